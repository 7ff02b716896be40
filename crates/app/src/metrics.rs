//! Prometheus metrics of the service (`GET /metrics`).
//!
//! Counts that describe tasks and events are taken from committed events only ([`Metrics`] is a
//! told of commits by the app's [`crate::Listener`]), so a metric never counts a write that was
//! rolled back. The store also reports each group commit's size and duration. Tasks by status are read
//! from the store when the metrics are scraped.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use lmsp_domain::ports::{CommitStats, PurgeReport, RecoveryReport};
use lmsp_domain::webhooks::Delivery;
use lmsp_domain::{Event, EventKind, TaskStatus};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The service's metrics, rendered in the Prometheus (OpenMetrics) text format.
pub struct Metrics {
    registry: Registry,
    tasks: Family<StatusLabel, Gauge>,
    submitted: Counter,
    finished: Family<OutcomeLabel, Counter>,
    events_written: Counter,
    commit_commands: Histogram,
    commit_seconds: Histogram,
    failed_transactions: Counter,
    recovered: Family<OutcomeLabel, Counter>,
    purged_tasks: Counter,
    purged_events: Counter,
    purged_idempotency_keys: Counter,
    purge_runs: Counter,
    log_lines_dropped: Counter,
    webhook_attempts: Family<OutcomeLabel, Counter>,
    dropped_source: std::sync::Mutex<Option<DroppedLines>>,
}

/// Tells how many log lines the log writer dropped so far.
pub type DroppedLines = Box<dyn Fn() -> u64 + Send + Sync>;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lmsp");
        let tasks = Family::<StatusLabel, Gauge>::default();
        registry.register("tasks", "Tasks stored, by status", tasks.clone());
        let submitted = Counter::default();
        registry.register(
            "tasks_submitted",
            "Tasks created since this process started",
            submitted.clone(),
        );
        let finished = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "tasks_finished",
            "Tasks finished since this process started, by outcome",
            finished.clone(),
        );
        let events_written = Counter::default();
        registry.register(
            "events_written",
            "Task events committed since this process started",
            events_written.clone(),
        );
        let commit_commands = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        registry.register(
            "commit_batch_commands",
            "Commands carried by one group commit",
            commit_commands.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register_with_unit(
            "commit_duration",
            "Duration of one group-commit transaction, BEGIN to COMMIT",
            Unit::Seconds,
            commit_seconds.clone(),
        );
        let failed_transactions = Counter::default();
        registry.register(
            "commit_failures",
            "Group-commit transactions that did not commit",
            failed_transactions.clone(),
        );
        let recovered = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "recovery_tasks",
            "Leftover tasks looked at by startup recovery, by what happened to them",
            recovered.clone(),
        );
        let purged_tasks = Counter::default();
        registry.register(
            "purged_tasks",
            "Finished tasks removed by the purge job",
            purged_tasks.clone(),
        );
        let purged_events = Counter::default();
        registry.register(
            "purged_events",
            "Events removed with purged tasks",
            purged_events.clone(),
        );
        let purged_idempotency_keys = Counter::default();
        registry.register(
            "purged_idempotency_keys",
            "Expired idempotency keys removed by the purge job",
            purged_idempotency_keys.clone(),
        );
        let purge_runs = Counter::default();
        registry.register(
            "purge_runs",
            "Completed passes of the purge job",
            purge_runs.clone(),
        );
        let log_lines_dropped = Counter::default();
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because the log sink was slow or broken (no reply waits for it)",
            log_lines_dropped.clone(),
        );
        let webhook_attempts = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "webhook_attempts",
            "Webhook delivery attempts, by outcome: delivered (2xx), retried (else, tried again \
             later), given_up (the retry period ran out)",
            webhook_attempts.clone(),
        );
        Self {
            registry,
            tasks,
            submitted,
            finished,
            events_written,
            commit_commands,
            commit_seconds,
            failed_transactions,
            recovered,
            purged_tasks,
            purged_events,
            purged_idempotency_keys,
            purge_runs,
            log_lines_dropped,
            webhook_attempts,
            dropped_source: std::sync::Mutex::new(None),
        }
    }

    /// Where the count of dropped log lines comes from (the binary's log writer).
    pub fn count_dropped_log_lines(&self, source: DroppedLines) {
        *self
            .dropped_source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(source);
    }

    /// Records what startup recovery did.
    pub fn record_recovery(&self, report: &RecoveryReport) {
        let resumed = report.resumed.len() as u64;
        self.recovered
            .get_or_create(&OutcomeLabel { outcome: "resumed" })
            .inc_by(resumed);
        self.recovered
            .get_or_create(&OutcomeLabel { outcome: "moved" })
            .inc_by(report.moved.saturating_sub(resumed));
        self.recovered
            .get_or_create(&OutcomeLabel {
                outcome: "untouched",
            })
            .inc_by(report.untouched);
    }

    /// Records one purge batch.
    pub fn record_purge(&self, report: PurgeReport) {
        self.purged_tasks.inc_by(report.tasks);
        self.purged_events.inc_by(report.events);
    }

    /// Records expired idempotency keys removed.
    pub fn record_purged_keys(&self, keys: u64) {
        self.purged_idempotency_keys.inc_by(keys);
    }

    /// Records one webhook delivery attempt, as the delivery stands after it.
    pub fn record_webhook_attempt(&self, delivery: &Delivery) {
        let outcome = if delivery.delivered_at.is_some() {
            "delivered"
        } else if delivery.given_up_at.is_some() {
            "given_up"
        } else {
            "retried"
        };
        self.webhook_attempts
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Records a completed purge pass.
    pub fn record_purge_run(&self) {
        self.purge_runs.inc();
    }

    /// Renders every metric, with `counts` (tasks per status, as stored now) as the task gauge.
    pub fn render(&self, counts: &[(TaskStatus, u64)]) -> String {
        for status in TaskStatus::ALL.iter().copied() {
            let count = counts
                .iter()
                .find(|(counted, _)| *counted == status)
                .map_or(0, |(_, count)| *count);
            self.tasks
                .get_or_create(&StatusLabel {
                    status: status.as_str(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        if let Some(source) = self
            .dropped_source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            let dropped = source();
            let counted = self.log_lines_dropped.get();
            self.log_lines_dropped
                .inc_by(dropped.saturating_sub(counted));
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

impl Metrics {
    /// Counts the events of a commit.
    pub fn committed(&self, events: &[Event]) {
        self.events_written.inc_by(events.len() as u64);
        for event in events {
            let outcome = match event.kind() {
                EventKind::Created => {
                    self.submitted.inc();
                    continue;
                }
                EventKind::Completed => "completed",
                EventKind::Failed => "failed",
                EventKind::Cancelled => "cancelled",
                _ => continue,
            };
            self.finished.get_or_create(&OutcomeLabel { outcome }).inc();
        }
    }

    /// Counts one write transaction. A failure without commands (the store's writer itself
    /// failed between two transactions) counts as a failure only, not in the histograms.
    pub fn transaction_measured(&self, stats: CommitStats) {
        if stats.commands > 0 {
            self.commit_commands.observe(stats.commands as f64);
            self.commit_seconds.observe(stats.duration.as_secs_f64());
        }
        if !stats.committed {
            self.failed_transactions.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use lmsp_domain::{EventPayload, TaskId, Timestamp};

    use super::*;

    fn event(payload: EventPayload) -> Event {
        Event {
            task_id: TaskId::from_ulid(ulid::Ulid::from_parts(1, 1)),
            sequence_number: 2,
            created_at: Timestamp::from_millis(0),
            payload,
        }
    }

    fn value_of(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no series `{series}` in\n{text}"))
    }

    #[test]
    fn committed_events_count_written_events_and_finished_outcomes() {
        let metrics = Metrics::new();
        metrics.committed(&[
            event(EventPayload::InProgress {}),
            event(EventPayload::Cancelled {}),
            event(EventPayload::Cancelling {}),
        ]);
        metrics.committed(&[event(EventPayload::Cancelled {})]);
        let text = metrics.render(&[]);
        assert_eq!(value_of(&text, "lmsp_events_written_total"), 4.0);
        assert_eq!(
            value_of(&text, "lmsp_tasks_finished_total{outcome=\"cancelled\"}"),
            2.0
        );
    }

    #[test]
    fn the_task_gauge_shows_every_status_with_zero_for_absent_ones() {
        let metrics = Metrics::new();
        let text = metrics.render(&[(TaskStatus::Running, 3)]);
        assert_eq!(value_of(&text, "lmsp_tasks{status=\"running\"}"), 3.0);
        assert_eq!(value_of(&text, "lmsp_tasks{status=\"queued\"}"), 0.0);
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn measured_transactions_fill_the_batch_and_latency_histograms() {
        let metrics = Metrics::new();
        for commands in [1, 64] {
            metrics.transaction_measured(CommitStats {
                commands,
                events: commands,
                duration: Duration::from_millis(2),
                committed: commands == 1,
            });
        }
        let text = metrics.render(&[]);
        assert_eq!(value_of(&text, "lmsp_commit_batch_commands_count"), 2.0);
        assert_eq!(value_of(&text, "lmsp_commit_batch_commands_sum"), 65.0);
        assert_eq!(value_of(&text, "lmsp_commit_duration_seconds_count"), 2.0);
        assert_eq!(value_of(&text, "lmsp_commit_failures_total"), 1.0);
    }

    /// A store writer that failed between two transactions reports a failure without commands:
    /// it counts as a failure, not as a batch of zero in the histograms.
    #[test]
    fn a_failure_without_commands_counts_only_as_a_failure() {
        let metrics = Metrics::new();
        metrics.transaction_measured(CommitStats {
            commands: 0,
            events: 0,
            duration: Duration::ZERO,
            committed: false,
        });
        let text = metrics.render(&[]);
        assert_eq!(value_of(&text, "lmsp_commit_batch_commands_count"), 0.0);
        assert_eq!(value_of(&text, "lmsp_commit_duration_seconds_count"), 0.0);
        assert_eq!(value_of(&text, "lmsp_commit_failures_total"), 1.0);
    }
}
