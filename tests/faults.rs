//! Fault tests against the real binary: a full disk (provoked with SQLite's page cap, so no
//! privileges are needed) and a log sink whose reader is gone. Each asserts the contract from the
//! outside: no 202 for anything unstored, `storage_unavailable` with `Retry-After` while the fault
//! lasts, health telling the truth, nothing stranded once it clears, nothing lost after a
//! restart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{lmsp_binary, metric_in, prompt, TestServer, DEADLINE, TERMINAL};
use serde_json::Value;

const FINISHED: [&str; 3] = ["completed", "failed", "cancelled"];

/// Polls `GET /v1/health` until it answers `want`.
async fn wait_health(server: &TestServer, want: u16) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, body) = server.get("/v1/health").await;
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "health never answered {want}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every task id the admin sees.
async fn all_task_ids(server: &TestServer) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(id) => format!("/v1/tasks?limit=100&after={id}"),
            None => String::from("/v1/tasks?limit=100"),
        };
        let (status, page) = server.get(&path).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap();
        ids.extend(data.iter().map(|t| t["id"].as_str().unwrap().to_owned()));
        after = data.last().map(|t| t["id"].as_str().unwrap().to_owned());
        if page["has_more"] != Value::Bool(true) {
            return ids;
        }
    }
}

/// P-2, I-1: on a full disk, submits answer 503 `storage_unavailable` with `Retry-After` (never a
/// 202 for a task that was not stored, never a 500), health answers 503 and stays so while the
/// disk is full; as space is freed, health recovers, every accepted task ends (none stranded
/// `running` or `cancelling`), and after a restart every accepted task that was not deleted is
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_503_strands_nothing_and_loses_nothing_p2_i1() {
    let mut server = TestServer::start(&["--sqlite-max-pages", "160", "--workers", "2"]);
    let mut accepted: Vec<String> = Vec::new();
    let mut unavailable = 0;
    let mut first_503: Option<(reqwest::header::HeaderMap, Value)> = None;
    for seed in 0..5_000u64 {
        let (status, headers, body) = server
            .post("/v1/responses", {
                let mut body = prompt(seed, 40, if seed % 2 == 0 { "retry" } else { "fail" });
                body["background"] = Value::Bool(true);
                body
            })
            .await;
        match status {
            202 => accepted.push(body["task_id"].as_str().unwrap().to_owned()),
            503 => {
                unavailable += 1;
                first_503.get_or_insert((headers, body));
                if unavailable >= 20 {
                    break;
                }
            }
            other => panic!("a submit on a filling disk answered {other}: {body}"),
        }
    }
    let (headers, body) = first_503.expect("the capped database never filled up");
    assert_eq!(body["error"]["code"], "storage_unavailable", "{body}");
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1, "Retry-After: {retry_after}");
    let health = wait_health(&server, 503).await;
    assert_eq!(health["status"], "unavailable", "{health}");
    assert_eq!(health["reason"], "storage_unavailable", "{health}");
    // Health stays 503 while the disk stays full, through several probes (each commits a tiny
    // rewrite that would fit; the probe also asks for room, so it does not flap to 200).
    let steady_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < steady_until {
        let (status, health) = server.get("/v1/health").await;
        assert_eq!(
            status, 503,
            "health flapped while the disk was full: {health}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Free space as an operator would, while the disk is full: delete finished tasks (a delete
    // frees pages for SQLite to reuse). Tasks still queued when the disk filled run once there is
    // room, and may fill it again, so freeing goes on while health says the store is full. Health
    // must recover, and every accepted task that is left must end: none stays stranded `running`
    // or `cancelling`.
    let deadline = Instant::now() + DEADLINE;
    let mut ended = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    loop {
        let (health, _) = server.get("/v1/health").await;
        for id in &accepted {
            if ended.contains(id) {
                continue;
            }
            let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
            assert_eq!(status, 200, "I-1: an accepted task is stored: {task}");
            if !FINISHED.contains(&task["status"].as_str().unwrap()) {
                continue;
            }
            if task["status"] == "failed" {
                let code = task["error"]["code"].as_str().unwrap();
                assert!(
                    ["storage_unavailable", "server_restarted"].contains(&code),
                    "{task}"
                );
            }
            ended.insert(id.clone());
        }
        if health == 200 && ended.len() == accepted.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "health {health}, {} accepted tasks unfinished, {} deleted",
            accepted.len() - ended.len(),
            deleted.len()
        );
        let mut freed_now = 0;
        if health == 503 {
            let deletable: Vec<String> = ended.difference(&deleted).take(30).cloned().collect();
            for id in deletable {
                let response_id = id.replacen("task_", "resp_", 1);
                let (status, _, body) =
                    server.delete(&format!("/v1/responses/{response_id}")).await;
                if status == 200 {
                    deleted.insert(id);
                    freed_now += 1;
                } else {
                    assert_eq!(status, 503, "{body}");
                }
            }
        }
        // After freeing, give the health probe (once a second while unhealthy) time to look.
        let pause = if freed_now > 0 { 1_500 } else { 200 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    assert!(!deleted.is_empty(), "no finished task was deleted");
    let stored_before = all_task_ids(&server).await;

    // Nothing lost: after a restart without the cap every accepted, undeleted task is there.
    server.kill_and_restart(&[]);
    let stored_after = all_task_ids(&server).await;
    for id in accepted.iter().filter(|id| !deleted.contains(*id)) {
        assert!(stored_after.contains(id), "I-1: {id} was lost");
    }
    assert_eq!(stored_before, stored_after);
    eprintln!(
        "full disk: {} accepted, {unavailable} answered 503, {} deleted to free space, 0 stranded, 0 lost",
        accepted.len(),
        deleted.len()
    );
}

/// A log sink whose reader is gone (stderr a closed pipe) loses no reply: every submit is
/// answered and stored, every task completes, the lost lines are counted in
/// `lmsp_log_lines_dropped_total`, and SIGTERM still stops the server cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stderr_loses_no_reply_and_sigterm_still_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(lmsp_binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0"])
        // Every request logs a line: the sink is written to all the time.
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut token, mut base) = (None, None);
    while token.is_none() || base.is_none() {
        let line = lines.next().expect("the server exited").unwrap();
        if let Some(rest) = line.strip_prefix("admin token (shown once): ") {
            token = Some(rest.trim().to_owned());
        }
        if let Some(rest) = line.strip_prefix("lmsp listening on ") {
            base = Some(rest.trim().to_owned());
        }
    }
    drop(lines); // the reader is gone: every later write to stderr fails with EPIPE
    let (token, base) = (token.unwrap(), base.unwrap());
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for seed in 0..50u64 {
        let response = http
            .post(format!("{base}/v1/responses"))
            .bearer_auth(&token)
            .json(&prompt(seed, 5, "fail"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("submit {seed} got no reply: {e}"));
        assert_eq!(response.status().as_u16(), 200, "a synchronous submit");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["status"], "completed", "{body}");
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let response = http
            .get(format!("{base}/v1/responses/{id}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{id} is stored");
    }
    // Every request logged a line nobody could read: the metric counts them (polled: the log
    // writer is behind the requests).
    let deadline = Instant::now() + DEADLINE;
    loop {
        let metrics = http
            .get(format!("{base}/metrics"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let dropped = metric_in(&metrics, "lmsp_log_lines_dropped_total");
        if dropped >= 50.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {dropped} dropped log lines counted after 100 logged requests"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "SIGTERM ends with exit 0: {status:?}");
}

/// Runs `fiu-ctrl` on the server (its remote control pipe is `ctrl`): the fault injection is
/// switched on and off while the server runs.
fn fiu_ctrl(ctrl: &std::path::Path, pid: u32, command: &str) {
    let status = Command::new("fiu-ctrl")
        .arg("-f")
        .arg(ctrl)
        .args(["-c", command])
        .arg(pid.to_string())
        .status()
        .expect("fiu-ctrl is installed with fiu-utils (scripts/fault-test-deps)");
    assert!(status.success(), "fiu-ctrl {command}: {status:?}");
}

/// The fault points of the injected I/O errors: fsync 5 %, pwrite 2 %.
const FAULTS: [(&str, &str); 4] = [
    ("posix/io/sync/fsync", "0.05"),
    ("posix/io/sync/fdatasync", "0.05"),
    ("posix/io/rw/pwrite", "0.02"),
    ("posix/io/rw/pwrite64", "0.02"),
];

/// P-2, I-1, I-2: with fsync and write errors injected (libfiu), a submit is answered 202 only
/// once its task is stored and 503 `storage_unavailable` otherwise; once the faults stop, every
/// accepted task ends (none stranded), and after a SIGKILL and a restart every accepted task is
/// there with a consistent log, in a database whose integrity check passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_io_errors_strand_nothing_and_lose_nothing_p2_i1_i2() {
    let ctrl_dir = tempfile::tempdir().unwrap();
    let ctrl = ctrl_dir.path().join("fiu-ctrl");
    let ctrl_arg = ctrl.to_string_lossy().into_owned();
    let mut server = TestServer::start_wrapped(
        &["fiu-run", "-x", "-f", &ctrl_arg],
        &["--workers", "2", "--reference-token-delay", "2ms"],
        "warn",
    );
    let pid = server.child.as_ref().unwrap().id();
    for (name, probability) in FAULTS {
        fiu_ctrl(
            &ctrl,
            pid,
            &format!("enable_random name={name},probability={probability}"),
        );
    }
    let mut accepted = Vec::new();
    let mut unavailable = 0;
    let mut submits = Vec::new();
    for seed in 0..200u64 {
        let body = {
            let mut body = prompt(seed, 20, ["fail", "retry", "resume"][seed as usize % 3]);
            body["background"] = Value::Bool(true);
            body
        };
        submits.push(server.post("/v1/responses", body));
        if submits.len() == 8 || seed == 199 {
            for (status, headers, body) in futures::future::join_all(submits.drain(..)).await {
                match status {
                    202 => accepted.push(body["task_id"].as_str().unwrap().to_owned()),
                    503 => {
                        assert_eq!(body["error"]["code"], "storage_unavailable", "{body}");
                        assert!(headers.contains_key("retry-after"), "{headers:?}");
                        unavailable += 1;
                    }
                    other => panic!("with injected I/O errors a submit answered {other}: {body}"),
                }
            }
        }
    }
    drop(submits);
    for (name, _) in FAULTS {
        fiu_ctrl(&ctrl, pid, &format!("disable name={name}"));
    }
    assert!(!accepted.is_empty(), "nothing was accepted");
    wait_health(&server, 200).await;
    let mut failed_storage = 0;
    for id in &accepted {
        let task = server
            .wait_task(id, "finished", |t| {
                FINISHED.contains(&t["status"].as_str().unwrap_or(""))
            })
            .await;
        if task["error"]["code"] == "storage_unavailable" {
            failed_storage += 1;
        }
    }

    server.kill_and_restart(&[]);
    for id in &accepted {
        let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(status, 200, "I-1: {id} was lost");
        let events = server.all_events(id).await;
        common::assert_log_invariants(&task, &events);
    }
    server.kill();
    let conn = rusqlite::Connection::open(server.data_dir.join("lmsp.db")).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    eprintln!(
        "injected I/O errors: {} accepted, {unavailable} answered 503, {failed_storage} ended \
         storage_unavailable, 0 stranded, 0 lost, integrity ok",
        accepted.len()
    );
}

/// A stop answers a waiting synchronous request 503 with its `Lmsp-Task-Id` and `Retry-After`
/// (not an empty reply), ends an open stream at an event boundary, and the task goes on after
/// the restart (policy `retry`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_answers_waiting_requests_503_and_ends_streams_between_events() {
    let mut server =
        TestServer::start(&["--reference-token-delay", "50ms", "--shutdown-grace", "1s"]);
    let waiting = {
        let request = server
            .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
            .json(&prompt(1, 400, "retry"));
        tokio::spawn(request.send())
    };
    let streaming = {
        let mut body = prompt(2, 400, "retry");
        body["stream"] = Value::Bool(true);
        let request = server
            .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
            .json(&body);
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let text = response.text().await.expect("the stream ends cleanly");
            text
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.send_sigterm();
    let reply = waiting
        .await
        .unwrap()
        .expect("a reply, not a cut connection");
    assert_eq!(reply.status().as_u16(), 503);
    let task_id = reply.headers()["lmsp-task-id"].to_str().unwrap().to_owned();
    assert!(reply.headers().contains_key("retry-after"));
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["code"], "service_unavailable", "{body}");
    let stream = streaming.await.unwrap();
    assert!(
        stream.ends_with("\n\n"),
        "the stream ends between events: {stream:?}"
    );
    assert!(server.wait_exit().success());
    server.restart(&[]);
    let task = server.wait_status(&task_id, "completed").await;
    assert_eq!(task["restarts"], 1, "{task}");
}

/// Nothing waits forever on a full disk: a stream and a synchronous request opened on running
/// tasks before the disk fills both get their end once space is freed — the stream its terminal
/// event, the request its final answer — and every accepted task ends (none stranded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_opened_before_the_disk_fills_get_their_end_once_it_clears() {
    let server = TestServer::start(&[
        "--sqlite-max-pages",
        "160",
        "--workers",
        "4",
        "--reference-token-delay",
        "20ms",
    ]);
    let streamed = server.submit(prompt(1, 400, "fail")).await;
    let mut stream = server
        .sse(&format!("/v1/tasks/{streamed}/events"), None)
        .await;
    let waiting = tokio::spawn(
        server
            .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
            .json(&prompt(2, 400, "fail"))
            .send(),
    );
    let deadline = Instant::now() + DEADLINE;
    while server.task_count().await < 2 {
        assert!(
            Instant::now() < deadline,
            "the synchronous task was never created"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Fill the disk with a few large tasks (each ends at once, so deleting them frees space
    // without a queue of work to eat it again) until submits are refused.
    let large_input = "lorem ipsum ".repeat(4_000);
    let mut fillers = Vec::new();
    let mut unavailable = 0;
    for seed in 100..400u64 {
        let body = serde_json::json!({"model": "reference", "input": large_input, "seed": seed,
            "max_output_tokens": 1, "on_restart": "fail", "background": true});
        let (status, _, reply) = server.post("/v1/responses", body).await;
        match status {
            202 => fillers.push(reply["task_id"].as_str().unwrap().to_owned()),
            503 => {
                unavailable += 1;
                if unavailable >= 3 {
                    break;
                }
            }
            other => panic!("a submit on a filling disk answered {other}: {reply}"),
        }
    }
    assert!(unavailable >= 3, "the capped database never filled up");
    wait_health(&server, 503).await;
    let (_, task) = server.get(&format!("/v1/tasks/{streamed}")).await;
    assert!(
        !FINISHED.contains(&task["status"].as_str().unwrap_or("")),
        "the streamed task ended before the disk filled; the test proves nothing: {task}"
    );
    assert!(
        !waiting.is_finished(),
        "the synchronous request ended before the disk filled"
    );

    // Free space: delete every finished filler.
    let mut deleted = BTreeSet::new();
    for id in &fillers {
        let (_, task) = server.get(&format!("/v1/tasks/{id}")).await;
        if FINISHED.contains(&task["status"].as_str().unwrap_or("")) {
            let response_id = id.replacen("task_", "resp_", 1);
            if server
                .delete(&format!("/v1/responses/{response_id}"))
                .await
                .0
                == 200
            {
                deleted.insert(id.clone());
            }
        }
    }
    assert!(!deleted.is_empty(), "no finished filler could be deleted");

    let messages = tokio::time::timeout(DEADLINE, stream.collect_all())
        .await
        .expect("the stream ended once space was freed");
    let last = messages.last().expect("the stream sent events");
    assert!(
        TERMINAL.contains(&last.event.as_deref().unwrap_or("")),
        "the stream ends with its terminal event: {last:?}"
    );
    let reply = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("the synchronous request was answered")
        .unwrap()
        .expect("a reply, not a cut connection");
    let status = reply.status().as_u16();
    let answered = reply.headers()["lmsp-task-id"].to_str().unwrap().to_owned();
    let body: Value = reply.json().await.unwrap();
    match status {
        200 => assert!(
            FINISHED.contains(&body["status"].as_str().unwrap_or("")),
            "{body}"
        ),
        _ => assert!(body["error"]["code"].is_string(), "{status}: {body}"),
    }
    let left = fillers.iter().filter(|id| !deleted.contains(*id));
    for id in [&streamed, &answered].into_iter().chain(left) {
        server
            .wait_task(id, "finished", |t| {
                FINISHED.contains(&t["status"].as_str().unwrap_or(""))
            })
            .await;
    }
    eprintln!(
        "waiters across a full disk: stream ended with {:?}, synchronous request answered {status}, \
         {} fillers accepted, {unavailable} answered 503, {} deleted, 0 stranded",
        last.event,
        fillers.len(),
        deleted.len()
    );
}
