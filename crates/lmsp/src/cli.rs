//! The command line: `lmsp serve` and the offline commands, every flag with its environment
//! variable. Values are checked here, so a bad one is refused with a message that says what is
//! expected.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::num::NonZeroU32;

use clap::{Args, Parser, Subcommand, ValueEnum};

use lmsp_app::LimitsUpdate;
use lmsp_domain::auth::Scope;
use lmsp_domain::RestartPolicy;

/// LMSP: a local model service. Paired clients submit inference work over HTTP (OpenAI's
/// Responses and chat completions APIs, or LMSP's own task API); the service runs it
/// asynchronously and never loses or corrupts a task across crashes, restarts and cancels.
#[derive(Debug, Parser)]
#[command(name = "lmsp", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the service (HTTP API, workers, recovery, purge).
    Serve(Box<ServeArgs>),
    /// Adds, lists and revokes clients, whether or not the server runs.
    #[command(subcommand)]
    Clients(ClientsCommand),
    /// Registers model files, whether or not the server runs.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Writes a consistent copy of the database to OUT, whether or not the server runs.
    Backup {
        /// The file to write (must not exist).
        out: PathBuf,
        #[command(flatten)]
        data: DataDir,
    },
}

/// Where the data lives.
#[derive(Debug, Clone, Args)]
pub struct DataDir {
    /// The data directory: holds the SQLite database `lmsp.db` (and, by default, the models
    /// directory).
    #[arg(long, env = "LMSP_DATA_DIR", default_value = "./lmsp-data")]
    pub data_dir: PathBuf,
    /// Store everything in this PostgreSQL database (`postgres://user@host/db`) instead of the
    /// data directory's SQLite file; any number of instances may share it.
    #[arg(long, env = "LMSP_DATABASE", value_parser = postgres_url)]
    pub database: Option<String>,
}

/// A `postgres://` or `postgresql://` URL.
fn postgres_url(text: &str) -> Result<String, String> {
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        Ok(text.to_owned())
    } else {
        Err(String::from(
            "a PostgreSQL URL, postgres://user@host:port/database (SQLite needs no --database: it \
             lives in --data-dir)",
        ))
    }
}

/// `--sync`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SyncFlag {
    /// Every commit is durable against power loss before any reply.
    Full,
    /// Faster; a power loss (not a crash) may lose the last commits.
    Normal,
}

/// `--engine`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum EngineFlag {
    /// The deterministic reference engine (text corpora).
    Reference,
    /// llama.cpp in process: registered GGUF files.
    Llama,
    /// An OpenAI-compatible upstream server (`--upstream`).
    Openai,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Plain lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|_| format!("`{text}` is not a duration (write e.g. 250ms, 30s, 10m, 7d)"))
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match duration(text)? {
        d if d.is_zero() => Err(String::from("must be longer than zero")),
        d => Ok(d),
    }
}

/// `lmsp serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub data: DataDir,
    /// The address to listen on (port 0 picks a free one, printed on stderr).
    #[arg(long, env = "LMSP_LISTEN", default_value = "127.0.0.1:8717")]
    pub listen: SocketAddr,
    /// Tasks run at once (1 or more).
    #[arg(long, env = "LMSP_WORKERS", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// How long finished tasks are kept after they finish.
    #[arg(long, env = "LMSP_RETENTION", default_value = "7d", value_parser = duration)]
    pub retention: Duration,
    /// How often the purge job removes finished tasks past the retention.
    #[arg(long, env = "LMSP_PURGE_INTERVAL", default_value = "60s", value_parser = positive_duration)]
    pub purge_interval: Duration,
    /// How long idempotency keys are kept.
    #[arg(long, env = "LMSP_IDEMPOTENCY_TTL", default_value = "24h", value_parser = positive_duration)]
    pub idempotency_ttl: Duration,
    /// The restart policy of tasks whose request names none.
    #[arg(long, env = "LMSP_DEFAULT_ON_RESTART", default_value = "fail",
          value_parser = ["fail", "retry", "resume"])]
    pub default_on_restart: String,
    /// The directory model files must be inside (default: DATA_DIR/models); its model files are
    /// registered at startup.
    #[arg(long, env = "LMSP_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// The engine for models that are not the built-in reference (which always runs on the
    /// reference engine).
    #[arg(long, env = "LMSP_ENGINE", value_enum, default_value = "reference")]
    pub engine: EngineFlag,
    /// The OpenAI-compatible server of `--engine openai`, e.g. `http://127.0.0.1:8080/v1`.
    #[arg(long, env = "LMSP_UPSTREAM", required_if_eq("engine", "openai"))]
    pub upstream: Option<String>,
    /// How long the upstream may take to accept a connection before the task fails with
    /// `timeout`.
    #[arg(long, env = "LMSP_UPSTREAM_CONNECT_TIMEOUT", default_value = "10s",
          value_parser = positive_duration)]
    pub upstream_connect_timeout: Duration,
    /// How long the upstream may take from a request to its first token (while it loads the
    /// model, queues the request or evaluates the prompt) before the task fails with `timeout`.
    #[arg(long, env = "LMSP_UPSTREAM_FIRST_TOKEN_TIMEOUT", default_value = "300s",
          value_parser = positive_duration)]
    pub upstream_first_token_timeout: Duration,
    /// How long the upstream may send nothing between two tokens before the task fails with
    /// `timeout`.
    #[arg(long, env = "LMSP_UPSTREAM_TOKEN_TIMEOUT", default_value = "30s",
          value_parser = positive_duration)]
    pub upstream_token_timeout: Duration,
    /// llama.cpp: CPU threads per generation (default: the cores divided among the workers).
    #[arg(long, env = "LMSP_LLAMA_THREADS")]
    pub llama_threads: Option<NonZeroU32>,
    /// llama.cpp: the most tokens (prompt and output) one generation's context holds.
    #[arg(long, env = "LMSP_LLAMA_CONTEXT", default_value = "4096")]
    pub llama_context: NonZeroU32,
    /// llama.cpp: the prompt chunk: prompts are evaluated in chunks of this many tokens starting
    /// at its multiples (outputs depend on it; the prompt cache reuses whole chunks); a cancel is
    /// noticed between two chunks.
    #[arg(long, env = "LMSP_LLAMA_BATCH", default_value = "32")]
    pub llama_batch: NonZeroU32,
    /// llama.cpp: idle contexts kept per loaded model for the next generations of the same size
    /// (making one costs about a millisecond of a first token; each holds its KV memory while
    /// idle; 0: none; default: --workers).
    #[arg(long, env = "LMSP_LLAMA_IDLE_CONTEXTS")]
    pub llama_idle_contexts: Option<usize>,
    /// llama.cpp: layers offloaded to the GPU (builds with the `cuda` or `metal` feature).
    #[arg(long, env = "LMSP_LLAMA_GPU_LAYERS")]
    pub llama_gpu_layers: Option<u32>,
    /// llama.cpp: output tokens before a generation's first KV checkpoint (saved under
    /// DATA_DIR/checkpoints/; a resume replays only the tokens after the newest); later ones
    /// come as often as those tokens cost to evaluate, so closer together as the context
    /// grows; 0: none.
    #[arg(long, env = "LMSP_CHECKPOINT_EVERY", default_value = "256")]
    pub checkpoint_every: u32,
    /// llama.cpp: the most bytes all KV checkpoints together take (the oldest go first).
    #[arg(long, env = "LMSP_CHECKPOINT_MAX_BYTES", default_value = "2147483648")]
    pub checkpoint_max_bytes: u64,
    /// llama.cpp: bytes of memory for the KV state of recent prompts, reused by requests that
    /// start with the same tokens; 0: no prompt cache.
    #[arg(long, env = "LMSP_PROMPT_CACHE_BYTES", default_value = "268435456")]
    pub prompt_cache_bytes: u64,
    /// The reference engine's time to load a model.
    #[arg(long, env = "LMSP_REFERENCE_LOAD_DELAY", default_value = "0ms", value_parser = duration)]
    pub reference_load_delay: Duration,
    /// The reference engine's time per token.
    #[arg(long, env = "LMSP_REFERENCE_TOKEN_DELAY", default_value = "0ms", value_parser = duration)]
    pub reference_token_delay: Duration,
    /// The reference engine's time to notice a cancel.
    #[arg(long, env = "LMSP_REFERENCE_CANCEL_DELAY", default_value = "0ms", value_parser = duration)]
    pub reference_cancel_delay: Duration,
    /// On SIGTERM/SIGINT: how long running tasks may still finish before the process exits.
    #[arg(long, env = "LMSP_SHUTDOWN_GRACE", default_value = "10s", value_parser = duration)]
    pub shutdown_grace: Duration,
    /// `full`: every commit is durable against power loss before any reply or event; `normal`:
    /// faster, but a power loss (not a crash) may lose the last commits.
    #[arg(long, env = "LMSP_SYNC", value_enum, default_value = "full")]
    pub sync: SyncFlag,
    /// Caps the database at this many pages (`PRAGMA max_page_count`, 4 KiB each), so that a
    /// full disk can be provoked without filling one: for fault tests and drills.
    #[arg(long, env = "LMSP_SQLITE_MAX_PAGES", hide = true)]
    pub sqlite_max_pages: Option<u32>,
    /// This instance's name on a shared database (`--database`): its incarnations share it, and a
    /// restarted one recovers its previous incarnation's tasks at once. Default: the host name.
    #[arg(long, env = "LMSP_INSTANCE")]
    pub instance: Option<String>,
    /// How long this instance's lease runs without renewal: when it has run out (a crash, a cut
    /// network), another instance recovers its tasks.
    #[arg(long, env = "LMSP_LEASE", default_value = "10s", value_parser = positive_duration)]
    pub lease: Duration,
    /// How long a queued task waits before it is claimed one service tier more urgently (`flex`
    /// as `default`, `default` as `priority`; again after each further period), so that no
    /// task waits forever behind more urgent work.
    #[arg(long, env = "LMSP_TIER_AGING", default_value = "5m", value_parser = positive_duration)]
    pub tier_aging: Duration,
    /// How many tasks may be queued in the whole service; past it a submit is answered 503
    /// `service_unavailable` with `Retry-After` and creates nothing. Default: no limit.
    #[arg(long, env = "LMSP_MAX_QUEUED", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_queued: Option<u32>,
    /// The largest file a client may upload (`POST /v1/files`), in bytes; a larger upload is
    /// answered 413 and nothing of it is kept.
    #[arg(long, env = "LMSP_MAX_FILE_BYTES", default_value_t = 200 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub max_file_bytes: u64,
    /// How long a webhook receiver has to answer one delivery attempt; no answer in time counts
    /// as a failed attempt, tried again later.
    #[arg(long, env = "LMSP_WEBHOOK_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub webhook_timeout: Duration,
    /// The wait before a failed webhook delivery is tried again the first time; it doubles with
    /// each attempt (±20 %), at most an hour apart.
    #[arg(long, env = "LMSP_WEBHOOK_RETRY_BASE", default_value = "1s", value_parser = positive_duration)]
    pub webhook_retry_base: Duration,
    /// How long after its event a webhook delivery is tried again before it is given up.
    #[arg(long, env = "LMSP_WEBHOOK_RETRY_FOR", default_value = "72h", value_parser = positive_duration)]
    pub webhook_retry_for: Duration,
    /// Log format on stderr (`RUST_LOG` filters, default `info`).
    #[arg(long, env = "LMSP_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// How long a client may take to send a request's headers, or to send its body after a
    /// pause, before it is answered 408 and closed.
    #[arg(long, env = "LMSP_REQUEST_TIMEOUT", default_value = "30s", value_parser = positive_duration)]
    pub request_timeout: Duration,
    /// How long an idle keep-alive connection stays open.
    #[arg(long, env = "LMSP_IDLE_TIMEOUT", default_value = "60s", value_parser = positive_duration)]
    pub idle_timeout: Duration,
    /// The most connections served at once; past it new connections get 503.
    #[arg(long, env = "LMSP_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
}

impl ServeArgs {
    /// The default restart policy.
    pub fn default_policy(&self) -> RestartPolicy {
        RestartPolicy::parse(&self.default_on_restart).unwrap_or_default()
    }
}

/// `lmsp clients …`.
#[derive(Debug, Subcommand)]
pub enum ClientsCommand {
    /// Adds a client: prints its id, then its token (shown once) on the last line.
    Add {
        /// A human name.
        #[arg(long)]
        name: String,
        /// A scope (repeatable): responses:write, responses:read, models:read, models:write, admin.
        #[arg(long = "scope", required = true, value_parser = parse_scope)]
        scopes: Vec<Scope>,
        #[command(flatten)]
        limits: LimitFlags,
        #[command(flatten)]
        data: DataDir,
    },
    /// Changes a client's limits (the flags given; `none` lifts one).
    Update {
        /// The client id (`cli_…`, as `lmsp clients list` shows it).
        id: String,
        #[command(flatten)]
        limits: LimitFlags,
        #[command(flatten)]
        data: DataDir,
    },
    /// Lists clients: id, name, scopes, state, created, limits.
    List {
        #[command(flatten)]
        data: DataDir,
    },
    /// Revokes a client; its token stops working at once.
    Revoke {
        /// The client id (`cli_…`, as `lmsp clients list` shows it).
        id: String,
        #[command(flatten)]
        data: DataDir,
    },
}

/// A client's limits on the command line.
#[derive(Debug, Clone, Args)]
pub struct LimitFlags {
    /// The most of its tasks that run at once (`none`: no limit); its other tasks wait while
    /// other clients' run.
    #[arg(long, value_parser = parse_limit)]
    pub max_running: Option<Limit>,
    /// The most of its tasks that may be queued (`none`: no limit); a submit past it is 429.
    #[arg(long, value_parser = parse_limit)]
    pub max_queued: Option<Limit>,
}

/// A limit: a number, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub Option<u32>);

fn parse_limit(text: &str) -> Result<Limit, String> {
    if text == "none" {
        return Ok(Limit(None));
    }
    text.parse::<u32>()
        .map(|n| Limit(Some(n)))
        .map_err(|_| format!("`{text}` is not a limit: a whole number from 0, or none"))
}

impl LimitFlags {
    /// The change the flags ask for.
    pub fn update(&self) -> LimitsUpdate {
        LimitsUpdate {
            max_running: self.max_running.map(|limit| limit.0),
            max_queued: self.max_queued.map(|limit| limit.0),
        }
    }
}

fn parse_scope(text: &str) -> Result<Scope, String> {
    Scope::parse(text).map_err(|e| e.to_string())
}

/// `lmsp models …`.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Registers a model file (`.gguf`, `.txt`) under ID, hashing it with a progress bar. Any
    /// readable file of the machine's owner may be registered this way.
    Add {
        /// The model id.
        id: String,
        /// The file.
        path: PathBuf,
        /// The models directory of the server that will run it (as its `--models-dir`; default
        /// DATA_DIR/models): a file inside it is stored by its path relative to it, which the
        /// server resolves against its own `--models-dir`.
        #[arg(long, env = "LMSP_MODELS_DIR")]
        models_dir: Option<PathBuf>,
        #[command(flatten)]
        data: DataDir,
    },
}
