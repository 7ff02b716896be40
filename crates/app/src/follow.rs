//! Following a task's events: what is stored, then live ones as they commit, each once, in
//! order, never before its commit; the stream ends after the terminal event. The stream is
//! driven by its consumer (no task of its own), so a dropped consumer costs nothing further.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use tokio::sync::broadcast;

use lmsp_domain::auth::Scope;
use lmsp_domain::ports::Store;
use lmsp_domain::{Event, TaskId};

use crate::caller::Caller;
use crate::error::AppError;
use crate::listener::Listener;
use crate::live::Live;
use crate::service::Service;

/// Events read from the store at a time.
const REPLAY_PAGE: usize = 500;

/// How long a follower waits after a failed read before it reads again.
const READ_RETRY: Duration = Duration::from_millis(250);

impl Service {
    /// The task's events after `after`: what is stored, then live ones as they commit; the
    /// stream ends after the terminal event (at once when `after` is at or past it).
    pub async fn follow_events(
        &self,
        caller: &Caller,
        task_id: TaskId,
        after: u64,
    ) -> Result<BoxStream<'static, Event>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        self.visible_task(caller, task_id).await?;
        let inner = &self.inner;
        let follower = Follower {
            store: Arc::clone(&inner.core.store),
            // Subscribed before the first read: an event committed in between is read or heard.
            live: inner.core.listener.live.subscribe(task_id),
            listener: Arc::clone(&inner.core.listener),
            poll: inner.core.settings.poll_fallback,
            task_id,
            last: after,
            pending: VecDeque::new(),
            replaying: true,
            ended: false,
        };
        Ok(futures::stream::unfold(follower, Follower::next).boxed())
    }
}

/// The state of one event stream: replaying stored pages, then following live events; a gap,
/// a lag or a notice from another instance sends it back to the store.
struct Follower {
    store: Arc<dyn Store>,
    live: broadcast::Receiver<Live>,
    listener: Arc<Listener>,
    /// For a shared store: how often to read the store anyway, in case a notice was lost.
    poll: Option<Duration>,
    task_id: TaskId,
    last: u64,
    pending: VecDeque<Event>,
    replaying: bool,
    ended: bool,
}

impl Follower {
    async fn next(mut self) -> Option<(Event, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.last = event.sequence_number;
                self.ended = event.kind().is_terminal();
                return Some((event, self));
            }
            if self.ended {
                return None;
            }
            if self.replaying {
                if !self.replay().await {
                    return None;
                }
                continue;
            }
            let heard = match self.poll {
                Some(every) => match tokio::time::timeout(every, self.live.recv()).await {
                    Ok(heard) => heard,
                    Err(_elapsed) => {
                        self.replaying = true;
                        continue;
                    }
                },
                None => self.live.recv().await,
            };
            match heard {
                // A terminal event at or before `last` (a stream started past the end): done.
                Ok(Live::Event(event))
                    if event.sequence_number <= self.last && event.kind().is_terminal() =>
                {
                    return None;
                }
                Ok(Live::Event(event)) if event.sequence_number <= self.last => {}
                Ok(Live::Event(event)) if event.sequence_number == self.last + 1 => {
                    self.pending.push_back((*event).clone());
                }
                Ok(Live::Advanced(sequence)) if sequence <= self.last => {}
                // A gap, a lag, or another instance's commit: read the rest from the store.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.replaying = true,
                // The fan-out dropped the channel (after a terminal event, or when it had no
                // listener for a moment): listen again, then catch up from the store.
                Err(broadcast::error::RecvError::Closed) => {
                    self.live = self.listener.live.subscribe(self.task_id);
                    self.replaying = true;
                }
            }
        }
    }

    /// Reads what the store holds after `last`; `false` when the stream is over (the task is
    /// gone, or finished with nothing more to read).
    async fn replay(&mut self) -> bool {
        loop {
            match self
                .store
                .events(self.task_id, self.last, REPLAY_PAGE)
                .await
            {
                Ok(page) if page.items.is_empty() => {
                    // Nothing stored after `last`: if the task is already finished, nothing will
                    // ever come (a reconnect at or past its terminal event), so end.
                    match self.store.task(self.task_id).await {
                        Ok(Some(task)) if !task.status.is_finished() => {
                            self.replaying = false;
                            return true;
                        }
                        // It finished since the read: read again what it wrote meanwhile.
                        Ok(Some(task)) if task.last_sequence_number > self.last => {}
                        Ok(_) => return false,
                        Err(error) if error.is_transient() => self.wait_after(&error).await,
                        Err(error) => return self.fail(&error),
                    }
                }
                Ok(page) => {
                    self.replaying = page.has_more;
                    self.pending.extend(page.items);
                    return true;
                }
                Err(error) if error.is_transient() => self.wait_after(&error).await,
                Err(error) => return self.fail(&error),
            }
        }
    }

    async fn wait_after(&self, error: &lmsp_domain::ports::StoreError) {
        tracing::debug!(task_id = %self.task_id, %error, "an event stream waits for the store");
        tokio::time::sleep(READ_RETRY).await;
    }

    fn fail(&self, error: &lmsp_domain::ports::StoreError) -> bool {
        tracing::warn!(task_id = %self.task_id, %error, "an event stream ended early");
        false
    }
}
