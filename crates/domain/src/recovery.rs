//! Restart policies and the recovery table (P-7…P-11).
//!
//! When an instance stops before its tasks finish (a restart, a crash, a lost lease), every
//! leftover task in its care (`queued`, `loading`, `running`, `cancelling`) moves by its
//! `on_restart` policy. [`plan`] is the table itself; [`recover`] applies it to a task and returns
//! the new row with its events, to be written in one transaction (P-11).
//!
//! Recovery is idempotent (I-5): a moved task passes into the care of the instance that moved it
//! (its owner), and only tasks owned by another instance are leftovers ([`is_leftover`]); so a
//! second pass changes nothing, and the next restart moves the task again, as it should: it was
//! interrupted again.

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::error_code::TaskErrorCode;
use crate::event::{ClosedItem, EventKind, EventPayload, QueueReason};
use crate::ids::InstanceId;
use crate::status::TaskStatus;
use crate::task::{ItemStatus, Task, TaskError};
use crate::time::Timestamp;
use crate::transition::{apply, Advanced, Transition};

/// What happens to an unfinished task when its instance stops.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    EnumString,
    IntoStaticStr,
    VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum RestartPolicy {
    /// Fail it with `server_restarted` (the default).
    #[default]
    Fail,
    /// Put it back in the queue and run it again from nothing.
    Retry,
    /// Continue a running task from its snapshot; otherwise like `retry`.
    Resume,
}

/// A string that names no policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown restart policy `{0}` (expected fail, retry or resume)")]
pub struct UnknownPolicy(pub String);

impl RestartPolicy {
    /// All three policies.
    pub const ALL: &'static [RestartPolicy] = Self::VARIANTS;

    /// The name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name.
    pub fn parse(text: &str) -> Result<Self, UnknownPolicy> {
        text.parse().map_err(|_| UnknownPolicy(text.to_owned()))
    }
}

/// One cell of the recovery table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Move {
    /// Nothing is written: a finished task, or a `queued` task that stays `queued`.
    Untouched,
    /// The task moves, with its event, in one transaction.
    Moved {
        /// The new status.
        status: TaskStatus,
        /// The event that records the move (the last one written).
        event: EventKind,
        /// The task error code, for moves to `failed` (P-9).
        error_code: Option<TaskErrorCode>,
        /// Whether `task.restarts` increments (every move that writes an event).
        increments_restarts: bool,
        /// Whether the engine continues from the task's snapshot.
        resumes_from_snapshot: bool,
        /// Whether an open output item is closed as incomplete first (the run is abandoned and
        /// the next one opens a new item).
        closes_open_item: bool,
    },
}

/// One cell of the recovery table: a leftover's status under its policy, and its move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cell {
    /// The status the task was left in (one of [`TaskStatus::UNFINISHED`]).
    pub status: TaskStatus,
    /// The task's `on_restart` policy.
    pub policy: RestartPolicy,
    /// What recovery does to it.
    pub moves: Move,
}

/// A move of the table: to `status` with the `event` that records it, `restarts + 1`.
const fn moved(status: TaskStatus, event: EventKind, resumes: bool, closes: bool) -> Move {
    Move::Moved {
        status,
        event,
        error_code: match event {
            EventKind::Failed => Some(TaskErrorCode::ServerRestarted),
            _ => None,
        },
        increments_restarts: true,
        resumes_from_snapshot: resumes,
        closes_open_item: closes,
    }
}

const fn cell(status: TaskStatus, policy: RestartPolicy, moves: Move) -> Cell {
    Cell {
        status,
        policy,
        moves,
    }
}

/// The recovery table (P-8…P-10) as data, cell by cell: every unfinished status under every
/// policy (a finished task is never moved). [`plan`] reads it, [`recover`] carries out a cell
/// for one task, and a store that moves a whole cell at once (set-based SQL) builds its
/// statements from the cell's [`Move`], so the two cannot disagree on what a cell does.
pub const TABLE: [Cell; 12] = {
    use EventKind as E;
    use RestartPolicy::{Fail, Resume, Retry};
    use TaskStatus::{Cancelled, Cancelling, Failed, Loading, Queued, Running};
    let failed = moved(Failed, E::Failed, false, false);
    let requeued = moved(Queued, E::Queued, false, true);
    let cancelled = moved(Cancelled, E::Cancelled, false, false);
    [
        cell(Queued, Fail, failed),
        cell(Queued, Retry, Move::Untouched),
        cell(Queued, Resume, Move::Untouched),
        cell(Loading, Fail, failed),
        cell(Loading, Retry, requeued),
        cell(Loading, Resume, requeued),
        cell(Running, Fail, failed),
        cell(Running, Retry, requeued),
        cell(Running, Resume, moved(Running, E::Resumed, true, false)),
        cell(Cancelling, Fail, cancelled),
        cell(Cancelling, Retry, cancelled),
        cell(Cancelling, Resume, cancelled),
    ]
};

/// The cells of the table for leftovers in `status`, one per policy (none for a finished
/// status).
pub fn cells_of(status: TaskStatus) -> impl Iterator<Item = &'static Cell> {
    TABLE.iter().filter(move |cell| cell.status == status)
}

/// The recovery table (P-8…P-10): the move of [`TABLE`]'s cell for `status` under `policy`;
/// a finished task, which has no cell, is untouched.
pub fn plan(status: TaskStatus, policy: RestartPolicy) -> Move {
    TABLE
        .iter()
        .find(|cell| cell.status == status && cell.policy == policy)
        .map_or(Move::Untouched, |cell| cell.moves)
}

/// The event that records a move of the table, of the kind [`plan`] names (`response.failed`
/// with `server_restarted`, `response.queued` for a restart, `response.resumed`, or
/// `response.cancelled`). `from_sequence_number` is where a resumed run continues: the last
/// event its snapshot covers, or the task's last event when it has no snapshot.
pub fn move_event(kind: EventKind, from_sequence_number: u64) -> EventPayload {
    match kind {
        EventKind::Failed => EventPayload::Failed {
            error: TaskError::server_restarted(),
        },
        EventKind::Queued => EventPayload::Queued {
            reason: QueueReason::ServerRestarted,
        },
        EventKind::Resumed => EventPayload::Resumed {
            from_sequence_number,
        },
        _ => EventPayload::Cancelled,
    }
}

/// Whether `task` is a leftover for `rescuer` (P-7): unfinished, and in the care of another
/// instance (one that is gone: callers pass only tasks of stopped instances).
pub fn is_leftover(task: &Task, rescuer: InstanceId) -> bool {
    !task.status.is_finished() && task.owner != rescuer
}

/// Whether [`recover`] needs the text of the task's open item: its move closes an open item.
pub fn needs_open_item_text(task: &Task) -> bool {
    task.items.open
        && matches!(
            plan(task.status, task.on_restart),
            Move::Moved {
                closes_open_item: true,
                ..
            }
        )
}

/// Applies [`plan`] to a leftover task on behalf of `rescuer` at time `at`; the moved task passes
/// into the rescuer's care.
///
/// `snapshot_covers` is the sequence number of the last event the task's stored snapshot covers,
/// if it has one; a resumed task's `response.resumed` names it (or, with no snapshot, the task's
/// last event: the resumed run then starts from nothing, which is where the log leaves it).
/// `open_item_text` is the text of the task's open item, asked for by
/// [`needs_open_item_text`]. Returns `None` when nothing is to be written.
pub fn recover(
    task: &Task,
    rescuer: InstanceId,
    snapshot_covers: Option<u64>,
    open_item_text: Option<String>,
    at: Timestamp,
) -> Option<Advanced> {
    if !is_leftover(task, rescuer) {
        return None;
    }
    let Move::Moved {
        status,
        event,
        increments_restarts,
        closes_open_item,
        ..
    } = plan(task.status, task.on_restart)
    else {
        return None;
    };
    let mut events = Vec::with_capacity(2);
    let open_item = task.items.open_item(task.id).filter(|_| closes_open_item);
    if let Some(item) = open_item {
        events.push(EventPayload::OutputItemDone(ClosedItem {
            item,
            text: open_item_text.unwrap_or_default(),
            status: ItemStatus::Incomplete,
        }));
    }
    events.push(move_event(
        event,
        snapshot_covers.unwrap_or(task.last_sequence_number),
    ));
    let mut advanced = apply(task, Transition { status, events }, at);
    if increments_restarts {
        advanced.task.restarts += 1;
    }
    if open_item.is_some() {
        advanced.task.items.open = false;
    }
    advanced.task.owner = rescuer;
    Some(advanced)
}
