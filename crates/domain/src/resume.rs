//! Where a resumed run continues (I-6): its snapshot's engine state, and the text of the deltas
//! that snapshot covers, read from the task's log.

use crate::event::{Event, EventPayload};
use crate::ports::{ResumePoint, Snapshot};
use crate::task::Task;

/// The resume point of `task` from its `snapshot` and its log from the first event (`log` may go
/// on past the snapshot; what follows it is not read).
///
/// The text is that of the deltas of the open output item up to the snapshot's last event. A
/// task without an open item (one the first release wrote) has the text of the deltas after its
/// last `response.queued` up to the snapshot: its run's, since each restart queued it again.
pub fn resume_point<'a>(
    task: &Task,
    snapshot: Snapshot,
    log: impl IntoIterator<Item = &'a Event>,
) -> ResumePoint {
    let open = task.items.open_item(task.id);
    let mut text = String::new();
    for event in log {
        if event.sequence_number > snapshot.sequence_number {
            break;
        }
        match &event.payload {
            EventPayload::Queued { .. } if open.is_none() => text.clear(),
            EventPayload::OutputTextDelta { item, delta } if open.is_none_or(|o| o == *item) => {
                text.push_str(delta);
            }
            _ => {}
        }
    }
    ResumePoint {
        state: snapshot.state,
        text_so_far: text,
    }
}
