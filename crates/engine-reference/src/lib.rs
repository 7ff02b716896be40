//! The deterministic reference engine (seeded n-gram sampler).
//!
//! [`ReferenceEngine`] reads a model file's text, splits it into whitespace-separated words and
//! generates words with a trigram/bigram sampler over that corpus (the corpus is read as a
//! circle, so every word has a follower). Token `i` is picked by a PRNG value computed statelessly
//! from the seed, the prompt and `i`, so the whole output is a pure function of the model
//! digest, the input, the seed and `max_output_tokens`; the state after each delta (next token
//! index and context words, in the snapshot envelope of `lmsp-engine-kit`) is enough to continue
//! exactly there (I-6).
//!
//! Tools and structured outputs are answered by a script ([`structured`]): a call of the chosen
//! tool with the smallest valid arguments, or the smallest valid instance of the format's schema,
//! in pieces; its state is the number of pieces written. A schema the engine cannot answer with
//! a valid instance is refused before the task is created ([`Engine::check`]). With `top_logprobs` asked for, each
//! delta comes after its token's log probability: the share of the chosen word among the
//! context's followers, with the most frequent followers as the alternatives (a scripted piece
//! is certain: 0).
//!
//! A run ends at the token whose text completes one of the task's stop strings (a
//! [`StopWatch`] over the text, rebuilt on a resume from the text so far): its usage counts the
//! tokens up to and including that one. The app cuts the text before the stop string.

pub mod structured;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lmsp_domain::model::{Digest, ModelToLoad};
use lmsp_domain::ports::{
    Engine, EngineError, Generation, GenerationItem, GenerationJob, Unsupported,
};
use lmsp_domain::task::{Fraction, TaskSpec, Usage};
use lmsp_domain::{Logprob, TokenLogprob, TopLogprob};

use crate::structured::Script;
use lmsp_engine_kit::envelope::Reader;
use lmsp_engine_kit::{EngineTag, ModelCache, ResumeState, StateError, StopWatch};

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

/// The reference engine: loaded corpora are cached in memory by digest. A slow load of one
/// model holds up no other model's generations.
#[derive(Debug)]
pub struct ReferenceEngine {
    settings: ReferenceSettings,
    loaded: ModelCache<Corpus>,
}

impl ReferenceEngine {
    /// An engine with nothing loaded.
    pub fn new(settings: ReferenceSettings) -> Self {
        Self {
            settings,
            loaded: ModelCache::new("the reference engine"),
        }
    }

    /// Whether the model with this digest is loaded.
    pub fn is_loaded(&self, digest: &Digest) -> bool {
        self.loaded.is_loaded(digest)
    }

    async fn corpus(&self, model: &ModelToLoad) -> Result<Arc<Corpus>, EngineError> {
        self.loaded
            .get_or_load(model, "text files", |path| async move {
                let text = tokio::fs::read_to_string(&path).await.map_err(|error| {
                    // Clients read the message: the file's name, not where it is kept.
                    let name = std::path::Path::new(&path)
                        .file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                    EngineError::ModelUnavailable(format!("{name}: {error}"))
                })?;
                pause(self.settings.load_delay).await;
                Ok(Corpus::new(&text))
            })
            .await
    }
}

#[async_trait]
impl Engine for ReferenceEngine {
    /// Refuses a format or tool parameters whose schema the engine cannot answer with a valid
    /// instance (a keyword it does not build for, or constraints nothing meets).
    fn check(&self, spec: &TaskSpec) -> Result<(), Unsupported> {
        structured::check_controls(&spec.controls)
    }

    async fn load(&self, model: &ModelToLoad) -> Result<(), EngineError> {
        self.corpus(model).await.map(|_| ())
    }

    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError> {
        let corpus = self.corpus(&job.model).await?;
        if corpus.vocabulary.is_empty() {
            return Err(EngineError::Failed(String::from(
                "the model file holds no words",
            )));
        }
        let prompt = job.spec.prompt_text();
        let base = splitmix64(job.spec.seed) ^ fnv1a64(prompt.as_bytes());
        let max = u64::from(job.spec.max_output_tokens);
        let input_tokens = prompt.split_whitespace().count() as u64;
        let top_logprobs = job.spec.controls.top_logprobs;
        let text_so_far = job.resume.as_ref().map_or("", |resume| &resume.text_so_far);
        let watch = StopWatch::resumed(&job.spec.controls, text_so_far);
        let resumed = match &job.resume {
            Some(resume) => {
                let state = read_state(&resume.state)?;
                state.remaining(job.spec.max_output_tokens)?;
                Some(state)
            }
            None => None,
        };
        let script =
            Script::of(&job.spec).map_err(|refused| EngineError::Failed(refused.message))?;
        if let Some(script) = script {
            let next = match &resumed {
                Some(state) => script_position(state)?,
                None => 0,
            };
            return Ok(Box::new(ScriptedGeneration::new(
                script,
                next,
                max,
                input_tokens,
                self.settings,
                top_logprobs,
                watch,
            )));
        }
        let (next, context) = match &resumed {
            Some(state) => (state.produced, text_context(state, &corpus)?),
            None => (0, corpus.start_context(&prompt, base)),
        };
        Ok(Box::new(ReferenceGeneration {
            corpus,
            base,
            next,
            context,
            max,
            input_tokens,
            settings: self.settings,
            sampling: Sampling::of(job.spec.temperature, job.spec.top_p),
            done: false,
            due: None,
            top_logprobs,
            queued: None,
            watch,
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

/// How the next word is picked among the followers of the context.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sampling {
    /// By frequency: a follower seen twice is twice as likely (temperature 1, no top-p).
    Frequency,
    /// The most frequent follower (temperature 0).
    Greedy,
    /// Frequencies raised to `1 / temperature`, the least likely cut off past `top_p` of the mass.
    Shaped { temperature: f64, top_p: f64 },
}

impl Sampling {
    fn of(temperature: Option<Fraction>, top_p: Option<Fraction>) -> Self {
        let temperature = temperature.map_or(1.0, Fraction::get);
        let top_p = top_p.map_or(1.0, Fraction::get);
        if temperature == 0.0 {
            Sampling::Greedy
        } else if temperature == 1.0 && top_p >= 1.0 {
            Sampling::Frequency
        } else {
            Sampling::Shaped { temperature, top_p }
        }
    }

    /// Picks a follower with the PRNG `value`.
    fn pick(self, followers: &[u32], value: u64) -> u32 {
        if let Sampling::Frequency = self {
            return followers[(value % followers.len() as u64) as usize];
        }
        // Each distinct follower with its count, most frequent first (ties by id: stable).
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for follower in followers {
            match counts.iter_mut().find(|(id, _)| id == follower) {
                Some((_, count)) => *count += 1,
                None => counts.push((*follower, 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let Sampling::Shaped { temperature, top_p } = self else {
            return counts[0].0;
        };
        let weights: Vec<f64> = counts
            .iter()
            .map(|(_, count)| f64::from(*count).powf(1.0 / temperature))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut kept = 0;
        let mut mass = 0.0;
        for weight in &weights {
            kept += 1;
            mass += weight / total;
            if mass >= top_p {
                break;
            }
        }
        let kept_total: f64 = weights[..kept].iter().sum();
        // A uniform number in [0, 1) from the top 53 bits of the PRNG value.
        let mut target = (value >> 11) as f64 / (1u64 << 53) as f64 * kept_total;
        for (index, weight) in weights[..kept].iter().enumerate() {
            if target < *weight {
                return counts[index].0;
            }
            target -= weight;
        }
        counts[kept - 1].0
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
    sampling: Sampling,
    done: bool,
    /// When the word being waited for is due: set by the first pull that waits for it, so a
    /// pull dropped in the middle of the wait (a cancel's select) does not start it over.
    due: Option<tokio::time::Instant>,
    /// How many alternatives of each token's log probability, when asked for.
    top_logprobs: Option<u8>,
    /// The delta whose log probabilities were just sent.
    queued: Option<GenerationItem>,
    /// The stop strings: the run ends after the word that completes one.
    watch: StopWatch,
}

/// Waits until the next word is due, `delay` after the pull that first asked for it.
/// Cancel-safe: nothing changes before the word is due, and a pull dropped meanwhile leaves the
/// due time as it was.
async fn wait_for_token(due: &mut Option<tokio::time::Instant>, delay: std::time::Duration) {
    if delay.is_zero() {
        return;
    }
    let at = *due.get_or_insert_with(|| tokio::time::Instant::now() + delay);
    tokio::time::sleep_until(at).await;
    *due = None;
}

#[async_trait]
impl Generation for ReferenceGeneration {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        if let Some(queued) = self.queued.take() {
            return Ok(Some(queued));
        }
        if self.done {
            return Ok(None);
        }
        if self.next >= self.max || self.watch.is_met() {
            self.done = true;
            return Ok(Some(GenerationItem::Finished {
                usage: Usage {
                    input_tokens: self.input_tokens,
                    output_tokens: self.next,
                    cached_tokens: 0,
                },
            }));
        }
        wait_for_token(&mut self.due, self.settings.token_delay).await;
        let value = splitmix64(self.base ^ self.next.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let followers = self
            .corpus
            .followers(&self.context)
            .filter(|followers| !followers.is_empty())
            .cloned();
        let word = match &followers {
            Some(followers) => self.sampling.pick(followers, value),
            None => u32::try_from(value % self.corpus.vocabulary.len() as u64).unwrap_or(0),
        };
        self.context.push(word);
        if self.context.len() > 2 {
            self.context.remove(0);
        }
        self.next += 1;
        let text = format!("{} ", self.corpus.word(word));
        self.watch.feed(&text);
        let delta = GenerationItem::Delta {
            text: text.clone(),
            state: encode_text_state(self.next, &self.context, &self.corpus),
        };
        match self.top_logprobs {
            None => Ok(Some(delta)),
            Some(top) => {
                self.queued = Some(delta);
                let tokens = vec![word_logprob(
                    &self.corpus,
                    followers.as_deref(),
                    word,
                    &text,
                    top,
                )];
                Ok(Some(GenerationItem::Logprobs { tokens }))
            }
        }
    }

    /// Takes `--reference-cancel-delay` to stop, like a real model finishing its current step.
    async fn stop(&mut self) {
        pause(self.settings.cancel_delay).await;
        self.done = true;
    }
}

/// The log probability of `word` among `followers` (its share of them; uniform over the
/// vocabulary without followers), with the `top` most frequent followers as alternatives.
fn word_logprob(
    corpus: &Corpus,
    followers: Option<&[u32]>,
    word: u32,
    text: &str,
    top: u8,
) -> TokenLogprob {
    let share = |id: u32| match followers {
        Some(followers) => {
            followers.iter().filter(|f| **f == id).count() as f64 / followers.len() as f64
        }
        None => 1.0 / corpus.vocabulary.len().max(1) as f64,
    };
    let mut counted: Vec<u32> = followers.map(<[u32]>::to_vec).unwrap_or_default();
    counted.sort_unstable();
    counted.dedup();
    counted.sort_by(|a, b| share(*b).total_cmp(&share(*a)).then(a.cmp(b)));
    let alternatives = counted
        .into_iter()
        .take(usize::from(top))
        .map(|id| {
            let token = format!("{} ", corpus.word(id));
            TopLogprob {
                bytes: token.as_bytes().to_vec(),
                token,
                logprob: Logprob::clamped(share(id).ln()),
            }
        })
        .collect();
    TokenLogprob {
        token: text.to_owned(),
        bytes: text.as_bytes().to_vec(),
        logprob: Logprob::clamped(share(word).ln()),
        top: alternatives,
    }
}

/// A scripted run: a call or a JSON text, piece by piece.
#[derive(Debug)]
struct ScriptedGeneration {
    /// The call's function, when the script is a call (its first item).
    call: Option<String>,
    pieces: Vec<String>,
    /// Items written: the call's start counts as one.
    next: u64,
    /// How many items the run writes (the script, cut at the budget).
    total: u64,
    input_tokens: u64,
    settings: ReferenceSettings,
    top_logprobs: Option<u8>,
    queued: Option<GenerationItem>,
    due: Option<tokio::time::Instant>,
    done: bool,
    /// The stop strings over the JSON text (a call's arguments are not text): the run ends after
    /// the piece that completes one.
    watch: StopWatch,
}

impl ScriptedGeneration {
    fn new(
        script: Script,
        next: u64,
        max: u64,
        input_tokens: u64,
        settings: ReferenceSettings,
        top_logprobs: Option<u8>,
        watch: StopWatch,
    ) -> Self {
        let pieces = script.pieces();
        let call = match script {
            Script::Call { name, .. } => Some(name),
            Script::Json(_) => None,
        };
        let total = (pieces.len() as u64 + u64::from(call.is_some())).min(max);
        Self {
            call,
            pieces,
            next,
            total,
            input_tokens,
            settings,
            top_logprobs,
            queued: None,
            due: None,
            done: false,
            watch,
        }
    }
}

#[async_trait]
impl Generation for ScriptedGeneration {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        if let Some(queued) = self.queued.take() {
            return Ok(Some(queued));
        }
        if self.done {
            return Ok(None);
        }
        if self.next >= self.total || self.watch.is_met() {
            self.done = true;
            return Ok(Some(GenerationItem::Finished {
                usage: Usage {
                    input_tokens: self.input_tokens,
                    output_tokens: self.next.min(self.total),
                    cached_tokens: 0,
                },
            }));
        }
        wait_for_token(&mut self.due, self.settings.token_delay).await;
        let index = self.next;
        self.next += 1;
        let state = encode_script_state(self.next);
        if let Some(name) = &self.call {
            if index == 0 {
                return Ok(Some(GenerationItem::CallStarted {
                    name: name.clone(),
                    state,
                }));
            }
            let piece = usize::try_from(index - 1).unwrap_or(usize::MAX);
            let text = self.pieces.get(piece).cloned().unwrap_or_default();
            return Ok(Some(GenerationItem::ArgumentsDelta { text, state }));
        }
        let piece = usize::try_from(index).unwrap_or(usize::MAX);
        let text = self.pieces.get(piece).cloned().unwrap_or_default();
        self.watch.feed(&text);
        let delta = GenerationItem::Delta {
            text: text.clone(),
            state,
        };
        match self.top_logprobs {
            None => Ok(Some(delta)),
            Some(top) => {
                self.queued = Some(delta);
                let certain = |text: &str| (text.to_owned(), text.as_bytes().to_vec());
                let (token, bytes) = certain(&text);
                let tokens = vec![TokenLogprob {
                    token: token.clone(),
                    bytes: bytes.clone(),
                    logprob: Logprob::clamped(0.0),
                    top: (top > 0)
                        .then(|| TopLogprob {
                            token,
                            bytes,
                            logprob: Logprob::clamped(0.0),
                        })
                        .into_iter()
                        .collect(),
                }];
                Ok(Some(GenerationItem::Logprobs { tokens }))
            }
        }
    }

    async fn stop(&mut self) {
        pause(self.settings.cancel_delay).await;
        self.done = true;
    }
}

/// The tag of this engine's states in the snapshot envelope.
const STATE_TAG: EngineTag = EngineTag::new("reference");

/// The first of this engine's own bytes in a state: which kind of run wrote it. A text run's
/// are followed by its context, `[word count: u8]` then per word `[len: u32 LE][UTF-8]`; a
/// scripted run's by nothing (its position is the items written, the envelope's count).
const TEXT_RUN: u8 = 0;
const SCRIPT_RUN: u8 = 1;

/// The state of a scripted run after `next` items.
fn encode_script_state(next: u64) -> Vec<u8> {
    ResumeState::new(next, vec![SCRIPT_RUN]).encode(STATE_TAG)
}

/// The state of a text run after `next` words, with its context.
fn encode_text_state(next: u64, context: &[u32], corpus: &Corpus) -> Vec<u8> {
    let mut own = vec![TEXT_RUN, u8::try_from(context.len()).unwrap_or(0)];
    for id in context {
        let word = corpus.word(*id).as_bytes();
        own.extend_from_slice(&u32::try_from(word.len()).unwrap_or(0).to_le_bytes());
        own.extend_from_slice(word);
    }
    ResumeState::new(next, own).encode(STATE_TAG)
}

/// A snapshot's state: the envelope, or a state of the formats the first releases wrote.
fn read_state(bytes: &[u8]) -> Result<ResumeState, StateError> {
    ResumeState::decode_or_legacy(bytes, STATE_TAG, read_legacy_state)
}

/// The states written before the envelope, as the envelope's: a text run's
/// `[1][next word index: u64 LE]` followed by its context (as above), and a scripted run's
/// `[2][items written: u64 LE]`.
fn read_legacy_state(bytes: &[u8]) -> Result<ResumeState, StateError> {
    let (kind, rest) = match bytes {
        [1, rest @ ..] => (TEXT_RUN, rest),
        [2, rest @ ..] => (SCRIPT_RUN, rest),
        _ => return Err(StateError::Unrecognized { engine: STATE_TAG }),
    };
    let mut reader = Reader::new(rest);
    let produced = u64::from_le_bytes(reader.array::<8>()?);
    let mut own = vec![kind];
    if kind == TEXT_RUN {
        own.extend_from_slice(reader.rest());
    } else {
        reader.finish()?;
    }
    Ok(ResumeState::new(produced, own))
}

/// The position of a scripted run in its state.
fn script_position(state: &ResumeState) -> Result<u64, StateError> {
    match state.engine.as_slice() {
        [SCRIPT_RUN] => Ok(state.produced),
        [SCRIPT_RUN, rest @ ..] => Err(StateError::TrailingBytes(rest.len())),
        _ => Err(StateError::Malformed("not a scripted run's")),
    }
}

/// The context words of a text run in its state, as ids of `corpus`.
fn text_context(state: &ResumeState, corpus: &Corpus) -> Result<Vec<u32>, StateError> {
    let mut reader = Reader::new(&state.engine);
    if reader.array::<1>()? != [TEXT_RUN] {
        return Err(StateError::Malformed("not a text run's"));
    }
    let [count] = reader.array::<1>()?;
    if !(1..=2).contains(&count) {
        return Err(StateError::Malformed(
            "its context must hold one or two words",
        ));
    }
    let mut context = Vec::new();
    for _ in 0..count {
        let len = u32::from_le_bytes(reader.array::<4>()?);
        let len = usize::try_from(len).map_err(|_| StateError::Truncated)?;
        let word = std::str::from_utf8(reader.bytes(len)?)
            .map_err(|_| StateError::Malformed("a context word is not UTF-8"))?;
        let id = corpus
            .ids
            .get(word)
            .ok_or(StateError::Malformed("a context word is not in the corpus"))?;
        context.push(*id);
    }
    reader.finish()?;
    Ok(context)
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

    #[test]
    fn greedy_sampling_takes_the_most_frequent_follower_and_shaping_keeps_top_p() {
        let followers = [7, 3, 7, 9, 7, 3];
        for value in [0, 1, 2, u64::MAX] {
            assert_eq!(Sampling::Greedy.pick(&followers, value), 7);
        }
        let narrow = Sampling::Shaped {
            temperature: 1.0,
            top_p: 0.4,
        };
        for value in [0, 12_345, u64::MAX / 3, u64::MAX] {
            assert_eq!(
                narrow.pick(&followers, value),
                7,
                "top_p keeps the most likely only"
            );
        }
        let wide = Sampling::Shaped {
            temperature: 2.0,
            top_p: 1.0,
        };
        let picked: std::collections::BTreeSet<u32> = (0..64u64)
            .map(|n| wide.pick(&followers, splitmix64(n)))
            .collect();
        assert_eq!(picked.into_iter().collect::<Vec<_>>(), vec![3, 7, 9]);
        assert_eq!(Sampling::of(None, None), Sampling::Frequency);
        assert_eq!(Sampling::of(Fraction::new(0.0), None), Sampling::Greedy);
    }

    /// A text run's state of the first releases, `[1][next: u64 LE][word count][len, word]…`.
    const LEGACY_TEXT_STATE: &[u8] = &[
        1, 3, 0, 0, 0, 0, 0, 0, 0, 2, 3, 0, 0, 0, b'o', b'n', b'e', 3, 0, 0, 0, b't', b'w', b'o',
    ];

    #[test]
    fn text_states_of_the_first_releases_still_resume() {
        let corpus = Corpus::new("one two three");
        let state = read_state(LEGACY_TEXT_STATE).unwrap();
        assert_eq!(state.produced, 3);
        assert_eq!(text_context(&state, &corpus).unwrap(), vec![0, 1]);
        // The same position in the envelope, as this release writes it.
        let enveloped = encode_text_state(3, &[0, 1], &corpus);
        assert_eq!(&enveloped[..4], b"LMSP");
        assert_eq!(read_state(&enveloped).unwrap(), state);
    }

    #[test]
    fn scripted_states_of_the_first_releases_still_resume() {
        let state = read_state(&[2, 5, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(script_position(&state).unwrap(), 5);
        assert_eq!(read_state(&encode_script_state(5)).unwrap(), state);
        assert_eq!(
            read_state(&[2, 5, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(StateError::TrailingBytes(1))
        );
        assert_eq!(read_state(&[2, 5, 0]), Err(StateError::Truncated));
    }

    #[test]
    fn a_state_of_the_other_kind_of_run_or_engine_is_refused() {
        let corpus = Corpus::new("one two three");
        let text = read_state(&encode_text_state(3, &[0, 1], &corpus)).unwrap();
        let script = read_state(&encode_script_state(3)).unwrap();
        assert!(script_position(&text).is_err());
        assert!(text_context(&script, &corpus).is_err());
        assert!(text_context(&text, &Corpus::new("four five")).is_err());
        let llama = ResumeState::new(3, vec![SCRIPT_RUN]).encode(EngineTag::new("llama"));
        assert!(matches!(
            read_state(&llama),
            Err(StateError::Foreign { found, .. }) if found == "llama"
        ));
        assert_eq!(
            read_state(b"LLS2"),
            Err(StateError::Unrecognized { engine: STATE_TAG })
        );
    }

    /// With zero delays the engine never waits on the timer: a zero-length tokio sleep would
    /// still wait for the next millisecond tick and cap a task at ~1 000 tokens per second.
    #[test]
    fn a_zero_delay_is_ready_at_once_without_a_runtime() {
        let mut context = Context::from_waker(Waker::noop());
        let pause = pin!(pause(Duration::ZERO));
        assert_eq!(pause.poll(&mut context), Poll::Ready(()));
    }
}
