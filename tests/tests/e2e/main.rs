//! End-to-end tests: the real `lmsp` binary as a process, on port 0 and a temp data directory.
//! No sleep is an assertion: every wait polls with a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use lmsp_tests::{assert_log_invariants, joined_deltas, TestServer};
use serde_json::{json, Value};

mod idempotency;
mod models;
mod pairing;

fn prompt(seed: u64, tokens: u64, policy: &str) -> Value {
    json!({"model": "reference", "input": "Once upon a time", "seed": seed,
           "max_output_tokens": tokens, "on_restart": policy})
}

/// The whole life of a background task: 202 with Location, then completed with a response whose
/// text is the joined deltas, and a log that satisfies I-2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_task_runs_to_completion_with_a_gapless_log_i2() {
    let server = TestServer::start(&[]);
    let (status, headers, task) = server
        .post(
            "/v1/responses",
            json!({
                "model": "reference", "input": "Once upon a time", "background": true, "seed": 7,
                "max_output_tokens": 24, "metadata": {"k": "v"}
            }),
        )
        .await;
    assert_eq!(status, 202, "{task}");
    let id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(headers["location"], format!("/v1/tasks/{id}").as_str());
    assert_eq!(headers["lmsp-task-id"], id.as_str());
    assert_eq!(task["object"], "task");
    assert_eq!(task["last_sequence_number"], 1);
    assert_eq!(task["metadata"]["k"], "v");
    let done = server.wait_status(&id, "completed").await;
    let events = server.all_events(&id).await;
    assert_log_invariants(&done, &events);
    let kinds: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        &kinds[..3],
        [
            "response.created",
            "response.loading",
            "response.in_progress"
        ]
    );
    let (status, response) = server
        .get(&format!(
            "/v1/responses/{}",
            done["response_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(response["output_text"], joined_deltas(&events).as_str());
    assert_eq!(response["usage"]["output_tokens"], 24);
    assert_eq!(response["task_id"], id.as_str());
}

/// A synchronous request waits and answers 200 with the response; the same seed gives the same
/// text (the reference engine is deterministic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_request_answers_with_the_deterministic_response() {
    let server = TestServer::start(&[]);
    let body = json!({"model": "reference", "input": "Once upon a time", "seed": 3, "max_output_tokens": 16});
    let (status, headers, first) = server.post("/v1/responses", body.clone()).await;
    assert_eq!(status, 200, "{first}");
    assert!(headers.contains_key("lmsp-task-id"));
    let (_, _, second) = server.post("/v1/responses", body).await;
    assert_eq!(first["output_text"], second["output_text"]);
    assert_ne!(first["task_id"], second["task_id"]);
}

/// `stream: true` answers an SSE stream from sequence 1 to the terminal event, then closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_request_sends_every_event_then_closes() {
    let server = TestServer::start(&[]);
    let response = server
        .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
        .json(&json!({"model": "reference", "input": "hello", "stream": true, "max_output_tokens": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let id = response.headers()["lmsp-task-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/tasks/{id}/events");
    let messages = server.sse(&path, None).await.collect_all().await;
    let ids: Vec<u64> = messages
        .iter()
        .map(|m| m.id.as_ref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        messages.last().unwrap().event.as_deref(),
        Some("response.completed")
    );
    assert_eq!(messages[0].data["type"], "response.created");
}

/// SSE reconnect with `Last-Event-ID` receives every later event exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_reconnect_with_last_event_id_gets_every_later_event_exactly_once() {
    let server = TestServer::start(&["--reference-token-delay", "20ms"]);
    let id = server.submit(prompt(11, 30, "fail")).await;
    let path = format!("/v1/tasks/{id}/events");
    let mut first = server.sse(&path, None).await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(first.next_message().await.unwrap());
    }
    drop(first);
    let last: u64 = seen.last().unwrap().id.as_ref().unwrap().parse().unwrap();
    let rest = server.sse(&path, Some(last)).await.collect_all().await;
    seen.extend(rest);
    let ids: Vec<u64> = seen
        .iter()
        .map(|m| m.id.as_ref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "every event exactly once, in order"
    );
    let task = server.wait_status(&id, "completed").await;
    assert_eq!(
        task["last_sequence_number"].as_u64(),
        Some(ids.len() as u64)
    );
}

/// P-4, I-3: cancel in every status, per the table of API.md §4.
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
    let (status, _, task) = server
        .post(&format!("/v1/tasks/{queued}/cancel"), Value::Null)
        .await;
    assert_eq!((status, task["status"].as_str()), (200, Some("cancelled")));
    // cancelled again → 200, nothing new.
    let (status, _, again) = server
        .post(&format!("/v1/tasks/{queued}/cancel"), Value::Null)
        .await;
    assert_eq!(
        (status, again["last_sequence_number"].clone()),
        (200, task["last_sequence_number"].clone())
    );
    // running → cancelling, 202; again → 202; then cancelled.
    let (status, _, task) = server
        .post(&format!("/v1/tasks/{running}/cancel"), Value::Null)
        .await;
    assert_eq!((status, task["status"].as_str()), (202, Some("cancelling")));
    let (status, _, _) = server
        .post(&format!("/v1/tasks/{running}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 202);
    let done = server.wait_status(&running, "cancelled").await;
    let events = server.all_events(&running).await;
    assert_log_invariants(&done, &events);
    // completed → 409 task_not_cancellable.
    let finished = server.submit(prompt(3, 3, "fail")).await;
    server.wait_status(&finished, "completed").await;
    let (status, _, body) = server
        .post(&format!("/v1/tasks/{finished}/cancel"), Value::Null)
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("task_not_cancellable"))
    );
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

struct Leftovers {
    by_policy: HashMap<&'static str, HashMap<&'static str, String>>,
}

/// P-7…P-11, I-5, I-6: SIGKILL with tasks in `queued`, `loading`, `running` and `cancelling` under
/// each policy, restart, and check every cell of the recovery table of API.md §7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_every_leftover_task_moves_by_the_recovery_table_p7_to_p11() {
    // Run 1: running, cancelling and queued tasks of each policy (6 workers: 3 run, 3 cancel).
    let mut server = TestServer::start(&[
        "--workers",
        "6",
        "--reference-token-delay",
        "30ms",
        "--reference-cancel-delay",
        "60s",
    ]);
    let mut leftovers = Leftovers {
        by_policy: HashMap::new(),
    };
    for (index, policy) in ["fail", "retry", "resume"].into_iter().enumerate() {
        let seed = 100 + index as u64;
        let running = server.submit(prompt(seed, 400, policy)).await;
        let cancelling = server.submit(prompt(seed + 10, 400, policy)).await;
        let cells = leftovers.by_policy.entry(policy).or_default();
        cells.insert("running", running);
        cells.insert("cancelling", cancelling);
    }
    for cells in leftovers.by_policy.values() {
        server
            .wait_task(&cells["running"], "running with output", |t| {
                t["status"] == "running" && t["last_sequence_number"].as_u64() > Some(6)
            })
            .await;
        server.wait_status(&cells["cancelling"], "running").await;
        let (status, _, _) = server
            .post(
                &format!("/v1/tasks/{}/cancel", cells["cancelling"]),
                Value::Null,
            )
            .await;
        assert_eq!(status, 202);
    }
    for (index, policy) in ["fail", "retry", "resume"].into_iter().enumerate() {
        let queued = server.submit(prompt(200 + index as u64, 5, policy)).await;
        leftovers
            .by_policy
            .get_mut(policy)
            .unwrap()
            .insert("queued", queued);
    }
    let before: HashMap<String, Value> = {
        let mut map = HashMap::new();
        for cells in leftovers.by_policy.values() {
            for id in cells.values() {
                map.insert(id.clone(), server.get(&format!("/v1/tasks/{id}")).await.1);
            }
        }
        map
    };
    for cells in leftovers.by_policy.values() {
        assert_eq!(before[&cells["cancelling"]]["status"], "cancelling");
        assert_eq!(before[&cells["running"]]["status"], "running");
    }
    // Restart with one worker that never gets past loading, so nothing moves after recovery.
    server.kill_and_restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    for (policy, cells) in &leftovers.by_policy {
        for (found, id) in cells {
            let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
            assert_eq!(status, 200);
            let events = server.all_events(id).await;
            let last = events.last().unwrap()["type"].as_str().unwrap().to_owned();
            let old = &before[id];
            let (expected_status, expected_event) = match (*found, *policy) {
                ("queued", "fail") | ("running", "fail") => ("failed", Some("response.failed")),
                ("queued", _) => ("queued", None),
                ("running", "retry") => ("queued", Some("response.queued")),
                ("running", _) => ("running", Some("response.resumed")),
                ("cancelling", _) => ("cancelled", Some("response.cancelled")),
                _ => unreachable!(),
            };
            // A queued task may have been claimed by the new worker (it loads for 60 s).
            let status_now = task["status"].as_str().unwrap();
            if expected_status == "queued" && status_now == "loading" {
                continue;
            }
            assert_eq!(status_now, expected_status, "{found}/{policy}: {task}");
            match expected_event {
                Some(kind) => {
                    assert_eq!(last, kind, "{found}/{policy}");
                    assert_eq!(task["restarts"], 1, "{found}/{policy}");
                    let lsn = task["last_sequence_number"].as_u64().unwrap();
                    let old_lsn = old["last_sequence_number"].as_u64().unwrap();
                    if *found == "running" {
                        // It kept streaming until the kill: recovery added one event after its
                        // last delta.
                        assert!(lsn > old_lsn, "{found}/{policy}");
                        let before_last = &events[events.len() - 2];
                        assert_eq!(before_last["type"], "response.output_text.delta");
                    } else {
                        assert_eq!(lsn, old_lsn + 1, "{found}/{policy}: one event");
                    }
                }
                None => {
                    assert_eq!(task["restarts"], 0, "{found}/{policy}: untouched");
                    assert_eq!(task["last_sequence_number"], old["last_sequence_number"]);
                }
            }
            if expected_status == "failed" {
                assert_eq!(task["error"]["code"], "server_restarted");
            }
            if expected_event == Some("response.resumed") {
                let resumed = events.last().unwrap();
                assert_eq!(
                    resumed["data"]["from_sequence_number"].as_u64(),
                    Some(events.len() as u64 - 1)
                );
            }
            assert_log_invariants(&task, &events);
        }
    }
    // Restart with zero delays: retried and resumed tasks complete; I-6 for the resumed one.
    server.kill_and_restart(&[]);
    let resumed = leftovers.by_policy["resume"]["running"].clone();
    let done = server.wait_status(&resumed, "completed").await;
    let events = server.all_events(&resumed).await;
    assert_log_invariants(&done, &events);
    let (_, response) = server
        .get(&format!(
            "/v1/responses/{}",
            done["response_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(response["output_text"], joined_deltas(&events).as_str());
    let (status, _, uninterrupted) = server.post("/v1/responses", prompt(102, 400, "fail")).await;
    assert_eq!(status, 200);
    assert_eq!(
        response["output_text"], uninterrupted["output_text"],
        "I-6: resumed output equals the uninterrupted one"
    );
    let retried = leftovers.by_policy["retry"]["running"].clone();
    let done = server.wait_status(&retried, "completed").await;
    let events = server.all_events(&retried).await;
    let (_, response) = server
        .get(&format!(
            "/v1/responses/{}",
            done["response_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        response["output_text"],
        joined_deltas(&events).as_str(),
        "retry's output is the new run's"
    );
}

/// P-7: a task killed while `loading` moves by its policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_a_loading_task_fails_or_requeues_by_policy_p8() {
    let mut server = TestServer::start(&["--workers", "3", "--reference-load-delay", "60s"]);
    let mut ids = Vec::new();
    for policy in ["fail", "retry", "resume"] {
        let id = server.submit(prompt(5, 5, policy)).await;
        ids.push((policy, id));
    }
    for (_, id) in &ids {
        server.wait_status(id, "loading").await;
    }
    server.kill_and_restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    for (policy, id) in &ids {
        let (_, task) = server.get(&format!("/v1/tasks/{id}")).await;
        let events = server.all_events(id).await;
        let last = events.last().unwrap()["type"].as_str().unwrap();
        if *policy == "fail" {
            assert_eq!(
                (task["status"].as_str(), last),
                (Some("failed"), "response.failed")
            );
            assert_eq!(task["error"]["code"], "server_restarted");
        } else {
            // queued + response.queued; the new worker may already be loading it again.
            assert!(
                events.iter().any(|e| e["type"] == "response.queued"),
                "{policy}: {events:?}"
            );
            assert!(["queued", "loading"].contains(&task["status"].as_str().unwrap()));
        }
        assert_eq!(task["restarts"], 1);
        assert_log_invariants(&task, &events);
    }
}

/// I-1, P-2: a task acknowledged with 202 survives a SIGKILL right after the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_task_survives_a_sigkill_right_after_the_reply_i1() {
    let mut server = TestServer::start(&["--workers", "1", "--reference-load-delay", "60s"]);
    let mut ids = Vec::new();
    for seed in 0..20 {
        ids.push(server.submit(prompt(seed, 5, "retry")).await);
    }
    server.kill_and_restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    for id in ids {
        let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(status, 200, "{id}");
        let events = server.all_events(&id).await;
        assert_eq!(events[0]["type"], "response.created");
        assert_log_invariants(&task, &events);
    }
}

/// P-5, P-6, I-4: finished tasks go after the retention; unfinished ones stay, whatever their age.
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, _) = server.get(&format!("/v1/tasks/{finished}")).await;
        if status == 404 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the finished task was never purged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        server.get(&format!("/v1/responses/{response_id}")).await.0,
        404
    );
    assert_eq!(
        server.get(&format!("/v1/tasks/{finished}/events")).await.0,
        404
    );
    let (status, task) = server.get(&format!("/v1/tasks/{unfinished}")).await;
    assert_eq!(status, 200);
    assert!(["queued", "loading", "running"].contains(&task["status"].as_str().unwrap()));
}

/// I-9: bad input gets a 4xx with the error envelope and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_4xx_envelope_and_creates_nothing_i9() {
    let server = TestServer::start(&[]);
    let token = server.admin_token.clone();
    let huge = "x".repeat(3 * 1024 * 1024);
    let rows: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        (
            "malformed json",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .header("content-type", "application/json")
                .body("{"),
            400,
            "invalid_request",
        ),
        (
            "wrong type",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .json(&json!({"model": "reference", "input": 5})),
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .json(&json!({"model": "reference", "input": "x", "bogus": 1})),
            400,
            "invalid_request",
        ),
        (
            "range",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .json(&json!({"model": "reference", "input": "x", "max_output_tokens": 0})),
            400,
            "invalid_request",
        ),
        (
            "unknown model",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .json(&json!({"model": "nope", "input": "x"})),
            404,
            "model_not_found",
        ),
        (
            "no content type",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .body("{}"),
            415,
            "unsupported_media_type",
        ),
        (
            "huge body",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .header("content-type", "application/json")
                .body(huge),
            413,
            "payload_too_large",
        ),
        (
            "huge body of the wrong type",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .header("content-type", "text/plain")
                .body("y".repeat(3 * 1024 * 1024)),
            415,
            "unsupported_media_type",
        ),
        (
            "no token",
            server
                .http
                .post(server.url("/v1/responses"))
                .json(&json!({"model": "reference", "input": "x"})),
            401,
            "unauthorized",
        ),
        (
            "bad token",
            server
                .request(reqwest::Method::POST, "/v1/responses", "lmsp_nope")
                .json(&json!({"model": "reference", "input": "x"})),
            401,
            "unauthorized",
        ),
        (
            "bad idempotency key",
            server
                .request(reqwest::Method::POST, "/v1/responses", &token)
                .header("idempotency-key", "")
                .json(&json!({"model": "reference", "input": "x"})),
            400,
            "invalid_idempotency_key",
        ),
        (
            "malformed task id",
            server.request(reqwest::Method::GET, "/v1/tasks/task_..%2F..%2Fetc", &token),
            404,
            "not_found",
        ),
        (
            "unknown task id",
            server.request(
                reqwest::Method::GET,
                "/v1/tasks/task_01ARZ3NDEKTSV4RRFFQ69G5FAV",
                &token,
            ),
            404,
            "not_found",
        ),
        (
            "bad list limit",
            server.request(reqwest::Method::GET, "/v1/tasks?limit=0", &token),
            400,
            "invalid_request",
        ),
        (
            "unknown route",
            server.request(reqwest::Method::GET, "/v1/nothing", &token),
            404,
            "not_found",
        ),
        (
            "model path traversal",
            server
                .request(reqwest::Method::POST, "/v1/models", &token)
                .json(&json!({"id": "evil", "path": "../../etc/passwd"})),
            400,
            "invalid_request",
        ),
    ];
    for (name, request, status, code) in rows {
        // A refused body is read to its end first, so the client gets the reply, not a reset.
        let response = request
            .send()
            .await
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(response.status().as_u16(), status, "{name}");
        if status == 401 {
            assert_eq!(response.headers()["www-authenticate"], "Bearer", "{name}");
        }
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{name}: {body}");
        assert!(body["error"]["message"].is_string(), "{name}");
        assert!(body["error"].get("param").is_some(), "{name}");
    }
    let (_, list) = server.get("/v1/tasks").await;
    assert_eq!(
        list["data"].as_array().unwrap().len(),
        0,
        "nothing was created: {list}"
    );
    let (_, models) = server.get("/v1/models").await;
    assert_eq!(
        models["data"].as_array().unwrap().len(),
        1,
        "only the reference model"
    );
}

/// I-7: a client sees only its own tasks; another's is a 404; a revoked token stops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_isolated_and_revocation_is_immediate_i7() {
    let server = TestServer::start(&[]);
    let alice = server.add_client("alice", &["responses:write", "responses:read"]);
    let bob = server.add_client("bob", &["responses:write", "responses:read"]);
    let reader = server.add_client("reader", &["responses:read"]);
    let (status, _, task) = server.post_as(&alice, "/v1/responses", json!({"model": "reference", "input": "hi", "background": true, "max_output_tokens": 3})).await;
    assert_eq!(status, 202);
    let id = task["id"].as_str().unwrap();
    assert_eq!(
        server.get_as(&alice, &format!("/v1/tasks/{id}")).await.0,
        200
    );
    assert_eq!(server.get_as(&bob, &format!("/v1/tasks/{id}")).await.0, 404);
    assert_eq!(
        server
            .get_as(&bob, &format!("/v1/tasks/{id}/events"))
            .await
            .0,
        404
    );
    assert_eq!(
        server
            .post_as(&bob, &format!("/v1/tasks/{id}/cancel"), Value::Null)
            .await
            .0,
        404
    );
    let (_, bobs) = server.get_as(&bob, "/v1/tasks").await;
    assert_eq!(bobs["data"].as_array().unwrap().len(), 0);
    assert_eq!(
        server.get(&format!("/v1/tasks/{id}")).await.0,
        200,
        "admin sees all"
    );
    let (status, _, body) = server
        .post_as(
            &reader,
            "/v1/responses",
            json!({"model": "reference", "input": "hi"}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden"))
    );
    let (_, clients) = server.get("/v1/clients").await;
    let bob_id = clients["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "bob")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!clients.to_string().contains("hash"));
    let response = server
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/clients/{bob_id}"),
            &server.admin_token,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    assert_eq!(server.get_as(&bob, "/v1/tasks").await.0, 401);
}

/// SIGTERM: new task requests get 503 during the grace, reads still work, exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_new_work_lets_running_tasks_finish_and_exits_zero() {
    let mut server =
        TestServer::start(&["--reference-token-delay", "20ms", "--shutdown-grace", "20s"]);
    let id = server.submit(prompt(9, 60, "fail")).await;
    server.wait_status(&id, "running").await;
    let pid = nix::unistd::Pid::from_raw(server.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, _, body) = server.post("/v1/responses", prompt(1, 1, "fail")).await;
        if status == 503 {
            assert_eq!(body["error"]["code"], "service_unavailable");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never refused new work"
        );
    }
    let status = server.terminate_wait();
    assert!(status.success(), "{status:?}");
    let mut server = server;
    server.kill_and_restart(&[]);
    let (_, task) = server.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(
        task["status"], "completed",
        "the running task finished within the grace"
    );
}

/// `GET /v1/service` and `GET /v1/health`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_document_keeps_its_id_across_restarts() {
    let mut server = TestServer::start(&[]);
    let health = server
        .http
        .get(server.url("/v1/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let (status, first) = server.get("/v1/service").await;
    assert_eq!(status, 200);
    assert_eq!(first["spec"], "LMSP 1.0");
    assert!(first["id"].as_str().unwrap().starts_with("svc_"));
    server.kill_and_restart(&[]);
    let (_, second) = server.get("/v1/service").await;
    assert_eq!(first["id"], second["id"]);
}

/// I-8: an idempotent retry replays the first reply and creates no second task, even across a
/// SIGKILL right after the 202.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_after_a_crash_replays_the_first_reply_i8() {
    let mut server = TestServer::start(&["--workers", "1", "--reference-load-delay", "60s"]);
    let body =
        json!({"model": "reference", "input": "hi", "background": true, "on_restart": "retry"});
    let send = |server: &TestServer, body: Value| {
        server
            .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
            .header("idempotency-key", "order-1")
            .json(&body)
            .send()
    };
    let first = send(&server, body.clone()).await.unwrap();
    assert_eq!(first.status().as_u16(), 202);
    let first_body: Value = first.json().await.unwrap();
    server.kill_and_restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    let again = send(&server, body.clone()).await.unwrap();
    assert_eq!(again.status().as_u16(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again_body: Value = again.json().await.unwrap();
    assert_eq!(again_body["id"], first_body["id"]);
    let mut other = body.clone();
    other["input"] = json!("something else");
    let reused = send(&server, other).await.unwrap();
    assert_eq!(reused.status().as_u16(), 422);
    let (_, list) = server.get("/v1/tasks").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
}

/// API.md §3: an admin's pairing code gives a new client a token once; wrong codes are 401, and
/// after five of them pairing answers 429 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_gives_a_new_client_a_token_once_and_limits_wrong_codes() {
    let server = TestServer::start(&[]);
    let (status, _, pairing) = server
        .post(
            "/v1/pairings",
            json!({"scopes": ["responses:read", "responses:write"]}),
        )
        .await;
    assert_eq!(status, 201, "{pairing}");
    let code = pairing["code"].as_str().unwrap().to_owned();
    let pair = |body: Value| server.http.post(server.url("/v1/pair")).json(&body).send();
    let too_wide = pair(json!({"code": code, "name": "phone", "scopes": ["admin"]}))
        .await
        .unwrap();
    assert_eq!(too_wide.status().as_u16(), 403);
    let paired = pair(json!({"code": code, "name": "phone", "scopes": ["responses:read"]}))
        .await
        .unwrap();
    assert_eq!(paired.status().as_u16(), 201);
    let paired: Value = paired.json().await.unwrap();
    let token = paired["token"].as_str().unwrap();
    assert!(paired["client_id"].as_str().unwrap().starts_with("cli_"));
    assert_eq!(server.get_as(token, "/v1/tasks").await.0, 200);
    let reused = pair(json!({"code": code, "name": "again", "scopes": ["responses:read"]}))
        .await
        .unwrap();
    assert_eq!(reused.status().as_u16(), 401, "a code works once");
    let (_, _, fresh) = server
        .post("/v1/pairings", json!({"scopes": ["responses:read"]}))
        .await;
    for _ in 0..4 {
        let wrong = pair(json!({"code": "000-000", "name": "x", "scopes": ["responses:read"]}))
            .await
            .unwrap();
        assert_eq!(wrong.status().as_u16(), 401);
    }
    let limited = pair(json!({"code": fresh["code"], "name": "x", "scopes": ["responses:read"]}))
        .await
        .unwrap();
    assert_eq!(limited.status().as_u16(), 429, "after five wrong codes");
    assert!(limited.headers().contains_key("retry-after"));
}

/// API.md §9: `/metrics` is admin-only Prometheus text that counts what was committed: tasks by
/// status, submitted and finished tasks, events written, and the group commits' histograms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_for_admins_and_count_committed_work() {
    let server = TestServer::start(&[]);
    let id = server.submit(prompt(3, 5, "fail")).await;
    let task = server.wait_status(&id, "completed").await;
    let response = server
        .request(reqwest::Method::GET, "/metrics", &server.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{series}` in\n{text}"))
    };
    assert_eq!(value("lmsp_tasks{status=\"completed\"}"), 1.0);
    assert_eq!(value("lmsp_tasks{status=\"queued\"}"), 0.0);
    assert_eq!(value("lmsp_tasks_submitted_total"), 1.0);
    assert_eq!(
        value("lmsp_tasks_finished_total{outcome=\"completed\"}"),
        1.0
    );
    assert_eq!(
        value("lmsp_events_written_total"),
        task["last_sequence_number"].as_f64().unwrap()
    );
    assert!(value("lmsp_commit_duration_seconds_count") >= 1.0);
    assert!(value("lmsp_commit_batch_commands_sum") >= 1.0);
    assert_eq!(value("lmsp_purged_tasks_total"), 0.0);
    assert_eq!(value("lmsp_recovery_tasks_total{outcome=\"moved\"}"), 0.0);

    let reader = server.add_client("reader", &["responses:read"]);
    assert_eq!(server.get_as(&reader, "/metrics").await.0, 403);
    let anonymous = server
        .http
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
}

/// Every request is logged once with its method, path, status and latency, and no log line ever
/// holds a token (I-7: no token in clear anywhere but the one reply that creates it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_logged_once_with_its_latency_and_never_a_token() {
    let server = TestServer::start_logging(&["--log-format", "json"]);
    let id = server.submit(prompt(4, 3, "fail")).await;
    server.wait_status(&id, "completed").await;
    let secret_path = format!("/v1/tasks/{id}");
    assert_eq!(server.get(&secret_path).await.0, 200);
    let lines = server.log_lines();
    let requests: Vec<Value> = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| entry["fields"]["message"] == "answered")
        .collect();
    let for_task: Vec<&Value> = requests
        .iter()
        .filter(|entry| entry["span"]["path"] == secret_path.as_str())
        .collect();
    assert!(
        !for_task.is_empty(),
        "no request line for {secret_path}: {lines:?}"
    );
    let line = for_task.last().unwrap();
    assert_eq!(line["span"]["method"], "GET");
    assert_eq!(line["fields"]["status"], 200);
    assert!(line["fields"]["latency_us"].is_u64());
    let token_body = server.admin_token.trim_start_matches("lmsp_");
    assert!(
        lines.iter().all(|line| !line.contains(token_body)),
        "a log line holds the token"
    );
}

/// API.md §5: a stream resumed at or past a task's terminal event (as a browser's `EventSource`
/// does after the server closed it) sends nothing more and closes, whether the task had already
/// finished or finishes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_at_or_past_the_terminal_event_closes() {
    let server = TestServer::start(&["--reference-token-delay", "20ms"]);
    let finished = server.submit(prompt(21, 3, "fail")).await;
    let task = server.wait_status(&finished, "completed").await;
    let terminal = task["last_sequence_number"].as_u64().unwrap();
    let closes = |id: String, last: u64| {
        let server = &server;
        async move {
            let mut stream = server
                .sse(&format!("/v1/tasks/{id}/events"), Some(last))
                .await;
            tokio::time::timeout(std::time::Duration::from_secs(30), stream.collect_all())
                .await
                .unwrap_or_else(|_| panic!("the stream of {id} after {last} never closed"))
        }
    };
    assert!(closes(finished.clone(), terminal).await.is_empty());
    assert!(closes(finished, terminal + 50).await.is_empty());
    let running = server.submit(prompt(22, 10, "fail")).await;
    assert!(
        closes(running, 1_000).await.is_empty(),
        "past the end of a running task"
    );
}
