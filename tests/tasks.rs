//! Tasks end to end (docs/api.md, docs/events.md, docs/rules.md): a background task's life and log, a synchronous
//! request and its failure replies, the cancel table, and retention.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::time::{Duration, Instant};

use common::{assert_envelope, assert_log_invariants, joined_deltas, prompt, TestServer, DEADLINE};
use serde_json::{json, Value};

/// The whole life of a background task: 202 with the response object (`queued`, its `resp_` id,
/// its `task_id`) and `Location`, then completed with a response whose text is the joined
/// deltas, and a log that satisfies I-2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_task_runs_to_completion_with_a_gapless_log_i2() {
    let server = TestServer::start(&[]);
    let (status, headers, accepted) = server
        .post(
            "/v1/responses",
            json!({
                "model": "reference", "input": "Once upon a time", "background": true, "seed": 7,
                "max_output_tokens": 24, "metadata": {"k": "v"}
            }),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(accepted["object"], "response");
    assert_eq!(accepted["status"], "queued");
    assert_eq!(accepted["background"], true);
    assert_eq!(accepted["metadata"]["k"], "v");
    assert_eq!(accepted["seed"], 7);
    assert_eq!(accepted["max_output_tokens"], 24);
    let response_id = accepted["id"].as_str().unwrap().to_owned();
    assert!(response_id.starts_with("resp_"), "{accepted}");
    let id = accepted["task_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("task_"), "{accepted}");
    assert_eq!(headers["location"], format!("/v1/tasks/{id}").as_str());
    assert_eq!(headers["lmsp-task-id"], id.as_str());

    let done = server.wait_status(&id, "completed").await;
    assert_eq!(done["object"], "task");
    // docs/api.md: RFC 3339 UTC with milliseconds.
    for field in ["created_at", "started_at", "finished_at"] {
        let at = done[field].as_str().unwrap();
        let millis = at
            .strip_suffix('Z')
            .and_then(|t| t.rsplit_once('.'))
            .map(|(_, fraction)| fraction.len());
        assert_eq!(millis, Some(3), "{field}: {at}");
    }
    assert_eq!(done["response_id"], response_id.as_str(), "one response id");
    assert_eq!(done["metadata"]["k"], "v");
    let events = server.all_events(&id).await;
    assert_log_invariants(&done, &events);
    // P-2: the first event was committed with the task, as it was at the 202.
    assert_eq!(events[0]["data"]["task"]["id"], id.as_str());
    assert_eq!(events[0]["data"]["task"]["status"], "queued");
    assert_eq!(events[0]["data"]["task"]["last_sequence_number"], 1);
    let kinds: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        &kinds[..3],
        [
            "response.created",
            "response.loading",
            "response.in_progress"
        ]
    );
    assert_eq!(
        &kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let (status, response) = server.get(&format!("/v1/responses/{response_id}")).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["output_text"], joined_deltas(&events).as_str());
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        response["output_text"]
    );
    assert_eq!(response["usage"]["output_tokens"], 24);
    assert_eq!(response["task_id"], id.as_str());
    let completed = events.last().unwrap();
    assert_eq!(completed["data"]["response"], response);
}

/// A synchronous request waits and answers 200 with the response; the same seed gives the same
/// text (the reference engine is deterministic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_request_answers_with_the_deterministic_response() {
    let server = TestServer::start(&[]);
    let body = json!({"model": "reference", "input": "Once upon a time", "seed": 3, "max_output_tokens": 16});
    let (status, headers, first) = server.post("/v1/responses", body.clone()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["background"], false);
    assert_eq!(headers["lmsp-task-id"], first["task_id"].as_str().unwrap());
    assert!(!first["output_text"].as_str().unwrap().is_empty());
    let (status, _, second) = server.post("/v1/responses", body).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(first["output_text"], second["output_text"]);
    assert_ne!(first["task_id"], second["task_id"]);
    assert_ne!(first["id"], second["id"]);
}

/// docs/api.md: a synchronous request whose task fails answers 500 with the task's error code; one
/// whose task is cancelled meanwhile answers 409 `task_cancelled`; both carry
/// `x-should-retry: false` and name the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_request_reports_a_failed_or_cancelled_task_without_retry() {
    let server = TestServer::start(&["--reference-token-delay", "50ms"]);
    let path = server.data_dir.join("models").join("gone.txt");
    std::fs::write(&path, "the fox runs into the forest and the dog sleeps").unwrap();
    let (status, _, model) = server
        .post(
            "/v1/models",
            json!({"id": "gone", "path": path.to_string_lossy()}),
        )
        .await;
    assert_eq!(status, 201, "{model}");
    std::fs::remove_file(&path).unwrap();
    let (status, headers, failed) = server
        .post(
            "/v1/responses",
            json!({"model": "gone", "input": "the fox"}),
        )
        .await;
    assert_eq!(status, 500, "{failed}");
    assert_envelope(status, &failed, "model_unavailable", "a failed task");
    assert_eq!(headers["x-should-retry"], "false");
    let task_id = headers["lmsp-task-id"].to_str().unwrap().to_owned();
    let (_, task) = server.get(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(task["status"], "failed");
    assert_eq!(task["error"]["code"], "model_unavailable");

    let waiting = {
        let request = server
            .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
            .json(&prompt(1, 10_000, "fail"));
        tokio::spawn(async move { request.send().await.unwrap() })
    };
    let deadline = Instant::now() + DEADLINE;
    let running = loop {
        let (_, list) = server.get("/v1/tasks?status=running").await;
        if let Some(task) = list["data"].as_array().unwrap().first() {
            break task["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the waiting task never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (status, _, _) = server
        .post(&format!("/v1/tasks/{running}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 202);
    let reply = waiting.await.unwrap();
    assert_eq!(reply.status().as_u16(), 409);
    assert_eq!(reply.headers()["x-should-retry"], "false");
    assert_eq!(reply.headers()["lmsp-task-id"], running.as_str());
    let body: Value = reply.json().await.unwrap();
    assert_envelope(409, &body, "task_cancelled", "a cancelled task");
}

/// P-4, I-3: cancel in every status, per the table of docs/api.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_follows_the_table_in_every_status_p4_i3() {
    let server = TestServer::start(&[
        "--workers",
        "1",
        "--reference-token-delay",
        "50ms",
        "--reference-cancel-delay",
        "300ms",
    ]);
    let running = server.submit(prompt(1, 10_000, "fail")).await;
    let queued = server.submit(prompt(2, 5, "fail")).await;
    server
        .wait_task(&running, "running with output", |t| {
            t["status"] == "running" && t["last_sequence_number"].as_u64() > Some(4)
        })
        .await;
    // queued → cancelled at once, 200.
    let (status, headers, task) = server
        .post(&format!("/v1/tasks/{queued}/cancel"), Value::Null)
        .await;
    assert_eq!((status, task["status"].as_str()), (200, Some("cancelled")));
    assert_eq!(task["object"], "task");
    assert_eq!(headers["lmsp-task-id"], queued.as_str());
    // cancelled again → 200, nothing new.
    let (status, _, again) = server
        .post(&format!("/v1/tasks/{queued}/cancel"), Value::Null)
        .await;
    assert_eq!(
        (status, again["last_sequence_number"].clone()),
        (200, task["last_sequence_number"].clone())
    );
    assert_log_invariants(&again, &server.all_events(&queued).await);
    // running → cancelling, 202; again → 202, nothing new; then cancelled.
    let (status, _, task) = server
        .post(&format!("/v1/tasks/{running}/cancel"), Value::Null)
        .await;
    assert_eq!((status, task["status"].as_str()), (202, Some("cancelling")));
    let (status, _, again) = server
        .post(&format!("/v1/tasks/{running}/cancel"), Value::Null)
        .await;
    if again["status"] == "cancelling" {
        assert_eq!(status, 202, "{again}");
        assert_eq!(again["last_sequence_number"], task["last_sequence_number"]);
    } else {
        // The worker stopped in between.
        assert_eq!((status, again["status"].as_str()), (200, Some("cancelled")));
    }
    let done = server.wait_status(&running, "cancelled").await;
    let events = server.all_events(&running).await;
    assert_log_invariants(&done, &events);
    // completed → 409 task_not_cancellable.
    let finished = server.submit(prompt(3, 3, "fail")).await;
    let before = server.wait_status(&finished, "completed").await;
    let (status, _, body) = server
        .post(&format!("/v1/tasks/{finished}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 409, "{body}");
    assert_envelope(status, &body, "task_not_cancellable", "completed");
    let (_, after) = server.get(&format!("/v1/tasks/{finished}")).await;
    assert_eq!(after, before, "nothing changed");
}

/// P-4: a cancel while the model loads ends `cancelled` without waiting for the load (which
/// would take an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_while_loading_ends_cancelled_p4() {
    let server = TestServer::start(&["--reference-load-delay", "1h"]);
    let id = server.submit(prompt(4, 5, "fail")).await;
    server.wait_status(&id, "loading").await;
    let (status, _, task) = server
        .post(&format!("/v1/tasks/{id}/cancel"), Value::Null)
        .await;
    assert_eq!((status, task["status"].as_str()), (202, Some("cancelling")));
    let done = server.wait_status(&id, "cancelled").await;
    assert_log_invariants(&done, &server.all_events(&id).await);
}

/// docs/api.md: `GET /v1/tasks` lists newest first, filters by status, and pages with `after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_list_is_newest_first_filters_by_status_and_pages() {
    let server = TestServer::start(&["--workers", "1", "--reference-load-delay", "1h"]);
    let mut ids = Vec::new();
    for seed in 0..5 {
        ids.push(server.submit(prompt(seed, 3, "fail")).await);
    }
    server.wait_status(&ids[0], "loading").await;
    let (status, page) = server.get("/v1/tasks?limit=2").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["object"], "list");
    let listed = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(listed(&page), [ids[4].clone(), ids[3].clone()]);
    assert_eq!(page["has_more"], true);
    let (_, next) = server
        .get(&format!("/v1/tasks?limit=2&after={}", ids[3]))
        .await;
    assert_eq!(listed(&next), [ids[2].clone(), ids[1].clone()]);
    let (_, last) = server
        .get(&format!("/v1/tasks?limit=2&after={}", ids[1]))
        .await;
    assert_eq!(listed(&last), [ids[0].clone()]);
    assert_eq!(last["has_more"], false);
    let (_, queued) = server.get("/v1/tasks?status=queued").await;
    assert_eq!(
        listed(&queued),
        ids[1..].iter().rev().cloned().collect::<Vec<_>>()
    );
    let (_, loading) = server.get("/v1/tasks?status=loading,running").await;
    assert_eq!(listed(&loading), [ids[0].clone()]);
    let (status, bad) = server.get("/v1/tasks?status=sleeping").await;
    assert_eq!(status, 400);
    assert_envelope(status, &bad, "invalid_request", "an unknown status");
}

/// P-5, P-6, I-4: finished tasks go after the retention, with their events and response;
/// unfinished ones stay, whatever their age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_purges_finished_tasks_and_keeps_unfinished_ones_p5_p6() {
    let server = TestServer::start(&[
        "--workers",
        "1",
        "--retention",
        "1s",
        "--purge-interval",
        "200ms",
        "--reference-token-delay",
        "100ms",
    ]);
    let finished = server.submit(prompt(1, 2, "fail")).await;
    let done = server.wait_status(&finished, "completed").await;
    let response_id = done["response_id"].as_str().unwrap().to_owned();
    let unfinished = server.submit(prompt(2, 100_000, "fail")).await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, _) = server.get(&format!("/v1/tasks/{finished}")).await;
        if status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the finished task was never purged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        server.get(&format!("/v1/responses/{response_id}")).await.0,
        404
    );
    assert_eq!(
        server.get(&format!("/v1/tasks/{finished}/events")).await.0,
        404
    );
    // The unfinished task is older than the retention by now, and stays.
    let (status, task) = server.get(&format!("/v1/tasks/{unfinished}")).await;
    assert_eq!(status, 200);
    assert!(["queued", "loading", "running"].contains(&task["status"].as_str().unwrap()));
    // Let a few more purge passes run while it is past the retention age.
    let runs = server.metric("lmsp_purge_runs_total").await;
    let deadline = Instant::now() + DEADLINE;
    while server.metric("lmsp_purge_runs_total").await < runs + 3.0 {
        assert!(Instant::now() < deadline, "the purge job stopped running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, task) = server.get(&format!("/v1/tasks/{unfinished}")).await;
    assert_eq!(status, 200, "P-6: never purged while unfinished");
    assert!(["queued", "loading", "running"].contains(&task["status"].as_str().unwrap()));
}
