//! The live fan-out: hands committed events to the subscribers of their task.
//!
//! The storage adapter calls [`LiveEvents::committed`] after each commit, so nothing reaches a
//! subscriber before it is durable. A subscriber that falls behind gets `Lagged` from its channel
//! and reads the gap back from the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::broadcast;

use lmsp_domain::ports::{CommitStats, CommittedEvents};
use lmsp_domain::{Event, TaskId};

/// Events a slow subscriber may fall behind before it reads the rest back from the store; small,
/// since every watched task holds one buffer of this many slots.
const CHANNEL_CAPACITY: usize = 64;

/// The map size below which abandoned channels are not swept.
const MIN_SWEEP: usize = 64;

/// Per-task broadcast channels of committed events.
#[derive(Debug, Default)]
pub struct LiveEvents {
    channels: Mutex<Channels>,
}

#[derive(Debug, Default)]
struct Channels {
    by_task: HashMap<TaskId, broadcast::Sender<Arc<Event>>>,
    /// The size at which abandoned channels are next swept away.
    sweep_at: usize,
}

impl LiveEvents {
    /// An empty fan-out.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Subscribes to the committed events of one task from now on.
    pub fn subscribe(&self, task_id: TaskId) -> broadcast::Receiver<Arc<Event>> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget channels whose subscribers have all gone, now and then: here, off the writer's
        // path, and only when the map has doubled since the last sweep (amortised O(1)).
        if channels.by_task.len() >= channels.sweep_at {
            channels
                .by_task
                .retain(|_, sender| sender.receiver_count() > 0);
            channels.sweep_at = (channels.by_task.len() * 2).max(MIN_SWEEP);
        }
        channels
            .by_task
            .entry(task_id)
            .or_insert_with(|| broadcast::channel(CHANNEL_CAPACITY).0)
            .subscribe()
    }

    /// How many tasks have live subscribers.
    pub fn watched_tasks(&self) -> usize {
        self.channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_task
            .len()
    }
}

impl CommittedEvents for LiveEvents {
    fn committed(&self, events: &[Event]) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let channels = &mut channels.by_task;
        if channels.is_empty() {
            return;
        }
        for event in events {
            if let Some(sender) = channels.get(&event.task_id) {
                if sender.send(Arc::new(event.clone())).is_err() || event.kind().is_terminal() {
                    // Nobody listens any more, or nothing more will come: drop the channel.
                    // Receivers still drain what was sent before.
                    channels.remove(&event.task_id);
                }
            }
        }
    }
}

/// Hands every commit to several listeners in turn (the live fan-out and the metrics), so the
/// store needs only one hook.
pub struct CommitListeners(Vec<Arc<dyn CommittedEvents>>);

impl CommitListeners {
    /// Listeners, told in this order.
    pub fn new(listeners: Vec<Arc<dyn CommittedEvents>>) -> Arc<Self> {
        Arc::new(Self(listeners))
    }
}

impl std::fmt::Debug for CommitListeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CommitListeners")
            .field(&self.0.len())
            .finish()
    }
}

impl CommittedEvents for CommitListeners {
    fn committed(&self, events: &[Event]) {
        for listener in &self.0 {
            listener.committed(events);
        }
    }

    fn transaction_measured(&self, stats: CommitStats) {
        for listener in &self.0 {
            listener.transaction_measured(stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(n: u64) -> TaskId {
        TaskId::from_ulid(ulid::Ulid::from_parts(n, 1))
    }

    /// Channels whose subscribers all went away are forgotten by later subscriptions, so the
    /// map stays bounded by the streams actually open.
    #[test]
    fn abandoned_channels_are_swept_by_later_subscriptions() {
        let live = LiveEvents::default();
        for n in 0..1_000 {
            drop(live.subscribe(task(n)));
        }
        let kept: Vec<_> = (1_000..1_010).map(|n| live.subscribe(task(n))).collect();
        assert!(
            live.watched_tasks() <= 2 * MIN_SWEEP,
            "{}",
            live.watched_tasks()
        );
        assert_eq!(kept.len(), 10);
    }
}
