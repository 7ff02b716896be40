//! The engine's own figures on any GGUF file, in process (no HTTP): tokens per second with and
//! without KV checkpoints, a repeated prompt's time to first token with and without the prompt
//! cache, and resume latency (restart → next token) after N tokens with and without checkpoints;
//! with `--grammar`, only tokens per second of an output constrained by a JSON schema's grammar
//! against the same run unconstrained; with `--copy-costs`, only what a KV checkpoint costs the
//! generating thread beside a token's evaluation, every 256 tokens of context up to `--tokens`:
//! llama.cpp's copy of the sequence state into a file (what a checkpoint does) and into a buffer.
//!
//! `cargo build --release --workspace --example engine_figures && target/release/examples/
//! engine_figures MODEL.gguf [--threads N] [--tokens N] [--every N] [--resume-max N]
//! [--grammar 1] [--copy-costs 1]`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // A measuring tool.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmsp_domain::model::{
    Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad,
};
use lmsp_domain::ports::{Engine, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::task::{Fraction, Input, TaskSpec};
use lmsp_domain::time::Timestamp;
use lmsp_domain::tools::{Controls, JsonText, OutputFormat};
use lmsp_engine_llama::{CheckpointSettings, LlamaEngine, LlamaSettings};

const PROMPT: &str =
    "Write a long story about a lighthouse keeper who finds a message in a bottle.";

fn model(path: &str) -> ModelToLoad {
    ModelToLoad {
        record: ModelRecord {
            id: ModelId::parse("figures").unwrap(),
            source: ModelSource::File {
                format: ModelFormat::Gguf,
                file: FileFingerprint {
                    path: String::from("figures.gguf"),
                    size_bytes: 0,
                    modified_millis: 0,
                    digest: Digest::from_sha256([9; 32]),
                },
            },
            created_at: Timestamp::from_millis(0),
        },
        path: Some(path.to_owned()),
    }
}

fn job(model: &ModelToLoad, tokens: u32, resume: Option<ResumePoint>) -> GenerationJob {
    controlled(model, tokens, resume, Controls::default())
}

/// A schema whose instances are long (an array of up to 200 short strings), for `--grammar`.
const LONG_SCHEMA: &str = r#"{"type": "object", "properties": {"story": {"type": "array",
    "items": {"type": "string", "maxLength": 40}, "maxItems": 200}}, "required": ["story"]}"#;

fn controlled(
    model: &ModelToLoad,
    tokens: u32,
    resume: Option<ResumePoint>,
    controls: Controls,
) -> GenerationJob {
    GenerationJob {
        model: model.clone(),
        spec: Arc::new(TaskSpec {
            input: Input::Text(PROMPT.into()),
            instructions: None,
            max_output_tokens: tokens,
            seed: 1,
            // Greedy keeps the length fixed only up to an end token; a high temperature rarely
            // draws one early.
            temperature: Fraction::new(1.0),
            top_p: None,
            previous_response_id: None,
            controls,
        }),
        resume,
    }
}

/// Time to the first delta, the whole run's time, the deltas.
async fn timed(
    engine: &LlamaEngine,
    job: GenerationJob,
) -> (Duration, Duration, Vec<(String, Vec<u8>)>) {
    let start = Instant::now();
    let mut generation = engine.generate(job).await.unwrap();
    let mut first = None;
    let mut deltas = Vec::new();
    while let Some(item) = generation.next_item().await.unwrap() {
        match item {
            GenerationItem::Delta { text, state } => {
                first.get_or_insert_with(|| start.elapsed());
                deltas.push((text, state));
            }
            GenerationItem::Finished { .. } => break,
            _ => {}
        }
    }
    (first.unwrap_or_default(), start.elapsed(), deltas)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: engine_figures MODEL.gguf [--threads N] [--tokens N] [--every N]");
    let (mut threads, mut tokens, mut every, mut resume_max) = (1u32, 600u32, 256u32, 500u32);
    let mut grammar = false;
    let mut copy = false;
    while let Some(flag) = args.next() {
        let value: u32 = args.next().expect("a value").parse().expect("a number");
        match flag.as_str() {
            "--threads" => threads = value,
            "--tokens" => tokens = value,
            "--every" => every = value,
            "--resume-max" => resume_max = value,
            "--grammar" => grammar = value != 0,
            "--copy-costs" => copy = value != 0,
            other => panic!("unknown flag {other}"),
        }
    }
    if copy {
        copy_costs(&path, threads, tokens);
        return;
    }
    let model = model(&path);
    let settings = LlamaSettings {
        threads: NonZeroU32::new(threads),
        ..LlamaSettings::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let plain = LlamaEngine::new(settings).unwrap();
    let checkpointed = LlamaEngine::new(settings)
        .unwrap()
        .with_checkpoints(CheckpointSettings {
            dir: dir.path().to_owned(),
            every: NonZeroU32::new(every).unwrap(),
            max_bytes: 8 << 30,
        });
    if grammar {
        plain.load(&model).await.unwrap();
        let constrained = Controls {
            format: OutputFormat::JsonSchema {
                name: String::from("story"),
                schema: JsonText::parsed(LONG_SCHEMA),
                strict: true,
            },
            ..Controls::default()
        };
        for (what, controls) in [
            ("unconstrained", Controls::default()),
            ("under a JSON schema's grammar", constrained),
        ] {
            let mut best = 0.0f64;
            for _ in 0..2 {
                let (first, total, deltas) =
                    timed(&plain, controlled(&model, tokens, None, controls.clone())).await;
                let rate = (deltas.len() as f64 - 1.0) / (total - first).as_secs_f64();
                best = best.max(rate);
            }
            println!("tokens/s ({tokens} tokens, {threads} thread(s)) {what}: {best:.1}");
        }
        return;
    }
    let cached = LlamaEngine::new(settings)
        .unwrap()
        .with_prompt_cache(256 << 20);
    plain.load(&model).await.unwrap();
    checkpointed.load(&model).await.unwrap();
    cached.load(&model).await.unwrap();

    // Tokens per second after the first token, alternating engines.
    let mut with = Vec::new();
    let mut without = Vec::new();
    for _ in 0..2 {
        for (engine, into) in [(&plain, &mut without), (&checkpointed, &mut with)] {
            let (first, total, deltas) = timed(engine, job(&model, tokens, None)).await;
            let rate = (deltas.len() as f64 - 1.0) / (total - first).as_secs_f64();
            into.push(rate);
        }
    }
    let best = |rates: &[f64]| rates.iter().copied().fold(0.0, f64::max);
    println!(
        "tokens/s ({tokens} tokens, {threads} thread(s)): without checkpoints {:.1}, with a checkpoint every {every} {:.1} ({:.1} %)",
        best(&without),
        best(&with),
        100.0 * best(&with) / best(&without)
    );

    // A repeated prompt's time to first token.
    let mut uncached = Vec::new();
    let mut repeated = Vec::new();
    for _ in 0..5 {
        uncached.push(ms(timed(&plain, job(&model, 2, None)).await.0));
        repeated.push(ms(timed(&cached, job(&model, 2, None)).await.0));
    }
    uncached.sort_by(f64::total_cmp);
    repeated.sort_by(f64::total_cmp);
    println!(
        "TTFT p50: a new prompt {:.1} ms, a repeated prompt from the cache {:.1} ms",
        uncached[2], repeated[2]
    );

    // Resume latency: the time to the first new delta, resuming after N tokens.
    for after in [100usize, 500, 1500, 3000] {
        if after > resume_max as usize {
            continue;
        }
        // Interrupted after `after` deltas, its checkpoints kept.
        let mut generation = checkpointed
            .generate(job(&model, after as u32 + 20, None))
            .await
            .unwrap();
        let mut seen = Vec::new();
        while seen.len() < after {
            match generation.next_item().await.unwrap() {
                Some(GenerationItem::Delta { text, state }) => seen.push((text, state)),
                _ => break,
            }
        }
        // Dropped, not stopped: a stop is a cancel, which removes the run's checkpoints.
        drop(generation);
        if seen.len() < after {
            continue;
        }
        checkpointed.checkpoints_settled().await;
        let point = ResumePoint {
            state: seen[after - 1].1.clone(),
            text_so_far: seen.iter().map(|(t, _)| t.as_str()).collect(),
        };
        let (with_checkpoint, _, _) = timed(
            &checkpointed,
            job(&model, after as u32 + 20, Some(point.clone())),
        )
        .await;
        let (from_prompt, _, _) = timed(&plain, job(&model, after as u32 + 20, Some(point))).await;
        println!(
            "resume after {after} tokens: {:.0} ms with checkpoints, {:.0} ms replaying from the prompt",
            ms(with_checkpoint),
            ms(from_prompt)
        );
    }
}

/// The median of the last 64 values (ms).
fn recent_median(values: &[f64]) -> f64 {
    let mut recent = values[values.len().saturating_sub(64)..].to_vec();
    recent.sort_by(f64::total_cmp);
    recent[recent.len() / 2]
}

/// `--copy-costs`: a context fed one token at a time (as a generation evaluates its output), and
/// every 256 tokens the time of one token's evaluation (median of the last 64) beside the time of
/// the two copies of the sequence state a checkpoint could make on the generating thread.
fn copy_costs(path: &str, threads: u32, tokens: u32) {
    use llama_cpp_2::context::params::LlamaContextParams;
    use llama_cpp_2::llama_backend::LlamaBackend;
    use llama_cpp_2::llama_batch::LlamaBatch;
    use llama_cpp_2::model::params::LlamaModelParams;
    use llama_cpp_2::model::LlamaModel;
    use llama_cpp_2::token::LlamaToken;
    use llama_cpp_2::LlamaStateSeqFlags;

    let backend = LlamaBackend::init().unwrap();
    let model = LlamaModel::load_from_file(&backend, path, &LlamaModelParams::default()).unwrap();
    let threads = i32::try_from(threads).unwrap();
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(tokens + 16))
        .with_n_batch(32)
        .with_n_ubatch(32)
        .with_n_seq_max(1)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
        .with_flash_attention_policy(0);
    let mut context = model.new_context(&backend, params).unwrap();
    let mut batch = LlamaBatch::new(32, 1);
    let dir = tempfile::tempdir().unwrap();
    let vocab = usize::try_from(model.n_vocab()).unwrap();
    let mut fed: Vec<LlamaToken> = Vec::new();
    let mut decode_ms = Vec::new();
    for i in 0..tokens as usize {
        let token = LlamaToken(i32::try_from(3 + (i * 7) % (vocab - 3)).unwrap());
        batch.clear();
        batch
            .add(token, i32::try_from(i).unwrap(), &[0], true)
            .unwrap();
        let start = Instant::now();
        context.decode(&mut batch).unwrap();
        decode_ms.push(ms(start.elapsed()));
        fed.push(token);
        if (i + 1) % 256 != 0 {
            continue;
        }
        let start = Instant::now();
        let state = context
            .state_seq_get(0, LlamaStateSeqFlags::empty())
            .unwrap();
        let get = ms(start.elapsed());
        let file = dir.path().join("state.kv");
        let start = Instant::now();
        context.state_seq_save_file(&file, 0, &fed).unwrap();
        let save = ms(start.elapsed());
        std::fs::remove_file(&file).unwrap();
        println!(
            "{:5} tokens: a token {:6.2} ms; the state {:5.1} MB: into a file {:6.2} ms, into a buffer {:6.2} ms",
            i + 1,
            recent_median(&decode_ms),
            state.byte_len() as f64 / 1e6,
            save,
            get
        );
    }
}
