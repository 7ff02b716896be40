//! Claims per second on SQLite with a long queue, in process: a deliberate exception to "through
//! the binary" (like `purge.rs` and `pg_claims.rs`), since no request measures a claim alone — a
//! worker's claim is followed by its run. The figure is the storage port's `claim_next` on the
//! SQLite adapter, the call every worker makes: tiers with aging first, then fairness between
//! the clients with queued work (fewest running, then least recently served).
//!
//! Two queues are prepared once per run through the port (`create_task`, many at once, so the
//! writer's group commit puts hundreds in one transaction; `synchronous=NORMAL`, since only the
//! result matters), in the care of the harness's instance: the *single queue* (every task one
//! client's, in the `default` tier) and the queue *across tiers* (the same number of tasks, task
//! `i` of client `i mod clients` in tier `i mod 3`, so every client has a head in each tier).
//! Each repetition copies a template into a fresh directory, opens it as the service does
//! (`synchronous=FULL`) and runs `loops` concurrent claim loops, each as a worker: claim the next
//! task, then end it (a `Fail` step, the cheapest end) before claiming again, so that a client's
//! running count stays what a service's workers leave it, not the number of claims so far. The
//! figure is the claims started after a warm-up, per second of the run after it; the claim
//! calls' own latency is measured too.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use lmsp_bench::fixtures::{self, applied, T0};
use lmsp_domain::ports::{CreateOutcome, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::ServiceTier;
use lmsp_domain::time::Timestamp;
use lmsp_domain::{ClientId, InstanceId};
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};

use crate::recovery::{close_store, copy_db, prep_store, DB_FILE};
use crate::stats::Latencies;

/// Creates in flight while preparing (the writer commits what has gathered as one transaction).
pub const IN_FLIGHT: usize = 4096;

/// What a queue is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Every task one client's, in the `default` tier.
    Single,
    /// Task `i` of client `i mod clients`, in tier `i mod 3` (priority, default, flex).
    AcrossTiers {
        /// Clients with queued work.
        clients: usize,
    },
}

impl Shape {
    /// How the shape reads in the output.
    pub fn describe(self) -> String {
        match self {
            Shape::Single => String::from("one client, default tier"),
            Shape::AcrossTiers { clients } => format!(
                "{clients} clients × 3 tiers, task i of client i mod {clients} in tier i mod 3 (priority, default, flex)"
            ),
        }
    }
}

/// A prepared queue.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The instance in whose care the tasks are (the claims are made as it).
    pub owner: InstanceId,
    /// When the claims start: just after the newest task was created (task `i` is created at
    /// `T0 + i` ms or so, so the oldest have waited a quarter of an hour at 1 000 000 tasks, and
    /// aging has moved them up).
    pub claim_from: Timestamp,
    /// Tasks queued.
    pub tasks: usize,
    /// How long the preparation took, s.
    pub seconds: f64,
    /// Size of the database file (and its WAL), MiB.
    pub mib: f64,
}

/// Queues `tasks` tasks of `shape` in `dir/lmsp.db`.
pub async fn prepare(dir: &Path, tasks: usize, shape: Shape) -> anyhow::Result<Prepared> {
    let started = Instant::now();
    std::fs::create_dir_all(dir)?;
    let store = prep_store(&dir.join(DB_FILE))?;
    let owner = fixtures::register_instance(store.as_ref(), T0).await?;
    let clients: Vec<ClientId> = match shape {
        Shape::Single => vec![fixtures::client_id()],
        Shape::AcrossTiers { clients } => {
            (0..clients.max(1)).map(|_| fixtures::client_id()).collect()
        }
    };
    let tiers = match shape {
        Shape::Single => &[ServiceTier::Default][..],
        Shape::AcrossTiers { .. } => ServiceTier::ALL,
    };
    let store_ref = &store;
    let clients_ref = &clients;
    let mut created = futures::stream::iter(0..tasks)
        .map(|i| async move {
            let client = clients_ref[i % clients_ref.len()];
            let mut task = fixtures::task(owner, client, RestartPolicy::Retry)?;
            task.service_tier = tiers[i % tiers.len()];
            match store_ref.create_task(task, None).await? {
                CreateOutcome::Created(task) => Ok(task.created_at),
                CreateOutcome::KeyAnswered(_) => {
                    bail!("a create without a key was answered by one")
                }
                CreateOutcome::QueueFull(full) => bail!("a create with no limit: {full}"),
            }
        })
        .buffer_unordered(IN_FLIGHT);
    let mut newest = T0;
    while let Some(done) = created.next().await {
        newest = newest.max(done?);
    }
    drop(created);
    let counts = store.count_by_status().await?;
    eprintln!("  prepared {}: {counts:?}", shape.describe());
    close_store(store);
    let mib = ["", "-wal"]
        .iter()
        .filter_map(|suffix| std::fs::metadata(dir.join(format!("{DB_FILE}{suffix}"))).ok())
        .map(|meta| meta.len() as f64)
        .sum::<f64>()
        / (1024.0 * 1024.0);
    Ok(Prepared {
        owner,
        claim_from: newest.plus_millis(1),
        tasks,
        seconds: started.elapsed().as_secs_f64(),
        mib,
    })
}

/// One repetition's claims.
#[derive(Debug, Clone)]
pub struct ClaimRun {
    /// Claims started after the warm-up, per second of the run after it.
    pub per_s: f64,
    /// Claims counted.
    pub claims: u64,
    /// The claim calls' p50 and p99, ms (each waits for its group commit, fsync'd).
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Whether the queue ran dry before the end (then the rate is over the time it ran).
    pub ran_dry: bool,
}

/// Measures one repetition on a copy of `template` in `work_dir`: `loops` claim loops for
/// `warmup` (not counted), then for `duration`.
pub async fn measure(
    template: &Path,
    work_dir: &Path,
    prepared: &Prepared,
    loops: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<ClaimRun> {
    copy_db(template, work_dir)?;
    let store = Arc::new(
        SqliteStore::open_without_listener(&work_dir.join(DB_FILE), SqliteOptions::default())
            .context("cannot open the copied database")?,
    );
    let started = Instant::now();
    let counted_from = started + warmup;
    let deadline = counted_from + duration;
    let owner = prepared.owner;
    let claim_from = prepared.claim_from;
    let mut handles = Vec::with_capacity(loops.max(1));
    for _ in 0..loops.max(1) {
        let store = Arc::clone(&store);
        handles.push(tokio::spawn(async move {
            let mut latencies = Latencies::new();
            let mut ran_dry = false;
            while Instant::now() < deadline {
                let sent = Instant::now();
                // The service's clock, as it advances from when the queue was complete.
                let at = claim_from.plus_millis(started.elapsed().as_millis() as i64);
                let claimed = store.claim_next(owner, at).await?;
                let took = sent.elapsed();
                let Some(task) = claimed else {
                    ran_dry = true;
                    break;
                };
                if sent >= counted_from {
                    latencies.push(took);
                }
                applied(store.finish(task.id, owner, fixtures::ended(), at).await?)?;
            }
            Ok::<_, anyhow::Error>((latencies, ran_dry, Instant::now()))
        }));
    }
    let mut all = Latencies::new();
    let mut ran_dry = false;
    let mut last = counted_from;
    for handle in handles {
        let (latencies, dry, ended) = handle.await??;
        all.extend(latencies);
        ran_dry |= dry;
        last = last.max(ended);
    }
    close_store(store);
    let _ = std::fs::remove_dir_all(work_dir);
    let seconds = last.saturating_duration_since(counted_from).as_secs_f64();
    if all.is_empty() || seconds <= 0.0 {
        bail!("no claim was made after the warm-up (the queue ran dry: {ran_dry})");
    }
    let claims = all.len() as u64;
    Ok(ClaimRun {
        per_s: claims as f64 / seconds,
        claims,
        p50_ms: all.quantile_ms(0.5),
        p99_ms: all.quantile_ms(0.99),
        ran_dry,
    })
}
