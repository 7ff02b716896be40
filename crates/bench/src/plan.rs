//! The sizes of a run: the full run's (the README's figures) or `--quick`'s, and what the flags
//! change.

use std::time::Duration;

use crate::Cli;

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(crate) quick: bool,
    pub(crate) external: bool,
    pub(crate) reps: usize,
    pub(crate) ceiling_duration: Duration,
    pub(crate) submit_levels: Vec<usize>,
    pub(crate) submit_duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) stream_tasks: usize,
    pub(crate) stream_tokens: u32,
    pub(crate) leftovers: usize,
    pub(crate) purge_events: u64,
    pub(crate) events_per_task: u64,
    pub(crate) writers: usize,
    pub(crate) writers_alone: Duration,
    pub(crate) sse_streams: usize,
    pub(crate) streams_per_task: usize,
    pub(crate) peer_jobs: usize,
    pub(crate) peer_workers: usize,
    pub(crate) peer_pushers: usize,
    pub(crate) pg_clients: usize,
    pub(crate) pg_instances: usize,
    pub(crate) pgbench_seconds: u64,
    pub(crate) pgbench_threads: usize,
    /// Output tokens of each streaming task in the PostgreSQL events figure (fewer than SQLite's:
    /// the same `stream_tasks`, a run of a few seconds).
    pub(crate) pg_stream_tokens: u32,
    /// Tasks queued for the PostgreSQL claims figure.
    pub(crate) pg_claim_queue: usize,
    /// Concurrent claim loops per instance in the claims figure.
    pub(crate) pg_claimers: usize,
    /// How long each claims run lasts.
    pub(crate) pg_claim_duration: Duration,
    /// Streams of the streams figure, spread over `pg_instances` instances, each following a
    /// task posted to another instance.
    pub(crate) pg_streams: usize,
    /// The model load every instance of the streams figure waits through first, so that every
    /// stream is open before the tokens flow.
    pub(crate) pg_streams_load_delay: &'static str,
    /// Lines of the batch of the batch figures.
    pub(crate) batch_lines: usize,
    /// How often the batch figures' interactive client sends a request.
    pub(crate) batch_interactive_every: Duration,
    /// How long the interactive client runs alone on the idle service first.
    pub(crate) batch_idle: Duration,
    /// Concurrent clients posting the comparison's background submits.
    pub(crate) batch_submit_clients: usize,
    /// Tasks queued for the SQLite claims figures (single queue, and across tiers).
    pub(crate) claim_queue: usize,
    /// Clients with queued work in the claims figure across tiers.
    pub(crate) claim_clients: usize,
    /// Concurrent claim loops (a service's workers).
    pub(crate) claim_loops: usize,
    /// Claims before the counted part of each run (not counted).
    pub(crate) claim_warmup: Duration,
    /// How long the counted part of each claims run lasts.
    pub(crate) claim_duration: Duration,
    /// Background tasks completed in each webhooks run.
    pub(crate) webhook_tasks: usize,
    /// Concurrent clients posting them.
    pub(crate) webhook_clients: usize,
}

impl Plan {
    /// The sizes `cli` asks for.
    pub(crate) fn new(cli: &Cli) -> Self {
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
                pg_claim_queue: 3_000,
                pg_claimers: 16,
                pg_claim_duration: Duration::from_millis(300),
                pg_streams: 30,
                pg_streams_load_delay: "1s",
                batch_lines: 500,
                batch_interactive_every: Duration::from_millis(50),
                batch_idle: Duration::from_millis(500),
                batch_submit_clients: 64,
                claim_queue: 3_000,
                claim_clients: 100,
                claim_loops: 4,
                claim_warmup: Duration::from_millis(100),
                claim_duration: Duration::from_millis(300),
                webhook_tasks: 200,
                webhook_clients: 16,
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
                pg_claim_queue: 100_000,
                pg_claimers: 16,
                pg_claim_duration: Duration::from_secs(3),
                pg_streams: 1_000,
                pg_streams_load_delay: "4s",
                batch_lines: 50_000,
                batch_interactive_every: Duration::from_millis(50),
                batch_idle: Duration::from_secs(10),
                batch_submit_clients: 64,
                claim_queue: 1_000_000,
                claim_clients: 1_000,
                claim_loops: 4,
                claim_warmup: Duration::from_millis(500),
                claim_duration: Duration::from_secs(5),
                webhook_tasks: 2_000,
                webhook_clients: 16,
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
        if let Some(n) = cli.batch_lines {
            plan.batch_lines = n.max(1);
        }
        if let Some(n) = cli.claim_queue {
            plan.claim_queue = n.max(1);
        }
        if let Some(n) = cli.webhook_tasks {
            plan.webhook_tasks = n.max(1);
        }
        if let Some(s) = cli.submit_seconds {
            plan.submit_duration = Duration::from_secs_f64(s.max(0.05));
        }
        plan
    }
}
