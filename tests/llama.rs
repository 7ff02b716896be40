//! A GGUF model run in process by llama.cpp through the real binary (`--engine llama`): the
//! tiny llama-architecture model of `crates/engine-llama/tests/tiny` (written at test time, its
//! greedy output known in advance) is registered, loaded, run to its exact text and token count,
//! resumed exactly after a kill -9 (I-6), and cancelled.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

#[path = "../crates/engine-llama/tests/tiny/mod.rs"]
mod tiny;

use common::TestServer;
use serde_json::{json, Value};

fn server_with_tiny_model(extra: &[&str]) -> TestServer {
    let mut args = vec!["--engine", "llama", "--workers", "1"];
    args.extend_from_slice(extra);
    let server = TestServer::start(&args);
    tiny::write(&server.data_dir.join("models").join("tiny.gguf"), None);
    server
}

async fn register(server: &TestServer) {
    let (status, _, model) = server
        .post("/v1/models", json!({"id": "tiny", "path": "tiny.gguf"}))
        .await;
    assert_eq!(status, 201, "{model}");
    assert_eq!(model["format"], "gguf", "{model}");
}

fn greedy(tokens: u64, policy: &str) -> Value {
    json!({"model": "tiny", "input": "hi", "max_output_tokens": tokens, "temperature": 0,
           "seed": 1, "on_restart": policy})
}

/// A GGUF model answers through the whole service: greedy text exactly the model's, usage in
/// real tokens, the log consistent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_model_runs_in_process_with_exact_text_and_token_usage() {
    let server = server_with_tiny_model(&[]);
    register(&server).await;
    let (status, _, response) = server.post("/v1/responses", greedy(20, "fail")).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "completed", "{response}");
    assert_eq!(response["output_text"], tiny::next_text(b' ', 20));
    assert_eq!(response["usage"]["output_tokens"], 20, "{response}");
    assert!(
        response["usage"]["input_tokens"].as_u64().unwrap() > 2,
        "{response}"
    );
    let task_id = response["id"]
        .as_str()
        .unwrap()
        .replacen("resp_", "task_", 1);
    let (_, task) = server.get(&format!("/v1/tasks/{task_id}")).await;
    let events = server.all_events(&task_id).await;
    common::assert_log_invariants(&task, &events);
}

/// I-6: a `resume` task killed mid-run continues after the restart from its snapshot, and its
/// text equals the uninterrupted run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gguf_task_resumes_exactly_i6() {
    let mut server = server_with_tiny_model(&["--llama-batch", "8"]);
    register(&server).await;
    let mut body = greedy(3_000, "resume");
    body["background"] = Value::Bool(true);
    let id = server.submit(body).await;
    server
        .wait_task(&id, "some output", |t| {
            t["last_sequence_number"].as_u64().unwrap_or(0) > 40
        })
        .await;
    server.kill_and_restart(&["--engine", "llama", "--workers", "1"]);
    let task = server.wait_status(&id, "completed").await;
    assert_eq!(task["restarts"], 1, "{task}");
    let events = server.all_events(&id).await;
    common::assert_log_invariants(&task, &events);
    assert!(events.iter().any(|e| e["type"] == "response.resumed"));
    // The same request uninterrupted (its context may end it before the budget: both alike).
    let fresh = server.submit({
        let mut body = greedy(3_000, "resume");
        body["background"] = Value::Bool(true);
        body
    });
    let fresh = fresh.await;
    server.wait_status(&fresh, "completed").await;
    let output = |task_id: &str| {
        let server = &server;
        let response_id = task_id.replacen("task_", "resp_", 1);
        async move {
            let (status, response) = server.get(&format!("/v1/responses/{response_id}")).await;
            assert_eq!(status, 200, "{response}");
            (
                response["output_text"].as_str().unwrap().to_owned(),
                response["usage"]["output_tokens"].clone(),
            )
        }
    };
    let (resumed_text, resumed_tokens) = output(&id).await;
    let (fresh_text, fresh_tokens) = output(&fresh).await;
    assert!(resumed_text.starts_with(&tiny::next_text(b' ', 40)));
    assert_eq!(resumed_text, fresh_text, "I-6");
    assert_eq!(resumed_tokens, fresh_tokens);
}

/// A cancel stops a running GGUF generation: the task ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_gguf_task_is_cancelled() {
    let server = server_with_tiny_model(&[]);
    register(&server).await;
    let mut body = greedy(3_500, "fail");
    body["background"] = Value::Bool(true);
    let id = server.submit(body).await;
    server.wait_status(&id, "running").await;
    let (status, _, reply) = server
        .post(&format!("/v1/tasks/{id}/cancel"), Value::Null)
        .await;
    assert!(status == 202 || status == 200, "{status} {reply}");
    let task = server.wait_status(&id, "cancelled").await;
    let events = server.all_events(&id).await;
    common::assert_log_invariants(&task, &events);
}
