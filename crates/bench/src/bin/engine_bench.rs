//! Engine overhead: the same GGUF model streamed through LMSP and directly, in one run.
//!
//! The model is `--model PATH`, or by default the tests' tiny GGUF model
//! (`crates/engine-llama/tests/tiny`, written at run time): its greedy output is known, every
//! request generates exactly `--tokens` tokens, and its tokens are so cheap (a fraction of a
//! millisecond each) that it shows the service's own cost per token at its largest. A real model
//! (e.g. SmolLM2 of `scripts/smollm2-model`) runs greedy with seed 1 on a prompt that makes long
//! output; its outputs are not known in advance, so the harness reports the tokens each path
//! actually generated.
//!
//! 1. **Four paths**, each streamed `--requests` times per repetition, one request at a time:
//!    llama.cpp's server directly (the pinned `xllamacpp` of `scripts/llamacpp-server-deps`),
//!    `lmsp serve --engine openai` in front of it, the llama-cpp-2 binding alone in this
//!    process, and `lmsp serve --engine llama` on the same file (with its default checkpoints,
//!    and again with `--checkpoint-every 0`): time to first token and tokens per second.
//! 2. **LMSP in process beside llama.cpp's server**: time to first token p50 for a new prompt
//!    (a system message that starts with a number never sent before) and for a repeated one
//!    (LMSP's prompt cache, llama.cpp's `cache_prompt` slot cache); tokens per second with 1
//!    stream and with 4 at once (llama.cpp `--parallel 4`, LMSP `--workers 4`); with and without
//!    checkpoints; each beside its target.
//! 3. **Resume latency**: a background task with `on_restart: "resume"`, its service killed with
//!    SIGKILL after N text deltas (100, 500, 1 500, 3 000; capped by the context), started again,
//!    and timed from the restarted process's spawn (and from its "listening" line) to the resumed
//!    run's first text delta on the task's event stream, with and without checkpoints.
//!
//!    Each kill also notes the newest KV checkpoint in place (the tokens a resume replays come
//!    after it), and `--resume-kills N` kills N times per point, with checkpoints at evenly
//!    spread phases of one checkpoint interval (resume.rs), so that a point's figure (their
//!    mean) does not hang on where its one kill fell between two checkpoints.
//!
//! `--only checkpoints` measures the checkpoint cost alone: LMSP in process with and without
//! checkpoints, alternating request by request, without llama.cpp's server; `--only resume
//! --resume-with-checkpoints-only` the resume latency with checkpoints alone.
//!
//! Run: `cargo build --release --workspace --bins && scripts/llamacpp-server-deps &&
//! target/release/engine-bench [--model target/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]`
//! (`--quick`: a few short requests, every path and phase at tiny sizes; CI's smoke test).

#[path = "../../../engine-llama/tests/tiny/mod.rs"]
mod tiny;

#[path = "engine_bench/binding.rs"]
mod binding;
#[path = "engine_bench/llamacpp.rs"]
mod llamacpp;
#[path = "engine_bench/resume.rs"]
mod resume;
#[path = "engine_bench/stream.rs"]
mod stream;

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::json;

use lmsp_bench::server::{find_lmsp, sibling_of_exe, Server};
use lmsp_bench::stats::{fmt_num, Latencies, Spread};

use llamacpp::LlamaCppServer;
use resume::{Kill, ResumeSample};
use stream::{aggregate_rate, stream_direct, stream_lmsp, Ask, Streamed};

/// Measures LMSP's overhead over the engines it runs on.
#[derive(Debug, Parser)]
#[command(name = "engine-bench", version, about)]
struct Cli {
    /// A few short requests, every phase at tiny sizes (CI's smoke test: asserts nothing about
    /// speed).
    #[arg(long)]
    quick: bool,
    /// The GGUF model file (default: the tests' tiny model, written at run time).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Repetitions (default 3, 1 with --quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Streamed requests per path and repetition (default 20 on the tiny model, 3 on a
    /// --model, 2 with --quick).
    #[arg(long)]
    requests: Option<usize>,
    /// Tokens per streamed request (default 1 000, 20 with --quick).
    #[arg(long)]
    tokens: Option<u64>,
    /// Time-to-first-token requests per path, kind and repetition (default 10, 2 with --quick).
    #[arg(long)]
    ttft_requests: Option<usize>,
    /// Rounds of 4 concurrent streams per path and repetition (default 2, 1 with --quick).
    #[arg(long)]
    rounds: Option<usize>,
    /// Resume points: kill after this many text deltas, in turn (default 100,500,1500,3000,
    /// 8,40 with --quick; capped by the context).
    #[arg(long, value_delimiter = ',')]
    resume_after: Option<Vec<u64>>,
    /// LMSP's `--checkpoint-every` where checkpoints are on (default 256, 8 with --quick).
    #[arg(long)]
    checkpoint_every: Option<u32>,
    /// Context per sequence, every path (the tiny model: its 2 048; default 4 096, LMSP's).
    #[arg(long)]
    context: Option<u32>,
    /// CPU threads for llama.cpp on every single-stream path (4 streams: llama.cpp's server
    /// keeps these, LMSP's 4 workers take its default, the cores divided among them).
    #[arg(long, default_value = "2")]
    threads: NonZeroU32,
    /// The `lmsp` binary (default: next to this executable; also env LMSP_BIN).
    #[arg(long)]
    lmsp_bin: Option<PathBuf>,
    /// The Python of the llama.cpp server venv (default: target/llamacpp-venv/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Only these phases (default: paths,ttft,streams,resume, i.e. everything): `paths` (every
    /// path one request at a time, with the checkpoints figure), `ttft`, `streams` (4 at once),
    /// `checkpoints` (LMSP in process with and without checkpoints alone, alternating request by
    /// request: the checkpoint cost without the other paths), `resume`. llama.cpp's server
    /// starts only for the phases that compare with it.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Option<Vec<Phase>>,
    /// Kills per resume point (default 1). With checkpoints, at evenly spread phases of the
    /// checkpoint interval that starts at or after the point, so that a point's figure (their
    /// mean) does not hang on where a kill falls between two checkpoints (a resume replays the
    /// tokens after the newest one); without, spread over the next `--checkpoint-every` deltas.
    #[arg(long, default_value = "1")]
    resume_kills: NonZeroU32,
    /// The resume phase without its "without checkpoints" chains (they replay the whole output
    /// at every restart: minutes at 3 000 tokens on a real model).
    #[arg(long)]
    resume_with_checkpoints_only: bool,
}

/// A phase of the run (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Phase {
    Paths,
    Ttft,
    Streams,
    Checkpoints,
    Resume,
}

/// The room kept for the prompt in the context.
const PROMPT_ROOM: u64 = 96;

/// The system message of the streamed requests.
const SYSTEM: &str = "You are a helpful assistant.";
/// A user message the real model answers at length (greedy SmolLM2 counts on for thousands of
/// tokens); the tiny model's output does not depend on it.
const LONG_OUTPUT: &str = "Write the numbers from 1000 to 5000, one per line.";
/// The fixed part of the time-to-first-token prompts' system message (a couple of hundred
/// tokens, so that evaluating it shows).
const TTFT_SYSTEM: &str = "You answer questions about the Harbour Street lending library. \
    The library opens at nine in the morning and closes at seven in the evening on weekdays, \
    and at four in the afternoon on Saturdays; it is closed on Sundays and public holidays. \
    Members may borrow up to twelve items at once: books for three weeks, films and music for \
    one week, and magazines for one week, except the current issue, which stays in the \
    reading room. Loans may be renewed twice online or at the desk unless another member has \
    reserved the item. Late returns cost twenty cents a day per item, up to the price of the \
    item; children's items are never fined. A lost card is replaced for two euros. The \
    reading room is silent; the study rooms on the first floor may be booked for two hours a \
    day, up to a week ahead. Printing costs ten cents a page in black and white and fifty in \
    colour. Answer briefly and politely, and say so when you do not know.";
const TTFT_USER: &str = "When does the library close on Saturdays?";

static NONCE: AtomicU64 = AtomicU64::new(1);

/// A time-to-first-token request: a new prompt (its system message starts with a number never
/// sent before), or always the same.
fn ttft_ask(new: bool) -> Ask {
    let number = if new {
        NONCE.fetch_add(1, Ordering::Relaxed)
    } else {
        0
    };
    Ask {
        system: format!("Conversation {number}. {TTFT_SYSTEM}"),
        user: TTFT_USER.to_owned(),
        tokens: 2,
    }
}

/// Per path: time to first token (p50 per repetition), tokens per second (median per
/// repetition), and the tokens each request generated.
#[derive(Debug, Default)]
struct PathFigures {
    first_token_ms: Spread,
    tokens_per_second: Spread,
    tokens: Vec<u64>,
    prompt_tokens: Vec<u64>,
    cached_tokens: Vec<u64>,
}

impl PathFigures {
    fn push_rep(&mut self, streams: &[Streamed]) {
        let mut first = Latencies::default();
        let mut rates: Vec<f64> = Vec::new();
        for stream in streams {
            first.push(stream.first_token());
            rates.push(stream.tokens_per_second());
            self.note(stream);
        }
        rates.sort_by(f64::total_cmp);
        self.first_token_ms.push(first.quantile_ms(0.5));
        self.tokens_per_second
            .push(rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN));
    }

    fn note(&mut self, stream: &Streamed) {
        self.tokens.push(stream.tokens);
        self.prompt_tokens.extend(stream.prompt_tokens);
        self.cached_tokens.extend(stream.cached_tokens);
    }

    fn tokens_range(&self) -> String {
        range(&self.tokens)
    }
}

/// A spread of ratios as percentages, `min / median / max`.
fn percent(ratios: &Spread) -> String {
    if ratios.is_empty() {
        return String::from("not run");
    }
    format!(
        "{} / {} / {}",
        fmt_num(ratios.min() * 100.0, 1),
        fmt_num(ratios.median() * 100.0, 1),
        fmt_num(ratios.max() * 100.0, 1)
    )
}

/// `a` or `a–b` over the values.
fn range(values: &[u64]) -> String {
    match (values.iter().min(), values.iter().max()) {
        (Some(min), Some(max)) if min == max => min.to_string(),
        (Some(min), Some(max)) => format!("{min}–{max}"),
        _ => String::from("?"),
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A phase starts (on stderr, with the time and the load).
fn progress(phase: &str) {
    eprintln!(
        "engine-bench: {phase} ({}; load {})",
        chrono::Utc::now().format("%H:%M:%S"),
        load()
    );
}

fn met(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

/// What the run needs of every service and server.
struct Setup {
    http: reqwest::Client,
    lmsp: PathBuf,
    work: tempfile::TempDir,
    models: PathBuf,
    context: u32,
}

impl Setup {
    /// `lmsp serve --engine llama` on the bench model, with its own data directory.
    fn llama_args(&self, workers: u32, threads: Option<u32>, every: u32) -> Vec<String> {
        let mut args: Vec<String> = [
            "--engine",
            "llama",
            "--models-dir",
            &self.models.to_string_lossy(),
            "--llama-context",
            &self.context.to_string(),
            "--workers",
            &workers.to_string(),
            "--checkpoint-every",
            &every.to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if let Some(threads) = threads {
            args.extend(["--llama-threads".to_owned(), threads.to_string()]);
        }
        args
    }

    fn start(&self, name: &str, args: &[String]) -> anyhow::Result<Server> {
        let dir = self.work.path().join(name);
        std::fs::create_dir_all(&dir)?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start(&self.lmsp, &dir, &args).with_context(|| format!("LMSP {name}"))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let quick = cli.quick;
    let phases = cli
        .only
        .clone()
        .unwrap_or_else(|| vec![Phase::Paths, Phase::Ttft, Phase::Streams, Phase::Resume]);
    let runs = |phase: Phase| phases.contains(&phase);
    let reps = cli.reps.unwrap_or(if quick { 1 } else { 3 });
    let is_tiny = cli.model.is_none();
    let requests = cli.requests.unwrap_or(match (quick, is_tiny) {
        (true, _) => 2,
        (false, true) => 20,
        (false, false) => 3,
    });
    let tokens = cli.tokens.unwrap_or(if quick { 20 } else { 1_000 });
    let ttft_requests = cli.ttft_requests.unwrap_or(if quick { 2 } else { 10 });
    let rounds = cli.rounds.unwrap_or(if quick { 1 } else { 2 });
    let every = cli.checkpoint_every.unwrap_or(if quick { 8 } else { 256 });
    let context = if is_tiny {
        tiny::CONTEXT_LENGTH
    } else {
        cli.context.unwrap_or(4_096)
    };
    if tokens + PROMPT_ROOM > u64::from(context) {
        bail!("--tokens must leave room for the prompt in the {context}-token context");
    }
    let lmsp = find_lmsp(cli.lmsp_bin.as_deref())?;
    let needs_server = runs(Phase::Paths) || runs(Phase::Ttft) || runs(Phase::Streams);
    let python = match (cli.python, needs_server) {
        (Some(python), _) => python,
        (None, true) => sibling_of_exe("../llamacpp-venv/bin/python")?,
        (None, false) => PathBuf::new(),
    };
    let work = tempfile::tempdir()?;
    let models = work.path().join("models");
    std::fs::create_dir_all(&models)?;
    let model = models.join("bench.gguf");
    let label = match &cli.model {
        Some(path) => {
            if std::fs::hard_link(path, &model).is_err() {
                std::fs::copy(path, &model)
                    .with_context(|| format!("cannot copy {}", path.display()))?;
            }
            path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into(),
            )
        }
        None => {
            tiny::write(&model, Some(tiny::CHATML));
            String::from("the tiny test model")
        }
    };
    // The tiny model's greedy output after a prompt that ends with a newline.
    let expected = is_tiny.then(|| tiny::next_text(b'\n', usize::try_from(tokens).unwrap_or(0)));
    let setup = Setup {
        http: reqwest::Client::builder().build()?,
        lmsp,
        work,
        models,
        context,
    };
    let threads = cli.threads.get();
    let long = Ask {
        system: SYSTEM.to_owned(),
        // The tiny model spends a token on each character of the prompt.
        user: if is_tiny { "hi" } else { LONG_OUTPUT }.to_owned(),
        tokens,
    };

    println!(
        "engine-bench: {label}, context {context}, {requests} streamed requests of {tokens} \
         tokens per path and repetition, {reps} repetitions, {threads} llama.cpp threads, \
         greedy, seed 1; phases {phases:?}; load {}",
        load()
    );

    // llama.cpp's server, 4 slots (one stream uses one); LMSP in front of it.
    let upstream = if needs_server {
        Some(LlamaCppServer::start(&python, &model, cli.threads, context, 4).context("llama.cpp")?)
    } else {
        None
    };
    let upstream_service = match &upstream {
        Some(upstream) if runs(Phase::Paths) => {
            let service = setup.start(
                "upstream",
                &[
                    "--engine",
                    "openai",
                    "--upstream",
                    &upstream.api,
                    "--workers",
                    "1",
                ]
                .map(str::to_owned),
            )?;
            let registered = setup
                .http
                .post(service.url("/v1/models"))
                .bearer_auth(&service.token)
                .json(&json!({"id": "upstream", "upstream_model": "bench"}))
                .send()
                .await?;
            if !registered.status().is_success() {
                bail!(
                    "cannot register the upstream model: {}",
                    registered.status()
                );
            }
            Some(service)
        }
        _ => None,
    };
    // LMSP in process: its defaults (checkpoints on), without checkpoints, and 4 workers.
    let in_process = runs(Phase::Paths) || runs(Phase::Ttft) || runs(Phase::Checkpoints);
    let local = if in_process {
        Some(setup.start("local", &setup.llama_args(1, Some(threads), every))?)
    } else {
        None
    };
    let plain = if runs(Phase::Paths) || runs(Phase::Checkpoints) {
        Some(setup.start("plain", &setup.llama_args(1, Some(threads), 0))?)
    } else {
        None
    };
    let four = if runs(Phase::Streams) {
        Some(setup.start("four", &setup.llama_args(4, None, every))?)
    } else {
        None
    };
    let binding = if runs(Phase::Paths) {
        Some(binding::Binding::load(&model, cli.threads, context)?)
    } else {
        None
    };

    let paths = Paths {
        http: &setup.http,
        api: upstream.as_ref().map(|u| u.api.as_str()),
        upstream_service: upstream_service.as_ref(),
        local: local.as_ref(),
        plain: plain.as_ref(),
        binding: binding.as_ref(),
    };
    let names = [
        "llama.cpp server, direct".to_owned(),
        "LMSP → llama.cpp server (--engine openai)".to_owned(),
        "llama-cpp-2 alone, in process".to_owned(),
        format!("LMSP in process (--engine llama, --checkpoint-every {every})"),
        "LMSP in process (--engine llama, --checkpoint-every 0)".to_owned(),
    ];
    // A warm-up request on every path that runs (model pages, connections, the first context).
    let warm = Ask {
        tokens: 8,
        ..long.clone()
    };
    for index in 0..names.len() {
        if paths.has(index) {
            paths.stream(index, &warm).await?;
        }
    }
    let check = |name: &str, streamed: &Streamed| -> anyhow::Result<()> {
        if let Some(expected) = &expected {
            if streamed.text != *expected || streamed.tokens != tokens {
                bail!(
                    "{name}: {} tokens of unexpected text {:?}",
                    streamed.tokens,
                    streamed.text.chars().take(40).collect::<String>()
                );
            }
        } else if streamed.tokens == 0 {
            bail!("{name}: no tokens");
        }
        Ok(())
    };

    // 1. Every path, one request at a time.
    let mut figures: Vec<PathFigures> = names.iter().map(|_| PathFigures::default()).collect();
    let mut load_streams = String::new();
    if runs(Phase::Paths) {
        progress("every path, one request at a time");
        for _ in 0..reps {
            for (index, figure) in figures.iter_mut().enumerate() {
                let mut streams = Vec::new();
                for _ in 0..requests {
                    let streamed = paths.stream(index, &long).await?;
                    check(&names[index], &streamed)?;
                    streams.push(streamed);
                }
                figure.push_rep(&streams);
            }
        }
        load_streams = load();
    }

    // 1b. LMSP in process with and without checkpoints alone, alternating request by request
    // (with, without, without, with, …: a drift of the machine's load hits both alike).
    let mut checkpointed: [PathFigures; 2] = Default::default();
    let mut paired = Spread::default();
    let mut load_checkpoints = String::new();
    if runs(Phase::Checkpoints) {
        progress("with and without checkpoints, alternating");
        for _ in 0..reps {
            let mut streams: [Vec<Streamed>; 2] = Default::default();
            for request in 0..requests {
                let order = if request % 2 == 0 { [0, 1] } else { [1, 0] };
                for slot in order {
                    let streamed = paths.stream(3 + slot, &long).await?;
                    check(&names[3 + slot], &streamed)?;
                    streams[slot].push(streamed);
                }
                let with = &streams[0][request];
                let without = &streams[1][request];
                paired.push(with.tokens_per_second() / without.tokens_per_second());
            }
            for (slot, streams) in streams.iter().enumerate() {
                checkpointed[slot].push_rep(streams);
            }
        }
        load_checkpoints = load();
    }

    // 2a. Time to first token, a new and a repeated prompt: llama.cpp's server and LMSP.
    let ttft_paths = [0usize, 3];
    let mut ttft_new: Vec<PathFigures> =
        ttft_paths.iter().map(|_| PathFigures::default()).collect();
    let mut ttft_repeated: Vec<PathFigures> =
        ttft_paths.iter().map(|_| PathFigures::default()).collect();
    let mut load_ttft = String::new();
    if runs(Phase::Ttft) {
        progress("time to first token");
        for _ in 0..reps {
            for (slot, &index) in ttft_paths.iter().enumerate() {
                let mut new = Vec::new();
                for _ in 0..ttft_requests {
                    new.push(paths.stream(index, &ttft_ask(true)).await?);
                }
                ttft_new[slot].push_rep(&new);
                // The first of the same prompt fills the caches; the others are measured.
                paths.stream(index, &ttft_ask(false)).await?;
                let mut repeated = Vec::new();
                for _ in 0..ttft_requests {
                    repeated.push(paths.stream(index, &ttft_ask(false)).await?);
                }
                ttft_repeated[slot].push_rep(&repeated);
            }
        }
        load_ttft = load();
    }

    // 2b. Four streams at once: llama.cpp's server (4 slots) and LMSP (4 workers).
    let mut concurrent = [Spread::default(), Spread::default()];
    let mut concurrent_tokens: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    let mut load_concurrent = String::new();
    if let (Some(upstream), Some(four)) = (&upstream, &four) {
        progress("4 streams at once");
        for _ in 0..reps {
            for (slot, concurrent) in concurrent.iter_mut().enumerate() {
                let mut rates = Vec::new();
                for _ in 0..rounds {
                    let streams: Vec<_> = (0..4)
                        .map(|_| async {
                            if slot == 0 {
                                stream_direct(&setup.http, &upstream.api, &long).await
                            } else {
                                stream_lmsp(&setup.http, four, "bench", &long).await
                            }
                        })
                        .collect();
                    let streams = futures::future::try_join_all(streams).await?;
                    for streamed in &streams {
                        check(
                            if slot == 0 {
                                "llama.cpp, 4 streams"
                            } else {
                                "LMSP, 4 streams"
                            },
                            streamed,
                        )?;
                        concurrent_tokens[slot].push(streamed.tokens);
                    }
                    rates.push(aggregate_rate(&streams));
                }
                rates.sort_by(f64::total_cmp);
                concurrent.push(rates[rates.len() / 2]);
            }
        }
        load_concurrent = load();
    }
    drop(four);
    drop(local);
    drop(plain);
    drop(upstream_service);
    drop(upstream);

    // 3. Resume latency, with and without checkpoints.
    // The resume task asks for all the context leaves after the prompt; a point is counted in
    // text deltas, fewer than tokens where a character takes several (the tiny model's "€"), so
    // the points stop at three quarters of that, leaving room to run on past the last one (the
    // task must still be running when its service is killed). 3 000 on a 4 096 context.
    let room = u64::from(context).saturating_sub(PROMPT_ROOM);
    let cap = room * 3 / 4;
    let wanted_points = cli.resume_after.clone().unwrap_or_else(|| {
        if quick {
            vec![8, 40]
        } else {
            vec![100, 500, 1_500, 3_000]
        }
    });
    let mut points: Vec<u64> = wanted_points.iter().map(|&p| p.min(cap)).collect();
    points.dedup();
    // Each point's kills, tagged with its index. With checkpoints, at evenly spread phases of
    // the checkpoint interval that starts at or after the point (resume.rs); without (a resume
    // replays the whole output, whatever the phase), spread over the next `every` deltas.
    let kills_per_point = u64::from(cli.resume_kills.get());
    let mut spread_kills: Vec<(usize, Kill)> = Vec::new();
    let mut last = None;
    for (index, &point) in points.iter().enumerate() {
        for kill in 0..kills_per_point {
            let at = (point + kill * u64::from(every) / kills_per_point).min(room * 7 / 8);
            if last.is_none_or(|last| at > last) {
                spread_kills.push((index, Kill::At(at)));
                last = Some(at);
            }
        }
    }
    let phased_kills: Vec<(usize, Kill)> = points
        .iter()
        .enumerate()
        .flat_map(|(group, &point)| {
            (0..kills_per_point).map(move |index| {
                let of = kills_per_point;
                (group, Kill::Phase { point, index, of })
            })
        })
        .collect();
    let resume_ask = Ask {
        tokens: room,
        ..long.clone()
    };
    let mut resumes: [Vec<Vec<ResumeSample>>; 2] = [Vec::new(), Vec::new()];
    let mut load_resume = String::new();
    if runs(Phase::Resume) {
        progress("resume latency");
        let chains: &[u32] = if cli.resume_with_checkpoints_only {
            &[every]
        } else {
            &[every, 0]
        };
        for rep in 0..reps {
            for (slot, &checkpoints) in chains.iter().enumerate() {
                let dir = setup
                    .work
                    .path()
                    .join(format!("resume-{rep}-{checkpoints}"));
                std::fs::create_dir_all(&dir)?;
                let args = setup.llama_args(1, Some(threads), checkpoints);
                let kills = if checkpoints > 0 && every > 0 {
                    &phased_kills
                } else {
                    &spread_kills
                };
                let samples = resume::chain(
                    &setup.http,
                    &setup.lmsp,
                    &dir,
                    &args,
                    "bench",
                    &resume_ask,
                    kills,
                )
                .await?;
                resumes[slot].push(samples);
            }
        }
        load_resume = load();
    }

    print_tables(&Report {
        phases: &phases,
        names: &names,
        figures: &figures,
        checkpointed: &checkpointed,
        paired: &paired,
        ttft_new: &ttft_new,
        ttft_repeated: &ttft_repeated,
        concurrent: &concurrent,
        concurrent_tokens: &concurrent_tokens,
        resumes: &resumes,
        kills_per_point,
        points: &points,
        wanted_points: &wanted_points,
        every,
        threads,
        context,
        loads: [
            load_streams,
            load_checkpoints,
            load_ttft,
            load_concurrent,
            load_resume,
        ],
    });
    Ok(())
}

struct Report<'a> {
    phases: &'a [Phase],
    names: &'a [String],
    figures: &'a [PathFigures],
    checkpointed: &'a [PathFigures; 2],
    paired: &'a Spread,
    ttft_new: &'a [PathFigures],
    ttft_repeated: &'a [PathFigures],
    concurrent: &'a [Spread; 2],
    concurrent_tokens: &'a [Vec<u64>; 2],
    resumes: &'a [Vec<Vec<ResumeSample>>; 2],
    /// Which point each kill of a chain belongs to.
    kills_per_point: u64,
    points: &'a [u64],
    wanted_points: &'a [u64],
    every: u32,
    threads: u32,
    context: u32,
    loads: [String; 5],
}

impl Report<'_> {
    fn ran(&self, phase: Phase) -> bool {
        self.phases.contains(&phase)
    }
}

fn print_tables(r: &Report<'_>) {
    if r.ran(Phase::Paths) {
        print_paths(r);
    }
    if r.ran(Phase::Checkpoints) {
        print_checkpoints(r);
    }
    if r.ran(Phase::Paths) || r.ran(Phase::Ttft) || r.ran(Phase::Streams) {
        print_beside_server(r);
    }
    if r.ran(Phase::Resume) {
        print_resumes(r);
    }
}

fn print_paths(r: &Report<'_>) {
    let load_streams = &r.loads[0];
    println!();
    println!("Every path, one streamed request at a time (load after: {load_streams}):");
    println!();
    println!(
        "| path | time to first token, p50 (min / median / max) | tokens/s after the first (min / median / max) | tokens per request |"
    );
    println!("| --- | --- | --- | --- |");
    for (name, figure) in r.names.iter().zip(r.figures) {
        println!(
            "| {name} | {} ms | {} | {} |",
            figure.first_token_ms.format(2),
            figure.tokens_per_second.format(0),
            figure.tokens_range()
        );
    }
    println!();
    println!(
        "| LMSP path | vs | TTFT + Δ (p50, medians) | target | tokens/s ratio | target | met? |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (through, direct) in [(1, 0), (3, 2)] {
        let delta =
            r.figures[through].first_token_ms.median() - r.figures[direct].first_token_ms.median();
        let ratio = r.figures[through].tokens_per_second.median()
            / r.figures[direct].tokens_per_second.median();
        println!(
            "| {} | {} | {} ms | ≤ 2 ms | {} % | ≥ 95 % | {} |",
            r.names[through],
            r.names[direct],
            fmt_num(delta, 2),
            fmt_num(ratio * 100.0, 1),
            met(delta <= 2.0 && ratio >= 0.95)
        );
    }
}

/// The `checkpoints` phase: LMSP in process with and without checkpoints alone.
fn print_checkpoints(r: &Report<'_>) {
    let load = &r.loads[1];
    println!();
    println!(
        "LMSP in process with and without checkpoints, alternating request by request, {} \
         threads; medians of the repetitions (min / median / max); load after: {load}:",
        r.threads
    );
    println!();
    println!("| path | time to first token, p50 | tokens/s after the first | tokens per request |");
    println!("| --- | --- | --- | --- |");
    for (name, figure) in r.names[3..].iter().zip(r.checkpointed) {
        println!(
            "| {name} | {} ms | {} | {} |",
            figure.first_token_ms.format(2),
            figure.tokens_per_second.format(0),
            figure.tokens_range()
        );
    }
    let [with, without] = r.checkpointed;
    let ratio = with.tokens_per_second.median() / without.tokens_per_second.median();
    println!();
    println!("| figure | without | with | target | met? |");
    println!("| --- | --- | --- | --- | --- |");
    println!(
        "| tokens/s, 1 stream, checkpoints (every {}) alone, with / without | {} | {} | ≥ 95 % of without ({} %; paired requests {} %) | {} |",
        r.every,
        without.tokens_per_second.format(0),
        with.tokens_per_second.format(0),
        fmt_num(ratio * 100.0, 1),
        percent(r.paired),
        met(ratio >= 0.95)
    );
}

/// LMSP in process beside llama.cpp's server: the rows of the phases that ran.
fn print_beside_server(r: &Report<'_>) {
    let [_, _, load_ttft, load_concurrent, _] = &r.loads;
    let server = &r.figures[0];
    let lmsp = &r.figures[3];
    let plain = &r.figures[4];
    println!();
    println!(
        "LMSP in process (--engine llama, {} threads, --checkpoint-every {}) beside llama.cpp's \
         server (xllamacpp, {} threads, --parallel 4, cache_prompt); medians of the repetitions \
         (min / median / max); load after TTFT: {load_ttft}, after 4 streams: {load_concurrent}:",
        r.threads, r.every, r.threads
    );
    println!();
    println!("| figure | llama.cpp server | LMSP in process | target | met? |");
    println!("| --- | --- | --- | --- | --- |");
    let cached = |f: &PathFigures| {
        format!(
            "prompt {} tokens, cached {}",
            range(&f.prompt_tokens),
            range(&f.cached_tokens)
        )
    };
    if r.ran(Phase::Ttft) {
        println!(
            "| TTFT p50, a new prompt ({} / {}) | {} ms | {} ms | — (reported) | — |",
            cached(&r.ttft_new[0]),
            cached(&r.ttft_new[1]),
            r.ttft_new[0].first_token_ms.format(2),
            r.ttft_new[1].first_token_ms.format(2),
        );
        let delta =
            r.ttft_repeated[1].first_token_ms.median() - r.ttft_repeated[0].first_token_ms.median();
        println!(
            "| TTFT p50, a repeated prompt ({} / {}) | {} ms | {} ms | ≤ llama.cpp's + 2 ms (Δ {} ms) | {} |",
            cached(&r.ttft_repeated[0]),
            cached(&r.ttft_repeated[1]),
            r.ttft_repeated[0].first_token_ms.format(2),
            r.ttft_repeated[1].first_token_ms.format(2),
            fmt_num(delta, 2),
            met(delta <= 2.0)
        );
    }
    if r.ran(Phase::Paths) {
        let ratio = lmsp.tokens_per_second.median() / server.tokens_per_second.median();
        println!(
            "| tokens/s, 1 stream ({} / {} tokens) | {} | {} | ≥ 95 % of llama.cpp's ({} %) | {} |",
            server.tokens_range(),
            lmsp.tokens_range(),
            server.tokens_per_second.format(0),
            lmsp.tokens_per_second.format(0),
            fmt_num(ratio * 100.0, 1),
            met(ratio >= 0.95)
        );
        let ratio_plain = plain.tokens_per_second.median() / server.tokens_per_second.median();
        println!(
            "| tokens/s, 1 stream, LMSP without checkpoints ({} tokens) | {} | {} | ≥ 95 % of llama.cpp's ({} %) | {} |",
            plain.tokens_range(),
            server.tokens_per_second.format(0),
            plain.tokens_per_second.format(0),
            fmt_num(ratio_plain * 100.0, 1),
            met(ratio_plain >= 0.95)
        );
    }
    if r.ran(Phase::Streams) {
        let ratio4 = r.concurrent[1].median() / r.concurrent[0].median();
        println!(
            "| tokens/s, 4 streams at once, all together (LMSP --workers 4; {} / {} tokens) | {} | {} | ≥ 95 % of llama.cpp's ({} %) | {} |",
            range(&r.concurrent_tokens[0]),
            range(&r.concurrent_tokens[1]),
            r.concurrent[0].format(0),
            r.concurrent[1].format(0),
            fmt_num(ratio4 * 100.0, 1),
            met(ratio4 >= 0.95)
        );
    }
    if r.ran(Phase::Paths) {
        let ratio_checkpoints = lmsp.tokens_per_second.median() / plain.tokens_per_second.median();
        println!(
            "| tokens/s, 1 stream, LMSP with checkpoints (every {}) / without | {} | {} | ≥ 95 % of without ({} %) | {} |",
            r.every,
            plain.tokens_per_second.format(0),
            lmsp.tokens_per_second.format(0),
            fmt_num(ratio_checkpoints * 100.0, 1),
            met(ratio_checkpoints >= 0.95)
        );
    }
}

fn print_resumes(r: &Report<'_>) {
    let load_resume = &r.loads[4];
    println!();
    if r.points != r.wanted_points {
        println!(
            "The {}-token context caps the resume points: {:?} asked, {:?} run.",
            r.context, r.wanted_points, r.points
        );
    }
    println!(
        "Resume latency: one task (on_restart resume, greedy), its service killed with SIGKILL \
         after N text deltas, started again; to the resumed run's first text delta on the \
         task's event stream, from the restarted process's spawn / from its \"listening\" line \
         (recovery done); medians of the repetitions (min / median / max); load after: \
         {load_resume}:"
    );
    println!();
    let kills = r.kills_per_point;
    if kills > 1 {
        println!(
            "{kills} kills per point; with checkpoints at evenly spread phases of the checkpoint \
             interval that starts at or after the point (the i-th of n at (i + ½) / n of the \
             spacing before it), without checkpoints spread over the next {} text deltas; each \
             chain's figure for a point is the mean of its kills.",
            r.every
        );
        println!();
    }
    println!(
        "| killed after (text deltas stored) | with checkpoints (every {}): spawn → next delta | listening → next delta | slowest kill, spawn → next delta | tokens replayed after the newest checkpoint (≈) | without checkpoints: spawn → next delta | listening → next delta |",
        r.every
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    // Per chain, the mean (or the largest) over the kills of point `at`.
    let over_kills = |slot: usize, at: usize, pick: fn(&ResumeSample) -> f64, slowest: bool| {
        let mut spread = Spread::default();
        for chain in &r.resumes[slot] {
            let values: Vec<f64> = chain
                .iter()
                .filter(|sample| sample.group == at)
                .map(pick)
                .collect();
            if values.is_empty() {
                continue;
            }
            spread.push(if slowest {
                values.iter().copied().fold(f64::MIN, f64::max)
            } else {
                values.iter().sum::<f64>() / values.len() as f64
            });
        }
        spread
    };
    let spread =
        |slot: usize, at: usize, pick: fn(&ResumeSample) -> f64| over_kills(slot, at, pick, false);
    let from_start = |s: &ResumeSample| s.from_start.as_secs_f64() * 1_000.0;
    let from_listening = |s: &ResumeSample| s.from_listening.as_secs_f64() * 1_000.0;
    for (at, point) in r.points.iter().enumerate() {
        let of_point = |slot: usize| {
            r.resumes[slot]
                .iter()
                .flat_map(|chain| chain.iter())
                .filter(move |sample| sample.group == at)
        };
        let stored: Vec<u64> = of_point(0).chain(of_point(1)).map(|s| s.stored).collect();
        let replayed: Vec<u64> = of_point(0)
            .map(|s| s.stored.saturating_sub(s.checkpoint.unwrap_or(0)))
            .collect();
        let ms = |spread: Spread| match spread.is_empty() {
            true => String::from("—"),
            false => format!("{} ms", spread.format(0)),
        };
        println!(
            "| {point} ({}) | {} | {} | {} | {} | {} | {} |",
            range(&stored),
            ms(spread(0, at, from_start)),
            ms(spread(0, at, from_listening)),
            ms(over_kills(0, at, from_start, true)),
            range(&replayed),
            ms(spread(1, at, from_start)),
            ms(spread(1, at, from_listening)),
        );
    }
    if r.points.len() >= 2 {
        let base = if r.points.len() >= 3 { 1 } else { 0 };
        let last = r.points.len() - 1;
        println!();
        println!("| resume target | spawn → next delta | met? |");
        println!("| --- | --- | --- |");
        for (slot, what) in [(0, "with checkpoints"), (1, "without checkpoints")] {
            if r.resumes[slot].is_empty() {
                continue;
            }
            let after_last = spread(slot, last, from_start).median();
            let after_base = spread(slot, base, from_start).median();
            println!(
                "| {what}: after {} ≤ 1.2 × after {} | {} ms vs 1.2 × {} ms = {} ms ({}×) | {} |",
                r.points[last],
                r.points[base],
                fmt_num(after_last, 0),
                fmt_num(after_base, 0),
                fmt_num(after_base * 1.2, 0),
                fmt_num(after_last / after_base, 2),
                met(after_last <= 1.2 * after_base)
            );
            if kills > 1 {
                let after_last = over_kills(slot, last, from_start, true).median();
                let after_base = over_kills(slot, base, from_start, true).median();
                println!(
                    "| {what}, the slowest of each point's kills: after {} ≤ 1.2 × after {} | {} ms vs 1.2 × {} ms = {} ms ({}×) | {} |",
                    r.points[last],
                    r.points[base],
                    fmt_num(after_last, 0),
                    fmt_num(after_base, 0),
                    fmt_num(after_base * 1.2, 0),
                    fmt_num(after_last / after_base, 2),
                    met(after_last <= 1.2 * after_base)
                );
            }
        }
    }
}

/// What a request needs on each path, in the order of the first table: the llama.cpp server
/// directly, LMSP in front of it, the binding alone, LMSP in process with checkpoints, without;
/// `None` where the phases that run do not need the path.
struct Paths<'a> {
    http: &'a reqwest::Client,
    /// The llama.cpp server's API root.
    api: Option<&'a str>,
    /// `lmsp serve --engine openai` in front of that server.
    upstream_service: Option<&'a Server>,
    /// `lmsp serve --engine llama` on the same model file, checkpoints on.
    local: Option<&'a Server>,
    /// The same, `--checkpoint-every 0`.
    plain: Option<&'a Server>,
    binding: Option<&'a binding::Binding>,
}

impl Paths<'_> {
    /// Whether path `index` is up.
    fn has(&self, index: usize) -> bool {
        match index {
            0 => self.api.is_some(),
            1 => self.upstream_service.is_some(),
            2 => self.binding.is_some(),
            3 => self.local.is_some(),
            _ => self.plain.is_some(),
        }
    }

    /// Streams one request on path `index`.
    async fn stream(&self, index: usize, ask: &Ask) -> anyhow::Result<Streamed> {
        let missing = || anyhow::anyhow!("path {index} is not up in this run's phases");
        match index {
            0 => stream_direct(self.http, self.api.ok_or_else(missing)?, ask).await,
            1 => {
                let service = self.upstream_service.ok_or_else(missing)?;
                stream_lmsp(self.http, service, "upstream", ask).await
            }
            2 => {
                let binding = self.binding.ok_or_else(missing)?;
                tokio::task::block_in_place(|| binding.stream(ask))
            }
            3 => stream_lmsp(self.http, self.local.ok_or_else(missing)?, "bench", ask).await,
            _ => stream_lmsp(self.http, self.plain.ok_or_else(missing)?, "bench", ask).await,
        }
    }
}
