//! OpenAI's chat completions end to end (docs/openai-sdk.md): `POST /v1/chat/completions` with and
//! without `stream`, each a durable task like any other (listed, `Lmsp-Task-Id`, idempotency).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::time::{Duration, Instant};

use common::{joined_deltas, SseStream, TestServer};
use serde_json::{json, Value};

fn chat(stream: bool, tokens: u64) -> Value {
    json!({"model": "reference", "seed": 9, "max_completion_tokens": tokens, "stream": stream,
           "messages": [{"role": "system", "content": "You tell stories."},
                        {"role": "user", "content": "Once upon a time"}]})
}

/// The same conversation as a Responses request.
fn as_response(tokens: u64) -> Value {
    json!({"model": "reference", "seed": 9, "max_output_tokens": tokens,
           "input": [{"role": "system", "content": "You tell stories."},
                     {"role": "user", "content": "Once upon a time"}]})
}

/// Without `stream`: 200 `chat.completion` once the task completed; the task is listed under
/// `/v1/tasks` with `Lmsp-Task-Id`, and its text is that task's response (and the same
/// conversation's as a Responses request: the reference engine is deterministic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_runs_as_a_task_and_answers_chat_completion() {
    let server = TestServer::start(&[]);
    let (status, headers, completion) = server.post("/v1/chat/completions", chat(false, 12)).await;
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["object"], "chat.completion");
    assert!(completion["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(completion["created"].is_i64());
    assert_eq!(completion["model"], "reference");
    let choices = completion["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 1);
    assert_eq!(choices[0]["index"], 0);
    assert_eq!(choices[0]["message"]["role"], "assistant");
    assert_eq!(choices[0]["finish_reason"], "length", "it used the budget");
    let content = choices[0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!content.is_empty());
    let usage = &completion["usage"];
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 12)
    );

    let task_id = headers["lmsp-task-id"].to_str().unwrap().to_owned();
    assert_eq!(completion["task_id"], task_id.as_str());
    let (_, list) = server.get("/v1/tasks").await;
    let listed: Vec<&Value> = list["data"].as_array().unwrap().iter().collect();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], task_id.as_str());
    assert_eq!(listed[0]["status"], "completed");
    let (_, response) = server
        .get(&format!(
            "/v1/responses/{}",
            listed[0]["response_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(response["output_text"], content.as_str());
    let (status, _, same) = server.post("/v1/responses", as_response(12)).await;
    assert_eq!(status, 200, "{same}");
    assert_eq!(same["output_text"], content.as_str());
}

/// With `stream: true`: `chat.completion.chunk`s as Server-Sent Events — the role first, the
/// deltas, a chunk with `finish_reason`, the usage chunk with `include_usage`, then
/// `data: [DONE]` — whose joined content is the task's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_completion_sends_chunks_then_done() {
    let server = TestServer::start(&["--reference-token-delay", "5ms"]);
    let mut body = chat(true, 10);
    body["stream_options"] = json!({"include_usage": true});
    let response = server
        .request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            &server.admin_token,
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::of(response);
    let task_id = stream.header("lmsp-task-id");
    let messages = stream.collect_all().await;
    let (done, chunks) = messages.split_last().unwrap();
    assert_eq!(done.raw, "[DONE]", "{messages:?}");
    let id = chunks[0].data["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("chatcmpl-"));
    for chunk in chunks {
        assert_eq!(chunk.data["object"], "chat.completion.chunk", "{chunk:?}");
        assert_eq!(chunk.data["id"], id.as_str(), "one id: {chunk:?}");
        assert_eq!(chunk.data["model"], "reference");
    }
    assert_eq!(chunks[0].data["choices"][0]["delta"]["role"], "assistant");
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage.data["choices"], json!([]), "{usage:?}");
    assert_eq!(usage.data["usage"]["completion_tokens"], 10);
    let (finish, deltas) = rest.split_last().unwrap();
    assert_eq!(finish.data["choices"][0]["finish_reason"], "length");
    assert!(deltas
        .iter()
        .all(|c| c.data["choices"][0]["finish_reason"].is_null()));
    let text: String = deltas
        .iter()
        .filter_map(|c| c.data["choices"][0]["delta"]["content"].as_str())
        .collect();

    let task = server.wait_status(&task_id, "completed").await;
    let (_, response) = server
        .get(&format!(
            "/v1/responses/{}",
            task["response_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(response["output_text"], text.as_str());
    let (_, _, same) = server.post("/v1/responses", as_response(10)).await;
    assert_eq!(same["output_text"], text.as_str());

    // Without include_usage there is no usage chunk.
    let response = server
        .request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            &server.admin_token,
        )
        .json(&chat(true, 3))
        .send()
        .await
        .unwrap();
    let messages = SseStream::of(response).collect_all().await;
    assert_eq!(messages.last().unwrap().raw, "[DONE]");
    assert!(messages.iter().all(|m| m.data.get("usage").is_none()));
}

/// docs/api.md, docs/openai-sdk.md: a chat completion takes an idempotency key like any task request: the same
/// key and body replay the first reply and start nothing new; another body is 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_is_idempotent_with_a_key() {
    let server = TestServer::start(&[]);
    let send = |body: Value| {
        server
            .request(
                reqwest::Method::POST,
                "/v1/chat/completions",
                &server.admin_token,
            )
            .header("idempotency-key", "chat-1")
            .json(&body)
    };
    let (status, headers, first) = server.send(send(chat(false, 5))).await;
    assert_eq!(status, 200, "{first}");
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, again_headers, again) = server.send(send(chat(false, 5))).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again_headers["idempotent-replayed"], "true");
    assert_eq!(again, first);
    assert_eq!(again_headers["lmsp-task-id"], headers["lmsp-task-id"]);
    let (status, _, reused) = server.send(send(chat(false, 6))).await;
    assert_eq!(status, 422, "{reused}");
    assert_eq!(reused["error"]["code"], "idempotency_key_reused");
    // The same key on another path is another key.
    let (status, _, other) = server
        .send(
            server
                .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
                .header("idempotency-key", "chat-1")
                .json(&as_response(5)),
        )
        .await;
    assert_eq!(status, 200, "{other}");
    assert_eq!(server.task_count().await, 2);
}

/// P-7…P-9, I-6, docs/openai-sdk.md: a chat completion is a durable task. Two chat requests
/// whose clients went away mid-run — a stream under `on_restart: resume`, a synchronous one
/// under `fail` — are listed under `/v1/tasks` with their policies; after a kill -9 and a
/// restart each is recovered by its policy: the resumed one completes with the same text as an
/// uninterrupted chat completion, the other ends `failed` with `server_restarted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_is_recovered_by_its_on_restart_policy_after_a_kill_p7_i6() {
    let mut server = TestServer::start(&["--reference-token-delay", "30ms"]);
    let mut resumed_body = chat(true, 200);
    resumed_body["on_restart"] = json!("resume");
    let response = server
        .request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            &server.admin_token,
        )
        .json(&resumed_body)
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::of(response);
    let resumed = stream.header("lmsp-task-id");
    for _ in 0..4 {
        stream.next_message().await.expect("a chunk");
    }
    drop(stream);
    let mut failed_body = chat(false, 200);
    failed_body["on_restart"] = json!("fail");
    failed_body["metadata"] = json!({"case": "synchronous"});
    let waiting = server
        .request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            &server.admin_token,
        )
        .json(&failed_body);
    let client = tokio::spawn(async move { waiting.send().await });
    let deadline = Instant::now() + common::DEADLINE;
    let failed = loop {
        let (_, list) = server.get("/v1/tasks?limit=100").await;
        let running = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["metadata"]["case"] == "synchronous" && t["status"] == "running")
            .map(|t| t["id"].as_str().unwrap().to_owned());
        if let Some(id) = running {
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "the synchronous chat never ran: {list}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    client.abort();
    let _ = client.await;

    let (_, list) = server.get("/v1/tasks?limit=100").await;
    let listed = |id: &str| {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap_or_else(|| panic!("{id} is not listed: {list}"))
            .clone()
    };
    assert_eq!(listed(&resumed)["on_restart"], "resume");
    assert_eq!(listed(&failed)["on_restart"], "fail");
    server.kill_and_restart(&[]);

    let done = server.wait_status(&resumed, "completed").await;
    assert_eq!(done["restarts"], 1, "{done}");
    let events = server.all_events(&resumed).await;
    assert!(
        events.iter().any(|e| e["type"] == "response.resumed"),
        "{events:?}"
    );
    let (_, response) = server
        .get(&format!(
            "/v1/responses/{}",
            done["response_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(response["output_text"], joined_deltas(&events).as_str());
    let (status, _, uninterrupted) = server.post("/v1/chat/completions", chat(false, 200)).await;
    assert_eq!(status, 200, "{uninterrupted}");
    assert_eq!(
        uninterrupted["choices"][0]["message"]["content"], response["output_text"],
        "I-6: the resumed chat's text is an uninterrupted one's"
    );
    let gone = server.wait_status(&failed, "failed").await;
    assert_eq!(gone["error"]["code"], "server_restarted", "{gone}");
}
