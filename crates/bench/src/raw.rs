//! The raw SQLite ceilings of the README's performance targets, measured in the same run as the service's figures
//! through `lmsp_bench::ceilings` (the one definition of each ceiling).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use lmsp_bench::ceilings;

use crate::stats::Spread;

/// Rows (or events) per commit of the batched ceilings (the README's performance targets).
pub const PER_COMMIT: usize = 64;
/// Rows per transaction of the raw recovery ceiling (the store's recovery batch).
pub const RECOVERY_BATCH: usize = 1000;

/// The ceilings, once per repetition.
#[derive(Debug, Clone, Default)]
pub struct Ceilings {
    /// Fsync'd single-row commits per second.
    pub single_commits_per_s: Spread,
    /// The median latency of one fsync'd single-row commit, ms.
    pub commit_ms: Spread,
    /// Rows per second at 64 rows per commit.
    pub rows_per_s: Spread,
    /// Event appends (insert + task update) per second at 64 per commit.
    pub events_per_s: Spread,
    /// Seconds to update + insert the leftover count of rows in batches.
    pub update_insert_s: Spread,
    /// How many rows the recovery ceiling wrote.
    pub leftovers: usize,
}

impl Ceilings {
    /// Measures every ceiling once into a fresh database under `dir`.
    pub async fn measure_once(
        &mut self,
        dir: &Path,
        duration: Duration,
        leftovers: usize,
    ) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("raw.db");
        let (single, rows, events, update) = tokio::task::spawn_blocking(move || {
            let single = ceilings::single_row_commits(&path, duration)?;
            let rows = ceilings::rows_per_commit(&path, PER_COMMIT, duration)?;
            let events = ceilings::event_appends(&path, PER_COMMIT, duration)?;
            let update = ceilings::update_insert(&path, leftovers, RECOVERY_BATCH)?;
            Ok::<_, ceilings::CeilingError>((single, rows, events, update))
        })
        .await?
        .context("raw ceilings")?;
        self.single_commits_per_s.push(single.commits_per_second());
        self.commit_ms
            .push(single.commit_latency(0.5).as_secs_f64() * 1000.0);
        self.rows_per_s.push(rows.per_second());
        self.events_per_s.push(events.per_second());
        self.update_insert_s.push(update.as_secs_f64());
        self.leftovers = leftovers;
        eprintln!(
            "  raw: {:.0} commits/s (median {:.2} ms), {:.0} rows/s @{PER_COMMIT}, {:.0} event appends/s @{PER_COMMIT}, update+insert {leftovers} rows {:.2} s",
            single.commits_per_second(),
            single.commit_latency(0.5).as_secs_f64() * 1000.0,
            rows.per_second(),
            events.per_second(),
            update.as_secs_f64()
        );
        let _ = std::fs::remove_dir_all(dir);
        Ok(())
    }
}
