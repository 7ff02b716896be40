//! Idempotency keys (docs/api.md, I-8): replay of the first reply, key reuse, a key in use, scope
//! per client and path, canonical digests, expiry, and `POST /v1/models`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::time::{Duration, Instant};

use common::{assert_envelope, SseMessage, SseStream, TestServer, DEADLINE};
use serde_json::{json, Value};

async fn post_with_key(
    server: &TestServer,
    token: &str,
    path: &str,
    key: &str,
    body: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let request = server
        .request(reqwest::Method::POST, path, token)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned());
    server.send(request).await
}

/// I-8: the same key with the same body — in any key order or spacing — replays the first reply
/// (status, body, headers) and creates nothing; another body is 422; another client or path is
/// another key; a malformed key is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replays_its_first_reply_for_the_same_canonical_body_i8() {
    let server = TestServer::start(&["--workers", "1", "--reference-load-delay", "60s"]);
    let admin = server.admin_token.clone();
    let body = r#"{"model": "reference", "input": "hi", "background": true, "seed": 5}"#;
    let (status, headers, first) =
        post_with_key(&server, &admin, "/v1/responses", "k-1", body).await;
    assert_eq!(status, 202, "{first}");
    assert!(headers.get("idempotent-replayed").is_none());
    let reordered = r#"{ "seed":5,"background" :true, "input":"hi","model":"reference" }"#;
    let (status, replay_headers, replayed) =
        post_with_key(&server, &admin, "/v1/responses", "k-1", reordered).await;
    assert_eq!(status, 202);
    assert_eq!(replay_headers["idempotent-replayed"], "true");
    assert_eq!(replayed, first, "the same body");
    assert_eq!(replay_headers["location"], headers["location"]);
    assert_eq!(replay_headers["lmsp-task-id"], headers["lmsp-task-id"]);
    assert_eq!(server.task_count().await, 1);

    let other_body = r#"{"model": "reference", "input": "other", "background": true}"#;
    let (status, _, reused) =
        post_with_key(&server, &admin, "/v1/responses", "k-1", other_body).await;
    assert_eq!(status, 422, "{reused}");
    assert_envelope(status, &reused, "idempotency_key_reused", "another body");

    let other_client = server.add_client("other", &["responses:write", "responses:read"]);
    let (status, _, theirs) =
        post_with_key(&server, &other_client, "/v1/responses", "k-1", body).await;
    assert_eq!(status, 202, "a key is scoped to its client");
    assert_ne!(theirs["id"], first["id"]);

    for bad in [&"k".repeat(256), "with space", "tab\there"] {
        let (status, _, reply) = post_with_key(&server, &admin, "/v1/responses", bad, body).await;
        assert_eq!(status, 400, "{bad:?}: {reply}");
        assert_envelope(status, &reply, "invalid_idempotency_key", bad);
        assert_eq!(reply["error"]["param"], "Idempotency-Key", "{reply}");
    }
    let (status, _, _) =
        post_with_key(&server, &admin, "/v1/responses", &"k".repeat(255), body).await;
    assert_eq!(status, 202, "255 visible characters are a key");
    assert_eq!(server.task_count().await, 3);
}

/// docs/api.md: while the first request with a key is still being answered (a synchronous request
/// waiting for its task), the same key is 409 `idempotency_key_in_use`; afterwards it replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_in_use_while_its_first_request_is_answered() {
    let server = TestServer::start(&["--reference-token-delay", "50ms"]);
    let admin = server.admin_token.clone();
    let body = r#"{"model": "reference", "input": "hi", "max_output_tokens": 30, "seed": 1}"#;
    let first = {
        let request = server
            .request(reqwest::Method::POST, "/v1/responses", &admin)
            .header("idempotency-key", "sync-1")
            .header("content-type", "application/json")
            .body(body);
        tokio::spawn(async move { request.send().await.unwrap() })
    };
    // Poll until the first request's task exists, then send the same key again.
    let deadline = Instant::now() + DEADLINE;
    while server.task_count().await == 0 {
        assert!(
            Instant::now() < deadline,
            "the first request never created its task"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _, busy) = post_with_key(&server, &admin, "/v1/responses", "sync-1", body).await;
    assert_eq!(status, 409, "{busy}");
    assert_envelope(status, &busy, "idempotency_key_in_use", "in use");
    let first = first.await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["object"], "response");
    let (status, headers, replayed) =
        post_with_key(&server, &admin, "/v1/responses", "sync-1", body).await;
    assert_eq!(status, 200);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replayed, first);
    assert_eq!(server.task_count().await, 1);
}

/// docs/api.md: keys expire after `--idempotency-ttl`; the purge job removes them, and the same key
/// then starts a new task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_after_the_ttl_and_are_purged() {
    let server = TestServer::start(&["--idempotency-ttl", "1s", "--purge-interval", "200ms"]);
    let admin = server.admin_token.clone();
    let body =
        r#"{"model": "reference", "input": "hi", "background": true, "max_output_tokens": 2}"#;
    let (_, _, first) = post_with_key(&server, &admin, "/v1/responses", "ttl", body).await;
    assert!(first["id"].is_string(), "{first}");
    let deadline = Instant::now() + DEADLINE;
    while server.metric("lmsp_purged_idempotency_keys_total").await < 1.0 {
        assert!(Instant::now() < deadline, "the key was never purged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, headers, second) =
        post_with_key(&server, &admin, "/v1/responses", "ttl", body).await;
    assert_eq!(status, 202);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_ne!(second["id"], first["id"]);
}

/// docs/api.md: `POST /v1/models` takes a key too: the same body replays the 201, another is 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_registration_is_idempotent_with_a_key() {
    let server = TestServer::start(&[]);
    let admin = server.admin_token.clone();
    let path = server.data_dir.join("models").join("m.txt");
    std::fs::write(&path, b"weights").unwrap();
    let body = json!({"id": "m", "path": path.to_string_lossy()}).to_string();
    let (status, _, first) = post_with_key(&server, &admin, "/v1/models", "model-1", &body).await;
    assert_eq!(status, 201, "{first}");
    let (status, headers, again) =
        post_with_key(&server, &admin, "/v1/models", "model-1", &body).await;
    assert_eq!((status, &again), (201, &first));
    assert_eq!(headers["idempotent-replayed"], "true");
    let other = json!({"id": "m2", "path": path.to_string_lossy()}).to_string();
    let (status, _, reused) = post_with_key(&server, &admin, "/v1/models", "model-1", &other).await;
    assert_eq!(
        (status, reused["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    assert_eq!(server.get("/v1/models/m2").await.0, 404);
}

/// I-8: a synchronous or streaming request's key commits with its task, so a retry after the
/// client gave up — or after a crash — gets that task's outcome or events, never a second task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_synchronous_or_streaming_request_never_starts_a_second_task_i8() {
    let mut server = TestServer::start(&["--reference-token-delay", "30ms"]);
    let admin = server.admin_token.clone();
    let sync_body = r#"{"model": "reference", "input": "hi", "max_output_tokens": 20, "seed": 3, "on_restart": "retry"}"#;
    // The first client gives up long before the task ends.
    let gave_up = server
        .request(reqwest::Method::POST, "/v1/responses", &admin)
        .header("idempotency-key", "sync-retry")
        .header("content-type", "application/json")
        .body(sync_body)
        .timeout(std::time::Duration::from_millis(200))
        .send()
        .await;
    assert!(gave_up.is_err(), "the first client timed out");
    // Crash while the task runs; recovery puts it back in the queue (`retry`).
    server.kill_and_restart(&["--reference-token-delay", "30ms"]);
    let deadline = Instant::now() + DEADLINE;
    let (status, headers, outcome) = loop {
        let (status, headers, reply) =
            post_with_key(&server, &admin, "/v1/responses", "sync-retry", sync_body).await;
        if status != 409 {
            break (status, headers, reply);
        }
        assert!(Instant::now() < deadline, "the key stayed in use");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(outcome["object"], "response");
    assert_eq!(server.task_count().await, 1, "one task for the key");
    assert_eq!(
        outcome["task_id"],
        headers["lmsp-task-id"].to_str().unwrap()
    );

    let stream_body =
        r#"{"model": "reference", "input": "hi", "max_output_tokens": 5, "stream": true}"#;
    let first = server
        .request(reqwest::Method::POST, "/v1/responses", &admin)
        .header("idempotency-key", "stream-retry")
        .header("content-type", "application/json")
        .body(stream_body)
        .send()
        .await
        .unwrap();
    let task_id = first.headers()["lmsp-task-id"].to_str().unwrap().to_owned();
    drop(first);
    let again = server
        .request(reqwest::Method::POST, "/v1/responses", &admin)
        .header("idempotency-key", "stream-retry")
        .header("content-type", "application/json")
        .body(stream_body)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["lmsp-task-id"].to_str().unwrap(), task_id);
    let messages = SseStream::of(again).collect_all().await;
    let ids: Vec<u64> = messages.iter().map(SseMessage::seq).collect();
    assert_eq!(
        ids.first(),
        Some(&1),
        "the events again from the first: {ids:?}"
    );
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert_eq!(messages[0].data["response"]["task_id"], task_id.as_str());
    let last = messages.last().unwrap();
    assert_eq!(
        last.event.as_deref(),
        Some("response.completed"),
        "{last:?}"
    );
    let task = server.wait_status(&task_id, "completed").await;
    assert_eq!(task["last_sequence_number"].as_u64(), Some(last.seq()));
    assert_eq!(server.task_count().await, 2, "one task per key");
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
    let first_location = first.headers()["location"].clone();
    let first_body: Value = first.json().await.unwrap();
    server.kill_and_restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    let again = send(&server, body.clone()).await.unwrap();
    assert_eq!(again.status().as_u16(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], first_location);
    let again_body: Value = again.json().await.unwrap();
    assert_eq!(again_body, first_body, "the first reply, as it was");
    let mut other = body.clone();
    other["input"] = json!("something else");
    let reused = send(&server, other).await.unwrap();
    assert_eq!(reused.status().as_u16(), 422);
    assert_eq!(server.task_count().await, 1);
}

/// Polls until `GET /v1/tasks/{id}` answers 404: the purge job removed the task.
async fn wait_purged(server: &TestServer, task_id: &str) {
    let deadline = Instant::now() + DEADLINE;
    while server.get(&format!("/v1/tasks/{task_id}")).await.0 != 404 {
        assert!(Instant::now() < deadline, "{task_id} was never purged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// I-8, docs/api.md: a synchronous request's key keeps its final reply, so a retry after the
/// task was purged gets the very reply the first request got (`POST /v1/responses` and
/// `POST /v1/chat/completions`), with `Idempotent-Replayed: true`, and starts no task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_keys_final_reply_outlives_its_purged_task_i8() {
    let server = TestServer::start(&["--retention", "1s", "--purge-interval", "100ms"]);
    let admin = server.admin_token.clone();
    let cases = [
        (
            "/v1/responses",
            r#"{"model": "reference", "input": "hi", "max_output_tokens": 5, "seed": 4}"#,
            "response",
        ),
        (
            "/v1/chat/completions",
            r#"{"model": "reference", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "seed": 4}"#,
            "chat.completion",
        ),
    ];
    for (path, body, object) in cases {
        let (status, headers, first) =
            post_with_key(&server, &admin, path, "sync-purged", body).await;
        assert_eq!(
            (status, first["object"].as_str()),
            (200, Some(object)),
            "{first}"
        );
        let task_id = headers["lmsp-task-id"].to_str().unwrap().to_owned();
        wait_purged(&server, &task_id).await;

        let (status, replay_headers, replayed) =
            post_with_key(&server, &admin, path, "sync-purged", body).await;

        assert_eq!(status, 200, "{path}: {replayed}");
        assert_eq!(replayed, first, "{path}: the first reply again");
        assert_eq!(replay_headers["idempotent-replayed"], "true");
        assert_eq!(replay_headers["lmsp-task-id"], headers["lmsp-task-id"]);
        assert_eq!(server.task_count().await, 0, "{path}: no task was started");
    }
}

/// I-8 (a retry of a synchronous request whose task was purged answered 404): a client that
/// gives up while its task runs, and retries only after the task was purged, still gets the
/// task's outcome, not a 404, and no second task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_request_whose_client_gave_up_gets_its_outcome_after_the_purge_i8() {
    let server = TestServer::start(&[
        "--reference-token-delay",
        "30ms",
        "--retention",
        "1s",
        "--purge-interval",
        "100ms",
    ]);
    let admin = server.admin_token.clone();
    let body = r#"{"model": "reference", "input": "hi", "max_output_tokens": 20, "seed": 8}"#;
    let gave_up = server
        .request(reqwest::Method::POST, "/v1/responses", &admin)
        .header("idempotency-key", "gave-up")
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(gave_up.is_err(), "the first client timed out");
    let (status, page) = server.get("/v1/tasks?limit=1").await;
    assert_eq!(status, 200, "{page}");
    let task_id = page["data"][0]["id"].as_str().unwrap().to_owned();
    server.wait_status(&task_id, "completed").await;
    wait_purged(&server, &task_id).await;

    let (status, headers, outcome) =
        post_with_key(&server, &admin, "/v1/responses", "gave-up", body).await;

    assert_eq!(status, 200, "{outcome}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers["lmsp-task-id"].to_str().unwrap(), task_id);
    assert_eq!(outcome["object"], "response");
    assert_eq!(outcome["status"], "completed");
    assert_eq!(outcome["task_id"], task_id.as_str());
    assert!(
        !outcome["output_text"].as_str().unwrap().is_empty(),
        "{outcome}"
    );
    assert_eq!(server.task_count().await, 0, "no second task");
}

/// I-8, docs/api.md: a stream's key points at its task; once the task was purged its events are
/// gone, and a retry gets 404 `not_found` saying so (`Idempotent-Replayed: true`,
/// `x-should-retry: false`, the task's id), and starts no task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_key_answers_404_once_its_task_was_purged_i8() {
    let server = TestServer::start(&["--retention", "1s", "--purge-interval", "100ms"]);
    let admin = server.admin_token.clone();
    let body = r#"{"model": "reference", "input": "hi", "max_output_tokens": 3, "stream": true}"#;
    let first = server
        .request(reqwest::Method::POST, "/v1/responses", &admin)
        .header("idempotency-key", "stream-purged")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let task_id = first.headers()["lmsp-task-id"].to_str().unwrap().to_owned();
    let events = SseStream::of(first).collect_all().await;
    assert_eq!(
        events.last().and_then(|last| last.event.as_deref()),
        Some("response.completed")
    );
    wait_purged(&server, &task_id).await;

    let (status, headers, gone) =
        post_with_key(&server, &admin, "/v1/responses", "stream-purged", body).await;

    assert_eq!(status, 404, "{gone}");
    assert_envelope(status, &gone, "not_found", "a purged stream");
    assert!(
        gone["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&task_id),
        "{gone}"
    );
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers["x-should-retry"], "false");
    assert_eq!(headers["lmsp-task-id"].to_str().unwrap(), task_id);
    assert_eq!(server.task_count().await, 0, "no task was started");
}
