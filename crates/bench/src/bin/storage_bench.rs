//! Storage benchmark: measures, in one run on this machine, the raw SQLite ceilings (fsync'd
//! single-row commits/s, rows/s at 64 rows per commit, raw event append — event insert + task
//! update — at 64 per commit) and then the adapter's `create_task` and `append` rates at 1, 16,
//! 64 and 256 concurrent callers, each with its ratio to the matching ceiling.
//!
//! The ceilings themselves are defined once, in `lmsp_bench::ceilings`; the
//! service-level harness (`crates/bench`) measures the same ones.
//!
//! Run: `cargo run --release -p lmsp-bench --bin storage-bench [-- --quick]`.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmsp_bench::ceilings;
use lmsp_domain::ids::TaskId;
use lmsp_domain::ports::{StoreError, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::transition::Step;
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Operations per second of `callers` concurrent callers, each running `operation` with its own
/// argument back to back for `duration`.
async fn rate<A, F, Fut>(args: Vec<A>, duration: Duration, operation: F) -> Res<f64>
where
    A: Clone + Send + 'static,
    F: Fn(A) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), StoreError>> + Send,
{
    let start = Instant::now();
    let handles: Vec<_> = args
        .into_iter()
        .map(|arg| {
            let operation = operation.clone();
            tokio::spawn(async move {
                let mut done = 0usize;
                while start.elapsed() < duration {
                    operation(arg.clone()).await?;
                    done += 1;
                }
                Ok::<usize, StoreError>(done)
            })
        })
        .collect();
    let mut total = 0usize;
    for handle in handles {
        total += handle.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn adapter_create(store: &Arc<SqliteStore>, callers: usize, duration: Duration) -> Res<f64> {
    let stores = vec![Arc::clone(store); callers];
    rate(stores, duration, |store: Arc<SqliteStore>| async move {
        let task = contract::task(contract::client_id(), RestartPolicy::Fail);
        store.create_task(task, None).await.map(drop)
    })
    .await
}

async fn adapter_append(store: &Arc<SqliteStore>, callers: usize, duration: Duration) -> Res<f64> {
    let mut running = Vec::new();
    for _ in 0..callers {
        let task = contract::task(contract::client_id(), RestartPolicy::Fail);
        store.create_task(task.clone(), None).await?;
        let steps = vec![
            Step::ClaimForLoading {
                model: contract::model_id(),
            },
            Step::Loaded,
        ];
        store.append(task.id, steps, None, contract::T0).await?;
        running.push((Arc::clone(store), task.id));
    }
    rate(
        running,
        duration,
        |(store, id): (Arc<SqliteStore>, TaskId)| async move {
            let step = Step::Output {
                delta: String::from("token "),
            };
            store
                .append(id, vec![step], None, contract::T0)
                .await
                .map(drop)
        },
    )
    .await
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Res<()> {
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
    let store = Arc::new(SqliteStore::open_without_hook(
        &dir.join("adapter.db"),
        options,
    )?);
    println!("adapter (synchronous=FULL):");
    for callers in [1usize, 16, 64, 256] {
        let rate = adapter_create(&store, callers, duration).await?;
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
        let rate = adapter_append(&store, callers, duration).await?;
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
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
