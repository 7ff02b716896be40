//! The llama.cpp engine: GGUF model files run in process (`--engine llama`; docs/engines.md).
//!
//! [`LlamaEngine`] loads each GGUF file once per digest (on a blocking thread, cached; a load of
//! one model holds up no generation of another) and runs every generation on a thread of its own
//! with its own llama.cpp context, the model being shared. Tokens travel to the async side over a
//! bounded channel, so a slow consumer slows the generating thread instead of buffering without
//! bound.
//!
//! **Exact resume (I-6).** Each delta's state holds the ids of every token generated so far, the
//! bytes of a character not yet complete and the run's checkpoint name (see [`state`]). Token `i`
//! is sampled by a sampler built afresh from the task's seed and `i` (top-p, temperature, then a
//! seeded draw; greedy at temperature 0), so "the sampler's position" is just the number of
//! tokens generated. llama.cpp's logits depend on the shape of each evaluation call, so
//! evaluation follows a fixed schedule that a resume repeats: the prompt in chunks of
//! [`LlamaSettings::batch_size`] tokens starting at its multiples, every output token alone, one
//! context per task (new, or an idle one of the same shape cleared: `contexts`), flash attention
//! off (its CPU kernel sums over threads). A resume restores the newest valid KV checkpoint
//! (`checkpoint`, with [`LlamaEngine::with_checkpoints`]) and evaluates only the tokens after
//! it, or, without one, the prompt and every token on the same schedule; either way it then
//! draws exactly what the uninterrupted run drew. A prompt cache
//! (`cache`, [`LlamaEngine::with_prompt_cache`]) reuses whole chunks of recent prompts with the
//! same result. The budget counts the same tokens: a resumed run never generates past
//! `max_output_tokens` in all.
//!
//! **Tools, structured output, sampling controls** (docs/llama-tools.md). A JSON format or a
//! forced call constrains the output while it is sampled, by a grammar that llama.cpp makes from
//! the schema; schema keywords that grammar cannot enforce are refused before a task is created
//! ([`check_schema`], [`check_controls`], through [`Engine::check`]). The grammar's and the
//! penalties' state, the held-back text of a possible stop string and where a call is are all
//! rebuilt on a resume from the output tokens, so a run killed inside a constrained JSON or a
//! call's arguments continues exactly.
//!
//! The crate's rooms: this file (settings, the backend, loading and caching models, the
//! [`Engine`] port), `run` (one generation's thread and its schedule), `sampling` (how a token is
//! drawn, and its log probabilities), `controls` (what a task's tools, format and controls ask of
//! a run), `schema` (which JSON schemas a grammar enforces), `steer` (penalties and grammars),
//! `shape` (what the tokens become: text, a call's start, its arguments), `contexts` (a loaded
//! model and its idle contexts), `checkpoint` (KV checkpoints on disk), `cache` (the prompt
//! cache), `generation` (the async side of a generation) and [`state`] (what a resume needs).
//!
//! **Stopping.** The generating thread checks a stop flag between tokens and between prompt
//! chunks of [`LlamaSettings::batch_size`] tokens; [`Generation::stop`] sets it, closes the
//! channel (waking a thread blocked on a full one) and waits for the thread to end. Dropping a
//! generation sets the flag too. A stop is the app's cancel, so it also ends the task's
//! checkpoints; a drop alone (the task will resume) keeps them. A stop therefore waits at most one
//! llama.cpp call: one token or
//! one prompt chunk (well under 100 ms for small models on CPU; bound it for big ones with a
//! smaller batch).

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use lmsp_domain::model::{Digest, ModelToLoad};
use lmsp_domain::ports::{Engine, EngineError, Generation, GenerationJob, Unsupported};
use lmsp_domain::task::TaskSpec;
use lmsp_engine_kit::ModelCache;

mod cache;
mod checkpoint;
mod contexts;
mod controls;
mod generation;
mod run;
mod sampling;
mod schema;
mod shape;
pub mod state;
mod steer;
#[cfg(test)]
mod tests;

pub use checkpoint::CheckpointSettings;
pub use controls::check_controls;
pub use schema::{check_schema, SchemaError};

use cache::PromptCache;
use checkpoint::Checkpoints;
use contexts::{LoadedModel, Model};
use run::{Resume, Run, Shared};
use state::GenerationState;

/// How the llama.cpp engine runs its models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaSettings {
    /// CPU threads per generation (for prompt evaluation and for each token); `None`: all the
    /// machine's cores.
    pub threads: Option<NonZeroU32>,
    /// The most tokens (prompt and output) one generation's context holds; a context is made no
    /// larger than its task needs, nor larger than the model was trained for. A prompt that does
    /// not fit fails the task; an output that reaches the end of the context ends there
    /// (`Finished`, with fewer tokens than `max_output_tokens`).
    pub context_size: NonZeroU32,
    /// The prompt chunk: prompt tokens evaluated per llama.cpp call, in chunks that start at its
    /// multiples (outputs depend on it: it is part of the evaluation's fixed schedule; the prompt
    /// cache reuses whole chunks). A stop is noticed between two calls, so this also bounds how
    /// long a stop waits during a long prompt.
    pub batch_size: NonZeroU32,
    /// Layers offloaded to a GPU (builds with the `cuda` or `metal` feature); 0 on CPU builds.
    pub gpu_layers: u32,
}

impl Default for LlamaSettings {
    fn default() -> Self {
        Self {
            threads: None,
            context_size: NonZeroU32::new(4096).unwrap_or(NonZeroU32::MIN),
            batch_size: NonZeroU32::new(32).unwrap_or(NonZeroU32::MIN),
            gpu_layers: if cfg!(any(feature = "cuda", feature = "metal")) {
                u32::MAX
            } else {
                0
            },
        }
    }
}

/// Why the llama.cpp engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    /// llama.cpp's backend failed to initialise.
    #[error("llama.cpp's backend cannot start: {0}")]
    Backend(String),
}

/// The process's llama.cpp backend: llama.cpp allows one initialisation per process.
static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();

fn backend() -> Result<&'static LlamaBackend, LlamaError> {
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(|error| LlamaError::Backend(error.clone()))
}

/// The llama.cpp engine.
pub struct LlamaEngine {
    settings: LlamaSettings,
    backend: &'static LlamaBackend,
    loaded: ModelCache<LoadedModel>,
    checkpoints: Option<Arc<Checkpoints>>,
    cache: Arc<PromptCache>,
    idle_contexts: usize,
    contexts_reused: Arc<AtomicU64>,
}

impl std::fmt::Debug for LlamaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaEngine")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl LlamaEngine {
    /// An engine with nothing loaded; starts llama.cpp's backend on first use in the process.
    pub fn new(settings: LlamaSettings) -> Result<Self, LlamaError> {
        Ok(Self {
            settings,
            backend: backend()?,
            loaded: ModelCache::new("the llama engine"),
            checkpoints: None,
            cache: Arc::new(PromptCache::new(0)),
            idle_contexts: 1,
            contexts_reused: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The same engine, keeping up to `count` idle llama.cpp contexts per model for the next
    /// generations of the same shape (a context costs about a millisecond to make; 0: every
    /// generation makes its own). The default is 1. Takes effect for models loaded afterwards.
    #[must_use]
    pub fn with_idle_contexts(mut self, count: usize) -> Self {
        self.idle_contexts = count;
        self
    }

    /// The same engine, saving each generation's KV state as [`CheckpointSettings`] say, so a
    /// resume in this data directory replays only the tokens after the newest checkpoint.
    #[must_use]
    pub fn with_checkpoints(mut self, settings: CheckpointSettings) -> Self {
        self.checkpoints = Some(Checkpoints::start(settings));
        self
    }

    /// The same engine, keeping the KV state of recently evaluated prompts in memory, up to
    /// `max_bytes`, for requests that start with the same tokens (0: no cache).
    #[must_use]
    pub fn with_prompt_cache(mut self, max_bytes: u64) -> Self {
        self.cache = Arc::new(PromptCache::new(max_bytes));
        self
    }

    /// How many generations ran on an idle context another one left (the others made their own).
    pub fn contexts_reused(&self) -> u64 {
        self.contexts_reused.load(Ordering::Relaxed)
    }

    /// How many resumes restored a KV checkpoint (the others replayed from the prompt).
    pub fn checkpoint_restores(&self) -> u64 {
        self.checkpoints.as_ref().map_or(0, |c| c.restores())
    }

    /// How many due checkpoints waited because their run's previous checkpoint was still being
    /// written (at most one write per run is in flight; the waiting one is taken at the first
    /// token after it).
    pub fn checkpoints_deferred(&self) -> u64 {
        self.checkpoints.as_ref().map_or(0, |c| c.deferred())
    }

    /// Waits until the checkpoint writer has done every write and removal asked of it so far:
    /// the checkpoints of the generations that ran are then in place, or gone for the runs that
    /// ended.
    pub async fn checkpoints_settled(&self) {
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.settled().await;
        }
    }

    /// Whether the model with this digest is loaded.
    pub fn is_loaded(&self, digest: &Digest) -> bool {
        self.loaded.is_loaded(digest)
    }

    async fn model(&self, model: &ModelToLoad) -> Result<Arc<LoadedModel>, EngineError> {
        let backend = self.backend;
        let gpu_layers = self.settings.gpu_layers;
        let idle = self.idle_contexts;
        let reused = Arc::clone(&self.contexts_reused);
        self.loaded
            .get_or_load(model, "GGUF model files", |path| {
                // Dropping this future abandons the wait; the blocking load then finishes and
                // its result is dropped (a later load starts afresh).
                async move {
                    tokio::task::spawn_blocking(move || {
                        load_model(backend, &path, gpu_layers, idle, reused)
                    })
                    .await
                    .map_err(|error| {
                        EngineError::Failed(format!("the model load broke: {error}"))
                    })?
                }
            })
            .await
    }
}

/// A model file's name without its directory.
fn shown_name(path: &str) -> String {
    Path::new(path).file_name().map_or_else(
        || String::from("the model file"),
        |name| name.to_string_lossy().into_owned(),
    )
}

fn load_model(
    backend: &LlamaBackend,
    path: &str,
    gpu_layers: u32,
    idle_contexts: usize,
    reused: Arc<AtomicU64>,
) -> Result<LoadedModel, EngineError> {
    // Clients read the message: it names the file, not where the server keeps it.
    let name = shown_name(path);
    if !Path::new(path).is_file() {
        return Err(EngineError::ModelUnavailable(format!(
            "{name}: no such file"
        )));
    }
    let params = LlamaModelParams::default().with_n_gpu_layers(gpu_layers);
    let model = LlamaModel::load_from_file(backend, path, &params).map_err(|error| {
        EngineError::ModelUnavailable(format!("{name}: llama.cpp cannot load it ({error})"))
    })?;
    let template = model.chat_template(None).ok();
    Ok(LoadedModel::of(
        Model { model, template },
        idle_contexts,
        reused,
    ))
}

#[async_trait]
impl Engine for LlamaEngine {
    /// Refuses a format or tool parameters with a schema keyword the grammar cannot enforce.
    fn check(&self, spec: &TaskSpec) -> Result<(), Unsupported> {
        check_controls(&spec.controls)
    }

    async fn load(&self, model: &ModelToLoad) -> Result<(), EngineError> {
        self.model(model).await.map(|_| ())
    }

    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError> {
        let loaded = self.model(&job.model).await?;
        let resume = match &job.resume {
            None => Resume::Fresh,
            Some(point) if point.state.is_empty() => Resume::Text(point.text_so_far.clone()),
            Some(point) => {
                let envelope = GenerationState::read(&point.state)?;
                envelope.remaining(job.spec.max_output_tokens)?;
                Resume::State(GenerationState::from_envelope(&envelope)?)
            }
        };
        let digest = job
            .model
            .record
            .file()
            .map(|file| file.digest.clone())
            .ok_or_else(|| {
                EngineError::ModelUnavailable(String::from(
                    "the llama engine runs GGUF model files only",
                ))
            })?;
        let generation = Run::spawn(
            loaded,
            self.backend,
            self.settings,
            Arc::clone(&job.spec),
            resume,
            Shared {
                digest,
                checkpoints: self.checkpoints.clone(),
                cache: Arc::clone(&self.cache),
            },
        )?;
        Ok(Box::new(generation))
    }
}
