//! A PostgreSQL restart under load (its own test target, so that no other test's database
//! connections are cut by it): while the database is away, submits answer 503
//! `storage_unavailable`, never a 202 for an unstored task; the instance reconnects by itself;
//! nothing acknowledged is lost and every accepted task ends.
//!
//! Needs the test cluster of `scripts/postgres-test-cluster` (`LMSP_TEST_POSTGRES_URL`, as
//! `scripts/test` starts it): it restarts that cluster with the script.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

use std::time::{Duration, Instant};

use common::{prompt, TestServer};
use serde_json::Value;

/// P-2, I-1, I-2: across a database restart every 202 names a stored task (a submit the store
/// cannot take answers 503 `storage_unavailable`), and every accepted task ends with a whole log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_loses_nothing_acknowledged() {
    let base = std::env::var("LMSP_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("LMSP_TEST_POSTGRES_URL is not set: run `scripts/postgres-test-cluster start`")
    });
    let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let name = format!(
        "lmsp_restart_{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    drop(client);
    let (prefix, _) = base.rsplit_once('/').unwrap();
    let database = format!("{prefix}/{name}");
    let server = TestServer::start(&[
        "--database",
        &database,
        "--workers",
        "2",
        "--reference-token-delay",
        "5ms",
    ]);

    let script = common::workspace_root().join("scripts/postgres-test-cluster");
    let restart = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let status = std::process::Command::new(script)
            .arg("restart")
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the cluster restarted");
    });
    let mut accepted = Vec::new();
    let mut unavailable = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        let mut body = prompt(accepted.len() as u64, 10, "retry");
        body["background"] = Value::Bool(true);
        let (status, headers, body) = server.post("/v1/responses", body).await;
        match status {
            202 => {
                accepted.push(body["task_id"].as_str().unwrap().to_owned());
                // A steady client, not a flood: the queue this leaves drains in seconds
                // however fast the machine accepts.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            503 => {
                assert_eq!(body["error"]["code"], "storage_unavailable", "{body}");
                assert!(headers.contains_key("retry-after"));
                unavailable += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("during a database restart a submit answered {other}: {body}"),
        }
    }
    restart.join().unwrap();
    assert!(!accepted.is_empty());
    // Each wait is bounded on its own (`wait_task`), so a task that never ends fails the test
    // while a long queue that keeps draining does not.
    for id in &accepted {
        let task = server
            .wait_task(id, "finished", |t| {
                ["completed", "failed", "cancelled"].contains(&t["status"].as_str().unwrap_or(""))
            })
            .await;
        let events = server.all_events(id).await;
        common::assert_log_invariants(&task, &events);
    }
    eprintln!(
        "database restart under load: {} accepted, {unavailable} answered 503, 0 lost",
        accepted.len()
    );
}
