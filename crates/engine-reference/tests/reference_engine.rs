//! Behaviour of the reference engine: determinism, exact resume (I-6), cancel and load caching.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests may panic on setup failures.

use std::time::{Duration, Instant};

use lmsp_domain::model::{Digest, FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{
    CancelFlag, Engine, EngineError, GenerationItem, GenerationJob, ResumePoint,
};
use lmsp_domain::task::{Input, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_engine_reference::{ReferenceEngine, ReferenceSettings};
use proptest::prelude::*;

const CORPUS: &str = "the river runs past the old mill and into the quiet forest where the deer \
drink at dawn . the forest is green in summer and gold in autumn and the wind carries the smell \
of pine . the old clock strikes nine and the market fills with voices .";

fn model(dir: &tempfile::TempDir) -> ModelRecord {
    let path = dir.path().join("reference.txt");
    std::fs::write(&path, CORPUS).unwrap();
    ModelRecord {
        id: ModelId::parse("reference").unwrap(),
        format: String::from("text"),
        file: FileFingerprint {
            path: path.to_string_lossy().into_owned(),
            size_bytes: CORPUS.len() as u64,
            modified_millis: 0,
            digest: Digest::from_sha256([3; 32]),
        },
        created_at: Timestamp::from_millis(0),
    }
}

fn job(
    model: &ModelRecord,
    prompt: &str,
    seed: u64,
    max: u32,
    resume: Option<ResumePoint>,
) -> GenerationJob {
    GenerationJob {
        model: model.clone(),
        spec: std::sync::Arc::new(TaskSpec {
            input: Input::Text(prompt.to_owned()),
            max_output_tokens: max,
            seed,
        }),
        resume,
        cancel: CancelFlag::new(),
    }
}

/// Runs to the end: every (delta text, state) and the final item.
async fn run(
    engine: &ReferenceEngine,
    job: GenerationJob,
) -> (Vec<(String, Vec<u8>)>, GenerationItem) {
    let mut generation = engine.generate(job).await.unwrap();
    let mut deltas = Vec::new();
    loop {
        match generation.next_item().await.unwrap().unwrap() {
            GenerationItem::Delta { text, state } => deltas.push((text, state)),
            other => {
                assert_eq!(generation.next_item().await.unwrap(), None);
                return (deltas, other);
            }
        }
    }
}

fn text(deltas: &[(String, Vec<u8>)]) -> String {
    deltas.iter().map(|(t, _)| t.as_str()).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_same_model_input_seed_and_budget_give_the_same_output() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    engine.load(&model).await.unwrap();
    let (first, end) = run(
        &engine,
        job(&model, "tell me about the forest", 42, 50, None),
    )
    .await;
    let (second, _) = run(
        &engine,
        job(&model, "tell me about the forest", 42, 50, None),
    )
    .await;
    assert_eq!(first, second);
    assert_eq!(first.len(), 50);
    assert!(first
        .iter()
        .all(|(t, _)| t.ends_with(' ') && !t.trim().is_empty()));
    assert!(first
        .iter()
        .all(|(t, _)| CORPUS.split_whitespace().any(|w| w == t.trim())));
    assert_eq!(
        end,
        GenerationItem::Finished {
            usage: Usage {
                input_tokens: 5,
                output_tokens: 50
            }
        }
    );
    let (other_seed, _) = run(
        &engine,
        job(&model, "tell me about the forest", 43, 50, None),
    )
    .await;
    assert_ne!(text(&first), text(&other_seed));
    // A fresh engine (a restarted service) gives the same text too.
    let fresh = ReferenceEngine::new(ReferenceSettings::default());
    let (again, _) = run(
        &fresh,
        job(&model, "tell me about the forest", 42, 50, None),
    )
    .await;
    assert_eq!(text(&first), text(&again));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// I-6: the deltas before a snapshot joined with the resumed run's deltas are exactly the
    /// uninterrupted output, and the usage counts the whole output.
    #[test]
    fn resumed_generation_continues_exactly_after_its_snapshot_i6(
        seed in any::<u64>(),
        max in 1_u32..200,
        cut in 0.0_f64..1.0,
        prompt in "[a-z ]{0,30}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        let model = model(&dir);
        runtime().block_on(async {
            let engine = ReferenceEngine::new(ReferenceSettings::default());
            let (full, full_end) = run(&engine, job(&model, &prompt, seed, max, None)).await;
            prop_assert_eq!(full.len(), max as usize);
            let cut = ((f64::from(max) * cut) as usize).clamp(1, max as usize);
            let (before, snapshot) = (&full[..cut], &full[cut - 1]);
            let resume = ResumePoint { state: snapshot.1.clone(), text_so_far: text(before) };
            let (after, end) = run(&engine, job(&model, &prompt, seed, max, Some(resume))).await;
            prop_assert_eq!(format!("{}{}", text(before), text(&after)), text(&full));
            prop_assert_eq!(after.len(), max as usize - cut);
            prop_assert_eq!(end, full_end);
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn invalid_state_bytes_fail_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    for state in [vec![], vec![9, 1, 2], vec![1; 40]] {
        let resume = ResumePoint {
            state,
            text_so_far: String::new(),
        };
        let result = engine.generate(job(&model, "x", 1, 10, Some(resume))).await;
        assert!(matches!(result, Err(EngineError::Failed(_))));
    }
}

#[tokio::test]
async fn a_cancel_is_noticed_within_one_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings {
        load_delay: Duration::ZERO,
        token_delay: Duration::from_millis(20),
        cancel_delay: Duration::from_millis(10),
    });
    let job = job(&model, "the forest", 7, 1000, None);
    let cancel = job.cancel.clone();
    let mut generation = engine.generate(job).await.unwrap();
    assert!(matches!(
        generation.next_item().await,
        Ok(Some(GenerationItem::Delta { .. }))
    ));
    cancel.raise();
    let started = Instant::now();
    assert_eq!(
        generation.next_item().await,
        Ok(Some(GenerationItem::Cancelled))
    );
    assert!(started.elapsed() >= Duration::from_millis(10));
    assert_eq!(generation.next_item().await, Ok(None));
}

#[tokio::test]
async fn a_cancel_raised_during_a_token_delay_stops_before_the_next_word() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings {
        load_delay: Duration::ZERO,
        token_delay: Duration::from_millis(50),
        cancel_delay: Duration::ZERO,
    });
    let job = job(&model, "the forest", 7, 1000, None);
    let cancel = job.cancel.clone();
    let mut generation = engine.generate(job).await.unwrap();
    let raiser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        cancel.raise();
    });
    assert_eq!(
        generation.next_item().await,
        Ok(Some(GenerationItem::Cancelled))
    );
    raiser.await.unwrap();
}

#[tokio::test]
async fn loading_caches_by_digest_and_waits_only_the_first_time() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings {
        load_delay: Duration::from_millis(150),
        token_delay: Duration::ZERO,
        cancel_delay: Duration::ZERO,
    });
    assert!(!engine.is_loaded(&model.file.digest).await);
    let started = Instant::now();
    engine.load(&model).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(engine.is_loaded(&model.file.digest).await);
    let again = Instant::now();
    engine.load(&model).await.unwrap();
    assert!(again.elapsed() < Duration::from_millis(100));
    // Cached: it works even after the file is gone.
    std::fs::remove_file(&model.file.path).unwrap();
    engine.load(&model).await.unwrap();
}

#[tokio::test]
async fn a_missing_model_file_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = model(&dir);
    model.file.path = dir.path().join("nope.txt").to_string_lossy().into_owned();
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    assert!(matches!(
        engine.load(&model).await,
        Err(EngineError::ModelUnavailable(_))
    ));
}
