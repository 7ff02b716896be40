//! Property tests of the pure domain: the recovery table of API.md §7 (P-7…P-11, I-5), the
//! absorbing finished statuses and the cancel rule (P-4, I-3), and the request validator (I-9).
//!
//! Each property runs 2 000 cases (`ProptestConfig { cases: 2000, .. }`). Test names state the
//! claim; doc comments cite the rule (P-n) or invariant (I-n) they check.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use lmsp_domain::recovery::{self, needs_recovery, Move, RestartPolicy, StartEpoch};
use lmsp_domain::task::{Input, Message, Role, Task, TaskError, TaskSpec};
use lmsp_domain::transition::{advance, transition, Refusal, Step, StepKind};
use lmsp_domain::validation::{validate_submit, MAX_METADATA_PAIRS, MAX_OUTPUT_TOKENS};
use lmsp_domain::{
    decide_cancel, ClientId, EventKind, EventPayload, ModelId, Response, ResponseId, TaskErrorCode,
    TaskId, TaskStatus, Timestamp, Usage,
};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::FileFailurePersistence;
use serde_json::{json, Map, Number, Value};
use ulid::Ulid;

const CASES: u32 = 2000;

/// 2 000 cases; failures are persisted beside this file (proptest cannot find a `lib.rs` for an
/// integration test, so the default `SourceParallel` persistence would keep nothing).
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/properties.txt",
        ))),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The recovery table, written down from API.md §7 independently of `recovery::plan`.
// ---------------------------------------------------------------------------------------------

/// What API.md §7 says one cell does: `None` for "no event, untouched", else the new status,
/// the event kind, and whether the engine continues from the snapshot.
type Cell = Option<(TaskStatus, EventKind, bool)>;

/// API.md §7, row by row (plus the finished statuses, which recovery never looks at: P-7).
fn api_section_7(status: TaskStatus, policy: RestartPolicy) -> Cell {
    use RestartPolicy::{Fail, Resume, Retry};
    use TaskStatus::*;
    match (status, policy) {
        // | `queued` | `failed` + `response.failed` | stays `queued`, no event | stays `queued`, no event |
        (Queued, Fail) => Some((Failed, EventKind::Failed, false)),
        (Queued, Retry) | (Queued, Resume) => None,
        // | `loading` | `failed` + `response.failed` | `queued` + `response.queued` | same |
        (Loading, Fail) => Some((Failed, EventKind::Failed, false)),
        (Loading, Retry) | (Loading, Resume) => Some((Queued, EventKind::Queued, false)),
        // | `running` | `failed` | `queued` + `response.queued` | `running` + `response.resumed` |
        (Running, Fail) => Some((Failed, EventKind::Failed, false)),
        (Running, Retry) => Some((Queued, EventKind::Queued, false)),
        (Running, Resume) => Some((Running, EventKind::Resumed, true)),
        // | `cancelling` | `cancelled` + `response.cancelled` | same | same |
        (Cancelling, _) => Some((Cancelled, EventKind::Cancelled, false)),
        // Finished tasks are not leftovers (P-7).
        (Completed | Failed | Cancelled, _) => None,
    }
}

fn expected_move(status: TaskStatus, policy: RestartPolicy) -> Move {
    match api_section_7(status, policy) {
        None => Move::Untouched,
        Some((new_status, event, resumes)) => Move::Moved {
            status: new_status,
            event,
            // P-9: a move to `failed` carries `server_restarted`; no other move has a code.
            error_code: (event == EventKind::Failed).then_some(TaskErrorCode::ServerRestarted),
            // API.md §7: every move that writes an event increments `restarts`.
            increments_restarts: true,
            // Only `running` under `resume` continues from its snapshot.
            resumes_from_snapshot: resumes,
        },
    }
}

fn any_policy() -> impl Strategy<Value = RestartPolicy> {
    select(RestartPolicy::ALL.to_vec())
}

/// The exhaustive form: all 7 × 3 cells of the table, each spelled out (P-7…P-10).
#[test]
fn recovery_table_cells_are_exactly_api_section_7() {
    use RestartPolicy::{Fail, Resume, Retry};
    use TaskStatus::*;
    let failed = Move::Moved {
        status: Failed,
        event: EventKind::Failed,
        error_code: Some(TaskErrorCode::ServerRestarted),
        increments_restarts: true,
        resumes_from_snapshot: false,
    };
    let requeued = Move::Moved {
        status: Queued,
        event: EventKind::Queued,
        error_code: None,
        increments_restarts: true,
        resumes_from_snapshot: false,
    };
    let resumed = Move::Moved {
        status: Running,
        event: EventKind::Resumed,
        error_code: None,
        increments_restarts: true,
        resumes_from_snapshot: true,
    };
    let cancelled = Move::Moved {
        status: Cancelled,
        event: EventKind::Cancelled,
        error_code: None,
        increments_restarts: true,
        resumes_from_snapshot: false,
    };
    let table = [
        (Queued, Fail, failed),
        (Queued, Retry, Move::Untouched),
        (Queued, Resume, Move::Untouched),
        (Loading, Fail, failed),
        (Loading, Retry, requeued),
        (Loading, Resume, requeued),
        (Running, Fail, failed),
        (Running, Retry, requeued),
        (Running, Resume, resumed),
        (Cancelling, Fail, cancelled),
        (Cancelling, Retry, cancelled),
        (Cancelling, Resume, cancelled),
        (Completed, Fail, Move::Untouched),
        (Completed, Retry, Move::Untouched),
        (Completed, Resume, Move::Untouched),
        (Failed, Fail, Move::Untouched),
        (Failed, Retry, Move::Untouched),
        (Failed, Resume, Move::Untouched),
        (Cancelled, Fail, Move::Untouched),
        (Cancelled, Retry, Move::Untouched),
        (Cancelled, Resume, Move::Untouched),
    ];
    assert_eq!(
        table.len(),
        TaskStatus::ALL.len() * RestartPolicy::ALL.len()
    );
    for (status, policy, expected) in table {
        assert_eq!(
            recovery::plan(status, policy),
            expected,
            "{status} / {policy}"
        );
        assert_eq!(
            expected_move(status, policy),
            expected,
            "{status} / {policy}"
        );
    }
}

fn ulid(seed: u64) -> Ulid {
    Ulid::from_parts(1_700_000_000_000 + (seed % 1_000_000), u128::from(seed))
}

fn spec() -> TaskSpec {
    TaskSpec {
        input: Input::Text(String::from("Once upon a time")),
        max_output_tokens: 16,
        seed: 42,
    }
}

fn reference() -> ModelId {
    ModelId::parse(ModelId::REFERENCE).unwrap()
}

fn any_task() -> impl Strategy<Value = Task> {
    task_in(TaskStatus::ALL.to_vec())
}

prop_compose! {
    /// A task row in one of `statuses`, with any policy and any mark of an earlier recovery.
    fn task_in(statuses: Vec<TaskStatus>)(
        status in select(statuses),
        policy in any_policy(),
        recovered_in in proptest::option::of(0u64..6),
        last_sequence_number in 1u64..60,
        restarts in 0u32..6,
        id_seed in any::<u64>(),
        started in any::<bool>(),
        at in 0i64..1_000_000,
    ) -> Task {
        let mut task = Task::new_queued(
            TaskId::from_ulid(ulid(id_seed)),
            ClientId::from_ulid(ulid(id_seed ^ 1)),
            reference(),
            policy,
            spec(),
            BTreeMap::new(),
            Timestamp::from_millis(at),
        );
        task.status = status;
        task.recovered_in = recovered_in.map(StartEpoch);
        task.last_sequence_number = last_sequence_number;
        task.restarts = restarts;
        if started || status != TaskStatus::Queued {
            task.started_at = Some(Timestamp::from_millis(at + 1));
        }
        if status.is_finished() {
            task.finished_at = Some(Timestamp::from_millis(at + 2));
        }
        if status == TaskStatus::Failed {
            task.error = Some(TaskError { code: TaskErrorCode::EngineError, message: "boom".into() });
        }
        task
    }
}

proptest! {
    #![proptest_config(config())]

    /// P-7…P-10: every (status, policy) cell of `recovery::plan` is the cell of API.md §7: the new
    /// status, the event kind, `server_restarted` exactly for moves to `failed`, `restarts`
    /// incrementing iff an event is written, and a snapshot resume only for `running` + `resume`.
    /// `recovery::recover` carries the cell out on a task row (P-11: the one event with the new
    /// state).
    #[test]
    fn recovery_table_matches_api_section_7(task in any_task(), epoch in 0u64..6, covers in proptest::option::of(0u64..60), at in 0i64..2_000_000) {
        let planned = recovery::plan(task.status, task.on_restart);
        prop_assert_eq!(planned, expected_move(task.status, task.on_restart));
        if let Move::Moved { status, event, error_code, increments_restarts, resumes_from_snapshot } = planned {
            prop_assert!(increments_restarts);
            prop_assert_eq!(error_code.is_some(), status == TaskStatus::Failed);
            prop_assert_eq!(event.implied_status(), status);
            prop_assert_eq!(
                resumes_from_snapshot,
                (task.status, task.on_restart) == (TaskStatus::Running, RestartPolicy::Resume)
            );
        }

        let current = StartEpoch(epoch);
        let recovered = recovery::recover(&task, current, covers, Timestamp::from_millis(at));
        match (planned, recovered) {
            (_, None) => {
                // Nothing written: the cell is untouched, or this start moved the task already.
                prop_assert!(planned == Move::Untouched || !needs_recovery(&task, current));
            }
            (Move::Untouched, Some(advanced)) => {
                prop_assert!(false, "an untouched cell wrote {:?}", advanced.events);
            }
            (Move::Moved { status, event, error_code, .. }, Some(advanced)) => {
                prop_assert!(needs_recovery(&task, current));
                prop_assert_eq!(advanced.task.status, status);
                prop_assert_eq!(advanced.events.len(), 1);
                let written = &advanced.events[0];
                prop_assert_eq!(written.kind(), event);
                prop_assert_eq!(written.task_id, task.id);
                prop_assert_eq!(written.sequence_number, task.last_sequence_number + 1);
                prop_assert_eq!(advanced.task.last_sequence_number, task.last_sequence_number + 1);
                prop_assert_eq!(advanced.task.restarts, task.restarts + 1);
                prop_assert_eq!(advanced.task.recovered_in, Some(current));
                if let Some(code) = error_code {
                    // P-9: `failed` with `server_restarted`, in the row and in the event.
                    prop_assert_eq!(advanced.task.error.as_ref().map(|e| e.code), Some(code));
                    let EventPayload::Failed { error } = &written.payload else {
                        panic!("a failed move wrote {:?}", written.payload);
                    };
                    prop_assert_eq!(error.code, code);
                }
                if let EventPayload::Queued { reason } = &written.payload {
                    prop_assert_eq!(*reason, lmsp_domain::QueueReason::ServerRestarted);
                }
                if let EventPayload::Resumed { from_sequence_number } = &written.payload {
                    prop_assert_eq!(*from_sequence_number, covers.unwrap_or(task.last_sequence_number));
                }
                prop_assert_eq!(advanced.task.finished_at.is_some(), status.is_finished());
            }
        }
    }

    /// I-5 (P-7…P-11): recovery applied twice in one start equals recovery applied once; the one
    /// recovery writes exactly one event carrying the new state (P-11), or nothing at all.
    #[test]
    fn recovery_is_idempotent(task in any_task(), epoch in 0u64..6, covers in proptest::option::of(0u64..60), at in 0i64..2_000_000, later in 0i64..1000) {
        let current = StartEpoch(epoch);
        let first_at = Timestamp::from_millis(at);
        let once = recovery::recover(&task, current, covers, first_at);
        let after_once = once.as_ref().map_or_else(|| task.clone(), |a| a.task.clone());
        if let Some(advanced) = &once {
            prop_assert_eq!(advanced.events.len(), 1);
            let event = &advanced.events[0];
            prop_assert_eq!(event.kind().implied_status(), advanced.task.status);
            prop_assert_eq!(event.sequence_number, advanced.task.last_sequence_number);
            prop_assert_eq!(event.created_at, first_at);
        }
        // The second run of the same start, whatever the time or snapshot it is given.
        let twice = recovery::recover(&after_once, current, covers.map(|c| c + 1), first_at.plus_millis(later));
        prop_assert_eq!(twice, None, "the second recovery of one start wrote something");
        // After one recovery nothing is left to do in this start: the task is marked as moved by
        // it, or its cell leaves it untouched.
        prop_assert!(
            !needs_recovery(&after_once, current)
                || recovery::plan(after_once.status, after_once.on_restart) == Move::Untouched
        );
    }

    /// P-4: finished statuses are absorbing: no step moves a finished task or writes an event
    /// (a cancel of a `cancelled` task is answered but changes nothing), and recovery leaves it.
    #[test]
    fn finished_tasks_accept_no_step(
        task in task_in(vec![TaskStatus::Completed, TaskStatus::Failed, TaskStatus::Cancelled]),
        step in any_step(),
        epoch in 0u64..6,
        at in 0i64..2_000_000,
    ) {
        prop_assert!(task.status.is_finished());
        match advance(&task, &step, Timestamp::from_millis(at)) {
            Err(refusal) => prop_assert_eq!(refusal, Refusal::Finished { status: task.status, step: step.kind() }),
            Ok(advanced) => {
                prop_assert_eq!(step.kind(), StepKind::RequestCancel);
                prop_assert_eq!(task.status, TaskStatus::Cancelled);
                prop_assert!(advanced.events.is_empty());
                prop_assert_eq!(advanced.task, task.clone());
            }
        }
        prop_assert_eq!(recovery::recover(&task, StartEpoch(epoch), None, Timestamp::from_millis(at)), None);
    }

    /// P-4, I-3: after `cancelling` the only event that may follow is `response.cancelled`; every
    /// other step is refused, a repeated cancel writes nothing, and recovery cancels (P-10).
    #[test]
    fn after_cancelling_only_cancelled_may_follow(step in any_step(), policy in any_policy(), epoch in 0u64..6, at in 0i64..2_000_000) {
        let status = TaskStatus::Cancelling;
        match transition(status, &step) {
            Ok(decided) => {
                let kinds: Vec<_> = decided.events.iter().map(EventPayload::kind).collect();
                match step.kind() {
                    StepKind::AcknowledgeCancel => {
                        prop_assert_eq!(decided.status, TaskStatus::Cancelled);
                        prop_assert_eq!(kinds, vec![EventKind::Cancelled]);
                    }
                    StepKind::RequestCancel => {
                        prop_assert_eq!(decided.status, TaskStatus::Cancelling);
                        prop_assert!(kinds.is_empty());
                    }
                    other => prop_assert!(false, "cancelling accepted {:?}", other),
                }
            }
            Err(refusal) => prop_assert_eq!(refusal, Refusal::CancelPending { step: step.kind() }),
        }
        // The cancel decision itself: a cancel answered 200/202 leads only to `cancelled`.
        let decision = decide_cancel(status);
        prop_assert_eq!(decision.new_status(), Some(TaskStatus::Cancelling));
        prop_assert!(decision.event().is_none());
        // Recovery of a cancelling task, whatever its policy, cancels it.
        let mut task = Task::new_queued(
            TaskId::from_ulid(ulid(7)), ClientId::from_ulid(ulid(8)), reference(), policy, spec(),
            BTreeMap::new(), Timestamp::from_millis(0),
        );
        task.status = status;
        task.last_sequence_number = 4;
        let recovered = recovery::recover(&task, StartEpoch(epoch), None, Timestamp::from_millis(at)).unwrap();
        prop_assert_eq!(recovered.task.status, TaskStatus::Cancelled);
        let kinds: Vec<_> = recovered.events.iter().map(|e| e.kind()).collect();
        prop_assert_eq!(kinds, vec![EventKind::Cancelled]);
    }
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::ClaimForLoading { model: reference() }),
        Just(Step::Loaded),
        ".{0,8}".prop_map(|delta| Step::Output { delta }),
        any::<u64>().prop_map(|seed| Step::Complete {
            response: Box::new(Response {
                id: ResponseId::from_ulid(ulid(seed)),
                task_id: TaskId::from_ulid(ulid(seed ^ 3)),
                model: reference(),
                output_text: String::from("text"),
                usage: Usage::default(),
                created_at: Timestamp::from_millis(0),
                completed_at: Timestamp::from_millis(1),
            }),
        }),
        Just(Step::Fail {
            error: TaskError {
                code: TaskErrorCode::EngineError,
                message: String::from("engine failed"),
            },
        }),
        Just(Step::RequestCancel),
        Just(Step::AcknowledgeCancel),
    ]
}

// ---------------------------------------------------------------------------------------------
// Validation (API.md §2, §4; I-9).
// ---------------------------------------------------------------------------------------------

const FIELDS: [&str; 8] = [
    "model",
    "input",
    "background",
    "stream",
    "on_restart",
    "max_output_tokens",
    "seed",
    "metadata",
];

fn any_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(FIELDS.to_vec()).prop_map(String::from),
        1 => select(vec!["role", "content", "k", ""]).prop_map(String::from),
        1 => Just("x".repeat(65)),
        1 => ".{0,12}",
    ]
}

fn any_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        select(vec![0i64, 1, -1, 100_000, 100_001, i64::MAX, i64::MIN]).prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

fn any_json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any_number(),
        select(vec![
            "",
            " ",
            "reference",
            "fail",
            "retry",
            "resume",
            "Resume",
            "system",
            "user",
            "assistant",
            "bot",
            "../etc",
        ])
        .prop_map(|s| Value::String(s.into())),
        any::<String>().prop_map(Value::String),
    ]
}

/// Arbitrary JSON: leaves, and arrays and objects of arbitrary JSON up to depth 4, whose keys are
/// often the validator's own field names so that nested paths get reached.
fn any_json() -> impl Strategy<Value = Value> {
    any_json_leaf().prop_recursive(4, 64, 10, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..10).prop_map(Value::Array),
            proptest::collection::btree_map(any_key(), inner, 0..20)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn valid_input() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-zA-Z ]{0,12}[a-z][a-zA-Z ]{0,12}".prop_map(Value::String),
        proptest::collection::vec(
            (select(vec!["system", "user", "assistant"]), ".{0,10}")
                .prop_map(|(role, content)| json!({"role": role, "content": content})),
            1..4
        )
        .prop_map(Value::Array),
    ]
}

/// A valid body: any subset of the optional fields, each with a valid value.
fn valid_body() -> impl Strategy<Value = Map<String, Value>> {
    (
        "[a-z][a-z0-9._:/-]{0,20}",
        valid_input(),
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(select(vec!["fail", "retry", "resume"])),
        proptest::option::of(1u64..=MAX_OUTPUT_TOKENS),
        proptest::option::of(any::<u64>()),
        proptest::option::of(proptest::collection::btree_map(
            "[a-z]{1,64}",
            ".{0,20}",
            0..=MAX_METADATA_PAIRS,
        )),
    )
        .prop_map(
            |(model, input, background, stream, on_restart, max, seed, metadata)| {
                let mut body = Map::new();
                body.insert("model".into(), Value::String(model));
                body.insert("input".into(), input);
                let mut put = |name: &str, value: Option<Value>| {
                    if let Some(value) = value {
                        body.insert(name.into(), value);
                    }
                };
                put("background", background.map(Value::Bool));
                put("stream", stream.map(Value::Bool));
                put("on_restart", on_restart.map(Value::from));
                put("max_output_tokens", max.map(Value::from));
                put("seed", seed.map(Value::from));
                put(
                    "metadata",
                    metadata.map(|m| {
                        Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
                    }),
                );
                body
            },
        )
}

/// One small change that may break a valid body.
#[derive(Debug, Clone)]
enum Mutation {
    Remove(&'static str),
    Set(&'static str, Value),
    AddUnknown(String, Value),
    BreakMessage(usize, &'static str, Value),
    OverfillMetadata(usize),
}

fn any_mutation() -> impl Strategy<Value = Mutation> {
    let field = || select(FIELDS.to_vec());
    prop_oneof![
        field().prop_map(Mutation::Remove),
        (field(), any_json()).prop_map(|(f, v)| Mutation::Set(f, v)),
        (field(), any_json_leaf()).prop_map(|(f, v)| Mutation::Set(f, v)),
        ("[a-z_]{1,10}", any_json_leaf()).prop_map(|(k, v)| Mutation::AddUnknown(k, v)),
        (
            0usize..4,
            select(vec!["role", "content", "name"]),
            any_json_leaf()
        )
            .prop_map(|(i, f, v)| Mutation::BreakMessage(i, f, v)),
        (0usize..40).prop_map(Mutation::OverfillMetadata),
    ]
}

fn mutate(body: &mut Map<String, Value>, mutation: &Mutation) {
    match mutation {
        Mutation::Remove(field) => {
            body.remove(*field);
        }
        Mutation::Set(field, value) => {
            body.insert((*field).into(), value.clone());
        }
        Mutation::AddUnknown(key, value) => {
            body.insert(key.clone(), value.clone());
        }
        Mutation::BreakMessage(index, field, value) => {
            if let Some(Value::Array(items)) = body.get_mut("input") {
                if let Some(Value::Object(message)) = items.get_mut(*index) {
                    message.insert((*field).into(), value.clone());
                }
            }
        }
        Mutation::OverfillMetadata(extra) => {
            let metadata = body
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(pairs) = metadata {
                for i in 0..*extra {
                    pairs.insert(format!("extra{i}"), Value::String("v".into()));
                }
            }
        }
    }
}

/// What every rejection must look like (I-9): a 4xx code and a message saying something.
fn check_rejection(body: &Value) -> Result<(), TestCaseError> {
    match validate_submit(body) {
        Err(error) => {
            let status = error.code.http_status();
            prop_assert!((400..500).contains(&status), "{} is {}", error.code, status);
            prop_assert!(!error.message.trim().is_empty());
            if let Some(param) = &error.param {
                // The named field is one the body has, or a required one it lacks.
                let top = param.split(['.', '[']).next().unwrap_or_default();
                let fields = body.as_object().unwrap();
                prop_assert!(
                    fields.contains_key(param.as_str())
                        || fields.contains_key(top)
                        || top == "model"
                        || top == "input",
                    "param {} names nothing in the body",
                    param
                );
            }
        }
        Ok(request) => {
            // What is accepted keeps the rules of API.md §4.
            prop_assert!((1..=100_000).contains(&request.max_output_tokens));
            prop_assert!(request.metadata.len() <= MAX_METADATA_PAIRS);
            match &request.input {
                Input::Text(text) => prop_assert!(!text.trim().is_empty()),
                Input::Messages(messages) => prop_assert!(!messages.is_empty()),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// I-9 (API.md §2, §4): whatever JSON arrives, and whatever a near-valid body is turned into,
    /// the validator never panics; every rejection has a 4xx code and a non-empty message; a
    /// valid body is accepted with its values.
    #[test]
    fn arbitrary_json_never_panics_the_validator(
        arbitrary in any_json(),
        body in valid_body(),
        mutations in proptest::collection::vec(any_mutation(), 0..4),
    ) {
        // Arbitrary JSON, as it is and as the top-level object it may be.
        if let Err(error) = validate_submit(&arbitrary) {
            prop_assert!((400..500).contains(&error.code.http_status()));
            prop_assert!(!error.message.trim().is_empty());
        }
        if arbitrary.is_object() {
            check_rejection(&arbitrary)?;
        }

        // Near-valid: a valid body with a few changes.
        let unchanged = Value::Object(body.clone());
        let request = validate_submit(&unchanged);
        prop_assert!(request.is_ok(), "a valid body was rejected: {} ({:?})", unchanged, request);
        let request = request.unwrap();
        prop_assert_eq!(request.model.as_str(), body["model"].as_str().unwrap());
        prop_assert_eq!(
            u64::from(request.max_output_tokens),
            body.get("max_output_tokens").and_then(Value::as_u64).unwrap_or(256)
        );
        prop_assert_eq!(request.seed, body.get("seed").and_then(Value::as_u64));
        prop_assert_eq!(
            request.on_restart.map(RestartPolicy::as_str),
            body.get("on_restart").and_then(Value::as_str)
        );
        if let Input::Messages(messages) = &request.input {
            let roles: Vec<_> = messages.iter().map(|m: &Message| m.role).collect();
            prop_assert!(roles.iter().all(|r| matches!(r, Role::System | Role::User | Role::Assistant)));
        }

        let mut changed = body;
        for mutation in &mutations {
            mutate(&mut changed, mutation);
        }
        check_rejection(&Value::Object(changed))?;
    }
}
