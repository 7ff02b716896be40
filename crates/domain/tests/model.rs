//! A model-based property test of a task's whole life (I-2, I-3, I-5; P-3, P-4, P-7…P-11).
//!
//! The model keeps its own state of the task, independent of the domain's row: its status, the
//! instance in whose care it is, its restarts, and its log (`Vec<Event>`), from which it reads the
//! output items. It drives the domain with random operations: worker steps and batches (from the
//! live instance, from a dead instance's late worker, from another live instance, some with a
//! stale view of the log), cancels from any instance, snapshots, and crashes of the owning
//! instance followed by recovery by a new rescuer under the task's random policy (sometimes run
//! twice). Steps go through [`advance_all`] and crashes through [`recover`], as a storage adapter
//! uses them.
//!
//! Before each operation the model predicts, from the contract (`contract/`), whether the domain
//! accepts it and with which events, or refuses it and with which refusal; the domain must agree
//! in both directions. After each operation the invariants are checked on the log and the row.
//! Every life ends with a last crash and then the owner's worker running the task to its end.

// Tests may unwrap; clippy.toml's `allow-unwrap-in-tests` does not reach the helpers outside
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod contract;
mod support;

use lmsp_domain::event::{ClosedItem, EventKind, EventPayload, QueueReason};
use lmsp_domain::ids::{InstanceId, ItemId};
use lmsp_domain::recovery::{self, recover, RestartPolicy};
use lmsp_domain::task::{ItemStatus, Task, TaskError};
use lmsp_domain::transition::{advance_all, Refusal, Step, StepKind};
use lmsp_domain::{decide_cancel, CancelReply, Event, TaskErrorCode, TaskStatus, Timestamp};
use proptest::prelude::*;
use proptest::sample::select;

use contract::{api_section_4_cancel, api_section_7, expected_events, next_status, refusal_for};
use support::{claim, config, instance, queued_task, response_of};

/// Who takes a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// The live instance: the one that accepted the task, or the rescuer of the last crash.
    Live,
    /// The instance that died in the last crash (its worker's late writes), or, before any crash,
    /// an instance that never had the task.
    Dead,
    /// Another live instance of the same database (ARCHITECTURE.md).
    Other,
}

/// A worker's step, without its data.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Claim,
    Loaded,
    Output(String),
    Complete,
    Fail(TaskErrorCode),
    Acknowledge,
}

/// The view of the log a worker's write carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// The stored log (the usual case).
    Current,
    /// The stored log's sequence number plus this offset (a stale or confused worker).
    Off(i64),
    /// No check.
    Unchecked,
}

/// One thing that can happen to the task.
#[derive(Debug, Clone)]
enum Op {
    /// A worker's batch of steps, as the store's `append` gets it.
    Steps {
        by: Who,
        view: View,
        actions: Vec<Action>,
    },
    /// A client asks to cancel, through any instance.
    Cancel { by: Who },
    /// The worker stores an engine snapshot covering the log so far.
    Snapshot,
    /// The instance in whose care the task is dies; a new instance recovers it (`twice`: its
    /// recovery runs a second time; `use_snapshot`: the stored snapshot is there).
    Crash { twice: bool, use_snapshot: bool },
}

fn any_action() -> impl Strategy<Value = Action> {
    // Weighted towards a run's own steps, so that lives are long: finishing steps are rare.
    prop_oneof![
        8 => Just(Action::Claim),
        8 => Just(Action::Loaded),
        36 => "[a-z ]{0,6}".prop_map(Action::Output),
        1 => Just(Action::Complete),
        1 => select(vec![
            TaskErrorCode::EngineError,
            TaskErrorCode::ModelUnavailable,
            TaskErrorCode::Timeout,
        ])
        .prop_map(Action::Fail),
        1 => Just(Action::Acknowledge),
    ]
}

fn any_who() -> impl Strategy<Value = Who> {
    prop_oneof![8 => Just(Who::Live), 1 => Just(Who::Dead), 1 => Just(Who::Other)]
}

fn any_view() -> impl Strategy<Value = View> {
    prop_oneof![
        8 => Just(View::Current),
        1 => select(vec![-2i64, -1, 1]).prop_map(View::Off),
        1 => Just(View::Unchecked),
    ]
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        80 => (any_who(), any_view(), any_action()).prop_map(|(by, view, action)| Op::Steps {
            by,
            view,
            actions: vec![action],
        }),
        12 => (any_who(), any_view(), proptest::collection::vec(any_action(), 2..5))
            .prop_map(|(by, view, actions)| Op::Steps { by, view, actions }),
        1 => any_who().prop_map(|by| Op::Cancel { by }),
        4 => Just(Op::Snapshot),
        5 => (any::<bool>(), any::<bool>())
            .prop_map(|(twice, use_snapshot)| Op::Crash { twice, use_snapshot }),
    ]
}

/// The life of one task: the model's own state, the domain's row, and the log.
#[derive(Debug)]
struct Life {
    /// The row as the domain last returned it (what a store keeps).
    task: Task,
    /// The task as created (the `response.created` data).
    created: Task,
    /// The log.
    events: Vec<Event>,
    /// The model's status of the task.
    status: TaskStatus,
    /// The model's owner of the task.
    owner: InstanceId,
    /// The model's count of recovery moves.
    restarts: u32,
    /// The live instance.
    live: InstanceId,
    /// The instance that died last (before any crash: one that never had the task).
    dead: InstanceId,
    /// How many instances there were.
    instances: u64,
    /// The sequence number the stored snapshot covers, if any.
    snapshot: Option<u64>,
    /// A cancel was answered 200 or 202.
    cancel_answered: bool,
    now: i64,
}

/// Another live instance of the same database.
fn other_instance() -> InstanceId {
    instance(99)
}

impl Life {
    fn new(policy: RestartPolicy, seed: u64) -> Self {
        let live = instance(0);
        let task = queued_task(seed, live, policy);
        let created = Event {
            task_id: task.id,
            sequence_number: 1,
            created_at: task.created_at,
            payload: EventPayload::Created {
                task: Box::new(task.clone()),
            },
        };
        Self {
            created: task.clone(),
            events: vec![created],
            status: TaskStatus::Queued,
            owner: live,
            restarts: 0,
            live,
            dead: instance(98),
            instances: 1,
            snapshot: None,
            cancel_answered: false,
            now: task.created_at.as_millis(),
            task,
        }
    }

    fn tick(&mut self) -> Timestamp {
        self.now += 7;
        Timestamp::from_millis(self.now)
    }

    fn instance_of(&self, who: Who) -> InstanceId {
        match who {
            Who::Live => self.live,
            Who::Dead => self.dead,
            Who::Other => other_instance(),
        }
    }

    /// The output items by the log: how many were added, and the open one (added, not done).
    fn items_by_the_log(&self) -> (u32, Option<ItemId>) {
        let mut added = 0;
        let mut open = None;
        for event in &self.events {
            match &event.payload {
                EventPayload::OutputItemAdded { item } => {
                    added += 1;
                    open = Some(*item);
                }
                EventPayload::OutputItemDone(_) => open = None,
                _ => {}
            }
        }
        (added, open)
    }

    /// The deltas after the last `response.queued` (all of them when there is none), joined:
    /// the text of the current run (docs/events.md).
    fn run_text(&self) -> String {
        let start = self
            .events
            .iter()
            .rposition(|e| e.kind() == EventKind::Queued)
            .map_or(0, |i| i + 1);
        self.events[start..]
            .iter()
            .filter_map(|e| match &e.payload {
                EventPayload::OutputTextDelta { delta, .. } => Some(delta.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The deltas of one item, joined.
    fn text_of(&self, item: ItemId) -> String {
        self.events
            .iter()
            .filter_map(|e| match &e.payload {
                EventPayload::OutputTextDelta { item: of, delta } if *of == item => {
                    Some(delta.as_str())
                }
                _ => None,
            })
            .collect()
    }

    /// The step a worker sends for `action`; a completion carries the run's text so far plus
    /// `pending`, the deltas of the same batch before it.
    fn step_for(&self, action: &Action, pending: &str, at: Timestamp) -> Step {
        match action {
            Action::Claim => claim(),
            Action::Loaded => Step::Loaded,
            Action::Output(delta) => Step::Output {
                delta: delta.clone(),
            },
            Action::Complete => {
                let text = format!("{}{pending}", self.run_text());
                Step::Complete {
                    response: Box::new(response_of(&self.task, &text, at)),
                }
            }
            Action::Fail(code) => Step::Fail {
                error: TaskError::new(*code, "the work failed"),
            },
            Action::Acknowledge => Step::AcknowledgeCancel,
        }
    }

    /// What the model predicts for `steps` from `by` with the view `expected`: the payloads
    /// written with the status and owner after them, or the refusal.
    fn predict(
        &self,
        steps: &[Step],
        by: InstanceId,
        expected: Option<u64>,
    ) -> Result<(Vec<EventPayload>, TaskStatus, InstanceId), Refusal> {
        let stored = self.events.len() as u64;
        if expected.is_some_and(|seen| seen != stored) {
            return Err(Refusal::Stale { stored });
        }
        let (mut added, mut open) = self.items_by_the_log();
        let (mut status, mut owner) = (self.status, self.owner);
        let mut payloads = Vec::new();
        for step in steps {
            if let Some(refusal) = refusal_for(status, owner, step.kind(), by) {
                return Err(refusal);
            }
            let written = expected_events(status, open, ItemId::of(self.task.id, added), step);
            for payload in &written {
                match payload {
                    EventPayload::OutputItemAdded { item } => {
                        added += 1;
                        open = Some(*item);
                    }
                    EventPayload::OutputItemDone(_) => open = None,
                    _ => {}
                }
            }
            payloads.extend(written);
            status = next_status(status, step.kind())?;
            if step.kind() == StepKind::Claim {
                owner = by;
            }
        }
        Ok((payloads, status, owner))
    }

    /// A worker's batch through `advance_all`: the domain must accept it exactly when the model
    /// does, with the events the model predicts, and refuse it otherwise with the predicted
    /// refusal, writing nothing.
    fn steps(&mut self, by: Who, view: View, actions: &[Action]) -> Result<(), TestCaseError> {
        let at = self.tick();
        let by = self.instance_of(by);
        let stored = self.events.len() as u64;
        let expected = match view {
            View::Current => Some(stored),
            View::Off(offset) => Some(stored.saturating_add_signed(offset)),
            View::Unchecked => None,
        };
        let mut pending = String::new();
        let mut steps = Vec::new();
        for action in actions {
            steps.push(self.step_for(action, &pending, at));
            if let Action::Output(delta) = action {
                pending.push_str(delta);
            }
        }
        let predicted = self.predict(&steps, by, expected);

        let outcome = advance_all(&self.task, &steps, by, expected, at);

        match (outcome, predicted) {
            (Err(refusal), Err(predicted)) => prop_assert_eq!(refusal, predicted),
            (Ok(advanced), Ok((payloads, status, owner))) => {
                self.append(advanced.task, advanced.events, &payloads, at)?;
                self.status = status;
                self.owner = owner;
            }
            (outcome, predicted) => prop_assert!(
                false,
                "{:?} from {} in {}: the domain says {:?}, the model {:?}",
                steps,
                by,
                self.status,
                outcome,
                predicted
            ),
        }
        Ok(())
    }

    /// A cancel request from any instance: decided as docs/api.md says.
    fn cancel(&mut self, by: Who) -> Result<(), TestCaseError> {
        let at = self.tick();
        let by = self.instance_of(by);
        let row = api_section_4_cancel(self.status);
        prop_assert_eq!(decide_cancel(self.task.status).reply(), row.reply);
        let predicted = self.predict(&[Step::RequestCancel], by, None);

        let outcome = advance_all(&self.task, &[Step::RequestCancel], by, None, at);

        match (outcome, predicted) {
            (Err(refusal), Err(predicted)) => {
                prop_assert_eq!(row.reply, CancelReply::NotCancellable);
                prop_assert_eq!(refusal, predicted);
            }
            (Ok(advanced), Ok((payloads, status, owner))) => {
                prop_assert_ne!(row.reply, CancelReply::NotCancellable);
                prop_assert_eq!(Some(status), row.new_status);
                self.append(advanced.task, advanced.events, &payloads, at)?;
                self.status = status;
                self.owner = owner;
                self.cancel_answered = true;
            }
            (outcome, predicted) => prop_assert!(
                false,
                "a cancel in {}: the domain says {:?}, the model {:?}",
                self.status,
                outcome,
                predicted
            ),
        }
        Ok(())
    }

    /// The instance in whose care the task is dies and a new one recovers it (P-7…P-11, I-5):
    /// the model predicts the cell of docs/rules.md, with the open item closed as incomplete when the
    /// run goes back to the queue; a second recovery by the same rescuer writes nothing.
    fn crash(&mut self, twice: bool, use_snapshot: bool) -> Result<(), TestCaseError> {
        let at = self.tick();
        self.instances += 1;
        // Rescuers are numbered from 100, apart from the creator, `Other` and the first `Dead`.
        let rescuer = instance(100 + self.instances);
        self.dead = self.owner;
        self.live = rescuer;
        let covers = if use_snapshot { self.snapshot } else { None };
        let (_, open) = self.items_by_the_log();
        let cell = api_section_7(self.status, self.task.on_restart);
        let closes = matches!(cell, Some((_, _, _, true))) && open.is_some();
        prop_assert_eq!(recovery::needs_open_item_text(&self.task), closes);
        let open_text = open.filter(|_| closes).map(|item| self.text_of(item));

        let recovered = recover(&self.task, rescuer, covers, open_text.clone(), at);

        match (recovered, cell) {
            (None, None) => {}
            (Some(advanced), Some((status, event, _resumes, _))) => {
                let mut payloads = Vec::new();
                if let (Some(item), Some(text)) = (open, open_text) {
                    payloads.push(EventPayload::OutputItemDone(ClosedItem {
                        item,
                        text,
                        status: ItemStatus::Incomplete,
                    }));
                }
                payloads.push(match event {
                    EventKind::Failed => EventPayload::Failed {
                        error: TaskError::server_restarted(),
                    },
                    EventKind::Queued => EventPayload::Queued {
                        reason: QueueReason::ServerRestarted,
                    },
                    EventKind::Resumed => EventPayload::Resumed {
                        from_sequence_number: covers.unwrap_or(self.events.len() as u64),
                    },
                    _ => EventPayload::Cancelled,
                });
                self.append(advanced.task, advanced.events, &payloads, at)?;
                self.status = status;
                self.owner = rescuer;
                self.restarts += 1;
                if status == TaskStatus::Queued {
                    // The next run starts from nothing (its claim drops the old snapshot).
                    self.snapshot = None;
                }
            }
            (recovered, cell) => prop_assert!(
                false,
                "recovery of {} under {}: the domain wrote {:?}, the table says {:?}",
                self.status,
                self.task.on_restart,
                recovered,
                cell
            ),
        }
        if twice {
            let later = self.tick();
            let again = recover(&self.task, rescuer, covers, Some("x".into()), later);
            prop_assert_eq!(
                again,
                None,
                "a second recovery by one rescuer wrote something"
            );
        }
        Ok(())
    }

    /// Appends what the domain wrote after checking it is what the model predicted, numbered
    /// right after the log, at this time.
    fn append(
        &mut self,
        task: Task,
        events: Vec<Event>,
        predicted: &[EventPayload],
        at: Timestamp,
    ) -> Result<(), TestCaseError> {
        let written: Vec<&EventPayload> = events.iter().map(|e| &e.payload).collect();
        let predicted: Vec<&EventPayload> = predicted.iter().collect();
        prop_assert_eq!(written, predicted);
        for (offset, event) in events.iter().enumerate() {
            prop_assert_eq!(
                event.sequence_number,
                self.events.len() as u64 + 1 + offset as u64
            );
            prop_assert_eq!(event.task_id, self.task.id);
            prop_assert_eq!(event.created_at, at);
        }
        self.task = task;
        self.events.extend(events);
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Steps { by, view, actions } => self.steps(*by, *view, actions),
            Op::Cancel { by } => self.cancel(*by),
            Op::Snapshot => {
                if self.status == TaskStatus::Running {
                    self.snapshot = Some(self.events.len() as u64);
                }
                Ok(())
            }
            Op::Crash {
                twice,
                use_snapshot,
            } => self.crash(*twice, *use_snapshot),
        }
    }

    /// The end of a life: the last crash, then the owner's worker runs the task to its end.
    fn finish(&mut self) -> Result<(), TestCaseError> {
        self.crash(true, true)?;
        self.check()?;
        for _ in 0..4 {
            let action = match self.status {
                TaskStatus::Queued => Action::Claim,
                TaskStatus::Loading => Action::Loaded,
                TaskStatus::Running => Action::Complete,
                TaskStatus::Cancelling => Action::Acknowledge,
                TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled => break,
            };
            // A queued task is claimed by the live instance; a claimed one is run by its owner.
            if action != Action::Claim {
                self.live = self.owner;
            }
            self.steps(Who::Live, View::Current, &[action])?;
            self.check()?;
        }
        prop_assert!(self.status.is_finished(), "the life ended {}", self.status);
        Ok(())
    }

    /// I-2, I-3, the row and the item structure, checked after every operation.
    fn check(&self) -> Result<(), TestCaseError> {
        self.check_log()?;
        self.check_row()?;
        self.check_items()
    }

    /// I-2 (P-3) and I-3 (P-4) on the log.
    fn check_log(&self) -> Result<(), TestCaseError> {
        let events = &self.events;
        let task = &self.task;
        // I-2: 1…n without gap or repeat, `last_sequence_number = n`, the status implied by the
        // last event, at most one terminal event and it is last, there exactly when finished.
        prop_assert_eq!(events[0].kind(), EventKind::Created);
        for (index, event) in events.iter().enumerate() {
            prop_assert_eq!(event.sequence_number, index as u64 + 1);
        }
        prop_assert_eq!(task.last_sequence_number, events.len() as u64);
        let last = events.last().unwrap();
        prop_assert_eq!(task.status, last.kind().implied_status());
        let terminals: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind().is_terminal())
            .map(|(i, _)| i)
            .collect();
        match terminals.as_slice() {
            [] => prop_assert!(!task.status.is_finished()),
            [only] => {
                prop_assert_eq!(*only, events.len() - 1);
                prop_assert!(task.status.is_finished());
            }
            many => prop_assert!(false, "terminal events at {:?}", many),
        }
        prop_assert!(events
            .windows(2)
            .all(|w| w[0].created_at <= w[1].created_at));

        // I-3 (P-4): after `response.cancelling` nothing but `response.cancelled`; once a cancel
        // was answered 200/202 the task never ends completed or failed.
        if let Some(first) = events
            .iter()
            .position(|e| e.kind() == EventKind::Cancelling)
        {
            for later in &events[first + 1..] {
                prop_assert_eq!(later.kind(), EventKind::Cancelled);
            }
        }
        if self.cancel_answered {
            prop_assert!(
                matches!(task.status, TaskStatus::Cancelling | TaskStatus::Cancelled),
                "an answered cancel, yet {}",
                task.status
            );
        }

        // Every run goes through `loading`: `response.in_progress` right after `response.loading`.
        for (index, event) in events.iter().enumerate() {
            if event.kind() == EventKind::InProgress {
                prop_assert_eq!(events[index - 1].kind(), EventKind::Loading);
            }
            if let EventPayload::Resumed {
                from_sequence_number,
            } = &event.payload
            {
                prop_assert!(*from_sequence_number <= index as u64);
            }
        }
        Ok(())
    }

    /// The row agrees with the model and with the log.
    fn check_row(&self) -> Result<(), TestCaseError> {
        let task = &self.task;
        let events = &self.events;
        prop_assert_eq!(task.status, self.status);
        prop_assert_eq!(task.owner, self.owner);
        prop_assert_eq!(task.restarts, self.restarts);
        // The creation event's task is the row with every changing field at its initial value.
        prop_assert_eq!(&task.as_created(), &self.created);
        prop_assert_eq!(task.finished_at.is_some(), task.status.is_finished());
        if task.status.is_finished() {
            prop_assert_eq!(task.finished_at, Some(events.last().unwrap().created_at));
        }
        let first_loading = events.iter().find(|e| e.kind() == EventKind::Loading);
        prop_assert_eq!(task.started_at, first_loading.map(|e| e.created_at));
        let last_failure = events.iter().rev().find_map(|e| match &e.payload {
            EventPayload::Failed { error } => Some(error),
            _ => None,
        });
        prop_assert_eq!(task.error.as_ref(), last_failure);
        prop_assert_eq!(task.error.is_some(), task.status == TaskStatus::Failed);
        let (added, open) = self.items_by_the_log();
        prop_assert_eq!(task.items.opened, added);
        prop_assert_eq!(task.items.open, open.is_some());
        Ok(())
    }

    /// The output item structure of docs/events.md.
    fn check_items(&self) -> Result<(), TestCaseError> {
        let events = &self.events;
        let mut open: Option<ItemId> = None;
        let mut added = 0;
        for (index, event) in events.iter().enumerate() {
            let next = events.get(index + 1).map(Event::kind);
            match &event.payload {
                EventPayload::OutputItemAdded { item } => {
                    prop_assert_eq!(open, None, "an item added while another is open");
                    // Indexes increase: the k-th item added is at `output_index` k.
                    prop_assert_eq!(*item, ItemId::of(self.task.id, added));
                    prop_assert_eq!(item.output_index(), added);
                    prop_assert_eq!(
                        events.get(index + 1).map(|e| e.payload.clone()),
                        Some(EventPayload::ContentPartAdded { item: *item })
                    );
                    added += 1;
                    open = Some(*item);
                }
                EventPayload::OutputTextDelta { item, .. } => {
                    prop_assert_eq!(Some(*item), open, "a delta outside its open item");
                }
                EventPayload::OutputItemDone(closed) => {
                    // Each item added is done at most once: done closes the open one.
                    prop_assert_eq!(Some(closed.item), open, "done for an item not open");
                    prop_assert_eq!(&closed.text, &self.text_of(closed.item));
                    match closed.status {
                        ItemStatus::Incomplete => {
                            prop_assert_eq!(next, Some(EventKind::Queued));
                        }
                        ItemStatus::Completed => {
                            prop_assert_eq!(next, Some(EventKind::Completed));
                            let before: Vec<EventKind> =
                                events[index - 2..index].iter().map(Event::kind).collect();
                            prop_assert_eq!(
                                before,
                                vec![EventKind::OutputTextDone, EventKind::ContentPartDone]
                            );
                        }
                    }
                    open = None;
                }
                EventPayload::Queued { .. } => {
                    prop_assert_eq!(
                        open,
                        None,
                        "a run went back to the queue with its item open"
                    );
                }
                EventPayload::Completed { response } => {
                    // The deltas after the last `response.queued`, joined, are `output_text`.
                    prop_assert_eq!(&response.output_text, &self.run_text());
                    prop_assert_eq!(response.id, self.task.response_id);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/model.txt"))]

    /// I-2 (P-3), I-3 (P-4) and I-5 (P-7…P-11) through random lives of a task: the domain accepts
    /// exactly the operations the model's contract accepts, with the events it predicts, and
    /// refuses the others with the predicted refusal; the log stays gapless and consistent with
    /// the row; nothing follows `response.cancelling` but `response.cancelled`; an answered
    /// cancel always ends `cancelled`; recovery moves the task by the table, once per rescuer;
    /// a completed task's `output_text` is its deltas after the last `response.queued`, joined,
    /// and each output item is added once and done at most once, at increasing indexes.
    #[test]
    fn a_task_keeps_its_invariants_through_random_lives(
        policy in select(RestartPolicy::ALL.to_vec()),
        seed in any::<u64>(),
        ops in proptest::collection::vec(any_op(), 0..100),
    ) {
        let mut life = Life::new(policy, seed);
        life.check()?;
        for op in &ops {
            life.apply(op)?;
            life.check()?;
        }

        life.finish()?;

        let terminals = life.events.iter().filter(|e| e.kind().is_terminal()).count();
        prop_assert_eq!(terminals, 1, "exactly one terminal event");
        prop_assert!(life.events.last().unwrap().kind().is_terminal());
        if life.cancel_answered {
            prop_assert_eq!(life.status, TaskStatus::Cancelled);
        }
    }
}

/// A whole life written out: a run that is requeued mid-output, rerun by the rescuer, cancelled
/// from another instance while a dead worker's late output is refused, and acknowledged.
#[test]
fn a_life_with_a_requeue_a_late_worker_and_a_cancel_ends_cancelled() {
    let mut life = Life::new(RestartPolicy::Retry, 5);
    let ops = [
        Op::Steps {
            by: Who::Live,
            view: View::Current,
            actions: vec![
                Action::Claim,
                Action::Loaded,
                Action::Output("Once ".into()),
            ],
        },
        Op::Crash {
            twice: true,
            use_snapshot: false,
        },
        Op::Steps {
            by: Who::Dead,
            view: View::Unchecked,
            actions: vec![Action::Output("upon".into())],
        },
        Op::Steps {
            by: Who::Live,
            view: View::Current,
            actions: vec![
                Action::Claim,
                Action::Loaded,
                Action::Output("Long ".into()),
            ],
        },
        Op::Cancel { by: Who::Other },
        Op::Steps {
            by: Who::Live,
            view: View::Current,
            actions: vec![Action::Complete],
        },
        Op::Steps {
            by: Who::Live,
            view: View::Current,
            actions: vec![Action::Acknowledge],
        },
    ];
    for op in &ops {
        life.apply(op).unwrap();
        life.check().unwrap();
    }

    let kinds: Vec<EventKind> = life.events.iter().map(Event::kind).collect();
    use EventKind::*;
    assert_eq!(
        kinds,
        [
            Created,
            Loading,
            InProgress,
            OutputItemAdded,
            ContentPartAdded,
            OutputTextDelta,
            OutputItemDone,
            Queued,
            Loading,
            InProgress,
            OutputItemAdded,
            ContentPartAdded,
            OutputTextDelta,
            Cancelling,
            Cancelled,
        ]
    );
    assert_eq!(life.task.status, TaskStatus::Cancelled);
    assert_eq!(life.task.restarts, 1);
    assert_eq!(life.task.items.opened, 2);
}

/// I-6 for function calls: the resume point of a run that wrote a message and then a call reads
/// the message's text and the call's arguments as far as they went (a delta finds its call by
/// item; the call's done event replaces the pieces by the whole arguments), and whether the call
/// was still open.
#[test]
fn a_run_so_far_holds_its_message_and_its_calls_arguments_i6() {
    use lmsp_domain::event::CallItem;
    use lmsp_domain::resume::{run_so_far, RunSoFar};

    let mut task = support::queued_task(
        40,
        InstanceId::from_ulid(ulid::Ulid::nil()),
        RestartPolicy::Resume,
    );
    task.items.opened = 2;
    task.items.open = true;
    let (message, call) = (ItemId::of(task.id, 0), ItemId::of(task.id, 1));
    let payloads = [
        EventPayload::OutputItemAdded { item: message },
        EventPayload::OutputTextDelta {
            item: message,
            delta: String::from("Let me look. "),
        },
        EventPayload::FunctionCallAdded {
            item: call,
            name: String::from("get_weather"),
        },
        EventPayload::FunctionCallArgumentsDelta {
            item: call,
            delta: String::from("{\"city\""),
        },
        EventPayload::FunctionCallDone(CallItem {
            item: call,
            name: String::from("get_weather"),
            arguments: String::from("{\"city\":\"Paris\"}"),
        }),
    ];
    let log: Vec<Event> = payloads
        .iter()
        .enumerate()
        .map(|(n, payload)| Event {
            task_id: task.id,
            sequence_number: n as u64 + 5,
            created_at: Timestamp::from_millis(1_000),
            payload: payload.clone(),
        })
        .collect();

    let mid_call = run_so_far(&task, 8, &log);
    assert_eq!(mid_call.text, "Let me look. ");
    assert_eq!(mid_call.calls.len(), 1);
    assert_eq!(mid_call.calls[0].arguments, "{\"city\"");
    assert!(mid_call.call_open);

    let done = run_so_far(&task, 9, &log);
    assert_eq!(done.text, "Let me look. ");
    assert_eq!(done.calls[0].arguments, "{\"city\":\"Paris\"}");
    assert!(!done.call_open);

    let mut followed = RunSoFar::default();
    for payload in &payloads[..4] {
        followed.follow(payload);
    }
    assert_eq!(followed.text, "Let me look. ");
    assert_eq!(followed.calls[0].name, "get_weather");
    assert_eq!(followed.calls[0].arguments, "{\"city\"");
    assert!(followed.call_open);
    followed.follow(&payloads[4]);
    assert_eq!(followed.calls[0].arguments, "{\"city\":\"Paris\"}");
    assert!(!followed.call_open);
}

/// A function call opens an output item of its own after the run's message (counted in the
/// task's items, open until the call is done), and a completion after calls closes the message
/// only when the run wrote text before them.
#[test]
fn a_call_opens_its_own_item_and_a_completion_closes_the_message_before_it() {
    use lmsp_domain::event::CallItem;

    let worker = InstanceId::from_ulid(ulid::Ulid::from_parts(1, 1));
    let at = Timestamp::from_millis(2_000);
    let run = |text: &str| {
        let task = support::queued_task(41, worker, RestartPolicy::Fail);
        let mut steps = vec![support::claim(), Step::Loaded];
        if !text.is_empty() {
            steps.push(Step::Output {
                delta: text.to_owned(),
            });
        }
        steps.push(Step::CallStarted {
            name: String::from("f"),
        });
        let started = advance_all(&task, &steps, worker, None, at).unwrap().task;
        let opened = if text.is_empty() { 1 } else { 2 };
        assert_eq!(started.items.opened, opened, "the call's item is counted");
        assert!(started.items.open, "the call is open");
        let call = CallItem {
            item: ItemId::of(task.id, opened - 1),
            name: String::from("f"),
            arguments: String::from("{}"),
        };
        let done = advance_all(
            &started,
            &[
                Step::CallArguments {
                    delta: String::from("{}"),
                },
                Step::CallDone {
                    name: String::from("f"),
                    arguments: String::from("{}"),
                },
            ],
            worker,
            None,
            at,
        )
        .unwrap()
        .task;
        assert_eq!(done.items.opened, opened);
        assert!(!done.items.open, "the call is closed");
        let mut response = support::response_of(&done, text, at);
        response.calls = vec![call];
        let completed = advance_all(
            &done,
            &[Step::Complete {
                response: Box::new(response),
            }],
            worker,
            None,
            at,
        )
        .unwrap();
        completed
            .events
            .iter()
            .map(|event| event.kind())
            .collect::<Vec<_>>()
    };
    let with_text = run("Let me look. ");
    assert!(
        with_text.contains(&EventKind::OutputTextDone),
        "the message before the call is closed: {with_text:?}"
    );
    let without = run("");
    assert!(
        !without.contains(&EventKind::OutputTextDone),
        "no message to close: {without:?}"
    );
    assert_eq!(without.last(), Some(&EventKind::Completed));
}
