//! OpenAI's chat completions end to end (docs/openai-sdk.md): `POST /v1/chat/completions` with and
//! without `stream`, each a durable task like any other (listed, `Lmsp-Task-Id`, idempotency).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{SseStream, TestServer};
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
