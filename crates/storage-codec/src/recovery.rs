//! Where a store's recovery pass has got to between its batches (each batch one transaction):
//! the same position in both adapters, over the unfinished statuses in the order recovery looks
//! at them (P-7).

use lmsp_domain::ids::TaskId;
use lmsp_domain::ports::RecoveryReport;
use lmsp_domain::status::TaskStatus;

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
}
