//! Engine overhead: the same model streamed through LMSP and directly, in one run.
//!
//! The model is the tests' tiny GGUF model (`crates/engine-llama/tests/tiny`, written at run
//! time): its greedy output is known, every request generates exactly `--tokens` tokens, and its
//! tokens are so cheap (a fraction of a millisecond each) that it shows the service's own cost
//! per token at its largest; a real model's tokens take 10–100× longer, the overhead stays the
//! same. Four paths, each streamed `--requests` times per repetition, one request at a time:
//!
//! - **llama.cpp server, direct**: a streaming chat completion straight to llama.cpp's HTTP
//!   server (the pinned `xllamacpp` of `scripts/llamacpp-server-deps`);
//! - **LMSP → llama.cpp server**: `lmsp serve --engine openai` in front of that same server, a
//!   streaming `POST /v1/responses`;
//! - **llama-cpp-2 alone**: the binding in this process — load, context, prompt, greedy loop;
//! - **LMSP in process**: `lmsp serve --engine llama` on the same file.
//!
//! Time to first token (request sent → first text received) and tokens per second (after the
//! first token) for each, and each LMSP path beside its direct path: TTFT + Δ ms (p50) and the
//! tokens/s ratio. Targets: Δ ≤ 2 ms, tokens/s ≥ 95 %.
//!
//! Run: `cargo build --release -p lmsp -p lmsp-bench --bins && scripts/llamacpp-server-deps &&
//! target/release/engine-bench` (`--quick`: a few short requests).

#[path = "../../../engine-llama/tests/tiny/mod.rs"]
mod tiny;

use std::io::{BufRead, BufReader};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{json, Value};

use lmsp_bench::server::{find_lmsp, sibling_of_exe, Server};
use lmsp_bench::stats::{fmt_num, Latencies, Spread};

/// Measures LMSP's overhead over the engines it runs on.
#[derive(Debug, Parser)]
#[command(name = "engine-bench", version, about)]
struct Cli {
    /// A few short requests (CI's smoke test: asserts nothing about speed).
    #[arg(long)]
    quick: bool,
    /// Repetitions (default 3, 1 with --quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Requests per path and repetition (default 20, 3 with --quick).
    #[arg(long)]
    requests: Option<usize>,
    /// Tokens per request (default 1 000, 20 with --quick).
    #[arg(long)]
    tokens: Option<u64>,
    /// CPU threads for llama.cpp on every path.
    #[arg(long, default_value = "2")]
    threads: NonZeroU32,
    /// The `lmsp` binary (default: next to this executable; also env LMSP_BIN).
    #[arg(long)]
    lmsp_bin: Option<PathBuf>,
    /// The Python of the llama.cpp server venv (default: target/llamacpp-venv/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
}

/// The tiny model's context, and what one request may generate in it.
const CONTEXT: u32 = 2_048;

/// One path's samples over one repetition.
#[derive(Debug, Default)]
struct Samples {
    first_token: Latencies,
    tokens_per_second: Vec<f64>,
}

impl Samples {
    fn push(&mut self, stream: &Streamed) {
        self.first_token.push(stream.first_token);
        self.tokens_per_second.push(stream.tokens_per_second());
    }

    /// TTFT p50 (ms) and median tokens/s.
    fn summary(&mut self) -> (f64, f64) {
        let mut rates = self.tokens_per_second.clone();
        rates.sort_by(f64::total_cmp);
        let rate = rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN);
        (self.first_token.quantile_ms(0.5), rate)
    }
}

/// What one streamed request measured.
#[derive(Debug)]
struct Streamed {
    first_token: Duration,
    /// From the first text to the last.
    rest: Duration,
    tokens: u64,
    text: String,
}

impl Streamed {
    fn tokens_per_second(&self) -> f64 {
        let after_first = self.tokens.saturating_sub(1) as f64;
        after_first / self.rest.as_secs_f64().max(1e-9)
    }
}

/// Accumulates the text of a stream with the times of its first and last pieces.
struct Clock {
    sent: Instant,
    first: Option<Instant>,
    last: Instant,
    text: String,
}

impl Clock {
    fn start() -> Self {
        let now = Instant::now();
        Self {
            sent: now,
            first: None,
            last: now,
            text: String::new(),
        }
    }

    fn text(&mut self, piece: &str) {
        if piece.is_empty() {
            return;
        }
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = now;
        self.text.push_str(piece);
    }

    fn done(self, tokens: u64) -> anyhow::Result<Streamed> {
        let first = self
            .first
            .ok_or_else(|| anyhow!("the stream sent no text"))?;
        Ok(Streamed {
            first_token: first.duration_since(self.sent),
            rest: self.last.duration_since(first),
            tokens,
            text: self.text,
        })
    }
}

/// Reads an SSE response, handing each event's JSON to `on_event`; stops at `[DONE]`, at the
/// end of the body, or when `on_event` says so.
async fn read_events(
    response: reqwest::Response,
    mut on_event: impl FnMut(&Value) -> bool,
) -> anyhow::Result<()> {
    if !response.status().is_success() {
        bail!("the stream answered {}", response.status());
    }
    let mut events = response.bytes_stream().eventsource();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| anyhow!("the stream broke: {e}"))?;
        if event.data.trim() == "[DONE]" {
            break;
        }
        let value: Value = serde_json::from_str(&event.data).context("an event's JSON")?;
        if on_event(&value) {
            break;
        }
    }
    Ok(())
}

/// A streaming chat completion straight to llama.cpp's server.
async fn stream_direct(http: &reqwest::Client, api: &str, tokens: u64) -> anyhow::Result<Streamed> {
    let body = json!({
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": true,
        "max_tokens": tokens, "temperature": 0, "seed": 1,
        "stream_options": {"include_usage": true},
    });
    let mut clock = Clock::start();
    let request = http.post(format!("{api}/chat/completions")).json(&body);
    // llama.cpp's server closes idle keep-alive connections on its own schedule: a request sent
    // on one it just closed never reached it, so it is sent again (on a new connection).
    let response = match request.try_clone().map(|r| r.send()) {
        Some(sent) => match sent.await {
            Ok(response) => response,
            Err(error) if error.is_request() || error.is_connect() => {
                clock = Clock::start();
                request.send().await?
            }
            Err(error) => return Err(error.into()),
        },
        None => request.send().await?,
    };
    let mut counted = 0;
    read_events(response, |chunk| {
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            clock.text(text);
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            counted = n;
        }
        false
    })
    .await?;
    clock.done(counted)
}

/// A streaming `POST /v1/responses` through LMSP.
async fn stream_lmsp(
    http: &reqwest::Client,
    server: &Server,
    model: &str,
    tokens: u64,
) -> anyhow::Result<Streamed> {
    let body = json!({
        "model": model, "input": "hi", "stream": true, "max_output_tokens": tokens,
        "temperature": 0, "seed": 1,
    });
    let mut clock = Clock::start();
    let response = http
        .post(server.url("/v1/responses"))
        .bearer_auth(&server.token)
        .json(&body)
        .send()
        .await?;
    let mut counted = 0;
    read_events(response, |event| {
        match event["type"].as_str() {
            Some("response.output_text.delta") => {
                clock.text(event["delta"].as_str().unwrap_or_default());
            }
            Some("response.completed" | "response.failed" | "response.incomplete") => {
                counted = event["response"]["usage"]["output_tokens"]
                    .as_u64()
                    .unwrap_or(0);
                return true;
            }
            _ => {}
        }
        false
    })
    .await?;
    clock.done(counted)
}

/// The binding alone, in this process: the model loaded once, then per request a context, the
/// templated prompt and a greedy loop, as `lmsp-engine-llama` does.
mod binding {
    use std::num::NonZeroU32;
    use std::path::Path;

    use anyhow::{anyhow, Context};
    use llama_cpp_2::context::params::LlamaContextParams;
    use llama_cpp_2::llama_backend::LlamaBackend;
    use llama_cpp_2::llama_batch::LlamaBatch;
    use llama_cpp_2::model::params::LlamaModelParams;
    use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
    use llama_cpp_2::sampling::LlamaSampler;

    use super::{Clock, Streamed, CONTEXT};

    pub struct Binding {
        backend: LlamaBackend,
        model: LlamaModel,
        threads: i32,
    }

    impl Binding {
        pub fn load(path: &Path, threads: NonZeroU32) -> anyhow::Result<Self> {
            let mut backend = LlamaBackend::init().map_err(|e| anyhow!("llama.cpp: {e}"))?;
            backend.void_logs();
            let model = LlamaModel::load_from_file(&backend, path, &LlamaModelParams::default())
                .map_err(|e| anyhow!("cannot load {}: {e}", path.display()))?;
            Ok(Self {
                backend,
                model,
                threads: i32::try_from(threads.get()).unwrap_or(1),
            })
        }

        pub fn stream(&self, tokens: u64) -> anyhow::Result<Streamed> {
            let mut clock = Clock::start();
            let template = self
                .model
                .chat_template(None)
                .map_err(|e| anyhow!("no chat template: {e}"))?;
            let chat = [LlamaChatMessage::new("user".into(), "hi".into())
                .map_err(|e| anyhow!("the message: {e}"))?];
            let prompt = self
                .model
                .apply_chat_template(&template, &chat, true)
                .map_err(|e| anyhow!("the chat template: {e}"))?;
            let vocab = self.model.vocab();
            let prompt = vocab.tokenize(prompt.as_bytes(), true, true);
            let params = LlamaContextParams::default()
                .with_n_ctx(NonZeroU32::new(CONTEXT))
                .with_n_batch(CONTEXT)
                .with_n_threads(self.threads)
                .with_n_threads_batch(self.threads);
            let mut context = self
                .model
                .new_context(&self.backend, params)
                .context("a context")?;
            let mut batch = LlamaBatch::new(usize::try_from(CONTEXT)?, 1);
            let last = prompt.len() - 1;
            for (index, &token) in prompt.iter().enumerate() {
                batch.add(token, i32::try_from(index)?, &[0], index == last)?;
            }
            context.decode(&mut batch).context("the prompt")?;
            let mut sampler = LlamaSampler::greedy();
            // Bytes of a character not yet complete (a character of several tokens).
            let mut pending: Vec<u8> = Vec::new();
            let mut position = prompt.len();
            let mut produced = 0;
            let mut logits_at = batch.n_tokens() - 1;
            while produced < tokens {
                let token = sampler.sample(&context, logits_at);
                if vocab.is_eog(token) {
                    break;
                }
                pending.extend(vocab.token_to_piece(token, false, None));
                if let Ok(text) = std::str::from_utf8(&pending) {
                    clock.text(text);
                    pending.clear();
                }
                produced += 1;
                batch.clear();
                batch.add(token, i32::try_from(position)?, &[0], true)?;
                context.decode(&mut batch).context("a token")?;
                position += 1;
                logits_at = 0;
            }
            clock.done(produced)
        }
    }
}

/// llama.cpp's HTTP server (xllamacpp) on the tiny model, killed when dropped.
struct LlamaCppServer {
    child: Child,
    api: String,
}

impl LlamaCppServer {
    fn start(python: &Path, model: &Path, threads: NonZeroU32) -> anyhow::Result<Self> {
        let serve = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/llamacpp/serve.py");
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut child = Command::new(python)
            .arg(&serve)
            .arg(model)
            .arg(port.to_string())
            .args([
                "--threads",
                &threads.to_string(),
                "--ctx",
                &CONTEXT.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "cannot run {} (install it with scripts/llamacpp-server-deps)",
                    python.display()
                )
            })?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let first = BufReader::new(stdout).lines().next().transpose()?;
        if !first
            .as_deref()
            .is_some_and(|l| l.starts_with("listening "))
        {
            let _ = child.kill();
            bail!("llama.cpp's server did not start: {first:?}");
        }
        Ok(Self {
            child,
            api: format!("http://127.0.0.1:{port}/v1"),
        })
    }
}

impl Drop for LlamaCppServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The medians of one path over the repetitions.
#[derive(Debug, Default)]
struct PathFigures {
    first_token_ms: Spread,
    tokens_per_second: Spread,
}

impl PathFigures {
    fn push(&mut self, samples: &mut Samples) {
        let (first_token, rate) = samples.summary();
        self.first_token_ms.push(first_token);
        self.tokens_per_second.push(rate);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let reps = cli.reps.unwrap_or(if cli.quick { 1 } else { 3 });
    let requests = cli.requests.unwrap_or(if cli.quick { 3 } else { 20 });
    let tokens = cli.tokens.unwrap_or(if cli.quick { 20 } else { 1_000 });
    if tokens + 32 > u64::from(CONTEXT) {
        bail!("--tokens must leave room for the prompt in the tiny model's {CONTEXT} context");
    }
    let lmsp = find_lmsp(cli.lmsp_bin.as_deref())?;
    let python = match cli.python {
        Some(python) => python,
        None => sibling_of_exe("../llamacpp-venv/bin/python")?,
    };
    let work = tempfile::tempdir()?;
    let model = work.path().join("tiny.gguf");
    tiny::write(&model, Some(tiny::CHATML));
    let expected = tiny::next_text(b'\n', usize::try_from(tokens)?);
    let http = reqwest::Client::builder().build()?;
    let threads = cli.threads.to_string();

    println!(
        "engine overhead: the tiny GGUF model, {requests} streamed requests of {tokens} tokens per \
         path and repetition, {reps} repetitions, {threads} llama.cpp threads; load {}",
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );

    let upstream = LlamaCppServer::start(&python, &model, cli.threads)?;
    let upstream_dir = work.path().join("upstream");
    let upstream_service = Server::start(
        &lmsp,
        &upstream_dir,
        &[
            "--engine",
            "openai",
            "--upstream",
            &upstream.api,
            "--workers",
            "1",
        ],
    )?;
    let registered = http
        .post(upstream_service.url("/v1/models"))
        .bearer_auth(&upstream_service.token)
        .json(&json!({"id": "tiny", "upstream_model": "tiny"}))
        .send()
        .await?;
    if !registered.status().is_success() {
        bail!(
            "cannot register the upstream model: {}",
            registered.status()
        );
    }
    let local_dir = work.path().join("local");
    std::fs::create_dir_all(local_dir.join("models"))?;
    std::fs::copy(&model, local_dir.join("models/tiny.gguf"))?;
    let local_service = Server::start(
        &lmsp,
        &local_dir,
        &[
            "--engine",
            "llama",
            "--workers",
            "1",
            "--llama-threads",
            &threads,
        ],
    )?;
    let binding = binding::Binding::load(&model, cli.threads)?;

    let names = [
        "llama.cpp server, direct",
        "LMSP → llama.cpp server (--engine openai)",
        "llama-cpp-2 alone, in process",
        "LMSP in process (--engine llama)",
    ];
    let mut figures: Vec<PathFigures> = names.iter().map(|_| PathFigures::default()).collect();
    let paths = Paths {
        http: &http,
        api: &upstream.api,
        upstream_service: &upstream_service,
        local_service: &local_service,
        binding: &binding,
    };
    // A warm-up request on every path (model pages, connections, the first context).
    for index in 0..names.len() {
        paths.stream(index, 8).await?;
    }
    for _ in 0..reps {
        for (index, figure) in figures.iter_mut().enumerate() {
            let mut samples = Samples::default();
            for _ in 0..requests {
                let streamed = paths.stream(index, tokens).await?;
                if streamed.text != expected || streamed.tokens != tokens {
                    bail!(
                        "{}: {} tokens of unexpected text {:?}",
                        names[index],
                        streamed.tokens,
                        streamed.text.chars().take(40).collect::<String>()
                    );
                }
                samples.push(&streamed);
            }
            figure.push(&mut samples);
        }
    }

    println!();
    println!("| path | time to first token, p50 (min / median / max) | tokens/s after the first (min / median / max) |");
    println!("| --- | --- | --- |");
    for (name, figure) in names.iter().zip(&figures) {
        println!(
            "| {name} | {} ms | {} |",
            figure.first_token_ms.format(2),
            figure.tokens_per_second.format(0)
        );
    }
    println!();
    println!(
        "| LMSP path | vs | TTFT + Δ (p50, medians) | target | tokens/s ratio | target | met? |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (through, direct) in [(1, 0), (3, 2)] {
        let delta =
            figures[through].first_token_ms.median() - figures[direct].first_token_ms.median();
        let ratio = figures[through].tokens_per_second.median()
            / figures[direct].tokens_per_second.median();
        let met = delta <= 2.0 && ratio >= 0.95;
        println!(
            "| {} | {} | {} ms | ≤ 2 ms | {} % | ≥ 95 % | {} |",
            names[through],
            names[direct],
            fmt_num(delta, 2),
            fmt_num(ratio * 100.0, 1),
            if met { "yes" } else { "**no**" }
        );
    }
    drop(local_service);
    drop(upstream_service);
    Ok(())
}

/// What a request needs on each of the four paths, in the order of the tables: the llama.cpp
/// server directly, LMSP in front of it, the binding alone, LMSP in process.
struct Paths<'a> {
    http: &'a reqwest::Client,
    /// The llama.cpp server's API root.
    api: &'a str,
    /// `lmsp serve --engine openai` in front of that server.
    upstream_service: &'a Server,
    /// `lmsp serve --engine llama` on the same model file.
    local_service: &'a Server,
    binding: &'a binding::Binding,
}

impl Paths<'_> {
    /// Streams one request of `tokens` tokens on path `index`.
    async fn stream(&self, index: usize, tokens: u64) -> anyhow::Result<Streamed> {
        match index {
            0 => stream_direct(self.http, self.api, tokens).await,
            1 => stream_lmsp(self.http, self.upstream_service, "tiny", tokens).await,
            2 => tokio::task::block_in_place(|| self.binding.stream(tokens)),
            _ => stream_lmsp(self.http, self.local_service, "tiny", tokens).await,
        }
    }
}
