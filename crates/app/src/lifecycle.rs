//! The life of this process: when it stops taking work, when it stops for good, when it cannot
//! go on, and the jobs that must end before it does.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The signals every worker, job and waiting request watches.
#[derive(Default)]
pub(crate) struct Lifecycle {
    /// Workers stop taking new work, and new task requests are refused (shutdown began).
    pub(crate) stop_taking_work: CancellationToken,
    /// Everything stops now (the grace has passed): running tasks are left for recovery.
    pub(crate) stop_now: CancellationToken,
    /// Raised when the service cannot go on (its lease was lost): the process must exit.
    pub(crate) fatal: CancellationToken,
    /// The background jobs and the jobs of requests that outlive their request.
    pub(crate) jobs: TaskTracker,
}

impl Lifecycle {
    /// Whether shutdown has begun.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.stop_taking_work.is_cancelled()
    }
}
