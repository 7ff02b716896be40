//! Where a store's recovery pass has got to between its batches (each batch one transaction):
//! the same position in both adapters, over the unfinished statuses in the order recovery looks
//! at them (P-7).

use std::future::Future;

use lmsp_domain::event::Event;
use lmsp_domain::ids::{InstanceId, TaskId};
use lmsp_domain::ports::RecoveryReport;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::time::Timestamp;

/// The leftover status a pass is looking at (an index into [`TaskStatus::UNFINISHED`]), and the
/// last task of that status a batch covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryCursor {
    /// The index of the status in [`TaskStatus::UNFINISHED`].
    pub status_index: usize,
    /// The last task of that status a batch covered (`None`: none yet).
    pub after: Option<TaskId>,
}

/// What one recovery batch did, and where the next one starts (`None`: the pass is complete).
pub type RecoveryStep = (RecoveryReport, Option<RecoveryCursor>);

/// One recovery batch (P-7…P-11, I-5), as both adapters are asked for it: the leftovers of
/// `stopped` to move into `rescuer`'s care at `at`, at most `limit` of them from `cursor` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryBatch {
    /// The stopped instance whose tasks are recovered.
    pub stopped: InstanceId,
    /// The instance that takes them over.
    pub rescuer: InstanceId,
    /// When (the caller's time, never the database's).
    pub at: Timestamp,
    /// Where the batch starts.
    pub cursor: RecoveryCursor,
    /// How many tasks the batch covers at most (the store's recovery batch size).
    pub limit: usize,
}

/// What a recovery batch has done so far: the domain's report of it, and the events it wrote,
/// in the order it wrote them.
#[derive(Debug, Default)]
pub struct Recovered {
    /// What was moved, resumed, left alone.
    pub report: RecoveryReport,
    /// The events written.
    pub events: Vec<Event>,
}

impl Recovered {
    /// The batch's outcome: what it did, where the next batch starts (`None`: the pass is
    /// complete), and its events.
    pub fn until(self, next: Option<RecoveryCursor>) -> (RecoveryStep, Vec<Event>) {
        ((self.report, next), self.events)
    }
}

impl RecoveryCursor {
    /// The start of a pass.
    pub const START: RecoveryCursor = RecoveryCursor {
        status_index: 0,
        after: None,
    };

    /// The status the cursor is at; `None` once the pass has looked at every one.
    pub fn status(&self) -> Option<TaskStatus> {
        TaskStatus::UNFINISHED.get(self.status_index).copied()
    }

    /// The start of the next status.
    pub fn next_status(self) -> RecoveryCursor {
        RecoveryCursor {
            status_index: self.status_index + 1,
            after: None,
        }
    }

    /// The cursor, while the pass has a status left to look at.
    pub fn unless_done(self) -> Option<RecoveryCursor> {
        self.status().is_some().then_some(self)
    }
}

impl RecoveryBatch {
    /// The first batch of a pass (from [`RecoveryCursor::START`]).
    pub fn first(stopped: InstanceId, rescuer: InstanceId, at: Timestamp, limit: usize) -> Self {
        Self {
            stopped,
            rescuer,
            at,
            cursor: RecoveryCursor::START,
            limit,
        }
    }
}

/// A whole recovery pass: `batch` run from `first`, each time from where the last one stopped,
/// until one says the pass is complete; what every batch did, added up. Each adapter's `batch`
/// is one transaction of its own (its locking and writing are the adapter's); the walk over the
/// batches is the same in both.
pub async fn recovery_pass<E, F, Fut>(
    first: RecoveryBatch,
    mut batch: F,
) -> Result<RecoveryReport, E>
where
    F: FnMut(RecoveryBatch) -> Fut,
    Fut: Future<Output = Result<RecoveryStep, E>>,
{
    let mut report = RecoveryReport::default();
    let mut cursor = Some(first.cursor);
    while let Some(from) = cursor {
        let (part, next) = batch(RecoveryBatch {
            cursor: from,
            ..first
        })
        .await?;
        report.absorb(part);
        cursor = next;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_looks_at_each_unfinished_status_in_turn_and_then_ends() {
        let mut cursor = RecoveryCursor::START;
        let mut seen = Vec::new();
        while let Some(status) = cursor.status() {
            seen.push(status);
            cursor = cursor.next_status();
            assert_eq!(cursor.after, None);
        }
        assert_eq!(seen, TaskStatus::UNFINISHED);
        assert_eq!(cursor.unless_done(), None);
        assert_eq!(
            RecoveryCursor::START.unless_done(),
            Some(RecoveryCursor::START)
        );
    }

    #[test]
    fn a_pass_adds_up_its_batches_and_starts_each_where_the_last_stopped() {
        let mut starts = Vec::new();
        let pass = recovery_pass(some_batch(), |batch| {
            let from = batch.cursor;
            starts.push(from);
            let next = from.next_status().unless_done();
            let part = RecoveryReport {
                moved: 1,
                ..RecoveryReport::default()
            };
            std::future::ready(Ok::<_, ()>((part, next)))
        });
        let report = block_on(pass).expect("no batch fails");
        assert_eq!(starts.first(), Some(&RecoveryCursor::START));
        assert_eq!(starts.len(), TaskStatus::UNFINISHED.len());
        assert_eq!(report.moved, TaskStatus::UNFINISHED.len() as u64);
    }

    #[test]
    fn a_failed_batch_ends_the_pass_with_its_error() {
        let mut runs = 0;
        let pass = recovery_pass(some_batch(), |_| {
            runs += 1;
            std::future::ready(Err::<RecoveryStep, _>("lost"))
        });
        assert_eq!(block_on(pass), Err("lost"));
        assert_eq!(runs, 1);
    }

    /// A pass's first batch (its instances and time do not matter to the walk).
    fn some_batch() -> RecoveryBatch {
        let instance = InstanceId::from_ulid(ulid::Ulid::nil());
        RecoveryBatch::first(instance, instance, Timestamp::from_millis(0), 10)
    }

    /// Runs a future that never waits (the batches above are ready at once).
    fn block_on<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("a ready batch never waits"),
        }
    }
}
