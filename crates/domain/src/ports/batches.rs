//! Files and batches: their records (in the store) and the files' bytes (where the store keeps
//! them: a directory beside SQLite's database, rows of the shared PostgreSQL database).

use async_trait::async_trait;

use crate::batch::{Batch, BatchStatus, DuplicateLine, FilePurpose, StoredFile};
use crate::ids::{BatchId, ClientId, FileId};
use crate::ports::{ListOrder, Page, StoreError};
use crate::status::TaskStatus;
use crate::task::{Response, Task};
use crate::time::Timestamp;

/// How deleting a file ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileDeleteOutcome {
    /// Its record is gone; its bytes may be removed.
    Deleted,
    /// An unfinished batch reads it: nothing changed.
    InUse,
    /// No such file (or not the caller's).
    NotFound,
}

/// What one purge of ended batches removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchPurge {
    /// Batches removed, with their records.
    pub batches: u64,
    /// Their tasks removed, with their events, responses and snapshots.
    pub tasks: u64,
    /// The files whose records went with them: their bytes are to be removed.
    pub files: Vec<FileId>,
    /// Whether more is left for a later call.
    pub more: bool,
}

/// Files' and batches' records.
#[async_trait]
pub trait BatchStore: Send + Sync {
    /// Stores a file's record (its bytes are already stored).
    async fn insert_file(&self, file: StoredFile) -> Result<(), StoreError>;

    /// A file's record.
    async fn file(&self, id: FileId) -> Result<Option<StoredFile>, StoreError>;

    /// Files in `order` (by id: oldest or newest first), continuing past `after` in that order;
    /// `client` restricts them to that client's.
    async fn list_files(
        &self,
        client: Option<ClientId>,
        purpose: Option<FilePurpose>,
        after: Option<FileId>,
        order: ListOrder,
        limit: usize,
    ) -> Result<Page<StoredFile>, StoreError>;

    /// Removes a file's record, unless a batch that has not ended reads it.
    async fn delete_file(
        &self,
        id: FileId,
        client: Option<ClientId>,
    ) -> Result<FileDeleteOutcome, StoreError>;

    /// Stores a new batch (`validating`).
    async fn insert_batch(&self, batch: Batch) -> Result<(), StoreError>;

    /// A batch, with its counts as they are now.
    async fn batch(&self, id: BatchId) -> Result<Option<Batch>, StoreError>;

    /// Batches, newest first, before `before`; `client` restricts them to that client's.
    async fn list_batches(
        &self,
        client: Option<ClientId>,
        before: Option<BatchId>,
        limit: usize,
    ) -> Result<Page<Batch>, StoreError>;

    /// The batches that have not ended, oldest first (the upkeep's work list).
    async fn unfinished_batches(&self, limit: usize) -> Result<Vec<Batch>, StoreError>;

    /// Keeps the tasks of some lines of a `validating` batch aside, invisible, until
    /// [`BatchStore::start_batch`] creates them all at once. Each task carries its
    /// [`crate::batch::BatchLine`]; a line kept already (an earlier, interrupted validation)
    /// keeps its first task.
    async fn stage_batch_tasks(&self, tasks: Vec<Task>) -> Result<(), StoreError>;

    /// The kept lines of `batch` whose `custom_id` an earlier kept line of it has, in line
    /// order, at most `limit` (a batch's `custom_id`s are unique: [`crate::batch::LineCheck`]
    /// says why the store checks it).
    async fn staged_duplicates(
        &self,
        batch: BatchId,
        limit: usize,
    ) -> Result<Vec<DuplicateLine>, StoreError>;

    /// P-2 for a whole batch: writes `started` (from `validating`), creates every kept task
    /// (`queued`, with its `response.created` event, not `background`: a line is answered as a
    /// synchronous request is) and sets the batch's total to their number, in one transaction. `None` (and nothing but the kept tasks' removal) when the
    /// batch is no longer `validating`.
    async fn start_batch(&self, started: Batch) -> Result<Option<Batch>, StoreError>;

    /// Writes `batch` if the stored one is still in status `from` (a compare-and-set); drops the
    /// tasks kept aside for it when it leaves `validating`. The counts are the store's, never
    /// overwritten. The batch as stored now, or `None` when it was not in `from`.
    async fn update_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
    ) -> Result<Option<Batch>, StoreError>;

    /// [`BatchStore::update_batch`] to a batch's end, storing the records of its output and error
    /// files in the same transaction.
    async fn end_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
        files: Vec<StoredFile>,
    ) -> Result<Option<Batch>, StoreError>;

    /// A batch's tasks in line order after line `after`, at most `limit`; with `statuses`
    /// non-empty, only those in one of them.
    async fn batch_tasks(
        &self,
        batch: BatchId,
        statuses: &[TaskStatus],
        after: u32,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError>;

    /// A batch's tasks in line order after line `after`, at most `limit`, each with its stored
    /// response (`None` for a task that has none): what the output and error files are written
    /// from, read a page at a time rather than a response per line.
    async fn batch_answers(
        &self,
        batch: BatchId,
        after: u32,
        limit: usize,
    ) -> Result<Vec<(Task, Option<Response>)>, StoreError>;

    /// P-5, P-6 for batches: removes batches that ended before `cutoff` with their tasks (at
    /// most `batch` tasks per call), then their output and error files' records. Never a batch
    /// that has not ended, nor an uploaded file.
    async fn purge_batches(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<BatchPurge, StoreError>;
}

/// Where the bytes of files are written to and read from.
#[async_trait]
pub trait FileContents: Send + Sync {
    /// A writer of the new file `id`'s bytes.
    async fn create(&self, id: FileId) -> Result<Box<dyn ContentWriter>, StoreError>;

    /// A reader of file `id`'s bytes; `None` when there are none.
    async fn open(&self, id: FileId) -> Result<Option<Box<dyn ContentReader>>, StoreError>;

    /// Removes file `id`'s bytes (nothing when there are none).
    async fn remove(&self, id: FileId) -> Result<(), StoreError>;
}

/// Writes one new file's bytes, in order.
#[async_trait]
pub trait ContentWriter: Send {
    /// Appends `chunk`.
    async fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError>;

    /// Makes every byte written durable; only then may the file's record be stored.
    async fn finish(self: Box<Self>) -> Result<(), StoreError>;
}

/// Reads one file's bytes, in order.
#[async_trait]
pub trait ContentReader: Send {
    /// The next bytes; empty at the end.
    async fn read(&mut self) -> Result<Vec<u8>, StoreError>;
}
