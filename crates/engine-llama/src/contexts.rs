//! A loaded model and its idle llama.cpp contexts.
//!
//! Making a context costs about a millisecond even for a tiny model (llama.cpp allocates its
//! buffers and reserves its compute graphs), which is most of a cached prompt's time to first
//! token. A generation therefore takes an idle context of the same shape (context size, chunk,
//! threads) when the model has one, and parks its own when it ends. A parked context is cleared
//! before reuse, its KV memory zeroed as a new context's is: a run on it makes the same llama.cpp
//! calls on the same memory as a run on a new one, so its output is the same to the bit (I-6).
//!
//! Memory: at most [`LoadedModel::of`]'s `max_idle` contexts are parked per model, and a run
//! that finds none of its shape drops the oldest parked one before it makes its own, so a model's
//! contexts, running and parked, never outnumber the most generations run at once on it. Parked
//! contexts are held while the service is idle, per loaded model (`--llama-idle-contexts`).

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};
use llama_cpp_2::LlamaContextLoadError;

/// llama.cpp's context creation mutates the model it is given (see `LlamaModel::new_context`):
/// contexts are made one at a time.
static CONTEXT_CREATION: Mutex<()> = Mutex::new(());

/// A model file in memory, with its chat template when it has one.
pub(crate) struct Model {
    pub(crate) model: LlamaModel,
    pub(crate) template: Option<LlamaChatTemplate>,
}

/// What makes two contexts interchangeable: everything a run sets when it makes one (the other
/// parameters are the same for every run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    n_ctx: u32,
    chunk: u32,
    threads: i32,
}

/// llama.cpp sizes a context's KV in multiples of this many cells (`GGML_PAD(n_ctx, 256)` in
/// `llama_context`'s constructor, whose only earlier use of the asked size is
/// `min(n_ctx, n_batch)`, which a chunk never exceeds).
const CELLS_PADDED_TO: u32 = 256;

impl Shape {
    /// The shape of a context of at least `n_ctx` cells (`chunk` ≤ `n_ctx`): asked as llama.cpp
    /// would pad it anyway, so that runs whose sizes differ only within a padding share contexts
    /// (the context is the same either way: the same output).
    pub(crate) fn new(n_ctx: u32, chunk: u32, threads: i32) -> Self {
        Self {
            n_ctx: n_ctx
                .checked_next_multiple_of(CELLS_PADDED_TO)
                .unwrap_or(n_ctx),
            chunk,
            threads,
        }
    }

    fn params(self) -> LlamaContextParams {
        LlamaContextParams::default()
            .with_n_ctx(std::num::NonZeroU32::new(self.n_ctx))
            .with_n_batch(self.chunk)
            .with_n_ubatch(self.chunk)
            .with_n_seq_max(1)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads)
            // Flash attention off (0: LLAMA_FLASH_ATTN_TYPE_DISABLED): on CPU it splits one
            // token's attention over the threads and sums the parts in that order, so its
            // result would depend on the thread count (docs/engines.md, exactness).
            .with_flash_attention_policy(0)
    }
}

struct Parked<'m> {
    shape: Shape,
    context: LlamaContext<'m>,
}

/// The parked contexts of one model, most recently parked last.
pub(crate) struct Idle<'m> {
    /// The model every context here is of.
    model: &'m LlamaModel,
    parked: Mutex<VecDeque<Parked<'m>>>,
    max: usize,
    /// Counts the contexts taken from here (not made), with the engine's other models'.
    reused: Arc<AtomicU64>,
}

self_cell::self_cell!(
    /// A loaded model with its idle contexts (which borrow it).
    pub(crate) struct LoadedModel {
        owner: Model,
        #[not_covariant]
        dependent: Idle,
    }
);

impl LoadedModel {
    /// `model`, keeping at most `max_idle` idle contexts (0: none, every run makes its own),
    /// counting each reuse in `reused`.
    pub(crate) fn of(model: Model, max_idle: usize, reused: Arc<AtomicU64>) -> Self {
        Self::new(model, |model| Idle {
            model: &model.model,
            parked: Mutex::new(VecDeque::new()),
            max: max_idle,
            reused,
        })
    }
}

impl<'m> Idle<'m> {
    /// A context of `shape` for this model: a parked one, cleared, or a new one.
    pub(crate) fn take<'i>(
        &'i self,
        backend: &LlamaBackend,
        shape: Shape,
    ) -> Result<Lease<'i, 'm>, LlamaContextLoadError> {
        let (reused, oldest) = {
            let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
            match parked.iter().rposition(|p| p.shape == shape) {
                Some(at) => (parked.remove(at).map(|p| p.context), None),
                None => (None, parked.pop_front()),
            }
        };
        // Freed after the lock is released (freeing a context takes a while), before a new one
        // is made.
        drop(oldest);
        let context = match reused {
            Some(mut context) => {
                // The KV memory zeroed, as a new context's is.
                context.clear_kv_cache();
                self.reused.fetch_add(1, Ordering::Relaxed);
                context
            }
            None => {
                let _creating = CONTEXT_CREATION
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                self.model.new_context(backend, shape.params())?
            }
        };
        Ok(Lease {
            idle: self,
            shape,
            context: Some(context),
        })
    }

    fn park(&self, shape: Shape, context: LlamaContext<'m>) {
        if self.max == 0 {
            return;
        }
        let dropped = {
            let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
            parked.push_back(Parked { shape, context });
            (parked.len() > self.max).then(|| parked.pop_front())
        };
        drop(dropped);
    }

    /// How many contexts are parked.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> usize {
        self.parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A context a run holds; parked for the next run when the run ends, however it ends.
pub(crate) struct Lease<'i, 'm> {
    idle: &'i Idle<'m>,
    shape: Shape,
    context: Option<LlamaContext<'m>>,
}

impl<'m> Deref for Lease<'_, 'm> {
    type Target = LlamaContext<'m>;

    fn deref(&self) -> &Self::Target {
        // Present until the lease is dropped.
        self.context.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for Lease<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.context.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Lease<'_, '_> {
    fn drop(&mut self) {
        // A run that panicked frees its context: nothing it left is kept.
        if std::thread::panicking() {
            return;
        }
        if let Some(context) = self.context.take() {
            self.idle.park(self.shape, context);
        }
    }
}
