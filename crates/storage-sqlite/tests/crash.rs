//! Crash test: the `crash_writer` child is SIGKILLed at random moments, at least 50 times, on
//! the same database; after each kill the reopened database satisfies I-1 (every acknowledged
//! task exists with its `response.created` at seq 1), I-2 (gapless logs that agree with the task
//! row) and I-8 (an idempotency record exists iff its task does), for everything acknowledged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmsp_domain::idempotency::KeyDecision;
use lmsp_domain::ids::TaskId;
use lmsp_domain::ports::{IdempotencyStore, TaskFilter, TaskStore};
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;

const KILLS: usize = 50;

/// The `crash_writer` example, built by the same `cargo test` run as this test (examples are
/// built before tests run), next to this test's own executable.
fn crash_writer() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(std::path::Path::parent).unwrap();
    profile.join("examples").join("crash_writer")
}

/// I-1, I-2, I-8 after 50 SIGKILLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_writer_leaves_acknowledged_work_consistent_i1_i2_i8() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let mut acked: HashMap<TaskId, u64> = HashMap::new();
    let mut rng = rand::thread_rng();
    let started = Instant::now();
    for round in 0..KILLS {
        let mode = if round % 5 == 0 { "full" } else { "normal" };
        let mut child = Command::new(crash_writer())
            .arg(&path)
            .arg(mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        // Wait for the first acknowledgement, then a random while, then kill.
        let mut first = [0u8; 1];
        stdout.read_exact(&mut first).unwrap();
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..60)));
        kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        child.wait().unwrap();
        let mut text = String::from_utf8_lossy(&first).into_owned();
        stdout.read_to_string(&mut text).unwrap();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            if parts.next() != Some("ACK") {
                continue;
            }
            let (Some(id), Some(seq)) = (parts.next(), parts.next()) else {
                continue; // a line cut by the kill
            };
            let (Ok(id), Ok(seq)) = (TaskId::parse(id), seq.parse::<u64>()) else {
                continue;
            };
            let entry = acked.entry(id).or_insert(0);
            *entry = (*entry).max(seq);
        }
        check(&path, &acked, round % 10 == 9).await;
    }
    assert!(
        acked.len() > KILLS,
        "the child acknowledged too little work"
    );
    eprintln!(
        "{KILLS} kills, {} acknowledged tasks, {:?}",
        acked.len(),
        started.elapsed()
    );
}

async fn check(path: &std::path::Path, acked: &HashMap<TaskId, u64>, full_scan: bool) {
    let store = SqliteStore::open_without_listener(path, SqliteOptions::default()).unwrap();
    for (id, seq) in acked {
        let (task, _) = contract::assert_log_consistent(&store, *id).await;
        assert!(
            task.last_sequence_number >= *seq,
            "acknowledged seq {seq} of {id} lost"
        );
    }
    // Every stored task, acknowledged or not: I-2 and I-8 (every tenth round, to stay fast).
    if !full_scan {
        return;
    }
    let mut before = None;
    loop {
        let page = store
            .list_tasks(TaskFilter {
                before,
                limit: 500,
                ..TaskFilter::default()
            })
            .await
            .unwrap();
        for task in &page.items {
            contract::assert_log_consistent(&store, task.id).await;
            // I-8: the task's record was committed with it, and replays its reply.
            let claim = contract::task_claim(task, &task.id.to_string());
            let after_hold = task.created_at.plus_millis(contract::HOLD_MILLIS + 1);
            assert_eq!(
                store.claim_key(&claim, after_hold).await.unwrap(),
                KeyDecision::Replay(contract::reply_for(task)),
                "I-8: the record of {}",
                task.id
            );
        }
        before = page.items.last().map(|t| t.id);
        if !page.has_more {
            break;
        }
    }
}
