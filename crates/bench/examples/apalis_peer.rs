//! The peer of the harness's comparison: apalis 0.6 with its SQLite storage (apalis-sql, sqlx)
//! doing the same submit-and-complete workload as the LMSP side — push N jobs from P concurrent
//! pushers while one worker with concurrency W completes each with a trivial job — and printing
//! jobs per second, from the first push to the moment its storage holds all N jobs as `Done`
//! (checked through `Storage::fetch_by_id` once the job function has run N times; apalis 0.6.4's
//! own `stats()` fails on SQLite with "column index out of bounds").
//!
//! The database is opened as LMSP opens its own: WAL, `synchronous=FULL` (every push is
//! durable before it returns). apalis polls: this peer polls every 5 ms for up to 64 jobs.
//! `lmsp-bench` runs this example as a subprocess (it is an example so that apalis stays a
//! dev-dependency of the bench crate only) and reads its last line:
//!
//! ```text
//! apalis_peer jobs=2000 seconds=1.234 jobs_per_second=1620.7
//! ```
//!
//! Run alone: `cargo run --release -p lmsp-bench --example apalis_peer -- --jobs 2000
//! --workers 4 --pushers 16 --db /tmp/apalis.db`.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use apalis::prelude::*;
use apalis_sql::sqlite::SqliteStorage;
use apalis_sql::Config;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// The job: a number to hand back.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: u64,
}

/// How many times the job function ran.
static RAN: AtomicU64 = AtomicU64::new(0);

/// The trivial work.
async fn complete(job: Job) -> Result<u64, Error> {
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(job.n)
}

#[derive(Debug)]
struct Args {
    jobs: u64,
    workers: usize,
    pushers: usize,
    db: PathBuf,
}

fn value<T: FromStr>(args: &[String], name: &str, default: T) -> anyhow::Result<T> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{name} needs a value")),
    }
}

fn parse_args() -> anyhow::Result<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    Ok(Args {
        jobs: value(&args, "--jobs", 2000)?,
        workers: value(&args, "--workers", 4)?,
        pushers: value(&args, "--pushers", 16)?,
        db: value(
            &args,
            "--db",
            std::env::temp_dir().join(format!("apalis-peer-{}.db", std::process::id())),
        )?,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if args.db.exists() {
        bail!("{} exists already; give a fresh path", args.db.display());
    }
    let options = SqliteConnectOptions::new()
        .filename(&args.db)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .context("cannot open the apalis database")?;
    SqliteStorage::setup(&pool)
        .await
        .context("cannot migrate the apalis database")?;
    let config = Config::new("lmsp-bench::Job")
        .set_poll_interval(Duration::from_millis(5))
        .set_buffer_size(64);
    let storage: SqliteStorage<Job> = SqliteStorage::new_with_config(pool.clone(), config);

    let worker = WorkerBuilder::new("lmsp-bench-peer")
        .concurrency(args.workers)
        .backend(storage.clone())
        .build_fn(complete);
    let running = tokio::spawn(worker.run());

    let start = Instant::now();
    let mut pushers = Vec::with_capacity(args.pushers);
    for p in 0..args.pushers as u64 {
        let mut storage = storage.clone();
        let (jobs, step) = (args.jobs, args.pushers as u64);
        pushers.push(tokio::spawn(async move {
            let mut n = p;
            let mut ids = Vec::new();
            while n < jobs {
                ids.push(storage.push(Job { n }).await?.task_id);
                n += step;
            }
            Ok::<_, sqlx::Error>(ids)
        }));
    }
    let mut pending = Vec::with_capacity(args.jobs as usize);
    for pusher in pushers {
        pending.extend(pusher.await??);
    }
    let deadline = start + Duration::from_secs(600);
    while RAN.load(Ordering::Relaxed) < args.jobs {
        if Instant::now() > deadline {
            bail!(
                "apalis ran {} of {} jobs in time",
                RAN.load(Ordering::Relaxed),
                args.jobs
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut reader = storage.clone();
    while !pending.is_empty() {
        let mut left = Vec::new();
        for id in pending {
            let job = reader.fetch_by_id(&id).await?;
            let done = job.is_some_and(|job| *job.parts.context.status() == State::Done);
            if !done {
                left.push(id);
            }
        }
        pending = left;
        if Instant::now() > deadline {
            bail!("{} apalis jobs were never acknowledged", pending.len());
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    running.abort();
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut path = args.db.clone().into_os_string();
        path.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(path));
    }
    println!(
        "apalis_peer jobs={} seconds={seconds:.3} jobs_per_second={:.1}",
        args.jobs,
        args.jobs as f64 / seconds
    );
    Ok(())
}
