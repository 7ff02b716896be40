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
//! cluster (`--only postgres`; in the default set when a PostgreSQL is available), and prints a
//! table of
//! figure | measured (min / median / max) | ceiling | ratio | target | met?.
//!
//! `--quick` runs a small version in seconds (CI's smoke test: it asserts the harness works,
//! never speeds). `--chart PATH` draws submit throughput and p99 against concurrency (PNG).

mod chart;
mod client;
mod events;
mod peer;
mod postgres;
mod procfs;
mod purge;
mod raw;
mod recovery;
mod report;
mod rss;
mod submit;

use lmsp_bench::{server, stats};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use crate::procfs::ProcWatch;
use crate::raw::Ceilings;
use crate::server::{find_lmsp, CpuMeter, Server};
use crate::stats::Spread;
use crate::submit::Request;

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
    /// Only these figures (comma-separated): submit, events, recovery, purge, rss, peer,
    /// postgres (by default all; postgres only when a PostgreSQL is available).
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
}

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    quick: bool,
    external: bool,
    reps: usize,
    ceiling_duration: Duration,
    submit_levels: Vec<usize>,
    submit_duration: Duration,
    warmup: Duration,
    stream_tasks: usize,
    stream_tokens: u32,
    leftovers: usize,
    purge_events: u64,
    events_per_task: u64,
    writers: usize,
    writers_alone: Duration,
    sse_streams: usize,
    streams_per_task: usize,
    peer_jobs: usize,
    peer_workers: usize,
    peer_pushers: usize,
    pg_clients: usize,
    pg_instances: usize,
    pgbench_seconds: u64,
    pgbench_threads: usize,
    /// Output tokens of each streaming task in the PostgreSQL events figure (fewer than SQLite's:
    /// the same `stream_tasks`, a run of a few seconds).
    pg_stream_tokens: u32,
}

impl Plan {
    fn new(cli: &Cli) -> Self {
        let quick = cli.quick;
        let mut plan = if quick {
            Plan {
                quick,
                external: cli.url.is_some(),
                reps: 1,
                ceiling_duration: Duration::from_millis(300),
                submit_levels: vec![1, 16, 64, 256],
                submit_duration: Duration::from_millis(400),
                warmup: Duration::from_millis(100),
                stream_tasks: 32,
                stream_tokens: 16,
                leftovers: 2_000,
                purge_events: 20_000,
                events_per_task: 260,
                writers: 16,
                writers_alone: Duration::from_millis(300),
                sse_streams: 100,
                streams_per_task: 1,
                peer_jobs: 100,
                peer_workers: 4,
                peer_pushers: 16,
                pg_clients: 64,
                pg_instances: 3,
                pgbench_seconds: 1,
                pgbench_threads: 2,
                pg_stream_tokens: 16,
            }
        } else {
            Plan {
                quick,
                external: cli.url.is_some(),
                reps: 3,
                ceiling_duration: Duration::from_secs(2),
                submit_levels: vec![1, 16, 64, 256],
                submit_duration: Duration::from_secs(4),
                warmup: Duration::from_secs(1),
                stream_tasks: 256,
                stream_tokens: 1000,
                leftovers: 100_000,
                purge_events: 1_000_000,
                events_per_task: 260,
                writers: 16,
                writers_alone: Duration::from_secs(4),
                sse_streams: 10_000,
                streams_per_task: 1,
                peer_jobs: 2_000,
                peer_workers: 4,
                peer_pushers: 16,
                pg_clients: 64,
                pg_instances: 3,
                pgbench_seconds: 5,
                pgbench_threads: 2,
                pg_stream_tokens: 100,
            }
        };
        if let Some(reps) = cli.reps {
            plan.reps = reps.max(1);
        }
        if let Some(n) = cli.leftovers {
            plan.leftovers = n;
        }
        if let Some(n) = cli.purge_events {
            plan.purge_events = n;
        }
        if let Some(n) = cli.streams {
            plan.sse_streams = n;
        }
        plan.streams_per_task = cli.streams_per_task.max(1);
        if let Some(s) = cli.submit_seconds {
            plan.submit_duration = Duration::from_secs_f64(s.max(0.05));
        }
        plan
    }
}

/// Everything measured.
#[derive(Debug, Default)]
pub struct Results {
    ceilings: Ceilings,
    /// Per concurrency: submits/s, p50 ms, p99 ms, errors.
    submit: BTreeMap<usize, (Spread, Spread, Spread, u64)>,
    /// Per concurrency: the HTTP floor (`GET /v1/health`) per second, p50 ms, p99 ms, errors.
    health: BTreeMap<usize, (Spread, Spread, Spread, u64)>,
    half_peak_rate: Spread,
    half_peak_p99: Spread,
    half_peak_errors: u64,
    events_per_s: Spread,
    events_delay_p50: Spread,
    events_delay_p99: Spread,
    recovery_s: Spread,
    writer_alone_p99: Spread,
    writer_purging_p99: Spread,
    purged_events: u64,
    purge_seconds: Spread,
    rss_idle: Spread,
    /// Spawn → listening on an empty data directory (the RSS phase's starts), ms.
    fresh_start_s: Spread,
    rss_streams: Spread,
    peer_lmsp: Spread,
    peer_apalis: Spread,
    /// `/proc` during the submit runs (a service the harness started).
    proc: ProcFigures,
    /// The PostgreSQL figures.
    pg: PgFigures,
    /// Figure family → why it did not run or failed.
    problems: BTreeMap<&'static str, String>,
}

/// A closed-loop figure: per second, p50 ms, p99 ms (each over the repetitions), errors.
pub type Level = (Spread, Spread, Spread, u64);

fn push_level(level: &mut Level, run: &submit::LevelRun) {
    level.0.push(run.per_s);
    level.1.push(run.p50_ms);
    level.2.push(run.p99_ms);
    level.3 += run.errors;
}

/// What `/proc` said about the submit service.
#[derive(Debug, Default)]
pub struct ProcFigures {
    /// Threads 0.2 s after ready, before any request.
    threads_idle: Spread,
    /// Per submit concurrency: the service's context switches per 202.
    submit_switches: BTreeMap<usize, Spread>,
    /// Per submit concurrency: the most threads seen during the run.
    submit_threads: BTreeMap<usize, Spread>,
    /// Per `GET /v1/health` concurrency: context switches per 200.
    health_switches: BTreeMap<usize, Spread>,
}

/// The PostgreSQL figures.
#[derive(Debug, Default)]
pub struct PgFigures {
    /// What the server was.
    described: String,
    /// pgbench's single-row insert commits per second at `pg_clients` clients.
    ceiling_tps: Spread,
    /// Submits at `pg_clients` clients on one instance.
    one: Level,
    /// Submits at `pg_clients` clients spread over `pg_instances` instances (summed).
    three: Level,
    /// Persisted events per second with `stream_tasks` tasks streaming on one instance.
    events_per_s: Spread,
    events_delay_p50: Spread,
    events_delay_p99: Spread,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let failed = runtime.block_on(run(cli))?;
    if failed {
        std::process::exit(1);
    }
    Ok(())
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

/// What one phase returns: its part of the results, or why it did not run.
enum Outcome {
    Done(Box<dyn FnOnce(&mut Results) + Send>),
    Skipped(String),
}

fn record(results: &mut Results, name: &'static str, outcome: anyhow::Result<Outcome>) {
    match outcome {
        Ok(Outcome::Done(apply)) => apply(results),
        Ok(Outcome::Skipped(why)) => {
            println!("\n[{name}] skipped: {why}");
            results.problems.insert(name, format!("skipped: {why}"));
        }
        Err(error) => {
            println!("\n[{name}] FAILED: {error:#}");
            results.problems.insert(name, format!("failed: {error:#}"));
        }
    }
}

/// The shared context of the phases.
struct Phases<'a> {
    plan: &'a Plan,
    lmsp: Option<&'a Path>,
    target: Option<&'a Arc<Server>>,
    work_dir: &'a Path,
    peer_bin: Option<&'a Path>,
    postgres_bin: &'a Path,
    postgres_url: Option<&'a str>,
}

impl Phases<'_> {
    /// The service for one repetition: the given one, or a fresh `lmsp serve` on a new data dir.
    fn server(&self, name: &str, flags: &[&str]) -> anyhow::Result<Arc<Server>> {
        if let Some(target) = self.target {
            return Ok(Arc::clone(target));
        }
        let lmsp = self.lmsp.ok_or_else(|| anyhow::anyhow!("no lmsp binary"))?;
        let dir = self.work_dir.join(format!("{name}-{}", ulid_like()));
        Ok(Arc::new(Server::start(lmsp, &dir, flags)?))
    }

    async fn submit_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        eprintln!("== background submits");
        let mut levels: BTreeMap<usize, Level> = BTreeMap::new();
        let mut health: BTreeMap<usize, Level> = BTreeMap::new();
        let mut proc = ProcFigures::default();
        let (mut half_rate, mut half_p99, mut half_errors) = (Spread::new(), Spread::new(), 0);
        println!("\n[submit] lmsp serve {} (the one worker sits in a 1 h model load, so only submits use the writer); /proc: the service's context switches summed over its threads, and its most threads, sampled every {} ms", submit::SERVE_FLAGS.join(" "), procfs::SAMPLE_EVERY.as_millis());
        for rep in 0..plan.reps {
            let server = self.server("submit", submit::SERVE_FLAGS)?;
            let http = client::http_client()?;
            if let Some(pid) = server.pid() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Some(threads) = procfs::threads(pid) {
                    println!("  rep {rep}: {threads} threads idle");
                    proc.threads_idle.push(threads as f64);
                }
            }
            submit::closed_loop(&http, &server, 16, plan.warmup, Request::Submit).await?;
            for clients in [1, 64] {
                let cpu = CpuMeter::start(&server);
                let watch = ProcWatch::start(&server);
                let run = submit::closed_loop(
                    &http,
                    &server,
                    clients,
                    plan.submit_duration,
                    Request::Health,
                )
                .await?;
                let seen = proc_report(watch, &run, "request").await?;
                println!(
                    "  rep {rep}: HTTP floor, GET /v1/health, {clients:>3} clients: {:>8.0}/s, p50 {:>7.2} ms, p99 {:>7.2} ms, errors {}; {}{}",
                    run.per_s, run.p50_ms, run.p99_ms, run.errors, cpu.report(&server), seen.text
                );
                if let Some(per) = seen.switches_per {
                    proc.health_switches.entry(clients).or_default().push(per);
                }
                push_level(health.entry(clients).or_default(), &run);
            }
            let mut peak: f64 = 0.0;
            for &clients in &plan.submit_levels {
                let cpu = CpuMeter::start(&server);
                let watch = ProcWatch::start(&server);
                let run = submit::closed_loop(
                    &http,
                    &server,
                    clients,
                    plan.submit_duration,
                    Request::Submit,
                )
                .await?;
                let seen = proc_report(watch, &run, "submit").await?;
                println!(
                    "  rep {rep}: {clients:>3} clients: {:>8.0} submits/s, p50 {:>7.2} ms, p99 {:>7.2} ms, errors {}; {}{}",
                    run.per_s, run.p50_ms, run.p99_ms, run.errors, cpu.report(&server), seen.text
                );
                if let Some(per) = seen.switches_per {
                    proc.submit_switches.entry(clients).or_default().push(per);
                }
                if let Some(threads) = seen.max_threads {
                    proc.submit_threads
                        .entry(clients)
                        .or_default()
                        .push(threads as f64);
                }
                push_level(levels.entry(clients).or_default(), &run);
                peak = peak.max(run.per_s);
            }
            let cpu = CpuMeter::start(&server);
            let half = submit::paced(&http, &server, peak / 2.0, plan.submit_duration, 256).await?;
            println!(
                "  rep {rep}: paced at {:.0}/s (half the peak {:.0}/s): achieved {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, errors {}; {}",
                half.target_per_s, peak, half.per_s, half.p50_ms, half.p99_ms, half.errors, cpu.report(&server)
            );
            half_rate.push(half.target_per_s);
            half_p99.push(half.p99_ms);
            half_errors += half.errors;
        }
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.submit = levels;
            r.health = health;
            r.proc = proc;
            r.half_peak_rate = half_rate;
            r.half_peak_p99 = half_p99;
            r.half_peak_errors = half_errors;
        })))
    }

    /// Submits on PostgreSQL: `pgbench`'s insert-commit ceiling, then per repetition one
    /// instance, three instances on one database, and (one instance) persisted events, each on a
    /// fresh database.
    async fn postgres_phase(&self, explicit: bool) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        let refuse = |why: String| -> anyhow::Result<Outcome> {
            if explicit {
                anyhow::bail!("--only postgres was asked for, but {why}")
            }
            Ok(Outcome::Skipped(why))
        };
        let Some(lmsp) = self.lmsp else {
            return refuse(String::from(
                "the PostgreSQL figures start their own lmsp serve instances (--url given)",
            ));
        };
        if let Some(why) = postgres::unavailable(self.postgres_bin, self.postgres_url) {
            return refuse(format!("no PostgreSQL is available: {why}"));
        }
        eprintln!("== PostgreSQL");
        let pg = match self.postgres_url {
            Some(url) => postgres::Postgres::external(url, self.postgres_bin)?,
            None => postgres::Postgres::start_cluster(self.postgres_bin)?,
        };
        let mut serve: Vec<&str> = submit::SERVE_FLAGS.to_vec();
        serve.extend(PG_FLAGS);
        println!(
            "\n[postgres] on {}; ceiling: pgbench -n -c {} -j {} -T {} -f (one single-row INSERT per transaction); figures: lmsp serve --database URL --instance NAME {} on a fresh database per repetition, {} closed-loop clients (round-robin over the instances); events: lmsp serve --database URL --workers {}, {} tasks × max_output_tokens {} posted with stream: true",
            pg.description,
            plan.pg_clients,
            plan.pgbench_threads,
            plan.pgbench_seconds,
            serve.join(" "),
            plan.pg_clients,
            plan.stream_tasks,
            plan.stream_tasks,
            plan.pg_stream_tokens,
        );
        let mut figures = PgFigures {
            described: pg.description.clone(),
            ..PgFigures::default()
        };
        for rep in 0..plan.reps {
            let tps = pg
                .pgbench(
                    self.work_dir,
                    plan.pg_clients,
                    plan.pgbench_threads,
                    plan.pgbench_seconds,
                )
                .await?;
            println!(
                "  rep {rep}: pgbench {} clients: {tps:.0} insert commits/s",
                plan.pg_clients
            );
            figures.ceiling_tps.push(tps);

            for instances in [1, plan.pg_instances] {
                let name = postgres::database_name(&format!("submit{instances}"));
                let url = pg.create_database(&name).await?;
                let run = self.pg_submits(lmsp, &url, instances, &serve).await;
                pg.drop_database(&name).await?;
                let (run, cpu) = run?;
                println!(
                    "  rep {rep}: {instances} instance(s), {} clients: {:>8.0} submits/s, p50 {:>7.2} ms, p99 {:>7.2} ms, errors {}; {cpu}",
                    plan.pg_clients, run.per_s, run.p50_ms, run.p99_ms, run.errors
                );
                let level = if instances == 1 {
                    &mut figures.one
                } else {
                    &mut figures.three
                };
                push_level(level, &run);
            }

            let name = postgres::database_name("events");
            let url = pg.create_database(&name).await?;
            let run = self.pg_events(lmsp, &url).await;
            pg.drop_database(&name).await?;
            let (run, cpu) = run?;
            println!(
                "  rep {rep}: events, {} tasks: {} events in {:.2} s = {:.0} events/s; created_at → arrival p50 {:.1} ms, p99 {:.1} ms; {cpu}",
                plan.stream_tasks, run.events, run.seconds, run.per_s, run.delay_p50_ms, run.delay_p99_ms
            );
            figures.events_per_s.push(run.per_s);
            figures.events_delay_p50.push(run.delay_p50_ms);
            figures.events_delay_p99.push(run.delay_p99_ms);
        }
        if pg.is_owned() {
            eprintln!("  stopping and removing the cluster");
        }
        drop(pg);
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.pg = figures;
        })))
    }

    /// Starts `instances` instances on the database at `url` (the first alone: it creates the
    /// schema and prints the admin token; then the others) and runs the closed-loop submits
    /// across them.
    async fn pg_submits(
        &self,
        lmsp: &Path,
        url: &str,
        instances: usize,
        serve: &[&str],
    ) -> anyhow::Result<(submit::LevelRun, String)> {
        let plan = self.plan;
        let mut servers: Vec<Arc<Server>> = Vec::with_capacity(instances);
        let mut token = String::new();
        for i in 1..=instances {
            let name = format!("bench-{i}");
            let mut flags = serve.to_vec();
            flags.extend(["--database", url, "--instance", &name]);
            let dir = self.work_dir.join(format!("pg-{}", ulid_like()));
            let mut server = Server::start(lmsp, &dir, &flags)?;
            if server.token.is_empty() {
                server.token.clone_from(&token);
            } else {
                token.clone_from(&server.token);
            }
            servers.push(Arc::new(server));
        }
        if token.is_empty() {
            anyhow::bail!("no instance printed the admin token of the fresh database");
        }
        let http = client::http_client()?;
        submit::closed_loop_across(&http, &servers, 16, plan.warmup, Request::Submit).await?;
        let cpus: Vec<CpuMeter> = servers.iter().map(|s| CpuMeter::start(s)).collect();
        let run = submit::closed_loop_across(
            &http,
            &servers,
            plan.pg_clients,
            plan.submit_duration,
            Request::Submit,
        )
        .await?;
        let cpu: Vec<String> = cpus
            .iter()
            .zip(&servers)
            .map(|(meter, server)| meter.report(server))
            .collect();
        Ok((run, cpu.join("; ")))
    }

    /// Persisted events with `stream_tasks` tasks streaming on one instance on `url`.
    async fn pg_events(
        &self,
        lmsp: &Path,
        url: &str,
    ) -> anyhow::Result<(events::EventsRun, String)> {
        let plan = self.plan;
        let mut flags = events::serve_flags(plan.stream_tasks);
        flags.extend(["--database", url, "--instance", "bench-events"].map(String::from));
        flags.extend(PG_FLAGS.iter().map(|flag| String::from(*flag)));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let dir = self.work_dir.join(format!("pg-events-{}", ulid_like()));
        let server = Arc::new(Server::start(lmsp, &dir, &flags)?);
        let http = client::http_client()?;
        let cpu = CpuMeter::start(&server);
        let run = events::run(&http, &server, plan.stream_tasks, plan.pg_stream_tokens).await?;
        Ok((run, cpu.report(&server)))
    }

    async fn events_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        eprintln!("== persisted events");
        let flags = events::serve_flags(plan.stream_tasks);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        println!(
            "\n[events] lmsp serve {} (reference engine, zero delays); {} tasks × max_output_tokens {} posted with stream: true",
            flags.join(" "),
            plan.stream_tasks,
            plan.stream_tokens
        );
        let (mut per_s, mut p50, mut p99) = (Spread::new(), Spread::new(), Spread::new());
        for rep in 0..plan.reps {
            let server = self.server("events", &flags)?;
            let http = client::http_client()?;
            let cpu = CpuMeter::start(&server);
            let run = events::run(&http, &server, plan.stream_tasks, plan.stream_tokens).await?;
            println!(
                "  rep {rep}: {} events in {:.2} s = {:.0} events/s; {} received over SSE; created_at → arrival p50 {:.1} ms, p99 {:.1} ms; {}",
                run.events, run.seconds, run.per_s, run.received, run.delay_p50_ms, run.delay_p99_ms, cpu.report(&server)
            );
            per_s.push(run.per_s);
            p50.push(run.delay_p50_ms);
            p99.push(run.delay_p99_ms);
        }
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.events_per_s = per_s;
            r.events_delay_p50 = p50;
            r.events_delay_p99 = p99;
        })))
    }

    async fn recovery_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        let Some(lmsp) = self.lmsp else {
            return Ok(Outcome::Skipped(String::from(
                "needs to start the process itself (--url given)",
            )));
        };
        eprintln!("== recovery");
        let template = self.work_dir.join("recovery-template");
        let prepared = Instant::now();
        recovery::prepare(&template, plan.leftovers).await?;
        println!(
            "\n[recovery] {} leftovers prepared through SqliteStore in {:.1} s (queued/loading/running/cancelling × fail/retry/resume); timing lmsp serve from spawn to \"listening\"",
            plan.leftovers,
            prepared.elapsed().as_secs_f64()
        );
        let http = client::http_client()?;
        let mut seconds = Spread::new();
        for rep in 0..plan.reps {
            let dir = self.work_dir.join(format!("recovery-{rep}"));
            let ready = recovery::time_start(lmsp, &template, &dir, &http, plan.leftovers).await?;
            println!("  rep {rep}: ready after {:.3} s", ready.as_secs_f64());
            seconds.push(ready.as_secs_f64());
        }
        let _ = std::fs::remove_dir_all(&template);
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.recovery_s = seconds;
        })))
    }

    async fn purge_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        eprintln!("== writers with and without purge");
        let template = self.work_dir.join("purge-template");
        let prepared = Instant::now();
        let events = purge::prepare(&template, plan.purge_events, plan.events_per_task).await?;
        println!(
            "\n[purge] {events} events in finished tasks of {} events each prepared through SqliteStore in {:.1} s; {} writers append one delta per call (synchronous=FULL), {:.1} s alone, then while the app's purge pass (lmsp_app::purge::purge_pass: batches of {} tasks / at most {} events past the first task, resting {}x each batch's time) runs to the end",
            plan.events_per_task,
            prepared.elapsed().as_secs_f64(),
            plan.writers,
            plan.writers_alone.as_secs_f64(),
            lmsp_app::purge::PURGE_BATCH,
            lmsp_storage_sqlite::SqliteOptions::default().purge_max_events,
            lmsp_app::purge::REST_FACTOR,
        );
        let (mut alone, mut purging, mut purge_s) = (Spread::new(), Spread::new(), Spread::new());
        let mut purged = 0;
        for rep in 0..plan.reps {
            let dir = self.work_dir.join(format!("purge-{rep}"));
            let run = purge::measure(&template, &dir, plan.writers, plan.writers_alone).await?;
            println!(
                "  rep {rep}: alone p50 {:.2} ms p99 {:.2} ms ({} appends); purging p50 {:.2} ms p99 {:.2} ms ({} appends); purged {} events in {:.2} s",
                run.alone_p50_ms, run.alone_p99_ms, run.appends.0, run.purging_p50_ms, run.purging_p99_ms, run.appends.1, run.purged_events, run.purge_seconds
            );
            alone.push(run.alone_p99_ms);
            purging.push(run.purging_p99_ms);
            purge_s.push(run.purge_seconds);
            purged = run.purged_events;
        }
        let _ = std::fs::remove_dir_all(&template);
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.writer_alone_p99 = alone;
            r.writer_purging_p99 = purging;
            r.purge_seconds = purge_s;
            r.purged_events = purged;
        })))
    }

    async fn rss_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        if self.target.is_some() {
            return Ok(Outcome::Skipped(String::from(
                "needs the process id of a service it started (--url given)",
            )));
        }
        eprintln!("== RSS");
        println!(
            "\n[rss] lmsp serve {}; VmRSS 0.5 s after ready, then with {} SSE streams open on queued tasks ({} per task)",
            rss::SERVE_FLAGS.join(" "),
            plan.sse_streams,
            plan.streams_per_task
        );
        let (mut idle, mut streams, mut fresh) = (Spread::new(), Spread::new(), Spread::new());
        for rep in 0..plan.reps {
            let server = self.server("rss", rss::SERVE_FLAGS)?;
            let http = client::http_client()?;
            fresh.push(server.ready_after.as_secs_f64() * 1000.0);
            let idle_mib = rss::idle(&server).await?;
            let (streams_mib, open) =
                rss::with_streams(&http, &server, plan.sse_streams, plan.streams_per_task).await?;
            println!(
                "  rep {rep}: idle {idle_mib:.1} MiB; {open} open SSE streams {streams_mib:.1} MiB"
            );
            idle.push(idle_mib);
            streams.push(streams_mib);
            drop(http);
        }
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.rss_idle = idle;
            r.rss_streams = streams;
            r.fresh_start_s = fresh;
        })))
    }

    async fn peer_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        eprintln!("== peer comparison");
        let flags = peer::serve_flags(plan.peer_workers);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        println!(
            "\n[peer] {} jobs pushed by {} concurrent clients, {} workers completing each; LMSP: lmsp serve {} (max_output_tokens 1); apalis 0.6 + SQLite (WAL, synchronous=FULL, 5 ms polls)",
            plan.peer_jobs,
            plan.peer_pushers,
            plan.peer_workers,
            flags.join(" ")
        );
        let peer_bin = peer::find_peer(self.peer_bin);
        let (mut lmsp_rate, mut apalis_rate) = (Spread::new(), Spread::new());
        for rep in 0..plan.reps {
            let server = self.server("peer", &flags)?;
            let http = client::http_client()?;
            let lmsp = peer::lmsp(&http, &server, plan.peer_jobs, plan.peer_pushers).await?;
            drop(server);
            lmsp_rate.push(lmsp);
            let apalis = match &peer_bin {
                Some(bin) => {
                    let db = self.work_dir.join(format!("apalis-{rep}.db"));
                    let rate = peer::apalis(
                        bin,
                        &db,
                        plan.peer_jobs,
                        plan.peer_workers,
                        plan.peer_pushers,
                    )
                    .await?;
                    apalis_rate.push(rate);
                    format!("{rate:.0} jobs/s")
                }
                None => String::from(
                    "not run (build the example: cargo build --release -p lmsp-bench --examples)",
                ),
            };
            println!("  rep {rep}: LMSP {lmsp:.0} jobs/s; apalis {apalis}");
        }
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.peer_lmsp = lmsp_rate;
            r.peer_apalis = apalis_rate;
            if peer_bin.is_none() {
                r.problems.insert(
                    "peer",
                    format!("skipped: no {} binary found", peer::PEER_EXAMPLE),
                );
            }
        })))
    }
}

/// The flags every PostgreSQL instance gets beyond its figure's (and `--database`, `--instance`).
const PG_FLAGS: &[&str] = &["--lease", "10s"];

/// What a [`ProcWatch`] saw, for the output and the figures.
struct ProcSeen {
    text: String,
    switches_per: Option<f64>,
    max_threads: Option<u64>,
}

async fn proc_report(
    watch: Option<ProcWatch>,
    run: &submit::LevelRun,
    what: &str,
) -> anyhow::Result<ProcSeen> {
    let Some(watch) = watch else {
        return Ok(ProcSeen {
            text: String::new(),
            switches_per: None,
            max_threads: None,
        });
    };
    let seen = watch.finish().await?;
    let per = seen.switches as f64 / (run.count.max(1)) as f64;
    Ok(ProcSeen {
        text: format!(
            "; /proc: {} context switches = {per:.2} per {what}, threads max {} (after {})",
            seen.switches, seen.max_threads, seen.threads_after
        ),
        switches_per: Some(per),
        max_threads: Some(seen.max_threads),
    })
}

/// A short unique suffix for directory names.
fn ulid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
