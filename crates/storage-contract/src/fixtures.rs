//! Fixture builders: ids, tasks, steps, responses, idempotency claims and replies, clients,
//! pairing codes, models, instances. Public, so adapters' own tests (crash and race tests, a
//! benchmark) build the same values as the suite.
//!
//! Ids are ULIDs made from a process-wide counter and the process id: they sort in creation
//! order within a process, and two processes writing one database (the crash test) never make
//! the same id. A task's `created_at` is its id's timestamp, so "oldest" means the same by id
//! and by time.

use std::sync::atomic::{AtomicU64, Ordering};

use lmsp_domain::auth::{Client, Pairing, Scope, Scopes, Secret, PAIRING_TTL_MILLIS};
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, Operation, RequestDigest,
    StoredReply,
};
use lmsp_domain::ids::{ClientId, InstanceId, ServiceId, TaskId};
use lmsp_domain::model::{Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource};
use lmsp_domain::ports::{InstanceInfo, ServiceIdentity, Snapshot};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::ServiceTier;
use lmsp_domain::task::{Input, Metadata, NewTask, Response, Task, TaskError, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_domain::tools::Controls;
use lmsp_domain::transition::Step;
use lmsp_domain::TaskErrorCode;
use ulid::Ulid;

/// The base time of the fixtures: every `at` of the suite is `T0` plus an offset.
pub const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// `T0` plus `offset_millis`.
pub const fn time(offset_millis: i64) -> Timestamp {
    T0.plus_millis(offset_millis)
}

/// How long the suite's idempotency claims hold their key.
pub const HOLD_MILLIS: i64 = 60_000;
/// How long the suite's idempotency records live.
pub const TTL_MILLIS: i64 = 24 * 60 * 60 * 1000;

static COUNTER: AtomicU64 = AtomicU64::new(1);

fn next() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A fresh ULID that sorts after every earlier one of this process; its timestamp is `T0` plus
/// the counter, its random part names the counter and the process.
pub fn ulid() -> Ulid {
    let n = next();
    Ulid::from_parts(
        T0.as_millis() as u64 + n,
        (u128::from(n) << 32) | u128::from(std::process::id()),
    )
}

/// A fresh task id.
pub fn task_id() -> TaskId {
    TaskId::from_ulid(ulid())
}

/// A fresh client id.
pub fn client_id() -> ClientId {
    ClientId::from_ulid(ulid())
}

/// A fresh instance id.
pub fn instance_id() -> InstanceId {
    InstanceId::from_ulid(ulid())
}

/// A fresh service id.
pub fn service_id() -> ServiceId {
    ServiceId::from_ulid(ulid())
}

/// The reference model's id.
pub fn model_id() -> ModelId {
    ModelId::parse(ModelId::REFERENCE).expect("a valid model id")
}

/// A model id from text.
pub fn model(id: &str) -> ModelId {
    ModelId::parse(id).expect("a valid model id")
}

/// Builds a new `queued` task ([`Task::new_queued`]).
#[derive(Debug, Clone)]
pub struct TaskBuilder {
    new: NewTask,
}

impl TaskBuilder {
    /// A task accepted by instance `owner`: a fresh id and client, the reference model, policy
    /// `fail`, not in the background, a small prompt, created at its id's time.
    pub fn new(owner: InstanceId) -> Self {
        let id = task_id();
        Self {
            new: NewTask {
                id,
                client_id: client_id(),
                owner,
                model: model_id(),
                on_restart: RestartPolicy::Fail,
                background: false,
                spec: TaskSpec {
                    input: Input::Text(String::from("Once upon a time")),
                    instructions: None,
                    max_output_tokens: 16,
                    seed: 7,
                    temperature: None,
                    top_p: None,
                    previous_response_id: None,
                    controls: Controls::default(),
                },
                metadata: Metadata::new(),
                created_at: Timestamp::from_millis(id.ulid().timestamp_ms() as i64),
                service_tier: ServiceTier::Default,
            },
        }
    }

    /// Of this client.
    pub fn client(mut self, client: ClientId) -> Self {
        self.new.client_id = client;
        self
    }

    /// With this restart policy.
    pub fn policy(mut self, policy: RestartPolicy) -> Self {
        self.new.on_restart = policy;
        self
    }

    /// At this service tier.
    pub fn tier(mut self, tier: ServiceTier) -> Self {
        self.new.service_tier = tier;
        self
    }

    /// Accepted at `at` (by default: its id's time).
    pub fn created(mut self, at: Timestamp) -> Self {
        self.new.created_at = at;
        self
    }

    /// On this model.
    pub fn model(mut self, model: ModelId) -> Self {
        self.new.model = model;
        self
    }

    /// Submitted in the background.
    pub fn background(mut self) -> Self {
        self.new.background = true;
        self
    }

    /// With this metadata pair.
    pub fn metadata(mut self, key: &str, value: &str) -> Self {
        self.new.metadata.insert(key.to_owned(), value.to_owned());
        self
    }

    /// With this spec.
    pub fn spec(mut self, spec: TaskSpec) -> Self {
        self.new.spec = spec;
        self
    }

    /// The task.
    pub fn build(self) -> Task {
        Task::new_queued(self.new)
    }
}

/// A new queued task accepted by `owner`, with `policy`, of a fresh client.
pub fn task(owner: InstanceId, policy: RestartPolicy) -> Task {
    TaskBuilder::new(owner).policy(policy).build()
}

/// The claim step of `task` (`queued → loading`).
pub fn claim(task: &Task) -> Step {
    Step::Claim {
        model: task.model.clone(),
    }
}

/// An output step.
pub fn output(delta: &str) -> Step {
    Step::Output {
        delta: delta.to_owned(),
    }
}

/// The response `task` completes with: its own response id, `text` as output.
pub fn response(task: &Task, text: &str, at: Timestamp) -> Response {
    Response {
        id: task.response_id,
        task_id: task.id,
        model: task.model.clone(),
        output_text: text.to_owned(),
        calls: Vec::new(),
        logprobs: Vec::new(),
        usage: Usage {
            input_tokens: 3,
            output_tokens: 2,
            cached_tokens: 0,
        },
        created_at: task.created_at,
        completed_at: at,
    }
}

/// The completion step of `task` with `text` as its output.
pub fn complete(task: &Task, text: &str, at: Timestamp) -> Step {
    Step::Complete {
        response: Box::new(response(task, text, at)),
    }
}

/// A failure step with an engine error.
pub fn fail() -> Step {
    Step::Fail {
        error: engine_error(),
    }
}

/// The error of [`fail`].
pub fn engine_error() -> TaskError {
    TaskError::new(TaskErrorCode::EngineError, "the engine broke")
}

/// A snapshot covering the log up to `sequence_number`.
pub fn snapshot(sequence_number: u64, state: &[u8]) -> Snapshot {
    Snapshot {
        sequence_number,
        state: state.to_vec(),
    }
}

/// An idempotency key from text.
pub fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).expect("a valid idempotency key")
}

/// The digest of a request body.
pub fn digest(body: &str) -> RequestDigest {
    RequestDigest::of_canonical(body.as_bytes())
}

/// A claim on `key` by `client` for `operation` with a request `body`, answered by `holder` at
/// `now`: held for [`HOLD_MILLIS`], kept for [`TTL_MILLIS`].
pub fn key_claim(
    client: ClientId,
    operation: Operation,
    key_text: &str,
    body: &str,
    holder: InstanceId,
    now: Timestamp,
) -> KeyClaim {
    KeyClaim {
        scope: IdempotencyScope {
            client_id: client,
            operation,
        },
        key: key(key_text),
        digest: digest(body),
        holder,
        hold_until: now.plus_millis(HOLD_MILLIS),
        expires_at: now.plus_millis(TTL_MILLIS),
    }
}

/// The claim a request to create `task` makes on `key_text` (its client, `create_response`,
/// held by the task's owner, at the task's creation).
pub fn task_claim(task: &Task, key_text: &str) -> KeyClaim {
    key_claim(
        task.client_id,
        Operation::CreateResponse,
        key_text,
        "{\"model\":\"reference\"}",
        task.owner,
        task.created_at,
    )
}

/// The reply stored for a request that created `task` (a 202 naming it).
pub fn reply_for(task: &Task) -> StoredReply {
    StoredReply {
        task_id: Some(task.id),
        body: format!("202 {}", task.id).into_bytes(),
    }
}

/// The record a request that created `task` under `key_text` commits with it: answered with
/// [`reply_for`], still held by the request ([`KeyClaim::answered_record`]).
pub fn record_for(task: &Task, key_text: &str) -> IdempotencyRecord {
    task_claim(task, key_text).answered_record(reply_for(task), task.created_at)
}

/// A client with `scopes` and a fresh token, and that token.
pub fn client(scopes: &[Scope]) -> (Client, Secret) {
    let token = Secret::new(format!("lmsp_contract-token-{}", next()));
    let client = Client {
        id: client_id(),
        name: format!("client {}", next()),
        scopes: Scopes::new(scopes.iter().copied()),
        token_hash: token.hash(),
        created_at: time(0),
        revoked_at: None,
    };
    (client, token)
}

/// A fresh pairing code granting `scopes`, created at `at` and valid 10 minutes, and the code.
pub fn pairing(scopes: &[Scope], at: Timestamp) -> (Pairing, Secret) {
    let n = next() % 1_000_000;
    let code = Secret::new(format!("{:03}-{:03}", n / 1000, n % 1000));
    let pairing = Pairing {
        code_hash: code.hash(),
        scopes: Scopes::new(scopes.iter().copied()),
        created_at: at,
        expires_at: at.plus_millis(PAIRING_TTL_MILLIS),
    };
    (pairing, code)
}

/// A file's fingerprint: `path` as stored, a size, an mtime and a digest made from `seed`.
pub fn fingerprint(path: &str, seed: u8) -> FileFingerprint {
    FileFingerprint {
        path: path.to_owned(),
        size_bytes: 1000 + u64::from(seed),
        modified_millis: time(i64::from(seed)).as_millis(),
        digest: Digest::from_sha256([seed; 32]),
    }
}

/// A model of a file at `path` (format from its name).
pub fn file_model(id: &str, path: &str) -> ModelRecord {
    ModelRecord {
        id: model(id),
        source: ModelSource::File {
            format: ModelFormat::of_path(path).unwrap_or(ModelFormat::Gguf),
            file: fingerprint(path, 1),
        },
        created_at: time(0),
    }
}

/// A model an upstream server runs under `name`.
pub fn upstream_model(id: &str, name: &str) -> ModelRecord {
    ModelRecord {
        id: model(id),
        source: ModelSource::Upstream {
            name: name.to_owned(),
        },
        created_at: time(0),
    }
}

/// An instance named `name` starting at `at` with a lease of `lease_millis`.
pub fn instance(name: &str, at: Timestamp, lease_millis: i64) -> InstanceInfo {
    InstanceInfo {
        id: instance_id(),
        name: name.to_owned(),
        started_at: at,
        lease_until: at.plus_millis(lease_millis),
    }
}

/// A fresh service identity created at `at`.
pub fn identity(at: Timestamp) -> ServiceIdentity {
    ServiceIdentity {
        id: service_id(),
        created_at: at,
    }
}
