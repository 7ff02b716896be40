//! Storage benchmark: measures, in one run on this machine, the raw SQLite ceilings (fsync'd
//! single-row commits/s, rows/s at 64 rows per commit, raw event append — event insert + task
//! update — at 64 per commit) and then the adapter's `create_task` and `append` rates at 1, 16,
//! 64 and 256 concurrent callers, each with its ratio to the matching ceiling.
//!
//! The ceilings themselves are defined once, in `lmsp_bench::ceilings`; the
//! service-level harness (`crates/bench`) measures the same ones.
//!
//! Run: `cargo run --release -p lmsp-bench --bin storage-bench [-- --quick]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmsp_bench::ceilings;
use lmsp_bench::fixtures::{self, applied, claim, output, T0};
use lmsp_domain::ids::{InstanceId, TaskId};
use lmsp_domain::ports::TaskStore;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::transition::Step;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

/// Operations per second of concurrent callers, one per element of `states`, each running
/// `operation` on its own state back to back for `duration` (the operation hands the state back
/// for its next call).
async fn rate<A, F, Fut>(states: Vec<A>, duration: Duration, operation: F) -> anyhow::Result<f64>
where
    A: Send + 'static,
    F: Fn(A) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<A>> + Send,
{
    let start = Instant::now();
    let handles: Vec<_> = states
        .into_iter()
        .map(|mut state| {
            let operation = operation.clone();
            tokio::spawn(async move {
                let mut done = 0usize;
                while start.elapsed() < duration {
                    state = operation(state).await?;
                    done += 1;
                }
                Ok::<usize, anyhow::Error>(done)
            })
        })
        .collect();
    let mut total = 0usize;
    for handle in handles {
        total += handle.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn adapter_create(
    store: &Arc<SqliteStore>,
    owner: InstanceId,
    callers: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let stores = vec![Arc::clone(store); callers];
    rate(
        stores,
        duration,
        move |store: Arc<SqliteStore>| async move {
            let task = fixtures::task(owner, fixtures::client_id(), RestartPolicy::Fail)?;
            store.create_task(task, None).await?;
            Ok(store)
        },
    )
    .await
}

/// A running task's appender: the store, the task and the last sequence number it saw.
type Appender = (Arc<SqliteStore>, TaskId, u64);

async fn adapter_append(
    store: &Arc<SqliteStore>,
    owner: InstanceId,
    callers: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let mut running: Vec<Appender> = Vec::new();
    for _ in 0..callers {
        let task = fixtures::task(owner, fixtures::client_id(), RestartPolicy::Fail)?;
        store.create_task(task.clone(), None).await?;
        let steps = vec![claim(&task), Step::Loaded];
        let now = applied(store.append(task.id, owner, 1, steps, None, T0).await?)?;
        running.push((Arc::clone(store), task.id, now.last_sequence_number));
    }
    rate(
        running,
        duration,
        move |(store, id, last): Appender| async move {
            let outcome = store
                .append(id, owner, last, vec![output("token ")], None, T0)
                .await?;
            let last = applied(outcome)?.last_sequence_number;
            Ok((store, id, last))
        },
    )
    .await
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let duration = Duration::from_millis(if quick { 500 } else { 2000 });
    let dir = std::env::temp_dir().join(format!("lmsp-storage-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let raw = dir.join("raw.db");
    let single = ceilings::single_row_commits(&raw, duration)?.per_second();
    let batched = ceilings::rows_per_commit(&raw, 64, duration)?.per_second();
    let events = ceilings::event_appends(&raw, 64, duration)?.per_second();
    println!("raw SQLite ceilings (WAL, synchronous=FULL):");
    println!("  single-row commits/s           {single:>10.0}");
    println!("  rows/s at 64 rows per commit   {batched:>10.0}");
    println!("  event appends/s at 64/commit   {events:>10.0}");

    let options = SqliteOptions {
        sync: SyncMode::Full,
        ..SqliteOptions::default()
    };
    let store = Arc::new(SqliteStore::open_without_listener(
        &dir.join("adapter.db"),
        options,
    )?);
    let owner = fixtures::register_instance(store.as_ref(), T0).await?;
    println!("adapter (synchronous=FULL):");
    for callers in [1usize, 16, 64, 256] {
        let rate = adapter_create(&store, owner, callers, duration).await?;
        let ceiling = if callers == 1 { single } else { batched };
        println!(
            "  create_task  callers={callers:>3}  {rate:>9.0}/s  ratio {:>5.1}% of {}",
            100.0 * rate / ceiling,
            if callers == 1 {
                "single-commit"
            } else {
                "64-row batch"
            }
        );
    }
    for callers in [1usize, 16, 64, 256] {
        let rate = adapter_append(&store, owner, callers, duration).await?;
        let ceiling = if callers == 1 { single } else { events };
        println!(
            "  append       callers={callers:>3}  {rate:>9.0}/s  ratio {:>5.1}% of {}",
            100.0 * rate / ceiling,
            if callers == 1 {
                "single-commit"
            } else {
                "raw event append"
            }
        );
    }
    store.close();
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
