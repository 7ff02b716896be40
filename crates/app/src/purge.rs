//! The purge job (P-5, P-6, I-4): every `--purge-interval`, finished tasks older than the
//! retention go, with their events, response and snapshot, then expired idempotency keys (a key
//! outlives its task and keeps its reply until it expires). One instance at a time runs it: the
//! store elects it ([`lmsp_domain::ports::InstanceStore::lead_maintenance`]).
//!
//! The store removes a bounded batch per transaction and never an unfinished task; this job paces
//! the batches. After each one it rests [`REST_FACTOR`] times as long as the batch took (at least
//! [`MIN_REST`]), so the purge holds the single writer a small share of the time and writers'
//! commits never queue behind a run of purge transactions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmsp_domain::ports::{FileContents, Store, StoreError};
use lmsp_domain::Timestamp;

use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::shared::Core;

/// Finished tasks asked for per purge transaction (the store may take fewer: it also bounds the
/// events one transaction removes).
pub const PURGE_BATCH: usize = 500;
/// Expired idempotency keys removed per transaction.
const KEY_BATCH: usize = 500;
/// How many times a batch's own duration the job rests after it.
pub const REST_FACTOR: u32 = 4;
/// The shortest rest between two batches.
pub const MIN_REST: Duration = Duration::from_millis(2);

/// What one purge pass removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeTotals {
    /// Finished tasks removed.
    pub tasks: u64,
    /// Their events.
    pub events: u64,
    /// Expired idempotency keys removed.
    pub idempotency_keys: u64,
}

/// One purge pass: finished tasks with `finished_at < cutoff`, batch after paced batch until none
/// is left, then idempotency keys expired at `now`. Each batch is counted in `metrics`.
pub async fn purge_pass(
    store: &dyn Store,
    cutoff: Timestamp,
    now: Timestamp,
    metrics: &Metrics,
) -> Result<PurgeTotals, StoreError> {
    let mut totals = PurgeTotals::default();
    loop {
        let began = Instant::now();
        let report = store.purge_finished(cutoff, PURGE_BATCH).await?;
        metrics.record_purge(report);
        totals.tasks += report.tasks;
        totals.events += report.events;
        if !report.more {
            break;
        }
        rest_after(began).await;
    }
    loop {
        let began = Instant::now();
        let keys = store.purge_idempotency(now, KEY_BATCH).await?;
        metrics.record_purged_keys(keys);
        totals.idempotency_keys += keys;
        if keys < KEY_BATCH as u64 {
            break;
        }
        rest_after(began).await;
    }
    metrics.record_purge_run();
    Ok(totals)
}

async fn rest_after(batch_began: Instant) {
    let rest = (batch_began.elapsed() * REST_FACTOR).max(MIN_REST);
    tokio::time::sleep(rest).await;
}

/// What one pass over ended batches removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchPurgeTotals {
    /// Batches removed.
    pub batches: u64,
    /// Their tasks.
    pub tasks: u64,
    /// Their output and error files.
    pub files: u64,
}

/// Ended batches whose end is before `cutoff` go, with their tasks, then their output and error
/// files (records, then bytes), batch after paced batch. Uploaded files stay until deleted.
pub async fn purge_batches_pass(
    store: &dyn Store,
    contents: &dyn FileContents,
    cutoff: Timestamp,
) -> Result<BatchPurgeTotals, StoreError> {
    let mut totals = BatchPurgeTotals::default();
    loop {
        let began = Instant::now();
        let purge = store.purge_batches(cutoff, PURGE_BATCH).await?;
        totals.batches += purge.batches;
        totals.tasks += purge.tasks;
        for file in &purge.files {
            if let Err(error) = contents.remove(*file).await {
                tracing::warn!(%error, %file, "could not remove a purged file's bytes");
            }
            totals.files += 1;
        }
        if !purge.more {
            return Ok(totals);
        }
        rest_after(began).await;
    }
}

/// The job: a pass every `purge_interval` until the service stops, when this instance leads.
pub(crate) async fn run_purge(
    core: Arc<Core>,
    life: Arc<Lifecycle>,
    contents: Arc<dyn FileContents>,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(core.settings.purge_interval) => {}
            () = life.stop_taking_work.cancelled() => return,
        }
        match core.store.lead_maintenance(core.instance).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(error) => {
                tracing::warn!(%error, "could not learn whether this instance leads the purge");
                continue;
            }
        }
        let retention = i64::try_from(core.settings.retention.as_millis()).unwrap_or(i64::MAX);
        let now = core.now();
        let cutoff = Timestamp::from_millis(now.as_millis().saturating_sub(retention));
        match purge_pass(core.store.as_ref(), cutoff, now, &core.listener.metrics).await {
            Ok(totals) if totals.tasks > 0 || totals.idempotency_keys > 0 => tracing::info!(
                tasks = totals.tasks,
                events = totals.events,
                idempotency_keys = totals.idempotency_keys,
                "purged"
            ),
            Ok(_) => {}
            Err(error) => tracing::error!(%error, "purge failed; it runs again next interval"),
        }
        match purge_batches_pass(core.store.as_ref(), contents.as_ref(), cutoff).await {
            Ok(totals) if totals.batches > 0 || totals.tasks > 0 => tracing::info!(
                batches = totals.batches,
                tasks = totals.tasks,
                files = totals.files,
                "purged ended batches"
            ),
            Ok(_) => {}
            Err(error) => {
                tracing::error!(%error, "batch purge failed; it runs again next interval")
            }
        }
    }
}
