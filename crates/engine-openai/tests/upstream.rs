//! The OpenAI engine against a small local stand-in for an OpenAI-compatible server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use lmsp_domain::model::{ModelId, ModelRecord, ModelSource, ModelToLoad};
use lmsp_domain::ports::{Engine, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::task::{Input, TaskSpec};
use lmsp_domain::time::Timestamp;
use lmsp_engine_openai::{OpenAiEngine, OpenAiSettings};

async fn upstream(seen: Arc<Mutex<Vec<Value>>>) -> String {
    upstream_ending(seen, true).await
}

/// A stand-in whose stream ends properly (`finish_reason` and `[DONE]`) when `ends` is true, or
/// is cut off after its words otherwise.
async fn upstream_ending(seen: Arc<Mutex<Vec<Value>>>, ends: bool) -> String {
    let app = Router::new()
        .route("/v1/models", get(|| async { Json(json!({"data": []})) }))
        .route(
            "/v1/chat/completions",
            post(move |Json(body): Json<Value>| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(body);
                    let mut text = String::new();
                    for word in ["alpha ", "beta ", "gamma "] {
                        text.push_str(&format!("data: {}\n\n", json!({"choices": [{"delta": {"content": word}, "finish_reason": null}]})));
                    }
                    if ends {
                        text.push_str(&format!("data: {}\n\n", json!({"choices": [{"delta": {}, "finish_reason": "stop"}]})));
                        text.push_str("data: [DONE]\n\n");
                    }
                    ([("content-type", "text/event-stream")], text)
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1")
}

fn job(resume: Option<ResumePoint>) -> GenerationJob {
    GenerationJob {
        model: ModelToLoad {
            record: ModelRecord {
                id: ModelId::parse("local").unwrap(),
                source: ModelSource::Upstream {
                    name: "llama".into(),
                },
                created_at: Timestamp::from_millis(0),
            },
            path: None,
        },
        spec: std::sync::Arc::new(TaskSpec {
            input: Input::Text("Once upon a time".into()),
            instructions: None,
            max_output_tokens: 10,
            seed: 1,
            temperature: None,
            top_p: None,
            previous_response_id: None,
        }),
        resume,
    }
}

async fn collect(engine: &OpenAiEngine, job: GenerationJob) -> Vec<GenerationItem> {
    let mut generation = engine.generate(job).await.unwrap();
    let mut items = Vec::new();
    while let Some(item) = generation.next_item().await.unwrap() {
        items.push(item);
    }
    items
}

#[tokio::test]
async fn streamed_chunks_become_deltas_then_finished() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = upstream(seen.clone()).await;
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: base,
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    engine.load(&job(None).model).await.unwrap();
    let items = collect(&engine, job(None)).await;
    let text: String = items
        .iter()
        .filter_map(|i| match i {
            GenerationItem::Delta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "alpha beta gamma ");
    assert!(matches!(
        items.last(),
        Some(GenerationItem::Finished { .. })
    ));
    let request = seen.lock().unwrap()[0].clone();
    assert_eq!(request["model"], "llama");
    assert_eq!(request["stream"], true);
}

#[tokio::test]
async fn a_resumed_job_resends_the_prompt_with_the_text_so_far() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = upstream(seen.clone()).await;
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: base,
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let resume = ResumePoint {
        state: Vec::new(),
        text_so_far: "so far ".into(),
    };
    collect(&engine, job(Some(resume))).await;
    let request = seen.lock().unwrap()[0].clone();
    let messages = request["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap(),
        &json!({"role": "assistant", "content": "so far "})
    );
    assert_eq!(request["max_tokens"], 8);
}

/// A stopped generation yields nothing more (the upstream request is dropped).
#[tokio::test]
async fn a_stopped_generation_yields_nothing_more() {
    let base = upstream(Arc::new(Mutex::new(Vec::new()))).await;
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: base,
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let mut generation = engine.generate(job(None)).await.unwrap();
    assert!(matches!(
        generation.next_item().await.unwrap(),
        Some(GenerationItem::Delta { .. })
    ));
    generation.stop().await;
    assert_eq!(generation.next_item().await.unwrap(), None);
}

#[tokio::test]
async fn an_unreachable_upstream_makes_the_model_unavailable() {
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: "http://127.0.0.1:9/v1".into(),
        connect_timeout: Duration::from_secs(2),
    })
    .unwrap();
    assert!(engine.load(&job(None).model).await.is_err());
}

/// A stream cut off before its end (no finish reason, no `[DONE]`) is an upstream failure, not a
/// completion with truncated text.
#[tokio::test]
async fn a_stream_cut_off_before_its_end_fails() {
    let base = upstream_ending(Arc::new(Mutex::new(Vec::new())), false).await;
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: base,
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let mut generation = engine.generate(job(None)).await.unwrap();
    let mut deltas = 0;
    let ended = loop {
        match generation.next_item().await {
            Ok(Some(GenerationItem::Delta { .. })) => deltas += 1,
            Ok(other) => panic!("not a failure: {other:?}"),
            Err(error) => break error,
        }
    };
    assert_eq!(deltas, 3);
    assert!(
        matches!(
            ended,
            lmsp_domain::ports::EngineError::UpstreamUnavailable(_)
        ),
        "{ended:?}"
    );
}
