//! Test-only child process of the crash test: opens the store at the path given as the first
//! argument, then creates tasks (with idempotency records) and appends events to them from
//! several concurrent callers, forever, printing `ACK <task_id> <seq>` after each acknowledged
//! commit. The crash test SIGKILLs it at random moments and checks the reopened database.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use lmsp_domain::ports::{CreateOutcome, StepOutcome, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::transition::Step;
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

fn ack(task: &lmsp_domain::ids::TaskId, seq: u64) -> Result<(), std::io::Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ACK {task} {seq}")?;
    out.flush()
}

async fn caller(store: Arc<SqliteStore>) -> Result<(), Box<dyn Error + Send + Sync>> {
    let worker = contract::instance_id();
    let mut complete_this_round = false;
    loop {
        complete_this_round = !complete_this_round;
        let task = contract::task(worker, RestartPolicy::Fail);
        let record = contract::record_for(&task, &task.id.to_string());
        let created = match store.create_task(task.clone(), Some(record)).await? {
            CreateOutcome::Created(created) => created,
            CreateOutcome::KeyAnswered(_) => return Err("unexpected answered key".into()),
            CreateOutcome::QueueFull(_) => return Err("a full queue with no limit".into()),
        };
        ack(&created.id, 1)?;
        let mut last = created.last_sequence_number;
        let mut batches = vec![
            vec![contract::claim(&task)],
            vec![Step::Loaded],
            vec![contract::output("a"), contract::output("b")],
        ];
        if complete_this_round {
            batches.push(vec![contract::complete(&task, "ab", contract::T0)]);
        }
        for batch in batches {
            let finishing = matches!(batch.first(), Some(Step::Complete { .. }));
            let outcome = if finishing {
                let step = batch.into_iter().next().ok_or("empty batch")?;
                store.finish(task.id, worker, step, contract::T0).await?
            } else {
                store
                    .append(task.id, worker, last, batch, None, contract::T0)
                    .await?
            };
            match outcome {
                StepOutcome::Applied { task, .. } => {
                    last = task.last_sequence_number;
                    ack(&task.id, last)?;
                }
                other => return Err(format!("unexpected {other:?}").into()),
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let path: PathBuf = std::env::args_os()
        .nth(1)
        .ok_or("usage: crash_writer <database path> [full|normal]")?
        .into();
    let sync = match std::env::args().nth(2).as_deref() {
        Some("full") => SyncMode::Full,
        _ => SyncMode::Normal,
    };
    let options = SqliteOptions {
        sync,
        ..SqliteOptions::default()
    };
    let store = Arc::new(SqliteStore::open_without_listener(&path, options)?);
    let mut handles = Vec::new();
    for _ in 0..8 {
        handles.push(tokio::spawn(caller(Arc::clone(&store))));
    }
    for handle in handles {
        handle.await??;
    }
    Ok(())
}
