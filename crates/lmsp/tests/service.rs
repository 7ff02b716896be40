//! The service and its operations end to end (the README): the service document and health,
//! the OpenAPI document, metrics, the request log, files readable by their owner only, and
//! `lmsp backup`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{lmsp_binary, metric_in, prompt, TestServer};
use serde_json::{json, Value};

/// `GET /v1/service` and `GET /v1/health`; the service id never changes for a data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_document_keeps_its_id_across_restarts() {
    let mut server = TestServer::start(&["--retention", "2d", "--default-on-restart", "resume"]);
    let health = server
        .http
        .get(server.url("/v1/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let health: Value = health.json().await.unwrap();
    assert_eq!(health, json!({"status": "ok"}));
    let (status, first) = server.get("/v1/service").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "service");
    assert_eq!(first["spec"], "LMSP 1.0");
    assert!(first["id"].as_str().unwrap().starts_with("svc_"));
    assert!(first["version"].is_string());
    assert!(first["started_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(first["retention_seconds"], 2 * 24 * 3600);
    assert_eq!(first["default_on_restart"], "resume");
    // Any token reads it; none is a 401.
    let reader = server.add_client("reader", &["models:read"]);
    assert_eq!(server.get_as(&reader, "/v1/service").await.0, 200);
    let anonymous = server
        .http
        .get(server.url("/v1/service"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    // docs/api.md: a request that names no policy gets the service's default; no budget, 256.
    let accepted = server
        .submit_response(serde_json::json!({"model": "reference", "input": "hi"}))
        .await;
    assert_eq!(accepted["on_restart"], "resume");
    assert_eq!(accepted["max_output_tokens"], 256);
    assert!(
        accepted["seed"].is_u64(),
        "the service picks a seed: {accepted}"
    );
    assert!(server.announced_token.is_some());
    server.kill_and_restart(&[]);
    assert_eq!(
        server.announced_token, None,
        "the admin token is shown once"
    );
    let (_, second) = server.get("/v1/service").await;
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["default_on_restart"], "fail");
}

/// the README: `GET /v1/openapi.json` (no auth) is an OpenAPI 3.1 document of the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_the_api_without_auth() {
    let server = TestServer::start(&[]);
    let response = server
        .http
        .get(server.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let document: Value = response.json().await.unwrap();
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        document["openapi"]
    );
    for path in [
        "/v1/responses",
        "/v1/responses/{id}",
        "/v1/responses/{id}/cancel",
        "/v1/chat/completions",
        "/v1/tasks",
        "/v1/tasks/{id}",
        "/v1/tasks/{id}/cancel",
        "/v1/tasks/{id}/events",
        "/v1/models",
        "/v1/pairings",
        "/v1/pair",
        "/v1/clients",
        "/v1/health",
        "/v1/service",
    ] {
        assert!(document["paths"].get(path).is_some(), "no {path}");
    }
}

/// the README: `/metrics` is admin-only Prometheus text that counts what was committed: tasks by
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
    let value = |series: &str| metric_in(&text, series);
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
    // A path nothing else asks for (waiting polls the task itself).
    let secret_path = format!("/v1/tasks/{id}/events");
    assert_eq!(server.get(&secret_path).await.0, 200);
    // Another client's task is a 404, logged too.
    let reader = server.add_client("reader", &["responses:read"]);
    assert_eq!(server.get_as(&reader, &secret_path).await.0, 404);
    // The request log is written off the request path: poll for the two lines.
    let deadline = std::time::Instant::now() + common::DEADLINE;
    let (lines, for_task) = loop {
        let lines = server.log_lines();
        let for_task: Vec<Value> = lines
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|entry| entry["fields"]["message"] == "answered")
            .filter(|entry| entry["span"]["path"] == secret_path.as_str())
            .collect();
        if for_task.len() >= 2 {
            break (lines, for_task);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no request lines for {secret_path}: {lines:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(for_task.len(), 2, "once per request: {for_task:#?}");
    let statuses: Vec<&Value> = for_task.iter().map(|l| &l["fields"]["status"]).collect();
    assert_eq!(statuses, [&json!(200), &json!(404)]);
    for line in &for_task {
        assert_eq!(line["span"]["method"], "GET");
        assert!(line["fields"]["latency_us"].is_u64(), "{line}");
        assert!(!line.to_string().contains("?"), "never a query: {line}");
    }
    for token in [&server.admin_token, &reader] {
        let secret = token.trim_start_matches("lmsp_");
        assert!(
            lines.iter().all(|line| !line.contains(secret)),
            "a log line holds a token"
        );
    }
}

/// the README: every file the service creates is its owner's only (0600, directories 0700),
/// and `lmsp backup OUT` writes a consistent copy of the database while the server runs, from
/// which a server starts with the same tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_and_a_backup_of_a_running_server_is_complete() {
    let server = TestServer::start(&[]);
    let id = server.submit(prompt(7, 5, "fail")).await;
    let task = server.wait_status(&id, "completed").await;
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&server.data_dir), 0o700);
    assert_eq!(mode(&server.data_dir.join("models")), 0o700);
    for entry in std::fs::read_dir(&server.data_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
    assert_eq!(
        mode(&server.data_dir.join("models").join("reference.txt")),
        0o600
    );

    let copy = tempfile::tempdir().unwrap();
    let restored = copy.path().join("restored");
    std::fs::create_dir(&restored).unwrap();
    let out = restored.join("lmsp.db");
    let output = Command::new(lmsp_binary())
        .arg("backup")
        .arg(&out)
        .arg("--data-dir")
        .arg(&server.data_dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(out.is_file());
    // A server on the copy has the task, and the same identity.
    let mut second = TestServer::start(&[]);
    second.kill();
    second.data_dir = restored;
    second.admin_token = server.admin_token.clone();
    second.restart(&[]);
    let (status, copied) = second.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(status, 200, "{copied}");
    assert_eq!(copied, task);
    assert_eq!(
        second.get("/v1/service").await.1["id"],
        server.get("/v1/service").await.1["id"]
    );
}
