//! `lmsp serve`: the startup order (lock the data directory, open and migrate the store, start
//! the service — which initializes, registers this instance and recovers to completion — then
//! bind, then serve), and the graceful stop.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use lmsp_app::{Adapters, Engines, Listener, Service, Settings, SystemClock};
use lmsp_domain::ports::{Clock, Engine, ModelFiles, Store, StoreListener};
use lmsp_domain::EngineKind;
use lmsp_engine_llama::{LlamaEngine, LlamaSettings};
use lmsp_engine_openai::{OpenAiEngine, OpenAiSettings};
use lmsp_engine_reference::{ReferenceEngine, ReferenceSettings};
use lmsp_http::server::{ServerLimits, ServerStop};
use lmsp_http::{router, AppState};
use lmsp_models_fs::FsModelFiles;
use lmsp_storage_postgres::{PostgresOptions, PostgresStore};
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

use crate::cli::{EngineFlag, ServeArgs, SyncFlag};
use crate::datadir;
use crate::logging;
use crate::offline;

/// Runs the service until SIGTERM/SIGINT (exit 0 after the grace) or a fatal loss (non-zero).
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    datadir::private_files();
    let logs = logging::install(args.log_format);
    let ready_timer = std::time::Instant::now();
    // Taken before anything is opened or recovered: a second server here changes nothing. A
    // shared PostgreSQL database needs no lock: its instances coordinate through leases.
    let _lock = match args.data.database {
        Some(_) => None,
        None => Some(datadir::lock(&args.data.data_dir)?),
    };
    // Bound before the store is opened: a start that cannot listen changes nothing (no database,
    // no identity or admin token, no recovery). Nothing is accepted before recovery is done.
    let tcp = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let listener = Listener::new();
    listener
        .metrics
        .count_dropped_log_lines(Box::new(logs.dropped()));
    let sync = match args.sync {
        SyncFlag::Full => SyncMode::Full,
        SyncFlag::Normal => SyncMode::Normal,
    };
    let heard = listener.clone() as Arc<dyn StoreListener>;
    let store: Arc<dyn Store> = match &args.data.database {
        Some(url) => Arc::new(
            PostgresStore::connect(url, PostgresOptions::default(), heard)
                .await
                .with_context(|| format!("cannot open the database {}", offline::redacted(url)))?,
        ),
        None => {
            let path = datadir::database_path(&args.data.data_dir);
            let options = SqliteOptions {
                sync,
                max_page_count: args.sqlite_max_pages,
                ..SqliteOptions::default()
            };
            Arc::new(
                SqliteStore::open(&path, options, heard)
                    .with_context(|| format!("cannot open the database {}", path.display()))?,
            )
        }
    };
    let models_dir = args
        .models_dir
        .clone()
        .unwrap_or_else(|| args.data.data_dir.join("models"));
    std::fs::create_dir_all(&models_dir).with_context(|| {
        format!(
            "cannot create the models directory {}",
            models_dir.display()
        )
    })?;
    let model_files: Arc<dyn ModelFiles> = Arc::new(FsModelFiles::new(models_dir));
    let reference: Arc<dyn Engine> = Arc::new(ReferenceEngine::new(ReferenceSettings {
        load_delay: args.reference_load_delay,
        token_delay: args.reference_token_delay,
        cancel_delay: args.reference_cancel_delay,
    }));
    let mut engines = Engines::new().with(EngineKind::Reference, reference);
    if let EngineFlag::Openai = args.engine {
        let upstream = OpenAiEngine::new(OpenAiSettings {
            base_url: args.upstream.clone().unwrap_or_default(),
            connect_timeout: args.upstream_connect_timeout,
            first_token_timeout: args.upstream_first_token_timeout,
            token_timeout: args.upstream_token_timeout,
        })?;
        engines = engines.with(EngineKind::Upstream, Arc::new(upstream));
    }
    if let EngineFlag::Llama = args.engine {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let per_worker = (cores / usize::from(args.workers).max(1)).max(1);
        let defaults = LlamaSettings::default();
        let llama = LlamaEngine::new(LlamaSettings {
            threads: args
                .llama_threads
                .or(NonZeroU32::new(u32::try_from(per_worker).unwrap_or(1))),
            context_size: args.llama_context,
            batch_size: args.llama_batch,
            gpu_layers: args.llama_gpu_layers.unwrap_or(defaults.gpu_layers),
        })?;
        engines = engines.with(EngineKind::Llama, Arc::new(llama));
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut settings = Settings::with_defaults(env!("CARGO_PKG_VERSION"));
    settings.workers = usize::from(args.workers);
    settings.retention = args.retention;
    settings.purge_interval = args.purge_interval;
    settings.idempotency_ttl = args.idempotency_ttl;
    settings.default_on_restart = args.default_policy();
    settings.lease = args.lease;
    if args.data.database.is_some() {
        settings.instance_name = args.instance.clone().unwrap_or_else(host_name);
        // Notifications from other instances may be lost (a dropped LISTEN connection): a poll
        // now and then catches the cancels they carried.
        settings.poll_fallback = Some(Duration::from_secs(1));
    }
    let adapters = Adapters {
        store,
        engines,
        model_files,
        clock,
    };
    let started = Service::start(adapters, listener, settings).await?;
    let service = started.service;
    if let Some(token) = &started.admin_token {
        logs.announce(
            "admin token (shown once): {}",
            "admin token (shown once)",
            ("token", token.expose()),
        );
    }
    let local = tcp.local_addr()?;
    service.spawn_background();
    tracing::info!(address = %local, ready_ms = ready_timer.elapsed().as_millis() as u64, "listening");
    logs.announce(
        "lmsp listening on {}",
        "listening",
        ("address", &format!("http://{local}")),
    );
    let limits = ServerLimits {
        request_timeout: args.request_timeout,
        idle_timeout: args.idle_timeout,
        max_connections: args.max_connections as usize,
    };
    let stop = ServerStop::new();
    let server = tokio::spawn(lmsp_http::server::serve(
        tcp,
        router(AppState {
            service: service.clone(),
        }),
        limits,
        stop.clone(),
    ));
    let fatal = tokio::select! {
        () = shutdown_signal() => false,
        () = service.failed() => true,
    };
    if fatal {
        tracing::error!("this instance cannot go on; exiting so that it can be started afresh");
    } else {
        tracing::info!(
            "shutting down: no new work; running tasks get {:?}",
            args.shutdown_grace
        );
    }
    service.begin_shutdown();
    let idle = service.wait_until_idle(args.shutdown_grace).await;
    // Waiting requests get their 503 and streams end at an event boundary, then connections close.
    service.stop().await;
    stop.stop(Duration::from_secs(2)).await;
    server.abort();
    tracing::info!(left_running = !idle, "stopped");
    if fatal {
        anyhow::bail!("the instance's lease was lost");
    }
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
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

/// The host's name, the default instance name on a shared database.
fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| String::from("lmsp"))
}
