//! The llama.cpp engine on a tiny GGUF model written at test time (`tiny`): known greedy text
//! through the real llama.cpp code path, token budgets and usage, seeded sampling, exact resume
//! (I-6), cancel-safe pulls, stopping, concurrency and unloadable files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests may panic on setup failures.

mod tiny;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmsp_domain::model::{
    Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad,
};
use lmsp_domain::ports::{
    Engine, EngineError, Generation, GenerationItem, GenerationJob, ResumePoint,
};
use lmsp_domain::task::{Fraction, Input, Message, Role, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_engine_llama::state::GenerationState;
use lmsp_engine_llama::{LlamaEngine, LlamaSettings};

/// The fallback prompt of a one-message input `hi` (the tiny model has no chat template).
const PROMPT_HI: &str = "user: hi\nassistant: ";

fn model_file(
    dir: &tempfile::TempDir,
    name: &str,
    digest: u8,
    bytes: Option<&[u8]>,
) -> ModelToLoad {
    let path = dir.path().join(format!("{name}.gguf"));
    match bytes {
        Some(bytes) => std::fs::write(&path, bytes).unwrap(),
        None => tiny::write(&path, None),
    }
    to_load(name, &path, digest)
}

fn to_load(name: &str, path: &std::path::Path, digest: u8) -> ModelToLoad {
    ModelToLoad {
        record: ModelRecord {
            id: ModelId::parse(name).unwrap(),
            source: ModelSource::File {
                format: ModelFormat::Gguf,
                file: FileFingerprint {
                    path: format!("{name}.gguf"),
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

fn tiny_model(dir: &tempfile::TempDir) -> ModelToLoad {
    model_file(dir, "tiny", 1, None)
}

fn engine() -> LlamaEngine {
    LlamaEngine::new(LlamaSettings {
        threads: NonZeroU32::new(1),
        ..LlamaSettings::default()
    })
    .unwrap()
}

fn spec(input: Input, max: u32, seed: u64, temperature: Option<f64>) -> Arc<TaskSpec> {
    Arc::new(TaskSpec {
        input,
        instructions: None,
        max_output_tokens: max,
        seed,
        temperature: temperature.and_then(Fraction::new),
        top_p: None,
        previous_response_id: None,
        controls: Default::default(),
    })
}

fn greedy_job(model: &ModelToLoad, max: u32) -> GenerationJob {
    GenerationJob {
        model: model.clone(),
        spec: spec(Input::Text("hi".into()), max, 0, Some(0.0)),
        resume: None,
    }
}

/// Every delta (text and state) and the final usage.
async fn collect(mut generation: Box<dyn Generation>) -> (Vec<(String, Vec<u8>)>, Usage) {
    let mut deltas = Vec::new();
    loop {
        match generation.next_item().await.unwrap() {
            Some(GenerationItem::Delta { text, state }) => deltas.push((text, state)),
            Some(GenerationItem::Finished { usage }) => {
                assert_eq!(generation.next_item().await.unwrap(), None);
                return (deltas, usage);
            }
            Some(other) => panic!("a plain run sends no {other:?}"),
            None => panic!("the generation ended without finishing"),
        }
    }
}

async fn run(engine: &LlamaEngine, job: GenerationJob) -> (Vec<(String, Vec<u8>)>, Usage) {
    collect(engine.generate(job).await.unwrap()).await
}

/// Each delta's text, tokens and pending bytes, without the run's checkpoint name (random per
/// run), which must be the same in every state of the run.
fn progress(deltas: &[(String, Vec<u8>)]) -> Vec<(String, Vec<i32>, Vec<u8>)> {
    let states: Vec<GenerationState> = deltas
        .iter()
        .map(|(_, state)| GenerationState::decode(state).unwrap())
        .collect();
    assert!(states.windows(2).all(|w| w[0].run() == w[1].run()));
    deltas
        .iter()
        .zip(states)
        .map(|((text, _), state)| {
            (
                text.clone(),
                state.tokens().to_vec(),
                state.pending().to_vec(),
            )
        })
        .collect()
}

fn text(deltas: &[(String, Vec<u8>)]) -> String {
    deltas.iter().map(|(text, _)| text.as_str()).collect()
}

fn input_tokens(prompt: &str) -> u64 {
    // One token per ASCII character, and the BOS token.
    prompt.len() as u64 + 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tiny_model_loads_and_its_greedy_text_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    let digest = model.record.file().unwrap().digest.clone();
    assert!(!engine.is_loaded(&digest));
    engine.load(&model).await.unwrap();
    assert!(engine.is_loaded(&digest));
    engine.load(&model).await.unwrap();

    let (deltas, usage) = run(&engine, greedy_job(&model, 20)).await;
    assert_eq!(text(&deltas), "0123456789!€ 01234");
    assert_eq!(text(&deltas), tiny::next_text(b' ', 20));
    assert_eq!(
        usage,
        Usage {
            input_tokens: input_tokens(PROMPT_HI),
            output_tokens: 20,
            cached_tokens: 0
        }
    );
    // Whole characters: `€`, three byte tokens, is one delta.
    assert!(deltas.iter().all(|(text, _)| !text.is_empty()));
    assert!(deltas.iter().any(|(text, _)| text == "€"));
    assert_eq!(deltas.len(), 18);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_the_same_on_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let first = run(&engine(), greedy_job(&model, 40)).await;
    let second = run(&engine(), greedy_job(&model, 40)).await;
    assert_eq!(progress(&first.0), progress(&second.0));
    assert_eq!(first.1, second.1);
    // Unset sampling parameters are llama.cpp's defaults (random): a seed makes them repeatable.
    let job = |seed| GenerationJob {
        model: model.clone(),
        spec: spec(Input::Text("hi".into()), 40, seed, Some(1.5)),
        resume: None,
    };
    let engine = engine();
    let a = run(&engine, job(1)).await;
    let b = run(&engine, job(1)).await;
    let c = run(&engine, job(2)).await;
    assert_eq!(progress(&a.0), progress(&b.0));
    assert_eq!(a.1, b.1);
    assert_ne!(text(&a.0), text(&c.0), "different seeds, different samples");
    assert_eq!(a.1.output_tokens, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_output_tokens_counts_real_tokens_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    for max in [0u32, 1, 10, 11, 12, 13, 14, 15, 100] {
        let (deltas, usage) = run(&engine, greedy_job(&model, max)).await;
        assert_eq!(usage.output_tokens, u64::from(max), "max {max}");
        assert_eq!(
            text(&deltas),
            tiny::next_text(b' ', max as usize),
            "max {max}"
        );
    }
    // A budget that ends inside `€` ends with a replacement character.
    let (deltas, _) = run(&engine, greedy_job(&model, 12)).await;
    assert_eq!(text(&deltas), "0123456789!\u{FFFD}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_counts_the_prompt_tokens_of_the_whole_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    let mut spec = (*spec(
        Input::Messages(vec![
            Message::new(Role::User, "count"),
            Message::new(Role::Assistant, "ok"),
            Message::new(Role::User, "go on"),
        ]),
        5,
        0,
        Some(0.0),
    ))
    .clone();
    spec.instructions = Some("be brief".into());
    let (deltas, usage) = run(
        &engine,
        GenerationJob {
            model: model.clone(),
            spec: Arc::new(spec),
            resume: None,
        },
    )
    .await;
    let prompt = "system: be brief\nuser: count\nassistant: ok\nuser: go on\nassistant: ";
    assert_eq!(usage.input_tokens, input_tokens(prompt));
    assert_eq!(usage.output_tokens, 5);
    assert_eq!(text(&deltas), "01234");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_template_in_the_model_builds_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.gguf");
    tiny::write(
        &path,
        Some("{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"),
    );
    let model = to_load("chat", &path, 9);
    let (deltas, usage) = run(&engine(), greedy_job(&model, 3)).await;
    // llama.cpp recognises the ChatML template; its prompt ends with a newline (→ `0`).
    let prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(usage.input_tokens, input_tokens(prompt));
    assert_eq!(text(&deltas), "012");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_continues_exactly_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    for (seed, temperature) in [(0, Some(0.0)), (7, Some(1.0)), (8, None)] {
        let max = 30;
        let job = |resume| GenerationJob {
            model: model.clone(),
            spec: spec(Input::Text("hi".into()), max, seed, temperature),
            resume,
        };
        let (full, usage) = run(&engine, job(None)).await;
        assert_eq!(usage.output_tokens, u64::from(max));
        let whole = text(&full);
        for k in [1, 2, 5, 10, 11, 12, full.len() - 1, full.len()]
            .into_iter()
            .filter(|&k| k >= 1 && k <= full.len())
        {
            let so_far = text(&full[..k]);
            let resume = ResumePoint {
                state: full[k - 1].1.clone(),
                text_so_far: so_far.clone(),
            };
            let (rest, resumed_usage) = run(&engine, job(Some(resume))).await;
            assert_eq!(
                format!("{so_far}{}", text(&rest)),
                whole,
                "seed {seed}, resumed after delta {k}"
            );
            assert_eq!(resumed_usage, usage, "seed {seed}, k {k}");
            // A resume of a resume too (the states go on where the first run's did).
            if let Some((_, state)) = rest.first() {
                let again = ResumePoint {
                    state: state.clone(),
                    text_so_far: format!("{so_far}{}", rest[0].0),
                };
                let (tail, again_usage) = run(&engine, job(Some(again))).await;
                assert_eq!(format!("{so_far}{}{}", rest[0].0, text(&tail)), whole);
                assert!(again_usage.output_tokens <= u64::from(max));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_past_the_budget_or_from_a_foreign_state_fails() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    let (full, _) = run(&engine, greedy_job(&model, 10)).await;
    let mut job = greedy_job(&model, 5);
    job.resume = Some(ResumePoint {
        state: full.last().unwrap().1.clone(),
        text_so_far: text(&full),
    });
    assert!(matches!(
        engine.generate(job).await.err(),
        Some(EngineError::Failed(_))
    ));
    let mut job = greedy_job(&model, 5);
    job.resume = Some(ResumePoint {
        state: b"{\"next\": 3}".to_vec(),
        text_so_far: String::new(),
    });
    assert!(matches!(
        engine.generate(job).await.err(),
        Some(EngineError::Failed(_))
    ));
}

/// I-6: snapshots written before the envelope (`LLS1`: the first release's, without a checkpoint
/// name; `LLS2`) still resume, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_of_earlier_releases_still_resume_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    let (full, full_usage) = run(&engine, greedy_job(&model, 8)).await;
    let cut = 3;
    let state = GenerationState::decode(&full[cut - 1].1).unwrap();
    let mut body = u32::try_from(state.tokens().len())
        .unwrap()
        .to_le_bytes()
        .to_vec();
    for token in state.tokens() {
        body.extend_from_slice(&token.to_le_bytes());
    }
    body.push(u8::try_from(state.pending().len()).unwrap());
    body.extend_from_slice(state.pending());
    let lls1 = [b"LLS1".as_slice(), &body].concat();
    let lls2 = [b"LLS2".as_slice(), &[9; 16], &body].concat();
    for legacy in [lls1, lls2] {
        let mut job = greedy_job(&model, 8);
        job.resume = Some(ResumePoint {
            state: legacy,
            text_so_far: text(&full[..cut]),
        });
        let (after, usage) = run(&engine, job).await;
        assert_eq!(
            format!("{}{}", text(&full[..cut]), text(&after)),
            text(&full)
        );
        assert_eq!(usage.output_tokens, full_usage.output_tokens);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_without_state_retokenizes_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    let mut job = greedy_job(&model, 8);
    job.resume = Some(ResumePoint {
        state: Vec::new(),
        text_so_far: "0123".into(),
    });
    let (deltas, usage) = run(&engine, job).await;
    assert_eq!(text(&deltas), "4567");
    assert_eq!(usage.output_tokens, 8);
    // `#` leads to the end of generation: nothing more, and no token counted for it.
    let mut job = greedy_job(&model, 8);
    job.resume = Some(ResumePoint {
        state: Vec::new(),
        text_so_far: "#".into(),
    });
    let (deltas, usage) = run(&engine, job).await;
    assert!(deltas.is_empty());
    assert_eq!(usage.output_tokens, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_pulls_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    let (expected, expected_usage) = run(&engine, greedy_job(&model, 60)).await;
    let mut generation = engine.generate(greedy_job(&model, 60)).await.unwrap();
    let mut deltas = Vec::new();
    let usage = loop {
        // Most of these pulls are dropped before an item arrives.
        match tokio::time::timeout(Duration::from_micros(50), generation.next_item()).await {
            Err(_) => continue,
            Ok(item) => match item.unwrap() {
                Some(GenerationItem::Delta { text, state }) => deltas.push((text, state)),
                Some(GenerationItem::Finished { usage }) => break usage,
                Some(other) => panic!("a plain run sends no {other:?}"),
                None => panic!("ended without finishing"),
            },
        }
    };
    assert_eq!(progress(&deltas), progress(&expected));
    assert_eq!(usage, expected_usage);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_returns_promptly_and_ends_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    // Pulling: stop mid-stream.
    let mut generation = engine.generate(greedy_job(&model, 2000)).await.unwrap();
    generation.next_item().await.unwrap().unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), generation.stop())
        .await
        .expect("stop returns");
    let took = started.elapsed();
    // Whatever was sent before the stop may still be read; then the generation is over.
    let mut count = 0;
    while let Some(item) = generation.next_item().await.unwrap() {
        assert!(matches!(item, GenerationItem::Delta { .. }));
        count += 1;
        assert!(count < 100, "the generation went on after its stop");
    }
    eprintln!("stop while pulling took {took:?}");

    // Not pulling: the thread is blocked on a full channel when the stop comes.
    let mut generation = engine.generate(greedy_job(&model, 2000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(Duration::from_secs(5), generation.stop())
        .await
        .expect("stop returns");
    drop(generation);

    // Stopped before it started, and dropped without a stop: both fine.
    let mut generation = engine.generate(greedy_job(&model, 2000)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), generation.stop())
        .await
        .expect("stop returns");
    drop(engine.generate(greedy_job(&model, 2000)).await.unwrap());
    // The engine goes on working.
    let (deltas, _) = run(&engine, greedy_job(&model, 3)).await;
    assert_eq!(text(&deltas), "012");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_generations_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let one = tiny_model(&dir);
    let other = model_file(&dir, "other", 2, None);
    let engine = Arc::new(engine());
    let mut generations = Vec::new();
    for (i, model) in [&one, &one, &other, &one].into_iter().enumerate() {
        generations.push(
            engine
                .generate(greedy_job(model, 20 + i as u32))
                .await
                .unwrap(),
        );
    }
    // Pull them in turns: each has its own context.
    let mut texts = vec![String::new(); generations.len()];
    let mut done = vec![None; generations.len()];
    while done.iter().any(Option::is_none) {
        for (i, generation) in generations.iter_mut().enumerate() {
            if done[i].is_some() {
                continue;
            }
            match generation.next_item().await.unwrap() {
                Some(GenerationItem::Delta { text, .. }) => texts[i].push_str(&text),
                Some(GenerationItem::Finished { usage }) => done[i] = Some(usage),
                Some(other) => panic!("a plain run sends no {other:?}"),
                None => panic!("ended without finishing"),
            }
        }
    }
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(*text, tiny::next_text(b' ', 20 + i), "generation {i}");
        assert_eq!(done[i].unwrap().output_tokens, 20 + i as u64);
    }
    // And on tasks of their own.
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            let engine = Arc::clone(&engine);
            let model = one.clone();
            tokio::spawn(async move { run(&engine, greedy_job(&model, 30 + i)).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let (deltas, _) = task.await.unwrap();
        assert_eq!(text(&deltas), tiny::next_text(b' ', 30 + i));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_unreadable_file_is_model_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let missing = to_load("missing", &dir.path().join("missing.gguf"), 3);
    assert!(matches!(
        engine.load(&missing).await,
        Err(EngineError::ModelUnavailable(_))
    ));
    let garbage = model_file(&dir, "garbage", 4, Some(&[7u8; 4096][..]));
    assert!(matches!(
        engine.load(&garbage).await,
        Err(EngineError::ModelUnavailable(_))
    ));
    assert!(matches!(
        engine.generate(greedy_job(&garbage, 3)).await.err(),
        Some(EngineError::ModelUnavailable(_))
    ));
    // A real model cut short.
    let path = dir.path().join("whole.gguf");
    tiny::write(&path, None);
    let bytes = std::fs::read(&path).unwrap();
    let cut = model_file(&dir, "cut", 5, Some(&bytes[..bytes.len() / 2]));
    assert!(matches!(
        engine.load(&cut).await,
        Err(EngineError::ModelUnavailable(_))
    ));
    // An upstream model is not this engine's.
    let mut upstream = missing.clone();
    upstream.record.source = ModelSource::Upstream { name: "gpt".into() };
    upstream.path = None;
    assert!(matches!(
        engine.load(&upstream).await,
        Err(EngineError::ModelUnavailable(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_during_a_long_prompt_returns_and_nothing_follows() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    // Four prompt tokens per llama.cpp call: ~450 calls, a stop is seen between two.
    let engine = LlamaEngine::new(LlamaSettings {
        threads: NonZeroU32::new(1),
        batch_size: NonZeroU32::new(4).unwrap(),
        ..LlamaSettings::default()
    })
    .unwrap();
    engine.load(&model).await.unwrap();
    let job = GenerationJob {
        model: model.clone(),
        spec: spec(Input::Text("a".repeat(1800)), 100, 0, Some(0.0)),
        resume: None,
    };
    let mut generation = engine.generate(job.clone()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), generation.stop())
        .await
        .expect("stop returns");
    assert_eq!(generation.next_item().await.unwrap(), None);
    // Unstopped, the same prompt runs to its end.
    let (deltas, usage) = run(&engine, job).await;
    assert_eq!(usage.output_tokens, 100);
    assert_eq!(
        usage.input_tokens,
        input_tokens(&format!("user: {}\nassistant: ", "a".repeat(1800)))
    );
    assert_eq!(text(&deltas), tiny::next_text(b' ', 100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_beyond_the_context_ends_when_the_context_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = LlamaEngine::new(LlamaSettings {
        threads: NonZeroU32::new(1),
        context_size: NonZeroU32::new(64).unwrap(),
        ..LlamaSettings::default()
    })
    .unwrap();
    let (deltas, usage) = run(&engine, greedy_job(&model, 1000)).await;
    let prompt = input_tokens(PROMPT_HI);
    assert_eq!(usage.output_tokens, 64 - prompt);
    assert_eq!(text(&deltas), tiny::next_text(b' ', (64 - prompt) as usize));
    // A prompt longer than the context fails.
    let long = GenerationJob {
        model: model.clone(),
        spec: spec(Input::Text("a".repeat(100)), 5, 0, Some(0.0)),
        resume: None,
    };
    let mut generation = engine.generate(long).await.unwrap();
    assert!(matches!(
        generation.next_item().await,
        Err(EngineError::Failed(_))
    ));
}

/// A stop string ends the generation at the token that completes it (within one token, across
/// tokens, inside a character of several tokens): the text before it is the unstopped run's,
/// and the usage counts the tokens generated, fewer than the budget. Resumed from any delta's
/// state before the stop, a run ends at the same token with the same usage (I-6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_ends_the_generation_at_its_last_token_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let engine = engine();
    let max = 30;
    let free = tiny::next_text(b' ', max);
    // The greedy text is `0123456789!€ 0123…`: `€` is three byte tokens, every other character
    // one.
    for (stop, tokens) in [("5", 6), ("€ 01", 17), ("9!€", 14), ("never", max)] {
        let mut stopped = (*spec(Input::Text("hi".into()), max as u32, 0, Some(0.0))).clone();
        stopped.controls.stop = vec![String::from("x-never-written"), String::from(stop)];
        let job = |resume| GenerationJob {
            model: model.clone(),
            spec: Arc::new(stopped.clone()),
            resume,
        };
        let (deltas, usage) = run(&engine, job(None)).await;
        let before = free.find(stop).map_or(free.as_str(), |at| &free[..at]);
        assert_eq!(text(&deltas), before, "stop {stop:?}");
        assert_eq!(
            usage,
            Usage {
                input_tokens: input_tokens(PROMPT_HI),
                output_tokens: tokens as u64,
                cached_tokens: 0
            },
            "stop {stop:?}"
        );
        for k in 1..deltas.len() {
            let so_far = text(&deltas[..k]);
            let resume = ResumePoint {
                state: deltas[k - 1].1.clone(),
                text_so_far: so_far.clone(),
            };
            let (rest, resumed_usage) = run(&engine, job(Some(resume))).await;
            assert_eq!(
                format!("{so_far}{}", text(&rest)),
                before,
                "stop {stop:?}, k {k}"
            );
            assert_eq!(resumed_usage, usage, "stop {stop:?}, k {k}");
        }
    }
}
