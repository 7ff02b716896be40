//! A task's row (`tasks` joined with `task_specs`) in its stored form, and back: the same
//! columns in both adapters, read and written as plain values so each adapter only binds them.
//!
//! Ids of tasks, clients and instances are stored as the 16 bytes of their ULID, so key order is
//! creation order.

use lmsp_domain::batch::BatchLine;
use lmsp_domain::ids::{BatchId, ClientId, InstanceId, ResponseId, TaskId};
use lmsp_domain::model::ModelId;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::ServiceTier;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{OutputItems, Task};
use lmsp_domain::time::Timestamp;
use ulid::Ulid;

use crate::{corrupt, error_from_text, error_to_text, metadata_from_text, spec_from_text, DbError};

/// The columns a task is read with, in the order of [`TaskRow`]'s fields (`t` is `tasks`, `s`
/// is `task_specs`).
pub const TASK_COLUMNS: &str = "t.id, t.client_id, t.status, t.model, t.on_restart, \
     t.created_at, t.started_at, t.finished_at, t.last_sequence_number, t.restarts, t.error, \
     t.response_id, t.owner, t.background, t.items_opened, t.item_open, s.spec, s.metadata, \
     s.accepted_by, t.tier, t.batch_id, t.batch_line, s.custom_id";

/// How many columns [`TASK_COLUMNS`] names.
pub const TASK_COLUMN_COUNT: usize = 23;

/// `tasks` joined with its spec, for `SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE …`.
pub const TASK_FROM: &str = "tasks t JOIN task_specs s ON s.task_id = t.id";

/// A `u64` as a stored integer.
pub fn to_i64(value: u64) -> Result<i64, DbError> {
    i64::try_from(value).map_err(|_| corrupt(format!("{value} is out of range")))
}

/// A stored integer as a `u64`.
pub fn from_i64(value: i64) -> Result<u64, DbError> {
    u64::try_from(value).map_err(|_| corrupt(format!("{value} is negative")))
}

/// A stored integer as a `u32`.
pub fn u32_of(value: i64) -> Result<u32, DbError> {
    u32::try_from(value).map_err(|_| corrupt(format!("{value} is out of range")))
}

/// A ULID from its stored 16 bytes.
pub fn ulid_of(bytes: &[u8]) -> Result<Ulid, DbError> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| corrupt(format!("an id of {} bytes", bytes.len())))?;
    Ok(Ulid::from_bytes(bytes))
}

/// A stored tier rank as its tier.
pub fn tier_of(rank: i64) -> Result<ServiceTier, DbError> {
    u8::try_from(rank)
        .ok()
        .and_then(ServiceTier::from_rank)
        .ok_or_else(|| corrupt(format!("a service tier of rank {rank}")))
}

/// A tier as stored: its rank.
pub fn tier_rank(tier: ServiceTier) -> i64 {
    i64::from(tier.rank())
}

/// The stored key of a task, client or instance id: its ULID's 16 bytes.
pub fn key_of(ulid: Ulid) -> [u8; 16] {
    ulid.to_bytes()
}

/// The response id of a task whose row stores none: the task's own ULID.
pub fn derived_response_id(task: TaskId) -> ResponseId {
    ResponseId::from_ulid(task.ulid())
}

/// The response id as stored: `NULL` when it is the derived one.
pub fn stored_response_id(task: &Task) -> Option<String> {
    (task.response_id != derived_response_id(task.id)).then(|| task.response_id.to_string())
}

/// A task's error as stored (`tasks.error`).
pub fn error_text(task: &Task) -> Result<Option<String>, DbError> {
    task.error.as_ref().map(error_to_text).transpose()
}

/// A task row as the database hands it over, column by column in [`TASK_COLUMNS`]' order;
/// [`TaskRow::decode`] checks and converts it.
#[derive(Debug, Clone)]
pub struct TaskRow {
    /// `t.id`.
    pub id: Vec<u8>,
    /// `t.client_id`.
    pub client_id: Vec<u8>,
    /// `t.status`.
    pub status: String,
    /// `t.model`.
    pub model: String,
    /// `t.on_restart`.
    pub on_restart: String,
    /// `t.created_at`.
    pub created_at: i64,
    /// `t.started_at`.
    pub started_at: Option<i64>,
    /// `t.finished_at`.
    pub finished_at: Option<i64>,
    /// `t.last_sequence_number`.
    pub last_sequence_number: i64,
    /// `t.restarts`.
    pub restarts: i64,
    /// `t.error`.
    pub error: Option<String>,
    /// `t.response_id`.
    pub response_id: Option<String>,
    /// `t.owner`.
    pub owner: Vec<u8>,
    /// `t.background`.
    pub background: bool,
    /// `t.items_opened`.
    pub items_opened: i64,
    /// `t.item_open`.
    pub item_open: bool,
    /// `s.spec`.
    pub spec: String,
    /// `s.metadata`.
    pub metadata: String,
    /// `s.accepted_by` (`NULL` in rows older than the column; see [`TaskRow::decode`]).
    pub accepted_by: Option<Vec<u8>>,
    /// `t.tier`: the service tier's rank ([`ServiceTier::rank`]).
    pub tier: i64,
    /// `t.batch_id`: the batch that created the task (`NULL` for a request's task).
    pub batch_id: Option<Vec<u8>>,
    /// `t.batch_line`: its line in the batch's input.
    pub batch_line: Option<i64>,
    /// `s.custom_id`: its line's `custom_id`.
    pub custom_id: Option<String>,
}

impl TaskRow {
    /// The domain task. A row that stores no `accepted_by` was accepted by `accepted_by_default`
    /// (each adapter knows which instance that is for its oldest rows).
    pub fn decode(self, accepted_by_default: Option<&[u8]>) -> Result<Task, DbError> {
        let id = TaskId::from_ulid(ulid_of(&self.id)?);
        let owner = InstanceId::from_ulid(ulid_of(&self.owner)?);
        let accepted_by = match self.accepted_by.as_deref().or(accepted_by_default) {
            Some(bytes) => InstanceId::from_ulid(ulid_of(bytes)?),
            None => owner,
        };
        Ok(Task {
            id,
            response_id: match self.response_id {
                Some(text) => ResponseId::parse(&text).map_err(corrupt)?,
                None => derived_response_id(id),
            },
            client_id: ClientId::from_ulid(ulid_of(&self.client_id)?),
            owner,
            accepted_by,
            status: TaskStatus::parse(&self.status).map_err(corrupt)?,
            model: ModelId::parse(&self.model).map_err(corrupt)?,
            on_restart: RestartPolicy::parse(&self.on_restart).map_err(corrupt)?,
            background: self.background,
            spec: spec_from_text(&self.spec)?,
            metadata: metadata_from_text(&self.metadata)?,
            created_at: Timestamp::from_millis(self.created_at),
            started_at: self.started_at.map(Timestamp::from_millis),
            finished_at: self.finished_at.map(Timestamp::from_millis),
            last_sequence_number: from_i64(self.last_sequence_number)?,
            restarts: u32_of(self.restarts)?,
            error: self
                .error
                .map(|error| error_from_text(&error))
                .transpose()?,
            items: OutputItems {
                opened: u32_of(self.items_opened)?,
                open: self.item_open,
            },
            service_tier: tier_of(self.tier)?,
            batch: match (self.batch_id, self.batch_line, self.custom_id) {
                (Some(batch), Some(line), Some(custom_id)) => Some(BatchLine {
                    batch_id: BatchId::from_ulid(ulid_of(&batch)?),
                    line: u32_of(line)?,
                    custom_id,
                }),
                (None, None, None) => None,
                _ => return Err(corrupt(format!("task {id} has half a batch line"))),
            },
        })
    }
}
