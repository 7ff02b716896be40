//! The app's side of the notification port: one [`Listener`] the store tells of every commit
//! (its own, and what it hears of other instances'), handing the news to the live fan-out, the
//! metrics, the store's health, and the workers' cancel tokens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use lmsp_domain::ports::{CommitStats, StoreListener};
use lmsp_domain::{Event, EventKind, TaskId};

use crate::live::LiveEvents;
use crate::metrics::Metrics;

/// Whether the store takes new work: a failed write transaction turns it off at once, and only
/// the health probe (`jobs::run_health_probe`, which also asks the store for room) turns it back
/// on — a write that commits does not, since on a full disk a small write still fits where a
/// submit does not.
#[derive(Debug)]
pub struct StoreHealth {
    healthy: AtomicBool,
}

impl Default for StoreHealth {
    fn default() -> Self {
        Self {
            healthy: AtomicBool::new(true),
        }
    }
}

impl StoreHealth {
    /// Whether the store takes new work, as the last failed write and the last probe found.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    /// Records the outcome of a write transaction: a failure turns health off; a commit leaves
    /// it as it is.
    pub fn record_write(&self, committed: bool) {
        if !committed {
            self.healthy.store(false, Ordering::SeqCst);
        }
    }

    /// Records what the health probe found: whether the store has room and commits.
    pub fn record_probe(&self, ok: bool) {
        self.healthy.store(ok, Ordering::SeqCst);
    }
}

/// The cancel tokens of the tasks this process's workers run.
#[derive(Debug, Default)]
pub struct RunningTasks {
    tokens: Mutex<HashMap<TaskId, CancellationToken>>,
}

impl RunningTasks {
    /// The token of a task a worker starts running.
    pub fn start(&self, task_id: TaskId) -> CancellationToken {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens.entry(task_id).or_default().clone()
    }

    /// Forgets a task its worker is done with.
    pub fn end(&self, task_id: TaskId) {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens.remove(&task_id);
    }

    /// Tells the worker of a task to stop, if one here runs it.
    pub fn cancel(&self, task_id: TaskId) {
        let tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(token) = tokens.get(&task_id) {
            token.cancel();
        }
    }

    /// How many tasks run here now.
    pub fn count(&self) -> usize {
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// What the store tells the app; build it before the store, hand it to the store as its
/// [`StoreListener`], and to the app.
#[derive(Default)]
pub struct Listener {
    /// The live fan-out.
    pub live: LiveEvents,
    /// The metrics.
    pub metrics: Metrics,
    /// The store's health.
    pub health: StoreHealth,
    /// The tasks this process runs.
    pub running: RunningTasks,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("watched_tasks", &self.live.watched_tasks())
            .field("running", &self.running.count())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener with nothing heard yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

impl StoreListener for Listener {
    fn committed(&self, events: &[Event]) {
        self.live.committed(events);
        self.metrics.committed(events);
        for event in events {
            if event.kind() == EventKind::Cancelling {
                self.running.cancel(event.task_id);
            }
        }
    }

    fn transaction_measured(&self, stats: CommitStats) {
        self.metrics.transaction_measured(stats);
        self.health.record_write(stats.committed);
    }

    fn advanced_elsewhere(&self, task_id: TaskId, last_sequence_number: u64) {
        self.live.advanced_elsewhere(task_id, last_sequence_number);
    }

    fn cancel_requested(&self, task_id: TaskId) {
        self.running.cancel(task_id);
    }
}

#[cfg(test)]
mod tests {
    use lmsp_domain::{EventPayload, Timestamp};

    use super::*;

    /// A committed `response.cancelling` stops the worker that runs the task here; other tasks'
    /// workers go on.
    #[test]
    fn a_committed_cancelling_event_cancels_the_running_worker() {
        let listener = Listener::default();
        let (mine, other) = (
            TaskId::from_ulid(ulid::Ulid::from_parts(1, 1)),
            TaskId::from_ulid(ulid::Ulid::from_parts(1, 2)),
        );
        let token = listener.running.start(mine);
        let untouched = listener.running.start(other);
        listener.committed(&[Event {
            task_id: mine,
            sequence_number: 4,
            created_at: Timestamp::from_millis(0),
            payload: EventPayload::Cancelling,
        }]);
        assert!(token.is_cancelled());
        assert!(!untouched.is_cancelled());
        listener.cancel_requested(other);
        assert!(
            untouched.is_cancelled(),
            "a cancel heard from elsewhere too"
        );
    }

    #[test]
    fn a_failed_write_turns_health_off_and_only_the_probe_turns_it_back_on() {
        let listener = Listener::default();
        assert!(listener.health.is_healthy());
        let stats = |committed| CommitStats {
            commands: 1,
            events: 0,
            duration: std::time::Duration::ZERO,
            committed,
        };
        listener.transaction_measured(stats(true));
        assert!(listener.health.is_healthy());
        listener.transaction_measured(stats(false));
        assert!(!listener.health.is_healthy());
        listener.transaction_measured(stats(true));
        assert!(
            !listener.health.is_healthy(),
            "a small commit does not prove room for new work"
        );
        listener.health.record_probe(true);
        assert!(listener.health.is_healthy());
        listener.health.record_probe(false);
        assert!(!listener.health.is_healthy());
    }
}
