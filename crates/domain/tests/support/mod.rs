//! Fixtures shared by the domain's test binaries: the proptest configuration, ids, tasks and
//! steps, and strategies for them.

// Each test binary that includes this module uses its own part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;

use lmsp_domain::ids::{ClientId, InstanceId, TaskId};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::ServiceTier;
use lmsp_domain::task::{Input, NewTask, Response, Task, TaskError, TaskSpec, Usage};
use lmsp_domain::transition::Step;
use lmsp_domain::{ModelId, TaskErrorCode, TaskStatus, Timestamp};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{FailurePersistence, FileFailurePersistence};
use ulid::Ulid;

/// Cases per property in a normal run (CI's `cargo test`).
pub const CASES: u32 = 2000;

/// The cases per property: [`CASES`], unless `PROPTEST_CASES` asks for another count (the
/// mutation run, `scripts/mutants-domain`, asks for fewer to stay fast).
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(CASES)
}

/// [`cases()`] cases; failures are persisted in `tests/proptest-regressions/<file>` (proptest
/// cannot find a `lib.rs` for an integration test, so its default `SourceParallel` persistence
/// would keep nothing), unless `PROPTEST_DISABLE_FAILURE_PERSISTENCE` is set (the mutation run,
/// whose failures are the mutants'). `PROPTEST_RNG_SEED` fixes the seed, as proptest's default
/// configuration reads it.
pub fn config(regressions: &'static str) -> ProptestConfig {
    let persist = std::env::var_os("PROPTEST_DISABLE_FAILURE_PERSISTENCE").is_none();
    ProptestConfig {
        cases: cases(),
        failure_persistence: persist.then(|| {
            Box::new(FileFailurePersistence::Direct(regressions)) as Box<dyn FailurePersistence>
        }),
        ..ProptestConfig::default()
    }
}

/// A ULID from a seed: distinct seeds give distinct ULIDs.
pub fn ulid(seed: u64) -> Ulid {
    Ulid::from_parts(1_700_000_000_000 + (seed % 1_000_000), u128::from(seed))
}

/// The `n`-th instance of the service.
pub fn instance(n: u64) -> InstanceId {
    InstanceId::from_ulid(ulid(0xA000 + n))
}

/// The built-in reference model.
pub fn reference() -> ModelId {
    ModelId::parse(ModelId::REFERENCE).unwrap()
}

/// A fresh `queued` task with id seed `seed`, accepted by `owner`, under `policy`.
pub fn queued_task(seed: u64, owner: InstanceId, policy: RestartPolicy) -> Task {
    Task::new_queued(NewTask {
        id: TaskId::from_ulid(ulid(seed)),
        client_id: ClientId::from_ulid(ulid(seed ^ 0x9)),
        owner,
        model: reference(),
        on_restart: policy,
        background: true,
        spec: TaskSpec {
            input: Input::Text(String::from("Once upon a time")),
            instructions: None,
            max_output_tokens: 64,
            seed,
            temperature: None,
            top_p: None,
            previous_response_id: None,
            controls: Default::default(),
        },
        metadata: BTreeMap::new(),
        created_at: Timestamp::from_millis(1_000),
        service_tier: ServiceTier::Default,
    })
}

/// The response of `task` with this text, as a worker's `Complete` carries it.
pub fn response_of(task: &Task, output_text: &str, at: Timestamp) -> Response {
    Response {
        id: task.response_id,
        task_id: task.id,
        model: task.model.clone(),
        output_text: output_text.to_owned(),
        calls: Vec::new(),
        logprobs: Vec::new(),
        usage: Usage {
            input_tokens: 4,
            output_tokens: 2,
            cached_tokens: 0,
        },
        created_at: task.created_at,
        completed_at: at,
    }
}

/// `Step::Complete` with `response_of(task, text)`.
pub fn complete(task: &Task, text: &str) -> Step {
    Step::Complete {
        response: Box::new(response_of(task, text, Timestamp::from_millis(9_000))),
    }
}

/// `Step::Output` of `delta`.
pub fn output(delta: &str) -> Step {
    Step::Output {
        delta: delta.to_owned(),
    }
}

/// `Step::Claim` of the reference model.
pub fn claim() -> Step {
    Step::Claim { model: reference() }
}

/// `Step::Fail` with an engine error.
pub fn fail() -> Step {
    Step::Fail {
        error: TaskError::new(TaskErrorCode::EngineError, "the engine failed"),
    }
}

/// Any restart policy.
pub fn any_policy() -> impl Strategy<Value = RestartPolicy> {
    select(RestartPolicy::ALL.to_vec())
}

/// Any status.
pub fn any_status() -> impl Strategy<Value = TaskStatus> {
    select(TaskStatus::ALL.to_vec())
}

/// Any of the first three instances: a task's owner and the caller of a step are often the same
/// and often not.
pub fn any_instance() -> impl Strategy<Value = InstanceId> {
    (0u64..3).prop_map(instance)
}

/// Any step; a completion carries a response of `seed`'s task with some text.
pub fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(claim()),
        Just(Step::Loaded),
        "[a-z ]{0,6}".prop_map(|delta| output(&delta)),
        ("[a-z ]{0,12}", any::<u64>()).prop_map(|(text, seed)| {
            let task = queued_task(seed, instance(0), RestartPolicy::Fail);
            complete(&task, &text)
        }),
        Just(fail()),
        Just(Step::RequestCancel),
        Just(Step::AcknowledgeCancel),
    ]
}

prop_compose! {
    /// A task row in one of `statuses`, owned by one of the first three instances, with any
    /// policy, any length of log, any earlier restarts and output items (the last possibly open),
    /// and the timestamps and error its status implies.
    pub fn task_in(statuses: Vec<TaskStatus>)(
        status in select(statuses),
        policy in any_policy(),
        owner in any_instance(),
        seed in any::<u64>(),
        last_sequence_number in 1u64..60,
        restarts in 0u32..6,
        opened in 0u32..4,
        open in any::<bool>(),
        started in any::<bool>(),
    ) -> Task {
        let mut task = queued_task(seed, owner, policy);
        task.status = status;
        task.last_sequence_number = last_sequence_number;
        task.restarts = restarts;
        task.items.opened = opened;
        task.items.open = open && opened > 0;
        if started || status != TaskStatus::Queued {
            task.started_at = Some(Timestamp::from_millis(1_001));
        }
        if status.is_finished() {
            task.finished_at = Some(Timestamp::from_millis(1_002));
        }
        if status == TaskStatus::Failed {
            task.error = Some(TaskError::new(TaskErrorCode::EngineError, "boom"));
        }
        task
    }
}

/// Any task row.
pub fn any_task() -> impl Strategy<Value = Task> {
    task_in(TaskStatus::ALL.to_vec())
}
