//! SQLite-specific checks of the write path (ARCHITECTURE.md): one failing command in a group
//! commit rolls back only its own savepoint (the test holds the writer so that the failing
//! command provably shares its batch), and a full disk surfaces as `StoreError::Full`
//! while leaving the database consistent and readable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use lmsp_domain::event::Event;
use lmsp_domain::ports::{CommitStats, StoreError, StoreListener, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};
use tokio::sync::oneshot;

/// A listener that can hold the writer thread: once armed, the next transaction it hears of
/// blocks the writer (inside `transaction_measured`, before the batch's callers are answered)
/// until the test releases it. The port asks listeners never to block; this one does so on
/// purpose, once, so that commands pile up behind the held writer and form the next batch.
#[derive(Debug, Default)]
struct WriterGate {
    heard: Arc<contract::RecordingListener>,
    armed: Mutex<Option<(oneshot::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
}

impl WriterGate {
    /// Arms the gate: returns what tells that the writer is held, and what releases it.
    fn arm(&self) -> (oneshot::Receiver<()>, std::sync::mpsc::Sender<()>) {
        let (held, is_held) = oneshot::channel();
        let (release, released) = std::sync::mpsc::channel();
        *self.armed.lock().unwrap() = Some((held, released));
        (is_held, release)
    }
}

impl StoreListener for WriterGate {
    fn committed(&self, events: &[Event]) {
        self.heard.committed(events);
    }

    fn transaction_measured(&self, stats: CommitStats) {
        self.heard.transaction_measured(stats);
        let armed = self.armed.lock().unwrap().take();
        if let Some((held, released)) = armed {
            let _ = held.send(());
            let _ = released.recv();
        }
    }
}

/// I-1: a failing command in a group commit rolls back only its own savepoint. A duplicate create
/// and a good one are queued while the writer is held, so they share the next batch: that
/// transaction carries both commands and commits, with the good task's event only; the duplicate
/// fails alone and leaves the first task as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_rolls_back_only_its_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        ..SqliteOptions::default()
    };
    let gate = Arc::new(WriterGate::default());
    let store = Arc::new(SqliteStore::open(&dir.path().join("db"), options, gate.clone()).unwrap());
    let first = contract::task(contract::instance_id(), RestartPolicy::Fail);
    store.create_task(first.clone(), None).await.unwrap();

    // Hold the writer on a commit of its own.
    let (held, release) = gate.arm();
    let blocker = contract::task(contract::instance_id(), RestartPolicy::Fail);
    let blocking = tokio::spawn({
        let (store, blocker) = (Arc::clone(&store), blocker.clone());
        async move { store.create_task(blocker, None).await }
    });
    held.await.unwrap();
    // Queue a duplicate of the first task and a good task behind it: a create hands its command
    // to the writer on its first poll.
    let good = contract::task(contract::instance_id(), RestartPolicy::Fail);
    let mut duplicate = Box::pin(store.create_task(first.clone(), None));
    let mut created = Box::pin(store.create_task(good.clone(), None));
    assert!(futures::poll!(duplicate.as_mut()).is_pending());
    assert!(futures::poll!(created.as_mut()).is_pending());
    let mark = gate.heard.mark();
    release.send(()).unwrap();

    blocking.await.unwrap().unwrap();
    assert!(duplicate.await.is_err(), "the duplicate create fails");
    created.await.unwrap();
    let batch = gate.heard.transactions_since(mark);
    assert_eq!(
        batch.len(),
        1,
        "both commands went in one transaction: {batch:?}"
    );
    assert_eq!(batch[0].commands, 2, "{batch:?}");
    assert!(batch[0].committed, "the batch committed: {batch:?}");
    assert_eq!(batch[0].events, 1, "the good task's event only: {batch:?}");
    for task in [&first, &blocker, &good] {
        let (stored, _) = contract::assert_log_consistent(&*store, task.id).await;
        assert_eq!(&stored, task);
    }
}

/// SQLITE_FULL becomes `StoreError::Full`; nothing half-written; reads still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_typed_error_and_leaves_the_database_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        max_page_count: Some(64),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_without_listener(&dir.path().join("db"), options).unwrap();
    let mut created = Vec::new();
    let mut full = false;
    for _ in 0..10_000 {
        let task = contract::task(contract::instance_id(), RestartPolicy::Fail);
        match store.create_task(task.clone(), None).await {
            Ok(_) => created.push(task.id),
            Err(StoreError::Full) => {
                full = true;
                assert!(store.task(task.id).await.unwrap().is_none());
                break;
            }
            Err(other) => panic!("expected Full, got {other}"),
        }
    }
    assert!(full, "the capped database never filled up");
    for id in &created {
        contract::assert_log_consistent(&store, *id).await;
    }
}

/// A database in a pre-release layout is refused at open with a message that says what to do,
/// and is left as it was.
#[test]
fn a_pre_release_database_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lmsp.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE tasks (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let error = SqliteStore::open_without_listener(&path, SqliteOptions::default()).unwrap_err();
    assert!(
        matches!(&error, StoreError::Corrupt(message) if message.contains("pre-release")),
        "{error:?}"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(tables, 1, "nothing was added to it");
}

/// A batch of `lines` requests, validating, with its input file and its lines kept aside
/// (staged), in `store`.
async fn staged_batch(store: &SqliteStore, lines: u32) -> lmsp_domain::batch::Batch {
    use lmsp_domain::batch::{Batch, BatchEndpoint, BatchLine, FilePurpose, NewBatch, StoredFile};
    use lmsp_domain::ids::{BatchId, FileId};
    use lmsp_domain::ports::BatchStore;
    use lmsp_domain::task::Metadata;
    use lmsp_domain::time::Timestamp;

    let client = contract::client_id();
    let owner = contract::instance_id();
    let input = StoredFile {
        id: FileId::from_ulid(contract::ulid()),
        client_id: client,
        filename: String::from("requests.jsonl"),
        purpose: FilePurpose::Batch,
        bytes: 1,
        digest: String::from("ab").repeat(32),
        created_at: Timestamp::from_millis(0),
        batch_id: None,
    };
    store.insert_file(input.clone()).await.unwrap();
    let batch = Batch::new(NewBatch {
        id: BatchId::from_ulid(contract::ulid()),
        client_id: client,
        endpoint: BatchEndpoint::Responses,
        input_file_id: input.id,
        completion_window_ms: 86_400_000,
        metadata: Metadata::new(),
        created_at: Timestamp::from_millis(0),
    });
    store.insert_batch(batch.clone()).await.unwrap();
    let tasks = (1..=lines)
        .map(|line| {
            let mut task = contract::TaskBuilder::new(owner).client(client).build();
            task.batch = Some(BatchLine {
                batch_id: batch.id,
                line,
                custom_id: format!("request-{line}"),
            });
            task
        })
        .collect();
    store.stage_batch_tasks(tasks).await.unwrap();
    batch
}

/// The number of kept-aside (staged) batch lines in the database at `path`.
fn staged_rows(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT count(*) FROM batch_staging", [], |row| row.get(0))
        .unwrap()
}

/// P-2: a batch's kept-aside lines are gone once it starts or is refused, removed a chunk per write
/// after the write that starts it (never inside its savepoint, whose journal would hold every
/// page of them in memory), so nothing of them stays behind in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_or_refused_batchs_kept_aside_lines_are_removed() {
    use lmsp_domain::ports::BatchStore;
    use lmsp_domain::time::Timestamp;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open_without_listener(&path, SqliteOptions::default()).unwrap();
    // More lines than one removal takes, so the removal runs several writes.
    let batches = [
        staged_batch(&store, 2_500).await,
        staged_batch(&store, 2_500).await,
    ];
    assert_eq!(staged_rows(&path), 5_000);

    let started = store
        .start_batch(batches[0].started(Timestamp::from_millis(10)))
        .await
        .unwrap()
        .expect("a validating batch starts");
    assert_eq!(started.counts.total, 2_500);
    assert_eq!(
        staged_rows(&path),
        2_500,
        "only the started batch's lines go"
    );

    let refused = batches[1].refused(Vec::new(), Timestamp::from_millis(10));
    store
        .update_batch(batches[1].status, refused)
        .await
        .unwrap()
        .expect("a validating batch is refused");
    assert_eq!(staged_rows(&path), 0);
}

/// P-5, P-6: kept-aside lines that a crash left behind (the batch was refused, the process died
/// before the writes that remove its lines) go with the batch's purge, a chunk per call within
/// the purge's budget, and the batch goes once none is left; the lines of a batch still
/// validating are never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_aside_lines_a_crash_left_behind_go_with_their_batchs_purge() {
    use lmsp_domain::ports::BatchStore;
    use lmsp_domain::time::Timestamp;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open_without_listener(&path, SqliteOptions::default()).unwrap();
    let refused = staged_batch(&store, 1_500).await;
    let validating = staged_batch(&store, 10).await;
    // The refusal committed, and nothing after it: what a kill -9 between the two leaves.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE batches SET status = 'failed', failed_at = 10 WHERE id = ?1",
            [refused.id.ulid().to_bytes().to_vec()],
        )
        .unwrap();
    assert_eq!(staged_rows(&path), 1_510);

    let first = store
        .purge_batches(Timestamp::from_millis(11), 1_000)
        .await
        .unwrap();
    assert_eq!((first.batches, first.tasks), (0, 0));
    assert!(first.more, "a full budget leaves the rest for a later call");
    assert_eq!(staged_rows(&path), 510);
    assert!(store.batch(refused.id).await.unwrap().is_some());

    let second = store
        .purge_batches(Timestamp::from_millis(11), 1_000)
        .await
        .unwrap();
    assert_eq!(second.batches, 1);
    assert_eq!(staged_rows(&path), 10, "a validating batch's lines stay");
    assert!(store.batch(refused.id).await.unwrap().is_none());
    assert!(store.batch(validating.id).await.unwrap().is_some());
}
