//! The async side of a generation: [`LlamaGeneration`] pulls what the generating thread sends
//! over a bounded channel, and stops it (a flag, then the channel closed, then a wait for the
//! thread to end).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use lmsp_domain::ports::{EngineError, Generation, GenerationItem};
use tokio::sync::{mpsc, oneshot};

/// A running llama.cpp generation.
pub(crate) struct LlamaGeneration {
    items: mpsc::Receiver<Result<GenerationItem, EngineError>>,
    stop: Arc<AtomicBool>,
    stopped: Option<oneshot::Receiver<()>>,
    finished: bool,
}

impl LlamaGeneration {
    /// The async side of a generating thread that sends on `items`, checks `stop`, and drops
    /// the sender of `stopped` when it ends.
    pub(crate) fn new(
        items: mpsc::Receiver<Result<GenerationItem, EngineError>>,
        stop: Arc<AtomicBool>,
        stopped: oneshot::Receiver<()>,
    ) -> Self {
        Self {
            items,
            stop,
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
            None if self.stop.load(Ordering::Relaxed) => {
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
        self.stop.store(true, Ordering::Relaxed);
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
        self.stop.store(true, Ordering::Relaxed);
    }
}
