//! The OpenAI engine against a small local stand-in for an OpenAI-compatible server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use lmsp_domain::ports::{CancelFlag, Engine, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::{Digest, FileFingerprint, Input, ModelId, ModelRecord, TaskSpec, Timestamp};
use lmsp_engine_openai::{OpenAiEngine, OpenAiSettings};

async fn upstream(seen: Arc<Mutex<Vec<Value>>>) -> String {
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
                    text.push_str(&format!("data: {}\n\n", json!({"choices": [{"delta": {}, "finish_reason": "stop"}]})));
                    text.push_str("data: [DONE]\n\n");
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
        model: ModelRecord {
            id: ModelId::parse("llama").unwrap(),
            format: "gguf".into(),
            file: FileFingerprint {
                path: "/m/llama.gguf".into(),
                size_bytes: 1,
                modified_millis: 0,
                digest: Digest::from_sha256([0; 32]),
            },
            created_at: Timestamp::from_millis(0),
        },
        spec: std::sync::Arc::new(TaskSpec {
            input: Input::Text("Once upon a time".into()),
            max_output_tokens: 10,
            seed: 1,
        }),
        resume,
        cancel: CancelFlag::new(),
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

#[tokio::test]
async fn a_raised_cancel_flag_stops_the_generation() {
    let base = upstream(Arc::new(Mutex::new(Vec::new()))).await;
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: base,
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let job = job(None);
    let flag = job.cancel.clone();
    let mut generation = engine.generate(job).await.unwrap();
    flag.raise();
    assert_eq!(
        generation.next_item().await.unwrap(),
        Some(GenerationItem::Cancelled)
    );
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
