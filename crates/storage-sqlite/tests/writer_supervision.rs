//! The writer is supervised: when its write path itself fails (a panic outside any command, as
//! a bug in the writer would), the batch it hit fails, the listener hears a failed transaction
//! (so health turns 503 at once), and the writer is restarted on a fresh connection, so later
//! writes commit. Past its restart budget it gives up for good and says why, and every later
//! write fails — so the binary exits instead of serving behind a dead writer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lmsp_domain::auth::{Client, Scope, Scopes, SecretHash};
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::{ClientStore, CommitStats, ServiceStore, StoreError, StoreListener};
use lmsp_domain::time::Timestamp;
use lmsp_domain::Event;
use lmsp_storage_sqlite::{RestartBudget, SqliteOptions, SqliteStore, WriterStatus};

/// Remembers whether each measured transaction committed.
#[derive(Debug, Default)]
struct Heard {
    commits: Mutex<Vec<bool>>,
}

impl Heard {
    fn commits(&self) -> Vec<bool> {
        self.commits.lock().unwrap().clone()
    }
}

impl StoreListener for Heard {
    fn committed(&self, _events: &[Event]) {}

    fn transaction_measured(&self, stats: CommitStats) {
        self.commits.lock().unwrap().push(stats.committed);
    }
}

fn store(dir: &tempfile::TempDir, budget: RestartBudget) -> (SqliteStore, Arc<Heard>) {
    let heard = Arc::new(Heard::default());
    let options = SqliteOptions {
        writer_restarts: budget,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(&dir.path().join("lmsp.db"), options, heard.clone()).unwrap();
    (store, heard)
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

/// Waits (at most 10 s) until the writer's status satisfies `done`.
async fn status_until(store: &SqliteStore, done: impl Fn(&WriterStatus) -> bool) -> WriterStatus {
    let mut status = store.writer_status();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        status.wait_for(|s| done(s)).await.map(|now| now.clone())
    })
    .await;
    match waited {
        Ok(Ok(now)) => now,
        _ => panic!(
            "the writer never got there: {:?}",
            *store.writer_status().borrow()
        ),
    }
}

/// A write path that fails outside any command fails its own batch, is heard as a failed
/// transaction, and the writer is restarted on a fresh connection: the next writes commit and
/// what was committed before is still there.
#[tokio::test]
async fn a_writer_that_fails_outside_any_command_is_restarted_and_later_writes_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (store, heard) = store(&dir, RestartBudget::default());
    store.insert_client(client("before")).await.unwrap();

    store.fail_writer_for_tests().unwrap();
    let status = status_until(&store, |s| s.restarts == 1).await;

    assert!(status.stopped.is_none(), "{status:?}");
    assert!(
        status
            .last_failure
            .as_deref()
            .is_some_and(|why| why.contains("failed on purpose")),
        "{status:?}"
    );
    assert!(
        heard.commits().contains(&false),
        "health heard the failed transaction: {:?}",
        heard.commits()
    );
    store.insert_client(client("after")).await.unwrap();
    store
        .check_writable(Timestamp::from_millis(2))
        .await
        .unwrap();
    let names: Vec<String> = store
        .list_clients()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert!(
        names.contains(&"before".to_owned()) && names.contains(&"after".to_owned()),
        "{names:?}"
    );
    assert_eq!(heard.commits().last(), Some(&true));
}

/// Past its budget (here one restart in the window) the writer gives up: its status says why,
/// and every later write fails as unavailable with that reason, instead of hanging or
/// pretending.
#[tokio::test]
async fn past_its_restart_budget_the_writer_gives_up_and_every_write_fails() {
    let dir = tempfile::tempdir().unwrap();
    let budget = RestartBudget {
        restarts: 1,
        window: Duration::from_secs(600),
    };
    let (store, _heard) = store(&dir, budget);

    store.fail_writer_for_tests().unwrap();
    status_until(&store, |s| s.restarts == 1).await;
    store.insert_client(client("between")).await.unwrap();
    store.fail_writer_for_tests().unwrap();
    let status = status_until(&store, |s| s.stopped.is_some()).await;

    assert_eq!(status.restarts, 1, "{status:?}");
    let written = store.insert_client(client("too late")).await;
    match written {
        Err(StoreError::Unavailable(why)) => {
            assert!(why.contains("the writer has stopped"), "{why}");
            assert!(why.contains("restarts allowed"), "{why}");
        }
        other => panic!("a write after the writer gave up: {other:?}"),
    }
    assert!(store
        .check_writable(Timestamp::from_millis(3))
        .await
        .is_err());
}
