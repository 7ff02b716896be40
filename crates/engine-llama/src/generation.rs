//! The async side of a generation: [`LlamaGeneration`] pulls what the generating thread sends
//! over a bounded channel, and stops it (a flag, then the channel closed, then a wait for the
//! thread to end).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use lmsp_domain::ports::{EngineError, Generation, GenerationItem};
use tokio::sync::{mpsc, oneshot};

/// What the async side of a generation tells its generating thread.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    /// Stop at the next check: set by [`Generation::stop`] and by a drop.
    stop: AtomicBool,
    /// The stop was [`Generation::stop`], the app's cancel: the task is over and nothing will
    /// resume it, so its checkpoints can go. A drop alone (the process stopping, a lost lease)
    /// leaves them for the resume.
    cancelled: AtomicBool,
}

impl Signals {
    /// Whether the thread should stop.
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Whether the task was cancelled (nothing will resume it).
    pub(crate) fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// A running llama.cpp generation.
pub(crate) struct LlamaGeneration {
    items: mpsc::Receiver<Result<GenerationItem, EngineError>>,
    signals: Arc<Signals>,
    stopped: Option<oneshot::Receiver<()>>,
    finished: bool,
}

impl LlamaGeneration {
    /// The async side of a generating thread that sends on `items`, checks `signals`, and
    /// drops the sender of `stopped` when it ends.
    pub(crate) fn new(
        items: mpsc::Receiver<Result<GenerationItem, EngineError>>,
        signals: Arc<Signals>,
        stopped: oneshot::Receiver<()>,
    ) -> Self {
        Self {
            items,
            signals,
            stopped: Some(stopped),
            finished: false,
        }
    }
}

impl std::fmt::Debug for LlamaGeneration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaGeneration")
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Generation for LlamaGeneration {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        if self.finished {
            return Ok(None);
        }
        // `recv` is cancel-safe: a dropped pull loses no item.
        match self.items.recv().await {
            Some(Ok(item)) => {
                if matches!(item, GenerationItem::Finished { .. }) {
                    self.finished = true;
                }
                Ok(Some(item))
            }
            Some(Err(error)) => {
                self.finished = true;
                Err(error)
            }
            None if self.signals.stopped() => {
                self.finished = true;
                Ok(None)
            }
            None => {
                self.finished = true;
                Err(EngineError::Failed(String::from(
                    "the generating thread ended without finishing",
                )))
            }
        }
    }

    async fn stop(&mut self) {
        // The cancel first, so the thread that sees the stop knows why.
        self.signals.cancelled.store(true, Ordering::Relaxed);
        self.signals.stop.store(true, Ordering::Relaxed);
        // Wakes a thread blocked on a full channel.
        self.items.close();
        if let Some(stopped) = self.stopped.take() {
            // An error only says the thread is gone, which is what is awaited.
            let _ = stopped.await;
        }
    }
}

impl Drop for LlamaGeneration {
    fn drop(&mut self) {
        self.signals.stop.store(true, Ordering::Relaxed);
    }
}
