//! Runs the storage contract suite (`lmsp-storage-contract`) against file-backed SQLite
//! databases, one fresh database in a temporary directory per check, plus the checks that only
//! this adapter's own form of storage has (reopening, the compact event rows, purge budgets).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lmsp_domain::event::{Event, EventKind};
use lmsp_domain::ports::{InstanceStore, StoreListener, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::transition::Step;
use lmsp_storage_contract::{self as contract, RecordingListener, StoreFactory};
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

/// Fresh SQLite stores, each in its own temporary directory, kept until the factory drops.
struct Sqlite {
    options: SqliteOptions,
    dirs: Mutex<Vec<tempfile::TempDir>>,
}

impl Sqlite {
    fn new() -> Self {
        Self::with(SqliteOptions {
            // The suite checks logic, not the disk: NORMAL keeps it quick, WAL stays on.
            sync: SyncMode::Normal,
            ..SqliteOptions::default()
        })
    }

    fn with(options: SqliteOptions) -> Self {
        Self {
            options,
            dirs: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl StoreFactory for Sqlite {
    type Store = SqliteStore;

    async fn fresh(&self, listener: Arc<dyn StoreListener>) -> SqliteStore {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SqliteStore::open(&dir.path().join("lmsp.db"), self.options.clone(), listener).unwrap();
        self.dirs.lock().unwrap().push(dir);
        store
    }
}

impl contract::SingleProcess for Sqlite {}

lmsp_storage_contract::storage_contract_tests!(Sqlite::new());
lmsp_storage_contract::storage_contract_single_process_tests!(Sqlite::new());

/// The store survives a reopen with its data, and the listener of the first opening heard the
/// commits only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_store_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lmsp.db");
    let listener = RecordingListener::new();
    let task = contract::task(contract::instance_id(), RestartPolicy::Fail);
    {
        let store = SqliteStore::open(&path, SqliteOptions::default(), listener.clone()).unwrap();
        contract::support::create(&store, task.clone()).await;
        store.close();
    }
    assert_eq!(listener.events().len(), 1);
    let store = SqliteStore::open_without_listener(&path, SqliteOptions::default()).unwrap();
    let (read, _) = contract::assert_log_consistent(&store, task.id).await;
    assert_eq!(read, task);
}

/// P-3, I-2: events are stored in a compact form (the created task and the completed response
/// are not copied into the log, item events are derived from their neighbours' rows): every kind
/// of event reads back exactly as it was committed, `response.created` included after the task
/// has moved on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_event_reads_back_as_it_was_committed_p3_i2() {
    let dir = tempfile::tempdir().unwrap();
    let listener = RecordingListener::new();
    let store = SqliteStore::open(
        &dir.path().join("lmsp.db"),
        SqliteOptions::default(),
        listener.clone(),
    )
    .unwrap();
    let worker = contract::support::register(&store, "worker", contract::time(0))
        .await
        .id;
    let running = |policy| {
        let store = &store;
        async move {
            let task = contract::TaskBuilder::new(worker)
                .policy(policy)
                .metadata("k", "v")
                .build();
            let task = contract::support::task_in(store, task, worker, TaskStatus::Running).await;
            let snapshot = contract::snapshot(task.last_sequence_number + 1, &[1, 2, 3]);
            contract::support::step(
                store,
                &task,
                worker,
                vec![contract::output("forest \"quoted\" ")],
                Some(snapshot),
                contract::time(3),
            )
            .await
        }
    };
    let completed = running(RestartPolicy::Fail).await;
    contract::support::finish(
        &store,
        &completed,
        worker,
        contract::complete(&completed, "forest \"quoted\" ", contract::time(4)),
    )
    .await;
    let failed = running(RestartPolicy::Fail).await;
    contract::support::finish(&store, &failed, worker, contract::fail()).await;
    let cancelled = running(RestartPolicy::Fail).await;
    store
        .cancel(cancelled.id, None, contract::time(5))
        .await
        .unwrap();
    store
        .finish(
            cancelled.id,
            worker,
            Step::AcknowledgeCancel,
            contract::time(6),
        )
        .await
        .unwrap();
    let called = running(RestartPolicy::Fail).await;
    contract::support::step(
        &store,
        &called,
        worker,
        vec![
            Step::CallStarted {
                name: String::from("get_weather"),
            },
            Step::CallArguments {
                delta: String::from("{\"city\":"),
            },
            Step::CallArguments {
                delta: String::from("\"Paris\"}"),
            },
            Step::CallDone {
                name: String::from("get_weather"),
                arguments: String::from("{\"city\":\"Paris\"}"),
            },
        ],
        None,
        contract::time(7),
    )
    .await;
    let resumed = running(RestartPolicy::Resume).await;
    let requeued = running(RestartPolicy::Retry).await;
    let rescuer = contract::support::register(&store, "rescuer", contract::time(10))
        .await
        .id;
    store
        .recover_instance(worker, rescuer, contract::time(10))
        .await
        .unwrap();

    let mut kinds = HashSet::new();
    for task in [
        &completed, &failed, &cancelled, &called, &resumed, &requeued,
    ] {
        let written: Vec<Event> = listener.events_of(task.id);
        let (_, read) = contract::assert_log_consistent(&store, task.id).await;
        assert_eq!(
            read, written,
            "the log of {} reads back as committed",
            task.id
        );
        kinds.extend(read.iter().map(Event::kind));
    }
    let missing: Vec<_> = EventKind::ALL
        .iter()
        .filter(|kind| !kinds.contains(kind))
        .collect();
    assert!(missing.is_empty(), "kinds not covered: {missing:?}");
}

/// I-4: a purge transaction stops taking tasks once their events pass the budget (always taking
/// at least one), and says when more are left, so a purge of a huge log runs in short steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_batch_is_bounded_by_events_and_says_when_more_are_left_i4() {
    let factory = Sqlite::with(SqliteOptions {
        purge_max_events: 10,
        ..SqliteOptions::default()
    });
    let (store, _listener) = contract::fresh_store(&factory).await;
    let worker = contract::instance_id();
    let mut per_task = Vec::new();
    for _ in 0..3 {
        let task = contract::task(worker, RestartPolicy::Fail);
        let done = contract::support::task_in(&store, task, worker, TaskStatus::Completed).await;
        per_task.push(done.last_sequence_number);
    }
    assert!(
        per_task.iter().all(|n| *n > 5),
        "a completed task has several events"
    );
    let cutoff = contract::time(1_000_000);
    let mut batches = Vec::new();
    loop {
        let report = store.purge_finished(cutoff, 100).await.unwrap();
        batches.push((report.tasks, report.events));
        if !report.more {
            break;
        }
    }
    let expected: Vec<(u64, u64)> = per_task.iter().map(|events| (1, *events)).collect();
    assert_eq!(
        batches, expected,
        "one task a batch: its events pass the budget of ten"
    );
    assert_eq!(store.count_by_status().await.unwrap(), []);
}

/// P-7…P-11, I-5: recovery in tiny batches (three tasks a transaction, so batches end inside a
/// cell of the table and run on into the next) still moves every leftover exactly per the table, with its
/// events, and a second pass changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_in_tiny_batches_moves_every_leftover_per_the_table_p7_p8_p9_p10_p11_i5() {
    let factory = Sqlite::with(SqliteOptions {
        sync: SyncMode::Normal,
        recovery_batch: 3,
        ..SqliteOptions::default()
    });
    contract::recovery::recovery_moves_every_leftover_task_per_the_table_p7_p8_p9_p10_p11_i5(
        &factory,
    )
    .await;
    contract::recovery::a_second_recovery_changes_nothing_i5(&factory).await;
    contract::recovery::a_requeued_task_closes_its_open_item_as_incomplete_and_its_next_run_opens_a_new_one(&factory).await;
    contract::recovery::a_resumed_task_continues_its_open_item(&factory).await;
    contract::recovery_oracle::recovery_writes_exactly_what_the_domain_decides_for_each_task_p11_i5(&factory).await;
}

/// I-7: the token checks run on the caller's thread and read what is committed, never a copy:
/// a client revoked by another process on the same file (the offline `lmsp clients revoke`
/// while the server runs) fails its very next check, and a client added there passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_revoked_or_added_by_another_process_is_seen_at_once_i7() {
    use lmsp_domain::auth::Scope;
    use lmsp_domain::ports::ClientStore;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lmsp.db");
    let server = SqliteStore::open_without_listener(&path, SqliteOptions::default()).unwrap();
    let (client, token) = contract::client(&[Scope::ResponsesWrite]);
    server.insert_client(client.clone()).await.unwrap();
    let hash = token.hash();
    assert_eq!(
        server
            .client_by_token_hash(hash)
            .await
            .unwrap()
            .map(|c| c.id),
        Some(client.id)
    );
    let offline = SqliteStore::open_without_listener(&path, SqliteOptions::default()).unwrap();
    assert!(offline
        .revoke_client(client.id, contract::time(5))
        .await
        .unwrap());
    offline.close();
    assert_eq!(
        server.client_by_token_hash(hash).await.unwrap(),
        None,
        "a revoked token fails at once"
    );
    let offline = SqliteStore::open_without_listener(&path, SqliteOptions::default()).unwrap();
    let (added, added_token) = contract::client(&[Scope::ResponsesRead]);
    offline.insert_client(added.clone()).await.unwrap();
    offline.close();
    assert_eq!(
        server
            .client_by_token_hash(added_token.hash())
            .await
            .unwrap()
            .map(|c| c.id),
        Some(added.id)
    );
}
