//! The figure families, one phase each: every phase measures its figures over the repetitions
//! and returns its part of the [`Results`] (or why it did not run). The shared context is
//! [`Phases`]; the persisted events, recovery, purge, RSS and peer phases are here, the submit
//! phase (with `/proc`) in `submit_phase`, the PostgreSQL phase in `postgres_phase` and the
//! Batch API phase in `batch_phase`.

mod batch_phase;
mod claims_phase;
mod postgres_phase;
mod submit_phase;
mod webhooks_phase;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::plan::Plan;
use crate::results::Results;
use crate::server::{CpuMeter, Server};
use crate::stats::Spread;
use crate::{client, events, peer, purge, recovery, rss};

/// What one phase returns: its part of the results, or why it did not run.
pub(crate) enum Outcome {
    /// Measured: what to write into the results.
    Done(Box<dyn FnOnce(&mut Results) + Send>),
    /// Not run, and why.
    Skipped(String),
}

/// Applies a phase's outcome to the results, or notes why it has none.
pub(crate) fn record(results: &mut Results, name: &'static str, outcome: anyhow::Result<Outcome>) {
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
pub(crate) struct Phases<'a> {
    pub(crate) plan: &'a Plan,
    pub(crate) lmsp: Option<&'a Path>,
    pub(crate) target: Option<&'a Arc<Server>>,
    pub(crate) work_dir: &'a Path,
    pub(crate) peer_bin: Option<&'a Path>,
    pub(crate) postgres_bin: &'a Path,
    pub(crate) postgres_url: Option<&'a str>,
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

    /// Persisted events per second with `stream_tasks` tasks streaming, and each event's
    /// delay from `created_at` to its arrival over SSE.
    pub(crate) async fn events_phase(&self) -> anyhow::Result<Outcome> {
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

    /// Startup recovery of `leftovers` tasks: `lmsp serve` timed from spawn to listening.
    pub(crate) async fn recovery_phase(&self) -> anyhow::Result<Outcome> {
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

    /// Writers' p99 commit latency alone, then while the app's purge pass runs.
    pub(crate) async fn purge_phase(&self) -> anyhow::Result<Outcome> {
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

    /// RSS idle, and with `sse_streams` SSE streams open.
    pub(crate) async fn rss_phase(&self) -> anyhow::Result<Outcome> {
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

    /// LMSP beside the peer job queue (apalis + SQLite) on the same submit-and-complete work.
    pub(crate) async fn peer_phase(&self) -> anyhow::Result<Outcome> {
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

/// A short unique suffix for directory names.
fn ulid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
