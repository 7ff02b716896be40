//! Where a resumed run continues (I-6): its snapshot's engine state, and the text and calls of
//! the events that snapshot covers, read from the task's log.

use crate::event::{CallItem, Event, EventPayload};
use crate::ids::ItemId;
use crate::ports::{ResumePoint, Snapshot};
use crate::task::Task;
use crate::tools::TokenLogprob;

/// The resume point of `task` from its `snapshot` and its log from the first event (`log` may go
/// on past the snapshot; what follows it is not read).
///
/// The text is that of the deltas of the open output item up to the snapshot's last event (or,
/// when the run went on to make calls, of its message). A task without an open item (one the
/// first release wrote) has the text of the deltas after its last `response.queued` up to the
/// snapshot: its run's, since each restart queued it again.
pub fn resume_point<'a>(
    task: &Task,
    snapshot: Snapshot,
    log: impl IntoIterator<Item = &'a Event>,
) -> ResumePoint {
    let so_far = run_so_far(task, snapshot.sequence_number, log);
    ResumePoint {
        state: snapshot.state,
        text_so_far: so_far.text,
    }
}

/// What a run had produced up to an event of its log: its message's text and its function calls
/// (the last one's arguments as far as they go, when `call_open`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunSoFar {
    /// The message's text.
    pub text: String,
    /// The calls, in order.
    pub calls: Vec<CallItem>,
    /// Whether the last call's arguments were still being written.
    pub call_open: bool,
    /// The log probabilities of the message's tokens (when the task asked for them).
    pub logprobs: Vec<TokenLogprob>,
}

impl RunSoFar {
    /// Follows one event of the run's own log (a worker following what it writes).
    pub fn follow(&mut self, payload: &EventPayload) {
        match payload {
            EventPayload::FunctionCallAdded { item, name } => {
                self.calls.push(CallItem {
                    item: *item,
                    name: name.clone(),
                    arguments: String::new(),
                });
                self.call_open = true;
            }
            EventPayload::FunctionCallArgumentsDelta { delta, .. } => {
                if let Some(call) = self.calls.last_mut() {
                    call.arguments.push_str(delta);
                }
            }
            EventPayload::FunctionCallDone(done) => {
                if let Some(call) = self.calls.last_mut() {
                    call.arguments.clone_from(&done.arguments);
                }
                self.call_open = false;
            }
            payload => {
                if let Some((_, delta)) = payload.text_delta() {
                    self.text.push_str(delta);
                }
                if let EventPayload::OutputTextLogprobs { logprobs, .. } = payload {
                    self.logprobs.extend(logprobs.iter().cloned());
                }
            }
        }
    }
}

/// What the run of `task` that the events up to `up_to` belong to had produced (see
/// [`resume_point`] for which run that is).
pub fn run_so_far<'a>(
    task: &Task,
    up_to: u64,
    log: impl IntoIterator<Item = &'a Event>,
) -> RunSoFar {
    let open = task.items.open_item(task.id);
    // The first item the current run opened: items before it are earlier runs'.
    let mut first_of_run: Option<u32> = None;
    let mut deltas: Vec<(ItemId, &str, &[TokenLogprob])> = Vec::new();
    let mut calls: Vec<CallItem> = Vec::new();
    let mut call_open = false;
    for event in log {
        if event.sequence_number > up_to {
            break;
        }
        match &event.payload {
            EventPayload::Queued { .. } => {
                first_of_run = None;
                if open.is_none() {
                    deltas.clear();
                    calls.clear();
                    call_open = false;
                }
            }
            EventPayload::OutputItemAdded { item } => {
                first_of_run.get_or_insert(item.output_index());
            }
            EventPayload::FunctionCallAdded { item, name } => {
                first_of_run.get_or_insert(item.output_index());
                calls.push(CallItem {
                    item: *item,
                    name: name.clone(),
                    arguments: String::new(),
                });
                call_open = true;
            }
            EventPayload::FunctionCallArgumentsDelta { item, delta } => {
                if let Some(call) = calls.iter_mut().rev().find(|call| call.item == *item) {
                    call.arguments.push_str(delta);
                }
            }
            EventPayload::FunctionCallDone(done) => {
                if let Some(call) = calls.iter_mut().rev().find(|call| call.item == done.item) {
                    call.arguments.clone_from(&done.arguments);
                }
                call_open = false;
            }
            EventPayload::OutputTextLogprobs {
                item,
                delta,
                logprobs,
            } => deltas.push((*item, delta, logprobs)),
            payload => {
                if let Some((item, delta)) = payload.text_delta() {
                    deltas.push((item, delta, &[]));
                }
            }
        }
    }
    let belongs = |item: ItemId| match open {
        None => true,
        Some(open) => {
            item == open || first_of_run.is_some_and(|first| item.output_index() >= first)
        }
    };
    deltas.retain(|(item, _, _)| belongs(*item));
    let text = deltas.iter().map(|(_, delta, _)| *delta).collect();
    let logprobs = deltas
        .iter()
        .flat_map(|(_, _, logprobs)| logprobs.iter().cloned())
        .collect();
    calls.retain(|call| belongs(call.item));
    let call_open = call_open && !calls.is_empty();
    RunSoFar {
        text,
        calls,
        call_open,
        logprobs,
    }
}
