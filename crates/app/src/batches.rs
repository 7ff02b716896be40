//! Files and batches (OpenAI's Batch API): uploading, reading and deleting files; creating,
//! reading and cancelling batches; and the batch upkeep job, which checks a new batch's lines and
//! creates its tasks, cancels the lines of a cancelled or expired batch, and writes a batch's
//! output and error files once every line is answered.
//!
//! The upkeep runs in every instance and keeps nothing in memory between passes: each step is a
//! compare-and-set on the batch's status in the store, so a step another instance (or an earlier
//! incarnation of this one, before a crash) took first is simply found done. A batch's files are
//! written from its tasks, one line per task in line order, so writing them again after a crash
//! gives the same lines: every `custom_id` is answered exactly once.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};

use lmsp_domain::auth::{Scope, Scopes};
use lmsp_domain::batch::{
    first_errors, line_outcome, parse_completion_window, Batch, BatchEndpoint, BatchLine,
    BatchStatus, BatchWork, ContentDigest, DuplicateLine, FilePurpose, LineCheck, LineEnvelope,
    LineError, LineErrorCode, LineOutcome, NewBatch, StoredFile, MAX_LINE_ERRORS,
};
use lmsp_domain::ports::{
    ContentReader, ContentWriter, FileDeleteOutcome, ListOrder, Page, StoreError,
};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::validation::{validate_metadata, SubmitRequest, ValidationError};
use lmsp_domain::{BatchId, FileId, Metadata, Response, Task};

use crate::caller::Caller;
use crate::error::AppError;
use crate::service::Service;

/// How often the upkeep looks at the batches that have not ended, when nothing woke it sooner.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(500);
/// Lines' tasks kept aside per store call while a batch is checked.
const STAGE_CHUNK: usize = 500;
/// Tasks read per store call while a batch's files are written or its lines cancelled.
const TASK_PAGE: usize = 500;
/// Batches looked at per upkeep pass.
const BATCHES_PER_PASS: usize = 64;

/// One input line, as the driving adapter read it.
#[derive(Debug, Clone)]
pub struct ReadLine {
    /// `custom_id`, when it is a string.
    pub custom_id: Option<String>,
    /// `method`, when it is a string.
    pub method: Option<String>,
    /// `url`, when it is a string.
    pub url: Option<String>,
    /// `body`, read as the endpoint reads a request, or why the endpoint would refuse it (its
    /// `param` relative to the body).
    pub body: Result<SubmitRequest, ValidationError>,
}

/// The driving adapter's reading and writing of batch lines: the endpoints' request and answer
/// shapes are its own.
pub trait BatchWire: Send + Sync {
    /// Reads one input line for `endpoint`; `None` when it is not a JSON object.
    fn read_line(&self, endpoint: BatchEndpoint, text: &[u8]) -> Option<ReadLine>;

    /// The output or error file's line (without its newline) answering the line of `task`, which
    /// finished: `outcome` says which file and how, `response` is its response when it completed.
    fn answer(
        &self,
        endpoint: BatchEndpoint,
        task: &Task,
        response: Option<&Response>,
        outcome: LineOutcome,
    ) -> Vec<u8>;
}

/// A file's bytes as they are read back.
pub struct FileContent {
    /// The file.
    pub file: StoredFile,
    /// Its bytes.
    pub reader: Box<dyn ContentReader>,
}

impl std::fmt::Debug for FileContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileContent")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// An upload's bytes, stored but not yet a file (no record names them).
#[derive(Debug)]
pub struct Received {
    id: FileId,
    filename: String,
    bytes: u64,
    digest: String,
}

/// What a new batch asks for, as the request gave it.
#[derive(Debug, Clone, Default)]
pub struct BatchRequest {
    /// `input_file_id`.
    pub input_file_id: String,
    /// `endpoint`.
    pub endpoint: String,
    /// `completion_window`.
    pub completion_window: String,
    /// `metadata`.
    pub metadata: Option<Metadata>,
}

fn invalid(param: &str, message: impl Into<String>) -> AppError {
    AppError::Invalid(ValidationError::new(param, message))
}

impl Service {
    /// Stores an upload's bytes as they stream in (at most `--max-file-bytes`): the first half
    /// of an upload, which [`Service::keep_file`] ends (a multipart upload may name its purpose
    /// after its file).
    pub async fn receive_file<S, B, E>(
        &self,
        caller: &Caller,
        filename: String,
        mut chunks: S,
    ) -> Result<Received, AppError>
    where
        S: Stream<Item = Result<B, E>> + Unpin + Send,
        B: AsRef<[u8]>,
        E: Display,
    {
        caller.require(Scope::ResponsesWrite)?;
        if filename.is_empty() || filename.chars().count() > 255 {
            return Err(invalid("file", "the file's name must be 1–255 characters"));
        }
        let core = &self.inner.core;
        let max = core.settings.max_file_bytes;
        let id = FileId::from_ulid(core.next_ulid());
        let mut writer = self.inner.contents.create(id).await?;
        let mut digest = ContentDigest::default();
        let written: Result<(), AppError> = async {
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk
                    .map_err(|error| invalid("file", format!("the upload broke off: {error}")))?;
                let chunk = chunk.as_ref();
                if digest.bytes() + chunk.len() as u64 > max {
                    return Err(AppError::FileTooLarge(max));
                }
                digest.update(chunk);
                writer.write(chunk).await?;
            }
            Ok(())
        }
        .await;
        if let Err(error) = written {
            drop(writer);
            self.remove_content(id).await;
            return Err(error);
        }
        if let Err(error) = writer.finish().await {
            // The bytes may be in place already (e.g. only the directory's sync failed).
            self.remove_content(id).await;
            return Err(error.into());
        }
        let (bytes, digest) = digest.finish();
        Ok(Received {
            id,
            filename,
            bytes,
            digest,
        })
    }

    /// Ends an upload: the file's record, once its `purpose` is known to be `batch` (the only
    /// one uploaded; the service writes the `batch_output` files itself). On a refusal the bytes
    /// are removed.
    pub async fn keep_file(
        &self,
        caller: &Caller,
        received: Received,
        purpose: Option<&str>,
    ) -> Result<StoredFile, AppError> {
        if purpose != Some(FilePurpose::Batch.as_str()) {
            self.remove_content(received.id).await;
            return Err(invalid(
                "purpose",
                "`purpose` must be \"batch\": files are uploaded as batch input",
            ));
        }
        let file = StoredFile {
            id: received.id,
            client_id: caller.client_id,
            filename: received.filename,
            purpose: FilePurpose::Batch,
            bytes: received.bytes,
            digest: received.digest,
            created_at: self.now(),
            batch_id: None,
        };
        if let Err(error) = self.inner.core.store.insert_file(file.clone()).await {
            self.remove_content(file.id).await;
            return Err(error.into());
        }
        Ok(file)
    }

    /// Drops an upload that will not be kept (its request failed after its bytes were stored).
    pub async fn discard_file(&self, received: Received) {
        self.remove_content(received.id).await;
    }

    /// Removes a file's bytes; a failure only leaves unreachable bytes behind, so it is logged.
    async fn remove_content(&self, id: FileId) {
        if let Err(error) = self.inner.contents.remove(id).await {
            tracing::warn!(%error, file = %id, "could not remove a file's bytes");
        }
    }

    /// A file the caller may see (I-7: another client's is not found).
    pub async fn file(&self, caller: &Caller, id: FileId) -> Result<StoredFile, AppError> {
        caller.require(Scope::ResponsesRead)?;
        match self.inner.core.store.file(id).await? {
            Some(file) if caller.visibility().is_none_or(|c| c == file.client_id) => Ok(file),
            _ => Err(AppError::NotFound),
        }
    }

    /// The caller's files in `order` (oldest or newest first), past `after` in that order.
    pub async fn list_files(
        &self,
        caller: &Caller,
        purpose: Option<FilePurpose>,
        after: Option<FileId>,
        order: ListOrder,
        limit: usize,
    ) -> Result<Page<StoredFile>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        Ok(self
            .inner
            .core
            .store
            .list_files(caller.visibility(), purpose, after, order, limit)
            .await?)
    }

    /// A file's bytes.
    pub async fn file_content(&self, caller: &Caller, id: FileId) -> Result<FileContent, AppError> {
        let file = self.file(caller, id).await?;
        match self.inner.contents.open(id).await? {
            Some(reader) => Ok(FileContent { file, reader }),
            None => Err(AppError::Store(StoreError::Corrupt(format!(
                "the bytes of file {id} are missing"
            )))),
        }
    }

    /// Deletes a file: its record, then its bytes. A file an unfinished batch reads stays.
    pub async fn delete_file(&self, caller: &Caller, id: FileId) -> Result<(), AppError> {
        caller.require(Scope::ResponsesWrite)?;
        match self
            .inner
            .core
            .store
            .delete_file(id, caller.visibility())
            .await?
        {
            FileDeleteOutcome::Deleted => {
                self.remove_content(id).await;
                Ok(())
            }
            FileDeleteOutcome::InUse => Err(AppError::FileInUse),
            FileDeleteOutcome::NotFound => Err(AppError::NotFound),
        }
    }

    /// Creates a batch from an uploaded file, in `validating`: the upkeep checks its lines next.
    pub async fn create_batch(
        &self,
        caller: &Caller,
        request: BatchRequest,
    ) -> Result<Batch, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        if self.inner.life.is_shutting_down() {
            return Err(AppError::ShuttingDown);
        }
        let endpoint = BatchEndpoint::parse(&request.endpoint).ok_or_else(|| {
            invalid(
                "endpoint",
                "`endpoint` must be \"/v1/responses\" or \"/v1/chat/completions\"",
            )
        })?;
        let window = parse_completion_window(&request.completion_window).ok_or_else(|| {
            invalid(
                "completion_window",
                "`completion_window` must be a duration such as \"24h\" (1s to 168h)",
            )
        })?;
        let metadata = validate_metadata(request.metadata.unwrap_or_default())?;
        let unknown = || AppError::UnknownReference {
            param: "input_file_id",
            message: format!("no file `{}`", request.input_file_id),
        };
        let file_id = FileId::parse(&request.input_file_id).map_err(|_| unknown())?;
        let file = match self.file(caller, file_id).await {
            Err(AppError::NotFound) => return Err(unknown()),
            other => other?,
        };
        if file.purpose != FilePurpose::Batch {
            return Err(invalid(
                "input_file_id",
                "the input file must be one uploaded with purpose \"batch\"",
            ));
        }
        let core = &self.inner.core;
        let batch = Batch::new(NewBatch {
            id: BatchId::from_ulid(core.next_ulid()),
            client_id: caller.client_id,
            endpoint,
            input_file_id: file_id,
            completion_window_ms: window,
            metadata,
            created_at: self.now(),
        });
        core.store.insert_batch(batch.clone()).await?;
        self.inner.batch_upkeep.notify_one();
        Ok(batch)
    }

    /// A batch the caller may see, with its counts as they are now.
    pub async fn batch(&self, caller: &Caller, id: BatchId) -> Result<Batch, AppError> {
        caller.require(Scope::ResponsesRead)?;
        match self.inner.core.store.batch(id).await? {
            Some(batch) if batch.visible_to(caller.visibility()) => Ok(batch),
            _ => Err(AppError::NotFound),
        }
    }

    /// The caller's batches, newest first, older than `after`.
    pub async fn list_batches(
        &self,
        caller: &Caller,
        after: Option<BatchId>,
        limit: usize,
    ) -> Result<Page<Batch>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        Ok(self
            .inner
            .core
            .store
            .list_batches(caller.visibility(), after, limit)
            .await?)
    }

    /// Cancels a batch: `cancelling` now; the upkeep cancels its unfinished lines and ends it
    /// `cancelled`, keeping the lines that finished. A batch already cancelling or cancelled is
    /// answered as it is; one that ended otherwise cannot be cancelled.
    pub async fn cancel_batch(&self, caller: &Caller, id: BatchId) -> Result<Batch, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        let store = &self.inner.core.store;
        // A compare-and-set on the status read: another step may move the batch in between
        // (its validation ends, its last line finishes), so read again then.
        for _ in 0..8 {
            let batch = self.batch(caller, id).await?;
            let Some(cancelling) = batch.cancelled_by_client(self.now()) else {
                return match batch.status {
                    BatchStatus::Cancelling | BatchStatus::Cancelled => Ok(batch),
                    status => Err(AppError::BatchNotCancellable(status.as_str())),
                };
            };
            if let Some(batch) = store.update_batch(batch.status, cancelling).await? {
                self.inner.batch_upkeep.notify_one();
                return Ok(batch);
            }
        }
        Err(AppError::StorageUnavailable)
    }

    /// The upkeep job: a pass over the batches that have not ended whenever a batch was created
    /// or cancelled, and every [`UPKEEP_INTERVAL`] (lines finish without telling it), until the
    /// service stops taking work.
    pub(crate) async fn run_batch_upkeep(self) {
        let life = Arc::clone(&self.inner.life);
        loop {
            if let Err(error) = self.upkeep_pass().await {
                tracing::warn!(%error, "the batch upkeep failed; it tries again");
            }
            tokio::select! {
                () = self.inner.batch_upkeep.notified() => {}
                () = tokio::time::sleep(UPKEEP_INTERVAL) => {}
                () = life.stop_taking_work.cancelled() => return,
            }
        }
    }

    /// One pass: each unfinished batch's next step ([`Batch::work`]).
    async fn upkeep_pass(&self) -> Result<(), AppError> {
        let store = &self.inner.core.store;
        for batch in store.unfinished_batches(BATCHES_PER_PASS).await? {
            if self.inner.life.is_shutting_down() {
                break;
            }
            let id = batch.id;
            let done = match batch.work(self.now()) {
                BatchWork::Validate => self.validate(batch).await,
                BatchWork::Expire => {
                    let expired = batch.finalizing(true, self.now());
                    store.update_batch(batch.status, expired).await?;
                    Ok(())
                }
                BatchWork::Sweep => self.sweep(&batch).await,
                BatchWork::Finalize => self.finalize(batch).await,
                BatchWork::Wait => Ok(()),
            };
            if let Err(error) = done {
                tracing::warn!(%error, batch = %id, "a batch step failed; it is tried again");
            }
        }
        Ok(())
    }

    /// Checks a `validating` batch's lines, keeping each good line's task aside, then either
    /// creates them all and starts the batch (P-2, all or nothing) or fails it with the first
    /// [`MAX_LINE_ERRORS`] errors and creates nothing.
    ///
    /// Good lines are kept aside even after a bad one, so that the store finds every duplicate
    /// `custom_id` among them (`staged_duplicates`): nothing here grows with the file.
    async fn validate(&self, batch: Batch) -> Result<(), AppError> {
        let store = &self.inner.core.store;
        let Some(mut reader) = self.inner.contents.open(batch.input_file_id).await? else {
            let error = LineError {
                code: LineErrorCode::EmptyFile,
                message: String::from("the input file is gone"),
                param: Some(String::from("input_file_id")),
                line: None,
            };
            store
                .update_batch(batch.status, batch.refused(vec![error], self.now()))
                .await?;
            return Ok(());
        };
        let caller = Caller {
            client_id: batch.client_id,
            scopes: Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite]),
        };
        let mut check = LineCheck::new(batch.endpoint);
        let mut errors = Vec::new();
        let mut staged = Vec::new();
        let mut lines = Lines::default();
        loop {
            let chunk = reader.read().await?;
            let end = chunk.is_empty();
            lines.feed(&chunk, end);
            while let Some(text) = lines.next_line() {
                if text.iter().all(u8::is_ascii_whitespace) {
                    check.skip();
                    continue;
                }
                match self.read_line(&batch, &caller, &text, &mut check).await {
                    Ok(task) => staged.push(task),
                    Err(error) => {
                        if matches!(error.code, LineErrorCode::TooManyLines) {
                            errors.push(error);
                            break;
                        }
                        if errors.len() < MAX_LINE_ERRORS {
                            errors.push(error);
                        }
                    }
                }
                if staged.len() >= STAGE_CHUNK {
                    store.stage_batch_tasks(std::mem::take(&mut staged)).await?;
                }
            }
            if end
                || errors
                    .last()
                    .is_some_and(|e| e.code == LineErrorCode::TooManyLines)
            {
                break;
            }
        }
        if !staged.is_empty() {
            store.stage_batch_tasks(staged).await?;
        }
        let duplicates = store.staged_duplicates(batch.id, MAX_LINE_ERRORS).await?;
        errors.extend(duplicates.iter().map(DuplicateLine::error));
        if errors.is_empty() {
            if let Err(error) = check.finish() {
                errors.push(error);
            }
        }
        if !errors.is_empty() {
            store
                .update_batch(
                    batch.status,
                    batch.refused(first_errors(errors), self.now()),
                )
                .await?;
            return Ok(());
        }
        if store
            .start_batch(batch.started(self.now()))
            .await?
            .is_some()
        {
            self.inner.workers.wake_all();
        }
        Ok(())
    }

    /// One line: its envelope, then its body as the endpoint would take it, as a task.
    async fn read_line(
        &self,
        batch: &Batch,
        caller: &Caller,
        text: &[u8],
        check: &mut LineCheck,
    ) -> Result<Task, LineError> {
        let Some(read) = self.inner.batch_wire.read_line(batch.endpoint, text) else {
            let line = check.skip();
            return Err(LineError::at(
                line,
                LineErrorCode::InvalidJsonLine,
                "the line is not a JSON object",
            ));
        };
        check.check(LineEnvelope {
            custom_id: read.custom_id.as_deref(),
            method: read.method.as_deref(),
            url: read.url.as_deref(),
        })?;
        let line = check.lines();
        let refused = |param: Option<String>, message: String| LineError {
            code: LineErrorCode::InvalidRequest,
            message,
            param: Some(match param {
                Some(param) => format!("body.{param}"),
                None => String::from("body"),
            }),
            line: Some(line),
        };
        let custom_id = read.custom_id.unwrap_or_default();
        let prepared = match read.body {
            Ok(request) => {
                let line_of = BatchLine {
                    batch_id: batch.id,
                    line,
                    custom_id: custom_id.clone(),
                };
                self.prepare_task(caller, &request, Some(line_of))
                    .await
                    .map_err(|error| (error.param(), error.to_string()))
            }
            Err(error) => Err((error.param, error.message)),
        };
        match prepared {
            // Its answer is the one a synchronous request gets.
            Ok(task) => Ok(Task {
                background: false,
                ..task
            }),
            Err((param, message)) => {
                // Refused for its body: its `custom_id` is taken all the same.
                check.refused_body(&custom_id);
                Err(refused(param, message))
            }
        }
    }

    /// Cancels a cancelled or expired batch's unfinished lines (P-4 for each: a queued line is
    /// cancelled at once, a running one stops as any cancelled task does).
    async fn sweep(&self, batch: &Batch) -> Result<(), AppError> {
        let store = &self.inner.core.store;
        let mut after = 0;
        loop {
            let tasks = store
                .batch_tasks(batch.id, &TaskStatus::UNFINISHED, after, TASK_PAGE)
                .await?;
            let Some(last) = tasks.last() else {
                return Ok(());
            };
            after = last.batch.as_ref().map_or(u32::MAX, |line| line.line);
            for task in &tasks {
                if task.status != TaskStatus::Cancelling {
                    store.cancel(task.id, None, self.now()).await?;
                }
            }
            if tasks.len() < TASK_PAGE {
                return Ok(());
            }
        }
    }

    /// Writes a batch's output and error files from its tasks, one line per task in line order,
    /// and ends it with them (a compare-and-set: when another pass ended it first, the files
    /// written here are removed again).
    async fn finalize(&self, batch: Batch) -> Result<(), AppError> {
        let store = &self.inner.core.store;
        let batch = if batch.status == BatchStatus::InProgress {
            let finalizing = batch.finalizing(false, self.now());
            match store.update_batch(batch.status, finalizing).await? {
                Some(batch) => batch,
                None => return Ok(()),
            }
        } else {
            batch
        };
        let mut output = OutputFile::new(self, &batch, "output");
        let mut errors = OutputFile::new(self, &batch, "error");
        let written = self.write_lines(&batch, &mut output, &mut errors).await;
        let files = match written {
            Ok(()) => {
                let output = output.finish().await;
                let errors = errors.finish().await;
                match (output, errors) {
                    (Ok(output), Ok(errors)) => [output, errors],
                    (output, errors) => {
                        self.remove_written(&[output.ok().flatten(), errors.ok().flatten()])
                            .await;
                        return Err(AppError::StorageUnavailable);
                    }
                }
            }
            Err(error) => {
                output.abandon(self).await;
                errors.abandon(self).await;
                return Err(error);
            }
        };
        let ended = batch.ended(
            files[0].as_ref().map(|f| f.id),
            files[1].as_ref().map(|f| f.id),
            self.now(),
        );
        // The records are stored with the batch's end and dated by it: the purge takes them
        // `--retention` after it, which is what their `expires_at` says.
        let end = ended.ended_at().unwrap_or_else(|| self.now());
        let records: Vec<StoredFile> = files
            .iter()
            .flatten()
            .map(|file| StoredFile {
                created_at: end,
                ..file.clone()
            })
            .collect();
        if store
            .end_batch(batch.status, ended, records)
            .await?
            .is_none()
        {
            self.remove_written(&files).await;
        }
        Ok(())
    }

    async fn remove_written(&self, files: &[Option<StoredFile>]) {
        for file in files.iter().flatten() {
            self.remove_content(file.id).await;
        }
    }

    /// Each finished line's answer, into the output or the error file.
    async fn write_lines(
        &self,
        batch: &Batch,
        output: &mut OutputFile,
        errors: &mut OutputFile,
    ) -> Result<(), AppError> {
        let store = &self.inner.core.store;
        let mut after = 0;
        loop {
            let answers = store.batch_answers(batch.id, after, TASK_PAGE).await?;
            for (task, response) in &answers {
                let Some(outcome) = line_outcome(task, batch) else {
                    continue;
                };
                let response = match outcome {
                    LineOutcome::Output => response.as_ref(),
                    _ => None,
                };
                let line = self
                    .inner
                    .batch_wire
                    .answer(batch.endpoint, task, response, outcome);
                let file = match outcome {
                    LineOutcome::Output => &mut *output,
                    _ => &mut *errors,
                };
                file.write_line(self, &line).await?;
            }
            match answers.last().and_then(|(task, _)| task.batch.as_ref()) {
                Some(line) if answers.len() == TASK_PAGE => after = line.line,
                _ => return Ok(()),
            }
        }
    }
}

/// A batch's output or error file being written: created at its first line, so a batch with no
/// line of a kind has no file of it.
struct OutputFile {
    id: FileId,
    client: lmsp_domain::ClientId,
    batch: BatchId,
    filename: String,
    writer: Option<Box<dyn ContentWriter>>,
    digest: ContentDigest,
    created_at: lmsp_domain::Timestamp,
}

impl OutputFile {
    fn new(service: &Service, batch: &Batch, kind: &str) -> Self {
        Self {
            id: FileId::from_ulid(service.inner.core.next_ulid()),
            client: batch.client_id,
            batch: batch.id,
            filename: format!("{}_{kind}.jsonl", batch.id),
            writer: None,
            digest: ContentDigest::default(),
            created_at: service.now(),
        }
    }

    async fn write_line(&mut self, service: &Service, line: &[u8]) -> Result<(), AppError> {
        let writer = match &mut self.writer {
            Some(writer) => writer,
            slot => slot.insert(service.inner.contents.create(self.id).await?),
        };
        writer.write(line).await?;
        writer.write(b"\n").await?;
        self.digest.update(line);
        self.digest.update(b"\n");
        Ok(())
    }

    /// The file's record once its bytes are durable; `None` when it has no line.
    async fn finish(self) -> Result<Option<StoredFile>, AppError> {
        let Some(writer) = self.writer else {
            return Ok(None);
        };
        writer.finish().await?;
        let (bytes, digest) = self.digest.finish();
        Ok(Some(StoredFile {
            id: self.id,
            client_id: self.client,
            filename: self.filename,
            purpose: FilePurpose::BatchOutput,
            bytes,
            digest,
            created_at: self.created_at,
            batch_id: Some(self.batch),
        }))
    }

    async fn abandon(self, service: &Service) {
        if self.writer.is_some() {
            drop(self.writer);
            service.remove_content(self.id).await;
        }
    }
}

/// Splits streamed bytes into lines (`\n`, with a `\r` before it dropped), never holding more
/// than the current line.
#[derive(Debug, Default)]
struct Lines {
    pending: Vec<u8>,
    ready: std::collections::VecDeque<Vec<u8>>,
}

impl Lines {
    /// Feeds the next bytes; `end` when no more follow (the last line needs no newline).
    fn feed(&mut self, chunk: &[u8], end: bool) {
        let mut rest = chunk;
        while let Some(at) = rest.iter().position(|&b| b == b'\n') {
            self.pending.extend_from_slice(&rest[..at]);
            let mut line = std::mem::take(&mut self.pending);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.ready.push_back(line);
            rest = &rest[at + 1..];
        }
        self.pending.extend_from_slice(rest);
        if end && !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.ready.push_back(line);
        }
    }

    fn next_line(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            lines.feed(chunk, i + 1 == chunks.len());
            while let Some(line) = lines.next_line() {
                out.push(line);
            }
        }
        out
    }

    #[test]
    fn lines_split_across_chunks_and_lose_their_line_ends() {
        assert_eq!(
            lines_of(&[b"ab", b"c\r\nd", b"e\nf", b""]),
            vec![b"abc".to_vec(), b"de".to_vec(), b"f".to_vec()]
        );
        assert_eq!(lines_of(&[b"a\n", b""]), vec![b"a".to_vec()]);
        assert_eq!(lines_of(&[b"\n\n", b""]), vec![Vec::new(), Vec::new()]);
    }
}
