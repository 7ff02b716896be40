//! The checkpoint writer on the tests' tiny model (`tests/tiny`), with its thread held where a
//! test needs a write in flight: a cancelled run with a write in flight leaves no file, a
//! checkpoint sealed by the writer restores and resumes exactly, and a checkpoint that falls due
//! while the run's previous one is still being written waits for it instead of queueing a copy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The writer's hold is a std mutex guard kept across awaits on purpose: only the writer thread
// (an OS thread, not a task of this runtime) ever waits for it, so nothing here can deadlock.
#![allow(clippy::await_holding_lock)]

#[path = "../tests/tiny/mod.rs"]
mod tiny;

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmsp_domain::model::{
    Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad,
};
use lmsp_domain::ports::{Engine, Generation, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::task::{Fraction, Input, TaskSpec};
use lmsp_domain::time::Timestamp;

use crate::{CheckpointSettings, LlamaEngine, LlamaSettings};

fn tiny_model(dir: &Path) -> ModelToLoad {
    let path = dir.join("tiny.gguf");
    tiny::write(&path, None);
    ModelToLoad {
        record: ModelRecord {
            id: ModelId::parse("tiny").unwrap(),
            source: ModelSource::File {
                format: ModelFormat::Gguf,
                file: FileFingerprint {
                    path: String::from("tiny.gguf"),
                    size_bytes: 0,
                    modified_millis: 0,
                    digest: Digest::from_sha256([1; 32]),
                },
            },
            created_at: Timestamp::from_millis(0),
        },
        path: Some(path.to_string_lossy().into_owned()),
    }
}

fn checkpointing(dir: &Path, every: u32) -> LlamaEngine {
    LlamaEngine::new(LlamaSettings {
        threads: NonZeroU32::new(1),
        ..LlamaSettings::default()
    })
    .unwrap()
    .with_checkpoints(CheckpointSettings {
        dir: dir.to_owned(),
        every: NonZeroU32::new(every).unwrap(),
        max_bytes: 1 << 30,
    })
}

/// A sampled run (its text is not the greedy cycle, so a wrong resume shows).
fn job(model: &ModelToLoad, max: u32, resume: Option<ResumePoint>) -> GenerationJob {
    GenerationJob {
        model: model.clone(),
        spec: Arc::new(TaskSpec {
            input: Input::Text("hi".into()),
            instructions: None,
            max_output_tokens: max,
            seed: 99,
            temperature: Fraction::new(1.0),
            top_p: None,
            previous_response_id: None,
            controls: Default::default(),
        }),
        resume,
    }
}

type Deltas = Vec<(String, Vec<u8>)>;

async fn next_delta(generation: &mut Box<dyn Generation>) -> (String, Vec<u8>) {
    loop {
        match generation.next_item().await.unwrap() {
            Some(GenerationItem::Delta { text, state }) => return (text, state),
            Some(GenerationItem::Finished { .. }) | None => panic!("the generation ended early"),
            Some(_) => {}
        }
    }
}

async fn deltas(generation: &mut Box<dyn Generation>, count: usize) -> Deltas {
    let mut deltas = Vec::new();
    while deltas.len() < count {
        deltas.push(next_delta(generation).await);
    }
    deltas
}

/// The deltas up to the end of the run, once its thread has ended (it removes the finished run's
/// checkpoints after sending the end: `stop` waits for it).
async fn rest(mut generation: Box<dyn Generation>) -> Deltas {
    let mut deltas = Vec::new();
    loop {
        match generation.next_item().await.unwrap() {
            Some(GenerationItem::Delta { text, state }) => deltas.push((text, state)),
            Some(GenerationItem::Finished { .. }) => {
                generation.stop().await;
                return deltas;
            }
            Some(_) => {}
            None => panic!("the generation ended without finishing"),
        }
    }
}

fn text(deltas: &[(String, Vec<u8>)]) -> String {
    deltas.iter().map(|(text, _)| text.as_str()).collect()
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix) && !p.ends_with("tiny.gguf"))
        .collect();
    files.sort();
    files
}

/// The output counts of the checkpoints in place (their `.meta` files).
fn sealed(dir: &Path) -> Vec<usize> {
    files(dir, ".meta")
        .iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            name.rsplit('-').next().unwrap().parse().unwrap()
        })
        .collect()
}

/// Resumes after the last of `so_far` and checks the whole text equals `whole`.
async fn assert_resumes_exactly(
    engine: &LlamaEngine,
    model: &ModelToLoad,
    max: u32,
    so_far: &Deltas,
    whole: &str,
) {
    let point = ResumePoint {
        state: so_far.last().unwrap().1.clone(),
        text_so_far: text(so_far),
    };
    let resumed = rest(engine.generate(job(model, max, Some(point))).await.unwrap()).await;
    assert_eq!(format!("{}{}", text(so_far), text(&resumed)), whole);
}

/// A run cancelled while the writer still has its checkpoint (handed over, not yet sealed)
/// leaves nothing behind: the removal is queued after the write and done once it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_with_a_write_in_flight_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let model = tiny_model(dir.path());
    let engine = checkpointing(&checkpoints, 8);
    let held = engine.checkpoints.as_ref().unwrap().hold();
    let mut generation = engine.generate(job(&model, 200, None)).await.unwrap();
    deltas(&mut generation, 20).await;
    assert_eq!(
        files(&checkpoints, ".kv.partial").len(),
        1,
        "the first checkpoint is copied and waits for the held writer"
    );
    assert!(sealed(&checkpoints).is_empty());
    generation.stop().await;
    drop(held);
    engine.checkpoints_settled().await;
    let left: Vec<_> = std::fs::read_dir(&checkpoints).unwrap().flatten().collect();
    assert!(left.is_empty(), "a cancelled run leaves no file: {left:?}");
}

/// A checkpoint that the writer thread sealed is restored by the resume of an interrupted
/// (dropped) run, which continues exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_sealed_by_the_writer_restores_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let model = tiny_model(dir.path());
    let engine = checkpointing(&checkpoints, 8);
    let max = 60;
    let whole = text(&rest(engine.generate(job(&model, max, None)).await.unwrap()).await);
    engine.checkpoints_settled().await;
    assert!(
        files(&checkpoints, "").is_empty(),
        "a finished run leaves no file"
    );

    // The writer held while the run goes: its first checkpoint (8 tokens in) is copied and
    // waits, and no later one is taken meanwhile, however far the run gets ahead of this reader
    // before the drop reaches it (a run that got 30 tokens ahead had sealed two checkpoints past
    // the resume point, and the older ones were dropped). Released, the writer seals it.
    let held = engine.checkpoints.as_ref().unwrap().hold();
    let mut generation = engine.generate(job(&model, max, None)).await.unwrap();
    let so_far = deltas(&mut generation, 30).await;
    drop(generation);
    drop(held);
    engine.checkpoints_settled().await;
    assert!(
        !sealed(&checkpoints).is_empty(),
        "an interrupted run keeps its checkpoints"
    );
    let restores = engine.checkpoint_restores();
    assert_resumes_exactly(&engine, &model, max, &so_far, &whole).await;
    assert_eq!(engine.checkpoint_restores(), restores + 1);
}

/// While the writer still has a run's checkpoint, the next one that falls due is not copied
/// (no second `.partial`, nothing queued): it waits, and is taken at the first token after the
/// write ends, past the point where it fell due; the run then resumes exactly from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_due_while_the_writer_is_busy_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let model = tiny_model(dir.path());
    let engine = checkpointing(&checkpoints, 8);
    let max = 400;
    let whole = text(&rest(engine.generate(job(&model, max, None)).await.unwrap()).await);
    engine.checkpoints_settled().await;

    let held = engine.checkpoints.as_ref().unwrap().hold();
    let deferred = engine.checkpoints_deferred();
    let mut generation = engine.generate(job(&model, max, None)).await.unwrap();
    let mut so_far = deltas(&mut generation, 30).await;
    // 30 deltas are at least 30 tokens: the checkpoint after 8 was copied, the ones due after
    // that waited.
    let partial = files(&checkpoints, ".kv.partial");
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert!(
        partial[0]
            .to_string_lossy()
            .ends_with("-0000000008.kv.partial"),
        "{partial:?}"
    );
    assert_eq!(engine.checkpoints_deferred(), deferred + 1);
    drop(held);

    // Once the writer is done with it, the waiting checkpoint is taken at the next token.
    let mut later = Vec::new();
    while later.is_empty() {
        engine.checkpoints_settled().await;
        later = sealed(&checkpoints)
            .into_iter()
            .filter(|&k| k != 8)
            .collect();
        so_far.push(next_delta(&mut generation).await);
    }
    assert!(
        later.iter().all(|&k| k >= 30),
        "the waiting checkpoint is taken after the write, not where it fell due: {later:?}"
    );

    // Resumed past the newest checkpoint in place (the writer held: nothing is sealed or pruned
    // meanwhile), the run restores it and continues exactly.
    let held = engine.checkpoints.as_ref().unwrap().hold();
    let newest = sealed(&checkpoints).into_iter().max().unwrap();
    while tokens(&so_far) <= newest {
        so_far.push(next_delta(&mut generation).await);
    }
    drop(generation);
    let restores = engine.checkpoint_restores();
    assert_resumes_exactly(&engine, &model, max, &so_far, &whole).await;
    assert_eq!(engine.checkpoint_restores(), restores + 1);
    drop(held);
    engine.checkpoints_settled().await;
}

/// The output tokens of the last state.
fn tokens(deltas: &[(String, Vec<u8>)]) -> usize {
    let state = crate::state::GenerationState::decode(&deltas.last().unwrap().1).unwrap();
    state.tokens().len()
}

/// Every delta of `job` on `engine`, once its run has ended.
async fn whole(engine: &LlamaEngine, job: GenerationJob) -> Deltas {
    rest(engine.generate(job).await.unwrap()).await
}

/// How many contexts `engine` keeps parked for `model`, and how many runs took one.
async fn idle(engine: &LlamaEngine, model: &ModelToLoad) -> (usize, u64) {
    let loaded = engine.model(model).await.unwrap();
    let parked = loaded.with_dependent(|_, idle| idle.parked());
    (parked, engine.contexts_reused())
}

/// A job asking `max` sampled tokens for `input`.
fn job_for(
    model: &ModelToLoad,
    input: &str,
    max: u32,
    resume: Option<ResumePoint>,
) -> GenerationJob {
    let mut job = job(model, max, resume);
    Arc::make_mut(&mut job.spec).input = Input::Text(input.into());
    job
}

/// I-6 on a reused context: a generation on a context another run left (another prompt of a
/// size within the same padding; its KV cleared) draws the same tokens as one on a context of
/// its own, and a resume on one continues exactly; runs at once each have their own, and no
/// more than the engine was told stay parked after them. (The tiny model writes its cycle
/// whatever the prompt: the SmolLM2 tests check a reused context's text on a real model.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_context_gives_what_a_new_one_gives() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let engine = |idle: usize| {
        LlamaEngine::new(LlamaSettings {
            threads: NonZeroU32::new(1),
            ..LlamaSettings::default()
        })
        .unwrap()
        .with_idle_contexts(idle)
    };
    let fresh = engine(0);
    let alone = text(&whole(&fresh, job_for(&model, "hi", 40, None)).await);

    let reusing = engine(1);
    // Another, longer prompt first (its context's size differs by less than llama.cpp's
    // padding: the same context): the next run takes its context, which held other tokens.
    whole(
        &reusing,
        job_for(&model, "a longer prompt than hi", 40, None),
    )
    .await;
    let again = text(&whole(&reusing, job_for(&model, "hi", 40, None)).await);
    assert_eq!(again, alone);
    assert_eq!(
        idle(&reusing, &model).await,
        (1, 1),
        "the second run took the first one's context"
    );

    // Interrupted after 10 deltas, then resumed on the context it parked.
    let mut first = reusing
        .generate(job_for(&model, "hi", 40, None))
        .await
        .unwrap();
    let so_far = deltas(&mut first, 10).await;
    // A stop waits for the run's thread, which parks the context (this engine keeps no
    // checkpoints, so the stop discards nothing the resume needs).
    first.stop().await;
    let point = ResumePoint {
        state: so_far.last().unwrap().1.clone(),
        text_so_far: text(&so_far),
    };
    let resumed = whole(&reusing, job_for(&model, "hi", 40, Some(point))).await;
    assert_eq!(format!("{}{}", text(&so_far), text(&resumed)), alone);
    assert_eq!(idle(&reusing, &model).await, (1, 3));

    // Two at once (each blocks on its full channel holding its context until read): two
    // contexts; after both, one parked, as told.
    let one = reusing
        .generate(job_for(&model, "hi", 40, None))
        .await
        .unwrap();
    let two = reusing
        .generate(job_for(&model, "hi", 40, None))
        .await
        .unwrap();
    assert_eq!(text(&rest(one).await), alone);
    assert_eq!(text(&rest(two).await), alone);
    assert_eq!(idle(&reusing, &model).await, (1, 4));
    assert_eq!(idle(&fresh, &model).await, (0, 0));
}
