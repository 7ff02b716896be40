//! The `lmsp` binary: the composition root. It reads flags and environment, builds the adapters,
//! hands them to the app, and serves; or runs an offline admin command on the data directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};

use lmsp_app::{CommitListeners, LiveEvents, Metrics, Service, Settings, SystemClock};
use lmsp_domain::auth::{Scope, Scopes};
use lmsp_domain::ports::{
    ClientStore, Clock, CommittedEvents, Engine, ModelFiles, ModelStore, Store,
};
use lmsp_domain::{ClientId, ModelId, ModelRecord, RestartPolicy};
use lmsp_engine_openai::{OpenAiEngine, OpenAiSettings};
use lmsp_engine_reference::{ReferenceEngine, ReferenceSettings};
use lmsp_http::{router, AppState, IdempotencyLocks};
use lmsp_models_fs::FsModelFiles;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

/// LMSP 1.0 local model service.
#[derive(Debug, Parser)]
#[command(name = "lmsp", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the service.
    Serve(ServeArgs),
    /// Manages clients on the data directory (works whether or not the server runs).
    #[command(subcommand)]
    Clients(ClientsCommand),
    /// Manages models on the data directory.
    #[command(subcommand)]
    Models(ModelsCommand),
}

#[derive(Debug, Args)]
struct DataDir {
    /// Where the database lives.
    #[arg(long, env = "LMSP_DATA_DIR", default_value = "./lmsp-data")]
    data_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SyncFlag {
    Full,
    Normal,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EngineFlag {
    Reference,
    Openai,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    data: DataDir,
    /// The address to listen on.
    #[arg(long, env = "LMSP_LISTEN", default_value = "127.0.0.1:8717")]
    listen: SocketAddr,
    /// Tasks run at once.
    #[arg(long, env = "LMSP_WORKERS", default_value_t = 4)]
    workers: usize,
    /// How long finished tasks are kept.
    #[arg(long, env = "LMSP_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// How often the purge job runs.
    #[arg(long, env = "LMSP_PURGE_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    purge_interval: Duration,
    /// How long idempotency keys are kept.
    #[arg(long, env = "LMSP_IDEMPOTENCY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    idempotency_ttl: Duration,
    /// The restart policy of tasks whose request names none.
    #[arg(long, env = "LMSP_DEFAULT_ON_RESTART", default_value = "fail")]
    default_on_restart: RestartPolicy,
    /// The directory model files must be inside (default: DATA_DIR/models).
    #[arg(long, env = "LMSP_MODELS_DIR")]
    models_dir: Option<PathBuf>,
    /// The engine.
    #[arg(long, env = "LMSP_ENGINE", value_enum, default_value = "reference")]
    engine: EngineFlag,
    /// The OpenAI-compatible server for `--engine openai`, e.g. `http://127.0.0.1:8080/v1`.
    #[arg(long, env = "LMSP_UPSTREAM", required_if_eq("engine", "openai"))]
    upstream: Option<String>,
    /// The reference engine's time to load a model.
    #[arg(long, env = "LMSP_REFERENCE_LOAD_DELAY", default_value = "0ms", value_parser = humantime::parse_duration)]
    reference_load_delay: Duration,
    /// The reference engine's time per token.
    #[arg(long, env = "LMSP_REFERENCE_TOKEN_DELAY", default_value = "0ms", value_parser = humantime::parse_duration)]
    reference_token_delay: Duration,
    /// The reference engine's time to notice a cancel.
    #[arg(long, env = "LMSP_REFERENCE_CANCEL_DELAY", default_value = "0ms", value_parser = humantime::parse_duration)]
    reference_cancel_delay: Duration,
    /// How long running tasks may finish after SIGTERM/SIGINT.
    #[arg(long, env = "LMSP_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// `full`: every commit is durable against power loss; `normal`: faster, may lose the last
    /// commits on power loss (never on a process crash).
    #[arg(long, env = "LMSP_SYNC", value_enum, default_value = "full")]
    sync: SyncFlag,
    /// Log format.
    #[arg(long, env = "LMSP_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
enum ClientsCommand {
    /// Adds a client and prints its token (one line).
    Add {
        /// A human name.
        #[arg(long)]
        name: String,
        /// A scope (repeatable): responses:write, responses:read, models:read, models:write, admin.
        #[arg(long = "scope", required = true)]
        scopes: Vec<Scope>,
        #[command(flatten)]
        data: DataDir,
    },
    /// Lists clients.
    List {
        #[command(flatten)]
        data: DataDir,
    },
    /// Revokes a client; its token stops working at once.
    Revoke {
        /// The client id (`cli_…`).
        id: String,
        #[command(flatten)]
        data: DataDir,
    },
}

#[derive(Debug, Subcommand)]
enum ModelsCommand {
    /// Registers a model file, hashing it with a progress bar.
    Add {
        /// The model id.
        id: String,
        /// The file.
        path: PathBuf,
        #[command(flatten)]
        data: DataDir,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve(args).await,
            Command::Clients(command) => clients(command).await,
            Command::Models(command) => models(command).await,
        }
    })
}

fn database_path(data_dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    Ok(data_dir.join("lmsp.db"))
}

fn open_store(
    data_dir: &Path,
    sync: SyncMode,
    hook: Option<Arc<dyn CommittedEvents>>,
) -> anyhow::Result<Arc<SqliteStore>> {
    let path = database_path(data_dir)?;
    let options = SqliteOptions {
        sync,
        ..SqliteOptions::default()
    };
    let store = match hook {
        Some(hook) => SqliteStore::open(&path, options, hook),
        None => SqliteStore::open_without_hook(&path, options),
    }
    .with_context(|| format!("cannot open the database {}", path.display()))?;
    Ok(Arc::new(store))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a terminal: a log file or a pipe gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let ready_timer = std::time::Instant::now();
    let live = LiveEvents::new();
    let metrics = Arc::new(Metrics::new());
    let sync = match args.sync {
        SyncFlag::Full => SyncMode::Full,
        SyncFlag::Normal => SyncMode::Normal,
    };
    let listeners = CommitListeners::new(vec![
        live.clone() as Arc<dyn CommittedEvents>,
        metrics.clone() as Arc<dyn CommittedEvents>,
    ]);
    let store = open_store(&args.data.data_dir, sync, Some(listeners))?;
    let models_dir = match &args.models_dir {
        Some(dir) => dir.clone(),
        None => args.data.data_dir.join("models"),
    };
    std::fs::create_dir_all(&models_dir).with_context(|| {
        format!(
            "cannot create the models directory {}",
            models_dir.display()
        )
    })?;
    let model_files: Arc<dyn ModelFiles> = Arc::new(FsModelFiles::new(models_dir.clone()));
    let engine: Arc<dyn Engine> = match args.engine {
        EngineFlag::Reference => Arc::new(ReferenceEngine::new(ReferenceSettings {
            load_delay: args.reference_load_delay,
            token_delay: args.reference_token_delay,
            cancel_delay: args.reference_cancel_delay,
        })),
        EngineFlag::Openai => Arc::new(OpenAiEngine::new(OpenAiSettings {
            base_url: args.upstream.clone().unwrap_or_default(),
            connect_timeout: Duration::from_secs(10),
        })?),
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let settings = Settings {
        workers: args.workers,
        retention: args.retention,
        purge_interval: args.purge_interval,
        idempotency_ttl: args.idempotency_ttl,
        default_on_restart: args.default_on_restart,
        version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let store_port: Arc<dyn Store> = store.clone();
    // Migrate (in open), then recover to completion (in start), then bind.
    let service = Service::start(
        store_port.clone(),
        engine,
        model_files.clone(),
        clock.clone(),
        live,
        metrics,
        settings,
    )
    .await?;
    if service.start_info().first_start {
        let (client, token) =
            lmsp_app::new_client("admin", Scopes::new([Scope::Admin]), clock.now());
        store_port.insert_client(client).await?;
        eprintln!("admin token (shown once): {}", token.expose());
    }
    register_reference_model(&store_port, &args.data.data_dir, clock.as_ref()).await?;
    register_models_dir(
        &store_port,
        model_files.as_ref(),
        &models_dir,
        clock.as_ref(),
    )
    .await;
    let state = AppState {
        service: service.clone(),
        in_flight: Arc::new(IdempotencyLocks::default()),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let workers = service.spawn_background();
    tracing::info!(address = %local, ready_ms = ready_timer.elapsed().as_millis() as u64, "listening");
    eprintln!("lmsp listening on http://{local}");
    let server = tokio::spawn(lmsp_http::server::serve(listener, router(state)));
    shutdown_signal().await;
    tracing::info!(
        "shutting down: no new work; running tasks get {:?}",
        args.shutdown_grace
    );
    service.begin_shutdown();
    let deadline = tokio::time::Instant::now() + args.shutdown_grace;
    while service.tasks_in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.abort();
    for worker in workers {
        worker.abort();
    }
    tracing::info!(left_running = service.tasks_in_flight(), "stopped");
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// Writes the built-in corpus to `DATA_DIR/models/reference.txt` and registers it, once.
async fn register_reference_model(
    store: &Arc<dyn Store>,
    data_dir: &Path,
    clock: &dyn Clock,
) -> anyhow::Result<()> {
    let id = ModelId::parse(ModelId::REFERENCE)?;
    if store.model(&id).await?.is_some() {
        return Ok(());
    }
    let dir = data_dir.join("models");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("reference.txt");
    lmsp_models_fs::write_reference_corpus(&path)?;
    let file = FsModelFiles::new(dir)
        .fingerprint(&path.to_string_lossy())
        .await?;
    store
        .insert_model(ModelRecord {
            id,
            format: String::from("text"),
            file,
            created_at: clock.now(),
        })
        .await?;
    Ok(())
}

/// Registers every regular file of the models directory whose stem is a free, valid model id.
async fn register_models_dir(
    store: &Arc<dyn Store>,
    files: &dyn ModelFiles,
    dir: &Path,
    clock: &dyn Clock,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let Ok(id) = ModelId::parse(stem) else {
            continue;
        };
        if !path.is_file() || matches!(store.model(&id).await, Ok(Some(_))) {
            continue;
        }
        match files.fingerprint(&path.to_string_lossy()).await {
            Ok(file) => {
                let format = lmsp_domain::model::format_of_path(&file.path);
                let record = ModelRecord {
                    id: id.clone(),
                    format,
                    file,
                    created_at: clock.now(),
                };
                if let Err(error) = store.insert_model(record).await {
                    tracing::warn!(model = %id, %error, "could not register model file");
                }
            }
            Err(error) => tracing::warn!(path = %path.display(), %error, "skipped model file"),
        }
    }
}

async fn clients(command: ClientsCommand) -> anyhow::Result<()> {
    match command {
        ClientsCommand::Add { name, scopes, data } => {
            let store = open_store(&data.data_dir, SyncMode::Full, None)?;
            let (client, token) =
                lmsp_app::new_client(&name, Scopes::new(scopes), SystemClock.now());
            store.insert_client(client).await?;
            println!("{}", token.expose());
        }
        ClientsCommand::List { data } => {
            let store = open_store(&data.data_dir, SyncMode::Full, None)?;
            for client in store.list_clients().await? {
                let scopes: Vec<_> = client.scopes.iter().map(|s| s.as_str()).collect();
                let state = if client.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                println!(
                    "{}\t{}\t{}\t{}",
                    client.id,
                    client.name,
                    scopes.join(","),
                    state
                );
            }
        }
        ClientsCommand::Revoke { id, data } => {
            let client_id =
                ClientId::parse(&id).map_err(|_| anyhow::anyhow!("`{id}` is not a client id"))?;
            let store = open_store(&data.data_dir, SyncMode::Full, None)?;
            if !store.revoke_client(client_id, SystemClock.now()).await? {
                bail!("no active client {id}");
            }
            println!("revoked {id}");
        }
    }
    Ok(())
}

async fn models(command: ModelsCommand) -> anyhow::Result<()> {
    let ModelsCommand::Add { id, path, data } = command;
    let model_id = ModelId::parse(&id)?;
    let store = open_store(&data.data_dir, SyncMode::Full, None)?;
    if store.model(&model_id).await?.is_some() {
        bail!("model `{id}` exists already");
    }
    let canonical =
        std::fs::canonicalize(&path).with_context(|| format!("cannot open {}", path.display()))?;
    let total = std::fs::metadata(&canonical)?.len();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("hashing {id}"));
    let progress = bar.clone();
    let hashed = canonical.clone();
    let file = tokio::task::spawn_blocking(move || {
        lmsp_models_fs::hash_file_with_progress(&hashed, move |done, _total| {
            progress.set_position(done)
        })
    })
    .await??;
    bar.finish_and_clear();
    let format = lmsp_domain::model::format_of_path(&file.path);
    let record = ModelRecord {
        id: model_id,
        format,
        file,
        created_at: SystemClock.now(),
    };
    println!(
        "{}\t{}\t{}",
        record.id, record.file.digest, record.file.path
    );
    if !store.insert_model(record).await? {
        bail!("model `{id}` exists already");
    }
    Ok(())
}
