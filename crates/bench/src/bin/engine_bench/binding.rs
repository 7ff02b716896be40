//! The binding alone, in this process: the model loaded once, then per request a context, the
//! templated prompt and a greedy loop, as `lmsp-engine-llama` does.

use std::num::NonZeroU32;
use std::path::Path;

use anyhow::{anyhow, Context};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;

use super::stream::{Ask, Clock, Streamed};

pub struct Binding {
    backend: LlamaBackend,
    model: LlamaModel,
    threads: i32,
    context: u32,
}

impl Binding {
    pub fn load(path: &Path, threads: NonZeroU32, context: u32) -> anyhow::Result<Self> {
        let mut backend = LlamaBackend::init().map_err(|e| anyhow!("llama.cpp: {e}"))?;
        backend.void_logs();
        let model = LlamaModel::load_from_file(&backend, path, &LlamaModelParams::default())
            .map_err(|e| anyhow!("cannot load {}: {e}", path.display()))?;
        Ok(Self {
            backend,
            model,
            threads: i32::try_from(threads.get()).unwrap_or(1),
            context,
        })
    }

    pub fn stream(&self, ask: &Ask) -> anyhow::Result<Streamed> {
        let mut clock = Clock::start();
        let template = self
            .model
            .chat_template(None)
            .map_err(|e| anyhow!("no chat template: {e}"))?;
        let chat = [
            LlamaChatMessage::new("system".into(), ask.system.clone())
                .map_err(|e| anyhow!("the message: {e}"))?,
            LlamaChatMessage::new("user".into(), ask.user.clone())
                .map_err(|e| anyhow!("the message: {e}"))?,
        ];
        let prompt = self
            .model
            .apply_chat_template(&template, &chat, true)
            .map_err(|e| anyhow!("the chat template: {e}"))?;
        let vocab = self.model.vocab();
        let prompt = vocab.tokenize(prompt.as_bytes(), true, true);
        clock.prompt_tokens = Some(u64::try_from(prompt.len())?);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(self.context))
            .with_n_batch(self.context)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        let mut context = self
            .model
            .new_context(&self.backend, params)
            .context("a context")?;
        let mut batch = LlamaBatch::new(usize::try_from(self.context)?, 1);
        let last = prompt.len() - 1;
        for (index, &token) in prompt.iter().enumerate() {
            batch.add(token, i32::try_from(index)?, &[0], index == last)?;
        }
        context.decode(&mut batch).context("the prompt")?;
        let mut sampler = LlamaSampler::greedy();
        // Bytes of a character not yet complete (a character of several tokens).
        let mut pending: Vec<u8> = Vec::new();
        let mut position = prompt.len();
        let mut produced = 0;
        let mut logits_at = batch.n_tokens() - 1;
        while produced < ask.tokens {
            let token = sampler.sample(&context, logits_at);
            if vocab.is_eog(token) {
                break;
            }
            pending.extend(vocab.token_to_piece(token, false, None));
            if let Ok(text) = std::str::from_utf8(&pending) {
                clock.text(text);
                pending.clear();
            }
            produced += 1;
            batch.clear();
            batch.add(token, i32::try_from(position)?, &[0], true)?;
            context.decode(&mut batch).context("a token")?;
            position += 1;
            logits_at = 0;
        }
        clock.done(produced)
    }
}
