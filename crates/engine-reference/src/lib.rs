//! The deterministic reference engine (seeded n-gram sampler).
//!
//! [`ReferenceEngine`] reads a model file's text, splits it into whitespace-separated words and
//! generates words with a trigram/bigram sampler over that corpus (the corpus is read as a
//! circle, so every word has a follower). Token `i` is picked by a PRNG value computed statelessly
//! from the seed, the prompt and `i`, so the whole output is a pure function of the model
//! digest, the input, the seed and `max_output_tokens`; the state after each delta (next token
//! index and context words) is enough to continue exactly there (I-6).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lmsp_domain::model::{Digest, ModelRecord};
use lmsp_domain::ports::{
    CancelFlag, Engine, EngineError, Generation, GenerationItem, GenerationJob,
};
use lmsp_domain::task::Usage;
use tokio::sync::Mutex;

/// How slow the reference engine pretends to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReferenceSettings {
    /// Time to load a model that is not loaded yet.
    pub load_delay: Duration,
    /// Time per generated token.
    pub token_delay: Duration,
    /// Time between noticing a cancel and reporting it.
    pub cancel_delay: Duration,
}

/// Waits `delay`; a zero delay does not wait at all (a zero-length timer still waits for the
/// next tick of tokio's millisecond timer wheel, which would cap output at ~1 000 tokens/s).
async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// The reference engine: loaded corpora are cached in memory by digest.
#[derive(Debug)]
pub struct ReferenceEngine {
    settings: ReferenceSettings,
    loaded: Mutex<HashMap<Digest, Arc<Corpus>>>,
}

impl ReferenceEngine {
    /// An engine with nothing loaded.
    pub fn new(settings: ReferenceSettings) -> Self {
        Self {
            settings,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the model with this digest is loaded.
    pub async fn is_loaded(&self, digest: &Digest) -> bool {
        self.loaded.lock().await.contains_key(digest)
    }

    async fn corpus(&self, model: &ModelRecord) -> Result<Arc<Corpus>, EngineError> {
        let mut loaded = self.loaded.lock().await;
        if let Some(corpus) = loaded.get(&model.file.digest) {
            return Ok(corpus.clone());
        }
        let text = tokio::fs::read_to_string(&model.file.path)
            .await
            .map_err(|error| {
                EngineError::ModelUnavailable(format!("{}: {error}", model.file.path))
            })?;
        pause(self.settings.load_delay).await;
        let corpus = Arc::new(Corpus::new(&text));
        loaded.insert(model.file.digest.clone(), corpus.clone());
        Ok(corpus)
    }
}

#[async_trait]
impl Engine for ReferenceEngine {
    async fn load(&self, model: &ModelRecord) -> Result<(), EngineError> {
        self.corpus(model).await.map(|_| ())
    }

    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError> {
        let corpus = self.corpus(&job.model).await?;
        if corpus.vocabulary.is_empty() {
            return Err(EngineError::Failed(String::from(
                "the model file holds no words",
            )));
        }
        let prompt = job.spec.input.prompt_text();
        let base = splitmix64(job.spec.seed) ^ fnv1a64(prompt.as_bytes());
        let max = u64::from(job.spec.max_output_tokens);
        let (next, context) = match &job.resume {
            Some(resume) => {
                let (next, context) = decode_state(&resume.state, &corpus)?;
                if next > max {
                    return Err(EngineError::Failed(String::from(
                        "the resume state is past the end of the output",
                    )));
                }
                (next, context)
            }
            None => (0, corpus.start_context(&prompt, base)),
        };
        Ok(Box::new(ReferenceGeneration {
            corpus,
            base,
            next,
            context,
            max,
            input_tokens: prompt.split_whitespace().count() as u64,
            settings: self.settings,
            cancel: job.cancel,
            done: false,
        }))
    }
}

/// The corpus as word ids with its follower tables.
#[derive(Debug)]
struct Corpus {
    vocabulary: Vec<String>,
    ids: HashMap<String, u32>,
    bigrams: HashMap<u32, Vec<u32>>,
    trigrams: HashMap<(u32, u32), Vec<u32>>,
}

impl Corpus {
    fn new(text: &str) -> Self {
        let mut vocabulary = Vec::new();
        let mut ids = HashMap::new();
        let mut words = Vec::new();
        for word in text.split_whitespace() {
            let next_id = u32::try_from(vocabulary.len()).unwrap_or(u32::MAX);
            let id = *ids.entry(word.to_owned()).or_insert_with(|| {
                vocabulary.push(word.to_owned());
                next_id
            });
            words.push(id);
        }
        let mut bigrams: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut trigrams: HashMap<(u32, u32), Vec<u32>> = HashMap::new();
        let n = words.len();
        for i in 0..n {
            let a = words[i];
            let b = words[(i + 1) % n];
            let c = words[(i + 2) % n];
            bigrams.entry(a).or_default().push(b);
            trigrams.entry((a, b)).or_default().push(c);
        }
        Self {
            vocabulary,
            ids,
            bigrams,
            trigrams,
        }
    }

    /// The last two prompt words when the corpus has them in a row, else the last one when the
    /// corpus has it, else a word picked by the PRNG.
    fn start_context(&self, prompt: &str, base: u64) -> Vec<u32> {
        let words: Vec<&str> = prompt.split_whitespace().collect();
        let last_ids: Vec<Option<u32>> = words
            .iter()
            .rev()
            .take(2)
            .rev()
            .map(|w| self.ids.get(*w).copied())
            .collect();
        if let [Some(a), Some(b)] = last_ids[..] {
            if self.trigrams.contains_key(&(a, b)) {
                return vec![a, b];
            }
        }
        if let Some(Some(last)) = last_ids.last() {
            return vec![*last];
        }
        let pick = splitmix64(base ^ 0xA076_1D64_78BD_642F) % self.vocabulary.len() as u64;
        vec![u32::try_from(pick).unwrap_or(0)]
    }

    fn followers(&self, context: &[u32]) -> Option<&Vec<u32>> {
        match context {
            [.., a, b] => self.trigrams.get(&(*a, *b)).or_else(|| self.bigrams.get(b)),
            [b] => self.bigrams.get(b),
            [] => None,
        }
    }

    fn word(&self, id: u32) -> &str {
        self.vocabulary
            .get(id as usize)
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// A running reference generation.
#[derive(Debug)]
struct ReferenceGeneration {
    corpus: Arc<Corpus>,
    base: u64,
    next: u64,
    context: Vec<u32>,
    max: u64,
    input_tokens: u64,
    settings: ReferenceSettings,
    cancel: CancelFlag,
    done: bool,
}

impl ReferenceGeneration {
    async fn cancelled(&mut self) -> Option<GenerationItem> {
        pause(self.settings.cancel_delay).await;
        self.done = true;
        Some(GenerationItem::Cancelled)
    }
}

#[async_trait]
impl Generation for ReferenceGeneration {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        if self.done {
            return Ok(None);
        }
        if self.cancel.is_raised() {
            return Ok(self.cancelled().await);
        }
        if self.next >= self.max {
            self.done = true;
            return Ok(Some(GenerationItem::Finished {
                usage: Usage {
                    input_tokens: self.input_tokens,
                    output_tokens: self.max,
                },
            }));
        }
        pause(self.settings.token_delay).await;
        if self.cancel.is_raised() {
            return Ok(self.cancelled().await);
        }
        let value = splitmix64(self.base ^ self.next.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let word = match self.corpus.followers(&self.context) {
            Some(followers) if !followers.is_empty() => {
                followers[(value % followers.len() as u64) as usize]
            }
            _ => u32::try_from(value % self.corpus.vocabulary.len() as u64).unwrap_or(0),
        };
        self.context.push(word);
        if self.context.len() > 2 {
            self.context.remove(0);
        }
        self.next += 1;
        let text = format!("{} ", self.corpus.word(word));
        Ok(Some(GenerationItem::Delta {
            text,
            state: encode_state(self.next, &self.context, &self.corpus),
        }))
    }
}

const STATE_VERSION: u8 = 1;

/// `[version 1][next token index: u64 LE][word count: u8]` then per word `[len: u32 LE][UTF-8]`.
fn encode_state(next: u64, context: &[u32], corpus: &Corpus) -> Vec<u8> {
    let mut state = vec![STATE_VERSION];
    state.extend_from_slice(&next.to_le_bytes());
    state.push(u8::try_from(context.len()).unwrap_or(0));
    for id in context {
        let word = corpus.word(*id).as_bytes();
        state.extend_from_slice(&u32::try_from(word.len()).unwrap_or(0).to_le_bytes());
        state.extend_from_slice(word);
    }
    state
}

fn decode_state(state: &[u8], corpus: &Corpus) -> Result<(u64, Vec<u32>), EngineError> {
    let invalid = |why: &str| EngineError::Failed(format!("invalid reference engine state: {why}"));
    let mut rest = state;
    let mut take = |n: usize| -> Result<&[u8], EngineError> {
        if rest.len() < n {
            return Err(invalid("truncated"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    if take(1)? != [STATE_VERSION] {
        return Err(invalid("unknown version"));
    }
    let mut next_bytes = [0_u8; 8];
    next_bytes.copy_from_slice(take(8)?);
    let next = u64::from_le_bytes(next_bytes);
    let count = take(1)?[0];
    if !(1..=2).contains(&count) {
        return Err(invalid("context must hold one or two words"));
    }
    let mut context = Vec::new();
    for _ in 0..count {
        let mut len_bytes = [0_u8; 4];
        len_bytes.copy_from_slice(take(4)?);
        let len = u32::from_le_bytes(len_bytes) as usize;
        let word = std::str::from_utf8(take(len)?).map_err(|_| invalid("a word is not UTF-8"))?;
        let id = corpus
            .ids
            .get(word)
            .ok_or_else(|| invalid("a context word is not in the corpus"))?;
        context.push(*id);
    }
    if !rest.is_empty() {
        return Err(invalid("trailing bytes"));
    }
    Ok((next, context))
}

/// SplitMix64: a fast, well-mixed 64-bit hash of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, 64 bits.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01B3)
    })
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// With zero delays the engine never waits on the timer: a zero-length tokio sleep would
    /// still wait for the next millisecond tick and cap a task at ~1 000 tokens per second.
    #[test]
    fn a_zero_delay_is_ready_at_once_without_a_runtime() {
        let mut context = Context::from_waker(Waker::noop());
        let pause = pin!(pause(Duration::ZERO));
        assert_eq!(pause.poll(&mut context), Poll::Ready(()));
    }
}
