//! One generation's work on a thread of its own: the prompt (the model's chat template), the
//! prompt and any resumed tokens evaluated a batch at a time, then one token at a time, each sent
//! to the async side with the state a resume needs (I-6); a stop is noticed between two llama.cpp
//! calls.

use std::cell::OnceCell;
use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaChatMessage;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::vocab::LlamaVocab;
use llama_cpp_2::LlamaStateSeqFlags;
use lmsp_domain::model::Digest;
use lmsp_domain::ports::{EngineError, GenerationItem};
use lmsp_domain::task::{Message, TaskSpec, Usage};
use tokio::sync::{mpsc, oneshot};

use crate::cache::PromptCache;
use crate::checkpoint::{knee, Checkpoints, RunCheckpoints, Spacing};
use crate::contexts::{Idle, LoadedModel, Model, Shape};
use crate::controls::{conversation, Asked};
use crate::generation::{LlamaGeneration, Signals};
use crate::sampling::{draw_seed, Probabilities, Sampling};
use crate::shape::{Piece, Shaper, Step};
use crate::state::{GenerationState, RunName};
use crate::steer::Steer;
use crate::LlamaSettings;
use lmsp_engine_kit::output_budget;

/// How many items a generating thread may send ahead of its consumer.
const CHANNEL_CAPACITY: usize = 32;

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
fn prompt_text(loaded: &Model, messages: &[Message]) -> (String, bool) {
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
    digest: Digest,
    checkpoints: Option<Arc<Checkpoints>>,
    cache: Arc<PromptCache>,
    signals: Arc<Signals>,
    /// The name of the run's checkpoints, once the generation has read or chosen it.
    name: OnceCell<RunName>,
    items: mpsc::Sender<Result<GenerationItem, EngineError>>,
}

/// What a run shares with its engine besides the model: its checkpoints and prompt cache.
pub(crate) struct Shared {
    pub(crate) digest: Digest,
    pub(crate) checkpoints: Option<Arc<Checkpoints>>,
    pub(crate) cache: Arc<PromptCache>,
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
        shared: Shared,
    ) -> Result<LlamaGeneration, EngineError> {
        let (items, receiver) = mpsc::channel(CHANNEL_CAPACITY);
        let signals = Arc::new(Signals::default());
        let (done, stopped) = oneshot::channel::<()>();
        let run = Run {
            loaded,
            backend,
            settings,
            spec,
            resume,
            digest: shared.digest,
            checkpoints: shared.checkpoints,
            cache: shared.cache,
            signals: Arc::clone(&signals),
            name: OnceCell::new(),
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
        Ok(LlamaGeneration::new(receiver, signals, stopped))
    }

    fn run(mut self) {
        let resume = std::mem::replace(&mut self.resume, Resume::Fresh);
        let outcome = self
            .loaded
            .with_dependent(|model, idle| self.generate(model, idle, resume));
        // Finished, failed or cancelled, the task is over: nothing resumes it, so its
        // checkpoints go. Stopped by a drop alone (the process stopping, a lost lease), it will
        // resume, from them.
        let over = match &outcome {
            Ok(()) | Err(Halt::Failed(_)) => true,
            Err(Halt::Stopped) => self.signals.cancelled(),
        };
        if let (true, Some(checkpoints), Some(&name)) = (over, &self.checkpoints, self.name.get()) {
            checkpoints.forget(name);
        }
        if let Err(Halt::Failed(error)) = outcome {
            // Nobody may be listening any more: then there is no one to tell.
            let _ = self.items.blocking_send(Err(error));
        }
    }

    fn stopped(&self) -> bool {
        self.signals.stopped()
    }

    fn send(&self, item: GenerationItem) -> Result<(), Halt> {
        if self.stopped() {
            return Err(Halt::Stopped);
        }
        self.items
            .blocking_send(Ok(item))
            .map_err(|_| Halt::Stopped)
    }

    fn generate<'m>(&self, loaded: &'m Model, idle: &Idle<'m>, resume: Resume) -> Result<(), Halt> {
        let model = &loaded.model;
        let vocab = model.vocab();
        let asked = Asked::of(&self.spec.controls)
            .map_err(|error| Halt::Failed(EngineError::Failed(error.to_string())))?;
        let (prompt, special) = prompt_text(
            loaded,
            &conversation(self.spec.conversation(), asked.tools_text.as_deref()),
        );
        let prompt_tokens = vocab.tokenize(prompt.as_bytes(), true, special);
        let fresh = matches!(resume, Resume::Fresh);
        let mut state = match resume {
            Resume::Fresh => GenerationState::default(),
            Resume::State(state) => state,
            Resume::Text(text) => {
                let tokens = vocab.tokenize(text.as_bytes(), false, false);
                GenerationState::new(tokens.iter().map(|t| t.0).collect(), Vec::new())
            }
        };
        // A run keeps its checkpoints under one name from its first start on.
        let run = state.run().unwrap_or_else(RunName::random);
        let _ = self.name.set(run);
        state = state.with_run(run);
        let max = usize::try_from(self.spec.max_output_tokens).unwrap_or(usize::MAX);
        // A state's budget was checked before the run started; this checks a resume from text
        // (its tokens are only known now) by the same rule.
        let remaining = output_budget(self.spec.max_output_tokens, state.output_tokens())?;
        let remaining = usize::try_from(remaining).unwrap_or(usize::MAX);
        let input_tokens = prompt_tokens.len();
        if prompt_tokens.is_empty() {
            return Err(failed("the prompt", "it has no tokens"));
        }
        let known = state.tokens().len();
        let all_len = input_tokens + known;

        let wanted = all_len.saturating_add(remaining).saturating_add(1);
        let mut n_ctx = self.settings.context_size.get();
        let trained = model.n_ctx_train();
        if trained > 0 {
            n_ctx = n_ctx.min(trained);
        }
        n_ctx = n_ctx.min(u32::try_from(wanted).unwrap_or(u32::MAX)).max(16);
        let n_ctx_usize = usize::try_from(n_ctx).unwrap_or(usize::MAX);
        if all_len >= n_ctx_usize {
            return Err(failed(
                "the prompt",
                format!("{all_len} tokens do not fit the model's context of {n_ctx}"),
            ));
        }
        let chunk = self.settings.batch_size.get().min(n_ctx);
        let threads = self.settings.threads.map_or_else(
            || {
                std::thread::available_parallelism()
                    .map_or(1, |n| i32::try_from(n.get()).unwrap_or(1))
            },
            |n| i32::try_from(n.get()).unwrap_or(1),
        );
        let shape = Shape::new(n_ctx, chunk, threads);
        if self.stopped() {
            return Err(Halt::Stopped);
        }
        let mut lease = idle
            .take(self.backend, shape)
            .map_err(|error| failed("llama.cpp cannot make a context", error))?;
        let context: &mut LlamaContext<'m> = &mut lease;

        // Exact by construction: the prompt is evaluated in chunks of `chunk` tokens starting at
        // multiples of `chunk`, and every output token alone, whatever was evaluated before or
        // restored; a resume therefore makes llama.cpp calls of the same shapes on the same
        // KV as the uninterrupted run did, and its logits are the same to the bit.
        let chunk = usize::try_from(chunk).unwrap_or(1).max(1);
        let digest = &self.digest;
        let mut batch = LlamaBatch::new(chunk, 1);
        let output: Vec<i32> = state.tokens().to_vec();
        let restored = match (&self.checkpoints, output.is_empty()) {
            (Some(checkpoints), false) => {
                checkpoints.restore(context, run, digest, &prompt_tokens, &output)
            }
            _ => None,
        };
        let mut cached_tokens = 0usize;
        let mut logits: Option<Vec<f32>> = None;
        let replay_from = if let Some(covered) = restored {
            cached_tokens = covered.min(input_tokens);
            covered
        } else {
            let mut from = 0;
            if let Some(hit) = self
                .cache
                .lookup(digest, chunk, &prompt_tokens, n_ctx_usize)
            {
                match context.state_seq_set(&hit.state, 0) {
                    Ok(()) => {
                        let reuse = u32::try_from(hit.reuse).unwrap_or(u32::MAX);
                        if context.kv_cache_seq_rm(0, Some(reuse), None).is_ok() {
                            from = hit.reuse;
                            cached_tokens = hit.reuse;
                            logits = hit.logits;
                        } else {
                            context.clear_kv_cache();
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "a cached prompt could not be restored");
                        context.clear_kv_cache();
                    }
                }
            }
            if from < input_tokens {
                let last_at =
                    self.evaluate_prompt(context, &mut batch, &prompt_tokens, from, chunk)?;
                let last = context.get_logits_ith(last_at).to_vec();
                if self.cache.enabled() {
                    match context.state_seq_get(0, LlamaStateSeqFlags::empty()) {
                        Ok(seq) => self.cache.insert(
                            digest,
                            chunk,
                            prompt_tokens.clone(),
                            seq,
                            last.clone(),
                        ),
                        Err(error) => {
                            tracing::warn!(%error, "a prompt's state could not be cached")
                        }
                    }
                }
                logits = Some(last);
            }
            0
        };
        // The run's checkpoints, spaced by what the tokens since the newest one (the restored one,
        // or the prompt) cost to evaluate.
        let mut saving = self.checkpoints.as_ref().map(|checkpoints| {
            let spacing = Spacing::new(checkpoints.every(), input_tokens, knee(model));
            RunCheckpoints::new(Arc::clone(checkpoints), run, digest.clone(), spacing)
        });
        // The output tokens after the restored point, one at a time, as they were generated.
        for (index, &token) in output.iter().enumerate().skip(replay_from) {
            if self.stopped() {
                return Err(Halt::Stopped);
            }
            self.decode_one(context, &mut batch, LlamaToken(token), input_tokens + index)?;
            if let Some(saving) = &mut saving {
                saving.evaluated(input_tokens + index);
            }
            logits = None;
        }
        let mut next_position = all_len;

        // The samplers with a memory and the shaping of the output, rebuilt from the tokens
        // generated so far exactly as the uninterrupted run built them (what they gave then was
        // sent then).
        let window = self.spec.max_output_tokens;
        let steer = Steer::new(model, asked.plan, window).map_err(|e| failed("a grammar", e))?;
        let (shaper, first) = Shaper::new(asked.mode, asked.stops);
        let mut out = Output {
            state: GenerationState::default().with_run(run),
            shaper,
            steer,
            logprobs: Vec::new(),
        };
        if let Some(name) = &first.arguments_of {
            out.steer
                .enter_arguments(name)
                .map_err(|e| failed("a grammar", e))?;
        }
        let mut ended = false;
        if fresh {
            // A resume (even with no token yet: after a named call's start) sent these already.
            self.send_step(&vocab, first, &out.state, &mut out.logprobs)?;
        } else {
            for &token in &output {
                ended |= out.advance(&vocab, LlamaToken(token), None)?.stopped;
            }
            out.logprobs.clear();
            if out.state != state {
                return Err(failed(
                    "the resume state",
                    "its tokens do not make its pending bytes",
                ));
            }
        }

        let sampling = Sampling::of(&self.spec);
        let mut all_tokens: Vec<LlamaToken> = Vec::new();
        if saving.is_some() {
            all_tokens.extend(prompt_tokens.iter().copied());
            all_tokens.extend(output.iter().map(|&t| LlamaToken(t)));
        }
        while !ended {
            if self.stopped() {
                return Err(Halt::Stopped);
            }
            if out.state.tokens().len() >= max || next_position >= n_ctx_usize {
                break;
            }
            let index = u64::try_from(out.state.tokens().len()).unwrap_or(u64::MAX);
            let wanted = asked.top_logprobs.filter(|_| !out.shaper.in_call());
            let (token, probabilities) = match &logits {
                Some(stored) => draw(
                    sampling,
                    self.spec.seed,
                    index,
                    stored,
                    &mut out.steer,
                    wanted,
                ),
                None => draw(
                    sampling,
                    self.spec.seed,
                    index,
                    context.get_logits_ith(0),
                    &mut out.steer,
                    wanted,
                ),
            };
            if vocab.is_eog(token) {
                break;
            }
            let step = out.advance(&vocab, token, probabilities)?;
            ended = step.stopped;
            self.send_step(&vocab, step, &out.state, &mut out.logprobs)?;
            if !ended && out.state.tokens().len() < max && next_position < n_ctx_usize {
                self.decode_one(context, &mut batch, token, next_position)?;
                logits = None;
                if let Some(saving) = &mut saving {
                    saving.evaluated(next_position);
                    all_tokens.push(token);
                    saving.after_token(context, out.state.tokens().len(), &all_tokens);
                }
                next_position += 1;
            }
        }
        if !ended {
            let rest = out.state.flush();
            let mut step = out.shaper.feed(&rest);
            step.pieces.extend(out.shaper.finish());
            self.send_step(&vocab, step, &out.state, &mut out.logprobs)?;
        }
        let state = out.state;
        tracing::debug!(cached_tokens, input_tokens, "a llama generation finished");
        self.send(GenerationItem::Finished {
            usage: Usage {
                input_tokens: u64::try_from(input_tokens).unwrap_or(u64::MAX),
                output_tokens: state.output_tokens(),
                cached_tokens: u64::try_from(cached_tokens).unwrap_or(u64::MAX),
            },
        })?;
        Ok(())
    }

    /// Sends what one step of the output gave, each piece with the state after it (a text
    /// piece after the log probabilities of its tokens, when asked for).
    fn send_step(
        &self,
        vocab: &LlamaVocab<'_>,
        step: Step,
        state: &GenerationState,
        logprobs: &mut Vec<Probabilities>,
    ) -> Result<(), Halt> {
        for piece in step.pieces {
            let item = match piece {
                Piece::Text(text) => {
                    if !logprobs.is_empty() {
                        let tokens = logprobs.drain(..).map(|p| p.of_vocab(vocab)).collect();
                        self.send(GenerationItem::Logprobs { tokens })?;
                    }
                    GenerationItem::Delta {
                        text,
                        state: state.encode(),
                    }
                }
                Piece::Call { name } => GenerationItem::CallStarted {
                    name,
                    state: state.encode(),
                },
                Piece::Arguments(text) => GenerationItem::ArgumentsDelta {
                    text,
                    state: state.encode(),
                },
            };
            self.send(item)?;
        }
        Ok(())
    }

    /// Evaluates `prompt[from..]` (`from` a multiple of `chunk`) in chunks that start at multiples
    /// of `chunk`, checking for a stop between; returns the batch index of the last token's
    /// logits.
    fn evaluate_prompt(
        &self,
        context: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch<'_>,
        prompt: &[LlamaToken],
        from: usize,
        chunk: usize,
    ) -> Result<i32, Halt> {
        let last = prompt.len() - 1;
        let mut start = from;
        while start < prompt.len() {
            if self.stopped() {
                return Err(Halt::Stopped);
            }
            let end = ((start / chunk + 1) * chunk).min(prompt.len());
            batch.clear();
            for (index, &token) in prompt.iter().enumerate().take(end).skip(start) {
                batch
                    .add(token, position(index)?, &[0], index == last)
                    .map_err(|error| failed("the prompt batch", error))?;
            }
            decode(context, batch)?;
            start = end;
        }
        Ok(batch.n_tokens() - 1)
    }

    /// Evaluates one token at `at`, alone (the shape every output token is evaluated with).
    fn decode_one(
        &self,
        context: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch<'_>,
        token: LlamaToken,
        at: usize,
    ) -> Result<(), Halt> {
        batch.clear();
        batch
            .add(token, position(at)?, &[0], true)
            .map_err(|error| failed("the token batch", error))?;
        decode(context, batch)
    }
}

/// A run's output as it grows: its tokens and pending bytes, its shaping, its penalties and
/// grammar, and the log probabilities of tokens whose text is not sent yet.
struct Output<'m> {
    state: GenerationState,
    shaper: Shaper,
    steer: Steer<'m>,
    logprobs: Vec<Probabilities>,
}

impl Output<'_> {
    /// Takes one generated token (drawn now, or replayed on a resume): the grammar and penalties
    /// record it, its text goes to the shaper, and a call's start switches the grammar to its
    /// arguments'.
    fn advance(
        &mut self,
        vocab: &LlamaVocab<'_>,
        token: LlamaToken,
        probabilities: Option<Probabilities>,
    ) -> Result<Step, Halt> {
        self.steer
            .accept(token)
            .map_err(|error| failed("the output", error))?;
        let piece = vocab.token_to_piece(token, false, None);
        let text = self.state.push(token.0, &piece);
        self.logprobs.extend(probabilities);
        let step = self.shaper.feed(&text);
        if let Some(name) = &step.arguments_of {
            self.steer
                .enter_arguments(name)
                .map_err(|error| failed("a grammar", error))?;
        }
        Ok(step)
    }
}

/// Draws output token `index` from `logits` as `sampling` says, after `steer`'s penalties and
/// grammar: the same as llama.cpp's `llama_sampler_sample` on a context's logits (the candidates
/// in token order), so a draw from cached logits equals one from freshly evaluated ones. With
/// `top_logprobs`, also the drawn token's log probability and the likeliest alternatives, from
/// the model's own distribution (the logits before penalties and grammar).
fn draw(
    sampling: Sampling,
    seed: u64,
    index: u64,
    logits: &[f32],
    steer: &mut Steer<'_>,
    top_logprobs: Option<u8>,
) -> (LlamaToken, Option<Probabilities>) {
    let mut candidates = LlamaTokenDataArray::from_iter(
        logits.iter().enumerate().map(|(id, &logit)| {
            LlamaTokenData::new(
                LlamaToken(i32::try_from(id).unwrap_or(i32::MAX)),
                logit,
                0.0,
            )
        }),
        false,
    );
    if steer.active() {
        steer.apply(&mut candidates);
    }
    let mut sampler = match sampling {
        Sampling::Greedy => LlamaSampler::greedy(),
        Sampling::Random { temperature, top_p } => LlamaSampler::chain_simple([
            LlamaSampler::top_p(top_p, 1),
            LlamaSampler::temp(temperature),
            LlamaSampler::dist(draw_seed(seed, index)),
        ]),
    };
    candidates.apply_sampler(&mut sampler);
    let token = candidates.selected_token().unwrap_or(LlamaToken(0));
    let probabilities = top_logprobs.map(|top| Probabilities::of(logits, token, top));
    (token, probabilities)
}

fn position(index: usize) -> Result<i32, Halt> {
    i32::try_from(index).map_err(|error| failed("the token position", error))
}

fn decode(context: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>) -> Result<(), Halt> {
    context
        .decode(batch)
        .map_err(|error| failed("llama.cpp cannot evaluate the tokens", error))
}
