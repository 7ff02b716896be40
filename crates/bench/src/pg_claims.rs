//! Claims per second on PostgreSQL with a long queue, in process: a deliberate exception to
//! "through the binary" (like `purge.rs`), since no request measures a claim alone — a worker's
//! claim is followed by its run. The figure is the storage port's `claim_next` on the PostgreSQL
//! adapter, the call every worker of every instance makes.
//!
//! The queue is prepared through the port (`create_task`, 64 at a time: the adapter group-commits
//! them). Each "instance" is a store of its own (its own pool, lanes and `LISTEN` connection) on
//! the same database, registered as an instance, with `claimers` concurrent claim loops; the
//! figure is claims committed per second, summed over the instances.
//!
//! Each loop is a worker whose run takes no time, as in the SQLite claims figure
//! (`sqlite_claims.rs`): it claims a task, ends it (a `Fail` step), and claims again. So a
//! client's running tasks are at most the claim loops, as a service's workers leave them. Before
//! (loops that only claimed), one client had thousands of tasks running by the end of a run,
//! which no service can have, and every claim counted them (`tasks_active`): 2 ms for 7 000, the
//! bulk of a claim's cost, growing through the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lmsp_domain::ports::{CreateOutcome, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::ServiceTier;
use lmsp_domain::time::Timestamp;
use lmsp_storage_postgres::{PostgresOptions, PostgresStore};

use lmsp_bench::fixtures;

/// Opens a store on `url` (the first one creates the schema).
async fn open(url: &str) -> anyhow::Result<PostgresStore> {
    Ok(PostgresStore::connect_without_listener(url, PostgresOptions::default()).await?)
}

/// Queues `tasks` tasks on the database at `url`, `parallel` creates at a time: with one client,
/// every task its own in the `default` tier (a single queue); with more, task `i` of client
/// `i mod clients` in tier `i mod 3` (priority, default, flex), so every client has a head in each
/// tier.
pub async fn prepare(
    url: &str,
    tasks: usize,
    parallel: usize,
    clients: usize,
) -> anyhow::Result<()> {
    let store = open(url).await?;
    let owner = fixtures::register_instance(&store, fixtures::T0).await?;
    let ids: Vec<_> = (0..clients.max(1)).map(|_| fixtures::client_id()).collect();
    let (store, ids) = (&store, &ids);
    let mut created = futures::stream::iter(0..tasks)
        .map(|i| async move {
            let mut task = fixtures::task(owner, ids[i % ids.len()], RestartPolicy::Retry)?;
            if ids.len() > 1 {
                task.service_tier = ServiceTier::ALL[i % ServiceTier::ALL.len()];
            }
            match store.create_task(task, None).await? {
                CreateOutcome::Created(_) => Ok(()),
                CreateOutcome::KeyAnswered(_) => {
                    anyhow::bail!("a create without a key was answered by one")
                }
                CreateOutcome::QueueFull(full) => anyhow::bail!("a create with no limit: {full}"),
            }
        })
        .buffer_unordered(parallel.max(1));
    while let Some(done) = created.next().await {
        done?;
    }
    store.close().await;
    Ok(())
}

/// What a run of [`claims_per_s`] measured.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRun {
    /// Claims committed per second, summed over the instances.
    pub per_s: f64,
    /// Claims that came back empty while tasks were still queued (each loop then tried again).
    pub empty: u64,
}

/// Claims in `instances` stores on `url`, `claimers` loops each, for `duration` or until all
/// `queued` tasks (those queued when it starts) are claimed: claims per second, summed.
///
/// An empty claim does not end a loop while tasks are still queued: the adapter claims again
/// while other claimers hold the heads it read (`SKIP LOCKED`), but only for a second, and
/// ending the loop there would count fewer claimers than the run started with. The run counts
/// such claims; the adapter's retry makes them rare.
pub async fn claims_per_s(
    url: &str,
    instances: usize,
    claimers: usize,
    duration: Duration,
    queued: u64,
) -> anyhow::Result<ClaimRun> {
    let mut stores: Vec<(Arc<PostgresStore>, lmsp_domain::ids::InstanceId)> = Vec::new();
    for _ in 0..instances.max(1) {
        // A claimer's id (claims need no registered instance: no lease is checked).
        stores.push((Arc::new(open(url).await?), fixtures::instance_id()));
    }
    let claimed = Arc::new(AtomicU64::new(0));
    let empty = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut loops = Vec::new();
    for (store, id) in &stores {
        for _ in 0..claimers.max(1) {
            let (store, id) = (Arc::clone(store), *id);
            let (claimed, empty) = (Arc::clone(&claimed), Arc::clone(&empty));
            loops.push(tokio::spawn(async move {
                let mut n = 0_u64;
                while Instant::now() < deadline {
                    let at = Timestamp::from_millis(fixtures::T0.as_millis() + 1 + n as i64);
                    match store.claim_next(id, at).await? {
                        Some(task) => {
                            claimed.fetch_add(1, Ordering::Relaxed);
                            n += 1;
                            fixtures::applied(
                                store.finish(task.id, id, fixtures::ended(), at).await?,
                            )?;
                        }
                        // The queue ran dry: the run ends early, and its rate is over the time
                        // it ran.
                        None if claimed.load(Ordering::Relaxed) >= queued => break,
                        // Every head this claim read was another claimer's.
                        None => {
                            empty.fetch_add(1, Ordering::Relaxed);
                            tokio::task::yield_now().await;
                        }
                    }
                }
                Ok::<(), anyhow::Error>(())
            }));
        }
    }
    for handle in loops {
        handle.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    for (store, _) in &stores {
        store.close().await;
    }
    let claimed = claimed.load(Ordering::Relaxed);
    Ok(ClaimRun {
        per_s: claimed as f64 / seconds,
        empty: empty.load(Ordering::Relaxed),
    })
}
