//! `lmsp serve`: the startup order (lock the data directory, open and migrate the store, start
//! the service — which initializes, registers this instance and recovers to completion — then
//! bind, then serve), and the graceful stop. It also fits the connection limit to the open-files
//! limit, and turns a SQLite writer that failed past its restarts into a non-zero exit, so that
//! the process never serves behind a dead writer.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use lmsp_app::{Adapters, Engines, Listener, Service, Settings, SystemClock, WebhookSettings};
use lmsp_domain::ports::{Clock, Engine, FileContents, ModelFiles, Store, StoreListener};
use lmsp_domain::webhooks::RetryPolicy;
use lmsp_domain::{EngineKind, TierAging};
use lmsp_engine_llama::{CheckpointSettings, LlamaEngine, LlamaSettings};
use lmsp_engine_openai::{OpenAiEngine, OpenAiSettings};
use lmsp_engine_reference::{ReferenceEngine, ReferenceSettings};
use lmsp_http::server::{ServerLimits, ServerStop};
use lmsp_http::wire::batches::HttpBatchWire;
use lmsp_http::{router, AppState};
use lmsp_models_fs::FsModelFiles;
use lmsp_storage_postgres::{PostgresOptions, PostgresStore};
use lmsp_storage_sqlite::{FileDir, SqliteOptions, SqliteStore, SyncMode, WriterStatus};
use lmsp_webhook_sender::HttpWebhookSender;
use tokio::sync::watch;

use crate::cli::{EngineFlag, ServeArgs, SyncFlag};
use crate::datadir;
use crate::logging;
use crate::offline;

/// Runs the service until SIGTERM/SIGINT (exit 0 after the grace) or a fatal loss (non-zero).
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let logs = logging::install(args.log_format);
    let ready_timer = std::time::Instant::now();
    let connections = connection_limit(args.max_connections);
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
    // Resolves (with the reason) when the SQLite writer has failed past its restarts; never for
    // PostgreSQL, whose connections are pooled and reconnect by themselves.
    let mut writer_gave_up: Pin<Box<dyn Future<Output = String> + Send>> =
        Box::pin(std::future::pending());
    // Files' bytes: in the shared database on PostgreSQL (every instance reads them), beside
    // SQLite's database in `DATA_DIR/files/` otherwise.
    let (store, file_contents): (Arc<dyn Store>, Arc<dyn FileContents>) = match &args.data.database
    {
        Some(url) => {
            let postgres = PostgresStore::connect(url, PostgresOptions::default(), heard)
                .await
                .with_context(|| format!("cannot open the database {}", offline::redacted(url)))?;
            let contents = postgres.file_contents();
            (Arc::new(postgres), contents)
        }
        None => {
            let path = datadir::database_path(&args.data.data_dir);
            let options = SqliteOptions {
                sync,
                max_page_count: args.sqlite_max_pages,
                ..SqliteOptions::default()
            };
            let sqlite = SqliteStore::open(&path, options, heard)
                .with_context(|| format!("cannot open the database {}", path.display()))?;
            writer_gave_up = Box::pin(watch_writer(sqlite.writer_status()));
            let files_dir = args.data.data_dir.join("files");
            let contents = FileDir::open(&files_dir).with_context(|| {
                format!("cannot open the files directory {}", files_dir.display())
            })?;
            (Arc::new(sqlite), Arc::new(contents))
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
        })?
        .with_prompt_cache(args.prompt_cache_bytes)
        // One idle context per worker by default: a model never has more contexts than workers.
        .with_idle_contexts(
            args.llama_idle_contexts
                .unwrap_or_else(|| usize::from(args.workers)),
        );
        // Checkpoints live in the data directory: another instance that recovers a task finds
        // none and replays from the prompt.
        let llama = match NonZeroU32::new(args.checkpoint_every) {
            Some(every) => llama.with_checkpoints(CheckpointSettings {
                dir: args.data.data_dir.join("checkpoints"),
                every,
                max_bytes: args.checkpoint_max_bytes,
            }),
            None => llama,
        };
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
    settings.tier_aging = TierAging::from_millis(
        u64::try_from(args.tier_aging.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
    )
    .unwrap_or_default();
    settings.max_queued = args.max_queued;
    settings.max_file_bytes = args.max_file_bytes;
    let as_millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    settings.webhooks = WebhookSettings {
        timeout: args.webhook_timeout,
        retry: RetryPolicy {
            base_ms: as_millis(args.webhook_retry_base),
            max_ms: RetryPolicy::DEFAULT
                .max_ms
                .max(as_millis(args.webhook_retry_base)),
            retry_for_ms: as_millis(args.webhook_retry_for),
        },
    };
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
        file_contents,
        batch_wire: Arc::new(HttpBatchWire),
        webhook_sender: Arc::new(
            HttpWebhookSender::new(Duration::from_secs(5))
                .context("cannot build the webhook sender")?,
        ),
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
    // Before the address is announced: a signal sent as soon as the service answers must find
    // the handler in place and stop it gracefully, not kill it with the default action.
    let mut signals = ShutdownSignals::register().context("cannot handle SIGTERM/SIGINT")?;
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
        max_connections: connections.max_connections,
        max_refusing: connections.max_refusing,
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
        () = signals.received() => None,
        () = service.failed() => Some(String::from("the instance's lease was lost")),
        reason = &mut writer_gave_up => Some(reason),
    };
    if let Some(reason) = &fatal {
        tracing::error!(
            %reason,
            "this instance cannot go on; exiting so that it can be started afresh"
        );
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
    if let Some(reason) = fatal {
        anyhow::bail!("this instance cannot go on: {reason}");
    }
    Ok(())
}

/// Logs each restart of the SQLite writer, and resolves with the reason once it has given up for
/// good (every write fails from then on: the process must exit to be started afresh).
async fn watch_writer(mut status: watch::Receiver<WriterStatus>) -> String {
    let mut restarts = 0;
    loop {
        let now = status.borrow_and_update().clone();
        if let Some(reason) = now.stopped {
            return reason;
        }
        if now.restarts > restarts {
            restarts = now.restarts;
            tracing::error!(
                restarts,
                failure = now.last_failure.as_deref().unwrap_or("unknown"),
                "the SQLite writer failed; it was restarted on a fresh connection"
            );
        }
        if status.changed().await.is_err() {
            // The store closed: nothing more will change.
            let stopped = status.borrow().stopped.clone();
            if let Some(reason) = stopped {
                return reason;
            }
            std::future::pending::<()>().await;
        }
    }
}

/// File descriptors kept aside from client connections (the database files of each SQLite
/// connection, the engines, the listener, the log): this many, or a tenth of the limit if more.
const FD_HEADROOM: u64 = 64;

/// What the server may hold open, as fitted to the open-files limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Connections {
    /// Connections served at once.
    max_connections: usize,
    /// Connections past the limit being answered 503 at once; more are closed at once.
    max_refusing: usize,
}

/// Raises the soft open-files limit to the hard one where allowed, then fits the connection limit
/// to it: `asked` (`--max-connections`), or the limit less [`FD_HEADROOM`] if that is less, so
/// that the service never runs out of descriptors for its database and its health check.
fn connection_limit(asked: u32) -> Connections {
    let limit = match rlimit::increase_nofile_limit(1 << 20) {
        Ok(limit) => Some(limit),
        Err(error) => {
            tracing::warn!(%error, "cannot raise the open-files limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    };
    let connections = fit_connections(u64::from(asked), limit);
    match limit {
        Some(limit) if connections.max_connections < asked as usize => tracing::warn!(
            max_connections = connections.max_connections,
            asked,
            open_files_limit = limit,
            "--max-connections is more than the open-files limit allows; serving at most \
             max_connections at once (raise the limit, e.g. LimitNOFILE= in systemd)"
        ),
        _ => tracing::info!(
            max_connections = connections.max_connections,
            open_files_limit = limit,
            "connection limit"
        ),
    }
    connections
}

/// The connection limits for `asked` connections under an open-files `limit` (`None`: unknown).
fn fit_connections(asked: u64, limit: Option<u64>) -> Connections {
    let Some(limit) = limit else {
        return Connections {
            max_connections: usize::try_from(asked).unwrap_or(usize::MAX),
            max_refusing: 64,
        };
    };
    let headroom = FD_HEADROOM.max(limit / 10);
    let room = limit.saturating_sub(headroom).max(1);
    Connections {
        max_connections: usize::try_from(asked.min(room)).unwrap_or(usize::MAX),
        max_refusing: usize::try_from((headroom / 4).clamp(1, 256)).unwrap_or(1),
    }
}

/// SIGTERM and SIGINT, registered when made: from then on either one is kept for
/// [`ShutdownSignals::received`] instead of ending the process at once.
struct ShutdownSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn register() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves when either signal has arrived (also one that arrived before the call).
    async fn received(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use lmsp_storage_sqlite::{NoListener, RestartBudget};

    #[test]
    fn the_connection_limit_leaves_room_for_the_databases_descriptors() {
        let low = fit_connections(10_000, Some(256));
        assert_eq!(low.max_connections, 192, "256 less 64 kept aside");
        assert_eq!(low.max_refusing, 16);
        let high = fit_connections(10_000, Some(1 << 20));
        assert_eq!(high.max_connections, 10_000, "what was asked fits");
        assert_eq!(high.max_refusing, 256);
        let tiny = fit_connections(10, Some(32));
        assert_eq!(tiny.max_connections, 1, "always at least one");
        let unknown = fit_connections(500, None);
        assert_eq!(unknown.max_connections, 500);
    }

    fn store_with_budget(dir: &tempfile::TempDir, restarts: u32) -> SqliteStore {
        let options = SqliteOptions {
            writer_restarts: RestartBudget {
                restarts,
                window: Duration::from_secs(600),
            },
            ..SqliteOptions::default()
        };
        let path = dir.path().join("lmsp.db");
        SqliteStore::open(&path, options, Arc::new(NoListener)).unwrap()
    }

    /// A writer restarted within its budget keeps the server up: the watch that `serve` selects
    /// on to exit does not resolve.
    #[tokio::test]
    async fn a_writer_restarted_within_its_budget_does_not_stop_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_budget(&dir, 1);
        let mut status = store.writer_status();
        let mut watched = tokio::spawn(watch_writer(store.writer_status()));

        store.fail_writer_for_tests().unwrap();
        tokio::time::timeout(
            Duration::from_secs(10),
            status.wait_for(|now| now.restarts == 1),
        )
        .await
        .unwrap()
        .unwrap();
        let still_serving = tokio::time::timeout(Duration::from_millis(200), &mut watched).await;

        assert!(still_serving.is_err(), "the watch ended: {still_serving:?}");
        watched.abort();
    }

    /// A writer that failed past its restart budget ends the watch with the writer's own reason,
    /// which `serve` logs before it stops and exits non-zero (the process never serves behind a
    /// dead writer).
    #[tokio::test]
    async fn a_writer_that_gave_up_ends_the_watch_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_budget(&dir, 0);
        let watched = tokio::spawn(watch_writer(store.writer_status()));

        store.fail_writer_for_tests().unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(10), watched)
            .await
            .unwrap()
            .unwrap();

        assert!(reason.contains("restarts allowed"), "{reason}");
        assert!(reason.contains("on purpose"), "{reason}");
    }
}
