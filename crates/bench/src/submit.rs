//! Background submits (HTTP 202): closed-loop clients at each concurrency, and an open-loop run
//! paced at half the peak rate for the p99 target.
//!
//! The service runs with `--workers 1 --reference-load-delay 1h`: the one worker sits in
//! `loading` on the first task, so nothing but submits competes for the writer and the CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::client::{submit, submit_body};
use crate::server::Server;
use crate::stats::Latencies;

/// The flags the harness starts the service with for this figure.
pub const SERVE_FLAGS: &[&str] = &["--workers", "1", "--reference-load-delay", "1h"];

/// One closed-loop run.
#[derive(Debug, Clone)]
pub struct LevelRun {
    /// 202s per second.
    pub per_s: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Replies other than 202, and transport errors.
    pub errors: u64,
    /// Requests answered as expected (202, or 200 for `GET /v1/health`).
    pub count: u64,
}

/// What a closed-loop client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A background submit (expects 202).
    Submit,
    /// `GET /v1/health` (no auth, no SQLite; expects 200): the HTTP floor of this machine.
    Health,
}

async fn send(
    http: &reqwest::Client,
    server: &Server,
    body: &serde_json::Value,
    request: Request,
) -> bool {
    match request {
        Request::Submit => matches!(submit(http, server, body).await, Ok((202, _))),
        Request::Health => match http.get(server.url("/v1/health")).send().await {
            Ok(response) => response.status().as_u16() == 200 && response.bytes().await.is_ok(),
            Err(_) => false,
        },
    }
}

/// `clients` clients each sending `request` back to back for `duration`.
pub async fn closed_loop(
    http: &reqwest::Client,
    server: &Arc<Server>,
    clients: usize,
    duration: Duration,
    request: Request,
) -> anyhow::Result<LevelRun> {
    closed_loop_across(
        http,
        std::slice::from_ref(server),
        clients,
        duration,
        request,
    )
    .await
}

/// `clients` clients each sending `request` back to back for `duration`, client `i` to
/// `servers[i % servers.len()]` (round-robin: several instances on one database); the rate is the
/// sum over all of them.
pub async fn closed_loop_across(
    http: &reqwest::Client,
    servers: &[Arc<Server>],
    clients: usize,
    duration: Duration,
    request: Request,
) -> anyhow::Result<LevelRun> {
    if servers.is_empty() {
        anyhow::bail!("no server to send to");
    }
    let body = Arc::new(submit_body("Once upon a time", 16));
    let start = Instant::now();
    let mut handles = Vec::with_capacity(clients);
    for i in 0..clients {
        let server = Arc::clone(&servers[i % servers.len()]);
        let (http, body) = (http.clone(), Arc::clone(&body));
        handles.push(tokio::spawn(async move {
            let mut latencies = Latencies::new();
            let mut errors = 0u64;
            while start.elapsed() < duration {
                let sent = Instant::now();
                if send(&http, &server, &body, request).await {
                    latencies.push(sent.elapsed());
                } else {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Latencies::new();
    let mut errors = 0;
    for handle in handles {
        let (part, part_errors) = handle.await?;
        latencies.extend(part);
        errors += part_errors;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(LevelRun {
        per_s: latencies.len() as f64 / elapsed,
        p50_ms: latencies.quantile_ms(0.5),
        p99_ms: latencies.quantile_ms(0.99),
        errors,
        count: latencies.len() as u64,
    })
}

/// One open-loop run at a fixed rate.
#[derive(Debug, Clone)]
pub struct PacedRun {
    /// The rate asked for, per second.
    pub target_per_s: f64,
    /// The rate achieved (202s per second).
    pub per_s: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Replies other than 202, and transport errors.
    pub errors: u64,
}

/// Submits on a fixed schedule of `rate` per second for `duration`, at most `max_in_flight` at
/// once. Latency runs from the moment a request is sent to its reply.
pub async fn paced(
    http: &reqwest::Client,
    server: &Arc<Server>,
    rate: f64,
    duration: Duration,
    max_in_flight: usize,
) -> anyhow::Result<PacedRun> {
    let body = Arc::new(submit_body("Once upon a time", 16));
    let gate = Arc::new(Semaphore::new(max_in_flight.max(1)));
    let period = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let start = tokio::time::Instant::now();
    let mut handles = Vec::new();
    let mut n: u32 = 0;
    loop {
        let due = start + period * n;
        if due.duration_since(start) >= duration {
            break;
        }
        tokio::time::sleep_until(due).await;
        let permit = Arc::clone(&gate).acquire_owned().await?;
        let (http, server, body) = (http.clone(), Arc::clone(server), Arc::clone(&body));
        handles.push(tokio::spawn(async move {
            let sent = Instant::now();
            let outcome = submit(&http, &server, &body).await;
            drop(permit);
            match outcome {
                Ok((202, _)) => Some(sent.elapsed()),
                _ => None,
            }
        }));
        n += 1;
    }
    let mut latencies = Latencies::new();
    let mut errors = 0;
    for handle in handles {
        match handle.await? {
            Some(latency) => latencies.push(latency),
            None => errors += 1,
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(PacedRun {
        target_per_s: rate,
        per_s: latencies.len() as f64 / elapsed,
        p50_ms: latencies.quantile_ms(0.5),
        p99_ms: latencies.quantile_ms(0.99),
        errors,
    })
}
