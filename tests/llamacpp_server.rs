//! The upstream engine (`--engine openai`) against a real llama.cpp server: the pinned PyPI
//! `xllamacpp` (installed into `target/llamacpp-venv` by `scripts/llamacpp-server-deps`) serving
//! the tiny test model of `crates/engine-llama/tests/tiny` (written at test time, its greedy
//! output known in advance) through `tests/llamacpp/serve.py`.
//!
//! Covers streaming with exact text and llama.cpp's token counts, a kill -9 of the service and
//! an exact resume with the budget kept (through the raw completion endpoint, on a server that
//! does not continue a trailing assistant message), an upstream stopped with SIGSTOP mid-stream
//! (`timeout`) and before its first token (`timeout`), cancels while the upstream hangs and while
//! it has queued the request, an upstream killed mid-stream, nothing listening, and an upstream
//! that answers 400. Fails, never skips, when the venv is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

#[path = "../crates/engine-llama/tests/tiny/mod.rs"]
mod tiny;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use common::{free_port, LlamaCppServer, TestServer};

/// Tokens the tiny model may produce in one request (its context is 2 048, the prompt ~20).
const LONG: u64 = 1_900;

/// llama.cpp's server (xllamacpp) serving the tiny model; `extra` goes to serve.py
/// (`--no-prefill`, `--ctx N`, `--parallel N`).
fn start_tiny(extra: &[&str]) -> LlamaCppServer {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    tiny::write(&model, Some(tiny::CHATML));
    LlamaCppServer::start(&model, extra).keeping(dir)
}

fn service_args<'a>(upstream: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--engine",
        "openai",
        "--upstream",
        upstream,
        "--workers",
        "2",
    ];
    args.extend_from_slice(extra);
    args
}

async fn register(service: &TestServer) {
    let (status, _, model) = service
        .post(
            "/v1/models",
            json!({"id": "tiny", "upstream_model": "tiny"}),
        )
        .await;
    assert_eq!(status, 201, "{model}");
}

fn greedy(tokens: u64, policy: &str) -> Value {
    json!({"model": "tiny", "input": "hi", "max_output_tokens": tokens, "temperature": 0,
           "seed": 1, "on_restart": policy})
}

/// The tiny model's greedy text after the chat template's prompt, which ends in a newline.
fn expected(tokens: u64) -> String {
    tiny::next_text(b'\n', usize::try_from(tokens).unwrap())
}

/// Submits a background task and waits until its first delta is committed.
async fn submit_and_wait_for_output(service: &TestServer, body: Value) -> String {
    let mut body = body;
    body["background"] = Value::Bool(true);
    let id = service.submit(body).await;
    let mut events = service.sse(&format!("/v1/tasks/{id}/events"), None).await;
    while let Some(message) = events.next_message().await {
        if message.data["type"] == "response.output_text.delta" {
            return id;
        }
    }
    panic!("the stream of {id} ended before its first delta");
}

fn task_error(task: &Value) -> (String, String) {
    (
        task["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        task["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// Text through LMSP equals llama.cpp's greedy text exactly, in a synchronous reply and in a
/// stream, and `usage` holds llama.cpp's own token counts (`€` is three tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_usage_through_lmsp_are_llama_cpps_own() {
    let upstream = start_tiny(&[]);
    let service = TestServer::start(&service_args(&upstream.api, &[]));
    register(&service).await;
    let (status, _, response) = service.post("/v1/responses", greedy(40, "fail")).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "completed", "{response}");
    assert_eq!(response["output_text"], expected(40));
    assert_eq!(response["usage"]["output_tokens"], 40, "{response}");
    assert!(
        response["usage"]["input_tokens"].as_u64().unwrap() > 10,
        "the chat template's prompt, counted by llama.cpp: {response}"
    );

    let mut body = greedy(30, "fail");
    body["stream"] = Value::Bool(true);
    let request = service
        .request(reqwest::Method::POST, "/v1/responses", &service.admin_token)
        .json(&body);
    let response = request.send().await.unwrap();
    let messages = common::SseStream::of(response).collect_all().await;
    let streamed: String = messages
        .iter()
        .filter(|m| m.data["type"] == "response.output_text.delta")
        .map(|m| m.data["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(streamed, expected(30));
}

/// I-6 through an upstream: a `resume` task whose service is killed -9 mid-stream continues
/// after the restart, on a llama.cpp server that does not continue a trailing assistant message
/// (prefill off), so the resume goes through the raw completion endpoint; the whole text equals
/// the uninterrupted run's and the budget holds in llama.cpp's tokens (no overshoot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_service_resumes_an_upstream_task_exactly_with_its_budget_kept_i6() {
    let upstream = start_tiny(&["--no-prefill"]);
    let args = service_args(&upstream.api, &[]);
    let mut service = TestServer::start(&args);
    register(&service).await;
    let id = submit_and_wait_for_output(&service, greedy(LONG, "resume")).await;
    // Freeze the upstream so the task is surely mid-stream when the service dies.
    upstream.signal(Signal::SIGSTOP);
    service.kill();
    upstream.signal(Signal::SIGCONT);
    service.restart(&args);
    let task = service.wait_status(&id, "completed").await;
    assert_eq!(task["restarts"], 1, "{task}");
    let events = service.all_events(&id).await;
    common::assert_log_invariants(&task, &events);
    assert!(events.iter().any(|e| e["type"] == "response.resumed"));
    let (_, response) = service
        .get(&format!(
            "/v1/responses/{}",
            id.replacen("task_", "resp_", 1)
        ))
        .await;
    assert_eq!(
        response["output_text"],
        expected(LONG),
        "exact across the kill"
    );
    assert_eq!(
        response["usage"]["output_tokens"], LONG,
        "{}",
        response["usage"]
    );
}

/// An upstream stopped (SIGSTOP) in the middle of a stream ends its task with `timeout` after
/// the between-token timeout, instead of keeping it `running` forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_stopped_mid_stream_ends_its_task_with_timeout() {
    let upstream = start_tiny(&[]);
    let service = TestServer::start(&service_args(
        &upstream.api,
        &["--upstream-token-timeout", "1s"],
    ));
    register(&service).await;
    let id = submit_and_wait_for_output(&service, greedy(LONG, "fail")).await;
    upstream.signal(Signal::SIGSTOP);
    let task = service.wait_status(&id, "failed").await;
    let (code, message) = task_error(&task);
    assert_eq!(code, "timeout", "{task}");
    assert!(message.contains("between-token"), "{message}");
    upstream.signal(Signal::SIGCONT);
}

/// An upstream stopped before the task starts ends it with `timeout` after the first-token
/// timeout: it never stays `loading`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_stopped_before_its_first_token_ends_the_task_with_timeout() {
    let upstream = start_tiny(&[]);
    let service = TestServer::start(&service_args(
        &upstream.api,
        &["--upstream-first-token-timeout", "1s"],
    ));
    register(&service).await;
    upstream.signal(Signal::SIGSTOP);
    let mut body = greedy(10, "fail");
    body["background"] = Value::Bool(true);
    let id = service.submit(body).await;
    let task = service.wait_status(&id, "failed").await;
    assert_eq!(task_error(&task).0, "timeout", "{task}");
    upstream.signal(Signal::SIGCONT);
}

/// A cancel reaches a task whose upstream hangs, mid-stream and before the first token: it is
/// `cancelled` at once, not after the next chunk (the stream is dropped, not polled). P-4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_task_whose_upstream_hangs() {
    let upstream = start_tiny(&[]);
    let service = TestServer::start(&service_args(&upstream.api, &[]));
    register(&service).await;
    let id = submit_and_wait_for_output(&service, greedy(LONG, "fail")).await;
    upstream.signal(Signal::SIGSTOP);
    let (status, _, _) = service
        .post(&format!("/v1/tasks/{id}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 202);
    let task = service.wait_status(&id, "cancelled").await;
    let events = service.all_events(&id).await;
    common::assert_log_invariants(&task, &events);

    // Before the first token: the request is sent, the upstream is stopped.
    let mut body = greedy(10, "fail");
    body["background"] = Value::Bool(true);
    let id = service.submit(body).await;
    service
        .wait_task(&id, "running or loading", |t| {
            t["status"] == "running" || t["status"] == "loading"
        })
        .await;
    let (status, _, _) = service
        .post(&format!("/v1/tasks/{id}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 202);
    service.wait_status(&id, "cancelled").await;
    upstream.signal(Signal::SIGCONT);
}

/// A task the upstream has queued (its one slot busy with another request) is cancelled at once,
/// and the upstream's slot then serves the next task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_task_the_upstream_has_queued() {
    let upstream = start_tiny(&["--parallel", "1"]);
    let service = TestServer::start(&service_args(
        &upstream.api,
        &["--upstream-token-timeout", "60s"],
    ));
    register(&service).await;
    // The first task holds the upstream's one slot; freeze the upstream so it stays held.
    let first = submit_and_wait_for_output(&service, greedy(LONG, "fail")).await;
    upstream.signal(Signal::SIGSTOP);
    let mut body = greedy(10, "fail");
    body["background"] = Value::Bool(true);
    let queued = service.submit(body).await;
    service
        .wait_task(&queued, "running or loading", |t| {
            t["status"] == "running" || t["status"] == "loading"
        })
        .await;
    for id in [&queued, &first] {
        let (status, _, _) = service
            .post(&format!("/v1/tasks/{id}/cancel"), Value::Null)
            .await;
        assert_eq!(status, 202);
        service.wait_status(id, "cancelled").await;
    }
    upstream.signal(Signal::SIGCONT);
    let (status, _, response) = service.post("/v1/responses", greedy(11, "fail")).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["output_text"], expected(11));
}

/// An upstream killed in the middle of a stream fails its task with `upstream_unavailable` and
/// a message saying what broke (the text so far is kept in the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_killed_mid_stream_fails_its_task_as_unavailable() {
    let mut upstream = start_tiny(&[]);
    let service = TestServer::start(&service_args(&upstream.api, &[]));
    register(&service).await;
    let id = submit_and_wait_for_output(&service, greedy(LONG, "fail")).await;
    upstream.signal(Signal::SIGSTOP);
    upstream.kill();
    let task = service.wait_status(&id, "failed").await;
    let (code, message) = task_error(&task);
    assert_eq!(code, "upstream_unavailable", "{task}");
    assert!(!message.is_empty(), "{task}");
    let events = service.all_events(&id).await;
    common::assert_log_invariants(&task, &events);
}

/// Nothing listening at the upstream's address: `upstream_unavailable`, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_upstream_unavailable() {
    let api = format!("http://127.0.0.1:{}/v1", free_port());
    let service = TestServer::start(&service_args(&api, &[]));
    register(&service).await;
    let mut body = greedy(10, "fail");
    body["background"] = Value::Bool(true);
    let id = service.submit(body).await;
    let task = service.wait_status(&id, "failed").await;
    let (code, message) = task_error(&task);
    assert_eq!(code, "upstream_unavailable", "{task}");
    assert!(message.to_lowercase().contains("refused"), "{message}");
}

/// An upstream that refuses the request (400: a prompt larger than its context) fails the task
/// with `upstream_unavailable` and llama.cpp's own message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_400_fails_the_task_with_the_upstreams_message() {
    let upstream = start_tiny(&["--ctx", "128"]);
    let service = TestServer::start(&service_args(&upstream.api, &[]));
    register(&service).await;
    let mut body = greedy(10, "fail");
    body["input"] = json!("0123456789 ".repeat(40));
    body["background"] = Value::Bool(true);
    let id = service.submit(body).await;
    let task = service.wait_status(&id, "failed").await;
    let (code, message) = task_error(&task);
    assert_eq!(code, "upstream_unavailable", "{task}");
    assert!(message.contains("400"), "{message}");
    assert!(
        message.contains("context"),
        "llama.cpp's own words: {message}"
    );
}
