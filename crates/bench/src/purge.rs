//! Writers' p99 commit latency with and without a purge running, in-process against
//! `SqliteStore` (the service's own adapter and write path).
//!
//! Finished tasks holding the asked-for number of events, all with an old `finished_at`
//! (an injected timestamp), are prepared once through the storage port; each repetition copies
//! that database, opens it as the service does (`synchronous=FULL`), and measures the latency of
//! every `append` (one output delta, as a worker's smallest batch) from concurrent writers, first
//! alone for a while, then while the app's own purge pass (`lmsp_app::purge::purge_pass`, paced
//! as in the service) removes every old task.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use lmsp_app::purge::purge_pass;
use lmsp_app::Metrics;
use lmsp_domain::ports::{StepOutcome, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use lmsp_domain::{ClientId, TaskId};
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};

use crate::recovery::{close_store, copy_db, prep_store, DB_FILE};
use crate::stats::Latencies;

/// Output deltas per append while preparing (the worker's `MAX_BATCH`).
const DELTAS_PER_APPEND: u64 = 64;
/// Tasks prepared at once.
const IN_FLIGHT: usize = 256;
/// When the prepared tasks finished.
const OLD: Timestamp = contract::T0;
/// A cut-off after every prepared task's `finished_at`.
const CUTOFF: Timestamp = contract::T0.plus_millis(86_400_000);
/// When the writers write (later than the cut-off; their tasks are never finished anyway).
const NOW: Timestamp = contract::T0.plus_millis(2 * 86_400_000);

fn applied(outcome: StepOutcome) -> anyhow::Result<()> {
    match outcome {
        StepOutcome::Applied { .. } => Ok(()),
        other => bail!("a preparation step was not applied: {other:?}"),
    }
}

/// Creates a task and brings it to `running` (3 events).
async fn running_task(store: &SqliteStore, client: ClientId) -> anyhow::Result<TaskId> {
    let task = contract::task(client, RestartPolicy::Fail);
    let id = task.id;
    store.create_task(task, None).await?;
    let steps = vec![
        Step::ClaimForLoading {
            model: contract::model_id(),
        },
        Step::Loaded,
    ];
    applied(store.append(id, steps, None, OLD).await?)?;
    Ok(id)
}

/// One finished task of `events` events (at least 5): created, loading, in_progress, deltas,
/// completed.
async fn finished_task(
    store: Arc<SqliteStore>,
    client: ClientId,
    events: u64,
) -> anyhow::Result<()> {
    let id = running_task(&store, client).await?;
    let mut deltas = events.saturating_sub(4).max(1);
    while deltas > 0 {
        let n = deltas.min(DELTAS_PER_APPEND);
        let steps = (0..n)
            .map(|_| Step::Output {
                delta: String::from("word "),
            })
            .collect();
        applied(store.append(id, steps, None, OLD).await?)?;
        deltas -= n;
    }
    let task = store
        .task(id)
        .await?
        .context("a prepared task disappeared")?;
    applied(store.finish(id, contract::complete(&task), OLD).await?)?;
    Ok(())
}

/// Prepares finished tasks of `per_task` events each, `total` events in all, in `dir/lmsp.db`.
/// Returns the number of events written.
pub async fn prepare(dir: &Path, total: u64, per_task: u64) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let per_task = per_task.max(5);
    let tasks = total.div_ceil(per_task);
    let store = prep_store(&dir.join(DB_FILE))?;
    let client = contract::client_id();
    let mut results = futures::stream::iter(0..tasks)
        .map(|_| finished_task(Arc::clone(&store), client, per_task))
        .buffer_unordered(IN_FLIGHT);
    while let Some(result) = results.next().await {
        result?;
    }
    drop(results);
    close_store(store);
    Ok(tasks * per_task)
}

/// One repetition.
#[derive(Debug, Clone)]
pub struct WriterRun {
    /// p50 of an append without purge, ms.
    pub alone_p50_ms: f64,
    /// p99 of an append without purge, ms.
    pub alone_p99_ms: f64,
    /// p50 of an append while purging, ms.
    pub purging_p50_ms: f64,
    /// p99 of an append while purging, ms.
    pub purging_p99_ms: f64,
    /// Events the purge removed.
    pub purged_events: u64,
    /// How long the purge took, s.
    pub purge_seconds: f64,
    /// Appends measured (alone, purging).
    pub appends: (usize, usize),
}

/// `writers` concurrent writers appending until `stop` is raised.
async fn write_until(
    store: &Arc<SqliteStore>,
    ids: &[TaskId],
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Latencies> {
    let mut handles = Vec::with_capacity(ids.len());
    for &id in ids {
        let (store, stop) = (Arc::clone(store), Arc::clone(stop));
        handles.push(tokio::spawn(async move {
            let mut latencies = Latencies::new();
            while !stop.load(Ordering::Relaxed) {
                let step = Step::Output {
                    delta: String::from("token "),
                };
                let sent = Instant::now();
                applied(store.append(id, vec![step], None, NOW).await?)?;
                latencies.push(sent.elapsed());
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut all = Latencies::new();
    for handle in handles {
        all.extend(handle.await??);
    }
    Ok(all)
}

/// Measures one repetition on a copy of the prepared database in `work_dir`.
pub async fn measure(
    template: &Path,
    work_dir: &Path,
    writers: usize,
    alone_for: Duration,
) -> anyhow::Result<WriterRun> {
    copy_db(template, work_dir)?;
    let store = Arc::new(
        SqliteStore::open_without_hook(&work_dir.join(DB_FILE), SqliteOptions::default())
            .context("cannot open the copied database")?,
    );
    let client = contract::client_id();
    let mut ids = Vec::with_capacity(writers);
    for _ in 0..writers {
        ids.push(running_task(&store, client).await?);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let timer = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            tokio::time::sleep(alone_for).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut alone = write_until(&store, &ids, &stop).await?;
    timer.await?;

    let stop = Arc::new(AtomicBool::new(false));
    let purger = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        tokio::spawn(async move {
            let began = Instant::now();
            let mut events = 0u64;
            // The app's own purge pass, paced as in the service.
            let outcome = purge_pass(store.as_ref(), CUTOFF, CUTOFF, &Metrics::new())
                .await
                .map(|totals| events = totals.events)
                .map_err(anyhow::Error::from);
            stop.store(true, Ordering::Relaxed);
            outcome.map(|()| (events, began.elapsed()))
        })
    };
    let mut purging = write_until(&store, &ids, &stop).await?;
    let (purged_events, purge_time) = purger.await??;
    close_store(store);
    let _ = std::fs::remove_dir_all(work_dir);
    Ok(WriterRun {
        alone_p50_ms: alone.quantile_ms(0.5),
        alone_p99_ms: alone.quantile_ms(0.99),
        purging_p50_ms: purging.quantile_ms(0.5),
        purging_p99_ms: purging.quantile_ms(0.99),
        purged_events,
        purge_seconds: purge_time.as_secs_f64(),
        appends: (alone.len(), purging.len()),
    })
}
