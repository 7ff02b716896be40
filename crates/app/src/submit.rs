//! Submitting work: a request that creates a task (P-2), answered per its delivery
//! (background, synchronous, stream), under its idempotency key if it has one (I-8, through
//! [`crate::idempotency::idempotent`]). A request that creates a task keeps, with the task, the
//! reply a retry is to get: a background request its whole 202; a synchronous or streaming
//! request a pointer to the task, since its reply is not known yet. When a synchronous request's
//! task finishes, its final reply is kept with the key (settled) by a job of its own, so it is
//! kept even if the waiting client went away, and a retry gets the same bytes after the task was
//! purged or deleted. A stream's key keeps its pointer: once its task is gone, a retry is told so
//! ([`TaskAnswer::Gone`]). The driving adapter encodes the replies a key keeps
//! ([`TaskReplies`]); the app keeps those bytes and hands them back without looking inside.

use std::sync::Arc;

use rand::RngCore;

use lmsp_domain::auth::Scope;
use lmsp_domain::batch::BatchLine;
use lmsp_domain::idempotency::{KeyClaim, Operation, StoredReply};
use lmsp_domain::ports::{CreateOutcome, StoreError};
use lmsp_domain::validation::{check_tool_answers, SubmitRequest, ValidationError};
use lmsp_domain::{
    Input, Message, NewTask, Response, ResponseId, RestartPolicy, Role, ServiceTier, Task, TaskId,
    TaskSpec, TaskStatus, ToolCall,
};

use crate::caller::Caller;
use crate::error::AppError;
use crate::idempotency::{idempotent, settle, IdempotentRequest, KeyHold, Ran};
use crate::service::Service;

/// How a request that creates a task is to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// 202 at once; the task runs on.
    Background,
    /// When the task has finished: its outcome.
    Synchronous,
    /// The task's events as they are committed.
    Stream,
}

impl Delivery {
    /// The delivery a request asks for (`stream` wins over `background`).
    pub fn of(request: &SubmitRequest) -> Self {
        if request.stream {
            Delivery::Stream
        } else if request.background {
            Delivery::Background
        } else {
            Delivery::Synchronous
        }
    }
}

/// What is given again from a task a kept reply points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromTask {
    /// Its outcome once it finished, as a synchronous request gets it.
    Outcome,
    /// Its events from the first, as a streaming request gets them.
    Events,
}

/// What a kept reply is, as the driving adapter that encoded it reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptReply {
    /// A whole reply, given again as it is.
    Whole,
    /// A pointer: the reply is rebuilt from this task.
    FromTask(TaskId, FromTask),
}

/// The driving adapter's encoding of the replies a task request's key keeps. The app stores
/// what these return and hands it back, never looking inside; [`TaskReplies::read`] tells it what
/// a kept reply is.
pub trait TaskReplies: Send + Sync {
    /// The reply to a background request (a 202 naming `task`), kept whole with the task.
    fn accepted(&self, task: &Task) -> StoredReply;

    /// What a synchronous or streaming request's key keeps with its task until its final reply is
    /// known: a pointer to follow, which [`TaskReplies::read`] gives back as
    /// [`KeptReply::FromTask`].
    fn follow(&self, task: &Task, how: FromTask) -> StoredReply;

    /// The reply to a synchronous request whose task finished, with its response when it
    /// completed: the very reply the waiting request is given, and kept with the key.
    fn finished(&self, task: &Task, response: Option<&Response>) -> StoredReply;

    /// What a kept reply is.
    fn read(&self, kept: &StoredReply) -> KeptReply;
}

/// What a request that creates a task is answered with.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskAnswer {
    /// A background request's task was accepted (a request without a key).
    Accepted(Task),
    /// A synchronous request's task finished (a request without a key, or a retry that saw its
    /// task finish); its response when it completed.
    Finished {
        /// The finished task.
        task: Task,
        /// Its response, when it completed.
        response: Option<Response>,
    },
    /// A streaming request: its task's events, from the first.
    Stream(Task),
    /// A reply the adapter encoded and the key keeps, given as it is: a background 202, a
    /// synchronous request's final reply.
    Kept(StoredReply),
    /// The service began to stop before a synchronous request's task finished; the task goes on
    /// after a restart (a retry with the key then gets its outcome).
    Stopping(TaskId),
    /// The key points at a task that is gone (purged or deleted) and kept no final reply of it (a
    /// stream, or a synchronous request whose waiting process stopped before the task finished
    /// and that no retry collected until the purge): there is nothing left to give again.
    Gone(TaskId),
}

/// A task request's answer, and whether it is given again under its key.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskReply {
    /// The answer.
    pub answer: TaskAnswer,
    /// Whether it answers a repeat under an idempotency key (nothing new was created).
    pub replayed: bool,
}

/// How the reply a key keeps is encoded from the task a request created.
type KeptFor<'a> = &'a (dyn Fn(&Task) -> StoredReply + Sync);

/// What creating a task under a key produced.
// `Task` is not boxed: the value is matched at once and returned once per request.
#[allow(clippy::large_enum_variant)]
enum Created {
    /// A new task, committed with its first event and, under a key, the reply the key keeps.
    Task {
        /// The task as created.
        task: Task,
        /// The reply committed with it under the key.
        kept: Option<StoredReply>,
    },
    /// Another request already answered under the idempotency key: its reply.
    KeyAnswered(StoredReply),
}

impl Service {
    /// P-2: creates the task a request asks for, with its first event, in one transaction;
    /// returns only after the commit. (A request with an idempotency key goes through
    /// [`Service::request_task`].)
    pub async fn submit(&self, caller: &Caller, request: &SubmitRequest) -> Result<Task, AppError> {
        match self.create_task(caller, request, None).await? {
            Created::Task { task, .. } => Ok(task),
            Created::KeyAnswered(_) => Err(AppError::KeyInUse),
        }
    }

    /// I-8, P-2: answers a request that creates a task (`operation` names which), per its
    /// [`Delivery`], under its idempotency key if it has one: the task is created with the reply
    /// a retry is to get (`replies` encodes it) in one transaction; a retry gets that reply again
    /// and creates nothing. A synchronous request waits for its task and keeps its final reply
    /// with the key.
    pub async fn request_task(
        &self,
        caller: &Caller,
        operation: Operation,
        request: &SubmitRequest,
        key: Option<IdempotentRequest>,
        replies: Arc<dyn TaskReplies>,
    ) -> Result<TaskReply, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        let core = &self.inner.core;
        let act = |hold| self.answer_task(caller, request, hold, Arc::clone(&replies));
        match idempotent(core, caller, operation, key, act).await? {
            Ran::Answered(reply) => Ok(reply),
            Ran::Replay(claim, kept) => self.replay_task(caller, &claim, kept, replies).await,
        }
    }

    /// Creates the task and answers per the delivery, while the request holds its key.
    async fn answer_task(
        &self,
        caller: &Caller,
        request: &SubmitRequest,
        hold: Option<KeyHold>,
        replies: Arc<dyn TaskReplies>,
    ) -> Result<TaskReply, AppError> {
        let delivery = Delivery::of(request);
        let kept_for = |task: &Task| match delivery {
            Delivery::Background => replies.accepted(task),
            Delivery::Synchronous => replies.follow(task, FromTask::Outcome),
            Delivery::Stream => replies.follow(task, FromTask::Events),
        };
        let key = hold.as_ref().map(|hold| (hold, &kept_for as KeptFor<'_>));
        let (task, kept) = match self.create_task(caller, request, key).await? {
            Created::Task { task, kept } => (task, kept),
            // This request's hold ran out and another one answered under the key meanwhile.
            Created::KeyAnswered(reply) => {
                let Some(hold) = hold else {
                    return Err(AppError::KeyInUse);
                };
                return self.replay_task(caller, hold.claim(), reply, replies).await;
            }
        };
        let answer = match (delivery, kept) {
            (Delivery::Stream, _) => TaskAnswer::Stream(task),
            // The first 202 is the kept one, so a replay is the same bytes by construction.
            (Delivery::Background, Some(kept)) => TaskAnswer::Kept(kept),
            (Delivery::Background, None) => TaskAnswer::Accepted(task),
            (Delivery::Synchronous, kept) => {
                let under = hold
                    .zip(kept)
                    .map(|(hold, kept)| (hold.claim().clone(), kept));
                self.outcome(caller, task.id, under, replies).await?
            }
        };
        Ok(TaskReply {
            answer,
            replayed: false,
        })
    }

    /// Gives a kept reply again: as it is, or rebuilt from the task it points at.
    async fn replay_task(
        &self,
        caller: &Caller,
        claim: &KeyClaim,
        kept: StoredReply,
        replies: Arc<dyn TaskReplies>,
    ) -> Result<TaskReply, AppError> {
        let answer = match replies.read(&kept) {
            KeptReply::Whole => TaskAnswer::Kept(kept),
            KeptReply::FromTask(task_id, how) => match self.inner.core.store.task(task_id).await? {
                Some(task) if caller.may_see(&task) => match how {
                    FromTask::Events => TaskAnswer::Stream(task),
                    FromTask::Outcome => {
                        let under = Some((claim.clone(), kept));
                        self.outcome(caller, task_id, under, replies).await?
                    }
                },
                _ => TaskAnswer::Gone(task_id),
            },
        };
        Ok(TaskReply {
            answer,
            replayed: true,
        })
    }

    /// A synchronous request's outcome: waits for the task to finish and, under a key whose
    /// record keeps `kept` (the pointer), keeps the final reply with the key. Under a key this
    /// runs as a job of its own, so the reply is kept even if the waiting request is dropped.
    async fn outcome(
        &self,
        caller: &Caller,
        task_id: TaskId,
        under: Option<(KeyClaim, StoredReply)>,
        replies: Arc<dyn TaskReplies>,
    ) -> Result<TaskAnswer, AppError> {
        if under.is_none() {
            return self.finished_outcome(task_id, None, replies).await;
        }
        let job = self.inner.life.jobs.spawn({
            let service = self.clone();
            async move { service.finished_outcome(task_id, under, replies).await }
        });
        match job.await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::error!(%error, task = %task_id, caller = %caller.client_id,
                    "waiting for a synchronous request's task stopped");
                Err(AppError::Store(StoreError::Unavailable(String::from(
                    "the outcome of the task could not be kept",
                ))))
            }
        }
    }

    /// Waits for the task to finish (or the service to stop) and settles the key, if any.
    async fn finished_outcome(
        &self,
        task_id: TaskId,
        under: Option<(KeyClaim, StoredReply)>,
        replies: Arc<dyn TaskReplies>,
    ) -> Result<TaskAnswer, AppError> {
        let finished = tokio::select! {
            finished = self.wait_finished(task_id, None) => finished,
            () = self.stopping() => Ok(None),
        };
        let task = match finished {
            Ok(Some(task)) => task,
            Ok(None) => return Ok(TaskAnswer::Stopping(task_id)),
            Err(AppError::NotFound) => return Ok(TaskAnswer::Gone(task_id)),
            Err(error) => return Err(error),
        };
        let response = match task.status {
            TaskStatus::Completed => match self.inner.core.store.response(task_id).await? {
                Some(response) => Some(response),
                // Deleted (or purged) the moment it completed.
                None => return Ok(TaskAnswer::Gone(task_id)),
            },
            _ => None,
        };
        let Some((claim, kept)) = under else {
            return Ok(TaskAnswer::Finished { task, response });
        };
        let reply = replies.finished(&task, response.as_ref());
        settle(&self.inner.core, &claim, &kept, reply.clone()).await;
        Ok(TaskAnswer::Kept(reply))
    }

    /// P-2, I-8: creates the task a request asks for with its first event and, when the request
    /// holds an idempotency key, the key's record answered with `kept_for(task)` (the reply a
    /// retry is to get), in one transaction; returns only after the commit.
    async fn create_task(
        &self,
        caller: &Caller,
        request: &SubmitRequest,
        key: Option<(&KeyHold, KeptFor<'_>)>,
    ) -> Result<Created, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        if self.inner.life.is_shutting_down() {
            return Err(AppError::ShuttingDown);
        }
        let core = &self.inner.core;
        let task = self.prepare_task(caller, request, None).await?;
        let kept = key.map(|(_, kept_for)| kept_for(&task));
        let record = key
            .zip(kept.clone())
            .map(|((held, _), kept)| held.answered_record(kept));
        match core
            .store
            .create_task_within(task, record, core.settings.max_queued)
            .await?
        {
            CreateOutcome::QueueFull(full) => Err(AppError::QueueFull(full)),
            CreateOutcome::Created(task) => {
                self.inner.workers.work_arrived();
                Ok(Created::Task { task, kept })
            }
            // Only when this request's hold ran out and another request answered under the key.
            CreateOutcome::KeyAnswered(record) => match key {
                Some((held, _)) => held.answered_elsewhere(&record).map(Created::KeyAnswered),
                None => Err(AppError::KeyInUse),
            },
        }
    }

    /// The task a request asks for, checked as far as it can be before it is stored: its model
    /// is registered, an earlier response it continues is the caller's and completed, its tool
    /// answers answer calls, and its model's engine can run it. `batch` names the batch line it
    /// answers, if any.
    pub(crate) async fn prepare_task(
        &self,
        caller: &Caller,
        request: &SubmitRequest,
        batch: Option<BatchLine>,
    ) -> Result<Task, AppError> {
        let core = &self.inner.core;
        let Some(record) = core.store.model(&request.model).await? else {
            return Err(AppError::ModelNotFound(request.model.to_string()));
        };
        let input = match request.previous_response_id {
            Some(previous) => {
                self.continued_input(caller, previous, &request.input)
                    .await?
            }
            None => request.input.clone(),
        };
        let earlier = match &input {
            Input::Messages(all) => all.len().saturating_sub(request.input.messages().len()),
            Input::Text(_) => 0,
        };
        check_tool_answers(&input, earlier)
            .map_err(|error| AppError::Invalid(error.in_shape(request.shape)))?;
        // A drawn seed stays below 2^53, so that a JavaScript client (its numbers are doubles)
        // reads it, and can send it back, exactly.
        let seed = request
            .seed
            .unwrap_or_else(|| rand::rngs::OsRng.next_u64() >> 11);
        let (on_restart, service_tier) = match batch {
            // A batch's lines resume by default, and never hold up interactive work.
            Some(_) => (
                request.on_restart.unwrap_or(RestartPolicy::Resume),
                ServiceTier::Flex,
            ),
            None => (
                request
                    .on_restart
                    .unwrap_or(core.settings.default_on_restart),
                request.service_tier,
            ),
        };
        let task = Task {
            batch,
            ..Task::new_queued(NewTask {
                id: TaskId::from_ulid(core.next_ulid()),
                client_id: caller.client_id,
                owner: core.instance,
                model: request.model.clone(),
                on_restart,
                background: request.background,
                spec: TaskSpec {
                    input,
                    instructions: request.instructions.clone(),
                    max_output_tokens: request.max_output_tokens,
                    seed,
                    temperature: request.temperature,
                    top_p: request.top_p,
                    previous_response_id: request.previous_response_id,
                    controls: request.controls.clone(),
                },
                metadata: request.metadata.clone(),
                created_at: self.now(),
                service_tier,
            })
        };
        let engine = record
            .engine()
            .and_then(|kind| self.inner.workers.engines().get(kind));
        if let Some(engine) = engine {
            engine.check(&task.spec).map_err(|unsupported| {
                let error = ValidationError::new(unsupported.param, unsupported.message);
                AppError::Invalid(error.in_shape(request.shape))
            })?;
        }
        Ok(task)
    }

    /// The conversation of an earlier response (its input and output) followed by `input`.
    async fn continued_input(
        &self,
        caller: &Caller,
        previous: ResponseId,
        input: &Input,
    ) -> Result<Input, AppError> {
        let unknown = || AppError::UnknownReference {
            param: "previous_response_id",
            message: format!("no response `{previous}`"),
        };
        let earlier = self
            .inner
            .core
            .store
            .task_by_response(previous)
            .await?
            .filter(|task| caller.may_see(task))
            .ok_or_else(unknown)?;
        let response = self
            .inner
            .core
            .store
            .response(earlier.id)
            .await?
            .ok_or_else(|| {
                AppError::Invalid(lmsp_domain::validation::ValidationError::new(
                    "previous_response_id",
                    format!(
                        "the response `{previous}` is {}, not completed",
                        earlier.status
                    ),
                ))
            })?;
        let mut messages = earlier.spec.input.messages();
        messages.push(Message {
            tool_calls: response
                .calls
                .iter()
                .map(|call| ToolCall {
                    call_id: call.item.call_id(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                })
                .collect(),
            ..Message::new(Role::Assistant, response.output_text)
        });
        messages.extend(input.messages());
        Ok(Input::Messages(messages))
    }
}
