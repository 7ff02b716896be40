//! Behaviour of the reference engine: determinism, sampling, exact resume (I-6), cancel-safe
//! pulls, stopping, and load caching. Delays run on tokio's paused clock: no test waits on the
//! wall clock.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests may panic on setup failures.

use std::sync::Arc;
use std::time::Duration;

use lmsp_domain::model::{
    Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad,
};
use lmsp_domain::ports::{Engine, EngineError, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::task::{Fraction, Input, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_engine_kit::{EngineTag, ResumeState};
use lmsp_engine_reference::{ReferenceEngine, ReferenceSettings};
use proptest::prelude::*;
use tokio::time::Instant;

const CORPUS: &str = "the river runs past the old mill and into the quiet forest where the deer \
drink at dawn . the forest is green in summer and gold in autumn and the wind carries the smell \
of pine . the old clock strikes nine and the market fills with voices .";

fn model_named(dir: &tempfile::TempDir, name: &str, digest: u8) -> ModelToLoad {
    let path = dir.path().join(format!("{name}.txt"));
    std::fs::write(&path, CORPUS).unwrap();
    ModelToLoad {
        record: ModelRecord {
            id: ModelId::parse(name).unwrap(),
            source: ModelSource::File {
                format: ModelFormat::Text,
                file: FileFingerprint {
                    path: format!("{name}.txt"),
                    size_bytes: CORPUS.len() as u64,
                    modified_millis: 0,
                    digest: Digest::from_sha256([digest; 32]),
                },
            },
            created_at: Timestamp::from_millis(0),
        },
        path: Some(path.to_string_lossy().into_owned()),
    }
}

fn model(dir: &tempfile::TempDir) -> ModelToLoad {
    model_named(dir, "reference", 3)
}

fn digest(model: &ModelToLoad) -> Digest {
    model.record.file().unwrap().digest.clone()
}

fn job_with(
    model: &ModelToLoad,
    prompt: &str,
    seed: u64,
    max: u32,
    temperature: Option<f64>,
    resume: Option<ResumePoint>,
) -> GenerationJob {
    GenerationJob {
        model: model.clone(),
        spec: Arc::new(TaskSpec {
            input: Input::Text(prompt.to_owned()),
            instructions: None,
            max_output_tokens: max,
            seed,
            temperature: temperature.and_then(Fraction::new),
            top_p: None,
            previous_response_id: None,
            controls: Default::default(),
        }),
        resume,
    }
}

fn job(
    model: &ModelToLoad,
    prompt: &str,
    seed: u64,
    max: u32,
    resume: Option<ResumePoint>,
) -> GenerationJob {
    job_with(model, prompt, seed, max, None, resume)
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
                output_tokens: 50,
                cached_tokens: 0
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
        temperature in proptest::option::of(prop_oneof![Just(0.0), Just(1.0), 0.05f64..2.0]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let model = model(&dir);
        runtime().block_on(async {
            let engine = ReferenceEngine::new(ReferenceSettings::default());
            let job = |resume| job_with(&model, &prompt, seed, max, temperature, resume);
            let (full, full_end) = run(&engine, job(None)).await;
            prop_assert_eq!(full.len(), max as usize);
            let cut = ((f64::from(max) * cut) as usize).clamp(1, max as usize);
            let (before, snapshot) = (&full[..cut], &full[cut - 1]);
            let resume = ResumePoint { state: snapshot.1.clone(), text_so_far: text(before) };
            let (after, end) = run(&engine, job(Some(resume))).await;
            prop_assert_eq!(format!("{}{}", text(before), text(&after)), text(&full));
            prop_assert_eq!(after.len(), max as usize - cut);
            prop_assert_eq!(end, full_end);
            Ok(())
        })?;
    }
}

/// I-6: snapshots stored by the first releases, before the envelope, still resume exactly.
#[tokio::test]
async fn a_state_of_the_first_releases_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    let prompt = "tell me about the forest";
    let (full, full_end) = run(&engine, job(&model, prompt, 42, 20, None)).await;
    let cut = 7;
    let envelope = ResumeState::decode(&full[cut - 1].1, EngineTag::new("reference")).unwrap();
    assert_eq!(envelope.produced, cut as u64);
    // The first releases wrote `[1][next word index: u64 LE]` followed by the context, which the
    // envelope's own bytes hold after their first (the kind of run).
    let mut legacy = vec![1];
    legacy.extend_from_slice(&envelope.produced.to_le_bytes());
    legacy.extend_from_slice(&envelope.engine[1..]);
    let resume = ResumePoint {
        state: legacy,
        text_so_far: text(&full[..cut]),
    };
    let (after, end) = run(&engine, job(&model, prompt, 42, 20, Some(resume))).await;
    assert_eq!(
        format!("{}{}", text(&full[..cut]), text(&after)),
        text(&full)
    );
    assert_eq!(end, full_end);
}

#[tokio::test]
async fn invalid_state_bytes_fail_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    let foreign = ResumeState::new(0, vec![0]).encode(EngineTag::new("openai"));
    // The openai engine's state of the first releases (a token count).
    let foreign_legacy = 3u64.to_le_bytes().to_vec();
    for state in [vec![], vec![9, 1, 2], vec![1; 40], foreign, foreign_legacy] {
        let resume = ResumePoint {
            state,
            text_so_far: String::new(),
        };
        let result = engine.generate(job(&model, "x", 1, 10, Some(resume))).await;
        assert!(matches!(result, Err(EngineError::Failed(_))));
    }
}

/// Temperature 0 is greedy: the same text whatever the seed.
#[tokio::test]
async fn temperature_zero_is_greedy_and_ignores_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    let greedy = |seed| job_with(&model, "the forest", seed, 30, Some(0.0), None);
    let (one, _) = run(&engine, greedy(1)).await;
    let (other, _) = run(&engine, greedy(99)).await;
    assert_eq!(text(&one), text(&other));
    let (sampled, _) = run(
        &engine,
        job_with(&model, "the forest", 1, 30, Some(1.5), None),
    )
    .await;
    let (sampled_other, _) = run(
        &engine,
        job_with(&model, "the forest", 99, 30, Some(1.5), None),
    )
    .await;
    assert_ne!(
        text(&sampled),
        text(&sampled_other),
        "a temperature above 0 samples by seed"
    );
}

/// A pull dropped in the middle of its token delay (a cancel's select) loses nothing: pulling
/// again gives the word an uninterrupted run gives.
#[tokio::test(start_paused = true)]
async fn a_dropped_pull_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings {
        token_delay: Duration::from_millis(50),
        ..ReferenceSettings::default()
    });
    let (uninterrupted, _) = run(&engine, job(&model, "the forest", 7, 5, None)).await;
    let mut generation = engine
        .generate(job(&model, "the forest", 7, 5, None))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let pull = generation.next_item();
        if let Ok(item) = tokio::time::timeout(Duration::from_millis(30), pull).await {
            if let Some(GenerationItem::Delta { text, state }) = item.unwrap() {
                seen.push((text, state));
            }
        }
    }
    assert_eq!(seen, uninterrupted);
}

/// Stopping takes the engine's time to notice a cancel (`--reference-cancel-delay`), then the
/// generation yields nothing more.
#[tokio::test(start_paused = true)]
async fn stopping_takes_the_cancel_delay_and_ends_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings {
        load_delay: Duration::ZERO,
        token_delay: Duration::from_millis(20),
        cancel_delay: Duration::from_millis(300),
    });
    let mut generation = engine
        .generate(job(&model, "the forest", 7, 1000, None))
        .await
        .unwrap();
    assert!(matches!(
        generation.next_item().await,
        Ok(Some(GenerationItem::Delta { .. }))
    ));
    let started = Instant::now();
    generation.stop().await;
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert_eq!(generation.next_item().await, Ok(None));
}

#[tokio::test(start_paused = true)]
async fn loading_caches_by_digest_and_waits_only_the_first_time() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings {
        load_delay: Duration::from_millis(150),
        token_delay: Duration::ZERO,
        cancel_delay: Duration::ZERO,
    });
    assert!(!engine.is_loaded(&digest(&model)));
    let started = Instant::now();
    engine.load(&model).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(engine.is_loaded(&digest(&model)));
    let again = Instant::now();
    engine.load(&model).await.unwrap();
    assert_eq!(again.elapsed(), Duration::ZERO);
    // Cached: it works even after the file is gone.
    std::fs::remove_file(model.path.as_deref().unwrap()).unwrap();
    engine.load(&model).await.unwrap();
}

/// A slow load of one model holds up no other model's load.
#[tokio::test(start_paused = true)]
async fn a_slow_load_of_one_model_does_not_hold_up_another() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (
        model_named(&dir, "first", 1),
        model_named(&dir, "second", 2),
    );
    let engine = Arc::new(ReferenceEngine::new(ReferenceSettings {
        load_delay: Duration::from_secs(10),
        ..ReferenceSettings::default()
    }));
    let slow = {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move { engine.load(&first).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    engine.load(&second).await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "its own delay, not the first's too"
    );
    slow.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_missing_model_file_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = model(&dir);
    model.path = Some(dir.path().join("nope.txt").to_string_lossy().into_owned());
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    assert!(matches!(
        engine.load(&model).await,
        Err(EngineError::ModelUnavailable(_))
    ));
}

/// A job of `job_with`'s with these controls.
fn job_controlled(
    model: &ModelToLoad,
    max: u32,
    controls: lmsp_domain::tools::Controls,
    resume: Option<ResumePoint>,
) -> GenerationJob {
    let mut job = job(model, "tell me about the forest", 42, max, resume);
    Arc::make_mut(&mut job.spec).controls = controls;
    job
}

fn stopping_at(stop: &[&str]) -> lmsp_domain::tools::Controls {
    lmsp_domain::tools::Controls {
        stop: stop.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

/// How many of `full`'s deltas it takes to complete the first of `stops` in their text.
fn tokens_to_stop(full: &[(String, Vec<u8>)], stops: &[&str]) -> usize {
    let all = text(full);
    let end = stops
        .iter()
        .filter_map(|stop| all.find(stop).map(|at| (at, at + stop.len())))
        .min()
        .map(|(_, end)| end)
        .unwrap();
    let mut written = 0;
    full.iter()
        .position(|(delta, _)| {
            written += delta.len();
            written >= end
        })
        .unwrap()
        + 1
}

/// A stop string ends the generation at the word that completes it (whether it lies in one word
/// or across two): the text up to there is the unstopped run's, and the usage counts the words
/// generated, fewer than the budget.
#[tokio::test]
async fn a_stop_string_ends_the_generation_at_the_word_that_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    let (full, _) = run(
        &engine,
        job(&model, "tell me about the forest", 42, 50, None),
    )
    .await;
    let across = format!(
        "{}{}",
        &full[20].0[full[20].0.len() - 2..],
        &full[21].0[..2]
    );
    let within = full[12].0.trim().to_owned();
    for stops in [
        vec![within.as_str()],
        vec!["never-written", across.as_str()],
    ] {
        let expected = tokens_to_stop(&full, &stops);
        assert!(expected < 50, "{stops:?}");
        let (stopped, end) = run(
            &engine,
            job_controlled(&model, 50, stopping_at(&stops), None),
        )
        .await;
        assert_eq!(stopped, full[..expected], "{stops:?}");
        assert_eq!(
            end,
            GenerationItem::Finished {
                usage: Usage {
                    input_tokens: 5,
                    output_tokens: expected as u64,
                    cached_tokens: 0
                }
            },
            "{stops:?}"
        );
    }
}

/// I-6 with a stop string: resumed from any snapshot before the stop (even one whose text ends
/// with the start of the stop string), a run ends at the same word with the same usage.
#[tokio::test]
async fn a_resumed_run_ends_at_the_same_stop_with_the_same_usage() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    let (free, _) = run(
        &engine,
        job(&model, "tell me about the forest", 42, 60, None),
    )
    .await;
    let stop = format!("{}{}", free[30].0, &free[31].0[..2]);
    let controls = stopping_at(&[stop.as_str()]);
    let (full, full_end) = run(&engine, job_controlled(&model, 60, controls.clone(), None)).await;
    let stopped_at = tokens_to_stop(&free, &[stop.as_str()]);
    assert_eq!(full.len(), stopped_at);
    for cut in 1..full.len() {
        let resume = ResumePoint {
            state: full[cut - 1].1.clone(),
            text_so_far: text(&full[..cut]),
        };
        let (after, end) = run(
            &engine,
            job_controlled(&model, 60, controls.clone(), Some(resume)),
        )
        .await;
        assert_eq!(after, full[cut..], "cut {cut}");
        assert_eq!(end, full_end, "cut {cut}");
    }
}

/// A structured output ends at a stop string too; and a schema the engine cannot answer with a
/// valid instance is refused before a task is created, naming the keyword.
#[tokio::test]
async fn a_scripted_output_stops_and_unbuildable_schemas_are_refused() {
    use lmsp_domain::tools::{Controls, JsonText, OutputFormat};
    let dir = tempfile::tempdir().unwrap();
    let model = model(&dir);
    let engine = ReferenceEngine::new(ReferenceSettings::default());
    let format = |schema: &str| OutputFormat::JsonSchema {
        name: String::from("x"),
        schema: JsonText::parsed(schema),
        strict: true,
    };
    let schema =
        r#"{"type":"object","properties":{"a":{"type":"string","minLength":10}},"required":["a"]}"#;
    let controls = Controls {
        format: format(schema),
        stop: vec![String::from(":")],
        ..Controls::default()
    };
    let (deltas, end) = run(&engine, job_controlled(&model, 50, controls, None)).await;
    assert_eq!(text(&deltas), "{\"a\":\"aa");
    assert_eq!(
        end,
        GenerationItem::Finished {
            usage: Usage {
                input_tokens: 5,
                output_tokens: 2,
                cached_tokens: 0
            }
        }
    );
    let refused = Controls {
        format: format(
            r#"{"type":"object","properties":{"a":{"type":"string","pattern":"^a+$"}},"required":["a"]}"#,
        ),
        ..Controls::default()
    };
    let job = job_controlled(&model, 50, refused, None);
    let unsupported = engine.check(&job.spec).unwrap_err();
    assert_eq!(unsupported.param, "text.format.schema.properties.a.pattern");
    assert!(engine.generate(job).await.is_err());
}
