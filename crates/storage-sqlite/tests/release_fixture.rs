//! The first release's database still reads: `tests/fixtures/release-0.1.0.db` was written by the
//! `lmsp` binary of the first release (commit 2255697, schema version 1) with
//! `tests/fixtures/make-release-0.1.0.sh`, which also wrote what it holds to
//! `tests/fixtures/release-0.1.0.expect.json`. Each check opens its own copy with the current
//! [`SqliteStore::open`], which migrates it to version 2 (the first release's tasks pass into the
//! care of the stopped legacy instance, its idempotency records move to the new table), and reads
//! every kind of row back through the ports:
//!
//! - I-2: every task's full log is consistent, with the kinds, output and error the first release
//!   wrote; statuses, specs, metadata, responses (P-3: the text of the deltas) and snapshots;
//! - clients (scopes, token hashes, revocation), the service identity, models (P-1: metadata only,
//!   the files are never read; one of them is gone);
//! - I-8: the first release's idempotency keys replay to the same request, are refused to
//!   another, and expire when they did;
//! - P-7…P-11, I-5: the unfinished tasks belong to the stopped legacy instance, which
//!   `stopped_instances` lists, and `recover_instance` moves them per the recovery table, once;
//!   the rescuer then carries on with them;
//! - a second open of the migrated file changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lmsp_domain::auth::{Client, Scope, Scopes, SecretHash};
use lmsp_domain::event::{Event, EventKind, EventPayload, QueueReason};
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyScope, KeyClaim, KeyDecision, Operation, RequestDigest, StoredReply,
};
use lmsp_domain::ids::{ClientId, InstanceId, ItemId, ResponseId, ServiceId, TaskId};
use lmsp_domain::model::{Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource};
use lmsp_domain::ports::{
    ClientStore, IdempotencyStore, InstanceStore, ModelStore, RecoveryReport, Registration,
    ServiceIdentity, ServiceStore, Snapshot, TaskFilter, TaskStore,
};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Input, Response, Role, Task, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use lmsp_domain::TaskErrorCode;
use lmsp_storage_contract::{self as contract, assert_log_consistent};
use lmsp_storage_sqlite::schema::{LEGACY_INSTANCE, SCHEMA_VERSION};
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};
use serde::Deserialize;
use serde_json::Value;
use ulid::Ulid;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/release-0.1.0.db"
);
const EXPECT: &str = include_str!("fixtures/release-0.1.0.expect.json");

/// What the script recorded about the fixture (`release-0.1.0.expect.json`).
#[derive(Debug, Deserialize)]
struct Expect {
    /// When the script killed the last server: the checks' clock starts here.
    at_ms: i64,
    user_version: i64,
    identity: IdentityDoc,
    service_config_keys: Vec<String>,
    pairings: i64,
    clients: Vec<ClientDoc>,
    models: Vec<ModelDoc>,
    tasks: Vec<TaskDoc>,
    snapshots: Vec<SnapshotDoc>,
    idempotency: Vec<KeyDoc>,
}

#[derive(Debug, Deserialize)]
struct IdentityDoc {
    id: String,
    created_at: i64,
}

#[derive(Debug, Deserialize)]
struct ClientDoc {
    id: String,
    name: String,
    scopes: Vec<String>,
    token_hash: String,
    created_at: i64,
    revoked_at: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct ModelDoc {
    id: String,
    format: String,
    path: String,
    size_bytes: u64,
    modified_millis: i64,
    digest: String,
    created_at: i64,
}

#[derive(Debug, Deserialize)]
struct TaskDoc {
    name: String,
    id: String,
    client: String,
    status: String,
    on_restart: String,
    model: String,
    metadata: BTreeMap<String, String>,
    created_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    last_sequence_number: u64,
    restarts: u32,
    error_code: Option<String>,
    response_id: Option<String>,
    output_text: Option<String>,
    usage: Option<UsageDoc>,
    /// The kinds of the log in order, a run of deltas as one.
    event_kinds: Vec<String>,
    /// The text of every delta, in order.
    delta_text: String,
}

#[derive(Debug, Deserialize)]
struct UsageDoc {
    input_tokens: u64,
    output_tokens: u64,
}

#[derive(Debug, Deserialize)]
struct SnapshotDoc {
    task: String,
    sequence_number: u64,
    state_hex: String,
}

#[derive(Debug, Deserialize)]
struct KeyDoc {
    client: String,
    operation: String,
    key: String,
    /// The request body, in canonical JSON.
    body: String,
    task: Option<String>,
    /// The reply the first release stored.
    reply: Value,
    created_at: i64,
    expires_at: i64,
}

impl Expect {
    fn load() -> Self {
        serde_json::from_str(EXPECT).expect("release-0.1.0.expect.json")
    }

    fn task(&self, name: &str) -> &TaskDoc {
        self.tasks
            .iter()
            .find(|task| task.name == name)
            .unwrap_or_else(|| panic!("no task `{name}` in the fixture"))
    }

    fn task_id(&self, name: &str) -> TaskId {
        TaskId::parse(&self.task(name).id).unwrap()
    }

    /// The checks' clock: a minute after the first release stopped.
    fn at(&self, offset_millis: i64) -> Timestamp {
        Timestamp::from_millis(self.at_ms + 60_000 + offset_millis)
    }
}

/// The instance that owns what the first release left unfinished.
fn legacy() -> InstanceId {
    InstanceId::from_ulid(Ulid::from_bytes(LEGACY_INSTANCE))
}

/// A copy of the fixture in a temporary directory (the committed file is never opened).
fn copy_fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lmsp.db");
    std::fs::copy(FIXTURE, &path).unwrap();
    (dir, path)
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open_without_listener(path, SqliteOptions::default()).unwrap()
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// The canonical JSON of a value, as the HTTP edge digests a request body
/// (`lmsp_http::extract::canonical_json`): keys sorted, no insignificant whitespace.
fn canonical_json(value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|key| {
                    let name = Value::String(key.clone()).to_string();
                    format!("{name}:{}", canonical_json(&fields[key.as_str()]))
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical_json).collect();
            format!("[{}]", items.join(","))
        }
        leaf => leaf.to_string(),
    }
}

/// The digest the app claims a key with for a request body (`JsonBody::digest`).
fn digest_of(body: &str) -> RequestDigest {
    let value: Value = serde_json::from_str(body).unwrap();
    let canonical = canonical_json(&value);
    assert_eq!(canonical, body, "the script sends canonical bodies");
    RequestDigest::of_canonical(canonical.as_bytes())
}

/// The kinds of a log, a run of deltas as one (the form of `event_kinds`).
fn collapsed_kinds(events: &[Event]) -> Vec<String> {
    let mut kinds: Vec<String> = Vec::new();
    for event in events {
        let name = event.kind().name();
        let repeat = kinds.last().map(String::as_str) == Some(name);
        if !(repeat && event.kind() == EventKind::OutputTextDelta) {
            kinds.push(name.to_owned());
        }
    }
    kinds
}

fn delta_text(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::OutputTextDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

/// Everything the ports read from a store, to compare two openings.
#[derive(Debug, PartialEq)]
struct Everything {
    tasks: Vec<Task>,
    logs: Vec<Vec<Event>>,
    responses: Vec<Option<Response>>,
    snapshots: Vec<Option<Snapshot>>,
    counts: Vec<(TaskStatus, u64)>,
    clients: Vec<Client>,
    models: Vec<ModelRecord>,
}

async fn everything(store: &SqliteStore) -> Everything {
    let page = store
        .list_tasks(TaskFilter {
            limit: 1000,
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert!(!page.has_more);
    let mut all = Everything {
        tasks: page.items,
        logs: Vec::new(),
        responses: Vec::new(),
        snapshots: Vec::new(),
        counts: store.count_by_status().await.unwrap(),
        clients: store.list_clients().await.unwrap(),
        models: store.list_models().await.unwrap(),
    };
    for task in &all.tasks {
        all.logs.push(contract::all_events(store, task.id).await);
        all.responses.push(store.response(task.id).await.unwrap());
        all.snapshots.push(store.snapshot(task.id).await.unwrap());
    }
    all
}

/// Every row of every table, the schema and the version, as text, straight from the file.
fn raw_dump(path: &Path) -> Vec<String> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    let mut dump = vec![format!("user_version {version}")];
    let schema: Vec<(String, String, Option<String>)> = conn
        .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (kind, name, sql) in &schema {
        dump.push(format!("{kind} {name}: {sql:?}"));
        if kind != "table" {
            continue;
        }
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{name}\"")).unwrap();
        let columns = stmt.column_count();
        let mut rows: Vec<String> = stmt
            .query_map([], |row| {
                (0..columns)
                    .map(|i| row.get::<_, rusqlite::types::Value>(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap()
            .map(|row| format!("{name} {:?}", row.unwrap()))
            .collect();
        rows.sort();
        dump.extend(rows);
    }
    dump
}

/// I-2, P-3, P-1: every row kind of the first release reads back through the ports. Every task's
/// full log is consistent (I-2) and holds the kinds, deltas and errors the first release wrote;
/// tasks keep their status, spec, metadata, times and restarts and are in the care of the legacy
/// instance; completed tasks have their responses under the ids the first release gave them
/// (their text is the deltas', P-3) and unfinished ones the id derived from their own; running
/// tasks keep their snapshots; clients their scopes, token hashes and revocation; models their
/// metadata only (P-1: `gone`'s file no longer exists); the identity stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_release_rows_read_back_through_the_ports_i2_p3_p1() {
    let expect = Expect::load();
    let (_dir, path) = copy_fixture();
    assert_eq!(
        raw_dump(&path)[0],
        format!("user_version {}", expect.user_version)
    );
    assert_eq!(expect.user_version, 1, "the fixture has the first layout");
    let store = open(&path);

    // Tasks and their logs (I-2).
    let listed = store
        .list_tasks(TaskFilter {
            limit: 100,
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    let mut ids: Vec<TaskId> = expect
        .tasks
        .iter()
        .map(|t| TaskId::parse(&t.id).unwrap())
        .collect();
    ids.sort();
    ids.reverse();
    assert_eq!(
        listed.items.iter().map(|t| t.id).collect::<Vec<_>>(),
        ids,
        "every task, newest first"
    );
    for doc in &expect.tasks {
        let id = TaskId::parse(&doc.id).unwrap();
        let (task, events) = assert_log_consistent(&store, id).await;
        let name = &doc.name;
        assert_eq!(task.status.as_str(), doc.status, "{name}: status");
        assert_eq!(
            task.on_restart.as_str(),
            doc.on_restart,
            "{name}: on_restart"
        );
        assert_eq!(task.model.as_str(), doc.model, "{name}: model");
        assert_eq!(task.client_id.to_string(), doc.client, "{name}: client");
        assert_eq!(task.metadata, doc.metadata, "{name}: metadata");
        assert_eq!(task.created_at.as_millis(), doc.created_at, "{name}");
        assert_eq!(task.started_at.map(Timestamp::as_millis), doc.started_at);
        assert_eq!(task.finished_at.map(Timestamp::as_millis), doc.finished_at);
        assert_eq!(task.last_sequence_number, doc.last_sequence_number);
        assert_eq!(task.restarts, doc.restarts, "{name}: restarts");
        assert_eq!(
            task.error.as_ref().map(|e| e.code.as_str()),
            doc.error_code.as_deref(),
            "{name}: error"
        );
        // The first release kept no owner, no background flag and no output items.
        assert_eq!(
            (task.owner, task.accepted_by),
            (legacy(), legacy()),
            "{name}"
        );
        assert!(
            !task.background,
            "{name}: the first release did not store it"
        );
        assert_eq!((task.items.opened, task.items.open), (0, false), "{name}");

        assert_eq!(events[0].created_at, task.created_at, "{name}: created");
        assert_eq!(collapsed_kinds(&events), doc.event_kinds, "{name}: kinds");
        assert_eq!(delta_text(&events), doc.delta_text, "{name}: deltas");
        for event in &events {
            match &event.payload {
                EventPayload::Created { task: created } => {
                    assert_eq!(**created, task.as_created(), "{name}: response.created")
                }
                EventPayload::Loading { model } => assert_eq!(*model, task.model),
                EventPayload::OutputTextDelta { item, .. } => {
                    assert_eq!(*item, ItemId::of(id, 0), "{name}: a delta's item")
                }
                EventPayload::Queued { reason } => {
                    assert_eq!(*reason, QueueReason::ServerRestarted)
                }
                EventPayload::Resumed {
                    from_sequence_number,
                } => assert!(*from_sequence_number < event.sequence_number),
                EventPayload::Failed { error } => {
                    assert_eq!(Some(error), task.error.as_ref(), "{name}: response.failed")
                }
                _ => {}
            }
        }

        let response = store.response(id).await.unwrap();
        match &doc.response_id {
            Some(response_id) => {
                let response = response.unwrap_or_else(|| panic!("{name}: no response"));
                let response_id = ResponseId::parse(response_id).unwrap();
                assert_eq!(task.response_id, response_id, "{name}: its own response id");
                assert_eq!(response.id, response_id);
                assert_eq!(response.task_id, id);
                assert_eq!(response.model, task.model);
                assert_eq!(Some(&response.output_text), doc.output_text.as_ref());
                let usage = doc.usage.as_ref().unwrap();
                assert_eq!(
                    response.usage,
                    Usage {
                        input_tokens: usage.input_tokens,
                        output_tokens: usage.output_tokens,
                        cached_tokens: 0,
                    }
                );
                assert_eq!(
                    response.output_text, doc.delta_text,
                    "P-3: the deltas' text"
                );
                assert_eq!(response.created_at, task.created_at);
                assert_eq!(Some(response.completed_at), task.finished_at);
                let Some(EventPayload::Completed { response: logged }) =
                    events.last().map(|e| &e.payload)
                else {
                    panic!("{name}: not completed last");
                };
                assert_eq!(**logged, response);
                let found = store.task_by_response(response_id).await.unwrap();
                assert_eq!(found.map(|t| t.id), Some(id), "{name}: by response");
                let derived = ResponseId::from_ulid(id.ulid());
                assert!(store.task_by_response(derived).await.unwrap().is_none());
            }
            None => {
                assert!(response.is_none(), "{name}: a response");
                assert_eq!(task.response_id, ResponseId::from_ulid(id.ulid()));
                let found = store.task_by_response(task.response_id).await.unwrap();
                assert_eq!(found.map(|t| t.id), Some(id), "{name}: by response");
            }
        }
    }

    // Listing by client, status and model goes by the stored columns.
    let laptop = ClientId::parse(&expect.clients[1].id).unwrap();
    let filtered = |filter: TaskFilter| {
        let store = &store;
        async move {
            let mut ids: Vec<TaskId> = store
                .list_tasks(TaskFilter {
                    limit: 100,
                    ..filter
                })
                .await
                .unwrap()
                .items
                .iter()
                .map(|t| t.id)
                .collect();
            ids.sort();
            ids
        }
    };
    let of = |keep: &dyn Fn(&TaskDoc) -> bool| {
        let mut ids: Vec<TaskId> = expect
            .tasks
            .iter()
            .filter(|t| keep(t))
            .map(|t| TaskId::parse(&t.id).unwrap())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        filtered(TaskFilter {
            client_id: Some(laptop),
            ..TaskFilter::default()
        })
        .await,
        of(&|t| t.client == expect.clients[1].id)
    );
    assert_eq!(
        filtered(TaskFilter {
            statuses: vec![TaskStatus::Failed, TaskStatus::Cancelled],
            ..TaskFilter::default()
        })
        .await,
        of(&|t| t.status == "failed" || t.status == "cancelled")
    );
    assert_eq!(
        filtered(TaskFilter {
            model: Some(ModelId::parse("tiny").unwrap()),
            ..TaskFilter::default()
        })
        .await,
        of(&|t| t.model == "tiny")
    );

    // The specs the script sent.
    let done = store.task(expect.task_id("done")).await.unwrap().unwrap();
    assert_eq!(done.spec.input, Input::Text("Once upon a time".into()));
    assert_eq!((done.spec.max_output_tokens, done.spec.seed), (8, 42));
    let sync = store.task(expect.task_id("sync")).await.unwrap().unwrap();
    let messages = sync.spec.input.messages();
    assert_eq!(
        messages
            .iter()
            .map(|m| (m.role, m.content.as_str()))
            .collect::<Vec<_>>(),
        [(Role::System, "Be brief."), (Role::User, "Tell me a story")]
    );
    assert_eq!((sync.spec.max_output_tokens, sync.spec.seed), (6, 7));
    assert_eq!(sync.spec.instructions, None);
    let fail = store.task(expect.task_id("fail")).await.unwrap().unwrap();
    assert_eq!(fail.error.unwrap().code, TaskErrorCode::ModelUnavailable);
    let failr = store.task(expect.task_id("failr")).await.unwrap().unwrap();
    assert_eq!(failr.error.unwrap().code, TaskErrorCode::ServerRestarted);

    let mut counts = store.count_by_status().await.unwrap();
    counts.sort_by_key(|(status, _)| status.as_str());
    let mut expected_counts: BTreeMap<&str, u64> = BTreeMap::new();
    for doc in &expect.tasks {
        *expected_counts.entry(doc.status.as_str()).or_default() += 1;
    }
    assert_eq!(
        counts
            .iter()
            .map(|(status, n)| (status.as_str(), *n))
            .collect::<BTreeMap<_, _>>(),
        expected_counts
    );
    assert_eq!(expected_counts.len(), 7, "a task in every status");

    // Snapshots: those of the running task and of the one cancelled while it ran.
    for doc in &expect.tasks {
        let id = TaskId::parse(&doc.id).unwrap();
        let stored = store.snapshot(id).await.unwrap();
        match expect.snapshots.iter().find(|s| s.task == doc.id) {
            Some(snapshot) => assert_eq!(
                stored,
                Some(Snapshot {
                    sequence_number: snapshot.sequence_number,
                    state: hex(&snapshot.state_hex),
                }),
                "{}: snapshot",
                doc.name
            ),
            None => assert_eq!(stored, None, "{}: snapshot", doc.name),
        }
    }
    let resume = expect.task("resume");
    assert_eq!(
        (resume.status.as_str(), resume.on_restart.as_str()),
        ("running", "resume")
    );
    // It ran on from its snapshot after the first release's own recovery, and was killed with
    // a snapshot of its last output.
    assert_eq!(
        resume.event_kinds[resume.event_kinds.len() - 2..],
        ["response.resumed", "response.output_text.delta"]
    );
    let snapshot = expect.snapshots.iter().find(|s| s.task == resume.id);
    assert_eq!(
        snapshot.map(|s| s.sequence_number),
        Some(resume.last_sequence_number)
    );

    // Clients.
    let clients = store.list_clients().await.unwrap();
    let expected_clients: Vec<Client> = expect
        .clients
        .iter()
        .map(|doc| Client {
            id: ClientId::parse(&doc.id).unwrap(),
            name: doc.name.clone(),
            scopes: Scopes::new(doc.scopes.iter().map(|s| Scope::parse(s).unwrap())),
            token_hash: SecretHash::from_hex(&doc.token_hash).unwrap(),
            created_at: Timestamp::from_millis(doc.created_at),
            revoked_at: doc.revoked_at.map(Timestamp::from_millis),
        })
        .collect();
    assert_eq!(clients, expected_clients);
    let names: Vec<(&str, bool)> = clients
        .iter()
        .map(|c| (c.name.as_str(), c.revoked_at.is_some()))
        .collect();
    assert_eq!(
        names,
        [("admin", false), ("laptop", false), ("old-phone", true)]
    );
    assert_eq!(clients[0].scopes, Scopes::new([Scope::Admin]));
    assert_eq!(
        clients[1].scopes,
        Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite])
    );
    for client in &clients {
        assert_eq!(
            store.client(client.id).await.unwrap().as_ref(),
            Some(client)
        );
        let by_token = store.client_by_token_hash(client.token_hash).await.unwrap();
        if client.revoked_at.is_some() {
            assert_eq!(by_token, None, "a revoked token does not authenticate");
        } else {
            assert_eq!(by_token.as_ref(), Some(client));
        }
    }

    // Models (P-1: metadata only).
    let models = store.list_models().await.unwrap();
    let expected_models: Vec<ModelRecord> = expect
        .models
        .iter()
        .map(|doc| ModelRecord {
            id: ModelId::parse(&doc.id).unwrap(),
            source: ModelSource::File {
                format: ModelFormat::parse(&doc.format),
                file: FileFingerprint {
                    path: doc.path.clone(),
                    size_bytes: doc.size_bytes,
                    modified_millis: doc.modified_millis,
                    digest: Digest::parse(&doc.digest).unwrap(),
                },
            },
            created_at: Timestamp::from_millis(doc.created_at),
        })
        .collect();
    assert_eq!(models, expected_models);
    assert_eq!(
        models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        ["gone", "reference", "tiny"]
    );
    assert!(models.iter().all(|m| m.file().is_some()));
    assert_eq!(models[2].format_name(), "gguf");
    let gone = store.model(&ModelId::parse("gone").unwrap()).await.unwrap();
    assert!(!Path::new(&gone.unwrap().file().unwrap().path).exists());

    // The identity stays; initializing again stores nothing.
    let identity = ServiceIdentity {
        id: ServiceId::parse(&expect.identity.id).unwrap(),
        created_at: Timestamp::from_millis(expect.identity.created_at),
    };
    let (admin, _token) = contract::client(&[Scope::Admin]);
    let initialized = store
        .initialize(contract::identity(expect.at(0)), admin)
        .await
        .unwrap();
    assert!(!initialized.first_start);
    assert_eq!(initialized.identity, identity);
    assert_eq!(store.list_clients().await.unwrap(), clients);
    store.check_writable(expect.at(0)).await.unwrap();
}

/// I-8: the first release's idempotency records moved with the migration and answer as they
/// did: the same request (its canonical body's digest, the client and operation of the key)
/// gets the first reply again, naming the task it created; another body under the key is
/// refused; and a record expires when the first release said it would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_release_idempotency_keys_replay_i8() {
    let expect = Expect::load();
    let (_dir, path) = copy_fixture();
    let store = open(&path);
    let rescuer = contract::instance_id();
    let claim = |doc: &KeyDoc, body: &str, now: Timestamp| KeyClaim {
        scope: IdempotencyScope {
            client_id: ClientId::parse(&doc.client).unwrap(),
            operation: Operation::parse(&doc.operation).unwrap(),
        },
        key: IdempotencyKey::parse(&doc.key).unwrap(),
        digest: digest_of(body),
        holder: rescuer,
        hold_until: now.plus_millis(contract::HOLD_MILLIS),
        expires_at: now.plus_millis(contract::TTL_MILLIS),
    };
    assert_eq!(
        expect
            .idempotency
            .iter()
            .map(|k| (k.key.as_str(), k.operation.as_str()))
            .collect::<Vec<_>>(),
        [
            ("add-tiny", "register_model"),
            ("create-done", "create_response"),
            ("create-sync", "create_response"),
        ]
    );
    let now = expect.at(0);
    for doc in &expect.idempotency {
        assert!(doc.expires_at > now.as_millis() && doc.created_at < expect.at_ms);
        let decision = store.claim_key(&claim(doc, &doc.body, now), now).await;
        let KeyDecision::Replay(StoredReply { task_id, body }) = decision.unwrap() else {
            panic!("{}: the same request does not replay", doc.key);
        };
        assert_eq!(
            task_id,
            doc.task.as_deref().map(|id| TaskId::parse(id).unwrap()),
            "{}: the reply's task",
            doc.key
        );
        let reply: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(reply, doc.reply, "{}: the first reply, as stored", doc.key);

        let mut other: Value = serde_json::from_str(&doc.body).unwrap();
        other["seed"] = Value::from(1234);
        let other = canonical_json(&other);
        let decision = store.claim_key(&claim(doc, &other, now), now).await;
        assert_eq!(decision.unwrap(), KeyDecision::Reused, "{}", doc.key);
    }
    let done = expect.task("done");
    let reply = &expect.idempotency[1].reply;
    assert_eq!(reply["status"], 202);
    assert_eq!(reply["task_id"].as_str(), Some(done.id.as_str()));
    assert_eq!(expect.idempotency[2].reply["from_task"], "outcome");
    assert_eq!(expect.idempotency[0].reply["status"], 201);

    // The same key for another operation, or of another client, is another key.
    let tiny = &expect.idempotency[0];
    let mut elsewhere = claim(tiny, &tiny.body, now);
    elsewhere.scope.operation = Operation::CreateResponse;
    assert_eq!(
        store.claim_key(&elsewhere, now).await.unwrap(),
        KeyDecision::Proceed
    );
    // Expired when the first release said: the key is free again.
    let after = Timestamp::from_millis(tiny.expires_at);
    assert_eq!(
        store
            .claim_key(&claim(tiny, &tiny.body, after), after)
            .await
            .unwrap(),
        KeyDecision::Proceed
    );
}

/// P-7…P-11, I-5: what the first release left unfinished is in the care of the legacy instance,
/// which is stopped: `stopped_instances` lists it for the next instance, and `recover_instance`
/// moves each leftover per the recovery table (`queued`+retry untouched, `loading`+resume back to
/// the queue, `running`+resume resumed from its snapshot, `cancelling` cancelled), finished tasks
/// untouched; a second pass changes nothing, and the legacy instance is no longer listed. The
/// rescuer then carries on: it finishes the resumed task and claims the queued ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_release_leftovers_are_recovered_from_the_legacy_instance_p7_i5() {
    let expect = Expect::load();
    let (_dir, path) = copy_fixture();
    let store = open(&path);
    let at = expect.at(0);
    let rescuer = contract::instance("rescuer", at, 30_000);
    let Registration::Registered { previous } =
        store.register_instance(rescuer.clone()).await.unwrap()
    else {
        panic!("the rescuer did not register");
    };
    assert!(previous.is_empty(), "the legacy instance has another name");
    let rescuer = rescuer.id;
    assert_eq!(
        store.stopped_instances(rescuer, at).await.unwrap(),
        [legacy()]
    );
    assert_eq!(
        store.cancelling_tasks(legacy()).await.unwrap(),
        [expect.task_id("retry")]
    );
    let mut before = BTreeMap::new();
    for doc in &expect.tasks {
        let id = TaskId::parse(&doc.id).unwrap();
        before.insert(doc.name.as_str(), assert_log_consistent(&store, id).await);
    }

    let report = store.recover_instance(legacy(), rescuer, at).await.unwrap();
    assert_eq!(
        report,
        RecoveryReport {
            moved: 3,
            untouched: 1,
            resumed: vec![expect.task_id("resume")],
        }
    );
    assert!(store
        .stopped_instances(rescuer, at)
        .await
        .unwrap()
        .is_empty());

    // Each task against the table, its log grown by exactly the recovery's event.
    let resume_snapshot = expect
        .snapshots
        .iter()
        .find(|s| s.task == expect.task("resume").id)
        .unwrap()
        .sequence_number;
    for doc in &expect.tasks {
        let id = TaskId::parse(&doc.id).unwrap();
        let (old, old_events) = &before[doc.name.as_str()];
        let (task, events) = assert_log_consistent(&store, id).await;
        let added: Vec<&EventPayload> = events[old_events.len()..]
            .iter()
            .map(|e| &e.payload)
            .collect();
        assert_eq!(events[..old_events.len()], old_events[..], "{}", doc.name);
        let moved = |status| {
            assert_eq!(task.status, status, "{}", doc.name);
            assert_eq!(task.owner, rescuer, "{}: passes to the rescuer", doc.name);
            assert_eq!(task.restarts, old.restarts + 1, "{}", doc.name);
            assert_eq!(task.accepted_by, legacy());
        };
        match doc.name.as_str() {
            "queued" => {
                assert_eq!(old.on_restart, RestartPolicy::Retry);
                assert_eq!(&task, old, "queued under retry: untouched");
                assert!(added.is_empty());
            }
            "load" => {
                assert_eq!(
                    (old.status, old.on_restart),
                    (TaskStatus::Loading, RestartPolicy::Resume)
                );
                moved(TaskStatus::Queued);
                assert_eq!(
                    added,
                    [&EventPayload::Queued {
                        reason: QueueReason::ServerRestarted
                    }]
                );
            }
            "resume" => {
                assert_eq!(
                    (old.status, old.on_restart),
                    (TaskStatus::Running, RestartPolicy::Resume)
                );
                moved(TaskStatus::Running);
                assert_eq!(
                    added,
                    [&EventPayload::Resumed {
                        from_sequence_number: resume_snapshot
                    }]
                );
                assert!(store.snapshot(id).await.unwrap().is_some());
            }
            "retry" => {
                assert_eq!(old.status, TaskStatus::Cancelling);
                moved(TaskStatus::Cancelled);
                assert_eq!(added, [&EventPayload::Cancelled]);
                assert_eq!(task.finished_at, Some(at));
                assert_eq!(store.snapshot(id).await.unwrap(), None, "a finished task's");
            }
            _ => {
                assert!(old.status.is_finished(), "{}", doc.name);
                assert_eq!(&task, old, "{}: finished, untouched", doc.name);
                assert!(added.is_empty());
            }
        }
    }

    // I-5: a second pass changes nothing (the queued task, left in the legacy instance's care,
    // is looked at again and left again).
    let settled = everything(&store).await;
    let again = store
        .recover_instance(legacy(), rescuer, expect.at(1))
        .await
        .unwrap();
    assert_eq!(
        again,
        RecoveryReport {
            moved: 0,
            untouched: 1,
            resumed: Vec::new(),
        }
    );
    assert_eq!(everything(&store).await, settled);

    // The rescuer carries on: the resumed task completes under its derived response id…
    let resume = store.task(expect.task_id("resume")).await.unwrap().unwrap();
    let text_so_far = expect.task("resume").delta_text.clone();
    let more = contract::support::step(
        &store,
        &resume,
        rescuer,
        vec![contract::output(" and more")],
        None,
        expect.at(2),
    )
    .await;
    let response = Response {
        id: more.response_id,
        task_id: more.id,
        model: more.model.clone(),
        output_text: format!("{text_so_far} and more"),
        calls: Vec::new(),
        logprobs: Vec::new(),
        usage: Usage {
            input_tokens: 2,
            output_tokens: 40,
            cached_tokens: 0,
        },
        created_at: more.created_at,
        completed_at: expect.at(3),
    };
    let finishing = Step::Complete {
        response: Box::new(response.clone()),
    };
    let outcome = store
        .finish(more.id, rescuer, finishing, expect.at(3))
        .await
        .unwrap();
    let (finished, _) = contract::support::applied(outcome);
    assert_eq!(finished.status, TaskStatus::Completed);
    let (_, events) = assert_log_consistent(&store, resume.id).await;
    assert_eq!(store.response(resume.id).await.unwrap(), Some(response));
    let by_response = store.task_by_response(resume.response_id).await.unwrap();
    assert_eq!(by_response.map(|t| t.id), Some(resume.id));
    assert_eq!(store.snapshot(resume.id).await.unwrap(), None);
    assert_eq!(delta_text(&events), format!("{text_so_far} and more"));

    // …and claims the queued tasks, oldest first.
    for name in ["load", "queued"] {
        let claimed = store.claim_next(rescuer, expect.at(4)).await.unwrap();
        assert_eq!(claimed.map(|t| t.id), Some(expect.task_id(name)));
        let (task, _) = assert_log_consistent(&store, expect.task_id(name)).await;
        assert_eq!((task.status, task.owner), (TaskStatus::Loading, rescuer));
    }
    assert_eq!(store.claim_next(rescuer, expect.at(5)).await.unwrap(), None);
}

/// The migration runs once: the file after the first open (this build's version, the legacy instance
/// listed, the first release's start counter gone) is exactly the file after a second open, and
/// the ports read the same from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_open_of_the_migrated_file_changes_nothing() {
    let expect = Expect::load();
    let (_dir, path) = copy_fixture();
    let original = raw_dump(&path);
    assert!(original
        .iter()
        .any(|line| line.starts_with("table idempotency_keys")));

    let store = open(&path);
    let first = everything(&store).await;
    store.close();
    drop(store);
    let migrated = raw_dump(&path);
    assert_ne!(migrated, original);
    assert_eq!(migrated[0], format!("user_version {SCHEMA_VERSION}"));
    let legacy_row = format!(
        "instances [Blob({:?}), Text(\"release 0.1\"), Integer(0), Integer(0), Integer(0), Null]",
        LEGACY_INSTANCE.to_vec()
    );
    assert!(
        migrated.contains(&legacy_row),
        "the stopped legacy instance"
    );
    let config: Vec<&String> = migrated
        .iter()
        .filter(|line| line.starts_with("service_config ["))
        .collect();
    assert_eq!(
        config.len(),
        expect.service_config_keys.len() - 1,
        "start_epoch goes: {config:?}"
    );
    assert!(!config.iter().any(|line| line.contains("start_epoch")));
    let pairings = migrated
        .iter()
        .filter(|line| line.starts_with("pairings ["))
        .count();
    assert_eq!(
        pairings as i64, expect.pairings,
        "the unredeemed code stays"
    );
    let keys = migrated
        .iter()
        .filter(|line| line.starts_with("idempotency_keys ["))
        .count();
    assert_eq!(keys, expect.idempotency.len(), "every key moved");

    let store = open(&path);
    let second = everything(&store).await;
    store.close();
    drop(store);
    assert_eq!(raw_dump(&path), migrated, "the second open wrote nothing");
    assert_eq!(second, first);
    assert_eq!(second.tasks.len(), expect.tasks.len());
}

/// P-5, P-6: the first release's finished tasks purge with their events, responses and
/// snapshots, its unfinished ones stay; the idempotency keys outlive their tasks (I-8): the key
/// of a purged task still replays its first reply, now naming no stored task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_release_finished_tasks_purge_and_their_keys_stay_p5_p6() {
    let expect = Expect::load();
    let (_dir, path) = copy_fixture();
    let store = open(&path);
    let finished: Vec<&TaskDoc> = expect
        .tasks
        .iter()
        .filter(|t| ["completed", "failed", "cancelled"].contains(&t.status.as_str()))
        .collect();
    let cutoff = Timestamp::from_millis(expect.at_ms + 1);
    let mut purged = 0;
    loop {
        let report = store.purge_finished(cutoff, 2).await.unwrap();
        purged += report.tasks;
        if !report.more {
            break;
        }
    }
    assert_eq!(purged, finished.len() as u64);
    for doc in &expect.tasks {
        let id = TaskId::parse(&doc.id).unwrap();
        if finished.iter().any(|t| t.id == doc.id) {
            assert_eq!(store.task(id).await.unwrap(), None, "{}", doc.name);
            assert!(store.events(id, 0, 10).await.unwrap().items.is_empty());
            assert_eq!(store.response(id).await.unwrap(), None);
        } else {
            assert_log_consistent(&store, id).await;
        }
    }
    let done = &expect.idempotency[1];
    assert_eq!(done.key, "create-done");
    let now = expect.at(0);
    let claim = KeyClaim {
        scope: IdempotencyScope {
            client_id: ClientId::parse(&done.client).unwrap(),
            operation: Operation::CreateResponse,
        },
        key: IdempotencyKey::parse(&done.key).unwrap(),
        digest: digest_of(&done.body),
        holder: contract::instance_id(),
        hold_until: now.plus_millis(contract::HOLD_MILLIS),
        expires_at: now.plus_millis(contract::TTL_MILLIS),
    };
    let KeyDecision::Replay(reply) = store.claim_key(&claim, now).await.unwrap() else {
        panic!("the key of a purged task does not replay");
    };
    assert_eq!(reply.task_id, None);
    assert_eq!(
        serde_json::from_slice::<Value>(&reply.body).unwrap(),
        done.reply
    );
}
