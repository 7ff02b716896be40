//! OpenAI's Responses API end to end (docs/api.md, docs/openai-sdk.md): a background response followed, cancelled
//! and deleted by its `resp_` id, in every status of its task.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use common::{assert_envelope, joined_deltas, prompt, TestServer};
use serde_json::{json, Value};

/// The fields of OpenAI's response object (docs/openai-sdk.md), LMSP's own included.
const RESPONSE_FIELDS: [&str; 24] = [
    "object",
    "id",
    "status",
    "model",
    "created_at",
    "completed_at",
    "background",
    "max_output_tokens",
    "metadata",
    "output",
    "usage",
    "error",
    "incomplete_details",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "task_id",
    "on_restart",
    "seed",
    "restarts",
    "output_text",
    "instructions",
];

fn assert_response_shape(response: &Value) {
    for field in RESPONSE_FIELDS {
        assert!(response.get(field).is_some(), "no `{field}`: {response}");
    }
    assert_eq!(response["object"], "response");
    assert!(response["id"].as_str().unwrap().starts_with("resp_"));
    assert!(response["task_id"].as_str().unwrap().starts_with("task_"));
    assert!(response["created_at"].is_i64(), "Unix seconds: {response}");
    assert_eq!(response["tools"], json!([]));
    assert_eq!(response["tool_choice"], "auto");
}

/// docs/openai-sdk.md: a background response is followed by its `resp_` id: `GET /v1/responses/{id}`
/// answers the response object in every status (`queued`, `in_progress`, `completed`), the same
/// id its task names, and once completed it holds the output, the usage and `completed_at`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_is_followed_by_its_resp_id_through_every_status() {
    let server = TestServer::start(&["--workers", "1", "--reference-token-delay", "20ms"]);
    let first = server.submit_response(prompt(1, 40, "fail")).await;
    let second = server.submit_response(prompt(2, 5, "resume")).await;
    assert_response_shape(&first);
    assert_response_shape(&second);
    assert_eq!(second["on_restart"], "resume");
    let response_path = |r: &Value| format!("/v1/responses/{}", r["id"].as_str().unwrap());
    let first_task = first["task_id"].as_str().unwrap().to_owned();
    server
        .wait_task(&first_task, "running", |t| t["status"] == "running")
        .await;
    // One worker: the second waits in the queue while the first runs.
    let (status, queued) = server.get(&response_path(&second)).await;
    assert_eq!(status, 200, "{queued}");
    assert_response_shape(&queued);
    assert_eq!(queued["status"], "queued");
    assert_eq!(queued["output"], json!([]));
    assert_eq!(queued["usage"], Value::Null);
    assert_eq!(queued["completed_at"], Value::Null);
    let response = server
        .request(
            reqwest::Method::GET,
            &response_path(&first),
            &server.admin_token,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["lmsp-task-id"], first_task.as_str());
    let running: Value = response.json().await.unwrap();
    assert_eq!(running["status"], "in_progress", "{running}");
    assert_eq!(running["id"], first["id"]);

    let done = server.wait_status(&first_task, "completed").await;
    assert_eq!(done["response_id"], first["id"]);
    let (_, completed) = server.get(&response_path(&first)).await;
    assert_response_shape(&completed);
    assert_eq!(completed["status"], "completed");
    assert!(completed["completed_at"].is_i64(), "{completed}");
    let events = server.all_events(&first_task).await;
    assert_eq!(completed["output_text"], joined_deltas(&events).as_str());
    let output = &completed["output"][0];
    assert_eq!(output["type"], "message");
    assert_eq!(output["role"], "assistant");
    assert_eq!(output["status"], "completed");
    assert!(output["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(output["content"][0]["type"], "output_text");
    assert_eq!(output["content"][0]["text"], completed["output_text"]);
    assert_eq!(output["content"][0]["annotations"], json!([]));
    let usage = &completed["usage"];
    assert_eq!(usage["output_tokens"], 40);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + 40)
    );
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
    assert!(usage["output_tokens_details"]["reasoning_tokens"].is_u64());
    for field in [
        "created_at",
        "model",
        "metadata",
        "seed",
        "task_id",
        "background",
    ] {
        assert_eq!(completed[field], first[field], "{field}");
    }
}

/// docs/api.md, docs/openai-sdk.md: `POST /v1/responses/{id}/cancel` is the task's cancel answering the response
/// object — a running response's cancel waits up to 1 s for the engine to stop and answers 200
/// `cancelled` (here the engine takes 300 ms), 200 once `cancelled`, 409 `task_not_cancellable`
/// once completed — and the task ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_is_cancelled_by_its_resp_id_p4() {
    let server = TestServer::start(&[
        "--workers",
        "1",
        "--reference-token-delay",
        "30ms",
        "--reference-cancel-delay",
        "300ms",
    ]);
    let running = server.submit_response(prompt(1, 10_000, "fail")).await;
    let queued = server.submit_response(prompt(2, 5, "fail")).await;
    let cancel = |r: &Value| format!("/v1/responses/{}/cancel", r["id"].as_str().unwrap());
    let running_task = running["task_id"].as_str().unwrap().to_owned();
    server
        .wait_task(&running_task, "running with output", |t| {
            t["status"] == "running" && t["last_sequence_number"].as_u64() > Some(4)
        })
        .await;
    let (status, headers, body) = server.post(&cancel(&queued), Value::Null).await;
    assert_eq!(status, 200, "{body}");
    assert_response_shape(&body);
    assert_eq!(body["status"], "cancelled");
    assert_eq!(body["id"], queued["id"]);
    assert_eq!(headers["lmsp-task-id"], queued["task_id"].as_str().unwrap());

    let (status, _, body) = server.post(&cancel(&running), Value::Null).await;
    assert_eq!(
        status, 200,
        "the cancel waited for the engine to stop: {body}"
    );
    assert_eq!(body["status"], "cancelled");
    let task = server.wait_status(&running_task, "cancelled").await;
    let (status, _, body) = server.post(&cancel(&running), Value::Null).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");
    let events = server.all_events(&running_task).await;
    assert_eq!(
        task["last_sequence_number"].as_u64(),
        Some(events.len() as u64),
        "the second cancel wrote nothing"
    );
    let (_, fetched) = server
        .get(&format!(
            "/v1/responses/{}",
            running["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(fetched["status"], "cancelled");

    let finished = server.submit_response(prompt(3, 3, "fail")).await;
    server
        .wait_status(finished["task_id"].as_str().unwrap(), "completed")
        .await;
    let (status, _, body) = server.post(&cancel(&finished), Value::Null).await;
    assert_eq!(status, 409, "{body}");
    assert_envelope(
        status,
        &body,
        "task_not_cancellable",
        "a completed response",
    );
}

/// docs/api.md: a cancel of a running response whose engine takes longer than the 1 s the cancel
/// waits answers 202 with the response still `in_progress` (the task is `cancelling`), and the
/// task still ends `cancelled` (P-4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_engine_stops_slowly_answers_in_progress_after_a_second_p4() {
    let server = TestServer::start(&[
        "--workers",
        "1",
        "--reference-token-delay",
        "30ms",
        "--reference-cancel-delay",
        "5s",
    ]);
    let running = server.submit_response(prompt(1, 10_000, "fail")).await;
    let task_id = running["task_id"].as_str().unwrap().to_owned();
    server.wait_status(&task_id, "running").await;
    let path = format!("/v1/responses/{}/cancel", running["id"].as_str().unwrap());
    let (status, _, body) = server.post(&path, Value::Null).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "in_progress", "cancelling is in_progress");
    let (_, task) = server.get(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(task["status"], "cancelling", "{task}");
    server.wait_status(&task_id, "cancelled").await;
}

/// docs/openai-sdk.md: `DELETE /v1/responses/{id}` deletes a finished task's response and log (404
/// afterwards, by either id); an unfinished one is 409 and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_response_is_deleted_by_its_resp_id_and_an_unfinished_one_is_not() {
    let server = TestServer::start(&["--workers", "1", "--reference-load-delay", "1h"]);
    let unfinished = server.submit_response(prompt(1, 5, "fail")).await;
    let unfinished_task = unfinished["task_id"].as_str().unwrap().to_owned();
    let unfinished_path = format!("/v1/responses/{}", unfinished["id"].as_str().unwrap());
    server.wait_status(&unfinished_task, "loading").await;
    let (status, _, body) = server.delete(&unfinished_path).await;
    assert_eq!(status, 409, "{body}");
    assert_envelope(status, &body, "task_not_finished", "an unfinished response");
    assert_eq!(server.get(&unfinished_path).await.0, 200, "it stays");

    // A queued task cancelled is finished: its response can be deleted.
    let finished = server.submit_response(prompt(2, 5, "fail")).await;
    let finished_task = finished["task_id"].as_str().unwrap().to_owned();
    let finished_path = format!("/v1/responses/{}", finished["id"].as_str().unwrap());
    let (status, _, _) = server
        .post(&format!("{finished_path}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 200);
    let (status, _, deleted) = server.delete(&finished_path).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(
        deleted,
        json!({"id": finished["id"], "object": "response.deleted", "deleted": true})
    );
    for path in [
        finished_path.clone(),
        format!("/v1/tasks/{finished_task}"),
        format!("/v1/tasks/{finished_task}/events"),
    ] {
        let (status, body) = server.get(&path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_envelope(status, &body, "not_found", &path);
    }
    let (status, _, body) = server.delete(&finished_path).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        server.task_count().await,
        1,
        "only the unfinished task is left"
    );

    // After it finishes, the unfinished one can go too.
    let (status, _, _) = server
        .post(&format!("{unfinished_path}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 200, "the cancel waited for the load to stop");
    server.wait_status(&unfinished_task, "cancelled").await;
    let (status, _, _) = server.delete(&unfinished_path).await;
    assert_eq!(status, 200);
    assert_eq!(server.task_count().await, 0);
}

/// docs/openai-sdk.md: `previous_response_id` puts the earlier response's input and output first; an
/// unknown one is a 404 and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_continues_a_previous_one() {
    let server = TestServer::start(&[]);
    let (status, _, first) = server.post("/v1/responses", prompt(5, 6, "fail")).await;
    assert_eq!(status, 200, "{first}");
    let (status, _, next) = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "input": "and then", "seed": 5, "max_output_tokens": 6,
                   "previous_response_id": first["id"]}),
        )
        .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["previous_response_id"], first["id"]);
    assert!(
        next["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64(),
        "the earlier input and output come first: {first} / {next}"
    );
    let count = server.task_count().await;
    let (status, _, body) = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "input": "x",
                   "previous_response_id": "resp_01ARZ3NDEKTSV4RRFFQ69G5FAV"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(server.task_count().await, count);
}

/// docs/openai-sdk.md: `temperature: 0` is greedy decoding on the reference engine: two
/// requests that differ only by their seed give the same `output_text`. At the default
/// temperature the same two seeds give different texts, so the seed does reach the sampler and
/// the equality is the greedy decoding's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_temperature_zero_the_seed_changes_nothing() {
    let server = TestServer::start(&[]);
    let body = |seed: u64, temperature: Option<f64>| {
        let mut body = prompt(seed, 40, "fail");
        if let Some(temperature) = temperature {
            body["temperature"] = json!(temperature);
        }
        body
    };
    let text = |reply: &(u16, reqwest::header::HeaderMap, Value)| {
        let (status, _, response) = reply;
        assert_eq!(*status, 200, "{response}");
        assert_eq!(response["status"], "completed", "{response}");
        response["output_text"].as_str().unwrap().to_owned()
    };

    let greedy_a = text(&server.post("/v1/responses", body(1, Some(0.0))).await);
    let greedy_b = text(&server.post("/v1/responses", body(987_654, Some(0.0))).await);
    let sampled_a = text(&server.post("/v1/responses", body(1, None)).await);
    let sampled_b = text(&server.post("/v1/responses", body(987_654, None)).await);

    assert!(!greedy_a.is_empty());
    assert_eq!(
        greedy_a, greedy_b,
        "temperature 0: the seed changes nothing"
    );
    assert_ne!(
        sampled_a, sampled_b,
        "at the default temperature the seeds do differ"
    );
}
