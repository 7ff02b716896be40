//! `lmsp-bench`: the service-level benchmark harness (the README's performance targets).
//!
//! It starts the real `lmsp` binary on temp data directories (or targets `--url`), measures the
//! figures of the README's performance targets — background submits per second and their latency at 1, 16, 64 and
//! 256 clients, persisted events per second with 256 tasks streaming, startup recovery of
//! 100 000 leftovers, writers' p99 commit latency while a purge of 1 000 000 events runs, RSS
//! idle and with 10 000 open SSE streams — each over several repetitions, measures the matching
//! raw SQLite ceilings in the same run (`lmsp_bench::ceilings`), compares LMSP with a
//! peer job queue (apalis + SQLite) on the same workload, reads the service's context switches
//! and threads from `/proc` during the submit runs, measures background submits on PostgreSQL
//! (one instance and three on one database) beside `pgbench`'s insert-commit ceiling of the same
//! cluster (`--only postgres`; in the default set when a PostgreSQL is available), measures
//! OpenAI's Batch API on a 50 000-line batch (upload, validate + create, lines per second against
//! the same lines posted one by one, an interactive client's p99 while it runs), measures SQLite
//! claims per second with a long queue of one client beside the same queue spread over the three
//! service tiers and many clients (`--only claims`, in process through the storage port), and
//! task completions per second with a webhook receiver that hangs beside none (`--only
//! webhooks`), and prints a table of
//! figure | measured (min / median / max) | ceiling | ratio | target | met?.
//!
//! `--quick` runs a small version in seconds (CI's smoke test: it asserts the harness works,
//! never speeds). `--chart PATH` draws submit throughput and p99 against concurrency (PNG).

mod batch;
mod chart;
mod client;
mod events;
mod peer;
mod pg_claims;
mod pg_streams;
mod phases;
mod plan;
mod postgres;
mod procfs;
mod purge;
mod raw;
mod recovery;
mod report;
mod results;
mod rss;
mod sqlite_claims;
mod submit;
mod webhooks;

use lmsp_bench::{server, stats};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;

use crate::phases::{record, Phases};
use crate::plan::Plan;
use crate::results::Results;
use crate::server::{find_lmsp, Server};

/// Measures the LMSP service against the README's performance targets and the raw SQLite ceilings.
#[derive(Debug, Parser)]
#[command(name = "lmsp-bench", version, about)]
struct Cli {
    /// A small version that runs in seconds (CI's smoke test; asserts nothing about speed).
    #[arg(long)]
    quick: bool,
    /// Repetitions of each figure (default 3, 1 with --quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Only these figures (comma-separated, or the flag repeated): submit, events, recovery,
    /// purge, rss, peer, postgres, batch, claims, webhooks (by default all; postgres only when a
    /// PostgreSQL is available), pg-claims and batch-memory (only when named).
    #[arg(long, value_delimiter = ',')]
    only: Vec<Figure>,
    /// The `lmsp` binary (default: next to this executable; also env LMSP_BIN).
    #[arg(long)]
    lmsp_bin: Option<PathBuf>,
    /// The peer example binary (default: examples/apalis_peer next to this executable; also env
    /// LMSP_BENCH_PEER_BIN).
    #[arg(long)]
    peer_bin: Option<PathBuf>,
    /// Target a running service instead of starting one (skips recovery and RSS).
    #[arg(long, requires = "token")]
    url: Option<String>,
    /// An admin token of the service given by --url.
    #[arg(long, env = "LMSP_TOKEN")]
    token: Option<String>,
    /// Where temp data directories go (default: the system temp directory).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Draw the submit chart (PNG) here.
    #[arg(long)]
    chart: Option<PathBuf>,
    /// A TrueType font for the chart (default: DejaVu Sans or Liberation Sans if present).
    #[arg(long)]
    chart_font: Option<PathBuf>,
    /// Leftover tasks for the recovery figure.
    #[arg(long)]
    leftovers: Option<usize>,
    /// Events to purge for the writer-latency figure.
    #[arg(long)]
    purge_events: Option<u64>,
    /// Open SSE streams for the RSS figure.
    #[arg(long)]
    streams: Option<usize>,
    /// SSE streams per task for the RSS figure (default 1: one task per stream).
    #[arg(long, default_value_t = 1)]
    streams_per_task: usize,
    /// Lines of the batch figures' batch (default 50 000, 500 with --quick; at most 50 000, the
    /// Batch API's limit).
    #[arg(long)]
    batch_lines: Option<usize>,
    /// Tasks queued for the claims figures (default 1 000 000, 3 000 with --quick).
    #[arg(long)]
    claim_queue: Option<usize>,
    /// Background tasks completed in each webhooks run (default 2 000, 200 with --quick).
    #[arg(long)]
    webhook_tasks: Option<usize>,
    /// Seconds of each submit run.
    #[arg(long)]
    submit_seconds: Option<f64>,
    /// PostgreSQL 15's binaries (initdb, pg_ctl, postgres, pgbench) for the postgres figures'
    /// throwaway cluster.
    #[arg(long, default_value = postgres::DEFAULT_BIN)]
    postgres_bin: PathBuf,
    /// Run the postgres figures on this server instead of a throwaway cluster
    /// (postgres://user@host:port/db; the harness creates and drops its own databases there).
    #[arg(long, env = "LMSP_BENCH_POSTGRES_URL")]
    postgres_url: Option<String>,
}

/// A figure family that `--only` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Figure {
    Submit,
    Events,
    Recovery,
    Purge,
    Rss,
    Peer,
    Postgres,
    Batch,
    Claims,
    Webhooks,
    /// PostgreSQL claims alone, one client and across tiers (only when asked for by name).
    PgClaims,
    /// Peak RSS of a batch's upload and creation for files of several sizes (only when asked
    /// for by name).
    BatchMemory,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let failed = runtime.block_on(async {
        tokio::select! {
            failed = run(cli) => failed,
            // Dropping the run stops what it started: the `lmsp` servers, a throwaway PostgreSQL
            // cluster, and the work directory.
            signal = stop_signal() => Err(anyhow::anyhow!(
                "stopped by {signal}; the servers and clusters this run started are stopped"
            )),
        }
    })?;
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM (`timeout`, `kill`), and names it. Without this, a
/// signal ended the process where it stood, and the `Drop`s that stop a throwaway PostgreSQL
/// cluster never ran: the cluster and its directory stayed behind.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

fn wants(cli: &Cli, figure: Figure) -> bool {
    cli.only.is_empty() || cli.only.contains(&figure)
}

/// Whether `--only` names the figure (then it must run, or the harness fails).
fn asked_for(cli: &Cli, figure: Figure) -> bool {
    cli.only.contains(&figure)
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    let started = Instant::now();
    let plan = Plan::new(&cli);
    let fds = rss::raise_fd_limit();
    let lmsp = match &cli.url {
        Some(_) => None,
        None => Some(find_lmsp(cli.lmsp_bin.as_deref())?),
    };
    let base_dir = match &cli.work_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => std::env::temp_dir(),
    };
    let work = tempfile::Builder::new()
        .prefix("lmsp-bench-")
        .tempdir_in(&base_dir)
        .context("cannot create the work directory")?;
    let work_dir = work.path().to_path_buf();

    report::header(&plan, lmsp.as_deref(), cli.url.as_deref(), fds);
    let mut results = Results::default();

    eprintln!("== raw SQLite ceilings");
    for rep in 0..plan.reps {
        results
            .ceilings
            .measure_once(
                &work_dir.join(format!("raw-{rep}")),
                plan.ceiling_duration,
                plan.leftovers,
            )
            .await?;
    }

    let target = cli
        .url
        .as_deref()
        .zip(cli.token.as_deref())
        .map(|(url, token)| Arc::new(Server::external(url, token)));
    let phases = Phases {
        plan: &plan,
        lmsp: lmsp.as_deref(),
        target: target.as_ref(),
        work_dir: &work_dir,
        peer_bin: cli.peer_bin.as_deref(),
        postgres_bin: &cli.postgres_bin,
        postgres_url: cli.postgres_url.as_deref(),
    };
    if wants(&cli, Figure::Submit) {
        record(&mut results, "submit", phases.submit_phase().await);
    }
    if wants(&cli, Figure::Postgres) {
        let explicit = asked_for(&cli, Figure::Postgres);
        record(
            &mut results,
            "postgres",
            phases.postgres_phase(explicit).await,
        );
    }
    if wants(&cli, Figure::Events) {
        record(&mut results, "events", phases.events_phase().await);
    }
    if wants(&cli, Figure::Recovery) {
        record(&mut results, "recovery", phases.recovery_phase().await);
    }
    if wants(&cli, Figure::Purge) {
        record(&mut results, "purge", phases.purge_phase().await);
    }
    if wants(&cli, Figure::Rss) {
        record(&mut results, "rss", phases.rss_phase().await);
    }
    if wants(&cli, Figure::Peer) {
        record(&mut results, "peer", phases.peer_phase().await);
    }
    if wants(&cli, Figure::Batch) {
        record(&mut results, "batch", phases.batch_phase().await);
    }
    if asked_for(&cli, Figure::BatchMemory) {
        record(
            &mut results,
            "batch-memory",
            phases.batch_memory_phase().await,
        );
    }
    if wants(&cli, Figure::Claims) {
        record(&mut results, "claims", phases.claims_phase().await);
    }
    if asked_for(&cli, Figure::PgClaims) {
        record(&mut results, "pg-claims", phases.pg_claims_phase().await);
    }
    if wants(&cli, Figure::Webhooks) {
        record(&mut results, "webhooks", phases.webhooks_phase().await);
    }

    let failed = results
        .problems
        .values()
        .any(|problem| problem.starts_with("failed"));
    report::tables(&plan, &results);
    if let Some(path) = &cli.chart {
        let points = report::chart_points(&results);
        let note = report::chart_note(&plan);
        match chart::draw(path, cli.chart_font.as_deref(), &points, &note) {
            Ok(()) => println!("\nchart written to {}", path.display()),
            Err(error) => println!("\nchart not written: {error:#}"),
        }
    }
    println!(
        "\nharness finished in {:.1} s; load average after the run: {}",
        started.elapsed().as_secs_f64(),
        report::load_average()
    );
    drop(work);
    Ok(failed)
}
