//! Startup recovery of many leftover tasks: the leftovers are prepared once through the storage
//! port (`SqliteStore`: `create_task`, `append`, `cancel`) in the care of an instance of the
//! harness that is never retired (as if it had been killed), many calls at once so group commit
//! batches them, in every unfinished status (queued, loading, running with a snapshot,
//! cancelling) under every policy (fail, retry, resume); each repetition copies that database
//! into a fresh data directory and times `lmsp serve` from spawn to its "listening" line (it
//! recovers the stopped instance's tasks to completion before it binds).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use lmsp_bench::fixtures::{self, applied, claim, output, T0};
use lmsp_domain::ports::{CancelOutcome, Snapshot, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::transition::Step;
use lmsp_domain::{ClientId, InstanceId};
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
        SqliteStore::open_without_listener(path, options)
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

/// Leaves task `i`, in the care of instance `owner`, in the status and policy its number picks.
async fn leave_one(
    store: Arc<SqliteStore>,
    owner: InstanceId,
    client: ClientId,
    i: usize,
) -> anyhow::Result<()> {
    let policy = match (i / 4) % 3 {
        0 => RestartPolicy::Fail,
        1 => RestartPolicy::Retry,
        _ => RestartPolicy::Resume,
    };
    let task = fixtures::task(owner, client, policy)?;
    let id = task.id;
    let at = T0;
    store.create_task(task.clone(), None).await?;
    match i % 4 {
        0 => {}
        1 => {
            applied(
                store
                    .append(id, owner, 1, vec![claim(&task)], None, at)
                    .await?,
            )?;
        }
        2 => {
            // Running with some output, then one more delta with the snapshot that covers it.
            let steps = vec![claim(&task), Step::Loaded, output("Once ")];
            let running = applied(store.append(id, owner, 1, steps, None, at).await?)?;
            let last = running.last_sequence_number;
            let snapshot = Snapshot {
                sequence_number: last + 1,
                state: vec![0; 16],
            };
            let covered = applied(
                store
                    .append(id, owner, last, vec![output("upon ")], Some(snapshot), at)
                    .await?,
            )?;
            if covered.last_sequence_number != last + 1 {
                bail!(
                    "one delta wrote {} events, not one",
                    covered.last_sequence_number - last
                );
            }
        }
        _ => {
            let steps = vec![claim(&task), Step::Loaded];
            applied(store.append(id, owner, 1, steps, None, at).await?)?;
            match store.cancel(id, None, at).await? {
                CancelOutcome::Decided { task, .. }
                    if task.status == lmsp_domain::TaskStatus::Cancelling => {}
                other => bail!("a running task's cancel did not leave it cancelling: {other:?}"),
            }
        }
    }
    Ok(())
}

/// Prepares `leftovers` unfinished tasks in `dir/lmsp.db`, in the care of an instance that
/// stopped without retiring.
pub async fn prepare(dir: &Path, leftovers: usize) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let store = prep_store(&dir.join(DB_FILE))?;
    let owner = fixtures::register_instance(store.as_ref(), T0).await?;
    let client = fixtures::client_id();
    let mut results = futures::stream::iter(0..leftovers)
        .map(|i| leave_one(Arc::clone(&store), owner, client, i))
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

/// What recovery must report on `/metrics` for the leftovers [`prepare`] leaves, by the table of
/// docs/rules.md: (moved other than resumed, untouched, resumed).
pub fn expected_report(leftovers: usize) -> (u64, u64, u64) {
    let (mut moved, mut untouched, mut resumed) = (0, 0, 0);
    for i in 0..leftovers {
        let policy = (i / 4) % 3;
        match (i % 4, policy) {
            // queued under retry or resume stays queued, untouched.
            (0, 1 | 2) => untouched += 1,
            // running under resume is resumed.
            (2, 2) => resumed += 1,
            _ => moved += 1,
        }
    }
    (moved, untouched, resumed)
}

/// A counter of the service's `/metrics`, by its full name with labels.
async fn metric(
    http: &reqwest::Client,
    server: &Server,
    name_and_labels: &str,
) -> anyhow::Result<u64> {
    let text = http
        .get(server.url("/metrics"))
        .bearer_auth(&server.token)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    text.lines()
        .find_map(|line| line.strip_prefix(name_and_labels))
        .and_then(|rest| rest.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .with_context(|| format!("no {name_and_labels} in /metrics"))
}

/// One timed start on a copy of the prepared database: spawn → "listening". Then checks that
/// recovery ran to completion before the bind: it reports every one of the `leftovers` moved or
/// untouched per the table, and no task is left `cancelling`.
pub async fn time_start(
    lmsp: &Path,
    template: &Path,
    data_dir: &Path,
    http: &reqwest::Client,
    leftovers: usize,
) -> anyhow::Result<Duration> {
    copy_db(template, data_dir)?;
    // One worker stuck loading keeps the workers from moving tasks while the check below runs.
    let server = Server::start(
        lmsp,
        data_dir,
        &["--workers", "1", "--reference-load-delay", "1h"],
    )?;
    let ready = server.ready_after;
    let page = get_json(http, &server, "/v1/tasks?status=cancelling&limit=1").await?;
    if !page["data"].as_array().is_some_and(Vec::is_empty) {
        bail!("a cancelling leftover survived recovery: {page}");
    }
    let counter = "lmsp_recovery_tasks_total{outcome=";
    let reported = (
        metric(http, &server, &format!("{counter}\"moved\"}}")).await?,
        metric(http, &server, &format!("{counter}\"untouched\"}}")).await?,
        metric(http, &server, &format!("{counter}\"resumed\"}}")).await?,
    );
    let expected = expected_report(leftovers);
    if reported != expected {
        bail!(
            "recovery reported (moved, untouched, resumed) {reported:?}, the table says {expected:?}"
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(data_dir);
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_report_follows_the_table() {
        // i = 0..12 covers each status under each policy once.
        assert_eq!(expected_report(12), (9, 2, 1));
        assert_eq!(expected_report(0), (0, 0, 0));
    }
}
