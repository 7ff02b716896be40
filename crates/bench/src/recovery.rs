//! Startup recovery of many leftover tasks: the leftovers are prepared once through the storage
//! port (`SqliteStore`: `create_task`, `append`, `cancel`), many calls at once so group commit
//! batches them, in every unfinished status (queued, loading, running with a snapshot,
//! cancelling) under every policy (fail, retry, resume); each repetition copies that database
//! into a fresh data directory and times `lmsp serve` from spawn to its "listening" line.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use lmsp_domain::ports::{Snapshot, StepOutcome, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::transition::Step;
use lmsp_domain::ClientId;
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

use crate::client::get_json;
use crate::server::Server;

/// The database file name inside a data directory.
pub const DB_FILE: &str = "lmsp.db";

/// Store calls in flight while preparing.
const IN_FLIGHT: usize = 1024;

/// Opens a store for preparation: `synchronous=NORMAL`, since only the result matters.
pub fn prep_store(path: &Path) -> anyhow::Result<Arc<SqliteStore>> {
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        ..SqliteOptions::default()
    };
    Ok(Arc::new(
        SqliteStore::open_without_hook(path, options)
            .with_context(|| format!("cannot open {}", path.display()))?,
    ))
}

/// Closes a store and waits for its writer, so the file can be copied.
pub fn close_store(store: Arc<SqliteStore>) {
    store.close();
    drop(store);
}

/// Copies a database (and its WAL, if any) into `to_dir`.
pub fn copy_db(from_dir: &Path, to_dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to_dir)?;
    for suffix in ["", "-wal"] {
        let from = from_dir.join(format!("{DB_FILE}{suffix}"));
        if from.exists() {
            std::fs::copy(&from, to_dir.join(format!("{DB_FILE}{suffix}")))
                .with_context(|| format!("cannot copy {}", from.display()))?;
        }
    }
    Ok(())
}

fn applied(outcome: StepOutcome) -> anyhow::Result<()> {
    match outcome {
        StepOutcome::Applied { .. } => Ok(()),
        other => bail!("a preparation step was not applied: {other:?}"),
    }
}

/// Leaves task `i` in the status and policy its number picks.
async fn leave_one(store: Arc<SqliteStore>, client: ClientId, i: usize) -> anyhow::Result<()> {
    let policy = match (i / 4) % 3 {
        0 => RestartPolicy::Fail,
        1 => RestartPolicy::Retry,
        _ => RestartPolicy::Resume,
    };
    let task = contract::task(client, policy);
    let id = task.id;
    let at = contract::T0;
    store.create_task(task, None).await?;
    let claim = Step::ClaimForLoading {
        model: contract::model_id(),
    };
    match i % 4 {
        0 => {}
        1 => applied(store.append(id, vec![claim], None, at).await?)?,
        2 => {
            let steps = vec![
                claim,
                Step::Loaded,
                Step::Output {
                    delta: String::from("Once "),
                },
            ];
            let snapshot = Snapshot {
                sequence_number: 4,
                state: vec![0; 16],
            };
            applied(store.append(id, steps, Some(snapshot), at).await?)?;
        }
        _ => {
            applied(
                store
                    .append(id, vec![claim, Step::Loaded], None, at)
                    .await?,
            )?;
            store.cancel(id, None, at).await?;
        }
    }
    Ok(())
}

/// Prepares `leftovers` unfinished tasks in `dir/lmsp.db`.
pub async fn prepare(dir: &Path, leftovers: usize) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let store = prep_store(&dir.join(DB_FILE))?;
    let client = contract::client_id();
    let mut results = futures::stream::iter(0..leftovers)
        .map(|i| leave_one(Arc::clone(&store), client, i))
        .buffer_unordered(IN_FLIGHT);
    while let Some(result) = results.next().await {
        result?;
    }
    drop(results);
    let counts = store.count_by_status().await?;
    eprintln!("  prepared leftovers: {counts:?}");
    close_store(store);
    Ok(dir.to_path_buf())
}

/// One timed start on a copy of the prepared database: spawn → "listening".
pub async fn time_start(
    lmsp: &Path,
    template: &Path,
    data_dir: &Path,
    http: &reqwest::Client,
) -> anyhow::Result<Duration> {
    copy_db(template, data_dir)?;
    // One worker stuck loading keeps the workers from moving tasks while the check below runs.
    let server = Server::start(
        lmsp,
        data_dir,
        &["--workers", "1", "--reference-load-delay", "1h"],
    )?;
    let ready = server.ready_after;
    // Sanity: recovery ran to completion before the bind (no task is left `cancelling`).
    let page = get_json(http, &server, "/v1/tasks?status=cancelling&limit=1").await?;
    if !page["data"].as_array().is_some_and(Vec::is_empty) {
        bail!("a cancelling leftover survived recovery: {page}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(data_dir);
    Ok(ready)
}
