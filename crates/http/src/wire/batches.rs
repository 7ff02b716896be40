//! Files and batches in OpenAI's shapes (the Files and Batch APIs), the body of `POST
//! /v1/batches`, and the reading and answering of batch lines ([`HttpBatchWire`]): a line's body
//! is read exactly as its endpoint reads a request, and its answer is exactly what the endpoint
//! answers a synchronous request whose task finished so.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use lmsp_app::{BatchWire, ReadLine};
use lmsp_domain::batch::{request_id, Batch, BatchEndpoint, LineOutcome, StoredFile};
use lmsp_domain::validation::{validate_submit, SubmitRequest, ValidationError};
use lmsp_domain::{Metadata, Response, Task, Timestamp};

use crate::error::ApiError;
use crate::extract::parse_json;
use crate::routes::submit::{finished, Rendering};
use crate::wire::requests::{ChatCompletionRequest, CreateResponseRequest};
use crate::wire::{constant, list_of, ListTag, Listed};

constant!(
    /// `"file"`.
    FileTag = "file"
);
constant!(
    /// `"batch"`.
    BatchTag = "batch"
);

/// A stored file (OpenAI's file object).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileObject {
    /// `file-…`.
    pub id: String,
    // Always `file`.
    #[schema(inline)]
    pub object: FileTag,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was stored (Unix seconds).
    pub created_at: i64,
    /// The name it was uploaded under, or the service gave it.
    pub filename: String,
    /// `batch` (uploaded) or `batch_output` (a batch's output or error file).
    pub purpose: &'static str,
    /// Always `processed`: a file is stored whole or not at all.
    pub status: &'static str,
    /// When it is purged (Unix seconds): an output or error file `--retention` after its
    /// batch's end; `null` for an upload, which stays until deleted.
    pub expires_at: Option<i64>,
    /// The SHA-256 of its bytes (lower-case hex).
    pub sha256: String,
}

impl FileObject {
    /// The wire form of a file, of a service that keeps ended batches for `retention`.
    pub fn of(file: &StoredFile, retention: std::time::Duration) -> Self {
        Self {
            id: file.id.to_string(),
            object: FileTag::Value,
            bytes: file.bytes,
            created_at: file.created_at.as_unix_seconds(),
            filename: file.filename.clone(),
            purpose: file.purpose.as_str(),
            status: "processed",
            expires_at: file.expires_at(retention).map(Timestamp::as_unix_seconds),
            sha256: file.digest.clone(),
        }
    }
}

impl Listed for FileObject {
    fn list_id(&self) -> &str {
        &self.id
    }
}

list_of!(
    /// A page of files, in the order asked for (newest first unless `order=asc`).
    FileList of FileObject, with ids
);

/// The answer to `DELETE /v1/files/{id}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileDeleted {
    /// The file's id.
    pub id: String,
    // Always `file`.
    #[schema(inline)]
    pub object: FileTag,
    /// Always `true`.
    pub deleted: bool,
}

/// One reason a batch's input was refused.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchErrorObject {
    /// What is wrong, e.g. `duplicate_custom_id`, `invalid_url`, `invalid_request`.
    pub code: &'static str,
    /// Human text.
    pub message: String,
    /// The field of the line at fault, e.g. `body.input`.
    pub param: Option<String>,
    /// The line, counted from 1 (none for the file as a whole).
    pub line: Option<u32>,
}

/// The reasons a batch failed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchErrors {
    // Always `list`.
    #[schema(inline)]
    pub object: ListTag,
    /// The errors, by line.
    pub data: Vec<BatchErrorObject>,
}

/// A batch's line counts.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct RequestCountsObject {
    /// Lines in the batch.
    pub total: u64,
    /// Lines answered in the output file.
    pub completed: u64,
    /// Lines answered in the error file.
    pub failed: u64,
}

/// A batch (OpenAI's batch object).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchObject {
    /// `batch_…`.
    pub id: String,
    // Always `batch`.
    #[schema(inline)]
    pub object: BatchTag,
    /// `/v1/responses` or `/v1/chat/completions`.
    pub endpoint: &'static str,
    /// Why its input was refused (`failed`), else `null`.
    pub errors: Option<BatchErrors>,
    /// The uploaded file of requests.
    pub input_file_id: String,
    /// How long it may take, e.g. `24h`.
    pub completion_window: String,
    /// `validating`, `failed`, `in_progress`, `finalizing`, `completed`, `expired`,
    /// `cancelling` or `cancelled`.
    pub status: &'static str,
    /// The file of answered lines, once written.
    pub output_file_id: Option<String>,
    /// The file of failed, cancelled and expired lines, once written.
    pub error_file_id: Option<String>,
    /// When it was created (Unix seconds), like every `*_at` here.
    pub created_at: i64,
    /// When its tasks were created.
    pub in_progress_at: Option<i64>,
    /// When its completion window passes.
    pub expires_at: i64,
    /// When its files began to be written.
    pub finalizing_at: Option<i64>,
    /// When it completed.
    pub completed_at: Option<i64>,
    /// When its input was refused.
    pub failed_at: Option<i64>,
    /// When its window passed.
    pub expired_at: Option<i64>,
    /// When a cancel was accepted.
    pub cancelling_at: Option<i64>,
    /// When it ended cancelled.
    pub cancelled_at: Option<i64>,
    /// Its line counts, kept as its tasks end.
    pub request_counts: RequestCountsObject,
    /// The client's metadata.
    pub metadata: Metadata,
}

fn seconds(at: Option<Timestamp>) -> Option<i64> {
    at.map(Timestamp::as_unix_seconds)
}

/// A completion window as a request gives it (`24h`).
fn window_text(millis: i64) -> String {
    match millis {
        m if m % 3_600_000 == 0 => format!("{}h", m / 3_600_000),
        m if m % 60_000 == 0 => format!("{}m", m / 60_000),
        m => format!("{}s", m / 1_000),
    }
}

impl BatchObject {
    /// The wire form of a batch.
    pub fn of(batch: &Batch) -> Self {
        let errors = (!batch.errors.is_empty()).then(|| BatchErrors {
            object: ListTag::Value,
            data: batch
                .errors
                .iter()
                .map(|error| BatchErrorObject {
                    code: error.code.as_str(),
                    message: error.message.clone(),
                    param: error.param.clone(),
                    line: error.line,
                })
                .collect(),
        });
        Self {
            id: batch.id.to_string(),
            object: BatchTag::Value,
            endpoint: batch.endpoint.url(),
            errors,
            input_file_id: batch.input_file_id.to_string(),
            completion_window: window_text(batch.completion_window_ms),
            status: batch.status.as_str(),
            output_file_id: batch.output_file_id.map(|id| id.to_string()),
            error_file_id: batch.error_file_id.map(|id| id.to_string()),
            created_at: batch.created_at.as_unix_seconds(),
            in_progress_at: seconds(batch.in_progress_at),
            expires_at: batch.expires_at().as_unix_seconds(),
            finalizing_at: seconds(batch.finalizing_at),
            completed_at: seconds(batch.completed_at),
            failed_at: seconds(batch.failed_at),
            expired_at: seconds(batch.expired_at),
            cancelling_at: seconds(batch.cancelling_at),
            cancelled_at: seconds(batch.cancelled_at),
            request_counts: RequestCountsObject {
                total: batch.counts.total,
                completed: batch.counts.completed,
                failed: batch.counts.failed,
            },
            metadata: batch.metadata.clone(),
        }
    }
}

impl Listed for BatchObject {
    fn list_id(&self) -> &str {
        &self.id
    }
}

list_of!(
    /// A page of batches, newest first.
    BatchList of BatchObject, with ids
);

/// The body of `POST /v1/batches`. Unknown fields are refused (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"input_file_id": "file-01JF0000000000000000000000",
    "endpoint": "/v1/responses", "completion_window": "24h"})))]
pub struct CreateBatchRequest {
    /// An uploaded file (`purpose` `batch`) of request lines
    /// `{"custom_id", "method": "POST", "url", "body"}`.
    pub input_file_id: String,
    /// `/v1/responses` or `/v1/chat/completions`: every line's `url`.
    pub endpoint: String,
    /// How long the batch may take: `24h` (OpenAI's value), or any of 1s…168h as `<n>h`, `<n>m`
    /// or `<n>s`. When it passes, unfinished lines are cancelled and the batch `expired`.
    pub completion_window: String,
    /// At most 16 string pairs.
    pub metadata: Option<Metadata>,
    /// Accepted for OpenAI's SDKs, with no effect: output files follow `--retention`.
    #[schema(value_type = Option<Object>)]
    pub output_expires_after: Option<Value>,
}

/// The batch lines' reading and answers of this edge.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpBatchWire;

fn validation(error: ApiError) -> ValidationError {
    ValidationError {
        message: error.message,
        param: error.param,
    }
}

/// A line's body read as its endpoint reads a request body.
fn read_body(endpoint: BatchEndpoint, body: &Value) -> Result<SubmitRequest, ValidationError> {
    if !body.is_object() {
        return Err(ValidationError {
            message: String::from("`body` must be a JSON object: the endpoint's request"),
            param: None,
        });
    }
    let bytes = serde_json::to_vec(body).map_err(|error| ValidationError {
        message: error.to_string(),
        param: None,
    })?;
    let draft = match endpoint {
        BatchEndpoint::Responses => parse_json::<CreateResponseRequest>(&bytes)
            .and_then(CreateResponseRequest::into_draft)
            .map_err(validation)?,
        BatchEndpoint::ChatCompletions => {
            parse_json::<ChatCompletionRequest>(&bytes)
                .and_then(ChatCompletionRequest::into_draft)
                .map_err(validation)?
                .draft
        }
    };
    let request = validate_submit(draft)?;
    if request.stream {
        return Err(ValidationError::new(
            "stream",
            "a batch line cannot stream: its answer goes to the output file",
        ));
    }
    Ok(request)
}

impl BatchWire for HttpBatchWire {
    fn read_line(&self, endpoint: BatchEndpoint, text: &[u8]) -> Option<ReadLine> {
        let value: Value = serde_json::from_slice(text).ok()?;
        let line = value.as_object()?;
        let text_of = |key: &str| line.get(key).and_then(Value::as_str).map(str::to_owned);
        let body = match line.get("body") {
            Some(body) => read_body(endpoint, body),
            None => Err(ValidationError {
                message: String::from("the line has no `body`"),
                param: None,
            }),
        };
        Some(ReadLine {
            custom_id: text_of("custom_id"),
            method: text_of("method"),
            url: text_of("url"),
            body,
        })
    }

    fn answer(
        &self,
        endpoint: BatchEndpoint,
        task: &Task,
        response: Option<&Response>,
        outcome: LineOutcome,
    ) -> Vec<u8> {
        let custom_id = task
            .batch
            .as_ref()
            .map(|line| line.custom_id.as_str())
            .unwrap_or_default();
        let line = match outcome {
            LineOutcome::Output | LineOutcome::Failed => {
                let rendering = match endpoint {
                    BatchEndpoint::Responses => Rendering::Responses,
                    BatchEndpoint::ChatCompletions => Rendering::Chat {
                        include_usage: false,
                    },
                };
                let reply = finished(task, response, rendering);
                let body: Value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
                json!({
                    "id": request_id(task.id),
                    "custom_id": custom_id,
                    "response": {
                        "status_code": reply.status,
                        "request_id": task.id.to_string(),
                        "body": body,
                    },
                    "error": null,
                })
            }
            LineOutcome::Cancelled(why) => json!({
                "id": request_id(task.id),
                "custom_id": custom_id,
                "response": null,
                "error": {"code": why.as_str(), "message": why.message()},
            }),
        };
        serde_json::to_vec(&line).unwrap_or_default()
    }
}
