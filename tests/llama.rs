//! A GGUF model run in process by llama.cpp through the real binary (`--engine llama`): the
//! tiny llama-architecture model of `crates/engine-llama/tests/tiny` (written at test time, its
//! greedy output known in advance) is registered, loaded, run to its exact text and token count,
//! resumed exactly after a kill -9 (I-6), and cancelled; a real model, SmolLM2 135M
//! (`scripts/smollm2-model`), resumes sampled and greedy tasks byte for byte after kills before
//! and after its KV checkpoints, from corrupt and foreign checkpoints too, gives identical
//! text to concurrent identical seeded requests, and keeps a structured output and a tool call's
//! arguments valid and exact across a kill -9.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

#[path = "../crates/engine-llama/tests/tiny/mod.rs"]
mod tiny;

use common::{register_smollm2, server_with_smollm2, TestServer, SMOLLM2_FLAGS};
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

fn story(max: u64, seed: u64, temperature: f64, top_p: Option<f64>) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "input": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "max_output_tokens": max, "temperature": temperature, "seed": seed,
        "on_restart": "resume", "background": true,
    });
    if let Some(top_p) = top_p {
        body["top_p"] = json!(top_p);
    }
    body
}

/// A task's stored response.
async fn stored_response(server: &TestServer, task_id: &str) -> Value {
    let response_id = task_id.replacen("task_", "resp_", 1);
    let (status, response) = server.get(&format!("/v1/responses/{response_id}")).await;
    assert_eq!(status, 200, "{response}");
    response
}

/// A task's stored text and token counts (`[input_tokens, output_tokens]`: what the model
/// read and wrote, the same for every run of the same request; `cached_tokens` is not among
/// them, it tells how much the last run reused).
async fn text_and_usage(server: &TestServer, task_id: &str) -> (String, Value) {
    let response = stored_response(server, task_id).await;
    let usage = &response["usage"];
    assert!(
        usage["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            <= usage["input_tokens"].as_u64().unwrap(),
        "{usage}"
    );
    (
        response["output_text"].as_str().unwrap().to_owned(),
        json!([usage["input_tokens"], usage["output_tokens"]]),
    )
}

/// Runs `body` to the end without interruption; its text and usage.
async fn uninterrupted(server: &TestServer, body: Value) -> (String, Value) {
    let id = server.submit(body).await;
    server.wait_status(&id, "completed").await;
    text_and_usage(server, &id).await
}

/// Submits `body`, kills the server with SIGKILL once the task has stored more than `events`
/// events, lets `between` touch the data directory while it is down, restarts it and waits for
/// the task to complete; its text and usage.
async fn killed_and_resumed(
    server: &mut TestServer,
    body: Value,
    events: u64,
    between: impl FnOnce(&std::path::Path),
) -> (String, Value) {
    let id = server.submit(body).await;
    server
        .wait_task(&id, "some output", |t| {
            t["last_sequence_number"].as_u64().unwrap_or(0) > events
        })
        .await;
    server.kill();
    between(&server.data_dir.join("checkpoints"));
    server.restart(&[SMOLLM2_FLAGS, &["--workers", "1"]].concat());
    let task = server.wait_status(&id, "completed").await;
    assert_eq!(task["restarts"], 1, "{task}");
    let events = server.all_events(&id).await;
    common::assert_log_invariants(&task, &events);
    text_and_usage(server, &id).await
}

/// I-6 on a real model: sampled (temperature 0.7 and 1.0, top-p 0.9, several seeds) and greedy
/// `resume` tasks killed with SIGKILL at several points — before the first KV checkpoint and
/// after several — each continue after the restart to exactly the uninterrupted output, byte for
/// byte, with the same usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_sampled_and_greedy_smollm2_tasks_resume_byte_for_byte_i6() {
    let mut server = server_with_smollm2("1");
    register_smollm2(&server).await;
    for (seed, temperature, top_p) in [(1234, 0.7, Some(0.9)), (7, 1.0, Some(0.9)), (3, 0.0, None)]
    {
        let body = story(100, seed, temperature, top_p);
        let (text, usage) = uninterrupted(&server, body.clone()).await;
        assert!(text.len() > 100, "{text}");
        // Before the first checkpoint (16 tokens), and after a few.
        for events in [8, 60] {
            let (resumed, resumed_usage) =
                killed_and_resumed(&mut server, body.clone(), events, |_| {}).await;
            assert_eq!(
                resumed, text,
                "I-6: seed {seed}, temperature {temperature}, kill after {events} events"
            );
            assert_eq!(resumed_usage, usage);
        }
    }
}

/// A corrupt checkpoint (flipped bytes in the state) and a checkpoint of another model (its meta
/// names another digest) are refused after a kill -9, and the task still resumes exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_and_foreign_checkpoints_still_resume_smollm2_exactly_i6() {
    let mut server = server_with_smollm2("1");
    register_smollm2(&server).await;
    let body = story(100, 99, 0.8, Some(0.9));
    let (text, usage) = uninterrupted(&server, body.clone()).await;
    let files = |dir: &std::path::Path, suffix: &str| -> Vec<std::path::PathBuf> {
        let found: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(suffix))
            .collect();
        assert!(!found.is_empty(), "checkpoints were written");
        found
    };
    let corrupt = |dir: &std::path::Path| {
        for kv in files(dir, ".kv") {
            let mut bytes = std::fs::read(&kv).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            std::fs::write(&kv, bytes).unwrap();
        }
    };
    let foreign = |dir: &std::path::Path| {
        for meta in files(dir, ".meta") {
            let text = std::fs::read_to_string(&meta).unwrap();
            let digest = text
                .lines()
                .find_map(|line| line.strip_prefix("digest "))
                .unwrap()
                .to_owned();
            let other = format!("sha256:{}", "0".repeat(64));
            assert_ne!(digest, other);
            std::fs::write(&meta, text.replace(&digest, &other)).unwrap();
        }
    };
    let (resumed, resumed_usage) = killed_and_resumed(&mut server, body.clone(), 60, corrupt).await;
    assert_eq!(resumed, text, "I-6 from a corrupt checkpoint");
    assert_eq!(resumed_usage, usage);
    let (resumed, resumed_usage) = killed_and_resumed(&mut server, body, 60, foreign).await;
    assert_eq!(resumed, text, "I-6 from another model's checkpoint");
    assert_eq!(resumed_usage, usage);
}

/// §11 prompt cache: a request whose prompt was evaluated before reuses it, and says so in
/// `usage.input_tokens_details.cached_tokens` (Chat: `prompt_tokens_details`); the first run of a
/// prompt reuses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_reports_its_cached_tokens_and_a_new_one_none() {
    let server = server_with_smollm2("1");
    register_smollm2(&server).await;
    let body = story(8, 11, 0.0, None);
    let first = server.submit(body.clone()).await;
    server.wait_status(&first, "completed").await;
    let first = stored_response(&server, &first).await;
    assert_eq!(
        first["usage"]["input_tokens_details"]["cached_tokens"], 0,
        "{first}"
    );
    let again = server.submit(body.clone()).await;
    server.wait_status(&again, "completed").await;
    let again = stored_response(&server, &again).await;
    let input = again["usage"]["input_tokens"].as_u64().unwrap();
    let cached = again["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 0 && cached <= input, "{again}");
    assert_eq!(again["output_text"], first["output_text"]);

    // The same conversation through Chat: the same prompt, cached again.
    let chat = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": body["input"]}],
        "max_tokens": 8,
        "seed": 11,
        "temperature": 0.0,
    });
    let (status, _, completion) = server.post("/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{completion}");
    let cached = completion["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 0, "{completion}");
}

/// Two identical seeded requests running at once (two workers) give identical text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_identical_seeded_smollm2_requests_give_identical_text() {
    let server = server_with_smollm2("2");
    register_smollm2(&server).await;
    let body = story(60, 5, 0.9, Some(0.9));
    let a = server.submit(body.clone()).await;
    let b = server.submit(body).await;
    server.wait_status(&a, "completed").await;
    server.wait_status(&b, "completed").await;
    let (text_a, usage_a) = text_and_usage(&server, &a).await;
    let (text_b, usage_b) = text_and_usage(&server, &b).await;
    assert!(text_a.len() > 50, "{text_a}");
    assert_eq!(text_a, text_b);
    assert_eq!(usage_a, usage_b);
}

/// The schema of [`structured_outputs_and_tool_calls_validate_and_resume_exactly_on_smollm2`]'s
/// structured output: every string bounded, so a run always closes its JSON within its budget.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "color": {"enum": ["red", "green", "blue"]}
        },
        "required": ["name", "age", "color"],
        "additionalProperties": false
    })
}

fn is_person(text: &str) -> bool {
    let Ok(Value::Object(person)) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    person.len() == 3
        && person["name"]
            .as_str()
            .is_some_and(|n| (1..=24).contains(&n.chars().count()))
        && person["age"].as_u64().is_some_and(|a| a <= 120)
        && person["color"]
            .as_str()
            .is_some_and(|c| ["red", "green", "blue"].contains(&c))
}

fn weather_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 30},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}
        },
        "required": ["city", "days"],
        "additionalProperties": false
    })
}

fn is_weather_call(arguments: &str) -> bool {
    let Ok(Value::Object(arguments)) = serde_json::from_str::<Value>(arguments) else {
        return false;
    };
    arguments.len() == 2
        && arguments["city"]
            .as_str()
            .is_some_and(|c| (1..=30).contains(&c.chars().count()))
        && arguments["days"]
            .as_u64()
            .is_some_and(|d| (1..=7).contains(&d))
}

/// A task's function calls, as `(name, arguments)`, from its stored response.
async fn stored_calls(server: &TestServer, task_id: &str) -> Vec<(String, String)> {
    let response = stored_response(server, task_id).await;
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "function_call")
        .map(|item| {
            (
                item["name"].as_str().unwrap().to_owned(),
                item["arguments"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Submits `body`, kills the server once the task stored more than `events` events, restarts it
/// and waits for the task to complete; its id.
async fn killed_and_completed(server: &mut TestServer, body: Value, events: u64) -> String {
    let id = server.submit(body).await;
    server
        .wait_task(&id, "some output", |t| {
            t["last_sequence_number"].as_u64().unwrap_or(0) > events
        })
        .await;
    server.kill();
    server.restart(&[SMOLLM2_FLAGS, &["--workers", "1"]].concat());
    let task = server.wait_status(&id, "completed").await;
    assert_eq!(task["restarts"], 1, "{task}");
    id
}

/// Through the Responses API on SmolLM2: a `json_schema` output parses and validates, a named
/// tool's call has arguments that validate against its parameters, both are exactly the
/// uninterrupted run's after a kill -9 inside them (the grammar's state replayed), and a schema
/// keyword the grammar cannot enforce is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs_and_tool_calls_validate_and_resume_exactly_on_smollm2() {
    let mut server = server_with_smollm2("1");
    register_smollm2(&server).await;

    let mut refused = person_schema();
    refused["properties"]["age"]["multipleOf"] = json!(5);
    let (status, _, reply) = server
        .post(
            "/v1/responses",
            json!({"model": "smollm2", "input": "Describe a person.",
                   "text": {"format": {"type": "json_schema", "name": "person", "schema": refused}}}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(
        reply["error"]["param"], "text.format.schema.properties.age.multipleOf",
        "{reply}"
    );

    let person = json!({
        "model": "smollm2", "input": "Describe a person as JSON.", "max_output_tokens": 120,
        "temperature": 1.0, "seed": 5, "on_restart": "resume", "background": true,
        "text": {"format": {"type": "json_schema", "name": "person", "schema": person_schema(),
                            "strict": true}},
    });
    let (text, usage) = uninterrupted(&server, person.clone()).await;
    assert!(is_person(&text), "{text}");
    let id = killed_and_completed(&mut server, person, 10).await;
    assert_eq!(text_and_usage(&server, &id).await, (text, usage));

    let call = json!({
        "model": "smollm2", "input": "What will the weather be in Paris this week?",
        "max_output_tokens": 80, "temperature": 1.0, "seed": 6, "on_restart": "resume",
        "background": true,
        "tools": [{"type": "function", "name": "get_weather", "description": "The forecast.",
                   "parameters": weather_parameters(), "strict": true}],
        "tool_choice": {"type": "function", "name": "get_weather"},
    });
    let id = server.submit(call.clone()).await;
    server.wait_status(&id, "completed").await;
    let calls = stored_calls(&server, &id).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "get_weather");
    assert!(is_weather_call(&calls[0].1), "{calls:?}");
    let id = killed_and_completed(&mut server, call, 8).await;
    assert_eq!(stored_calls(&server, &id).await, calls);
}
