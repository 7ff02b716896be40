//! The submit phase: closed-loop background submits at each concurrency, the HTTP floor
//! (`GET /v1/health`) beside them, a paced run at half the peak, and what `/proc` says about the
//! service meanwhile (context switches, threads).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Outcome, Phases};
use crate::client;
use crate::procfs::{self, ProcWatch};
use crate::results::{push_level, Level, ProcFigures, Results};
use crate::server::{CpuMeter, Server};
use crate::stats::Spread;
use crate::submit::{self, Request};

impl Phases<'_> {
    /// Background submits at each concurrency beside the HTTP floor, a paced run at half the
    /// peak, and `/proc` meanwhile.
    pub(crate) async fn submit_phase(&self) -> anyhow::Result<Outcome> {
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
                let (run, seen, cpu) = measure(
                    &http,
                    &server,
                    clients,
                    plan.submit_duration,
                    Request::Health,
                )
                .await?;
                println!(
                    "  rep {rep}: HTTP floor, GET /v1/health, {clients:>3} clients: {:>8.0}/s, p50 {:>7.2} ms, p99 {:>7.2} ms, errors {}; {cpu}{}",
                    run.per_s, run.p50_ms, run.p99_ms, run.errors, seen.text
                );
                if let Some(per) = seen.switches_per {
                    proc.health_switches.entry(clients).or_default().push(per);
                }
                push_level(health.entry(clients).or_default(), &run);
            }
            let mut peak: f64 = 0.0;
            for &clients in &plan.submit_levels {
                let (run, seen, cpu) = measure(
                    &http,
                    &server,
                    clients,
                    plan.submit_duration,
                    Request::Submit,
                )
                .await?;
                println!(
                    "  rep {rep}: {clients:>3} clients: {:>8.0} submits/s, p50 {:>7.2} ms, p99 {:>7.2} ms, errors {}; {cpu}{}",
                    run.per_s, run.p50_ms, run.p99_ms, run.errors, seen.text
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
}

/// What a [`ProcWatch`] saw, for the output and the figures.
struct ProcSeen {
    text: String,
    switches_per: Option<f64>,
    max_threads: Option<u64>,
}

/// One closed-loop run of `request` at `clients` clients, with what `/proc` saw meanwhile and the
/// service's CPU.
async fn measure(
    http: &reqwest::Client,
    server: &Arc<Server>,
    clients: usize,
    duration: Duration,
    request: Request,
) -> anyhow::Result<(submit::LevelRun, ProcSeen, String)> {
    let cpu = CpuMeter::start(server);
    let watch = ProcWatch::start(server);
    let run = submit::closed_loop(http, server, clients, duration, request).await?;
    let what = match request {
        Request::Health => "request",
        Request::Submit => "submit",
    };
    let seen = proc_report(watch, &run, what).await?;
    Ok((run, seen, cpu.report(server)))
}

/// What `watch` saw during `run`, per `what` (a request, a submit), when there was a watch.
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
