//! The live fan-out: hands committed events to the subscribers of their task.
//!
//! The store tells the app's [`crate::Listener`] after each commit, and it hands the events on
//! here, so nothing reaches a subscriber before it is durable. Events committed by another
//! instance arrive as a mere notice ([`Live::Advanced`]): the subscriber reads them from the store.
//! A subscriber that falls behind gets `Lagged` from its channel and reads the gap back too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::broadcast;

use lmsp_domain::{Event, TaskId};

/// Items a slow subscriber may fall behind before it reads the rest back from the store; small,
/// since every watched task holds one buffer of this many slots.
const CHANNEL_CAPACITY: usize = 64;

/// The map size below which abandoned channels are not swept.
const MIN_SWEEP: usize = 64;

/// What a subscriber of a task hears.
#[derive(Debug, Clone)]
pub enum Live {
    /// An event this process committed.
    Event(Arc<Event>),
    /// Another instance committed the task's events up to this sequence number.
    Advanced(u64),
}

/// Per-task broadcast channels of committed events.
#[derive(Debug, Default)]
pub struct LiveEvents {
    channels: Mutex<Channels>,
}

#[derive(Debug, Default)]
struct Channels {
    by_task: HashMap<TaskId, broadcast::Sender<Live>>,
    /// The size at which abandoned channels are next swept away.
    sweep_at: usize,
}

impl LiveEvents {
    /// Subscribes to the committed events of one task from now on.
    pub fn subscribe(&self, task_id: TaskId) -> broadcast::Receiver<Live> {
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

    /// Hands committed events to their tasks' subscribers.
    pub fn committed(&self, events: &[Event]) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let channels = &mut channels.by_task;
        if channels.is_empty() {
            return;
        }
        for event in events {
            if let Some(sender) = channels.get(&event.task_id) {
                let sent = sender.send(Live::Event(Arc::new(event.clone())));
                if sent.is_err() || event.kind().is_terminal() {
                    // Nobody listens any more, or nothing more will come: drop the channel.
                    // Receivers still drain what was sent before.
                    channels.remove(&event.task_id);
                }
            }
        }
    }

    /// Tells a task's subscribers that another instance committed its events up to `sequence`.
    pub fn advanced_elsewhere(&self, task_id: TaskId, sequence: u64) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = channels.by_task.get(&task_id) {
            let _ = sender.send(Live::Advanced(sequence));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use lmsp_domain::{EventPayload, Timestamp};

    use super::*;

    fn task(n: u64) -> TaskId {
        TaskId::from_ulid(ulid::Ulid::from_parts(n, 1))
    }

    fn event(task_id: TaskId, sequence_number: u64, payload: EventPayload) -> Event {
        Event {
            task_id,
            sequence_number,
            created_at: Timestamp::from_millis(0),
            payload,
        }
    }

    /// Channels whose subscribers all went away are forgotten by later subscriptions, so the
    /// map stays bounded by the streams actually open.
    #[test]
    fn abandoned_channels_are_swept_by_later_subscriptions() {
        let live = LiveEvents::default();
        for n in 0..1_000 {
            drop(live.subscribe(task(n)));
        }
        let _kept: Vec<_> = (1_000..1_010).map(|n| live.subscribe(task(n))).collect();
        assert!(
            live.watched_tasks() <= 2 * MIN_SWEEP,
            "{}",
            live.watched_tasks()
        );
        assert!(live.watched_tasks() >= 10, "the open subscriptions stay");
    }

    /// A subscriber hears its own task's events in order and no other task's; after the terminal
    /// event the channel is dropped, so later subscribers start afresh.
    #[tokio::test]
    async fn subscribers_hear_their_task_in_order_until_the_terminal_event() {
        let live = LiveEvents::default();
        let (mine, other) = (task(1), task(2));
        let mut receiver = live.subscribe(mine);
        live.committed(&[
            event(other, 2, EventPayload::InProgress),
            event(mine, 2, EventPayload::InProgress),
            event(mine, 3, EventPayload::Cancelled),
        ]);
        live.advanced_elsewhere(mine, 9);
        let heard: Vec<u64> = std::iter::from_fn(|| match receiver.try_recv() {
            Ok(Live::Event(event)) => Some(event.sequence_number),
            Ok(Live::Advanced(seq)) => Some(seq + 1000),
            Err(_) => None,
        })
        .collect();
        assert_eq!(heard, vec![2, 3], "the notice after the end goes nowhere");
        assert_eq!(live.watched_tasks(), 0);
    }
}
