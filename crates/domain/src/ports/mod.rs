//! The ports: what the app needs from the outside world, as `async_trait` traits over domain
//! types only. Adapters (`lmsp-storage-sqlite`, `lmsp-storage-postgres`, the engines,
//! `lmsp-models-fs`) implement them; the app holds them as `Arc<dyn …>`.
//!
//! The storage port is split by concern and combined into [`Store`]. Each method that writes is
//! **one transaction** in which the adapter reads the current rows, asks the domain
//! ([`crate::transition::advance_all`], [`crate::recovery::recover`],
//! [`crate::cancel::decide_cancel`], [`crate::idempotency::decide`],
//! [`crate::auth::PairingLimit`]) and writes exactly what the domain returns, as a compare-and-set
//! on what it read, or reports the refusal as a value. `Err` is only for the storage itself
//! failing. Nothing here assumes one process: claims and recovery go by instance, and what one
//! instance commits reaches the others through the [`StoreListener`] notification port.

mod batches;
mod clients;
mod engine;
mod files;
mod idempotency;
mod instances;
mod models;
mod tasks;
mod webhooks;

pub use batches::{
    BatchPurge, BatchStore, ContentReader, ContentWriter, FileContents, FileDeleteOutcome,
};
pub use clients::{ClientStore, Redemption};
pub use engine::{
    Engine, EngineError, EngineHealth, Generation, GenerationItem, GenerationJob, ResumePoint,
    Unsupported,
};
pub use files::{ModelFileError, ModelFiles, Progress, VerifiedFile};
pub use idempotency::{IdempotencyStore, KeyedInsert};
pub use instances::{InstanceInfo, InstanceStore, Registration};
pub use models::ModelStore;
pub use tasks::{
    CancelOutcome, CreateOutcome, DeleteOutcome, ListOrder, Page, PurgeReport, RecoveryReport,
    Snapshot, StepOutcome, TaskFilter, TaskStore,
};
pub use webhooks::{OutgoingEvent, WebhookSender, WebhookStore};

use async_trait::async_trait;

use crate::auth::Client;
use crate::event::Event;
use crate::ids::{ServiceId, TaskId};
use crate::time::Timestamp;

/// A failure of the storage itself (never an expected outcome such as a refused step).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The disk is full; nothing of the failed command was written.
    #[error("the storage is full")]
    Full,
    /// The store cannot be read or written now (I/O error, locked too long, unreachable).
    #[error("the storage is unavailable: {0}")]
    Unavailable(String),
    /// A stored row could not be understood.
    #[error("the storage holds data it cannot read: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether trying again later may succeed (a full disk, an unreachable database), as opposed
    /// to data that will never read.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Full | StoreError::Unavailable(_))
    }
}

/// The notification port: how the app hears what the store committed, here and elsewhere.
///
/// Every method is called only after the commit it reports, and must not block (implementations
/// hand the news on and return). An adapter shared by several instances (PostgreSQL) reports the
/// commits of the others too, as far as it hears of them, and the app also polls now and then, so
/// a lost notification delays news but loses none.
pub trait StoreListener: Send + Sync {
    /// The events this process's transaction made durable, in log order per task.
    fn committed(&self, events: &[Event]);

    /// One transaction the adapter tried to commit, measured (for metrics), committed or not.
    fn transaction_measured(&self, _stats: CommitStats) {}

    /// Another instance committed events of `task_id`, up to `last_sequence_number`.
    fn advanced_elsewhere(&self, _task_id: TaskId, _last_sequence_number: u64) {}

    /// A cancel of `task_id` was committed by another instance.
    fn cancel_requested(&self, _task_id: TaskId) {}
}

/// A listener that hears nothing: for a store opened by a tool or a test that serves no one.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoListener;

impl StoreListener for NoListener {
    fn committed(&self, _events: &[Event]) {}
}

/// One transaction of the storage adapter's write path, measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitStats {
    /// The commands (port calls) the transaction carried (group commit).
    pub commands: usize,
    /// The events it made durable (0 when it did not commit).
    pub events: usize,
    /// From `BEGIN` to the end of `COMMIT` (or of the rollback).
    pub duration: std::time::Duration,
    /// Whether it committed.
    pub committed: bool,
}

/// The service's identity: fixed for a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceIdentity {
    /// `svc_…`.
    pub id: ServiceId,
    /// When the store was first used.
    pub created_at: Timestamp,
}

/// What initializing a store found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Initialized {
    /// The identity (the stored one, or the candidate when the store was empty).
    pub identity: ServiceIdentity,
    /// Whether the store was empty: the candidate identity and admin client were stored.
    pub first_start: bool,
}

/// The service's identity and the store's health.
#[async_trait]
pub trait ServiceStore: Send + Sync {
    /// On an empty store, stores `candidate` as the identity and `admin` as the first client, in
    /// one transaction (so a crash leaves both or neither); on an initialized one, changes nothing.
    async fn initialize(
        &self,
        candidate: ServiceIdentity,
        admin: Client,
    ) -> Result<Initialized, StoreError>;

    /// Commits a tiny write, to learn whether the store accepts commits now (health).
    async fn check_writable(&self, at: Timestamp) -> Result<(), StoreError>;
}

/// The whole storage port, as the app holds it (`Arc<dyn Store>`).
pub trait Store:
    TaskStore
    + ClientStore
    + ModelStore
    + IdempotencyStore
    + InstanceStore
    + ServiceStore
    + BatchStore
    + WebhookStore
{
}

impl<T> Store for T where
    T: TaskStore
        + ClientStore
        + ModelStore
        + IdempotencyStore
        + InstanceStore
        + ServiceStore
        + BatchStore
        + WebhookStore
{
}

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}
