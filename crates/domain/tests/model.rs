//! A model-based property test of a task's life (I-2, I-3, I-5; P-3, P-4, P-7…P-11).
//!
//! A pure in-memory task log (`Vec<Event>` + `Task`) is driven by random sequences of worker
//! steps (claim, loaded, output deltas, complete, fail), cancel requests, snapshots, and crashes
//! followed by recovery in a new [`StartEpoch`] under the task's random restart policy. Steps go
//! through [`advance`], crashes through [`recover`], exactly as a storage adapter would use them;
//! a refused step leaves the log unchanged. After every operation the invariants are checked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use lmsp_domain::recovery::{recover, RestartPolicy, StartEpoch};
use lmsp_domain::task::{Input, Task, TaskError, TaskSpec};
use lmsp_domain::transition::{advance, Step};
use lmsp_domain::{
    decide_cancel, CancelReply, ClientId, Event, EventKind, EventPayload, ModelId, Response,
    ResponseId, TaskErrorCode, TaskId, TaskStatus, Timestamp, Usage,
};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::FileFailurePersistence;
use ulid::Ulid;

/// One thing that can happen to the task.
#[derive(Debug, Clone)]
enum Op {
    /// A worker claims it and loads its model.
    Claim,
    /// The model is loaded; generation starts.
    Loaded,
    /// The engine produced a delta.
    Output(String),
    /// The engine finished; the worker stores the response.
    Complete,
    /// The work failed.
    Fail(TaskErrorCode),
    /// A client asks to cancel.
    Cancel,
    /// The worker stopped after a cancel.
    Acknowledge,
    /// The worker stored an engine snapshot covering the log so far.
    Snapshot,
    /// The process dies; the next start recovers (`twice`: its recovery runs a second time).
    Crash { twice: bool, use_snapshot: bool },
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Claim),
        4 => Just(Op::Loaded),
        8 => "[a-z ]{0,6}".prop_map(Op::Output),
        2 => Just(Op::Complete),
        1 => select(vec![
            TaskErrorCode::EngineError,
            TaskErrorCode::ModelUnavailable,
            TaskErrorCode::Timeout,
        ])
        .prop_map(Op::Fail),
        1 => Just(Op::Cancel),
        1 => Just(Op::Acknowledge),
        1 => Just(Op::Snapshot),
        2 => (any::<bool>(), any::<bool>())
            .prop_map(|(twice, use_snapshot)| Op::Crash { twice, use_snapshot }),
    ]
}

/// The in-memory log of one task and what the test knows about its history.
#[derive(Debug)]
struct Life {
    task: Task,
    events: Vec<Event>,
    now: i64,
    epoch: u64,
    /// A cancel was answered 200 or 202 (reply `Cancelled` or `Accepted`).
    cancel_answered: bool,
    /// The sequence number the stored snapshot covers, if any.
    snapshot: Option<u64>,
    /// The output of the current run as the test tracks it: reset by `response.queued`.
    run_text: String,
    /// Events recovery wrote (each increments `restarts`).
    recovery_moves: u32,
    responses: u64,
}

fn ulid(seed: u64) -> Ulid {
    Ulid::from_parts(1_700_000_000_000 + (seed % 1_000_000), u128::from(seed))
}

fn reference() -> ModelId {
    ModelId::parse(ModelId::REFERENCE).unwrap()
}

impl Life {
    fn new(policy: RestartPolicy, seed: u64) -> Self {
        let created_at = Timestamp::from_millis(1_000);
        let task = Task::new_queued(
            TaskId::from_ulid(ulid(seed)),
            ClientId::from_ulid(ulid(seed ^ 0xff)),
            reference(),
            policy,
            TaskSpec {
                input: Input::Text(String::from("Once upon a time")),
                max_output_tokens: 64,
                seed,
            },
            BTreeMap::new(),
            created_at,
        );
        let created = Event {
            task_id: task.id,
            sequence_number: 1,
            created_at,
            payload: EventPayload::Created {
                task: Box::new(task.clone()),
            },
        };
        Self {
            task,
            events: vec![created],
            now: 1_000,
            epoch: 0,
            cancel_answered: false,
            snapshot: None,
            run_text: String::new(),
            recovery_moves: 0,
            responses: 0,
        }
    }

    fn tick(&mut self) -> Timestamp {
        self.now += 7;
        Timestamp::from_millis(self.now)
    }

    /// Appends what the domain decided, checking it is numbered right after the log.
    fn append(&mut self, task: Task, events: Vec<Event>) -> Result<(), TestCaseError> {
        for (offset, event) in events.iter().enumerate() {
            prop_assert_eq!(
                event.sequence_number,
                self.task.last_sequence_number + 1 + offset as u64
            );
        }
        self.task = task;
        self.events.extend(events);
        Ok(())
    }

    /// A worker or client step through `advance`; a refusal must leave everything as it was.
    fn step(&mut self, step: &Step) -> Result<bool, TestCaseError> {
        let at = self.tick();
        match advance(&self.task, step, at) {
            Err(_refusal) => Ok(false),
            Ok(advanced) => {
                if advanced.events.is_empty() {
                    // A step that writes nothing changes nothing (a repeated cancel).
                    prop_assert_eq!(&advanced.task, &self.task);
                }
                self.append(advanced.task, advanced.events)?;
                Ok(true)
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Claim => {
                self.step(&Step::ClaimForLoading { model: reference() })?;
            }
            Op::Loaded => {
                self.step(&Step::Loaded)?;
            }
            Op::Output(delta) => {
                if self.step(&Step::Output {
                    delta: delta.clone(),
                })? {
                    self.run_text.push_str(delta);
                }
            }
            Op::Complete => {
                self.responses += 1;
                let response = Response {
                    id: ResponseId::from_ulid(ulid(self.responses)),
                    task_id: self.task.id,
                    model: reference(),
                    output_text: self.run_text.clone(),
                    usage: Usage::default(),
                    created_at: self.task.created_at,
                    completed_at: Timestamp::from_millis(self.now + 7),
                };
                self.step(&Step::Complete {
                    response: Box::new(response),
                })?;
            }
            Op::Fail(code) => {
                self.step(&Step::Fail {
                    error: TaskError {
                        code: *code,
                        message: String::from("the work failed"),
                    },
                })?;
            }
            Op::Cancel => {
                let decision = decide_cancel(self.task.status);
                let accepted = self.step(&Step::RequestCancel)?;
                // The cancel is refused exactly when API.md §4 answers 409.
                prop_assert_eq!(accepted, decision.reply() != CancelReply::NotCancellable);
                if matches!(
                    decision.reply(),
                    CancelReply::Cancelled | CancelReply::Accepted
                ) {
                    self.cancel_answered = true;
                }
            }
            Op::Acknowledge => {
                self.step(&Step::AcknowledgeCancel)?;
            }
            Op::Snapshot => {
                if self.task.status == TaskStatus::Running {
                    self.snapshot = Some(self.task.last_sequence_number);
                }
            }
            Op::Crash {
                twice,
                use_snapshot,
            } => self.crash(*twice, *use_snapshot)?,
        }
        Ok(())
    }

    /// The process dies and the next start runs recovery (P-7…P-11, I-5).
    fn crash(&mut self, twice: bool, use_snapshot: bool) -> Result<(), TestCaseError> {
        self.epoch += 1;
        let current = StartEpoch(self.epoch);
        let covers = if use_snapshot { self.snapshot } else { None };
        let before = self.task.clone();
        let at = self.tick();
        if let Some(advanced) = recover(&self.task, current, covers, at) {
            prop_assert!(!before.status.is_finished());
            prop_assert_eq!(
                advanced.events.len(),
                1,
                "one event per recovered task (I-5)"
            );
            let event = &advanced.events[0];
            prop_assert_eq!(event.kind().implied_status(), advanced.task.status);
            match &event.payload {
                EventPayload::Queued { .. } => {
                    // `retry` (and `resume` of a loading task): the next run starts from nothing.
                    self.run_text.clear();
                    self.snapshot = None;
                }
                EventPayload::Resumed {
                    from_sequence_number,
                } => {
                    prop_assert_eq!(before.status, TaskStatus::Running);
                    prop_assert_eq!(before.on_restart, RestartPolicy::Resume);
                    prop_assert!(*from_sequence_number <= before.last_sequence_number);
                    prop_assert_eq!(
                        *from_sequence_number,
                        covers.unwrap_or(before.last_sequence_number)
                    );
                }
                EventPayload::Failed { error } => {
                    prop_assert_eq!(before.on_restart, RestartPolicy::Fail);
                    prop_assert_eq!(error.code, TaskErrorCode::ServerRestarted);
                }
                EventPayload::Cancelled {} => {
                    prop_assert_eq!(before.status, TaskStatus::Cancelling);
                }
                other => prop_assert!(false, "recovery wrote {:?}", other),
            }
            self.recovery_moves += 1;
            self.append(advanced.task, advanced.events)?;
        } else {
            // Untouched: finished, or `queued` under `retry`/`resume`.
            prop_assert!(
                before.status.is_finished()
                    || (before.status == TaskStatus::Queued
                        && before.on_restart != RestartPolicy::Fail)
            );
        }
        if twice {
            let later = self.tick();
            let again = recover(&self.task, current, covers, later);
            prop_assert_eq!(
                again,
                None,
                "a second recovery in one start wrote something"
            );
        }
        Ok(())
    }

    /// The deltas after the last `response.queued` (all of them when there is none), joined.
    fn output_by_the_log(&self) -> String {
        let start = self
            .events
            .iter()
            .rposition(|e| e.kind() == EventKind::Queued)
            .map_or(0, |i| i + 1);
        self.events[start..]
            .iter()
            .filter_map(|e| match &e.payload {
                EventPayload::OutputTextDelta { delta } => Some(delta.as_str()),
                _ => None,
            })
            .collect()
    }

    /// I-2, I-3, the task row and the output rule, checked after every operation.
    fn check(&self) -> Result<(), TestCaseError> {
        let task = &self.task;
        let events = &self.events;

        // I-2 (P-3): 1…n without gap or repeat, `last_sequence_number = n`, status implied by
        // the last event, at most one terminal event and it is last, present iff finished.
        prop_assert_eq!(events[0].kind(), EventKind::Created);
        for (index, event) in events.iter().enumerate() {
            prop_assert_eq!(event.sequence_number, index as u64 + 1);
            prop_assert_eq!(event.task_id, task.id);
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
        prop_assert!(terminals.len() <= 1, "terminal events at {:?}", terminals);
        if let Some(&at) = terminals.first() {
            prop_assert_eq!(at, events.len() - 1);
            prop_assert!(task.status.is_finished());
        } else {
            prop_assert!(!task.status.is_finished());
        }
        prop_assert!(events
            .windows(2)
            .all(|w| w[0].created_at <= w[1].created_at));

        // I-3 (P-4): after `response.cancelling` nothing but `response.cancelled`.
        if let Some(first) = events
            .iter()
            .position(|e| e.kind() == EventKind::Cancelling)
        {
            for later in &events[first + 1..] {
                prop_assert_eq!(later.kind(), EventKind::Cancelled);
            }
        }
        // I-3: once a cancel was answered 200/202 the task never ends completed or failed.
        if self.cancel_answered {
            prop_assert!(
                matches!(task.status, TaskStatus::Cancelling | TaskStatus::Cancelled),
                "answered cancel, yet {}",
                task.status
            );
        }

        // Every run goes through `loading`: `response.in_progress` right after `response.loading`.
        for (index, event) in events.iter().enumerate() {
            if event.kind() == EventKind::InProgress {
                prop_assert_eq!(events[index - 1].kind(), EventKind::Loading);
            }
        }

        // The row agrees with the log.
        prop_assert_eq!(task.finished_at.is_some(), task.status.is_finished());
        prop_assert_eq!(task.error.is_some(), task.status == TaskStatus::Failed);
        prop_assert_eq!(
            task.response_id.is_some(),
            task.status == TaskStatus::Completed
        );
        prop_assert_eq!(
            task.started_at.is_some(),
            events.iter().any(|e| e.kind() == EventKind::Loading)
        );
        prop_assert_eq!(task.restarts, self.recovery_moves);
        if let Some(error) = &task.error {
            let EventPayload::Failed { error: logged } = &last.payload else {
                panic!("a failed task whose last event is {:?}", last.payload);
            };
            prop_assert_eq!(logged, error);
        }

        // The output rule of API.md §5: the deltas after the last `response.queued`, joined.
        let by_the_log = self.output_by_the_log();
        prop_assert_eq!(&self.run_text, &by_the_log);
        if task.status == TaskStatus::Completed {
            let EventPayload::Completed { response } = &last.payload else {
                panic!("a completed task whose last event is {:?}", last.payload);
            };
            prop_assert_eq!(&response.output_text, &by_the_log);
            prop_assert_eq!(Some(response.id), task.response_id);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        // Persisted beside this file: proptest finds no `lib.rs` for an integration test.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// I-2 (P-3) and I-3 (P-4), with recovery (P-7…P-11, I-5) in between: random lives of a task
    /// keep the log gapless and consistent with the row after every operation, nothing follows
    /// `response.cancelling` but `response.cancelled`, an answered cancel always ends
    /// `cancelled`, and a completed task's `output_text` is its deltas after the last
    /// `response.queued`, joined.
    #[test]
    fn task_log_invariants_hold_through_random_lives(
        policy in select(RestartPolicy::ALL.to_vec()),
        seed in any::<u64>(),
        ops in proptest::collection::vec(any_op(), 0..60),
    ) {
        let mut life = Life::new(policy, seed);
        life.check()?;
        for op in &ops {
            life.apply(op)?;
            life.check()?;
        }
        // One last crash: every leftover is recovered, and an answered cancel has ended.
        life.crash(true, true)?;
        life.check()?;
        if life.cancel_answered {
            prop_assert_eq!(life.task.status, TaskStatus::Cancelled);
        }
        if life.task.on_restart == RestartPolicy::Fail {
            prop_assert!(life.task.status.is_finished());
        }
    }
}
