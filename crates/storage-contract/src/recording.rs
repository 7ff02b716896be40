//! A [`StoreListener`] that records everything it hears, for the checks on the notification
//! port: which events each transaction made durable, the measured transactions, and the news of
//! other processes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lmsp_domain::event::Event;
use lmsp_domain::ids::TaskId;
use lmsp_domain::ports::{CommitStats, StoreListener};

/// Everything a [`RecordingListener`] heard, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heard {
    /// Each `committed` call's events.
    pub committed: Vec<Vec<Event>>,
    /// Each measured transaction.
    pub transactions: Vec<CommitStats>,
    /// Each `advanced_elsewhere` call.
    pub advanced_elsewhere: Vec<(TaskId, u64)>,
    /// Each `cancel_requested` call.
    pub cancels_requested: Vec<TaskId>,
}

/// How much had been heard at some moment (see [`RecordingListener::mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    committed: usize,
    transactions: usize,
}

/// Records what the store tells it.
#[derive(Debug, Default)]
pub struct RecordingListener {
    heard: Mutex<Heard>,
}

impl RecordingListener {
    /// A listener that heard nothing yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Heard> {
        self.heard.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of everything heard.
    pub fn heard(&self) -> Heard {
        self.lock().clone()
    }

    /// Every committed event heard, in the order heard.
    pub fn events(&self) -> Vec<Event> {
        self.lock().committed.iter().flatten().cloned().collect()
    }

    /// The committed events of one task, in the order heard.
    pub fn events_of(&self, task_id: TaskId) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|event| event.task_id == task_id)
            .collect()
    }

    /// The present moment, to ask later what was heard since.
    pub fn mark(&self) -> Mark {
        let heard = self.lock();
        Mark {
            committed: heard.committed.len(),
            transactions: heard.transactions.len(),
        }
    }

    /// The committed events heard since `mark`.
    pub fn events_since(&self, mark: Mark) -> Vec<Event> {
        self.lock().committed[mark.committed..]
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The transactions measured since `mark`.
    pub fn transactions_since(&self, mark: Mark) -> Vec<CommitStats> {
        self.lock().transactions[mark.transactions..].to_vec()
    }

    /// The highest sequence number `advanced_elsewhere` reported for a task.
    pub fn advanced_elsewhere_to(&self, task_id: TaskId) -> Option<u64> {
        self.lock()
            .advanced_elsewhere
            .iter()
            .filter(|(task, _)| *task == task_id)
            .map(|(_, sequence)| *sequence)
            .max()
    }

    /// Whether a cancel of the task was heard from elsewhere.
    pub fn heard_cancel_of(&self, task_id: TaskId) -> bool {
        self.lock().cancels_requested.contains(&task_id)
    }
}

impl StoreListener for RecordingListener {
    fn committed(&self, events: &[Event]) {
        self.lock().committed.push(events.to_vec());
    }

    fn transaction_measured(&self, stats: CommitStats) {
        self.lock().transactions.push(stats);
    }

    fn advanced_elsewhere(&self, task_id: TaskId, last_sequence_number: u64) {
        self.lock()
            .advanced_elsewhere
            .push((task_id, last_sequence_number));
    }

    fn cancel_requested(&self, task_id: TaskId) {
        self.lock().cancels_requested.push(task_id);
    }
}
