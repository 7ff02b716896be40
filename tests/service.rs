//! The service and its operations end to end (the README): the service document and health,
//! the OpenAPI document, metrics, the request log and JSON logs, files readable by their owner
//! only, `lmsp backup`, and a clean stop that leaves `lmsp.db` complete on its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{lmsp_binary, metric_in, prompt, TestServer, DEADLINE};
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
    assert_eq!(mode(&out), 0o600, "a backup holds prompts and outputs");
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

/// Checks that a stderr line under `--log-format json` is one JSON object of the log lines'
/// shape (`timestamp`, `level`, `fields.message`, `target`), and returns it.
fn json_log_line(line: &str) -> Value {
    let object: Value = serde_json::from_str(line)
        .unwrap_or_else(|_| panic!("a stderr line under --log-format json is not JSON: {line}"));
    assert!(object["timestamp"].is_string(), "{line}");
    assert!(
        ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
            .contains(&object["level"].as_str().unwrap_or("")),
        "{line}"
    );
    assert!(object["fields"]["message"].is_string(), "{line}");
    assert!(object["target"].is_string(), "{line}");
    object
}

/// Waits (bounded) for a child to exit.
fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lmsp did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Under `--log-format json` every line on stderr is one JSON object shaped like the log lines:
/// the admin token and the address a person must see, the request log, the stop — and the error
/// a start that cannot listen exits with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_json_logs_every_stderr_line_is_one_json_object() {
    let temp = tempfile::tempdir().unwrap();
    let mut child = Command::new(lmsp_binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(temp.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (sender, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let mut seen = Vec::new();
    let (mut token, mut base) = (None, None);
    while base.is_none() {
        let line = lines
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("no address printed; stderr: {seen:#?}"));
        let object = json_log_line(&line);
        if let Some(value) = object["fields"]["token"].as_str() {
            token = Some(value.to_owned());
        }
        if let Some(value) = object["fields"]["address"].as_str() {
            if value.starts_with("http://") {
                base = Some(value.to_owned());
            }
        }
        seen.push(line);
    }
    let token = token.expect("the first start prints the admin token");
    let reply = reqwest::Client::new()
        .get(format!("{}/v1/service", base.unwrap()))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_exit(&mut child).success());
    // The reader thread ends with stderr: everything after the address.
    let rest: Vec<String> = lines.iter().collect();
    let messages: Vec<String> = rest
        .iter()
        .map(|line| {
            json_log_line(line)["fields"]["message"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(messages.iter().any(|m| m == "answered"), "{rest:#?}");
    assert!(messages.iter().any(|m| m == "stopped"), "{rest:#?}");

    // A fatal start: the port is taken.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let output = Command::new(lmsp_binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(temp.path().join("data"))
        .args(["--log-format", "json", "--listen"])
        .arg(busy.local_addr().unwrap().to_string())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let text = String::from_utf8(output.stderr).unwrap();
    let objects: Vec<Value> = text.lines().map(json_log_line).collect();
    let last = objects.last().unwrap_or_else(|| panic!("no error printed"));
    assert_eq!(last["level"], "ERROR", "{text}");
    assert!(
        last["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot listen")),
        "{text}"
    );
}

/// A clean stop (SIGTERM) folds the write-ahead log into the database file: a copy of
/// `lmsp.db` alone, without its `-wal` and `-shm`, holds every task, and a server starts on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_clean_stop_lmsp_db_alone_holds_every_task() {
    let mut server = TestServer::start(&[]);
    let mut ids = Vec::new();
    for seed in 0..5 {
        let id = server.submit(prompt(seed, 3, "fail")).await;
        server.wait_status(&id, "completed").await;
        ids.push(id);
    }
    server.send_sigterm();
    assert!(server.wait_exit().success());

    let copy = tempfile::tempdir().unwrap();
    let alone = copy.path().join("data");
    std::fs::create_dir(&alone).unwrap();
    std::fs::copy(server.data_dir.join("lmsp.db"), alone.join("lmsp.db")).unwrap();
    let stored: i64 = {
        let conn = rusqlite::Connection::open(alone.join("lmsp.db")).unwrap();
        conn.query_row(
            "SELECT count(*) FROM tasks WHERE status = 'completed'",
            [],
            |row| row.get(0),
        )
        .unwrap()
    };
    assert_eq!(stored, 5, "every task is in lmsp.db itself");

    server.data_dir = alone;
    server.restart(&[]);
    for id in &ids {
        let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(status, 200, "{task}");
        assert_eq!(task["status"], "completed", "{task}");
    }
}

/// A SIGTERM sent the moment the address is announced stops the service gracefully (exit 0): the
/// handler is in place before the announcement, so the signal never meets the default action
/// that kills the process at once. Repeated, since the window it guards is short.
#[test]
fn a_sigterm_right_after_the_address_line_is_a_graceful_stop() {
    for _ in 0..5 {
        let temp = tempfile::tempdir().unwrap();
        let mut child = Command::new(lmsp_binary())
            .arg("serve")
            .arg("--data-dir")
            .arg(temp.path().join("data"))
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        loop {
            let line = lines
                .next()
                .expect("lmsp printed its address before its stderr ended")
                .unwrap();
            if line.starts_with("lmsp listening on ") {
                break;
            }
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        // Drain stderr so that the stop's log lines never block the process.
        std::thread::spawn(move || lines.for_each(drop));
        let status = wait_exit(&mut child);
        assert!(status.success(), "{status:?}");
    }
}
