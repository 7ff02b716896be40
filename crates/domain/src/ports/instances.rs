//! Instances: the processes that share a store, their leases, and the recovery of those that
//! stopped (P-7…P-11).

use async_trait::async_trait;

use crate::ids::InstanceId;
use crate::ports::{RecoveryReport, StoreError};
use crate::time::Timestamp;

/// An instance as it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    /// This incarnation's id.
    pub id: InstanceId,
    /// Its stable name (e.g. the host's), shared by its incarnations.
    pub name: String,
    /// When it started.
    pub started_at: Timestamp,
    /// Until when its lease runs.
    pub lease_until: Timestamp,
}

/// What registering found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// Registered. `previous` are earlier incarnations of the same name, now declared stopped:
    /// the new one recovers them at once instead of waiting for their leases to run out.
    Registered {
        /// Earlier incarnations of this name.
        previous: Vec<InstanceId>,
    },
    /// An instance of this name holds a lease that has not run out (another process is running
    /// under the same name, or a crashed one's lease is still running): nothing was written.
    NameInUse {
        /// When that lease runs out.
        lease_until: Timestamp,
    },
}

/// Instances and their leases.
#[async_trait]
pub trait InstanceStore: Send + Sync {
    /// Registers an instance with its lease. A single-process store (SQLite behind a lock on its
    /// directory) declares every other instance stopped.
    async fn register_instance(&self, instance: InstanceInfo) -> Result<Registration, StoreError>;

    /// Renews an instance's lease; `false` when it had run out and the instance was declared
    /// stopped (its tasks are another's now: it must take no more steps on them).
    async fn renew_lease(
        &self,
        instance: InstanceId,
        lease_until: Timestamp,
        at: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Ends an instance's lease (a clean stop); its unfinished tasks are recovered by others.
    async fn retire_instance(&self, instance: InstanceId, at: Timestamp) -> Result<(), StoreError>;

    /// Instances that stopped (retired, or whose lease ran out by `at`) and still have tasks to
    /// be recovered, oldest first; never `me`.
    async fn stopped_instances(
        &self,
        me: InstanceId,
        at: Timestamp,
    ) -> Result<Vec<InstanceId>, StoreError>;

    /// P-7…P-11, I-5: moves every unfinished task in the care of the stopped instance `stopped`
    /// per [`crate::recovery::recover`] on behalf of `rescuer`, each move with its events in one
    /// transaction, as a compare-and-set, in batches; runs to completion, then ends the
    /// idempotency holds of `stopped` and marks it recovered. Each task moves once even when
    /// several rescuers run at the same time.
    async fn recover_instance(
        &self,
        stopped: InstanceId,
        rescuer: InstanceId,
        at: Timestamp,
    ) -> Result<RecoveryReport, StoreError>;

    /// Whether `instance` leads the maintenance (the purge job) now: at most one instance at a
    /// time does. Asked before every pass.
    async fn lead_maintenance(&self, instance: InstanceId) -> Result<bool, StoreError>;
}
