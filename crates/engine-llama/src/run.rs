//! One generation's work on a thread of its own: the prompt (the model's chat template), the
//! prompt and any resumed tokens evaluated a batch at a time, then one token at a time, each sent
//! to the async side with the state a resume needs (I-6); a stop is noticed between two llama.cpp
//! calls.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaChatMessage;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use lmsp_domain::ports::{EngineError, GenerationItem};
use lmsp_domain::task::{Message, TaskSpec, Usage};
use tokio::sync::{mpsc, oneshot};

use crate::generation::LlamaGeneration;
use crate::sampling::{draw_seed, Sampling};
use crate::state::GenerationState;
use crate::{LlamaSettings, LoadedModel};

/// How many items a generating thread may send ahead of its consumer.
const CHANNEL_CAPACITY: usize = 32;

/// llama.cpp's context creation mutates the model it is given (see `LlamaModel::new_context`):
/// contexts are made one at a time.
static CONTEXT_CREATION: Mutex<()> = Mutex::new(());

/// Where a generation starts.
pub(crate) enum Resume {
    /// From the prompt.
    Fresh,
    /// From a snapshot's state.
    State(GenerationState),
    /// From the text of a snapshot without a state (re-tokenized: the next tokens may differ
    /// from the uninterrupted run's where the tokenizer splits that text otherwise).
    Text(String),
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
pub(crate) struct Run {
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
    /// Starts generating `spec` from `resume` on a thread of its own; returns its async side.
    pub(crate) fn spawn(
        loaded: Arc<LoadedModel>,
        backend: &'static LlamaBackend,
        settings: LlamaSettings,
        spec: Arc<TaskSpec>,
        resume: Resume,
    ) -> Result<LlamaGeneration, EngineError> {
        let (items, receiver) = mpsc::channel(CHANNEL_CAPACITY);
        let stop = Arc::new(AtomicBool::new(false));
        let (done, stopped) = oneshot::channel::<()>();
        let run = Run {
            loaded,
            backend,
            settings,
            spec,
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
        Ok(LlamaGeneration::new(receiver, stop, stopped))
    }

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
