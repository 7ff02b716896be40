//! What every engine shares, written once: [`ModelCache`], the models an engine has loaded, by
//! digest; [`output_budget`], what a (resumed) generation may still produce; and the snapshot
//! envelope ([`ResumeState`], in [`envelope`]), the frame of every engine's resume state: the
//! output tokens produced so far, checked against the budget the same way for every engine, and
//! the engine's own bytes, under the tag of the engine that wrote them; and the [`StopWatch`]
//! (in [`stop`]), which tells an engine that makes its text in process when the text has written
//! one of the task's stop strings, so the generation ends there.
//!
//! An engine adapter keeps only what is its own: how a model file is loaded, how tokens are made
//! and what its own bytes of a resume state hold.

pub mod envelope;
pub mod stop;

pub use envelope::{EngineTag, ResumeState, StateError};
pub use stop::StopWatch;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use lmsp_domain::model::{Digest, ModelToLoad};
use lmsp_domain::ports::EngineError;
use tokio::sync::OnceCell;

/// The models an engine has loaded, each once, by the digest of its file.
///
/// Concurrent requests for one model wait for a single load; a slow load of one model holds up
/// no other model. A failed (or abandoned) load leaves the slot empty, so the next request loads
/// afresh.
#[derive(Debug)]
pub struct ModelCache<T> {
    engine: &'static str,
    loaded: Mutex<HashMap<Digest, Arc<OnceCell<Arc<T>>>>>,
}

impl<T> ModelCache<T> {
    /// An empty cache of the engine named `engine` (for its messages, e.g. "the llama engine").
    pub fn new(engine: &'static str) -> Self {
        Self {
            engine,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the model with this digest is loaded.
    pub fn is_loaded(&self, digest: &Digest) -> bool {
        self.lock()
            .get(digest)
            .is_some_and(|slot| slot.initialized())
    }

    /// The loaded model of `model`'s file, loaded by `load` (given the file's absolute path) unless it
    /// is loaded already. A model without a file is [`EngineError::ModelUnavailable`], naming
    /// what the engine runs (`runs`, e.g. "GGUF model files").
    pub async fn get_or_load<F, Fut>(
        &self,
        model: &ModelToLoad,
        runs: &str,
        load: F,
    ) -> Result<Arc<T>, EngineError>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<T, EngineError>>,
    {
        let (Some(file), Some(path)) = (model.record.file(), model.path.as_deref()) else {
            return Err(EngineError::ModelUnavailable(format!(
                "{} runs {runs} only",
                self.engine
            )));
        };
        let slot = Arc::clone(self.lock().entry(file.digest.clone()).or_default());
        let loaded = slot
            .get_or_try_init(|| async { load(path.to_owned()).await.map(Arc::new) })
            .await?;
        Ok(Arc::clone(loaded))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Arc<OnceCell<Arc<T>>>>> {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The JSON Schema keywords that constrain nothing (annotations): an engine that refuses the
/// keywords of a schema it cannot enforce (a format's, a tool's parameters) takes these anywhere.
pub const SCHEMA_ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$anchor",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    // OpenAPI's tag of a union (pydantic's discriminated unions): the branches' `const` tags
    // constrain the value already.
    "discriminator",
];

/// How many tokens a generation may still produce when `produced` of the task's
/// `max_output_tokens` are already out (0 for a fresh one). A resume state past the end of the
/// budget is not a state this task can have: an error, never a silently longer output.
pub fn output_budget(max_output_tokens: u32, produced: u64) -> Result<u64, EngineError> {
    u64::from(max_output_tokens)
        .checked_sub(produced)
        .ok_or_else(|| {
            EngineError::Failed(String::from(
                "the resume state is past the end of the output",
            ))
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_budget_is_what_is_left_and_a_state_past_it_is_an_error() {
        assert_eq!(output_budget(10, 0).unwrap(), 10);
        assert_eq!(output_budget(10, 4).unwrap(), 6);
        assert_eq!(output_budget(10, 10).unwrap(), 0);
        assert!(matches!(output_budget(10, 11), Err(EngineError::Failed(_))));
    }
}
