//! What the harness writes through the storage port when it prepares a database or drives the
//! adapter directly: ids, tasks, the steps a worker takes, and the instance in whose care the
//! tasks are. Kept here, in the harness itself, so that it depends on no test crate.
//!
//! Ids are ULIDs made from a process-wide counter and the process id, so they sort in creation
//! order within the harness. Every timestamp is [`T0`] plus an offset: the figures never depend on
//! the wall clock (a purge's cut-off, for one, is chosen relative to `T0`).

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::bail;
use lmsp_domain::error_code::TaskErrorCode;
use lmsp_domain::ids::{ClientId, InstanceId, TaskId};
use lmsp_domain::model::ModelId;
use lmsp_domain::ports::{InstanceInfo, InstanceStore, Registration, StepOutcome};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::ServiceTier;
use lmsp_domain::task::{Input, Metadata, NewTask, Response, Task, TaskError, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use ulid::Ulid;

/// The base time of everything the harness writes.
pub const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// The name the harness's instance registers under.
pub const INSTANCE_NAME: &str = "lmsp-bench";

static COUNTER: AtomicU64 = AtomicU64::new(1);

/// A fresh ULID that sorts after every earlier one of this process.
pub fn ulid() -> Ulid {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Ulid::from_parts(
        T0.as_millis() as u64 + n,
        (u128::from(n) << 32) | u128::from(std::process::id()),
    )
}

/// A fresh task id.
pub fn task_id() -> TaskId {
    TaskId::from_ulid(ulid())
}

/// A fresh client id.
pub fn client_id() -> ClientId {
    ClientId::from_ulid(ulid())
}

/// A fresh instance id.
pub fn instance_id() -> InstanceId {
    InstanceId::from_ulid(ulid())
}

/// The built-in reference model's id.
pub fn model_id() -> anyhow::Result<ModelId> {
    Ok(ModelId::parse(ModelId::REFERENCE)?)
}

/// A new `queued` task of `client`, accepted by instance `owner`, under `policy`: the reference
/// model, a short prompt, 16 output tokens, created at its id's time.
pub fn task(owner: InstanceId, client: ClientId, policy: RestartPolicy) -> anyhow::Result<Task> {
    let id = task_id();
    Ok(Task::new_queued(NewTask {
        id,
        client_id: client,
        owner,
        model: model_id()?,
        on_restart: policy,
        background: true,
        spec: TaskSpec {
            input: Input::Text(String::from("Once upon a time")),
            instructions: None,
            max_output_tokens: 16,
            seed: 7,
            temperature: None,
            top_p: None,
            previous_response_id: None,
            controls: Default::default(),
        },
        metadata: Metadata::new(),
        created_at: Timestamp::from_millis(id.ulid().timestamp_ms() as i64),
        service_tier: ServiceTier::Default,
    }))
}

/// The claim of `task` (`queued → loading`): the task passes into the claimer's care.
pub fn claim(task: &Task) -> Step {
    Step::Claim {
        model: task.model.clone(),
    }
}

/// One output delta.
pub fn output(delta: &str) -> Step {
    Step::Output {
        delta: delta.to_owned(),
    }
}

/// The completion of `task` with `text` as its output, at `at`.
pub fn complete(task: &Task, text: &str, at: Timestamp) -> Step {
    Step::Complete {
        response: Box::new(Response {
            id: task.response_id,
            task_id: task.id,
            model: task.model.clone(),
            output_text: text.to_owned(),
            calls: Vec::new(),
            logprobs: Vec::new(),
            usage: Usage {
                input_tokens: 4,
                output_tokens: 16,
                cached_tokens: 0,
            },
            created_at: task.created_at,
            completed_at: at,
        }),
    }
}

/// The end a claim loop gives each task it claimed, as a worker whose run takes no time would
/// (the cheapest end: from `loading` straight to `failed`).
pub fn ended() -> Step {
    Step::Fail {
        error: TaskError::new(TaskErrorCode::EngineError, "lmsp-bench: claimed and ended"),
    }
}

/// The task after steps that must have been applied; an error says which were not.
pub fn applied(outcome: StepOutcome) -> anyhow::Result<Task> {
    match outcome {
        StepOutcome::Applied { task, .. } => Ok(task),
        StepOutcome::Refused { task, refusal } => {
            bail!(
                "a step on {} ({}) was refused: {refusal}",
                task.id,
                task.status
            )
        }
        StepOutcome::NotFound => bail!("a step was taken on a task that does not exist"),
    }
}

/// Registers a fresh instance of the harness in `store` (whose tasks the harness then creates
/// and steps), with a lease of a day from `at`; returns its id.
pub async fn register_instance(
    store: &dyn InstanceStore,
    at: Timestamp,
) -> anyhow::Result<InstanceId> {
    let id = instance_id();
    let info = InstanceInfo {
        id,
        name: String::from(INSTANCE_NAME),
        started_at: at,
        lease_until: at.plus_millis(86_400_000),
    };
    match store.register_instance(info).await? {
        Registration::Registered { .. } => Ok(id),
        Registration::NameInUse { lease_until } => bail!(
            "another instance named {INSTANCE_NAME} holds a lease until {}",
            lease_until.as_millis()
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn ids_sort_in_creation_order_and_tasks_start_queued() {
        let (a, b) = (task_id(), task_id());
        assert!(a.ulid() < b.ulid());
        let owner = instance_id();
        let task = task(owner, client_id(), RestartPolicy::Resume).unwrap();
        assert_eq!(task.status, lmsp_domain::TaskStatus::Queued);
        assert_eq!(task.owner, owner);
        assert_eq!(task.last_sequence_number, 1);
        assert!(matches!(claim(&task), Step::Claim { .. }));
    }
}
