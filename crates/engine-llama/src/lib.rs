//! The llama.cpp engine: GGUF model files run in process (API.md §11, `--engine llama`).
//!
//! [`LlamaEngine`] loads each GGUF file once per digest (on a blocking thread, cached; a load of
//! one model holds up no generation of another) and runs every generation on a thread of its own
//! with its own llama.cpp context, the model being shared. Tokens travel to the async side over a
//! bounded channel, so a slow consumer slows the generating thread instead of buffering without
//! bound.
//!
//! **Resume (I-6).** Each delta's state holds the ids of every token generated so far and the
//! bytes of a character not yet complete (see [`state`]). Token `i` is sampled by a sampler built
//! afresh from the task's seed and `i` (top-p, temperature, then a seeded draw; greedy at
//! temperature 0), so "the sampler's position" is just the number of tokens generated, and a
//! resumed run re-evaluates the prompt and the generated tokens and then draws exactly what the
//! uninterrupted run would have drawn. The budget counts the same tokens: a resumed run never
//! generates past `max_output_tokens` in all.
//!
//! **Stopping.** The generating thread checks a stop flag between tokens and between prompt
//! batches of [`LlamaSettings::batch_size`] tokens; [`Generation::stop`] sets it, closes the
//! channel (waking a thread blocked on a full one) and waits for the thread to end. Dropping a
//! generation sets the flag too. A stop therefore waits at most one llama.cpp call: one token or
//! one prompt batch (well under 100 ms for small models on CPU; bound it for big ones with a
//! smaller batch).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use async_trait::async_trait;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use lmsp_domain::model::{Digest, ModelToLoad};
use lmsp_domain::ports::{Engine, EngineError, Generation, GenerationItem, GenerationJob};
use lmsp_domain::task::{Message, TaskSpec, Usage};
use tokio::sync::{mpsc, oneshot, OnceCell};

pub mod state;

use state::GenerationState;

/// How many items a generating thread may send ahead of its consumer.
const CHANNEL_CAPACITY: usize = 32;

/// llama.cpp's default temperature, used when a task names none.
const DEFAULT_TEMPERATURE: f32 = 0.8;

/// llama.cpp's default nucleus mass, used when a task names none.
const DEFAULT_TOP_P: f32 = 0.95;

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
    /// Prompt tokens evaluated per llama.cpp call. A stop is noticed between two such calls, so
    /// this bounds how long a stop waits during a long prompt.
    pub batch_size: NonZeroU32,
    /// Layers offloaded to a GPU (builds with the `cuda` or `metal` feature); 0 on CPU builds.
    pub gpu_layers: u32,
}

impl Default for LlamaSettings {
    fn default() -> Self {
        Self {
            threads: None,
            context_size: NonZeroU32::new(4096).unwrap_or(NonZeroU32::MIN),
            batch_size: NonZeroU32::new(64).unwrap_or(NonZeroU32::MIN),
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

/// llama.cpp's context creation mutates the model it is given (see `LlamaModel::new_context`):
/// contexts are made one at a time.
static CONTEXT_CREATION: Mutex<()> = Mutex::new(());

fn backend() -> Result<&'static LlamaBackend, LlamaError> {
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(|error| LlamaError::Backend(error.clone()))
}

/// A model loaded into memory, with its chat template when it has one.
struct LoadedModel {
    model: LlamaModel,
    template: Option<LlamaChatTemplate>,
}

/// A model being loaded or loaded: one load per digest, whoever asks for it meanwhile.
type Slot = Arc<OnceCell<Arc<LoadedModel>>>;

/// The llama.cpp engine.
pub struct LlamaEngine {
    settings: LlamaSettings,
    backend: &'static LlamaBackend,
    loaded: Mutex<HashMap<Digest, Slot>>,
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
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the model with this digest is loaded.
    pub fn is_loaded(&self, digest: &Digest) -> bool {
        self.slot(digest).initialized()
    }

    fn slot(&self, digest: &Digest) -> Slot {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(loaded.entry(digest.clone()).or_default())
    }

    async fn model(&self, model: &ModelToLoad) -> Result<Arc<LoadedModel>, EngineError> {
        let (Some(file), Some(path)) = (model.record.file(), model.path.as_deref()) else {
            return Err(EngineError::ModelUnavailable(String::from(
                "the llama engine runs GGUF model files only",
            )));
        };
        let slot = self.slot(&file.digest);
        let loaded = slot
            .get_or_try_init(|| async {
                let path = path.to_owned();
                let backend = self.backend;
                let gpu_layers = self.settings.gpu_layers;
                // Dropping this future abandons the wait; the blocking load then finishes and
                // its result is dropped (a later load starts afresh).
                tokio::task::spawn_blocking(move || load_model(backend, &path, gpu_layers))
                    .await
                    .map_err(|error| EngineError::Failed(format!("the model load broke: {error}")))?
                    .map(Arc::new)
            })
            .await?;
        Ok(Arc::clone(loaded))
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
    Ok(LoadedModel { model, template })
}

#[async_trait]
impl Engine for LlamaEngine {
    async fn load(&self, model: &ModelToLoad) -> Result<(), EngineError> {
        self.model(model).await.map(|_| ())
    }

    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError> {
        let loaded = self.model(&job.model).await?;
        let resume = match &job.resume {
            None => Resume::Fresh,
            Some(point) if point.state.is_empty() => Resume::Text(point.text_so_far.clone()),
            Some(point) => {
                Resume::State(GenerationState::decode(&point.state).map_err(|error| {
                    EngineError::Failed(format!("the resume state is unreadable: {error}"))
                })?)
            }
        };
        if let Resume::State(state) = &resume {
            if state.output_tokens() > u64::from(job.spec.max_output_tokens) {
                return Err(EngineError::Failed(String::from(
                    "the resume state is past the end of the output",
                )));
            }
        }
        let (items, receiver) = mpsc::channel(CHANNEL_CAPACITY);
        let stop = Arc::new(AtomicBool::new(false));
        let (done, stopped) = oneshot::channel::<()>();
        let run = Run {
            loaded,
            backend: self.backend,
            settings: self.settings,
            spec: Arc::clone(&job.spec),
            resume,
            stop: Arc::clone(&stop),
            items,
        };
        std::thread::Builder::new()
            .name(String::from("lmsp-llama"))
            .spawn(move || {
                // Dropped when the thread ends, however it ends: `stop` waits for that.
                let _done = done;
                run.run();
            })
            .map_err(|error| {
                EngineError::Failed(format!("cannot start a generating thread: {error}"))
            })?;
        Ok(Box::new(LlamaGeneration {
            items: receiver,
            stop,
            stopped: Some(stopped),
            finished: false,
        }))
    }
}

/// Where a generation starts.
enum Resume {
    /// From the prompt.
    Fresh,
    /// From a snapshot's state.
    State(GenerationState),
    /// From the text of a snapshot without a state (re-tokenized: the next tokens may differ
    /// from the uninterrupted run's where the tokenizer splits that text otherwise).
    Text(String),
}

/// How tokens are drawn.
#[derive(Debug, Clone, Copy)]
enum Sampling {
    Greedy,
    Random { temperature: f32, top_p: f32 },
}

impl Sampling {
    fn of(spec: &TaskSpec) -> Self {
        // Narrowing to llama.cpp's f32 is intended.
        #[allow(clippy::cast_possible_truncation)]
        let temperature = spec
            .temperature
            .map_or(DEFAULT_TEMPERATURE, |t| t.get() as f32);
        #[allow(clippy::cast_possible_truncation)]
        let top_p = spec.top_p.map_or(DEFAULT_TOP_P, |p| p.get() as f32);
        if temperature <= 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Random {
                temperature,
                top_p: top_p.min(1.0),
            }
        }
    }
}

/// The seed of the draw of output token `index`: a pure function of the task's seed and the
/// index, so a resumed run draws what the uninterrupted one drew.
fn draw_seed(seed: u64, index: u64) -> u32 {
    let mixed = splitmix64(seed ^ splitmix64(index));
    // Keep the low 32 bits: the truncation is the point.
    #[allow(clippy::cast_possible_truncation)]
    let low = mixed as u32;
    // llama.cpp reads u32::MAX (LLAMA_DEFAULT_SEED) as "pick a random seed".
    if low == u32::MAX {
        0x9E37_79B9
    } else {
        low
    }
}

fn splitmix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The prompt text of a conversation: the model's chat template when it has one (with the
/// assistant's turn opened), else `role: content` lines and an `assistant: ` line. The flag tells
/// whether the text holds the template's special tokens (to be parsed as such).
fn prompt_text(loaded: &LoadedModel, messages: &[Message]) -> (String, bool) {
    if let Some(template) = &loaded.template {
        let chat: Result<Vec<_>, _> = messages
            .iter()
            .map(|m| LlamaChatMessage::new(m.role.as_str().to_owned(), m.content.clone()))
            .collect();
        if let Ok(chat) = chat {
            match loaded.model.apply_chat_template(template, &chat, true) {
                Ok(text) => return (text, true),
                Err(error) => {
                    tracing::warn!(%error, "the model's chat template failed; using a plain prompt");
                }
            }
        }
    }
    let mut text = String::new();
    for message in messages {
        text.push_str(message.role.as_str());
        text.push_str(": ");
        text.push_str(&message.content);
        text.push('\n');
    }
    text.push_str("assistant: ");
    (text, false)
}

/// One generation's work, run on its own thread.
struct Run {
    loaded: Arc<LoadedModel>,
    backend: &'static LlamaBackend,
    settings: LlamaSettings,
    spec: Arc<TaskSpec>,
    resume: Resume,
    stop: Arc<AtomicBool>,
    items: mpsc::Sender<Result<GenerationItem, EngineError>>,
}

/// Why a run ended early.
enum Halt {
    /// Stopped, or nobody listens any more.
    Stopped,
    /// Failed.
    Failed(EngineError),
}

impl From<EngineError> for Halt {
    fn from(error: EngineError) -> Self {
        Halt::Failed(error)
    }
}

fn failed(what: &str, error: impl std::fmt::Display) -> Halt {
    Halt::Failed(EngineError::Failed(format!("{what}: {error}")))
}

impl Run {
    fn run(mut self) {
        let resume = std::mem::replace(&mut self.resume, Resume::Fresh);
        if let Err(Halt::Failed(error)) = self.generate(resume) {
            // Nobody may be listening any more: then there is no one to tell.
            let _ = self.items.blocking_send(Err(error));
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn send(&self, item: GenerationItem) -> Result<(), Halt> {
        if self.stopped() {
            return Err(Halt::Stopped);
        }
        self.items
            .blocking_send(Ok(item))
            .map_err(|_| Halt::Stopped)
    }

    fn generate(&self, resume: Resume) -> Result<(), Halt> {
        let model = &self.loaded.model;
        let vocab = model.vocab();
        let (prompt, special) = prompt_text(&self.loaded, &self.spec.conversation());
        let prompt_tokens = vocab.tokenize(prompt.as_bytes(), true, special);
        let mut state = match resume {
            Resume::Fresh => GenerationState::default(),
            Resume::State(state) => state,
            Resume::Text(text) => {
                let tokens = vocab.tokenize(text.as_bytes(), false, false);
                GenerationState::new(tokens.iter().map(|t| t.0).collect(), Vec::new())
            }
        };
        let max = usize::try_from(self.spec.max_output_tokens).unwrap_or(usize::MAX);
        if state.tokens().len() > max {
            return Err(failed(
                "the resumed output",
                "it is longer than max_output_tokens",
            ));
        }
        let input_tokens = prompt_tokens.len();
        let mut all: Vec<LlamaToken> = prompt_tokens;
        all.extend(state.tokens().iter().map(|&t| LlamaToken(t)));
        if all.is_empty() {
            return Err(failed("the prompt", "it has no tokens"));
        }

        let remaining = max - state.tokens().len();
        let wanted = all.len().saturating_add(remaining).saturating_add(1);
        let mut n_ctx = self.settings.context_size.get();
        let trained = model.n_ctx_train();
        if trained > 0 {
            n_ctx = n_ctx.min(trained);
        }
        n_ctx = n_ctx.min(u32::try_from(wanted).unwrap_or(u32::MAX)).max(16);
        let n_ctx_usize = usize::try_from(n_ctx).unwrap_or(usize::MAX);
        if all.len() >= n_ctx_usize {
            return Err(failed(
                "the prompt",
                format!(
                    "{} tokens do not fit the model's context of {n_ctx}",
                    all.len()
                ),
            ));
        }
        let batch_size = self.settings.batch_size.get().min(n_ctx);
        let threads = self.settings.threads.map_or_else(
            || {
                std::thread::available_parallelism()
                    .map_or(1, |n| i32::try_from(n.get()).unwrap_or(1))
            },
            |n| i32::try_from(n.get()).unwrap_or(1),
        );
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(batch_size)
            .with_n_ubatch(batch_size)
            .with_n_seq_max(1)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        if self.stopped() {
            return Err(Halt::Stopped);
        }
        let mut context = {
            let _creating = CONTEXT_CREATION
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            model
                .new_context(self.backend, params)
                .map_err(|error| failed("llama.cpp cannot make a context", error))?
        };

        // The prompt and any resumed tokens, a batch at a time, checking for a stop between.
        let batch_len = usize::try_from(batch_size).unwrap_or(1).max(1);
        let mut batch = LlamaBatch::new(batch_len, 1);
        let last = all.len() - 1;
        for (chunk_index, chunk) in all.chunks(batch_len).enumerate() {
            if self.stopped() {
                return Err(Halt::Stopped);
            }
            batch.clear();
            for (offset, &token) in chunk.iter().enumerate() {
                let index = chunk_index * batch_len + offset;
                batch
                    .add(token, position(index)?, &[0], index == last)
                    .map_err(|error| failed("the prompt batch", error))?;
            }
            decode(&mut context, &mut batch)?;
        }
        let mut logits_at = batch.n_tokens() - 1;
        let mut next_position = all.len();

        let sampling = Sampling::of(&self.spec);
        let mut greedy = LlamaSampler::greedy();
        loop {
            if self.stopped() {
                return Err(Halt::Stopped);
            }
            if state.tokens().len() >= max || next_position >= n_ctx_usize {
                break;
            }
            let index = u64::try_from(state.tokens().len()).unwrap_or(u64::MAX);
            let token = match sampling {
                Sampling::Greedy => greedy.sample(&context, logits_at),
                Sampling::Random { temperature, top_p } => LlamaSampler::chain_simple([
                    LlamaSampler::top_p(top_p, 1),
                    LlamaSampler::temp(temperature),
                    LlamaSampler::dist(draw_seed(self.spec.seed, index)),
                ])
                .sample(&context, logits_at),
            };
            if vocab.is_eog(token) {
                break;
            }
            let piece = vocab.token_to_piece(token, false, None);
            let text = state.push(token.0, &piece);
            if !text.is_empty() {
                self.send(GenerationItem::Delta {
                    text,
                    state: state.encode(),
                })?;
            }
            if state.tokens().len() < max && next_position < n_ctx_usize {
                batch.clear();
                batch
                    .add(token, position(next_position)?, &[0], true)
                    .map_err(|error| failed("the token batch", error))?;
                decode(&mut context, &mut batch)?;
                next_position += 1;
                logits_at = 0;
            }
        }
        let rest = state.flush();
        if !rest.is_empty() {
            self.send(GenerationItem::Delta {
                text: rest,
                state: state.encode(),
            })?;
        }
        self.send(GenerationItem::Finished {
            usage: Usage {
                input_tokens: u64::try_from(input_tokens).unwrap_or(u64::MAX),
                output_tokens: state.output_tokens(),
            },
        })
    }
}

fn position(index: usize) -> Result<i32, Halt> {
    i32::try_from(index).map_err(|error| failed("the token position", error))
}

fn decode(context: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>) -> Result<(), Halt> {
    context
        .decode(batch)
        .map_err(|error| failed("llama.cpp cannot evaluate the tokens", error))
}

/// A running llama.cpp generation.
struct LlamaGeneration {
    items: mpsc::Receiver<Result<GenerationItem, EngineError>>,
    stop: Arc<AtomicBool>,
    stopped: Option<oneshot::Receiver<()>>,
    finished: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_seeds_avoid_llamas_random_seed_and_differ_by_index() {
        let seeds: Vec<u32> = (0..1000).map(|i| draw_seed(7, i)).collect();
        assert!(seeds.iter().all(|&s| s != u32::MAX));
        let mut unique = seeds.clone();
        unique.sort_unstable();
        unique.dedup();
        assert!(unique.len() > 990);
        assert_eq!(draw_seed(7, 3), draw_seed(7, 3));
        assert_ne!(draw_seed(7, 3), draw_seed(8, 3));
    }
}
