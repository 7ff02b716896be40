//! Health tells the truth about the store's writer: a writer that failed and gave up turns health
//! 503 at once and keeps it there, a writer restarted on a fresh connection takes writes again
//! and health comes back, and the probe runs while health is green too, so a failure no write
//! has met yet is found within a few seconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use lmsp_app::{Adapters, Engines, Listener, Service, SystemClock};
use lmsp_domain::auth::{Client, Scope, Scopes, SecretHash};
use lmsp_domain::ports::{ClientStore, Store, StoreListener};
use lmsp_domain::{ClientId, EngineKind, Timestamp};
use lmsp_storage_sqlite::{
    FileDir, NoListener, RestartBudget, SqliteOptions, SqliteStore, SyncMode,
};

use support::{engine_with, files_ok, settings, NoBatchLines, NoReceivers};

/// A started service on a SQLite store with `budget`; the store reports to `heard` (the
/// service's listener, or one that hears nothing).
struct Running {
    service: Service,
    sqlite: Arc<SqliteStore>,
    listener: Arc<Listener>,
    _dir: tempfile::TempDir,
}

async fn start(budget: RestartBudget, told: bool) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let listener = Listener::new();
    let heard: Arc<dyn StoreListener> = if told {
        listener.clone()
    } else {
        Arc::new(NoListener)
    };
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        writer_restarts: budget,
        ..SqliteOptions::default()
    };
    let sqlite = Arc::new(SqliteStore::open(&dir.path().join("lmsp.db"), options, heard).unwrap());
    let adapters = Adapters {
        store: Arc::clone(&sqlite) as Arc<dyn Store>,
        engines: Engines::new().with(
            EngineKind::Reference,
            Arc::new(engine_with(Duration::ZERO, 1)),
        ),
        model_files: Arc::new(files_ok()),
        file_contents: Arc::new(FileDir::open(&dir.path().join("files")).unwrap()),
        batch_wire: Arc::new(NoBatchLines),
        webhook_sender: Arc::new(NoReceivers),
        clock: Arc::new(SystemClock),
    };
    let started = Service::start(
        adapters,
        Arc::clone(&listener),
        settings(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    started.service.spawn_background();
    Running {
        service: started.service,
        sqlite,
        listener,
        _dir: dir,
    }
}

fn client(name: &str) -> Client {
    let id = ulid::Ulid::new();
    Client {
        id: ClientId::from_ulid(id),
        name: name.to_owned(),
        scopes: Scopes::new([Scope::ResponsesRead]),
        token_hash: SecretHash::from_hex(&format!("{:064x}", u128::from(id))).unwrap(),
        created_at: Timestamp::from_millis(1),
        revoked_at: None,
    }
}

/// Polls (every 10 ms, at most `within`) until health is `healthy`.
async fn health_becomes(service: &Service, healthy: bool, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while service.store_is_healthy() != healthy {
        assert!(
            tokio::time::Instant::now() < deadline,
            "health never became {} within {within:?}",
            if healthy { "ok" } else { "unavailable" }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A writer that fails past its restart budget (none here) turns health 503 at once, since the
/// store tells the listener of the failed transaction, and every write is refused as
/// unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gave_up_turns_health_503_and_every_write_is_refused() {
    let none = RestartBudget {
        restarts: 0,
        window: Duration::from_secs(60),
    };
    let running = start(none, true).await;
    assert!(running.service.store_is_healthy());

    running.sqlite.fail_writer_for_tests().unwrap();

    health_becomes(&running.service, false, Duration::from_secs(5)).await;
    let written = running.sqlite.insert_client(client("refused")).await;
    assert!(written.is_err(), "{written:?}");
    assert!(running.sqlite.writer_status().borrow().stopped.is_some());
    assert!(!running.service.store_is_healthy());
}

/// A writer restarted on a fresh connection takes writes again, and health is green once a
/// commit succeeds; the failed transaction is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_writer_takes_writes_again_and_health_comes_back() {
    let running = start(RestartBudget::default(), true).await;

    running.sqlite.fail_writer_for_tests().unwrap();
    let mut status = running.sqlite.writer_status();
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.restarts == 1),
    )
    .await
    .expect("the writer was restarted")
    .unwrap();

    running.sqlite.insert_client(client("after")).await.unwrap();
    health_becomes(&running.service, true, Duration::from_secs(5)).await;
    let metrics = running.listener.metrics.render(&[]);
    assert!(
        metrics.contains("lmsp_commit_failures_total 1"),
        "the failed transaction is counted: {metrics}"
    );
}

/// The probe runs while health is green too: a store whose writer stopped without the app
/// hearing of it (here the store tells another listener) turns health 503 within a few probe
/// periods, although no request wrote anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_finds_a_stopped_writer_while_health_is_still_green() {
    let none = RestartBudget {
        restarts: 0,
        window: Duration::from_secs(60),
    };
    let running = start(none, false).await;
    running.sqlite.fail_writer_for_tests().unwrap();
    let mut status = running.sqlite.writer_status();
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.stopped.is_some()),
    )
    .await
    .expect("the writer gave up")
    .unwrap();
    assert!(
        running.service.store_is_healthy(),
        "the service was not told of the failure"
    );

    health_becomes(&running.service, false, Duration::from_secs(20)).await;
}
