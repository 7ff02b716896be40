//! Who goes first, end to end (docs/api.md, "Priority, fairness and limits"): service tiers,
//! fairness between clients, and the per-client and service-wide queue limits, with one worker so
//! that the order is the service's choice alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use common::{assert_envelope, prompt, TestServer};
use serde_json::{json, Value};

/// A body for the reference model at `tier`, `tokens` words long (put back in the queue, not
/// failed, by a restart).
fn at_tier(seed: u64, tokens: u64, tier: &str) -> Value {
    let mut body = prompt(seed, tokens, "retry");
    body["service_tier"] = json!(tier);
    body
}

/// A one-worker service whose reference model takes 20 ms a word.
fn one_worker(extra: &[&str]) -> TestServer {
    let mut args = vec!["--workers", "1", "--reference-token-delay", "20ms"];
    args.extend_from_slice(extra);
    TestServer::start(&args)
}

/// Submits a long task and waits until it runs: the one worker is busy until it is cancelled.
async fn occupy(server: &TestServer) -> String {
    let blocker = server.submit(prompt(1, 100_000, "fail")).await;
    server.wait_status(&blocker, "running").await;
    blocker
}

async fn cancel(server: &TestServer, task: &str) {
    let (status, _, body) = server
        .post(&format!("/v1/tasks/{task}/cancel"), Value::Null)
        .await;
    assert!(status == 200 || status == 202, "{status} {body}");
}

/// When a task started (RFC 3339 with milliseconds, so the text orders like the time), or `None`.
async fn started_at(server: &TestServer, task: &str) -> Option<String> {
    let (status, body) = server.get(&format!("/v1/tasks/{task}")).await;
    assert_eq!(status, 200, "{body}");
    body["started_at"].as_str().map(String::from)
}

/// A service tier is stored with the task and echoed: on the response object, the task and the
/// chat completion; `auto` and no tier are `default`; an unknown tier is a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_tier_is_echoed_and_an_unknown_one_is_refused() {
    let server = TestServer::start(&[]);
    for (asked, echoed) in [
        ("flex", "flex"),
        ("priority", "priority"),
        ("auto", "default"),
    ] {
        let response = server.submit_response(at_tier(3, 2, asked)).await;
        assert_eq!(response["service_tier"], echoed, "{response}");
        let task = response["task_id"].as_str().unwrap();
        let (_, stored) = server.get(&format!("/v1/tasks/{task}")).await;
        assert_eq!(stored["service_tier"], echoed, "{stored}");
    }
    let plain = server.submit_response(prompt(4, 2, "fail")).await;
    assert_eq!(plain["service_tier"], "default");
    let (status, _, completion) = server
        .post(
            "/v1/chat/completions",
            json!({"model": "reference", "max_tokens": 2, "service_tier": "flex",
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["service_tier"], "flex");
    let before = server.task_count().await;
    let (status, _, body) = server.post("/v1/responses", at_tier(5, 2, "scale")).await;
    assert_envelope(status, &body, "invalid_request", "an unknown tier");
    assert_eq!(body["error"]["param"], "service_tier");
    assert_eq!(server.task_count().await, before, "nothing created");
}

/// Issue 25: with one worker, 200 `flex` tasks queued and then one `default` task, the `default`
/// task starts next; the `flex` ones after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_task_starts_before_flex_tasks_queued_earlier() {
    let server = one_worker(&[]);
    let blocker = occupy(&server).await;
    let mut flex = Vec::new();
    for seed in 0..200 {
        flex.push(server.submit(at_tier(seed, 1, "flex")).await);
    }
    let default = server.submit(at_tier(999, 1, "default")).await;
    cancel(&server, &blocker).await;
    server.wait_status(&default, "completed").await;
    let first = started_at(&server, &default).await.unwrap();
    for task in &flex {
        if let Some(started) = started_at(&server, task).await {
            assert!(
                started >= first,
                "flex {task} started at {started}, before {first}"
            );
        }
    }
    server.wait_status(flex.last().unwrap(), "completed").await;
}

/// Issue 25: fairness within a tier, even with one worker: client A queues 100 tasks, then client
/// B one; B's task starts after at most one of A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_long_queue_lets_another_clients_task_start_after_at_most_one_of_its() {
    let server = one_worker(&[]);
    let scopes = ["responses:write", "responses:read"];
    let (a, b) = (
        server.add_client("a", &scopes),
        server.add_client("b", &scopes),
    );
    let blocker = occupy(&server).await;
    let submit = |token: String, seed: u64| {
        let server = &server;
        async move {
            let mut body = prompt(seed, 1, "fail");
            body["background"] = json!(true);
            let (status, _, response) = server.post_as(&token, "/v1/responses", body).await;
            assert_eq!(status, 202, "{response}");
            response["task_id"].as_str().unwrap().to_owned()
        }
    };
    let mut a_tasks = Vec::new();
    for seed in 0..100 {
        a_tasks.push(submit(a.clone(), seed).await);
    }
    let b_task = submit(b.clone(), 1000).await;
    cancel(&server, &blocker).await;
    server.wait_status(&b_task, "completed").await;
    let b_started = started_at(&server, &b_task).await.unwrap();
    let mut before = 0;
    for task in &a_tasks {
        if started_at(&server, task)
            .await
            .is_some_and(|started| started < b_started)
        {
            before += 1;
        }
    }
    assert!(before <= 1, "{before} of A's tasks started before B's");
}

/// Issue 25, I-9 (a refused submit changes nothing): a client's `max_queued` (set with `PATCH /v1/clients/{id}`, shown by
/// `GET /v1/clients`): the submit past it is 429 `rate_limited` with `Retry-After` and creates
/// nothing; lifting the limit (`null`) lets it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_past_the_clients_max_queued_is_429_and_creates_nothing() {
    let server = one_worker(&[]);
    let token = server.add_client("limited", &["responses:write", "responses:read"]);
    let (_, clients) = server.get("/v1/clients").await;
    let client = clients["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "limited")
        .unwrap()
        .clone();
    assert_eq!(client["max_queued"], Value::Null, "{client}");
    let path = format!("/v1/clients/{}", client["id"].as_str().unwrap());
    let (status, _, patched) = server
        .send(
            server
                .request(reqwest::Method::PATCH, &path, &server.admin_token)
                .json(&json!({"max_queued": 5})),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["max_queued"], 5);
    assert_eq!(
        patched["max_running"],
        Value::Null,
        "an absent field is kept"
    );
    let (status, _, refused) = server
        .send(
            server
                .request(reqwest::Method::PATCH, &path, &server.admin_token)
                .json(&json!({"max_queued": -1})),
        )
        .await;
    assert_envelope(status, &refused, "invalid_request", "a negative limit");

    occupy(&server).await;
    let body = || {
        let mut body = prompt(7, 1, "fail");
        body["background"] = json!(true);
        body
    };
    for _ in 0..5 {
        let (status, _, response) = server.post_as(&token, "/v1/responses", body()).await;
        assert_eq!(status, 202, "{response}");
    }
    let before = server.task_count().await;
    let (status, headers, refused) = server.post_as(&token, "/v1/responses", body()).await;
    assert_envelope(status, &refused, "rate_limited", "the sixth queued task");
    assert_eq!(status, 429);
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert_eq!(server.task_count().await, before, "nothing created");

    let (status, _, lifted) = server
        .send(
            server
                .request(reqwest::Method::PATCH, &path, &server.admin_token)
                .json(&json!({"max_queued": null})),
        )
        .await;
    assert_eq!(status, 200, "{lifted}");
    assert_eq!(lifted["max_queued"], Value::Null);
    let (status, _, response) = server.post_as(&token, "/v1/responses", body()).await;
    assert_eq!(status, 202, "{response}");
}

/// Issue 25, I-9 (a refused submit changes nothing): the service-wide `--max-queued`: past it a submit is 503 `service_unavailable` with
/// `Retry-After`, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_past_the_services_max_queued_is_503_and_creates_nothing() {
    let server = one_worker(&["--max-queued", "3"]);
    occupy(&server).await;
    for seed in 0..3 {
        server.submit(prompt(seed, 1, "fail")).await;
    }
    let before = server.task_count().await;
    let mut body = prompt(9, 1, "fail");
    body["background"] = json!(true);
    let (status, headers, refused) = server.post("/v1/responses", body).await;
    assert_envelope(status, &refused, "service_unavailable", "past --max-queued");
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert_eq!(server.task_count().await, before, "nothing created");
}

/// Issue 25: tiers hold across a kill -9 and restart: the queued `flex` tasks keep their tier and
/// a `default` task queued after them still starts first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_hold_after_a_kill_and_restart() {
    let mut server = one_worker(&[]);
    occupy(&server).await;
    let mut flex = Vec::new();
    for seed in 0..5 {
        flex.push(server.submit(at_tier(seed, 1, "flex")).await);
    }
    let default = server.submit(at_tier(99, 1, "default")).await;
    server.kill_and_restart(&["--workers", "1", "--reference-token-delay", "20ms"]);
    server.wait_status(&default, "completed").await;
    let first = started_at(&server, &default).await.unwrap();
    for task in &flex {
        let done = server.wait_status(task, "completed").await;
        assert_eq!(done["service_tier"], "flex", "{done}");
        assert!(done["started_at"].as_str().unwrap() >= first.as_str());
    }
}
