//! Everything a run measured, per figure family, for the tables and the chart.

use std::collections::BTreeMap;

use crate::raw::Ceilings;
use crate::stats::Spread;
use crate::submit;

/// Everything measured.
#[derive(Debug, Default)]
pub struct Results {
    pub(crate) ceilings: Ceilings,
    /// Per concurrency: submits/s, p50 ms, p99 ms, errors.
    pub(crate) submit: BTreeMap<usize, (Spread, Spread, Spread, u64)>,
    /// Per concurrency: the HTTP floor (`GET /v1/health`) per second, p50 ms, p99 ms, errors.
    pub(crate) health: BTreeMap<usize, (Spread, Spread, Spread, u64)>,
    pub(crate) half_peak_rate: Spread,
    pub(crate) half_peak_p99: Spread,
    pub(crate) half_peak_errors: u64,
    pub(crate) events_per_s: Spread,
    pub(crate) events_delay_p50: Spread,
    pub(crate) events_delay_p99: Spread,
    pub(crate) recovery_s: Spread,
    pub(crate) writer_alone_p99: Spread,
    pub(crate) writer_purging_p99: Spread,
    pub(crate) purged_events: u64,
    pub(crate) purge_seconds: Spread,
    pub(crate) rss_idle: Spread,
    /// Spawn → listening on an empty data directory (the RSS phase's starts), ms.
    pub(crate) fresh_start_s: Spread,
    pub(crate) rss_streams: Spread,
    pub(crate) peer_lmsp: Spread,
    pub(crate) peer_apalis: Spread,
    /// `/proc` during the submit runs (a service the harness started).
    pub(crate) proc: ProcFigures,
    /// The PostgreSQL figures.
    pub(crate) pg: PgFigures,
    /// The Batch API figures.
    pub(crate) batch: BatchFigures,
    /// SQLite claims per second, single queue and across tiers.
    pub(crate) claims: ClaimFigures,
    /// Completions per second with and without a hanging webhook receiver.
    pub(crate) webhooks: WebhookFigures,
    /// Figure family → why it did not run or failed.
    pub(crate) problems: BTreeMap<&'static str, String>,
}

/// A closed-loop figure: per second, p50 ms, p99 ms (each over the repetitions), errors.
pub type Level = (Spread, Spread, Spread, u64);

/// Adds one run to a closed-loop figure.
pub(crate) fn push_level(level: &mut Level, run: &submit::LevelRun) {
    level.0.push(run.per_s);
    level.1.push(run.p50_ms);
    level.2.push(run.p99_ms);
    level.3 += run.errors;
}

/// What `/proc` said about the submit service.
#[derive(Debug, Default)]
pub struct ProcFigures {
    /// Threads 0.2 s after ready, before any request.
    pub(crate) threads_idle: Spread,
    /// Per submit concurrency: the service's context switches per 202.
    pub(crate) submit_switches: BTreeMap<usize, Spread>,
    /// Per submit concurrency: the most threads seen during the run.
    pub(crate) submit_threads: BTreeMap<usize, Spread>,
    /// Per `GET /v1/health` concurrency: context switches per 200.
    pub(crate) health_switches: BTreeMap<usize, Spread>,
}

/// The PostgreSQL figures.
#[derive(Debug, Default)]
pub struct PgFigures {
    /// What the server was.
    pub(crate) described: String,
    /// pgbench's single-row insert commits per second at `pg_clients` clients.
    pub(crate) ceiling_tps: Spread,
    /// Submits at `pg_clients` clients on one instance.
    pub(crate) one: Level,
    /// Submits at `pg_clients` clients spread over `pg_instances` instances (summed).
    pub(crate) three: Level,
    /// The rate of the paced run on one instance: half its peak (`one`) of the same repetition.
    pub(crate) half_peak_rate: Spread,
    /// That paced run's p99, send → reply, ms.
    pub(crate) half_peak_p99: Spread,
    /// Its replies other than 202.
    pub(crate) half_peak_errors: u64,
    /// pgbench's p99 (start → end of each transaction, its schedule lag left out) paced at the
    /// same rate (`-R`), ms.
    pub(crate) pgbench_paced_p99: Spread,
    /// Persisted events per second with `stream_tasks` tasks streaming on one instance.
    pub(crate) events_per_s: Spread,
    pub(crate) events_delay_p50: Spread,
    pub(crate) events_delay_p99: Spread,
    /// SQLite's persisted events per second on the same workload, same repetition.
    pub(crate) sqlite_events_per_s: Spread,
    /// Persisted events per second with `pg_streams` streams over `pg_instances` instances,
    /// each following a task posted to another instance.
    pub(crate) streams_per_s: Spread,
    pub(crate) streams_delay_p50: Spread,
    pub(crate) streams_delay_p99: Spread,
    /// Claims per second with `pg_claim_queue` tasks queued, one instance.
    pub(crate) claims_one: Spread,
    /// Claims per second, `pg_instances` instances on the same queue (summed).
    pub(crate) claims_three: Spread,
}

/// The Batch API figures (each over the repetitions).
#[derive(Debug, Default)]
pub struct BatchFigures {
    /// Multipart `POST /v1/files` of the file, sent → reply, s.
    pub(crate) upload_s: Spread,
    /// The service's RSS right before the upload, MiB.
    pub(crate) upload_rss_before: Spread,
    /// Its highest RSS during the upload, MiB.
    pub(crate) upload_rss_peak: Spread,
    /// Peak − before, MiB.
    pub(crate) upload_rss_growth: Spread,
    /// `POST /v1/batches` → first seen `in_progress`, s.
    pub(crate) create_s: Spread,
    /// The service's RSS right before `POST /v1/batches`, MiB.
    pub(crate) create_rss_before: Spread,
    /// Its highest RSS until `in_progress`, MiB.
    pub(crate) create_rss_peak: Spread,
    /// Peak − before, MiB.
    pub(crate) create_rss_growth: Spread,
    /// Lines per second, `in_progress` → `completed`.
    pub(crate) lines_per_s: Spread,
    /// Lines per second, `POST /v1/batches` → `completed`.
    pub(crate) end_to_end_per_s: Spread,
    /// Every line counted → `completed` (the upkeep noticing, then writing the files), s.
    pub(crate) finalize_s: Spread,
    /// The same lines as background submits, first POST → all finished, per second.
    pub(crate) background_per_s: Spread,
    /// The interactive client on the idle service: p50 and p99, ms.
    pub(crate) idle_p50: Spread,
    pub(crate) idle_p99: Spread,
    /// The interactive client while the batch runs: p50 and p99, ms.
    pub(crate) busy_p50: Spread,
    pub(crate) busy_p99: Spread,
    /// Interactive requests not answered 200 (idle and busy, every repetition).
    pub(crate) interactive_errors: u64,
}

/// SQLite claims per second with `claim_queue` tasks queued (in process, the storage port's
/// `claim_next`, `claim_loops` loops each ending its task before the next claim).
#[derive(Debug, Default)]
pub struct ClaimFigures {
    /// Preparing the single queue's template and the one across tiers (once per run), s.
    pub(crate) prepare_single_s: Spread,
    pub(crate) prepare_tiers_s: Spread,
    /// Claims per second, every task one client's in the `default` tier.
    pub(crate) single_per_s: Spread,
    /// A `claim_next` call's p50 and p99 there, ms.
    pub(crate) single_p50: Spread,
    pub(crate) single_p99: Spread,
    /// Claims per second, the same number of tasks over three tiers and `claim_clients` clients.
    pub(crate) tiers_per_s: Spread,
    /// A `claim_next` call's p50 and p99 there, ms.
    pub(crate) tiers_p50: Spread,
    pub(crate) tiers_p99: Spread,
}

/// Completions per second of `webhook_tasks` background tasks, with and without a webhook
/// receiver that hangs.
#[derive(Debug, Default)]
pub struct WebhookFigures {
    /// No webhook endpoint.
    pub(crate) without_per_s: Spread,
    /// An endpoint subscribed to `response.completed` whose receiver never answers.
    pub(crate) hanging_per_s: Spread,
    /// Its deliveries neither delivered nor given up when the service was stopped.
    pub(crate) pending: Spread,
    /// Connections the receiver accepted.
    pub(crate) connections: Spread,
}
