//! What a black-box audit of the API found, each test one finding as a client sees it, over a
//! real service in this process (SQLite in a temp dir, the reference engine).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use support::*;

/// Whether `value`'s JSON text holds `needle` anywhere.
fn mentions(value: &Value, needle: &str) -> bool {
    value.to_string().contains(needle)
}

/// A model's path is shown only to `admin` and `models:write`: a task's error, which its client
/// reads, names the model instead — in the synchronous 500, the stream's `error` event and the
/// task object.
#[tokio::test]
async fn a_task_error_names_the_model_not_its_files_path() {
    let app = test_app().await;
    let (_, token) = paired_client(&app, &["responses:write", "responses:read"]).await;
    let token = Some(token.as_str());
    let model = vanishing_model(&app).await;
    let models_dir = app.models_dir.to_string_lossy().into_owned();
    let expected = format!("the file of model `{model}` is unavailable");

    let body = json!({"model": model, "input": "hello"});
    let reply = send(
        &app.router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.body["error"]["code"], "model_unavailable");
    assert_eq!(reply.body["error"]["message"], expected.as_str());

    let body = json!({"model": model, "input": "hello", "stream": true});
    let frames = sse_data(
        &app.router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    let error = frames.iter().find(|f| f["type"] == "error").unwrap();
    assert_eq!(error["message"], expected.as_str());
    let task_id = frames[0]["response"]["task_id"].as_str().unwrap();
    let task = send(
        &app.router,
        request(Method::GET, &format!("/v1/tasks/{task_id}"), token, None),
    )
    .await;
    assert_eq!(task.body["error"]["message"], expected.as_str());
    for shown in frames.iter().chain([&reply.body, &task.body]) {
        assert!(!mentions(shown, &models_dir), "{shown}");
        assert!(!mentions(shown, "gone.txt"), "{shown}");
    }
}

/// A 400's `param` and message, after checking it is the error envelope.
async fn refused(app: &TestApp, path: &str, body: Value) -> (String, String) {
    let token = Some(app.admin_token.as_str());
    let reply = send(&app.router, request(Method::POST, path, token, Some(body))).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    let error = &reply.body["error"];
    assert_eq!(error["code"], "invalid_request", "{error}");
    assert_eq!(error["type"], "invalid_request_error", "{error}");
    (
        error["param"].as_str().unwrap_or_default().to_owned(),
        error["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// A chat request with `extra` fields over a user message.
fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "reference", "max_completion_tokens": 3,
        "messages": [{"role": "user", "content": "Once upon a time"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// Every rule a chat request breaks names the Chat field (`messages[i]…`, `max_tokens` or
/// `max_completion_tokens`, `response_format.json_schema…`, `tools[i].function…`), never the
/// Responses field the rule is written for; a Responses request still names its own.
#[tokio::test]
async fn chat_errors_name_chat_fields() {
    let app = test_app().await;
    let tool = |name: &str| json!([{"type": "function", "function": {"name": name}}]);
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "call_zzz", "content": "1"}]}),
            "messages[1].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"},
                {"role": "tool", "content": "1"}]}),
            "messages[1].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"},
                {"role": "bot", "content": "1"}]}),
            "messages[1].role",
        ),
        (json!({"max_completion_tokens": 0}), "max_completion_tokens"),
        (
            json!({"max_completion_tokens": null, "max_tokens": 100_001}),
            "max_tokens",
        ),
        (
            json!({"tools": tool("two words")}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [tool("f")[0], tool("f")[0]]}),
            "tools[1].function.name",
        ),
        (
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "a b", "schema": {"type": "object"}}}}),
            "response_format.json_schema.name",
        ),
        (json!({"messages": []}), "messages"),
        (json!({"seed": "one"}), "seed"),
    ];
    for (extra, param) in cases {
        let (named, message) = refused(&app, "/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(named, param, "{extra}: {message}");
        for responses in ["input", "max_output_tokens", "call_id", "text.format"] {
            assert!(
                !message.contains(&format!("`{responses}`")),
                "{extra}: {message}"
            );
        }
    }
    let (named, _) = refused(
        &app,
        "/v1/responses",
        json!({"model": "reference", "input": [{"role": "user", "content": "x"},
            {"type": "function_call_output", "call_id": "call_zzz", "output": "1"}]}),
    )
    .await;
    assert_eq!(named, "input[1].call_id");
}

/// OpenAI refuses `top_logprobs` without `logprobs: true` (400 naming `top_logprobs`).
#[tokio::test]
async fn chat_top_logprobs_needs_logprobs() {
    let app = test_app().await;
    for extra in [
        json!({"top_logprobs": 2}),
        json!({"top_logprobs": 2, "logprobs": false}),
        json!({"top_logprobs": 0, "logprobs": null}),
    ] {
        let (param, message) = refused(&app, "/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(param, "top_logprobs", "{extra}: {message}");
    }
    let token = Some(app.admin_token.as_str());
    let body = chat(json!({"top_logprobs": 2, "logprobs": true}));
    let reply = send(
        &app.router,
        request(Method::POST, "/v1/chat/completions", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body["choices"][0]["logprobs"]["content"].is_array());
}

/// Every chunk of a chat stream carries the task's `service_tier`, as the completion does.
#[tokio::test]
async fn every_chat_chunk_carries_the_service_tier() {
    let app = test_app().await;
    let token = Some(app.admin_token.as_str());
    for (asked, shown) in [(json!("priority"), "priority"), (Value::Null, "default")] {
        let body = chat(json!({"stream": true, "service_tier": asked,
            "stream_options": {"include_usage": true}}));
        let frames = sse_data(
            &app.router,
            request(Method::POST, "/v1/chat/completions", token, Some(body)),
        )
        .await;
        assert!(frames.len() >= 3, "{frames:?}");
        for frame in &frames {
            assert_eq!(frame["service_tier"], shown, "{frame}");
        }
    }
}

/// The limits of a client, as the admin's list shows them.
async fn limits_of(app: &TestApp, client_id: &str) -> Value {
    let token = Some(app.admin_token.as_str());
    let list = send(
        &app.router,
        request(Method::GET, "/v1/clients", token, None),
    )
    .await;
    let client = list.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|client| client["id"] == client_id)
        .unwrap()
        .clone();
    json!({"max_running": client["max_running"], "max_queued": client["max_queued"]})
}

/// `PATCH /v1/clients/{id}` on a revoked client is 404, as `DELETE` is, and changes nothing;
/// `max_running: 0` is a 400 and changes nothing; 1 is taken.
#[tokio::test]
async fn a_client_update_refuses_a_revoked_client_and_max_running_zero() {
    let app = test_app().await;
    let token = Some(app.admin_token.as_str());
    let (id, _) = paired_client(&app, &["responses:read"]).await;
    let path = format!("/v1/clients/{id}");
    let patch = |body: Value| request(Method::PATCH, &path, token, Some(body));
    let before = limits_of(&app, &id).await;

    let reply = send(
        &app.router,
        patch(json!({"max_running": 0, "max_queued": 5})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(reply.body["error"]["param"], "max_running");
    assert_eq!(limits_of(&app, &id).await, before);

    let reply = send(&app.router, patch(json!({"max_running": 1}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["max_running"], 1);
    let kept = limits_of(&app, &id).await;

    let reply = send(&app.router, request(Method::DELETE, &path, token, None)).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let reply = send(
        &app.router,
        patch(json!({"max_running": 3, "max_queued": 7})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert_eq!(reply.body["error"]["code"], "not_found");
    assert_eq!(limits_of(&app, &id).await, kept);
    let reply = send(&app.router, request(Method::DELETE, &path, token, None)).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

/// A seed may be any int64, negative too, echoed as sent (on the response and on its task); the
/// same 64 bits given as an unsigned integer are the same seed. A seed the service draws stays
/// below 2^53, which a JavaScript client reads exactly.
#[tokio::test]
async fn seeds_are_int64_and_drawn_below_2_pow_53() {
    let app = test_app().await;
    let token = Some(app.admin_token.as_str());
    let respond = |seed: Value| {
        let body = json!({"model": "reference", "input": "Once upon a time",
            "max_output_tokens": 8, "temperature": 1.0, "seed": seed});
        send(
            &app.router,
            request(Method::POST, "/v1/responses", token, Some(body)),
        )
    };

    let negative = respond(json!(-5)).await;
    assert_eq!(negative.status, StatusCode::OK, "{}", negative.body);
    assert_eq!(negative.body["seed"], -5);
    let task_id = negative.body["task_id"].as_str().unwrap();
    let task = send(
        &app.router,
        request(Method::GET, &format!("/v1/tasks/{task_id}"), token, None),
    )
    .await;
    assert_eq!(task.body["seed"], -5);
    let same_bits = respond(json!(u64::MAX - 4)).await;
    assert_eq!(same_bits.status, StatusCode::OK, "{}", same_bits.body);
    assert_eq!(same_bits.body["output_text"], negative.body["output_text"]);
    for seed in [json!(i64::MIN), json!(i64::MAX), json!(0)] {
        let reply = respond(seed.clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body["seed"], seed);
    }
    let (param, _) = refused(
        &app,
        "/v1/responses",
        json!({"model": "reference", "input": "x", "seed": 1.5}),
    )
    .await;
    assert_eq!(param, "seed");

    let body = chat(json!({"seed": -5}));
    let reply = send(
        &app.router,
        request(Method::POST, "/v1/chat/completions", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);

    for _ in 0..8 {
        let drawn = respond(Value::Null).await;
        let seed = drawn.body["seed"].as_i64().unwrap();
        assert!((0..1 << 53).contains(&seed), "{seed}");
    }
}
