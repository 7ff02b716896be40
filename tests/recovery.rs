//! Crashes, restarts and shutdown end to end (the README, docs/rules.md): SIGKILL with tasks in every
//! unfinished status under every policy, the recovery table, acknowledged work surviving a
//! crash, and the graceful stop on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{assert_envelope, assert_log_invariants, joined_deltas, prompt, TestServer, DEADLINE};
use serde_json::{json, Value};

type Cells = HashMap<&'static str, HashMap<&'static str, String>>;

/// What the recovery table of docs/rules.md says for a task found in `found` under `policy`: its
/// status after recovery and the event recovery writes (none for a `queued` task that stays).
fn expected_move(found: &str, policy: &str) -> (&'static str, Option<&'static str>) {
    match (found, policy) {
        ("cancelling", _) => ("cancelled", Some("response.cancelled")),
        (_, "fail") => ("failed", Some("response.failed")),
        ("queued", _) => ("queued", None),
        ("running", "retry") => ("queued", Some("response.queued")),
        ("running", "resume") => ("running", Some("response.resumed")),
        _ => unreachable!("{found}/{policy}"),
    }
}

/// P-7…P-11, I-5, I-6: SIGKILL with tasks in `queued`, `running` and `cancelling` under each
/// policy, restart, and check every cell of the recovery table of docs/rules.md (`loading` has its
/// own test below); then let the moved tasks run: a resumed task's output equals the
/// uninterrupted one (I-6), a retried task's is its new run's.
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
    let mut cells: Cells = HashMap::new();
    for (index, policy) in ["fail", "retry", "resume"].into_iter().enumerate() {
        let seed = 100 + index as u64;
        let running = server.submit(prompt(seed, 400, policy)).await;
        let cancelling = server.submit(prompt(seed + 10, 400, policy)).await;
        let of_policy = cells.entry(policy).or_default();
        of_policy.insert("running", running);
        of_policy.insert("cancelling", cancelling);
    }
    for of_policy in cells.values() {
        server
            .wait_task(&of_policy["running"], "running with output", |t| {
                t["status"] == "running" && t["last_sequence_number"].as_u64() > Some(6)
            })
            .await;
        server
            .wait_task(&of_policy["cancelling"], "running with output", |t| {
                t["status"] == "running" && t["last_sequence_number"].as_u64() > Some(6)
            })
            .await;
        let (status, _, _) = server
            .post(
                &format!("/v1/tasks/{}/cancel", of_policy["cancelling"]),
                Value::Null,
            )
            .await;
        assert_eq!(status, 202);
    }
    for (index, policy) in ["fail", "retry", "resume"].into_iter().enumerate() {
        let queued = server.submit(prompt(200 + index as u64, 5, policy)).await;
        cells.get_mut(policy).unwrap().insert("queued", queued);
    }
    let mut before: HashMap<String, Value> = HashMap::new();
    for of_policy in cells.values() {
        for id in of_policy.values() {
            before.insert(id.clone(), server.get(&format!("/v1/tasks/{id}")).await.1);
        }
    }
    for of_policy in cells.values() {
        assert_eq!(before[&of_policy["cancelling"]]["status"], "cancelling");
        assert_eq!(before[&of_policy["running"]]["status"], "running");
    }
    // Restart with one worker that never gets past loading, so nothing moves after recovery
    // but a queued task that the worker claims (it then loads for a minute).
    server.kill_and_restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    for (policy, of_policy) in &cells {
        for (found, id) in of_policy {
            let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
            assert_eq!(status, 200);
            let events = server.all_events(id).await;
            let old = &before[id];
            let (expected_status, expected_event) = expected_move(found, policy);
            let status_now = task["status"].as_str().unwrap();
            let context = format!("{found}/{policy}: {task}");
            match expected_event {
                None => {
                    // Untouched by recovery; the new worker may have claimed it since.
                    assert_eq!(task["restarts"], 0, "{context}: untouched");
                    assert!(
                        ["queued", "loading"].contains(&status_now),
                        "{context}: {events:?}"
                    );
                    assert!(
                        events
                            .iter()
                            .all(|e| e["type"] != "response.queued"
                                && e["type"] != "response.failed"),
                        "{context}: no recovery event"
                    );
                    if status_now == "queued" {
                        assert_eq!(task["last_sequence_number"], old["last_sequence_number"]);
                    }
                }
                Some(kind) => {
                    assert_eq!(task["restarts"], 1, "{context}");
                    let lsn = task["last_sequence_number"].as_u64().unwrap();
                    let old_lsn = old["last_sequence_number"].as_u64().unwrap();
                    // What recovery wrote is the log's last event, unless a queued task was
                    // claimed since (then `response.loading` follows it).
                    let moved_at = if status_now == "loading" && expected_status == "queued" {
                        assert_eq!(events.last().unwrap()["type"], "response.loading");
                        events.len() - 2
                    } else {
                        assert_eq!(status_now, expected_status, "{context}");
                        events.len() - 1
                    };
                    assert_eq!(events[moved_at]["type"], kind, "{context}");
                    match *found {
                        "running" => {
                            // It kept streaming until the kill: recovery wrote after its last
                            // delta; a run put back in the queue first closes its item as
                            // incomplete, in the same transaction.
                            assert!(lsn > old_lsn, "{context}");
                            let mut before_move = &events[moved_at - 1];
                            if *policy == "retry" {
                                assert_eq!(before_move["type"], "response.output_item.done");
                                assert_eq!(before_move["data"]["status"], "incomplete");
                                before_move = &events[moved_at - 2];
                            }
                            assert_eq!(
                                before_move["type"], "response.output_text.delta",
                                "{context}"
                            );
                        }
                        _ => {
                            assert_eq!(lsn, old_lsn + 1, "{context}: one event");
                        }
                    }
                    if kind == "response.resumed" {
                        assert_eq!(
                            events[moved_at]["data"]["from_sequence_number"].as_u64(),
                            Some(moved_at as u64),
                            "{context}: the snapshot covers the last delta"
                        );
                    }
                }
            }
            if expected_status == "failed" {
                assert_eq!(task["error"]["code"], "server_restarted", "{context}");
                assert_eq!(
                    events.last().unwrap()["data"]["error"]["code"],
                    "server_restarted"
                );
            }
            assert_log_invariants(&task, &events);
        }
    }
    // Restart with zero delays: retried and resumed tasks complete; I-6 for the resumed one.
    server.kill_and_restart(&[]);
    let resumed = cells["resume"]["running"].clone();
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
    assert_eq!(response["restarts"], 2);
    let (status, _, uninterrupted) = server.post("/v1/responses", prompt(102, 400, "fail")).await;
    assert_eq!(status, 200, "{uninterrupted}");
    assert_eq!(
        response["output_text"], uninterrupted["output_text"],
        "I-6: resumed output equals the uninterrupted one"
    );
    let retried = cells["retry"]["running"].clone();
    let done = server.wait_status(&retried, "completed").await;
    let events = server.all_events(&retried).await;
    assert_log_invariants(&done, &events);
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
    // The new run opened a new item (next output_index); the response holds only that one.
    let items: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .collect();
    assert!(items.len() >= 2, "{items:?}");
    let last_item = items.last().unwrap();
    assert_ne!(items[0]["data"]["item_id"], last_item["data"]["item_id"]);
    assert_eq!(response["output"].as_array().unwrap().len(), 1);
    assert_eq!(response["output"][0]["id"], last_item["data"]["item_id"]);
    let (_, _, uninterrupted) = server.post("/v1/responses", prompt(101, 400, "fail")).await;
    assert_eq!(
        response["output_text"], uninterrupted["output_text"],
        "a retried run starts again from nothing"
    );
}

/// P-7, P-8: a task killed while `loading` moves by its policy: `fail` fails it, `retry` and
/// `resume` put it back in the queue.
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
    let mut accepted = Vec::new();
    for seed in 0..20 {
        accepted.push(server.submit_response(prompt(seed, 5, "retry")).await);
    }
    server.kill_and_restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    for response in accepted {
        let id = response["task_id"].as_str().unwrap();
        let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(status, 200, "{id}");
        assert_eq!(task["response_id"], response["id"]);
        let events = server.all_events(id).await;
        assert_eq!(events[0]["type"], "response.created");
        assert_log_invariants(&task, &events);
        let (status, again) = server
            .get(&format!(
                "/v1/responses/{}",
                response["id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(status, 200, "{again}");
    }
    assert_eq!(server.task_count().await, 20);
}

/// the README: SIGTERM stops new work — new task requests get 503 `service_unavailable` during
/// the grace, reads still work — lets the running task finish, and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_new_work_lets_running_tasks_finish_and_exits_zero() {
    let mut server =
        TestServer::start(&["--reference-token-delay", "20ms", "--shutdown-grace", "20s"]);
    let id = server.submit(prompt(9, 100, "fail")).await;
    server.wait_status(&id, "running").await;
    server.send_sigterm();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Background submits, so no probe waits on its task: a synchronous one accepted just before
    // the signal is handled waits for a task no worker starts during the grace, and is answered
    // 503 only when the server stops (its task stays queued for the next start).
    let mut probe = prompt(1, 1, "fail");
    probe["background"] = json!(true);
    loop {
        let (status, headers, body) = server.post("/v1/responses", probe.clone()).await;
        match status {
            503 => {
                assert_envelope(status, &body, "service_unavailable", "during the grace");
                assert!(headers.contains_key("retry-after"), "{headers:?}");
                break;
            }
            // Before the signal is handled a submit is still accepted.
            202 => {}
            other => panic!("a submit during shutdown answered {other} (not 202/503): {body}"),
        }
        assert!(Instant::now() < deadline, "never refused new work");
    }
    // Reads still work during the grace.
    let (status, task) = server.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(status, 200, "{task}");
    let exit = server.wait_exit();
    assert!(exit.success(), "{exit:?}");
    server.restart(&[]);
    let (_, task) = server.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(
        task["status"], "completed",
        "the running task finished within the grace"
    );
    assert_eq!(task["restarts"], 0, "nothing was left for recovery");
}

/// the README: a second `lmsp serve` on a data directory in use exits non-zero with a clear
/// message and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_data_directory_exits_and_changes_nothing() {
    let server = TestServer::start(&["--workers", "1", "--reference-load-delay", "60s"]);
    let id = server.submit(prompt(1, 5, "fail")).await;
    let task = server.wait_status(&id, "loading").await;
    let mut second = std::process::Command::new(common::lmsp_binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(&server.data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("the second server kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut message = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut message).unwrap();
    assert!(!status.success(), "{status:?}");
    assert!(message.contains("in use"), "{message}");
    let (_, now) = server.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(now, task, "recovery did not run on the live server's task");
}

/// Runs `lmsp serve` on `data_dir` with `--listen` on a port this test holds, and returns its
/// exit status and stderr (bounded).
fn serve_on_a_busy_port(data_dir: &std::path::Path) -> (std::process::ExitStatus, String) {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = busy.local_addr().unwrap().to_string();
    let mut child = std::process::Command::new(common::lmsp_binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", &address])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a server that cannot listen kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut message = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut message).unwrap();
    drop(busy);
    (status, message)
}

/// the README: a start that cannot listen exits non-zero with a clear message and changes
/// nothing: on a new data directory it creates no database (so no admin token is shown and
/// lost), and on one with leftover tasks it does not recover them — the next start does, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_cannot_listen_exits_and_changes_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let fresh = temp.path().join("fresh");
    let (status, message) = serve_on_a_busy_port(&fresh);
    assert!(!status.success(), "{status:?}");
    assert!(message.contains("cannot listen"), "{message}");
    assert!(!message.contains("lmsp_"), "no token shown: {message}");
    assert!(!fresh.join("lmsp.db").exists(), "no database was created");

    let mut server = TestServer::start(&["--reference-token-delay", "30ms"]);
    assert!(server.admin_token.starts_with("lmsp_"));
    let id = server.submit(prompt(31, 400, "resume")).await;
    server
        .wait_task(&id, "running with output", |t| {
            t["status"] == "running" && t["last_sequence_number"].as_u64() > Some(6)
        })
        .await;
    server.kill();
    let (status, message) = serve_on_a_busy_port(&server.data_dir);
    assert!(!status.success(), "{status:?}");
    assert!(message.contains("cannot listen"), "{message}");
    server.restart(&["--workers", "1", "--reference-load-delay", "60s"]);
    let (_, task) = server.get(&format!("/v1/tasks/{id}")).await;
    let events = server.all_events(&id).await;
    let resumed = events
        .iter()
        .filter(|e| e["type"] == "response.resumed")
        .count();
    assert_eq!(
        (task["restarts"].as_u64(), resumed),
        (Some(1), 1),
        "recovered once, by the start that served: {task}"
    );
    assert_log_invariants(&task, &events);
}
