//! Files and batches: OpenAI's Batch API on durable tasks.
//!
//! A client uploads a file of requests, one JSON line each, and creates a batch from it. The
//! batch's lines are checked first ([`LineCheck`]); a batch with a bad line fails and creates
//! nothing. Otherwise every line becomes a task, all created together with the batch's move to
//! `in_progress`, and the batch counts its lines as their tasks finish ([`counted`]), in the
//! same transaction as each task's end. When every line is counted, or the batch is cancelled or
//! its completion window passes, the batch is finalized: its output and error files are written
//! from its tasks, one line per task ([`line_outcome`]), and it ends ([`BatchStatus::ended`]).

use sha2::{Digest as _, Sha256};

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::ids::{BatchId, ClientId, FileId, TaskId};
use crate::status::TaskStatus;
use crate::task::{Metadata, Task};
use crate::time::Timestamp;

/// The most lines a batch may have (OpenAI's limit).
pub const MAX_LINES: u32 = 50_000;

/// The most line errors a failed batch reports (the first ones, in line order).
pub const MAX_LINE_ERRORS: usize = 100;

/// The longest `custom_id`, in characters.
pub const MAX_CUSTOM_ID_CHARS: usize = 512;

/// What a stored file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum FilePurpose {
    /// A batch's input, uploaded by a client.
    Batch,
    /// A batch's output or error file, written by the service.
    BatchOutput,
}

impl FilePurpose {
    /// The name, e.g. `batch`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name; `None` for an unknown one.
    pub fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

/// A stored file's record (its bytes are kept apart, by the file-content port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// Its id.
    pub id: FileId,
    /// The client that owns it (I-7: no other client sees it).
    pub client_id: ClientId,
    /// The name it was uploaded under (or the service gave it).
    pub filename: String,
    /// What it is for.
    pub purpose: FilePurpose,
    /// Its size.
    pub bytes: u64,
    /// The SHA-256 of its bytes, in lower-case hex.
    pub digest: String,
    /// When it was stored; an output or error file's record is stored with its batch's end, and
    /// dated by it ([`Batch::ended_at`]), so it expires with its batch.
    pub created_at: Timestamp,
    /// The batch that wrote it (an output or error file), `None` for an upload.
    pub batch_id: Option<BatchId>,
}

impl StoredFile {
    /// When it is purged, keeping ended batches for `retention`: an output or error file goes
    /// with its batch, `retention` after the batch's end (the file's date); an upload stays
    /// until it is deleted (`None`).
    pub fn expires_at(&self, retention: std::time::Duration) -> Option<Timestamp> {
        match self.purpose {
            FilePurpose::Batch => None,
            FilePurpose::BatchOutput => {
                let millis = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
                Some(self.created_at.plus_millis(millis))
            }
        }
    }
}

/// The endpoint a batch's requests go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, VariantArray)]
pub enum BatchEndpoint {
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
}

impl BatchEndpoint {
    /// Its path, e.g. `/v1/responses`.
    pub fn url(self) -> &'static str {
        match self {
            BatchEndpoint::Responses => "/v1/responses",
            BatchEndpoint::ChatCompletions => "/v1/chat/completions",
        }
    }

    /// The endpoint at `url`; `None` for any other path.
    pub fn parse(url: &str) -> Option<Self> {
        Self::VARIANTS.iter().copied().find(|e| e.url() == url)
    }
}

/// Where a batch is. `failed`, `completed`, `expired` and `cancelled` are its ends.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, VariantArray, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum BatchStatus {
    /// Created; its input file is being checked.
    Validating,
    /// A line of its input was bad: no task was created.
    Failed,
    /// Its lines' tasks are queued or running.
    InProgress,
    /// Every line is answered (or its window passed and the rest are being cancelled); its
    /// output and error files are being written.
    Finalizing,
    /// Ended with every line answered.
    Completed,
    /// Its completion window passed: the unfinished lines were cancelled, the finished kept.
    Expired,
    /// A cancel was accepted; its unfinished lines are being cancelled.
    Cancelling,
    /// Ended by a cancel, with the lines that finished before it kept.
    Cancelled,
}

impl BatchStatus {
    /// The statuses in which a batch still has work to do.
    pub const UNFINISHED: [BatchStatus; 4] = [
        BatchStatus::Validating,
        BatchStatus::InProgress,
        BatchStatus::Finalizing,
        BatchStatus::Cancelling,
    ];

    /// The name, e.g. `in_progress`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name; `None` for an unknown one.
    pub fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }

    /// Whether the batch has ended (never left again).
    pub fn is_finished(self) -> bool {
        !Self::UNFINISHED.contains(&self)
    }

    /// Whether a cancel is accepted in this status.
    pub fn cancellable(self) -> bool {
        matches!(self, BatchStatus::Validating | BatchStatus::InProgress)
    }

    /// Whether the batch's unfinished lines are to be cancelled now: it was cancelled, or it
    /// expired (`finalizing` with its window passed).
    pub fn sweeps(self, expired: bool) -> bool {
        match self {
            BatchStatus::Cancelling => true,
            BatchStatus::Finalizing => expired,
            _ => false,
        }
    }

    /// How a batch in this status ends once its files are written: `cancelling` ends
    /// `cancelled`, an expired one `expired`, any other `completed`.
    pub fn ended(self, expired: bool) -> BatchStatus {
        match self {
            BatchStatus::Cancelling => BatchStatus::Cancelled,
            _ if expired => BatchStatus::Expired,
            _ => BatchStatus::Completed,
        }
    }
}

/// How many of a batch's lines there are and how many were answered, each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestCounts {
    /// Lines in the batch.
    pub total: u64,
    /// Lines answered in the output file.
    pub completed: u64,
    /// Lines answered in the error file (failed, cancelled or expired).
    pub failed: u64,
}

impl RequestCounts {
    /// Whether every line was answered.
    pub fn all_counted(&self) -> bool {
        self.completed + self.failed >= self.total
    }
}

/// Which count a line's task adds to when it finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// `completed`: answered in the output file.
    Completed,
    /// `failed`: answered in the error file.
    Failed,
}

/// The count a line's task adds to on reaching `status`: `completed` for a completed task,
/// `failed` for a failed or cancelled one, none while unfinished. A store adds it in the same
/// transaction as the task's end, so the counts are never a scan.
pub fn counted(status: TaskStatus) -> Option<Counter> {
    match status {
        TaskStatus::Completed => Some(Counter::Completed),
        TaskStatus::Failed | TaskStatus::Cancelled => Some(Counter::Failed),
        TaskStatus::Queued | TaskStatus::Loading | TaskStatus::Running | TaskStatus::Cancelling => {
            None
        }
    }
}

/// What a bad input line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum LineErrorCode {
    /// Not a JSON object, or not valid UTF-8.
    InvalidJsonLine,
    /// `custom_id` is missing, empty, too long or not a string.
    InvalidCustomId,
    /// Another line has the same `custom_id`.
    DuplicateCustomId,
    /// `method` is not `POST`.
    InvalidMethod,
    /// `url` is not the batch's endpoint.
    InvalidUrl,
    /// The body is one the endpoint would refuse.
    InvalidRequest,
    /// More lines than a batch may have.
    TooManyLines,
    /// No line at all.
    EmptyFile,
}

impl LineErrorCode {
    /// The name, e.g. `duplicate_custom_id`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name; `None` for an unknown one.
    pub fn parse(text: &str) -> Option<Self> {
        Self::VARIANTS.iter().copied().find(|c| c.as_str() == text)
    }
}

/// Why a batch's input was refused: one line, or the file as a whole (`line: None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// What is wrong.
    pub code: LineErrorCode,
    /// Human text.
    pub message: String,
    /// The offending field of the line, e.g. `body.input`.
    pub param: Option<String>,
    /// The line, counted from 1.
    pub line: Option<u32>,
}

impl LineError {
    /// The error of a `line` whose `custom_id` an earlier line has.
    pub fn duplicate(line: u32, custom_id: &str) -> Self {
        Self::at(
            line,
            LineErrorCode::DuplicateCustomId,
            format!("the `custom_id` \"{custom_id}\" is used by an earlier line"),
        )
    }

    /// An error of `line`.
    pub fn at(line: u32, code: LineErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            param: None,
            line: Some(line),
        }
    }
}

/// A line's envelope, as the driving adapter read it: `None` for a field that is absent or not
/// a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LineEnvelope<'a> {
    /// `custom_id`.
    pub custom_id: Option<&'a str>,
    /// `method`.
    pub method: Option<&'a str>,
    /// `url`.
    pub url: Option<&'a str>,
}

/// The checks of a batch's lines that need no engine: each line's envelope against the batch's
/// endpoint, and the number of lines. Fed the lines in order.
///
/// `custom_id`s unique within a batch is checked by the store, not here, so that a check's memory
/// does not grow with the file: the store finds each kept line whose `custom_id` an earlier kept
/// line has ([`DuplicateLine`]). What the store never sees is a line refused for its body (it is
/// not kept), whose `custom_id` is taken all the same; this check remembers those, the first
/// [`MAX_LINE_ERRORS`] of them: a line with the id of a later one comes after that many errors,
/// so its error would not be reported anyway.
#[derive(Debug)]
pub struct LineCheck {
    endpoint: BatchEndpoint,
    /// The `custom_id`s of the first lines refused for their bodies.
    refused: Vec<String>,
    lines: u32,
}

impl LineCheck {
    /// A check of a batch for `endpoint`.
    pub fn new(endpoint: BatchEndpoint) -> Self {
        Self {
            endpoint,
            refused: Vec::new(),
            lines: 0,
        }
    }

    /// Checks the next line's envelope (the line numbered `self.lines() + 1`).
    pub fn check(&mut self, envelope: LineEnvelope<'_>) -> Result<(), LineError> {
        self.lines = self.lines.saturating_add(1);
        let line = self.lines;
        if line > MAX_LINES {
            return Err(LineError::at(
                line,
                LineErrorCode::TooManyLines,
                format!("a batch has at most {MAX_LINES} lines"),
            ));
        }
        let custom_id = match envelope.custom_id {
            Some(id) if !id.is_empty() && id.chars().count() <= MAX_CUSTOM_ID_CHARS => id,
            _ => {
                return Err(LineError::at(
                    line,
                    LineErrorCode::InvalidCustomId,
                    format!("`custom_id` must be a string of 1–{MAX_CUSTOM_ID_CHARS} characters"),
                ))
            }
        };
        if envelope.method != Some("POST") {
            return Err(LineError::at(
                line,
                LineErrorCode::InvalidMethod,
                "`method` must be \"POST\"",
            ));
        }
        if envelope.url != Some(self.endpoint.url()) {
            return Err(LineError::at(
                line,
                LineErrorCode::InvalidUrl,
                format!(
                    "`url` must be the batch's endpoint, \"{}\"",
                    self.endpoint.url()
                ),
            ));
        }
        if self.refused.iter().any(|id| id == custom_id) {
            return Err(LineError::duplicate(line, custom_id));
        }
        Ok(())
    }

    /// Notes that the line just checked, whose envelope passed, was refused for its body: its
    /// `custom_id` is taken all the same.
    pub fn refused_body(&mut self, custom_id: &str) {
        if self.refused.len() < MAX_LINE_ERRORS {
            self.refused.push(custom_id.to_owned());
        }
    }

    /// Counts a line that has no envelope to check (it is not a JSON object); its number.
    pub fn skip(&mut self) -> u32 {
        self.lines = self.lines.saturating_add(1);
        self.lines
    }

    /// How many lines were checked.
    pub fn lines(&self) -> u32 {
        self.lines
    }

    /// The error of a file that ended after `self.lines()` lines: one with no line at all.
    pub fn finish(&self) -> Result<(), LineError> {
        if self.lines == 0 {
            return Err(LineError {
                code: LineErrorCode::EmptyFile,
                message: String::from("the input file has no request line"),
                param: None,
                line: None,
            });
        }
        Ok(())
    }
}

/// A kept line of a batch whose `custom_id` an earlier kept line of the same batch has, as the
/// store finds them ([`LineCheck`] says why the store does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateLine {
    /// The line, counted from 1.
    pub line: u32,
    /// Its `custom_id`.
    pub custom_id: String,
}

impl DuplicateLine {
    /// The line's error.
    pub fn error(&self) -> LineError {
        LineError::duplicate(self.line, &self.custom_id)
    }
}

/// What a refused batch reports: the first [`MAX_LINE_ERRORS`] of `errors` in line order (an
/// error of the whole file last), from the errors found while reading its lines and those the
/// store found after, each list the first ones of its kind.
pub fn first_errors(mut errors: Vec<LineError>) -> Vec<LineError> {
    errors.sort_by_key(|error| error.line.unwrap_or(u32::MAX));
    errors.truncate(MAX_LINE_ERRORS);
    errors
}

/// A task's place in its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLine {
    /// The batch.
    pub batch_id: BatchId,
    /// The line of the input file, counted from 1.
    pub line: u32,
    /// The line's `custom_id`.
    pub custom_id: String,
}

/// A batch of requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Its id.
    pub id: BatchId,
    /// The client that created it (I-7).
    pub client_id: ClientId,
    /// Where its requests go.
    pub endpoint: BatchEndpoint,
    /// The uploaded file of requests.
    pub input_file_id: FileId,
    /// How long it may take, from its creation, in milliseconds.
    pub completion_window_ms: i64,
    /// Where it is.
    pub status: BatchStatus,
    /// The file of answered lines, once written (none when no line completed).
    pub output_file_id: Option<FileId>,
    /// The file of failed, cancelled and expired lines, once written (none when there are none).
    pub error_file_id: Option<FileId>,
    /// Why its input was refused (`failed`).
    pub errors: Vec<LineError>,
    /// Its line counts.
    pub counts: RequestCounts,
    /// The client's metadata.
    pub metadata: Metadata,
    /// When it was created.
    pub created_at: Timestamp,
    /// When its tasks were created.
    pub in_progress_at: Option<Timestamp>,
    /// When its validation refused it.
    pub failed_at: Option<Timestamp>,
    /// When its files began to be written (or its window passed).
    pub finalizing_at: Option<Timestamp>,
    /// When it completed.
    pub completed_at: Option<Timestamp>,
    /// When its window passed.
    pub expired_at: Option<Timestamp>,
    /// When a cancel was accepted.
    pub cancelling_at: Option<Timestamp>,
    /// When it ended cancelled.
    pub cancelled_at: Option<Timestamp>,
}

/// A new batch, as its creator asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBatch {
    /// Its id.
    pub id: BatchId,
    /// Its client.
    pub client_id: ClientId,
    /// Its endpoint.
    pub endpoint: BatchEndpoint,
    /// Its input file.
    pub input_file_id: FileId,
    /// Its completion window, in milliseconds.
    pub completion_window_ms: i64,
    /// Its metadata.
    pub metadata: Metadata,
    /// Now.
    pub created_at: Timestamp,
}

impl Batch {
    /// A new batch in `validating`.
    pub fn new(new: NewBatch) -> Self {
        Self {
            id: new.id,
            client_id: new.client_id,
            endpoint: new.endpoint,
            input_file_id: new.input_file_id,
            completion_window_ms: new.completion_window_ms,
            status: BatchStatus::Validating,
            output_file_id: None,
            error_file_id: None,
            errors: Vec::new(),
            counts: RequestCounts::default(),
            metadata: new.metadata,
            created_at: new.created_at,
            in_progress_at: None,
            failed_at: None,
            finalizing_at: None,
            completed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
        }
    }

    /// When its completion window passes.
    pub fn expires_at(&self) -> Timestamp {
        self.created_at.plus_millis(self.completion_window_ms)
    }

    /// Whether it ended, and when.
    pub fn ended_at(&self) -> Option<Timestamp> {
        self.failed_at
            .or(self.completed_at)
            .or(self.cancelled_at)
            .or(if self.status == BatchStatus::Expired {
                self.expired_at
            } else {
                None
            })
    }

    /// Whether the batch exists for `client` (I-7), like [`Task::visible_to`].
    pub fn visible_to(&self, client: Option<ClientId>) -> bool {
        client.is_none_or(|client| client == self.client_id)
    }

    /// What the batch's upkeep is to do with it now ([`BatchWork`]).
    pub fn work(&self, now: Timestamp) -> BatchWork {
        let expired = self.expired_at.is_some();
        match self.status {
            BatchStatus::Validating => BatchWork::Validate,
            BatchStatus::InProgress if now >= self.expires_at() => BatchWork::Expire,
            BatchStatus::InProgress if self.counts.all_counted() => BatchWork::Finalize,
            BatchStatus::Finalizing | BatchStatus::Cancelling if !self.counts.all_counted() => {
                if self.status.sweeps(expired) {
                    BatchWork::Sweep
                } else {
                    BatchWork::Wait
                }
            }
            BatchStatus::Finalizing | BatchStatus::Cancelling => BatchWork::Finalize,
            _ => BatchWork::Wait,
        }
    }
}

/// What a batch's upkeep is to do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchWork {
    /// Check its input and create its tasks (or fail it).
    Validate,
    /// Its window passed: move it to `finalizing` as expired, then sweep.
    Expire,
    /// Cancel its unfinished lines' tasks.
    Sweep,
    /// Every line is counted: write its files and end it.
    Finalize,
    /// Nothing now: its lines are running, or it ended.
    Wait,
}

/// Who stopped a line that was cancelled before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum LineCancel {
    /// The batch was cancelled before the line finished (`batch_cancelled`).
    BatchCancelled,
    /// The batch's window passed before the line finished (`batch_expired`).
    BatchExpired,
    /// The line's own task was cancelled (`POST /v1/tasks/{id}/cancel`), not the batch
    /// (`cancelled`).
    #[strum(serialize = "cancelled")]
    Request,
}

impl LineCancel {
    /// The error code, e.g. `batch_cancelled`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The error's message, for people.
    pub fn message(self) -> &'static str {
        match self {
            LineCancel::BatchCancelled => "the batch was cancelled before this request finished",
            LineCancel::BatchExpired => {
                "the batch's completion window passed before this request finished"
            }
            LineCancel::Request => "the request was cancelled before it finished",
        }
    }
}

/// Where a finished line's answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineOutcome {
    /// The output file: the endpoint's answer (the task completed).
    Output,
    /// The error file, with the endpoint's error answer (the task failed).
    Failed,
    /// The error file, with no answer: a cancel (the batch's, its expiry, or the line's own)
    /// stopped the line.
    Cancelled(LineCancel),
}

/// Where the line whose task is `task` is answered in `batch`, which is being finalized (it
/// ends as [`Batch::ended`] says); `None` while the task is unfinished (a batch is finalized only
/// when every line is counted).
///
/// A cancelled line was stopped by the batch's cancel or expiry when the batch ends so and the
/// line finished no earlier than that cancel or expiry; otherwise its own task was cancelled
/// ([`LineCancel::Request`]): the batch, ending `completed`, or stopped after the line had
/// finished, did not stop it.
pub fn line_outcome(task: &Task, batch: &Batch) -> Option<LineOutcome> {
    match counted(task.status)? {
        Counter::Completed => Some(LineOutcome::Output),
        Counter::Failed if task.status == TaskStatus::Failed => Some(LineOutcome::Failed),
        Counter::Failed => Some(LineOutcome::Cancelled(batch.line_cancel(task))),
    }
}

/// The id of a line's answer (`batch_req_…`): derived from its task, so it is the same however
/// often the files are written.
pub fn request_id(task: TaskId) -> String {
    format!("batch_req_{}", task.ulid())
}

/// A completion window as a batch request gives it: a number of hours, minutes or seconds, e.g.
/// `24h` (OpenAI's only value). Between one second and seven days; `None` for anything else.
pub fn parse_completion_window(text: &str) -> Option<i64> {
    let (number, unit) = text.split_at(text.len().checked_sub(1)?);
    let scale = match unit {
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        _ => return None,
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let millis = number.parse::<i64>().ok()?.checked_mul(scale)?;
    (1_000..=7 * 24 * 3_600_000)
        .contains(&millis)
        .then_some(millis)
}

/// The steps of a batch's life: each returns the batch as it is to be stored, written by a store
/// as a compare-and-set on the status it was read in.
impl Batch {
    /// `validating → in_progress`: its tasks were created.
    pub fn started(&self, at: Timestamp) -> Batch {
        Batch {
            status: BatchStatus::InProgress,
            in_progress_at: Some(at),
            ..self.clone()
        }
    }

    /// `validating → failed`: a line of its input was bad.
    pub fn refused(&self, errors: Vec<LineError>, at: Timestamp) -> Batch {
        Batch {
            status: BatchStatus::Failed,
            errors,
            failed_at: Some(at),
            ..self.clone()
        }
    }

    /// A cancel: `validating` or `in_progress → cancelling`; `None` in any other status (a
    /// batch already ending or ended is left as it is).
    pub fn cancelled_by_client(&self, at: Timestamp) -> Option<Batch> {
        self.status.cancellable().then(|| Batch {
            status: BatchStatus::Cancelling,
            cancelling_at: Some(at),
            ..self.clone()
        })
    }

    /// `in_progress → finalizing`: every line is counted, or (`expired`) its window passed.
    pub fn finalizing(&self, expired: bool, at: Timestamp) -> Batch {
        Batch {
            status: BatchStatus::Finalizing,
            finalizing_at: Some(at),
            expired_at: expired.then_some(at),
            ..self.clone()
        }
    }

    /// Who stopped the cancelled line whose task is `task`, in this batch being finalized: see
    /// [`line_outcome`].
    fn line_cancel(&self, task: &Task) -> LineCancel {
        let (by_batch, since) = match self.status.ended(self.expired_at.is_some()) {
            BatchStatus::Cancelled => (LineCancel::BatchCancelled, self.cancelling_at),
            BatchStatus::Expired => (LineCancel::BatchExpired, self.expired_at),
            _ => return LineCancel::Request,
        };
        match (since, task.finished_at) {
            (Some(since), Some(finished)) if finished < since => LineCancel::Request,
            _ => by_batch,
        }
    }

    /// `finalizing` or `cancelling` → its end ([`BatchStatus::ended`]), with its files.
    pub fn ended(&self, output: Option<FileId>, error: Option<FileId>, at: Timestamp) -> Batch {
        let status = self.status.ended(self.expired_at.is_some());
        Batch {
            status,
            output_file_id: output,
            error_file_id: error,
            completed_at: (status == BatchStatus::Completed).then_some(at),
            cancelled_at: (status == BatchStatus::Cancelled).then_some(at),
            finalizing_at: self.finalizing_at.or(Some(at)),
            ..self.clone()
        }
    }
}

/// The size and SHA-256 of a file's bytes, fed as they stream past.
#[derive(Debug, Clone, Default)]
pub struct ContentDigest {
    hasher: Sha256,
    bytes: u64,
}

impl ContentDigest {
    /// Feeds the next bytes.
    pub fn update(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.bytes += chunk.len() as u64;
    }

    /// The bytes fed so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The size and the digest in lower-case hex.
    pub fn finish(self) -> (u64, String) {
        (self.bytes, hex::encode(self.hasher.finalize()))
    }
}
