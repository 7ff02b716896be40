//! Files and batches (OpenAI's Batch API) with several instances of the real binary on one
//! PostgreSQL database (`lmsp serve --database`): a file uploaded through one instance is read
//! and deleted through another (its bytes live in the database), and a batch shared by three
//! instances, one of them killed with `kill -9` mid-way, still answers every line exactly once.
//!
//! Needs a PostgreSQL server: `LMSP_TEST_POSTGRES_URL` (what `scripts/postgres-test-cluster
//! start` prints; `scripts/test` starts it). Without it the tests fail, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

use common::postgres::{fresh_database, instance};
use common::{prompt, TestServer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The multipart boundary of the uploads (the tests' reqwest has no `multipart` feature, so the
/// body is written by hand); an upload checks its bytes do not contain it.
const BOUNDARY: &str = "lmsp-e2e-boundary-5f3c9a1e7d2b4c60";

/// `POST /v1/files` (`purpose=batch`, then the `file` part) on `server`; the file object.
async fn upload(server: &TestServer, filename: &str, bytes: &[u8]) -> Value {
    assert!(
        !bytes
            .windows(BOUNDARY.len())
            .any(|window| window == BOUNDARY.as_bytes()),
        "the upload contains the multipart boundary"
    );
    let mut body = Vec::with_capacity(bytes.len() + 512);
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
             --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    let request = server
        .request(reqwest::Method::POST, "/v1/files", &server.admin_token)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body);
    let (status, _, file) = server.send(request).await;
    assert_eq!(status, 200, "upload to {}: {file}", server.base);
    assert_eq!(file["object"], "file", "{file}");
    assert_eq!(file["purpose"], "batch", "{file}");
    assert_eq!(file["filename"], filename, "{file}");
    assert_eq!(file["bytes"].as_u64(), Some(bytes.len() as u64), "{file}");
    file
}

/// `GET /v1/files/{id}/content` on `server`: its status and bytes.
async fn content(server: &TestServer, id: &str) -> (u16, Vec<u8>) {
    let response = server
        .request(
            reqwest::Method::GET,
            &format!("/v1/files/{id}/content"),
            &server.admin_token,
        )
        .send()
        .await
        .expect("the content request was answered");
    let status = response.status().as_u16();
    let bytes = response
        .bytes()
        .await
        .expect("the content's bytes")
        .to_vec();
    (status, bytes)
}

/// The hex SHA-256 of `bytes`, as a file object's `sha256` shows it.
fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The value of a series of `server`'s `GET /metrics`, 0 when it is not (yet) there (a labelled
/// counter appears at its first increment).
async fn metric_or_zero(server: &TestServer, series: &str) -> f64 {
    common::metric_or_zero(&server.metrics_text().await, series)
}

/// Lines this process finished as completed (`lmsp_tasks_finished_total` counts the tasks whose
/// end this instance committed, since it started).
async fn completed_here(server: &TestServer) -> u64 {
    metric_or_zero(server, "lmsp_tasks_finished_total{outcome=\"completed\"}").await as u64
}

/// Polls `GET /v1/batches/{id}` on `server` until `done` holds, or panics after `deadline`
/// with the batch as it last was. A batch that ended otherwise than `done` wants fails at once.
async fn wait_batch(
    server: &TestServer,
    id: &str,
    what: &str,
    deadline: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let until = Instant::now() + deadline;
    loop {
        let (status, batch) = server.get(&format!("/v1/batches/{id}")).await;
        assert_eq!(status, 200, "{batch}");
        if done(&batch) {
            return batch;
        }
        let ended = ["failed", "expired", "cancelled"].contains(&batch["status"].as_str().unwrap());
        assert!(!ended, "batch {id} ended before it was {what}: {batch}");
        assert!(
            Instant::now() < until,
            "batch {id} was not {what} within {deadline:?}: {batch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines of a JSONL file, parsed.
fn jsonl(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).expect("a JSONL file is UTF-8");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "every line ends: {text}"
    );
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Every task the admin sees (`GET /v1/tasks?limit=100`, paged with `after`).
async fn all_tasks(server: &TestServer) -> Vec<Value> {
    let mut tasks: Vec<Value> = Vec::new();
    loop {
        let path = match tasks.last() {
            Some(last) => format!("/v1/tasks?limit=100&after={}", last["id"].as_str().unwrap()),
            None => String::from("/v1/tasks?limit=100"),
        };
        let (status, page) = server.get(&path).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap();
        tasks.extend(data.iter().cloned());
        if page["has_more"] != Value::Bool(true) || data.is_empty() {
            return tasks;
        }
    }
}

/// How many lines the shared batch has.
const LINES: u64 = 300;

/// P-2, P-7, I-5, I-2 for a batch: three instances share one batch (uploaded through `a`,
/// created through `b`, watched through `c`); each of them runs some of its lines; `a` is killed
/// with `kill -9` while it runs lines, and once its lease has run out the others recover them
/// (`on_restart: "resume"`, so every line still completes). Then every `custom_id` is answered
/// exactly once across the output and error files, the counts agree with the files and with the
/// batch's tasks (P-2: all 300 were created, each once), the lines of the killed instance were
/// recovered once each (I-5), and every line's log is gapless with one terminal event (I-2).
///
/// The API shows no task's instance: the moment of the kill (when `a` has just begun a line) is
/// read from the `tasks` and `instances` tables, and which instances finished lines from each
/// one's `lmsp_tasks_finished_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_answer_every_line_of_a_shared_batch_once() {
    let database = fresh_database().await;
    // Three workers each, lines of 80 tokens at 5 ms: the batch runs for a while on all three.
    let busy = ["--workers", "3", "--reference-token-delay", "5ms"];
    let mut a = instance(&database, "a", None, &busy);
    let token = a.admin_token.clone();
    let b = instance(&database, "b", Some(&token), &busy);
    let c = instance(&database, "c", Some(&token), &busy);
    // The instances run: the binary is built (the time below leaves its build out).
    let started = Instant::now();

    let mut input = Vec::new();
    for line in 0..LINES {
        let request = json!({
            "custom_id": format!("line-{line:03}"),
            "method": "POST",
            "url": "/v1/responses",
            "body": prompt(line, 80, "resume"),
        });
        input.extend_from_slice(request.to_string().as_bytes());
        input.push(b'\n');
    }
    let file = upload(&a, "lines.jsonl", &input).await;
    let file_id = file["id"].as_str().unwrap();

    let (status, _, batch) = b
        .post(
            "/v1/batches",
            json!({"input_file_id": file_id, "endpoint": "/v1/responses",
                   "completion_window": "24h"}),
        )
        .await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(batch["status"], "validating", "{batch}");
    let batch_id = batch["id"].as_str().unwrap().to_owned();

    // Wait until the batch runs, some 30 lines are done, and each instance finished lines of it
    // (so more than one instance claims its lines, and `a` is one of them).
    let deadline = Instant::now() + Duration::from_secs(120);
    let before_kill = loop {
        let (status, batch) = c.get(&format!("/v1/batches/{batch_id}")).await;
        assert_eq!(status, 200, "{batch}");
        assert!(
            ["validating", "in_progress"].contains(&batch["status"].as_str().unwrap()),
            "the batch runs: {batch}"
        );
        let done = batch["request_counts"]["completed"].as_u64().unwrap();
        let counts = [
            completed_here(&a).await,
            completed_here(&b).await,
            completed_here(&c).await,
        ];
        if batch["status"] == "in_progress" && done >= 30 && counts.iter().all(|&n| n > 0) {
            break (batch, counts);
        }
        assert!(
            Instant::now() < deadline,
            "the instances never all ran lines: {counts:?} {batch}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (batch, [a_before, _, _]) = before_kill;
    assert_eq!(batch["request_counts"]["total"], LINES, "{batch}");
    assert!(
        batch["request_counts"]["completed"].as_u64().unwrap() < LINES / 2,
        "the kill comes mid-way: {batch}"
    );
    // The API shows no task's instance, so the moment of the kill is read from the database:
    // `a` runs a line that has just begun (at most 20 events in of its ~85), so it still runs
    // it when the kill comes (it has 60 tokens and more at 5 ms to go).
    let (db, connection) = tokio_postgres::connect(&database, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let deadline = Instant::now() + Duration::from_secs(120);
    let running_on_a = loop {
        let rows = db
            .query(
                "SELECT t.id FROM tasks t JOIN instances i ON i.id = t.owner \
                 WHERE i.name = 'a' AND i.retired_at IS NULL AND t.status = 'running' \
                 AND t.batch_id IS NOT NULL AND t.last_sequence_number <= 20",
                &[],
            )
            .await
            .unwrap();
        if !rows.is_empty() {
            let ids: Vec<String> = rows
                .iter()
                .map(|row| {
                    let bytes: Vec<u8> = row.get(0);
                    let bytes: [u8; 16] = bytes.try_into().expect("a task id is a ULID");
                    format!("task_{}", ulid::Ulid::from_bytes(bytes))
                })
                .collect();
            break ids;
        }
        assert!(Instant::now() < deadline, "`a` never ran a line");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    a.kill();

    // The survivors finish the batch: `a`'s lines once its lease has run out.
    let batch = wait_batch(
        &b,
        &batch_id,
        "completed",
        Duration::from_secs(240),
        |batch| batch["status"] == "completed",
    )
    .await;
    let counts = &batch["request_counts"];
    assert_eq!(counts["total"], LINES, "{batch}");
    assert_eq!(
        counts["completed"].as_u64().unwrap() + counts["failed"].as_u64().unwrap(),
        LINES,
        "{batch}"
    );
    // Every line resumes where it stopped: none fails.
    assert_eq!(counts["failed"], 0, "{batch}");
    assert!(batch["errors"].is_null(), "{batch}");
    for field in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(batch[field].is_i64(), "{field}: {batch}");
    }

    // The files, read through the third instance.
    let output_id = batch["output_file_id"].as_str().expect("an output file");
    let (status, output) = content(&c, output_id).await;
    assert_eq!(status, 200);
    let (status, output_file) = c.get(&format!("/v1/files/{output_id}")).await;
    assert_eq!(status, 200, "{output_file}");
    assert_eq!(output_file["purpose"], "batch_output", "{output_file}");
    assert_eq!(output_file["bytes"].as_u64(), Some(output.len() as u64));
    assert_eq!(output_file["sha256"], sha256_hex(&output), "{output_file}");
    let mut lines = jsonl(&output);
    let output_lines = lines.len() as u64;
    let errors = match batch["error_file_id"].as_str() {
        Some(error_id) => {
            let (status, errors) = content(&c, error_id).await;
            assert_eq!(status, 200);
            jsonl(&errors)
        }
        None => Vec::new(),
    };
    assert_eq!(output_lines, counts["completed"].as_u64().unwrap());
    assert_eq!(errors.len() as u64, counts["failed"].as_u64().unwrap());
    lines.extend(errors);
    assert_eq!(lines.len() as u64, LINES, "a line per input line");

    // Exactly once per custom_id; the output in line order; each answer a completed response
    // whose `request_id` is its line's task.
    let mut answered: BTreeMap<String, String> = BTreeMap::new();
    let mut order = Vec::new();
    for line in &lines[..output_lines as usize] {
        let custom_id = line["custom_id"].as_str().unwrap().to_owned();
        assert!(line["error"].is_null(), "{line}");
        let response = &line["response"];
        assert_eq!(response["status_code"], 200, "{line}");
        assert_eq!(response["body"]["object"], "response", "{line}");
        assert_eq!(response["body"]["status"], "completed", "{line}");
        assert!(
            !response["body"]["output_text"]
                .as_str()
                .unwrap_or("")
                .is_empty()
                || response["body"]["output"].is_array(),
            "{line}"
        );
        let task_id = response["request_id"].as_str().unwrap().to_owned();
        assert!(task_id.starts_with("task_"), "{line}");
        assert_eq!(
            response["body"]["id"].as_str().unwrap(),
            task_id.replacen("task_", "resp_", 1),
            "{line}"
        );
        order.push(custom_id.clone());
        assert!(
            answered.insert(custom_id, task_id).is_none(),
            "a custom_id answered twice: {line}"
        );
    }
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "the output is in line order");
    for line in &lines[output_lines as usize..] {
        let custom_id = line["custom_id"].as_str().unwrap().to_owned();
        assert!(
            answered.insert(custom_id, String::new()).is_none(),
            "a custom_id answered twice: {line}"
        );
    }
    let expected: BTreeSet<String> = (0..LINES).map(|line| format!("line-{line:03}")).collect();
    assert_eq!(
        answered.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "every custom_id once"
    );

    // P-2: the batch's tasks are its 300 lines, each once, each the task its answer names.
    let tasks: Vec<Value> = all_tasks(&c)
        .await
        .into_iter()
        .filter(|task| task["batch_id"] == batch_id.as_str())
        .collect();
    assert_eq!(tasks.len() as u64, LINES, "a task per line");
    let mut recovered = 0;
    let mut seen = BTreeSet::new();
    for task in &tasks {
        let custom_id = task["custom_id"].as_str().unwrap();
        assert!(
            seen.insert(custom_id.to_owned()),
            "two tasks for {custom_id}"
        );
        assert_eq!(
            answered.get(custom_id).map(String::as_str),
            task["id"].as_str(),
            "{task}"
        );
        assert_eq!(task["status"], "completed", "{task}");
        assert_eq!(task["service_tier"], "flex", "{task}");
        assert_eq!(task["on_restart"], "resume", "{task}");
        let restarts = task["restarts"].as_u64().unwrap();
        assert!(restarts <= 1, "recovered at most once: {task}");
        recovered += restarts;
        // I-2 on every line's log; I-5: a recovered line was moved once, and claimed again.
        let events = b.all_events(task["id"].as_str().unwrap()).await;
        common::assert_log_invariants(task, &events);
        let moved = events
            .iter()
            .filter(|e| e["type"] == "response.queued" || e["type"] == "response.resumed")
            .count() as u64;
        assert!(moved >= restarts, "recovered once: {events:?}");
    }
    assert!(
        recovered >= running_on_a.len() as u64,
        "the lines the killed instance ran were recovered: {running_on_a:?}, {recovered}"
    );
    for id in &running_on_a {
        let task = tasks
            .iter()
            .find(|t| t["id"] == id.as_str())
            .expect("a line's task");
        assert_eq!(
            task["restarts"], 1,
            "a line running on `a` at the kill: {task}"
        );
    }

    // More than one instance claimed lines: each finished some before the kill, and the
    // survivors' and `a`'s counts add up to no more than the lines (each finished once).
    let (b_after, c_after) = (completed_here(&b).await, completed_here(&c).await);
    assert!(a_before > 0 && b_after > 0 && c_after > 0);
    assert!(
        a_before + b_after + c_after <= LINES,
        "each line finished by one instance: a {a_before}+, b {b_after}, c {c_after}"
    );
    eprintln!(
        "batch {batch_id}: a finished {a_before}+ before the kill, b {b_after}, c {c_after}; \
         {recovered} lines recovered ({} seen running on a at the kill); {:?} after the \
         instances started",
        running_on_a.len(),
        started.elapsed()
    );
}

/// The bytes of a file live in the shared database: a 3 MiB upload through one instance (four
/// 1 MiB parts) is read back byte for byte through another, with the same size and SHA-256;
/// I-7: another client, paired across the instances, finds it on neither; deleted through the
/// second instance, it is gone from the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_on_one_instance_is_read_by_another() {
    let database = fresh_database().await;
    let first = instance(&database, "first", None, &["--workers", "1"]);
    let token = first.admin_token.clone();
    let second = instance(&database, "second", Some(&token), &["--workers", "1"]);
    let started = Instant::now();

    // 3 MiB and a bit: every byte value, newlines and NULs included, and a last part that is not
    // full. A xorshift stream, so the bytes differ from part to part.
    let size = 3 * (1 << 20) + 12_345;
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    let digest = sha256_hex(&bytes);
    let file = upload(&first, "blob.bin", &bytes).await;
    assert_eq!(file["status"], "processed", "{file}");
    assert_eq!(file["sha256"], digest.as_str(), "{file}");
    let id = file["id"].as_str().unwrap();
    assert!(id.starts_with("file-"), "{file}");

    let (status, read) = content(&second, id).await;
    assert_eq!(status, 200);
    assert_eq!(read.len(), bytes.len(), "the same size");
    assert!(read == bytes, "the same bytes, in order");

    let (status, seen) = second.get(&format!("/v1/files/{id}")).await;
    assert_eq!(status, 200, "{seen}");
    for field in ["id", "bytes", "sha256", "filename", "purpose", "created_at"] {
        assert_eq!(seen[field], file[field], "{field}: {seen} vs {file}");
    }
    let (status, listed) = second.get("/v1/files?purpose=batch").await;
    assert_eq!(status, 200, "{listed}");
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["id"] == id),
        "listed on the other instance: {listed}"
    );

    // I-7: another client's file is not found, on either instance, and it cannot delete it.
    let (status, _, pairing) = first
        .post(
            "/v1/pairings",
            json!({"scopes": ["responses:read", "responses:write"]}),
        )
        .await;
    assert_eq!(status, 201, "{pairing}");
    let paired = second
        .http
        .post(second.url("/v1/pair"))
        .json(&json!({"code": pairing["code"], "name": "other",
                      "scopes": ["responses:read", "responses:write"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(paired.status().as_u16(), 201);
    let paired: Value = paired.json().await.unwrap();
    let other = paired["token"].as_str().unwrap();
    for server in [&first, &second] {
        let (status, body) = server.get_as(other, &format!("/v1/files/{id}")).await;
        assert_eq!(status, 404, "{body}");
        common::assert_envelope(status, &body, "not_found", "another client's file");
        let (status, body) = server
            .get_as(other, &format!("/v1/files/{id}/content"))
            .await;
        assert_eq!(status, 404, "{body}");
        let (status, listed) = server.get_as(other, "/v1/files").await;
        assert_eq!(status, 200, "{listed}");
        assert_eq!(listed["data"], json!([]), "{listed}");
        let (status, _, body) = server
            .send(server.request(reqwest::Method::DELETE, &format!("/v1/files/{id}"), other))
            .await;
        assert_eq!(status, 404, "{body}");
    }

    let (status, _, deleted) = second.delete(&format!("/v1/files/{id}")).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(
        deleted,
        json!({"id": id, "object": "file", "deleted": true})
    );
    let (status, gone) = first.get(&format!("/v1/files/{id}")).await;
    assert_eq!(status, 404, "{gone}");
    common::assert_envelope(status, &gone, "not_found", "a deleted file");
    let (status, _) = content(&first, id).await;
    assert_eq!(status, 404, "its bytes are gone too");
    let (status, _, again) = first.delete(&format!("/v1/files/{id}")).await;
    assert_eq!(status, 404, "{again}");
    eprintln!(
        "{size} bytes up, read, deleted in {:?} after the instances started",
        started.elapsed()
    );
}
