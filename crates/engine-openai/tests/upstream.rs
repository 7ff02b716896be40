//! The OpenAI engine against small local stand-ins for an OpenAI-compatible server: each test's
//! upstream sends exactly the bytes it is given, chunk by chunk, so splits, cut-offs, hangs and
//! errors are the test's choice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use lmsp_domain::model::{ModelId, ModelRecord, ModelSource, ModelToLoad};
use lmsp_domain::ports::{
    Engine, EngineError, EngineHealth, Generation, GenerationItem, GenerationJob, ResumePoint,
};
use lmsp_domain::task::{Input, TaskSpec};
use lmsp_domain::time::Timestamp;
use lmsp_engine_kit::{EngineTag, ResumeState};
use lmsp_engine_openai::{OpenAiEngine, OpenAiSettings};

/// What the stand-in answers to a chat completion.
#[derive(Clone)]
enum Reply {
    /// A 200 event stream of these chunks, each sent on its own after a short pause.
    Chunks(Vec<Vec<u8>>),
    /// A 200 event stream that sends these chunks, then nothing, forever.
    Hang(Vec<Vec<u8>>),
    /// An error status with this body.
    Status(StatusCode, String),
}

fn sse(data: &Value) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

fn word(text: &str) -> Vec<u8> {
    sse(&json!({"choices": [{"delta": {"content": text}, "finish_reason": null}]}))
}

/// A stream that ends properly: the words, a finish reason, a usage chunk and `[DONE]`.
fn words(texts: &[&str], prompt_tokens: u64) -> Vec<Vec<u8>> {
    let mut chunks: Vec<Vec<u8>> = texts.iter().map(|text| word(text)).collect();
    chunks.push(sse(
        &json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
    ));
    chunks.push(sse(&json!({
        "choices": [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": texts.len()}
    })));
    chunks.push(b"data: [DONE]\n\n".to_vec());
    chunks
}

async fn upstream(reply: Reply, seen: Arc<Mutex<Vec<Value>>>) -> String {
    let app = Router::new()
        .route("/v1/models", get(|| async { Json(json!({"data": []})) }))
        .route(
            "/v1/chat/completions",
            post(move |Json(body): Json<Value>| {
                let seen = seen.clone();
                let reply = reply.clone();
                async move {
                    seen.lock().unwrap().push(body);
                    answer(reply)
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1")
}

fn answer(reply: Reply) -> Response {
    let (chunks, hang) = match reply {
        Reply::Status(status, body) => return (status, body).into_response(),
        Reply::Chunks(chunks) => (chunks, false),
        Reply::Hang(chunks) => (chunks, true),
    };
    let stream = futures::stream::unfold(
        (chunks.into_iter(), hang),
        |(mut chunks, hang)| async move {
            match chunks.next() {
                Some(chunk) => {
                    // Separate writes, so the client reads them as separate network chunks.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Some((Ok::<_, std::io::Error>(Bytes::from(chunk)), (chunks, hang)))
                }
                None if hang => {
                    std::future::pending::<()>().await;
                    None
                }
                None => None,
            }
        },
    );
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}

fn engine(base_url: String) -> OpenAiEngine {
    OpenAiEngine::new(OpenAiSettings {
        base_url,
        connect_timeout: Duration::from_secs(5),
        first_token_timeout: Duration::from_millis(500),
        token_timeout: Duration::from_millis(500),
    })
    .unwrap()
}

fn job(max_output_tokens: u32, resume: Option<ResumePoint>) -> GenerationJob {
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
        spec: Arc::new(TaskSpec {
            input: Input::Text("Once upon a time".into()),
            instructions: None,
            max_output_tokens,
            seed: 1,
            temperature: lmsp_domain::task::Fraction::new(0.5),
            top_p: None,
            previous_response_id: None,
            controls: Default::default(),
        }),
        resume,
    }
}

/// Pulls every item; the items and how the generation ended.
async fn run(
    generation: &mut Box<dyn Generation>,
) -> (Vec<GenerationItem>, Result<(), EngineError>) {
    let mut items = Vec::new();
    loop {
        match generation.next_item().await {
            Ok(Some(item)) => items.push(item),
            Ok(None) => return (items, Ok(())),
            Err(error) => return (items, Err(error)),
        }
    }
}

fn text(items: &[GenerationItem]) -> String {
    items
        .iter()
        .filter_map(|item| match item {
            GenerationItem::Delta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// Streamed chunks become deltas, then `Finished` with the upstream's own token counts; the
/// request carries the model's upstream name, the seed and the sampling parameters.
#[tokio::test]
async fn streamed_chunks_become_deltas_then_finished_with_the_upstreams_usage() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = upstream(
        Reply::Chunks(words(&["alpha ", "beta ", "gamma "], 31)),
        seen.clone(),
    )
    .await;
    let engine = engine(base);
    engine.load(&job(10, None).model).await.unwrap();
    let mut generation = engine.generate(job(10, None)).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    ended.unwrap();
    assert_eq!(text(&items), "alpha beta gamma ");
    match items.last() {
        Some(GenerationItem::Finished { usage }) => {
            assert_eq!((usage.input_tokens, usage.output_tokens), (31, 3));
        }
        other => panic!("not finished: {other:?}"),
    }
    let request = seen.lock().unwrap()[0].clone();
    assert_eq!(request["model"], "llama");
    assert_eq!(request["stream"], true);
    assert_eq!(request["seed"], 1);
    assert_eq!(request["temperature"], 0.5);
    assert_eq!(request["max_tokens"], 10);
}

/// A task's stop strings go to the upstream, which ends its stream at the first one (without
/// it): `Finished` counts the upstream's tokens, fewer than the budget, so the service answers
/// finish reason `stop` as it does for the in-process engines, which end there themselves.
#[tokio::test]
async fn the_upstreams_stop_ends_the_generation_with_its_own_usage() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = upstream(Reply::Chunks(words(&["alpha ", "beta "], 31)), seen.clone()).await;
    let engine = engine(base);
    let mut job = job(10, None);
    Arc::make_mut(&mut job.spec).controls.stop = vec![String::from("gamma")];
    let mut generation = engine.generate(job).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    ended.unwrap();
    assert_eq!(text(&items), "alpha beta ");
    match items.last() {
        Some(GenerationItem::Finished { usage }) => assert_eq!(usage.output_tokens, 2),
        other => panic!("not finished: {other:?}"),
    }
    assert_eq!(seen.lock().unwrap()[0]["stop"], json!(["gamma"]));
}

/// A character split between two network chunks arrives intact, not as U+FFFD.
#[tokio::test]
async fn a_character_split_across_network_chunks_arrives_intact() {
    let mut chunks = words(&["grüß ", "dich "], 4);
    let first = chunks.remove(0);
    let split = first.iter().position(|byte| *byte == 0xC3).unwrap() + 1;
    chunks.insert(0, first[split..].to_vec());
    chunks.insert(0, first[..split].to_vec());
    let base = upstream(Reply::Chunks(chunks), Arc::new(Mutex::new(Vec::new()))).await;
    let mut generation = engine(base).generate(job(10, None)).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    ended.unwrap();
    assert_eq!(text(&items), "grüß dich ");
}

/// A resumed job re-sends the conversation with the text so far as the assistant's turn, and
/// asks only for the tokens left: the snapshot state counts tokens, not words.
#[tokio::test]
async fn a_resumed_job_asks_for_the_tokens_left_by_its_snapshot() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = upstream(Reply::Chunks(words(&["on"], 5)), seen.clone()).await;
    let engine = engine(base);
    // Seven tokens made three words so far.
    let resume = ResumePoint {
        state: ResumeState::new(7, vec![0]).encode(EngineTag::new("openai")),
        text_so_far: "so far ".into(),
    };
    let mut resumed = engine.generate(job(10, Some(resume))).await.unwrap();
    let (items, ended) = run(&mut resumed).await;
    ended.unwrap();
    let request = seen.lock().unwrap().last().unwrap().clone();
    let messages = request["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap(),
        &json!({"role": "assistant", "content": "so far "})
    );
    assert_eq!(request["max_tokens"], 3, "10 tokens, 7 spent");
    match items.last() {
        Some(GenerationItem::Finished { usage }) => assert_eq!(usage.output_tokens, 8),
        other => panic!("not finished: {other:?}"),
    }
}

/// A resumed job whose budget is spent finishes at once, without asking the upstream.
#[tokio::test]
async fn a_resumed_job_with_no_budget_left_finishes_without_asking() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = upstream(Reply::Chunks(words(&["more"], 5)), seen.clone()).await;
    let resume = ResumePoint {
        state: 4u64.to_le_bytes().to_vec(),
        text_so_far: "a b c d ".into(),
    };
    let mut generation = engine(base).generate(job(4, Some(resume))).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    ended.unwrap();
    assert!(
        matches!(items.as_slice(), [GenerationItem::Finished { usage }] if usage.output_tokens == 4)
    );
    assert!(seen.lock().unwrap().is_empty());
}

/// A state past the end of the budget, or another engine's, fails the generation before the
/// upstream is asked anything.
#[tokio::test]
async fn a_resume_past_the_budget_or_from_another_engines_state_fails() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = upstream(Reply::Chunks(words(&["more"], 5)), seen.clone()).await;
    let engine = engine(base);
    for state in [
        ResumeState::new(5, vec![0]).encode(EngineTag::new("openai")),
        5u64.to_le_bytes().to_vec(),
        ResumeState::new(1, vec![0]).encode(EngineTag::new("reference")),
        b"LLS1".to_vec(),
    ] {
        let resume = ResumePoint {
            state,
            text_so_far: "a b c d e ".into(),
        };
        let result = engine.generate(job(4, Some(resume))).await;
        assert!(matches!(result, Err(EngineError::Failed(_))));
    }
    assert!(seen.lock().unwrap().is_empty());
}

/// A stopped generation yields nothing more, not even what it had already read.
#[tokio::test]
async fn a_stopped_generation_yields_nothing_more() {
    let base = upstream(
        Reply::Chunks(words(&["alpha ", "beta ", "gamma "], 3)),
        Arc::new(Mutex::new(Vec::new())),
    )
    .await;
    let mut generation = engine(base).generate(job(10, None)).await.unwrap();
    assert!(matches!(
        generation.next_item().await.unwrap(),
        Some(GenerationItem::Delta { .. })
    ));
    generation.stop().await;
    assert_eq!(generation.next_item().await.unwrap(), None);
}

/// A stream cut off before its end (no finish reason, no `[DONE]`) is an upstream failure, not a
/// completion with truncated text.
#[tokio::test]
async fn a_stream_cut_off_before_its_end_fails() {
    let chunks = vec![word("alpha "), word("beta ")];
    let base = upstream(Reply::Chunks(chunks), Arc::new(Mutex::new(Vec::new()))).await;
    let mut generation = engine(base).generate(job(10, None)).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    assert_eq!(text(&items), "alpha beta ");
    assert!(
        matches!(ended, Err(EngineError::UpstreamUnavailable(_))),
        "{ended:?}"
    );
}

/// An upstream that stops sending in the middle of a stream fails the generation with
/// `Timeout` after the read timeout, instead of keeping it running forever.
#[tokio::test]
async fn an_upstream_that_stops_sending_times_out() {
    let base = upstream(
        Reply::Hang(vec![word("alpha ")]),
        Arc::new(Mutex::new(Vec::new())),
    )
    .await;
    let mut generation = engine(base).generate(job(10, None)).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    assert_eq!(text(&items), "alpha ");
    assert!(matches!(ended, Err(EngineError::Timeout(_))), "{ended:?}");
}

/// An upstream's error status keeps its message; an error inside the stream too.
#[tokio::test]
async fn upstream_errors_keep_their_message() {
    let base = upstream(
        Reply::Status(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"message": "loading model", "code": 503}}).to_string(),
        ),
        Arc::new(Mutex::new(Vec::new())),
    )
    .await;
    let refused = engine(base).generate(job(10, None)).await.err().unwrap();
    assert!(
        matches!(&refused, EngineError::UpstreamUnavailable(m) if m.contains("loading model")),
        "{refused:?}"
    );
    let chunks = vec![
        word("a "),
        sse(&json!({"error": {"message": "context full"}})),
    ];
    let base = upstream(Reply::Chunks(chunks), Arc::new(Mutex::new(Vec::new()))).await;
    let mut generation = engine(base).generate(job(10, None)).await.unwrap();
    let (_, ended) = run(&mut generation).await;
    assert!(
        matches!(&ended, Err(EngineError::UpstreamUnavailable(m)) if m.contains("context full")),
        "{ended:?}"
    );
}

/// An unreachable upstream is `UpstreamUnavailable` (not a missing model file).
#[tokio::test]
async fn an_unreachable_upstream_is_unavailable() {
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: "http://127.0.0.1:9/v1".into(),
        connect_timeout: Duration::from_secs(2),
        first_token_timeout: Duration::from_secs(2),
        token_timeout: Duration::from_secs(2),
    })
    .unwrap();
    let failed = engine.load(&job(10, None).model).await.err().unwrap();
    assert!(
        matches!(failed, EngineError::UpstreamUnavailable(_)),
        "{failed:?}"
    );
}

/// A stand-in for llama.cpp's server: `/props`, `/apply-template` (a fixed template) and the
/// raw `/v1/completions`, whose chunks carry `text` and the tokens predicted so far.
async fn llama_cpp_upstream(
    chunks: Vec<Vec<u8>>,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
) -> String {
    let completions_seen = seen.clone();
    let chat_seen = seen.clone();
    let app = Router::new()
        .route("/v1/models", get(|| async { Json(json!({"data": []})) }))
        .route(
            "/props",
            get(|| async { Json(json!({"default_generation_settings": {}})) }),
        )
        .route(
            "/apply-template",
            post(|Json(body): Json<Value>| async move {
                let user = body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                Json(json!({"prompt": format!("<user>{user}</user><assistant>")}))
            }),
        )
        .route(
            "/v1/completions",
            post(move |Json(body): Json<Value>| {
                let seen = completions_seen.clone();
                let chunks = chunks.clone();
                async move {
                    seen.lock().unwrap().push(("completions".into(), body));
                    answer(Reply::Chunks(chunks))
                }
            }),
        )
        .route(
            "/v1/chat/completions",
            post(move |Json(body): Json<Value>| {
                let seen = chat_seen.clone();
                async move {
                    seen.lock().unwrap().push(("chat".into(), body));
                    answer(Reply::Chunks(words(&["x"], 1)))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1")
}

/// On llama.cpp, a resume goes through the raw completion endpoint with the server's own chat
/// template followed by the text so far, so it continues the text whether or not the server
/// prefills assistant messages; budgets and usage count llama.cpp's predicted tokens, so a
/// character of three tokens in one chunk counts three.
#[tokio::test]
async fn a_resume_on_llama_cpp_continues_the_templated_prompt_and_counts_its_tokens() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let chunks = vec![
        sse(
            &json!({"choices": [{"text": "9", "finish_reason": null}], "timings": {"predicted_n": 1}}),
        ),
        sse(
            &json!({"choices": [{"text": "€", "finish_reason": null}], "timings": {"predicted_n": 4}}),
        ),
        sse(
            &json!({"choices": [{"text": "", "finish_reason": "length"}], "timings": {"predicted_n": 4}}),
        ),
        b"data: [DONE]\n\n".to_vec(),
    ];
    let base = llama_cpp_upstream(chunks, seen.clone()).await;
    let engine = engine(base);
    engine.load(&job(10, None).model).await.unwrap();
    // A state of the first releases: the token count alone.
    let resume = ResumePoint {
        state: 6u64.to_le_bytes().to_vec(),
        text_so_far: "012345".into(),
    };
    let mut resumed = engine.generate(job(10, Some(resume))).await.unwrap();
    let (items, ended) = run(&mut resumed).await;
    ended.unwrap();
    assert_eq!(text(&items), "9€");
    let states: Vec<u64> = items
        .iter()
        .filter_map(|item| match item {
            GenerationItem::Delta { state, .. } => Some(
                ResumeState::decode(state, EngineTag::new("openai"))
                    .unwrap()
                    .produced,
            ),
            _ => None,
        })
        .collect();
    assert_eq!(states, [7, 10], "6 before, then llama.cpp's own counts");
    match items.last() {
        Some(GenerationItem::Finished { usage }) => assert_eq!(usage.output_tokens, 10),
        other => panic!("not finished: {other:?}"),
    }
    let seen = seen.lock().unwrap();
    let (endpoint, request) = seen.last().unwrap();
    assert_eq!(endpoint, "completions");
    assert_eq!(
        request["prompt"],
        "<user>Once upon a time</user><assistant>012345"
    );
    assert_eq!(request["max_tokens"], 4, "10 tokens, 6 spent");
    assert_eq!(request["timings_per_token"], true);
}

/// A first run on llama.cpp is an ordinary chat completion (asking for per-token counts).
#[tokio::test]
async fn a_first_run_on_llama_cpp_is_a_chat_completion() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = llama_cpp_upstream(Vec::new(), seen.clone()).await;
    let engine = engine(base);
    engine.load(&job(10, None).model).await.unwrap();
    let mut generation = engine.generate(job(10, None)).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    ended.unwrap();
    assert_eq!(text(&items), "x");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "chat");
    assert_eq!(seen[0].1["timings_per_token"], true);
}

/// An upstream that answers the request but sends no token (queued behind other work, or
/// evaluating a long prompt) fails at the first-token timeout; chunks without text (a role, a
/// keep-alive) do not count as a token.
#[tokio::test]
async fn an_upstream_that_sends_no_token_times_out_at_the_first_token_timeout() {
    let role_only =
        sse(&json!({"choices": [{"delta": {"role": "assistant"}, "finish_reason": null}]}));
    let base = upstream(
        Reply::Hang(vec![role_only.clone(), role_only]),
        Arc::new(Mutex::new(Vec::new())),
    )
    .await;
    let mut generation = engine(base).generate(job(10, None)).await.unwrap();
    let (items, ended) = run(&mut generation).await;
    assert!(items.is_empty(), "{items:?}");
    assert!(
        matches!(&ended, Err(EngineError::Timeout(m)) if m.contains("first-token")),
        "{ended:?}"
    );
}

/// A stand-in whose `GET /v1/models` answers `status` (changeable) and counts its requests.
async fn models_upstream(status: Arc<Mutex<StatusCode>>, asked: Arc<Mutex<u32>>) -> String {
    let app = Router::new().route(
        "/v1/models",
        get(move || {
            let status = *status.lock().unwrap();
            *asked.lock().unwrap() += 1;
            async move { (status, Json(json!({"data": []}))) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1")
}

/// Health: an upstream that answers `GET /models` is `Ok`; the answer is reused for a while, so
/// a second look within the TTL asks the upstream nothing (even though it now fails).
#[tokio::test]
async fn health_is_ok_while_the_upstream_answers_and_is_cached() {
    let status = Arc::new(Mutex::new(StatusCode::OK));
    let asked = Arc::new(Mutex::new(0));
    let engine = engine(models_upstream(status.clone(), asked.clone()).await);

    let first = engine.health().await;
    *status.lock().unwrap() = StatusCode::SERVICE_UNAVAILABLE;
    let second = engine.health().await;

    assert_eq!(first, EngineHealth::Ok);
    assert_eq!(second, EngineHealth::Ok, "the cached answer");
    assert_eq!(*asked.lock().unwrap(), 1, "one probe within the TTL");
}

/// Health: an upstream that answers an error status is `Unavailable`, naming the status but
/// not the upstream's address.
#[tokio::test]
async fn health_is_unavailable_when_the_upstream_answers_an_error() {
    let status = Arc::new(Mutex::new(StatusCode::SERVICE_UNAVAILABLE));
    let base = models_upstream(status, Arc::new(Mutex::new(0))).await;
    let address = base.trim_start_matches("http://").trim_end_matches("/v1");
    let engine = engine(base.clone());

    let health = engine.health().await;

    match health {
        EngineHealth::Unavailable(reason) => {
            assert!(reason.contains("503"), "{reason}");
            assert!(!reason.contains(address), "{reason}");
        }
        EngineHealth::Ok => panic!("an upstream answering 503 is not healthy"),
    }
}

/// Health: an upstream nobody listens at is `Unavailable`, without its address.
#[tokio::test]
async fn health_is_unavailable_when_nothing_answers() {
    let engine = OpenAiEngine::new(OpenAiSettings {
        base_url: "http://127.0.0.1:9/v1".into(),
        connect_timeout: Duration::from_secs(2),
        first_token_timeout: Duration::from_secs(2),
        token_timeout: Duration::from_secs(2),
    })
    .unwrap();

    let health = engine.health().await;

    assert!(
        matches!(&health, EngineHealth::Unavailable(reason) if !reason.contains("127.0.0.1")),
        "{health:?}"
    );
}
