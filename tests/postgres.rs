//! Several instances of the real binary on one PostgreSQL database (`lmsp serve --database`):
//! every task is claimed and run once, a killed instance's tasks are recovered by another once
//! its lease runs out, and a cancel sent to any instance stops the task where it runs.
//!
//! Needs a PostgreSQL server: `LMSP_TEST_POSTGRES_URL` (what `scripts/postgres-test-cluster
//! start` prints; `scripts/test` starts it). Without it the tests fail, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

use common::postgres::{fresh_database, instance};
use common::{prompt, TestServer};
use serde_json::Value;
use std::collections::BTreeSet;

async fn finished(server: &TestServer, id: &str) -> Value {
    server
        .wait_task(id, "finished", |t| {
            ["completed", "failed", "cancelled"].contains(&t["status"].as_str().unwrap_or(""))
        })
        .await
}

/// Three instances share one queue: two hundred tasks submitted across the instances are each claimed once
/// (one `response.loading`, no restart) and complete; every instance answers for every task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_run_each_task_once() {
    let database = fresh_database().await;
    let first = instance(
        &database,
        "a",
        None,
        &["--workers", "2", "--reference-token-delay", "5ms"],
    );
    let token = first.admin_token.clone();
    let second = instance(
        &database,
        "b",
        Some(&token),
        &["--workers", "2", "--reference-token-delay", "5ms"],
    );
    let third = instance(
        &database,
        "c",
        Some(&token),
        &["--workers", "2", "--reference-token-delay", "5ms"],
    );
    let mut ids = Vec::new();
    for seed in 0..200u64 {
        let submitter = [&first, &second, &third][seed as usize % 3];
        ids.push(submitter.submit(prompt(seed, 20, "retry")).await);
    }
    for (index, id) in ids.iter().enumerate() {
        let reader = [&first, &second, &third][index % 3];
        let task = finished(reader, id).await;
        assert_eq!(task["status"], "completed", "{task}");
        assert_eq!(task["restarts"], 0, "{task}");
        let events = reader.all_events(id).await;
        common::assert_log_invariants(&task, &events);
        let loads = events
            .iter()
            .filter(|e| e["type"] == "response.loading")
            .count();
        assert_eq!(loads, 1, "claimed once: {events:?}");
    }
}

/// P-7, I-5: when an instance is killed, another recovers its running tasks once its lease has
/// run out (policy `retry`: requeued once, then run to completion), and touches no task of a
/// live instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_tasks_are_recovered_by_another_p7_i5() {
    let database = fresh_database().await;
    let slow = ["--workers", "4", "--reference-token-delay", "20ms"];
    let mut doomed = instance(&database, "doomed", None, &slow);
    let token = doomed.admin_token.clone();
    let mut ids = Vec::new();
    for seed in 0..4u64 {
        ids.push(doomed.submit(prompt(seed, 400, "retry")).await);
    }
    for id in &ids {
        doomed.wait_status(id, "running").await;
    }
    let survivor = instance(&database, "survivor", Some(&token), &["--workers", "4"]);
    doomed.kill();
    let mut restarts = BTreeSet::new();
    for id in &ids {
        let task = finished(&survivor, id).await;
        assert_eq!(task["status"], "completed", "{task}");
        restarts.insert(task["restarts"].as_u64().unwrap());
        let events = survivor.all_events(id).await;
        common::assert_log_invariants(&task, &events);
        let requeued = events
            .iter()
            .filter(|e| e["type"] == "response.queued")
            .count();
        assert_eq!(requeued, 1, "recovered once: {events:?}");
    }
    assert_eq!(restarts, BTreeSet::from([1]));
}

/// I-6 across instances: a `resume` task running on a killed instance is resumed by another from
/// its snapshot, and its output equals an uninterrupted run of the same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_task_of_a_killed_instance_continues_exactly_i6() {
    let database = fresh_database().await;
    let mut doomed = instance(
        &database,
        "doomed",
        None,
        &["--workers", "1", "--reference-token-delay", "20ms"],
    );
    let token = doomed.admin_token.clone();
    let id = doomed.submit(prompt(77, 300, "resume")).await;
    doomed
        .wait_task(&id, "some output", |t| {
            t["last_sequence_number"].as_u64().unwrap_or(0) > 30
        })
        .await;
    let survivor = instance(&database, "survivor", Some(&token), &["--workers", "1"]);
    doomed.kill();
    let task = finished(&survivor, &id).await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["restarts"], 1, "{task}");
    let events = survivor.all_events(&id).await;
    common::assert_log_invariants(&task, &events);
    assert!(
        events.iter().any(|e| e["type"] == "response.resumed"),
        "resumed: {events:?}"
    );
    let fresh = survivor.submit(prompt(77, 300, "resume")).await;
    survivor.wait_status(&fresh, "completed").await;
    let text = |task_id: &str| {
        let server = &survivor;
        let response_id = task_id.replacen("task_", "resp_", 1);
        async move {
            let (status, response) = server.get(&format!("/v1/responses/{response_id}")).await;
            assert_eq!(status, 200, "{response}");
            response["output_text"].as_str().unwrap().to_owned()
        }
    };
    assert_eq!(text(&id).await, text(&fresh).await, "I-6");
}

/// A cancel sent to one instance stops the task running on another (the notification port): the
/// cancel is recorded and acknowledged by the worker that runs the task (P-4), and the task ends
/// `cancelled`, never also completed (I-3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_to_any_instance_stops_the_task_where_it_runs() {
    let database = fresh_database().await;
    let runner = instance(
        &database,
        "runner",
        None,
        &["--workers", "1", "--reference-token-delay", "20ms"],
    );
    let token = runner.admin_token.clone();
    let other = instance(&database, "other", Some(&token), &["--workers", "1"]);
    let id = runner.submit(prompt(1, 5_000, "fail")).await;
    runner.wait_status(&id, "running").await;
    let (status, _, body) = other
        .post(&format!("/v1/tasks/{id}/cancel"), Value::Null)
        .await;
    assert_eq!(status, 202, "{body}");
    let task = runner.wait_status(&id, "cancelled").await;
    let events = runner.all_events(&id).await;
    common::assert_log_invariants(&task, &events);
}

/// A stream on instance B of a task running on instance A, dropped halfway and resumed on
/// instance C with `Last-Event-ID`, gets every event exactly once, as the stored log has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_follows_a_task_of_another_instance_and_resumes_on_a_third() {
    let database = fresh_database().await;
    let runner = instance(
        &database,
        "runner",
        None,
        &["--workers", "1", "--reference-token-delay", "20ms"],
    );
    let token = runner.admin_token.clone();
    // The runner claims the task before the others exist, so it is surely another instance's
    // task that they stream (started first, either of them could claim it and finish it at
    // once, without the runner's token delay).
    let id = runner.submit(prompt(5, 300, "fail")).await;
    runner.wait_status(&id, "running").await;
    let watcher = instance(&database, "watcher", Some(&token), &["--workers", "1"]);
    let third = instance(&database, "third", Some(&token), &["--workers", "1"]);
    let path = format!("/v1/tasks/{id}/events");
    let mut first = watcher.sse(&path, None).await;
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let message = first.next_message().await.expect("an event");
        seen.push(message.seq());
    }
    drop(first);
    let last = *seen.last().unwrap();
    let rest: Vec<u64> = third
        .sse(&path, Some(last))
        .await
        .collect_all()
        .await
        .iter()
        .map(|m| m.seq())
        .collect();
    seen.extend(rest);
    let task = finished(&runner, &id).await;
    assert_eq!(task["status"], "completed", "{task}");
    let stored: Vec<u64> = runner
        .all_events(&id)
        .await
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seen, stored, "every event once, across instances");
}

/// I-8: the same idempotent request sent to two instances creates one task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_on_another_instance_creates_no_second_task_i8() {
    let database = fresh_database().await;
    let a = instance(&database, "a", None, &["--workers", "1"]);
    let token = a.admin_token.clone();
    let b = instance(&database, "b", Some(&token), &["--workers", "1"]);
    let mut body = prompt(9, 5, "fail");
    body["background"] = Value::Bool(true);
    let send = |server: &TestServer| {
        server
            .request(reqwest::Method::POST, "/v1/responses", &token)
            .header("idempotency-key", "across-instances")
            .json(&body)
            .send()
    };
    let first = send(&a).await.unwrap();
    assert_eq!(first.status().as_u16(), 202);
    let first: Value = first.json().await.unwrap();
    let again = send(&b).await.unwrap();
    assert_eq!(again.status().as_u16(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["task_id"], again["task_id"]);
    assert_eq!(a.task_count().await, 1);
}
