//! Runs the storage contract suite (`lmsp_storage_sqlite::contract`) against a file-backed
//! SQLite database in a temporary directory, one fresh database per check.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_storage_sqlite::contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_without_hook(&dir.path().join("lmsp.db"), options).unwrap();
    (dir, store)
}

macro_rules! contract_test {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (_dir, store) = store();
                contract::$name(&store).await;
            }
        )*
    };
}

contract_test!(
    /// P-2, I-1.
    create_stores_task_with_created_event_p2_i1,
    /// P-2, I-8.
    create_with_idempotency_is_atomic_i8,
    /// P-3, I-2.
    append_is_gapless_and_all_or_nothing_p3_i2,
    /// P-3.
    finish_stores_response_and_drops_snapshot_p3,
    /// Queue order.
    claim_next_takes_the_oldest_queued_task,
    /// P-4, I-3.
    cancel_follows_the_table_p4_i3,
    /// P-5, P-6, I-4.
    purge_removes_only_old_finished_tasks_p5_p6_i4,
    /// P-7..P-11, I-5.
    recovery_follows_the_table_and_is_idempotent_p7_p11_i5,
    /// Listing and counts.
    list_and_count_tasks,
    /// Clients and pairing.
    clients_and_pairings,
    /// P-1.
    models_are_metadata_only_p1,
    /// Start epochs.
    begin_start_keeps_identity_and_counts_epochs,
);

/// The store survives a reopen with its data and the hook hears committed events only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_keeps_data_and_hook_hears_commits() {
    use lmsp_domain::event::Event;
    use lmsp_domain::ports::{CommittedEvents, TaskStore};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Recorder(Mutex<Vec<Event>>);
    impl CommittedEvents for Recorder {
        fn committed(&self, events: &[Event]) {
            self.0.lock().unwrap().extend_from_slice(events);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lmsp.db");
    let recorder = Arc::new(Recorder::default());
    let task = contract::task(contract::client_id(), Default::default());
    {
        let store = SqliteStore::open(&path, SqliteOptions::default(), recorder.clone()).unwrap();
        store.create_task(task.clone(), None).await.unwrap();
    }
    assert_eq!(recorder.0.lock().unwrap().len(), 1);
    let store = SqliteStore::open_without_hook(&path, SqliteOptions::default()).unwrap();
    contract::assert_log_consistent(&store, task.id).await;
}
