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

use anyhow::Context;
use futures::StreamExt;
use lmsp_app::purge::purge_pass;
use lmsp_app::Metrics;
use lmsp_bench::fixtures::{self, applied, claim, complete, output, T0};
use lmsp_domain::ports::TaskStore;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use lmsp_domain::{ClientId, InstanceId, TaskId};
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};

use crate::recovery::{close_store, copy_db, prep_store, DB_FILE};
use crate::stats::Latencies;

/// Output deltas per append while preparing (the worker's `MAX_BATCH`).
const DELTAS_PER_APPEND: u64 = 64;
/// Tasks prepared at once.
const IN_FLIGHT: usize = 256;
/// When the prepared tasks finished.
const OLD: Timestamp = T0;
/// A cut-off after every prepared task's `finished_at`.
const CUTOFF: Timestamp = T0.plus_millis(86_400_000);
/// When the writers write (later than the cut-off; their tasks are never finished anyway).
const NOW: Timestamp = T0.plus_millis(2 * 86_400_000);

/// Creates a task in the care of `owner` and brings it to `running` (3 events); returns its id
/// and last sequence number.
async fn running_task(
    store: &SqliteStore,
    owner: InstanceId,
    client: ClientId,
    at: Timestamp,
) -> anyhow::Result<(TaskId, u64)> {
    let task = fixtures::task(owner, client, RestartPolicy::Fail)?;
    let id = task.id;
    store.create_task(task.clone(), None).await?;
    let steps = vec![claim(&task), Step::Loaded];
    let running = applied(store.append(id, owner, 1, steps, None, at).await?)?;
    Ok((id, running.last_sequence_number))
}

/// One finished task of `events` events (at least 10): created, loading, in_progress, the
/// item's opening, deltas, the item's closing, completed. Returns the events written.
async fn finished_task(
    store: Arc<SqliteStore>,
    owner: InstanceId,
    client: ClientId,
    events: u64,
) -> anyhow::Result<u64> {
    let (id, mut last) = running_task(&store, owner, client, OLD).await?;
    // Besides its deltas: 3 events to `running`, 2 opening the item with the first delta, 3
    // closing it and `response.completed`.
    let total_deltas = events.saturating_sub(9).max(1);
    let mut deltas = total_deltas;
    while deltas > 0 {
        let n = deltas.min(DELTAS_PER_APPEND);
        let steps = (0..n).map(|_| output("word ")).collect();
        last =
            applied(store.append(id, owner, last, steps, None, OLD).await?)?.last_sequence_number;
        deltas -= n;
    }
    let task = store
        .task(id)
        .await?
        .context("a prepared task disappeared")?;
    let text = "word ".repeat(usize::try_from(total_deltas).unwrap_or(0));
    let done = applied(
        store
            .finish(id, owner, complete(&task, &text, OLD), OLD)
            .await?,
    )?;
    Ok(done.last_sequence_number)
}

/// Prepares finished tasks of `per_task` events each, `total` events in all, in
/// `dir/lmsp.db`. Returns the number of events written.
pub async fn prepare(dir: &Path, total: u64, per_task: u64) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let per_task = per_task.max(10);
    let tasks = total.div_ceil(per_task);
    let store = prep_store(&dir.join(DB_FILE))?;
    let owner = fixtures::register_instance(store.as_ref(), OLD).await?;
    let client = fixtures::client_id();
    let mut results = futures::stream::iter(0..tasks)
        .map(|_| finished_task(Arc::clone(&store), owner, client, per_task))
        .buffer_unordered(IN_FLIGHT);
    let mut written = 0;
    while let Some(result) = results.next().await {
        written += result?;
    }
    drop(results);
    close_store(store);
    Ok(written)
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

/// One writer per task of `tasks` (id, last sequence number), each appending one delta at a
/// time on behalf of `owner` until `stop` is raised; returns their latencies and the tasks'
/// last sequence numbers.
async fn write_until(
    store: &Arc<SqliteStore>,
    owner: InstanceId,
    tasks: &[(TaskId, u64)],
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<(Latencies, Vec<(TaskId, u64)>)> {
    let mut handles = Vec::with_capacity(tasks.len());
    for &(id, mut last) in tasks {
        let (store, stop) = (Arc::clone(store), Arc::clone(stop));
        handles.push(tokio::spawn(async move {
            let mut latencies = Latencies::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let outcome = store
                    .append(id, owner, last, vec![output("token ")], None, NOW)
                    .await?;
                latencies.push(sent.elapsed());
                last = applied(outcome)?.last_sequence_number;
            }
            Ok::<_, anyhow::Error>((latencies, (id, last)))
        }));
    }
    let mut all = Latencies::new();
    let mut after = Vec::with_capacity(tasks.len());
    for handle in handles {
        let (latencies, task) = handle.await??;
        all.extend(latencies);
        after.push(task);
    }
    Ok((all, after))
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
        SqliteStore::open_without_listener(&work_dir.join(DB_FILE), SqliteOptions::default())
            .context("cannot open the copied database")?,
    );
    let owner = fixtures::register_instance(store.as_ref(), NOW).await?;
    let client = fixtures::client_id();
    let mut tasks = Vec::with_capacity(writers);
    for _ in 0..writers {
        tasks.push(running_task(&store, owner, client, NOW).await?);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let timer = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            tokio::time::sleep(alone_for).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let (mut alone, tasks) = write_until(&store, owner, &tasks, &stop).await?;
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
    let (mut purging, _) = write_until(&store, owner, &tasks, &stop).await?;
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
