//! KV checkpoints on disk (`DATA_DIR/checkpoints/`): a generation's llama.cpp state saved as its
//! output grows ([`Spacing`]: the first after [`CheckpointSettings::every`] output tokens, the
//! next ones closer together as the context grows), so a resume after a crash restores it and
//! replays about as much work at any length instead of the whole output.
//!
//! A checkpoint is two files named after the run ([`RunName`], carried by every resume state) and
//! the output tokens it covers: `<run>-<k>.kv`, llama.cpp's sequence state file (the prompt and
//! the first `k` output tokens, and their KV), and `<run>-<k>.meta`, which binds it to the model
//! digest, the token counts, the file's size and a checksum of its bytes. Both are written under a
//! `.partial` name and renamed into place, the `.kv` first: a `.meta` in place means a complete
//! `.kv`. A load checks the meta, the size, the checksum and that the tokens in the file are the
//! task's own; whatever fails is logged and the next older checkpoint (or a replay from the
//! prompt) is used instead, so a corrupt, missing or foreign checkpoint never changes an output.
//!
//! The generating thread only asks llama.cpp to write the `.partial` file (the one copy of the
//! state, into the page cache); the engine's writer thread checksums it, renames it, drops the
//! run's older checkpoints (the newest two stay: the stored snapshot may lag the newest) and keeps
//! the whole directory under [`CheckpointSettings::max_bytes`], oldest first. A run has at most
//! one checkpoint with the writer ([`RunCheckpoints`]): one that falls due meanwhile waits and is
//! taken at the first token after the write. The writer does its jobs in order, so a run's
//! removal (asked by its generating thread after its last write) comes after a write in flight.
//! There is no fsync: a kill -9 leaves the page cache to the kernel, and a power loss that tears a
//! file is caught by the checksum. A directory that cannot be written, or a full disk, costs the
//! checkpoint (logged), never the task.

use std::fmt::Write as _;
use std::io::Read;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;
use lmsp_domain::model::Digest;

use crate::state::RunName;

/// Where and how often generations save their KV state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// The directory of the checkpoint files (created when missing).
    pub dir: PathBuf,
    /// Output tokens before a generation's first checkpoint; the next ones each come when the
    /// tokens evaluated since the newest cost as much as those first ones did (docs/engines.md).
    pub every: NonZeroU32,
    /// The most bytes all checkpoints together may take; the oldest go first.
    pub max_bytes: u64,
}

const META_HEADER: &str = "lmsp-kv-checkpoint 1";

/// What the writer thread is asked to do, in the order asked.
enum Job {
    /// A `.partial` state file that a run's generating thread just wrote: checksum it, name it,
    /// prune and bound, then clear `writing` (the run may take its next checkpoint).
    Seal {
        run: RunName,
        output: usize,
        tokens: usize,
        digest: Digest,
        writing: Arc<AtomicBool>,
    },
    /// The run is over: its checkpoints go. Queued by the run's generating thread after its last
    /// `Seal`, so a write still in flight is sealed first and then removed with the others.
    Forget(RunName),
    /// Tells when every job queued before it is done.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The checkpoints of an engine.
pub(crate) struct Checkpoints {
    settings: CheckpointSettings,
    jobs: Mutex<mpsc::Sender<Job>>,
    restores: AtomicU64,
    /// Due checkpoints that waited because the run's previous one was still being written.
    deferred: AtomicU64,
    /// Held by the writer thread during each job; held by a test, it keeps the writer between
    /// two jobs (a write kept in flight, the directory unchanged).
    #[cfg(test)]
    hold: Arc<Mutex<()>>,
}

impl std::fmt::Debug for Checkpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoints")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The digest of a file's bytes (not cryptographic: it catches torn and flipped bytes). Four
/// multiply-rotate lanes over 8-byte words, fast enough to check a checkpoint of tens of
/// megabytes in a fraction of the time llama.cpp takes to read it.
#[derive(Debug, Clone, Copy)]
struct Checksum {
    lanes: [u64; 4],
    length: u64,
    tail: [u8; 32],
    tail_len: usize,
}

impl Checksum {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;

    fn new() -> Self {
        Self {
            lanes: [
                0x243F_6A88_85A3_08D3,
                0x1319_8A2E_0370_7344,
                0xA409_3822_299F_31D0,
                0x082E_FA98_EC4E_6C89,
            ],
            length: 0,
            tail: [0; 32],
            tail_len: 0,
        }
    }

    fn block(&mut self, block: &[u8]) {
        for (lane, word) in self.lanes.iter_mut().zip(block.chunks_exact(8)) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word);
            *lane = (*lane ^ u64::from_le_bytes(bytes))
                .wrapping_mul(Self::K)
                .rotate_left(29);
        }
    }

    fn update(&mut self, mut bytes: &[u8]) {
        self.length = self
            .length
            .wrapping_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
        if self.tail_len > 0 {
            let take = (32 - self.tail_len).min(bytes.len());
            self.tail[self.tail_len..self.tail_len + take].copy_from_slice(&bytes[..take]);
            self.tail_len += take;
            bytes = &bytes[take..];
            if self.tail_len < 32 {
                return;
            }
            let tail = self.tail;
            self.block(&tail);
            self.tail_len = 0;
        }
        let mut blocks = bytes.chunks_exact(32);
        for block in &mut blocks {
            self.block(block);
        }
        let rest = blocks.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
        self.tail_len = rest.len();
    }

    fn finish(mut self) -> u64 {
        let mut last = [0u8; 32];
        last[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        last[31] ^= u8::try_from(self.tail_len).unwrap_or(0);
        self.block(&last);
        let mut hash = self.length.wrapping_mul(Self::K);
        for lane in self.lanes {
            hash = (hash ^ lane).wrapping_mul(Self::K).rotate_left(31);
        }
        hash ^ (hash >> 29)
    }
}

/// The checksum and size of a file, read through `buffer` (grown to 1 MiB).
fn checksum_file(path: &Path, buffer: &mut Vec<u8>) -> std::io::Result<(u64, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut sum = Checksum::new();
    buffer.resize(1 << 20, 0);
    let mut size = 0u64;
    loop {
        let read = file.read(buffer)?;
        if read == 0 {
            return Ok((sum.finish(), size));
        }
        size += u64::try_from(read).unwrap_or(u64::MAX);
        sum.update(&buffer[..read]);
    }
}

/// What a `.meta` file says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    digest: String,
    output: usize,
    tokens: usize,
    bytes: u64,
    checksum: u64,
}

impl Meta {
    fn render(&self) -> String {
        let mut text = String::from(META_HEADER);
        text.push('\n');
        // Writing to a String cannot fail.
        let _ = writeln!(text, "digest {}", self.digest);
        let _ = writeln!(text, "output {}", self.output);
        let _ = writeln!(text, "tokens {}", self.tokens);
        let _ = writeln!(text, "bytes {}", self.bytes);
        let _ = writeln!(text, "checksum {:016x}", self.checksum);
        text
    }

    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()? != META_HEADER {
            return None;
        }
        let mut field = |name: &str| -> Option<String> {
            let line = lines.next()?;
            line.strip_prefix(name)?
                .strip_prefix(' ')
                .map(str::to_owned)
        };
        let meta = Meta {
            digest: field("digest")?,
            output: field("output")?.parse().ok()?,
            tokens: field("tokens")?.parse().ok()?,
            bytes: field("bytes")?.parse().ok()?,
            checksum: u64::from_str_radix(&field("checksum")?, 16).ok()?,
        };
        Some(meta)
    }
}

fn stem(run: RunName, output: usize) -> String {
    format!("{}-{output:010}", run.hex())
}

/// The output count of a checkpoint file of `run`, from its name (`<run>-<k>.<suffix>`).
fn output_of(name: &str, run: &str, suffix: &str) -> Option<usize> {
    name.strip_prefix(run)?
        .strip_prefix('-')?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

impl Checkpoints {
    /// Checkpoints in `settings.dir`, sealed by a thread of their own. Leftover `.partial` files
    /// (a process killed while writing) are removed. A directory that cannot be made is logged:
    /// each save then fails and is logged, and resumes replay from the prompt.
    pub(crate) fn start(settings: CheckpointSettings) -> Arc<Self> {
        if let Err(error) = std::fs::create_dir_all(&settings.dir) {
            tracing::warn!(dir = %settings.dir.display(), %error,
                "the checkpoint directory cannot be made: generations run without checkpoints");
        }
        if let Ok(entries) = std::fs::read_dir(&settings.dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().ends_with(".partial") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let (sender, receiver) = mpsc::channel::<Job>();
        let mut sealer = Sealer {
            settings: settings.clone(),
            buffer: Vec::new(),
        };
        #[cfg(test)]
        let hold = Arc::new(Mutex::new(()));
        #[cfg(test)]
        let held = Arc::clone(&hold);
        let spawned = std::thread::Builder::new()
            .name(String::from("lmsp-checkpoints"))
            .spawn(move || {
                for job in receiver {
                    #[cfg(test)]
                    let _held = held.lock().unwrap_or_else(PoisonError::into_inner);
                    sealer.run(job);
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "the checkpoint thread cannot start: checkpoints are not kept");
        }
        Arc::new(Self {
            settings,
            jobs: Mutex::new(sender),
            restores: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            #[cfg(test)]
            hold,
        })
    }

    /// Holds the writer thread between two jobs until the guard is dropped (tests).
    #[cfg(test)]
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.hold.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many due checkpoints waited for the run's previous write (each was taken at the
    /// first token after that write ended, or not at all if the run ended first).
    pub(crate) fn deferred(&self) -> u64 {
        self.deferred.load(Ordering::Relaxed)
    }

    /// Waits until every write and removal asked for so far is done.
    pub(crate) async fn settled(&self) {
        let (done, settled) = tokio::sync::oneshot::channel();
        self.send(Job::Flush(done));
        // An error only says the thread is gone (it could not start): nothing is pending then.
        let _ = settled.await;
    }

    /// How many resumes restored a checkpoint.
    pub(crate) fn restores(&self) -> u64 {
        self.restores.load(Ordering::Relaxed)
    }

    /// Output tokens before a run's first checkpoint (the spacing's budget).
    pub(crate) fn every(&self) -> usize {
        usize::try_from(self.settings.every.get()).unwrap_or(usize::MAX)
    }

    fn send(&self, job: Job) {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        // The thread is gone only if it could not start (logged then).
        let _ = jobs.send(job);
    }

    /// Copies the context's sequence, which holds `tokens` (the prompt and the first `output`
    /// output tokens), into a `.partial` file and hands it to the writer thread, which clears
    /// `writing` when it is done with it; returns whether it was handed over (a failure is
    /// logged, and `writing` left to the caller).
    fn save(
        &self,
        context: &LlamaContext<'_>,
        run: RunName,
        digest: &Digest,
        output: usize,
        tokens: &[LlamaToken],
        writing: &Arc<AtomicBool>,
    ) -> bool {
        let partial = self
            .settings
            .dir
            .join(format!("{}.kv.partial", stem(run, output)));
        // llama.cpp's own serialization of the sequence, straight into the page cache: the one
        // copy of the state, and all the generating thread does (docs/engines.md).
        match context.state_seq_save_file(&partial, 0, tokens) {
            Ok(_) => {
                self.send(Job::Seal {
                    run,
                    output,
                    tokens: tokens.len(),
                    digest: digest.clone(),
                    writing: Arc::clone(writing),
                });
                true
            }
            Err(error) => {
                let _ = std::fs::remove_file(&partial);
                tracing::warn!(dir = %self.settings.dir.display(), %error, output,
                    "a KV checkpoint could not be written (a resume replays more tokens)");
                false
            }
        }
    }

    /// The run is over: its checkpoints are removed.
    pub(crate) fn forget(&self, run: RunName) {
        self.send(Job::Forget(run));
    }

    /// Restores into `context` (empty) the newest valid checkpoint of `run` that covers fewer
    /// than `output.len()` output tokens (a resume must evaluate at least the last known token to
    /// have its logits) and whose tokens are `prompt` followed by the start of `output`; returns
    /// how many output tokens it covers. `None`: nothing usable (each refusal logged), the
    /// context left empty.
    pub(crate) fn restore(
        &self,
        context: &mut LlamaContext<'_>,
        run: RunName,
        digest: &Digest,
        prompt: &[LlamaToken],
        output: &[i32],
    ) -> Option<usize> {
        let hex = run.hex();
        let mut found: Vec<usize> = std::fs::read_dir(&self.settings.dir)
            .ok()?
            .flatten()
            .filter_map(|entry| output_of(&entry.file_name().to_string_lossy(), &hex, ".meta"))
            .filter(|&k| k < output.len())
            .collect();
        found.sort_unstable_by(|a, b| b.cmp(a));
        for k in found {
            match self.try_restore(context, run, digest, prompt, &output[..k]) {
                Ok(()) => {
                    self.restores.fetch_add(1, Ordering::Relaxed);
                    return Some(k);
                }
                Err(why) => {
                    tracing::warn!(run = %hex, output = k, why,
                        "a KV checkpoint is not used (falling back to an older one or the prompt)");
                    context.clear_kv_cache();
                }
            }
        }
        None
    }

    fn try_restore(
        &self,
        context: &mut LlamaContext<'_>,
        run: RunName,
        digest: &Digest,
        prompt: &[LlamaToken],
        output: &[i32],
    ) -> Result<(), &'static str> {
        let stem = stem(run, output.len());
        let meta_path = self.settings.dir.join(format!("{stem}.meta"));
        let kv_path = self.settings.dir.join(format!("{stem}.kv"));
        let text = std::fs::read_to_string(&meta_path).map_err(|_| "its meta is unreadable")?;
        let meta = Meta::parse(&text).ok_or("its meta is malformed")?;
        if meta.digest != digest.as_str() {
            return Err("it is another model's");
        }
        let tokens = prompt.len() + output.len();
        if meta.output != output.len() || meta.tokens != tokens {
            return Err("its token counts are not the task's");
        }
        let (checksum, bytes) =
            checksum_file(&kv_path, &mut Vec::new()).map_err(|_| "its state is unreadable")?;
        if bytes != meta.bytes || checksum != meta.checksum {
            return Err("its state does not match its checksum");
        }
        let (stored, _) = context
            .state_seq_load_file(&kv_path, 0, tokens)
            .map_err(|_| "llama.cpp cannot load its state")?;
        let expected = prompt
            .iter()
            .copied()
            .chain(output.iter().map(|&t| LlamaToken(t)));
        if stored.len() != tokens || !stored.iter().copied().eq(expected) {
            return Err("its tokens are not the task's");
        }
        Ok(())
    }
}

/// When a run takes its checkpoints: by evaluation cost, so that the replay after the newest
/// one costs about the same at any length of output.
///
/// A token evaluated at position `p` (attending over `p` cells) is taken to cost `knee + p`
/// units: a fixed part (the weights) and a part that grows with the context (the attention
/// over the KV cells); `knee` is the context at which a token costs twice one at position 0.
/// The first checkpoint comes after [`CheckpointSettings::every`] output tokens; each later one
/// when the tokens evaluated since the newest cost as much as those first ones did, so the
/// checkpoints come closer together as the context grows, and a resume, which evaluates the
/// tokens after the newest checkpoint one at a time, replays about as much work after 3 000
/// tokens as after 300. Integer units: the first checkpoint falls exactly on `every`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spacing {
    knee: u128,
    budget: u128,
    spent: u128,
}

impl Spacing {
    /// The spacing of a run whose prompt has `prompt` tokens, a checkpoint after each `every`
    /// output tokens' worth of evaluation.
    pub(crate) fn new(every: usize, prompt: usize, knee: u64) -> Self {
        let every = u128::try_from(every).unwrap_or(u128::MAX);
        let prompt = u128::try_from(prompt).unwrap_or(u128::MAX);
        let knee = u128::from(knee);
        // The cost of output tokens 0..every: Σ (knee + prompt + i).
        let budget = every
            .saturating_mul(knee.saturating_add(prompt))
            .saturating_add(every.saturating_mul(every.saturating_sub(1)) / 2);
        Self {
            knee,
            budget,
            spent: 0,
        }
    }

    /// A token was evaluated at `position`.
    pub(crate) fn evaluated(&mut self, position: usize) {
        let position = u128::try_from(position).unwrap_or(u128::MAX);
        self.spent = self
            .spent
            .saturating_add(self.knee.saturating_add(position));
    }

    /// Whether the tokens evaluated since the newest checkpoint are worth one.
    pub(crate) fn due(&self) -> bool {
        self.spent >= self.budget
    }

    /// A checkpoint was taken (or its write failed: the next try waits as long).
    pub(crate) fn taken(&mut self) {
        self.spent = 0;
    }
}

/// The knee of a model's cost per token ([`Spacing`]): the context at which a token's attention
/// costs as much as the rest of its evaluation.
pub(crate) fn knee(model: &llama_cpp_2::model::LlamaModel) -> u64 {
    cost_knee(
        model.size(),
        model.n_layer(),
        model.n_embd(),
        model.n_head(),
        model.n_head_kv(),
    )
}

/// [`knee`] from the model's figures: its weights' bytes, read once per token, against the KV
/// bytes that one more cell of context adds to a token's reads (`2 · n_layer · n_embd_kv` values
/// of 2 bytes), scaled by how much dearer a byte of attention is than a byte of weights on
/// llama.cpp's CPU kernels ([`ATTENTION_COST`]).
fn cost_knee(weights: u64, layers: u32, embd: i32, heads: u32, kv_heads: u32) -> u64 {
    let embd = u64::try_from(embd).unwrap_or(0);
    let embd_kv = if heads == 0 {
        embd
    } else {
        embd.saturating_mul(u64::from(kv_heads)) / u64::from(heads)
    };
    let per_cell = 4u64
        .saturating_mul(u64::from(layers))
        .saturating_mul(embd_kv)
        .saturating_mul(ATTENTION_COST);
    if per_cell == 0 {
        return FLAT;
    }
    (weights / per_cell).clamp(1, FLAT)
}

/// A knee so far out that the cost per token is flat: a checkpoint every `every` tokens.
const FLAT: u64 = 1 << 48;

/// How much dearer a KV byte is than a weight byte in a token's evaluation on llama.cpp's CPU
/// kernels without flash attention. Measured on SmolLM2 135M Q4_1 (1 thread, CPU time per token
/// from 256 to 3 072 tokens of context): 17.1 ms + 0.0127 ms per cell, a knee of ≈ 1 350
/// cells, where its weights' bytes over its KV bytes per cell give 4 270. Where it is off (the
/// tests' tiny f32 model measures ≈ 780 against 330 from this), checkpoints come closer or
/// further apart than needed, never inexactly.
const ATTENTION_COST: u64 = 3;

/// One run's checkpoints, kept by its generating thread: when they are due, and whether the
/// writer thread still has the previous one (at most one write in flight per run: a checkpoint
/// that falls due meanwhile waits for it, and is taken at the first token after it).
pub(crate) struct RunCheckpoints {
    checkpoints: Arc<Checkpoints>,
    run: RunName,
    digest: Digest,
    writing: Arc<AtomicBool>,
    spacing: Spacing,
    waiting: bool,
}

impl std::fmt::Debug for RunCheckpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCheckpoints")
            .field("run", &self.run.hex())
            .field("spacing", &self.spacing)
            .finish_non_exhaustive()
    }
}

impl RunCheckpoints {
    pub(crate) fn new(
        checkpoints: Arc<Checkpoints>,
        run: RunName,
        digest: Digest,
        spacing: Spacing,
    ) -> Self {
        Self {
            checkpoints,
            run,
            digest,
            writing: Arc::new(AtomicBool::new(false)),
            spacing,
            waiting: false,
        }
    }

    /// A token was evaluated at `position` (a replayed or a generated one).
    pub(crate) fn evaluated(&mut self, position: usize) {
        self.spacing.evaluated(position);
    }

    /// After output token `output - 1` was evaluated (the context holds `tokens`: the prompt and
    /// `output` output tokens): takes a checkpoint if one is due and the previous is written.
    pub(crate) fn after_token(
        &mut self,
        context: &LlamaContext<'_>,
        output: usize,
        tokens: &[LlamaToken],
    ) {
        if !self.spacing.due() {
            return;
        }
        if self.writing.load(Ordering::Acquire) {
            if !self.waiting {
                self.waiting = true;
                self.checkpoints.deferred.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        self.waiting = false;
        self.writing.store(true, Ordering::Release);
        let handed = self.checkpoints.save(
            context,
            self.run,
            &self.digest,
            output,
            tokens,
            &self.writing,
        );
        if !handed {
            self.writing.store(false, Ordering::Release);
        }
        self.spacing.taken();
    }
}

/// The writer thread's side.
struct Sealer {
    settings: CheckpointSettings,
    /// The read buffer of checksums, kept from one checkpoint to the next.
    buffer: Vec<u8>,
}

impl Sealer {
    fn run(&mut self, job: Job) {
        match job {
            Job::Seal {
                run,
                output,
                tokens,
                digest,
                writing,
            } => {
                if let Err(error) = self.seal(run, output, tokens, &digest) {
                    tracing::warn!(dir = %self.settings.dir.display(), %error, output,
                        "a KV checkpoint could not be sealed (a resume replays more tokens)");
                }
                self.prune(run, output);
                self.bound();
                writing.store(false, Ordering::Release);
            }
            Job::Forget(run) => self.remove_run(run),
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }

    fn seal(
        &mut self,
        run: RunName,
        output: usize,
        tokens: usize,
        digest: &Digest,
    ) -> std::io::Result<()> {
        let stem = stem(run, output);
        let dir = &self.settings.dir;
        let partial = dir.join(format!("{stem}.kv.partial"));
        let result = (|| {
            let (checksum, bytes) = checksum_file(&partial, &mut self.buffer)?;
            let meta = Meta {
                digest: digest.as_str().to_owned(),
                output,
                tokens,
                bytes,
                checksum,
            };
            let meta_partial = dir.join(format!("{stem}.meta.partial"));
            if let Err(error) = std::fs::write(&meta_partial, meta.render()) {
                let _ = std::fs::remove_file(&meta_partial);
                return Err(error);
            }
            std::fs::rename(&partial, dir.join(format!("{stem}.kv")))?;
            std::fs::rename(&meta_partial, dir.join(format!("{stem}.meta")))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        result
    }

    /// Drops the run's checkpoints older than the newest two.
    fn prune(&self, run: RunName, newest: usize) {
        let hex = run.hex();
        let Ok(entries) = std::fs::read_dir(&self.settings.dir) else {
            return;
        };
        let mut outputs: Vec<usize> = entries
            .flatten()
            .filter_map(|entry| output_of(&entry.file_name().to_string_lossy(), &hex, ".meta"))
            .filter(|&k| k <= newest)
            .collect();
        outputs.sort_unstable_by(|a, b| b.cmp(a));
        for k in outputs.into_iter().skip(2) {
            self.remove(&stem(run, k));
        }
    }

    fn remove(&self, stem: &str) {
        // The meta first: a `.kv` without its `.meta` is never used.
        let _ = std::fs::remove_file(self.settings.dir.join(format!("{stem}.meta")));
        let _ = std::fs::remove_file(self.settings.dir.join(format!("{stem}.kv")));
    }

    fn remove_run(&self, run: RunName) {
        let prefix = format!("{}-", run.hex());
        if let Ok(entries) = std::fs::read_dir(&self.settings.dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }

    /// Removes the oldest checkpoints until all of them fit `max_bytes`.
    fn bound(&self) {
        let Ok(entries) = std::fs::read_dir(&self.settings.dir) else {
            return;
        };
        let mut stems: std::collections::HashMap<String, (u64, std::time::SystemTime)> =
            std::collections::HashMap::new();
        let mut total = 0u64;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(stem) = name
                .strip_suffix(".kv")
                .or_else(|| name.strip_suffix(".meta"))
            else {
                continue;
            };
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            total = total.saturating_add(metadata.len());
            let modified = metadata.modified().unwrap_or(std::time::UNIX_EPOCH);
            let slot = stems
                .entry(stem.to_owned())
                .or_insert((0, std::time::UNIX_EPOCH));
            slot.0 = slot.0.saturating_add(metadata.len());
            slot.1 = slot.1.max(modified);
        }
        if total <= self.settings.max_bytes {
            return;
        }
        let mut oldest: Vec<(String, u64, std::time::SystemTime)> = stems
            .into_iter()
            .map(|(stem, (bytes, modified))| (stem, bytes, modified))
            .collect();
        oldest.sort_by(|a, b| a.2.cmp(&b.2).then_with(|| a.0.cmp(&b.0)));
        for (stem, bytes, _) in oldest {
            if total <= self.settings.max_bytes {
                break;
            }
            tracing::info!(checkpoint = %stem, "a KV checkpoint is removed to stay under --checkpoint-max-bytes");
            self.remove(&stem);
            total = total.saturating_sub(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meta_round_trips_and_a_torn_one_is_refused() {
        let meta = Meta {
            digest: String::from("sha256:ab"),
            output: 256,
            tokens: 300,
            bytes: 12_345,
            checksum: 0xDEAD_BEEF,
        };
        let text = meta.render();
        assert_eq!(Meta::parse(&text), Some(meta));
        for cut in 0..text.len() - 1 {
            if let Some(parsed) = Meta::parse(&text[..cut]) {
                // Only a cut inside the last number can parse, and then it differs.
                assert_ne!(parsed.checksum, 0xDEAD_BEEF, "{cut}");
            }
        }
    }

    #[test]
    fn the_checksum_sees_every_flipped_byte_and_ignores_how_bytes_are_fed() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let whole = {
            let mut sum = Checksum::new();
            sum.update(&bytes);
            sum.finish()
        };
        let pieces = {
            let mut sum = Checksum::new();
            for piece in bytes.chunks(13) {
                sum.update(piece);
            }
            sum.finish()
        };
        assert_eq!(whole, pieces);
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            let mut sum = Checksum::new();
            sum.update(&flipped);
            assert_ne!(sum.finish(), whole, "{at}");
        }
        let mut short = Checksum::new();
        short.update(&bytes[..999]);
        assert_ne!(short.finish(), whole);
    }

    /// The output counts at which a run of `tokens` output tokens takes its checkpoints.
    fn checkpoints_of(every: usize, prompt: usize, knee: u64, tokens: usize) -> Vec<usize> {
        let mut spacing = Spacing::new(every, prompt, knee);
        let mut taken = Vec::new();
        for n in 0..tokens {
            spacing.evaluated(prompt + n);
            if spacing.due() {
                taken.push(n + 1);
                spacing.taken();
            }
        }
        taken
    }

    #[test]
    fn checkpoints_come_closer_as_the_context_grows_and_each_gap_costs_the_first_ones() {
        let (every, prompt, knee) = (256, 40, 1_400);
        let taken = checkpoints_of(every, prompt, knee, 3_000);
        assert_eq!(taken[0], every, "the first after `every` output tokens");
        let cost = |from: usize, to: usize| -> u64 {
            (from..to).map(|n| knee + (prompt + n) as u64).sum()
        };
        let budget = cost(0, every);
        let mut previous = (0, usize::MAX);
        for &at in &taken {
            let gap = at - previous.0;
            assert!(gap <= previous.1, "gaps never widen: {taken:?}");
            // Each gap costs the budget, give or take its last token.
            let spent = cost(previous.0, at);
            assert!(spent >= budget && spent - budget < knee + (prompt + at) as u64);
            previous = (at, gap);
        }
        // At 3 000 tokens a token costs (1 400 + 3 000) / (1 400 + 40) ≈ 3 times the first.
        let last_gap = taken[taken.len() - 1] - taken[taken.len() - 2];
        assert!((80..=95).contains(&last_gap), "{last_gap}: {taken:?}");
    }

    #[test]
    fn a_flat_cost_per_token_keeps_a_checkpoint_every_n_tokens() {
        let taken = checkpoints_of(16, 30, FLAT, 100);
        assert_eq!(taken, [16, 32, 48, 64, 80, 96]);
    }

    #[test]
    fn the_knee_comes_from_the_weights_against_the_kv_bytes_per_cell() {
        // SmolLM2 135M Q4_1: 98 362 432 bytes, 30 layers, 576 wide, 9 heads of which 3 for KV.
        assert_eq!(cost_knee(98_362_432, 30, 576, 9, 3), 1_423);
        // A model without layers has no growing part: its checkpoints are evenly spaced.
        assert_eq!(cost_knee(1_000, 0, 0, 0, 0), FLAT);
    }

    #[test]
    fn checkpoint_names_parse_back() {
        let run = RunName([0xAB; 16]);
        let name = format!("{}.meta", stem(run, 512));
        assert_eq!(output_of(&name, &run.hex(), ".meta"), Some(512));
        assert_eq!(output_of(&name, &run.hex(), ".kv"), None);
        assert_eq!(output_of(&name, &RunName([1; 16]).hex(), ".meta"), None);
    }
}
