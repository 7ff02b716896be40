//! The model engine port.

use std::sync::Arc;

use async_trait::async_trait;

use crate::model::ModelToLoad;
use crate::task::{TaskSpec, Usage};
use crate::tools::TokenLogprob;

/// Why an engine failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The model file is missing or unreadable, or no engine runs its format.
    #[error("the model is unavailable: {0}")]
    ModelUnavailable(String),
    /// The model file does not match its stored digest.
    #[error("the model file does not match its digest")]
    DigestMismatch,
    /// The upstream server cannot be reached, refused the work or broke off.
    #[error("the upstream is unavailable: {0}")]
    UpstreamUnavailable(String),
    /// The engine sent nothing for too long.
    #[error("the engine timed out: {0}")]
    Timeout(String),
    /// Anything else.
    #[error("the engine failed: {0}")]
    Failed(String),
}

/// One item of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationItem {
    /// Output text, and the state to resume from right after it.
    Delta {
        /// The text (whole characters: a delta never splits one).
        text: String,
        /// The engine state after this text.
        state: Vec<u8>,
    },
    /// The log probabilities of the tokens of the next [`GenerationItem::Delta`], sent right
    /// before it, only when the task asks for them (`controls.top_logprobs`).
    Logprobs {
        /// One per token of the next delta's text, in order.
        tokens: Vec<TokenLogprob>,
    },
    /// A function call starts (the text so far, if any, is the run's message). Its id is the
    /// service's (made from the task and the item's place), never the engine's.
    CallStarted {
        /// The function called (one of the task's tools).
        name: String,
        /// The engine state right after the call's start.
        state: Vec<u8>,
    },
    /// A piece of the open call's arguments (JSON text). The call ends with the next
    /// `CallStarted`, `Delta` or `Finished`.
    ArgumentsDelta {
        /// The text (whole characters).
        text: String,
        /// The engine state after this text.
        state: Vec<u8>,
    },
    /// The generation finished.
    Finished {
        /// Token counts of the whole output, in the engine's tokens (including any part before a
        /// resume).
        usage: Usage,
    },
}

/// A running generation, pulled item by item.
///
/// A cancel is the app's business: it stops pulling, calls [`Generation::stop`] and drops the
/// generation. So [`Generation::next_item`] must be cancel-safe (its future may be dropped at any
/// await point without losing or corrupting anything), and dropping a generation must stop
/// whatever work it has under way.
#[async_trait]
pub trait Generation: Send {
    /// The next item; after `Finished` there is none.
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError>;

    /// Stops the generation and returns once the engine has stopped working on it. A stop is a
    /// cancel: nothing will resume the task, so the engine may discard what it kept to resume
    /// it (checkpoints). A generation only dropped may be resumed.
    async fn stop(&mut self);
}

/// A request an engine cannot carry out as asked (a schema keyword it cannot enforce, …): a 400
/// naming `param`, and nothing created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unsupported {
    /// The field at fault, e.g. `text.format.schema.pattern`.
    pub param: String,
    /// Human text.
    pub message: String,
}

/// What a generation is asked to do.
#[derive(Debug, Clone)]
pub struct GenerationJob {
    /// The model (loaded with [`Engine::load`]).
    pub model: ModelToLoad,
    /// The task's conversation, budget and sampling.
    pub spec: Arc<TaskSpec>,
    /// When resuming: the state of the snapshot and the text produced before it. The engine's
    /// state must hold whatever else it needs to continue exactly (e.g. where it is in a call's
    /// arguments).
    pub resume: Option<ResumePoint>,
}

/// Where a resumed generation continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The snapshot's engine state.
    pub state: Vec<u8>,
    /// The text produced up to the snapshot.
    pub text_so_far: String,
}

/// Whether an engine can take work now, as the service object shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineHealth {
    /// It can run work.
    Ok,
    /// It cannot now (its upstream does not answer, …); why, in words fit for any client (no
    /// address, no path).
    Unavailable(String),
}

/// A model engine.
#[async_trait]
pub trait Engine: Send + Sync {
    /// Whether the engine can take work now. Cheap and bounded in time (an engine that asks
    /// another server caches the answer): the service asks it whenever its service object is
    /// read. An engine in this process is always able, the default.
    async fn health(&self) -> EngineHealth {
        EngineHealth::Ok
    }

    /// Whether the engine can carry out what `spec` asks (its tools, format and sampling
    /// controls), checked before the task is created. Cheap and pure; the default takes
    /// everything.
    fn check(&self, spec: &TaskSpec) -> Result<(), Unsupported> {
        let _ = spec;
        Ok(())
    }

    /// Loads a model (a no-op when it is loaded already). The app checks the file against its
    /// digest before; dropping the future abandons the load.
    async fn load(&self, model: &ModelToLoad) -> Result<(), EngineError>;
    /// Starts generating; resumes from `job.resume` when given.
    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError>;
}
