//! SQLite-specific checks of the write path (ARCHITECTURE.md): one failing command in a group
//! commit rolls back only its own savepoint, and a full disk surfaces as `StoreError::Full`
//! while leaving the database consistent and readable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use futures::future::join_all;
use lmsp_domain::ports::{StoreError, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

/// A duplicate create in a batch fails alone; the other commands of the batch commit (I-1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_rolls_back_only_its_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        ..SqliteOptions::default()
    };
    let store =
        Arc::new(SqliteStore::open_without_listener(&dir.path().join("db"), options).unwrap());
    let duplicate = contract::task(contract::instance_id(), RestartPolicy::Fail);
    let mut tasks: Vec<_> = (0..200)
        .map(|_| contract::task(contract::instance_id(), RestartPolicy::Fail))
        .collect();
    tasks.insert(50, duplicate.clone());
    tasks.insert(150, duplicate.clone());
    let results = join_all(tasks.iter().cloned().map(|task| {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.create_task(task, None).await })
    }))
    .await;
    let failures = results
        .iter()
        .filter(|r| r.as_ref().unwrap().is_err())
        .count();
    assert_eq!(failures, 1, "only the second duplicate fails");
    for task in &tasks {
        contract::assert_log_consistent(&*store, task.id).await;
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
