//! The rows of files and batches, and a batch line's kept-aside task, in their stored form: the
//! same columns in both adapters, which only bind them.

use serde::{Deserialize, Serialize};

use lmsp_domain::batch::{
    Batch, BatchEndpoint, BatchStatus, DuplicateLine, FilePurpose, LineError, LineErrorCode,
    RequestCounts, StoredFile,
};
use lmsp_domain::ids::{BatchId, ClientId, FileId};
use lmsp_domain::task::Task;
use lmsp_domain::time::Timestamp;

use crate::rows::{from_i64, key_of, stored_response_id, tier_rank, to_i64, u32_of, ulid_of};
use crate::{corrupt, metadata_from_text, metadata_to_text, spec_to_text, DbError};

/// The columns a file is read with, in [`FileRow`]'s order.
pub const FILE_COLUMNS: &str =
    "id, client_id, filename, purpose, bytes, digest, created_at, batch_id";

/// The columns a batch is read with, in [`BatchRow`]'s order (also the order it is written in).
pub const BATCH_COLUMNS: &str = "id, client_id, endpoint, input_file_id, completion_window, \
     status, output_file_id, error_file_id, errors, total, completed, failed, metadata, \
     created_at, in_progress_at, failed_at, finalizing_at, completed_at, expired_at, \
     cancelling_at, cancelled_at";

/// The columns of `batch_staging`, in [`StagedRow`]'s order.
pub const STAGING_COLUMNS: &str = "batch_id, line, task_id, client_id, custom_id, model, \
     on_restart, tier, response_id, owner, spec, metadata, created_at";

/// The stored key of a file id.
pub fn file_key(id: FileId) -> [u8; 16] {
    key_of(id.ulid())
}

/// The stored key of a batch id.
pub fn batch_key(id: BatchId) -> [u8; 16] {
    key_of(id.ulid())
}

/// A file's row.
#[derive(Debug, Clone)]
pub struct FileRow {
    /// `id`.
    pub id: Vec<u8>,
    /// `client_id`.
    pub client_id: Vec<u8>,
    /// `filename`.
    pub filename: String,
    /// `purpose`.
    pub purpose: String,
    /// `bytes`.
    pub bytes: i64,
    /// `digest`.
    pub digest: String,
    /// `created_at`.
    pub created_at: i64,
    /// `batch_id`.
    pub batch_id: Option<Vec<u8>>,
}

impl FileRow {
    /// The row of `file`.
    pub fn encode(file: &StoredFile) -> Result<Self, DbError> {
        Ok(Self {
            id: file_key(file.id).to_vec(),
            client_id: key_of(file.client_id.ulid()).to_vec(),
            filename: file.filename.clone(),
            purpose: file.purpose.as_str().to_owned(),
            bytes: to_i64(file.bytes)?,
            digest: file.digest.clone(),
            created_at: file.created_at.as_millis(),
            batch_id: file.batch_id.map(|id| batch_key(id).to_vec()),
        })
    }

    /// The file.
    pub fn decode(self) -> Result<StoredFile, DbError> {
        Ok(StoredFile {
            id: FileId::from_ulid(ulid_of(&self.id)?),
            client_id: ClientId::from_ulid(ulid_of(&self.client_id)?),
            filename: self.filename,
            purpose: FilePurpose::parse(&self.purpose)
                .ok_or_else(|| corrupt(format!("a file purpose `{}`", self.purpose)))?,
            bytes: from_i64(self.bytes)?,
            digest: self.digest,
            created_at: Timestamp::from_millis(self.created_at),
            batch_id: self
                .batch_id
                .map(|bytes| ulid_of(&bytes).map(BatchId::from_ulid))
                .transpose()?,
        })
    }
}

/// A line error as stored in `batches.errors` (a JSON array).
#[derive(Debug, Serialize, Deserialize)]
struct LineErrorDoc {
    code: String,
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    param: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

/// A batch's row.
#[derive(Debug, Clone)]
pub struct BatchRow {
    /// `id`.
    pub id: Vec<u8>,
    /// `client_id`.
    pub client_id: Vec<u8>,
    /// `endpoint`: its URL.
    pub endpoint: String,
    /// `input_file_id`.
    pub input_file_id: Vec<u8>,
    /// `completion_window`, in milliseconds.
    pub completion_window: i64,
    /// `status`.
    pub status: String,
    /// `output_file_id`.
    pub output_file_id: Option<Vec<u8>>,
    /// `error_file_id`.
    pub error_file_id: Option<Vec<u8>>,
    /// `errors`: a JSON array, `NULL` when there are none.
    pub errors: Option<String>,
    /// `total`.
    pub total: i64,
    /// `completed`.
    pub completed: i64,
    /// `failed`.
    pub failed: i64,
    /// `metadata`.
    pub metadata: String,
    /// `created_at`.
    pub created_at: i64,
    /// The `*_at` columns after `created_at`, in [`BATCH_COLUMNS`]' order.
    pub times: [Option<i64>; 7],
}

fn file_of(bytes: Option<Vec<u8>>) -> Result<Option<FileId>, DbError> {
    bytes
        .map(|bytes| ulid_of(&bytes).map(FileId::from_ulid))
        .transpose()
}

impl BatchRow {
    /// The row of `batch`.
    pub fn encode(batch: &Batch) -> Result<Self, DbError> {
        let errors = if batch.errors.is_empty() {
            None
        } else {
            let docs: Vec<LineErrorDoc> = batch
                .errors
                .iter()
                .map(|error| LineErrorDoc {
                    code: error.code.as_str().to_owned(),
                    message: error.message.clone(),
                    param: error.param.clone(),
                    line: error.line,
                })
                .collect();
            Some(serde_json::to_string(&docs)?)
        };
        let millis = |time: Option<Timestamp>| time.map(Timestamp::as_millis);
        Ok(Self {
            id: batch_key(batch.id).to_vec(),
            client_id: key_of(batch.client_id.ulid()).to_vec(),
            endpoint: batch.endpoint.url().to_owned(),
            input_file_id: file_key(batch.input_file_id).to_vec(),
            completion_window: batch.completion_window_ms,
            status: batch.status.as_str().to_owned(),
            output_file_id: batch.output_file_id.map(|id| file_key(id).to_vec()),
            error_file_id: batch.error_file_id.map(|id| file_key(id).to_vec()),
            errors,
            total: to_i64(batch.counts.total)?,
            completed: to_i64(batch.counts.completed)?,
            failed: to_i64(batch.counts.failed)?,
            metadata: metadata_to_text(&batch.metadata)?,
            created_at: batch.created_at.as_millis(),
            times: [
                millis(batch.in_progress_at),
                millis(batch.failed_at),
                millis(batch.finalizing_at),
                millis(batch.completed_at),
                millis(batch.expired_at),
                millis(batch.cancelling_at),
                millis(batch.cancelled_at),
            ],
        })
    }

    /// The batch.
    pub fn decode(self) -> Result<Batch, DbError> {
        let errors = match self.errors {
            None => Vec::new(),
            Some(text) => serde_json::from_str::<Vec<LineErrorDoc>>(&text)?
                .into_iter()
                .map(|doc| {
                    Ok(LineError {
                        code: LineErrorCode::parse(&doc.code)
                            .ok_or_else(|| corrupt(format!("a line error code `{}`", doc.code)))?,
                        message: doc.message,
                        param: doc.param,
                        line: doc.line,
                    })
                })
                .collect::<Result<_, DbError>>()?,
        };
        let [in_progress_at, failed_at, finalizing_at, completed_at, expired_at, cancelling_at, cancelled_at] =
            self.times.map(|time| time.map(Timestamp::from_millis));
        Ok(Batch {
            id: BatchId::from_ulid(ulid_of(&self.id)?),
            client_id: ClientId::from_ulid(ulid_of(&self.client_id)?),
            endpoint: BatchEndpoint::parse(&self.endpoint)
                .ok_or_else(|| corrupt(format!("a batch endpoint `{}`", self.endpoint)))?,
            input_file_id: FileId::from_ulid(ulid_of(&self.input_file_id)?),
            completion_window_ms: self.completion_window,
            status: BatchStatus::parse(&self.status)
                .ok_or_else(|| corrupt(format!("a batch status `{}`", self.status)))?,
            output_file_id: file_of(self.output_file_id)?,
            error_file_id: file_of(self.error_file_id)?,
            errors,
            counts: RequestCounts {
                total: from_i64(self.total)?,
                completed: from_i64(self.completed)?,
                failed: from_i64(self.failed)?,
            },
            metadata: metadata_from_text(&self.metadata)?,
            created_at: Timestamp::from_millis(self.created_at),
            in_progress_at,
            failed_at,
            finalizing_at,
            completed_at,
            expired_at,
            cancelling_at,
            cancelled_at,
        })
    }
}

/// A batch line's task kept aside in `batch_staging` until its batch starts.
#[derive(Debug, Clone)]
pub struct StagedRow {
    /// `batch_id`.
    pub batch_id: Vec<u8>,
    /// `line`.
    pub line: i64,
    /// `task_id`.
    pub task_id: Vec<u8>,
    /// `client_id`.
    pub client_id: Vec<u8>,
    /// `custom_id`.
    pub custom_id: String,
    /// `model`.
    pub model: String,
    /// `on_restart`.
    pub on_restart: String,
    /// `tier`: the service tier's rank.
    pub tier: i64,
    /// `response_id`.
    pub response_id: Option<String>,
    /// `owner`: the instance that accepts it.
    pub owner: Vec<u8>,
    /// `spec`.
    pub spec: String,
    /// `metadata`.
    pub metadata: String,
    /// `created_at`.
    pub created_at: i64,
}

impl StagedRow {
    /// The row of a batch line's new task (`task.batch` names its line).
    pub fn encode(task: &Task) -> Result<Self, DbError> {
        let line = task.batch.as_ref().ok_or_else(|| {
            corrupt(format!(
                "task {} is kept for a batch but has no line",
                task.id
            ))
        })?;
        Ok(Self {
            batch_id: batch_key(line.batch_id).to_vec(),
            line: i64::from(line.line),
            task_id: key_of(task.id.ulid()).to_vec(),
            client_id: key_of(task.client_id.ulid()).to_vec(),
            custom_id: line.custom_id.clone(),
            model: task.model.as_str().to_owned(),
            on_restart: task.on_restart.as_str().to_owned(),
            tier: tier_rank(task.service_tier),
            response_id: stored_response_id(task),
            owner: key_of(task.owner.ulid()).to_vec(),
            spec: spec_to_text(&task.spec)?,
            metadata: metadata_to_text(&task.metadata)?,
            created_at: task.created_at.as_millis(),
        })
    }

    /// The line number, checked.
    pub fn line(&self) -> Result<u32, DbError> {
        u32_of(self.line)
    }
}

/// A row of `sql::STAGED_DUPLICATES` (`line`, `custom_id`), decoded.
pub fn duplicate_line(line: i64, custom_id: String) -> Result<DuplicateLine, DbError> {
    Ok(DuplicateLine {
        line: u32_of(line)?,
        custom_id,
    })
}
