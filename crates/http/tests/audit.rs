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
