//! Webhooks with two instances of the real binary on one PostgreSQL database: the outbox row is
//! written with the completion it announces, whichever instance ran the task, and each event is
//! delivered by one instance only (a delivery is claimed in the database before it is sent), so
//! a receiver that answers 200 gets every event exactly once.
//!
//! Needs a PostgreSQL server: `LMSP_TEST_POSTGRES_URL` (what `scripts/postgres-test-cluster
//! start` prints; `scripts/test` starts it). Without it the test fails, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::postgres::{fresh_database, instance};
use common::{prompt, TestServer};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the receiver got: each delivery's `webhook-id` header and its JSON body.
type Received = Arc<Mutex<Vec<(String, Value)>>>;

/// A webhook receiver on 127.0.0.1 that answers every delivery 200 and keeps it; its URL.
async fn receiver() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let received: Received = Arc::default();
    let kept = Arc::clone(&received);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve(stream, Arc::clone(&kept)));
        }
    });
    (url, received)
}

/// Serves one connection: reads requests (headers, then a `content-length` body), keeps each
/// and answers 200, until the sender closes it.
async fn serve(mut stream: TcpStream, received: Received) {
    let mut buffer = Vec::new();
    loop {
        let Some(end) = find(&buffer, b"\r\n\r\n") else {
            let mut chunk = [0_u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_string();
        let header = |name: &str| {
            head.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.eq_ignore_ascii_case(name)
                    .then(|| value.trim().to_owned())
            })
        };
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buffer.len() < end + 4 + length {
            let mut chunk = [0_u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Value = serde_json::from_slice(&buffer[end + 4..end + 4 + length])
            .unwrap_or_else(|e| panic!("a delivery's body is JSON: {e}"));
        let id = header("webhook-id").unwrap_or_default();
        received.lock().unwrap().push((id, body));
        buffer.drain(..end + 4 + length);
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Deliveries this instance made that the receiver took (`lmsp_webhook_attempts_total`).
async fn delivered_by(server: &TestServer) -> f64 {
    common::metric_or_zero(
        &server.metrics_text().await,
        "lmsp_webhook_attempts_total{outcome=\"delivered\"}",
    )
}

/// Forty responses submitted across two instances, each completion's `response.completed`
/// delivered exactly once (one `webhook-id` per response, never twice) by one of the two
/// instances: their delivered counters sum to the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_deliver_each_event_once() {
    const TASKS: u64 = 40;
    let database = fresh_database().await;
    let a = instance(&database, "a", None, &["--workers", "2"]);
    let b = instance(&database, "b", Some(&a.admin_token), &["--workers", "2"]);
    let (url, received) = receiver().await;
    let (status, _, endpoint) = a
        .post(
            "/v1/webhook_endpoints",
            json!({"name": "e2e", "url": url, "event_types": ["response.completed"]}),
        )
        .await;
    assert_eq!(status, 200, "{endpoint}");

    let mut responses = BTreeSet::new();
    let mut tasks = Vec::new();
    for seed in 0..TASKS {
        let via = if seed % 2 == 0 { &a } else { &b };
        let response = via.submit_response(prompt(seed, 8, "retry")).await;
        responses.insert(response["id"].as_str().unwrap().to_owned());
        tasks.push(response["task_id"].as_str().unwrap().to_owned());
    }
    for task in &tasks {
        a.wait_status(task, "completed").await;
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    while received.lock().unwrap().len() < responses.len() {
        assert!(
            Instant::now() < deadline,
            "{} of {} events delivered in 60 s",
            received.lock().unwrap().len(),
            responses.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Long enough for a second delivery of any event to arrive, were there one.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let received = received.lock().unwrap().clone();
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (id, body) in received {
        assert!(
            !id.is_empty(),
            "every delivery carries a webhook-id: {body}"
        );
        by_id.entry(id).or_default().push(body);
    }
    let twice: Vec<_> = by_id
        .iter()
        .filter(|(_, bodies)| bodies.len() > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "events delivered more than once: {twice:?}"
    );
    let announced: BTreeSet<String> = by_id
        .values()
        .map(|bodies| {
            let body = &bodies[0];
            assert_eq!(body["type"], "response.completed", "{body}");
            body["data"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(announced, responses, "one event per completed response");
    let delivered = delivered_by(&a).await + delivered_by(&b).await;
    assert_eq!(
        delivered, TASKS as f64,
        "the two instances' deliveries sum to the events"
    );
}
