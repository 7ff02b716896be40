//! The prompt cache: the KV state of recently evaluated prompts, kept in memory up to a byte
//! budget, reused by a request whose prompt starts with the same tokens.
//!
//! A prompt is evaluated in chunks of the engine's chunk size that start at multiples of it (see
//! `run`), so the KV of a whole chunk depends only on the tokens up to its end. A cached prompt
//! therefore serves another prompt for every whole chunk the two share — never a partial last
//! chunk, which an uncached run of the other prompt would evaluate with another shape — and an
//! identical prompt entirely, with the logits of its last token (no evaluation at all). Either
//! way the output equals an uncached run's.

use std::sync::{Mutex, PoisonError};

use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::SeqState;
use lmsp_domain::model::Digest;

/// One cached prompt.
struct Entry {
    digest: Digest,
    chunk: usize,
    tokens: Vec<LlamaToken>,
    state: SeqState,
    logits: Vec<f32>,
    bytes: usize,
}

/// What a lookup found.
pub(crate) struct Hit {
    /// The KV state of a cached prompt (possibly longer than what is reused).
    pub(crate) state: SeqState,
    /// How many of the new prompt's tokens the state serves (the rest of its cells go).
    pub(crate) reuse: usize,
    /// The logits after the last prompt token, when the whole prompt is reused.
    pub(crate) logits: Option<Vec<f32>>,
}

/// The prompt cache of an engine (empty and unused at a budget of 0).
pub(crate) struct PromptCache {
    max_bytes: usize,
    // Most recently used last.
    entries: Mutex<Vec<Entry>>,
}

impl std::fmt::Debug for PromptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptCache")
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// How many leading tokens two sequences share.
fn shared(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    /// A cache of at most `max_bytes` of states and logits.
    pub(crate) fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            entries: Mutex::new(Vec::new()),
        }
    }

    /// Whether anything is ever cached.
    pub(crate) fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The cached prompt serving most of `prompt` (evaluated on the model `digest` in chunks of
    /// `chunk` tokens) in a context of `n_ctx` cells.
    pub(crate) fn lookup(
        &self,
        digest: &Digest,
        chunk: usize,
        prompt: &[LlamaToken],
        n_ctx: usize,
    ) -> Option<Hit> {
        if !self.enabled() || chunk == 0 {
            return None;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut best: Option<(usize, usize)> = None;
        for (index, entry) in entries.iter().enumerate() {
            if entry.digest != *digest || entry.chunk != chunk || entry.tokens.len() >= n_ctx {
                continue;
            }
            let reuse = if entry.tokens == prompt {
                prompt.len()
            } else {
                // Whole chunks only, and never all of the new prompt: its last token must be
                // evaluated for its logits.
                let common = shared(&entry.tokens, prompt).min(prompt.len().saturating_sub(1));
                common / chunk * chunk
            };
            if reuse > 0 && best.is_none_or(|(_, b)| reuse > b) {
                best = Some((index, reuse));
            }
        }
        let (index, reuse) = best?;
        let entry = entries.remove(index);
        let hit = Hit {
            state: entry.state.clone(),
            reuse,
            logits: (reuse == prompt.len()).then(|| entry.logits.clone()),
        };
        entries.push(entry);
        Some(hit)
    }

    /// Keeps the state and last logits of a whole prompt, evicting the least recently used.
    pub(crate) fn insert(
        &self,
        digest: &Digest,
        chunk: usize,
        tokens: Vec<LlamaToken>,
        state: SeqState,
        logits: Vec<f32>,
    ) {
        let bytes = state
            .byte_len()
            .saturating_add(logits.len().saturating_mul(4))
            .saturating_add(tokens.len().saturating_mul(4));
        if !self.enabled() || bytes > self.max_bytes {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|e| !(e.digest == *digest && e.chunk == chunk && e.tokens == tokens));
        let mut total: usize = entries.iter().map(|e| e.bytes).sum::<usize>() + bytes;
        while total > self.max_bytes && !entries.is_empty() {
            let evicted = entries.remove(0);
            total -= evicted.bytes;
        }
        entries.push(Entry {
            digest: digest.clone(),
            chunk,
            tokens,
            state,
            logits,
            bytes,
        });
    }
}
