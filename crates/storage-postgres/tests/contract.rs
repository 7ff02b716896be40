//! Runs the storage contract suite (`lmsp-storage-contract`) against PostgreSQL: one fresh
//! database per check (`CREATE DATABASE lmsp_test_<n>` on the cluster named by
//! `LMSP_TEST_POSTGRES_URL`), dropped when the check ends, plus the multi-process checks, whose
//! second "process" is a second store with its own pool and `LISTEN` connection on the same
//! database.
//!
//! Start a throwaway cluster first: `scripts/postgres-test-cluster start` prints the URL:
//!
//! ```text
//! LMSP_TEST_POSTGRES_URL=$(scripts/postgres-test-cluster start) cargo test -p lmsp-storage-postgres
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lmsp_domain::ports::StoreListener;
use lmsp_storage_contract::{MultiProcess, StoreFactory};
use lmsp_storage_postgres::{PostgresOptions, PostgresStore};
use tokio_postgres::NoTls;

/// The variable naming the cluster the tests create their databases on.
const URL_VARIABLE: &str = "LMSP_TEST_POSTGRES_URL";

/// Databases made so far by this test binary (part of each name).
static MADE: AtomicU64 = AtomicU64::new(0);

/// The base URL, or a failure that says how to get one (never a silent skip).
fn base_url() -> String {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "{URL_VARIABLE} is not set: run `scripts/postgres-test-cluster start` and set \
             {URL_VARIABLE} to the URL it prints (e.g. \
             {URL_VARIABLE}=$(scripts/postgres-test-cluster start) cargo test -p \
             lmsp-storage-postgres)"
        ),
    }
}

/// The URL of database `name` on the cluster of `base`.
fn database_url(base: &str, name: &str) -> String {
    let (prefix, rest) = base.split_once("://").expect("a postgres:// URL");
    let (authority, query) = match rest.split_once('/') {
        Some((authority, path)) => (
            authority,
            path.split_once('?').map(|(_, query)| query).unwrap_or(""),
        ),
        None => (rest, ""),
    };
    if query.is_empty() {
        format!("{prefix}://{authority}/{name}")
    } else {
        format!("{prefix}://{authority}/{name}?{query}")
    }
}

/// Runs one statement on the cluster's maintenance database.
async fn admin(base: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(base, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {base} ({e}): is the test cluster running?"));
    let driver = tokio::spawn(connection);
    client.batch_execute(sql).await.unwrap();
    drop(client);
    let _ = driver.await;
}

/// Fresh databases, one per store asked for, dropped with the factory.
struct Postgres {
    base: String,
    options: PostgresOptions,
    databases: Mutex<Vec<String>>,
}

impl Postgres {
    fn new() -> Self {
        Self::with(PostgresOptions {
            pool_size: 8,
            ..PostgresOptions::default()
        })
    }

    fn with(options: PostgresOptions) -> Self {
        Self {
            base: base_url(),
            options,
            databases: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl StoreFactory for Postgres {
    type Store = PostgresStore;

    async fn fresh(&self, listener: Arc<dyn StoreListener>) -> PostgresStore {
        let name = format!(
            "lmsp_test_{}_{}_{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed),
            ulid::Ulid::new().to_string().to_lowercase()
        );
        admin(&self.base, &format!("CREATE DATABASE {name}")).await;
        self.databases.lock().unwrap().push(name.clone());
        PostgresStore::connect(
            &database_url(&self.base, &name),
            self.options.clone(),
            listener,
        )
        .await
        .unwrap()
    }
}

#[async_trait]
impl MultiProcess for Postgres {
    async fn another_process(
        &self,
        store: &PostgresStore,
        listener: Arc<dyn StoreListener>,
    ) -> PostgresStore {
        let name = store.database().expect("the store names its database");
        PostgresStore::connect(
            &database_url(&self.base, &name),
            self.options.clone(),
            listener,
        )
        .await
        .unwrap()
    }
}

/// I-4 (a purge removes a task with all its rows) and I-2 (a task's events are its log): the
/// events and specs of database `name` whose task is not there. Schema versions 7 and 8 have no
/// foreign keys on `task_events` and `task_specs`: the adapter keeps that integrity, and every
/// check of the suite ends by counting them; none when the database has no events table (its
/// check failed before the migrations ran), an error when it cannot be read.
async fn rows_without_their_task(base: &str, name: &str) -> Result<i64, String> {
    let url = database_url(base, name);
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .map_err(|e| format!("cannot connect to {name}: {e}"))?;
    let driver = tokio::spawn(connection);
    let exists: bool = client
        .query_one("SELECT to_regclass('task_events') IS NOT NULL", &[])
        .await
        .map_err(|e| format!("{name}: {e}"))?
        .get(0);
    let orphans = if exists {
        client
            .query_one(
                "SELECT (SELECT count(*) FROM task_events e \
                         WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = e.task_id)) \
                      + (SELECT count(*) FROM task_specs s \
                         WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = s.task_id))",
                &[],
            )
            .await
            .map_err(|e| format!("{name}: {e}"))?
            .get(0)
    } else {
        0
    };
    drop(client);
    let _ = driver.await;
    Ok(orphans)
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let names = std::mem::take(&mut *self.databases.lock().unwrap());
        if names.is_empty() {
            return;
        }
        let base = self.base.clone();
        // The test's runtime is ending: drop the databases from a runtime of our own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut found = Vec::new();
                for name in names {
                    match rows_without_their_task(&base, &name).await {
                        Ok(0) => {}
                        Ok(count) => found.push(format!(
                            "{name}: {count} events or specs without their task"
                        )),
                        Err(error) => found.push(error),
                    }
                    admin(
                        &base,
                        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                    )
                    .await;
                }
                found
            })
        });
        let found = dropped
            .join()
            .unwrap_or_else(|_| vec![String::from("the databases could not all be dropped")]);
        if !found.is_empty() && !std::thread::panicking() {
            panic!("after the check: {found:?}");
        }
    }
}

lmsp_storage_contract::storage_contract_tests!(Postgres::new());
lmsp_storage_contract::storage_contract_multi_process_tests!(Postgres::new());

/// P-7, I-5: two processes recovering the same stopped instance at the same time, in small
/// batches, move each of its tasks exactly once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rescuers_move_each_task_once_i5() {
    use lmsp_domain::ports::{InstanceStore, TaskStore};
    use lmsp_domain::recovery::RestartPolicy;
    use lmsp_domain::status::TaskStatus;
    use lmsp_storage_contract::{self as contract, RecordingListener};

    let factory = Postgres::with(PostgresOptions {
        recovery_batch: 3,
        pool_size: 8,
        ..PostgresOptions::default()
    });
    let (first, _heard) = contract::fresh_store(&factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let gone = contract::support::register(&first, "gone", contract::time(0)).await;
    let mut tasks = Vec::new();
    for index in 0..20 {
        let status = if index % 2 == 0 {
            TaskStatus::Running
        } else {
            TaskStatus::Loading
        };
        let task = contract::task(gone.id, RestartPolicy::Retry);
        tasks.push(contract::support::task_in(&first, task, gone.id, status).await);
    }
    first
        .retire_instance(gone.id, contract::time(100))
        .await
        .unwrap();
    let a = contract::support::register(&first, "rescuer-a", contract::time(100))
        .await
        .id;
    let b = contract::support::register(&second, "rescuer-b", contract::time(100))
        .await
        .id;
    let (first, second) = (Arc::new(first), Arc::new(second));
    let one = {
        let first = Arc::clone(&first);
        tokio::spawn(async move {
            first
                .recover_instance(gone.id, a, contract::time(101))
                .await
                .unwrap()
        })
    };
    let two = {
        let second = Arc::clone(&second);
        tokio::spawn(async move {
            second
                .recover_instance(gone.id, b, contract::time(101))
                .await
                .unwrap()
        })
    };
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    assert_eq!(one.moved + two.moved, 20, "{one:?} {two:?}");
    for task in &tasks {
        let (after, events) = contract::assert_log_consistent(first.as_ref(), task.id).await;
        assert_eq!(after.status, TaskStatus::Queued);
        assert_eq!(after.restarts, task.restarts + 1, "moved once");
        assert_eq!(events.len() as u64, after.last_sequence_number);
        assert!(after.owner == a || after.owner == b);
    }
    assert!(first
        .stopped_instances(a, contract::time(102))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        first.count_by_status().await.unwrap(),
        vec![(TaskStatus::Queued, 20)]
    );
}

/// Leadership is a session lock: when the leading store goes away (or its instance retires),
/// another instance leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_passes_on_when_the_leader_goes() {
    use lmsp_domain::ports::InstanceStore;
    use lmsp_storage_contract::{self as contract, RecordingListener};

    let factory = Postgres::new();
    let (first, _heard) = contract::fresh_store(&factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let third = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let a = contract::support::register(&first, "a", contract::time(0))
        .await
        .id;
    let b = contract::support::register(&second, "b", contract::time(0))
        .await
        .id;
    let c = contract::support::register(&third, "c", contract::time(0))
        .await
        .id;
    assert!(first.lead_maintenance(a).await.unwrap());
    assert!(!second.lead_maintenance(b).await.unwrap());
    first.retire_instance(a, contract::time(1)).await.unwrap();
    contract::eventually("b leads", contract::support::NEWS_DEADLINE, || {
        let second = &second;
        async move { second.lead_maintenance(b).await.unwrap().then_some(()) }
    })
    .await;
    assert!(!third.lead_maintenance(c).await.unwrap());
    drop(second);
    contract::eventually("c leads", contract::support::NEWS_DEADLINE, || {
        let third = &third;
        async move { third.lead_maintenance(c).await.unwrap().then_some(()) }
    })
    .await;
}

/// Files' bytes are rows of the shared database: what one process writes, in parts of at most
/// a MiB, another reads back whole and in order; a file with no bytes and no record is none, an
/// empty file with its record reads empty at once, and a removal drops every part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_bytes_are_kept_in_parts_every_process_reads() {
    use lmsp_domain::batch::{FilePurpose, StoredFile};
    use lmsp_domain::ids::FileId;
    use lmsp_domain::ports::BatchStore;
    use lmsp_storage_contract::{self as contract, RecordingListener};
    use lmsp_storage_postgres::PART_BYTES;

    let factory = Postgres::new();
    let (first, _heard) = contract::fresh_store(&factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let (writing, reading) = (first.file_contents(), second.file_contents());

    let bytes: Vec<u8> = (0..PART_BYTES * 5 / 2).map(|n| (n % 251) as u8).collect();
    let id = FileId::from_ulid(contract::ulid());
    let mut writer = writing.create(id).await.unwrap();
    for piece in bytes.chunks(300_001) {
        writer.write(piece).await.unwrap();
    }
    writer.finish().await.unwrap();
    let mut reader = reading.open(id).await.unwrap().expect("written");
    let mut read = Vec::new();
    let mut parts = 0;
    loop {
        let part = reader.read().await.unwrap();
        if part.is_empty() {
            break;
        }
        assert!(part.len() <= PART_BYTES);
        parts += 1;
        read.extend(part);
    }
    assert_eq!(parts, 3);
    assert!(read == bytes, "the bytes read back are the bytes written");
    assert!(
        reader.read().await.unwrap().is_empty(),
        "the end stays the end"
    );

    reading.remove(id).await.unwrap();
    assert!(
        writing.open(id).await.unwrap().is_none(),
        "no part and no record"
    );
    assert!(reading
        .open(FileId::from_ulid(contract::ulid()))
        .await
        .unwrap()
        .is_none());

    let empty = StoredFile {
        id: FileId::from_ulid(contract::ulid()),
        client_id: contract::client_id(),
        filename: String::from("empty.jsonl"),
        purpose: FilePurpose::BatchOutput,
        bytes: 0,
        digest: String::from("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        created_at: contract::time(0),
        batch_id: None,
    };
    writing
        .create(empty.id)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    first.insert_file(empty.clone()).await.unwrap();
    let mut reader = reading
        .open(empty.id)
        .await
        .unwrap()
        .expect("a recorded file");
    assert!(reader.read().await.unwrap().is_empty());
}

/// `batch::counted` under the group commit, from two processes at once: every line of a batch
/// ends (completed, failed or cancelled) concurrently, and the counts add up to the total, each
/// line counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_line_ends_in_two_processes_count_each_line_once() {
    use lmsp_domain::batch::{Batch, BatchEndpoint, BatchLine, FilePurpose, NewBatch, StoredFile};
    use lmsp_domain::ids::{BatchId, FileId};
    use lmsp_domain::ports::{BatchStore, TaskStore};
    use lmsp_domain::transition::Step;
    use lmsp_storage_contract::{self as contract, RecordingListener};

    const LINES: u32 = 48;
    let factory = Postgres::new();
    let (first, _heard) = contract::fresh_store(&factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let client = contract::client_id();
    let worker = contract::instance_id();
    let input = StoredFile {
        id: FileId::from_ulid(contract::ulid()),
        client_id: client,
        filename: String::from("in.jsonl"),
        purpose: FilePurpose::Batch,
        bytes: 1,
        digest: String::from("00"),
        created_at: contract::time(0),
        batch_id: None,
    };
    first.insert_file(input.clone()).await.unwrap();
    let batch = Batch::new(NewBatch {
        id: BatchId::from_ulid(contract::ulid()),
        client_id: client,
        endpoint: BatchEndpoint::ChatCompletions,
        input_file_id: input.id,
        completion_window_ms: 60_000,
        metadata: Default::default(),
        created_at: contract::time(0),
    });
    first.insert_batch(batch.clone()).await.unwrap();
    let lines: Vec<_> = (1..=LINES)
        .map(|line| {
            let mut task = contract::TaskBuilder::new(worker).client(client).build();
            task.batch = Some(BatchLine {
                batch_id: batch.id,
                line,
                custom_id: format!("r{line}"),
            });
            task
        })
        .collect();
    second.stage_batch_tasks(lines.clone()).await.unwrap();
    first
        .start_batch(batch.started(contract::time(1)))
        .await
        .unwrap()
        .unwrap();
    let stores = [&first, &second];
    let ends = lines.iter().enumerate().map(|(index, task)| {
        let store = stores[index % 2];
        async move {
            match index % 3 {
                0 => {
                    let running = contract::support::step(
                        store,
                        task,
                        worker,
                        vec![contract::claim(task), Step::Loaded],
                        None,
                        contract::time(2),
                    )
                    .await;
                    contract::support::finish(
                        store,
                        &running,
                        worker,
                        contract::complete(&running, "ok", contract::time(3)),
                    )
                    .await;
                }
                1 => {
                    let loading = contract::support::step(
                        store,
                        task,
                        worker,
                        vec![contract::claim(task)],
                        None,
                        contract::time(2),
                    )
                    .await;
                    contract::support::finish(store, &loading, worker, contract::fail()).await;
                }
                _ => {
                    store
                        .cancel(task.id, None, contract::time(2))
                        .await
                        .unwrap();
                }
            }
        }
    });
    futures::future::join_all(ends).await;
    let stored = first.batch(batch.id).await.unwrap().unwrap();
    assert_eq!(stored.counts.total, u64::from(LINES));
    assert_eq!(stored.counts.completed, u64::from(LINES / 3));
    assert_eq!(stored.counts.failed, u64::from(LINES - LINES / 3));
}

/// `WebhookStore::claim_deliveries` from two processes at once: claims racing in both take each
/// delivery once, and never two of one endpoint while one of its deliveries is leased (claims
/// take their turn under an advisory lock, and lock the rows they lease with `SKIP LOCKED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_webhook_claims_in_two_processes_take_each_delivery_once() {
    use std::collections::HashSet;

    use lmsp_domain::ids::WebhookEndpointId;
    use lmsp_domain::ports::WebhookStore;
    use lmsp_domain::recovery::RestartPolicy;
    use lmsp_domain::status::TaskStatus;
    use lmsp_domain::webhooks::{AttemptOutcome, RetryPolicy, WebhookEndpoint, WebhookEventType};
    use lmsp_storage_contract::{self as contract, RecordingListener};

    const ENDPOINTS: usize = 6;
    const TASKS: usize = 5;
    let factory = Postgres::new();
    let (first, _heard) = contract::fresh_store(&factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    for n in 0..ENDPOINTS {
        first
            .insert_endpoint(WebhookEndpoint {
                id: WebhookEndpointId::from_ulid(contract::ulid()),
                name: format!("receiver {n}"),
                url: format!("https://hooks.example/{n}"),
                event_types: vec![WebhookEventType::ResponseCompleted],
                secret: String::from("whsec_c2VjcmV0"),
                previous_secret: None,
                created_at: contract::time(0),
                updated_at: contract::time(0),
            })
            .await
            .unwrap();
    }
    let worker = contract::instance_id();
    for _ in 0..TASKS {
        let task = contract::TaskBuilder::new(worker)
            .background()
            .policy(RestartPolicy::Fail)
            .build();
        contract::support::task_in(&first, task, worker, TaskStatus::Completed).await;
    }

    let stores = [&first, &second];
    let mut taken = HashSet::new();
    for round in 0..=TASKS as i64 {
        let now = contract::time(1_000 + round);
        let claims = (0..8).map(|n| {
            let store = stores[n % 2];
            async move {
                store
                    .claim_deliveries(now, now.plus_millis(60_000), 2, 1)
                    .await
                    .unwrap()
            }
        });
        let claimed: Vec<_> = futures::future::join_all(claims)
            .await
            .into_iter()
            .flatten()
            .collect();
        let endpoints: HashSet<_> = claimed.iter().map(|d| d.endpoint_id).collect();
        assert_eq!(
            endpoints.len(),
            claimed.len(),
            "round {round}: one leased delivery per endpoint at most"
        );
        let expected = if round < TASKS as i64 { ENDPOINTS } else { 0 };
        assert_eq!(
            claimed.len(),
            expected,
            "round {round}: one of each endpoint"
        );
        for delivery in claimed {
            assert!(
                taken.insert((delivery.endpoint_id, delivery.event_id.clone())),
                "taken twice: {delivery:?}"
            );
            let delivered = delivery.after_attempt(
                AttemptOutcome::Answered(200),
                &RetryPolicy::DEFAULT,
                now,
                0.0,
            );
            stores[round as usize % 2]
                .record_attempt(delivered)
                .await
                .unwrap();
        }
    }
    assert_eq!(taken.len(), ENDPOINTS * TASKS);
}

/// P-11 (a command that fails fails alone; the others written in its transaction stay written),
/// and I-2 (each task's log whole: every cancelled task has its one `response.cancelled`, the
/// refused one none):
/// cancels gathered by one write lane into shared transactions, one of which PostgreSQL refuses
/// (a trigger of this test's rejects the update of the one `flex` task). That cancel fails; the
/// 30 others are all written, each task cancelled once with its log whole.
///
/// The group commit sends a batch's writes without savepoints first (`batch.rs`: a row locked
/// by the transaction and updated by a savepoint gets a MultiXact), so a failure aborts the
/// whole transaction, and the batch is written again with a savepoint around each command.
/// This check fails if that second pass loses or repeats the others' writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_postgres_refuses_fails_alone_in_its_batch_p11() {
    use lmsp_domain::ports::{CancelOutcome, CreateOutcome, TaskStore};
    use lmsp_domain::recovery::RestartPolicy;
    use lmsp_domain::schedule::ServiceTier;
    use lmsp_domain::status::TaskStatus;
    use lmsp_storage_contract::{self as contract, RecordingListener};

    let factory = Postgres::with(PostgresOptions {
        pool_size: 4,
        write_lanes: 1,
        ..PostgresOptions::default()
    });
    let (first, _heard) = contract::fresh_store(&factory).await;
    let owner = contract::support::register(&first, "owner", contract::time(0))
        .await
        .id;
    let mut tasks = Vec::new();
    for index in 0..31 {
        let mut task = contract::task(owner, RestartPolicy::Retry);
        if index == 17 {
            task.service_tier = ServiceTier::Flex;
        }
        let CreateOutcome::Created(task) = first.create_task(task, None).await.unwrap() else {
            panic!("a create without a key or limit")
        };
        tasks.push(task);
    }
    let name = first.database().expect("the store names its database");
    admin(
        &database_url(&factory.base, &name),
        "CREATE FUNCTION refuse_flex() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
         CREATE TRIGGER refuse_flex BEFORE UPDATE ON tasks FOR EACH ROW \
         WHEN (OLD.tier = 2) EXECUTE FUNCTION refuse_flex();",
    )
    .await;
    // Another store: it has committed none of these rows, so every cancel reads its row first
    // and is written by the batch's read–decide–write path.
    let second = Arc::new(
        factory
            .another_process(&first, RecordingListener::new())
            .await,
    );
    let cancels = tasks.iter().map(|task| {
        let (second, id) = (Arc::clone(&second), task.id);
        tokio::spawn(async move { second.cancel(id, None, contract::time(10)).await })
    });
    let outcomes = futures::future::join_all(cancels).await;
    for (task, outcome) in tasks.iter().zip(outcomes) {
        let outcome = outcome.unwrap();
        let (after, events) = contract::assert_log_consistent(&first, task.id).await;
        if task.service_tier == ServiceTier::Flex {
            assert!(outcome.is_err(), "the refused cancel failed: {outcome:?}");
            assert_eq!(after.status, TaskStatus::Queued);
            assert_eq!(after.last_sequence_number, task.last_sequence_number);
        } else {
            assert!(
                matches!(outcome, Ok(CancelOutcome::Decided { .. })),
                "{outcome:?}"
            );
            assert_eq!(after.status, TaskStatus::Cancelled, "{:?}", task.id);
            assert_eq!(events.len() as u64, after.last_sequence_number);
            assert_eq!(
                after.last_sequence_number,
                task.last_sequence_number + 1,
                "cancelled once"
            );
        }
    }
}

/// A claim does not come back empty because another transaction held the only claimable task
/// for a moment (`SKIP LOCKED` passes over it): while a task is claimable, locks aside, the
/// adapter claims again (for at most a second), so a worker takes it when the holder lets go
/// instead of sleeping until its next wake-up. Here a transaction of this test locks the one
/// queued task and rolls back after 100 ms; the claim begun meanwhile gets the task. Before,
/// the claim answered `None` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_out_a_transaction_holding_the_only_queued_task() {
    use lmsp_domain::ports::TaskStore;
    use lmsp_domain::status::TaskStatus;
    use lmsp_storage_contract as contract;

    let factory = Postgres::new();
    let (store, owner, task, url) = one_queued_task(&factory).await;
    let (holder, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    let driver = tokio::spawn(connection);
    holder
        .batch_execute("BEGIN; SELECT 1 FROM tasks WHERE status = 'queued' FOR UPDATE")
        .await
        .unwrap();
    let store = Arc::new(store);
    let claim = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.claim_next(owner, contract::time(10)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    let claimed = claim.await.unwrap().unwrap();
    let claimed = claimed.expect("the claim took the task once the holder let go");
    assert_eq!(claimed.id, task.id);
    assert_eq!(claimed.status, TaskStatus::Loading);
    drop(holder);
    let _ = driver.await;
}

/// A fresh store with one queued task (its owner registered), and the URL of its database.
async fn one_queued_task(
    factory: &Postgres,
) -> (
    PostgresStore,
    lmsp_domain::ids::InstanceId,
    lmsp_domain::task::Task,
    String,
) {
    use lmsp_domain::ports::{CreateOutcome, TaskStore};
    use lmsp_domain::recovery::RestartPolicy;
    use lmsp_storage_contract as contract;

    let (store, _heard) = contract::fresh_store(factory).await;
    let owner = contract::support::register(&store, "owner", contract::time(0))
        .await
        .id;
    let task = contract::task(owner, RestartPolicy::Retry);
    let CreateOutcome::Created(task) = store.create_task(task, None).await.unwrap() else {
        panic!("a create without a key or limit")
    };
    let name = store.database().expect("the store names its database");
    let url = database_url(&factory.base, &name);
    (store, owner, task, url)
}

/// I-1 across an upgrade (a task the store acknowledged stays, with its spec): schema version 8
/// on a database of version 7. The next store to open it drops `task_specs`' foreign key (and
/// records the version); the task and spec already there stay readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_7_database_loses_the_spec_foreign_key_when_opened() {
    use lmsp_domain::ports::TaskStore;
    use lmsp_storage_contract::RecordingListener;

    let factory = Postgres::new();
    let (first, _owner, task, url) = one_queued_task(&factory).await;
    admin(
        &url,
        "ALTER TABLE task_specs ADD CONSTRAINT task_specs_task_id_fkey \
         FOREIGN KEY (task_id) REFERENCES tasks (id); \
         DELETE FROM schema_migrations WHERE version = 8;",
    )
    .await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    let driver = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_constraint \
                     WHERE conname = 'task_specs_task_id_fkey'), \
                    (SELECT max(version) FROM schema_migrations)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 0, "the foreign key is gone");
    assert_eq!(row.get::<_, i64>(1), 8);
    let read = second
        .task(task.id)
        .await
        .unwrap()
        .expect("the task is there");
    assert_eq!(read.spec, task.spec);
    drop(client);
    let _ = driver.await;
}
