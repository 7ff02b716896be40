//! Tasks: submitting work, reading tasks, responses and events, cancelling, deleting.

use std::time::Duration;

use rand::RngCore;

use lmsp_domain::auth::Scope;
use lmsp_domain::idempotency::{decide, KeyDecision, StoredReply};
use lmsp_domain::ports::{CancelOutcome, CreateOutcome, DeleteOutcome, Page, TaskFilter};
use lmsp_domain::validation::SubmitRequest;
use lmsp_domain::{
    CancelDecision, Event, Input, Message, ModelId, NewTask, Response, ResponseId, Role, Task,
    TaskId, TaskSpec, TaskStatus,
};

use crate::clients::Caller;
use crate::error::AppError;
use crate::idempotency::KeyHold;
use crate::service::Service;

/// What creating a task under a key produced.
// `Task` is not boxed: the value is matched at once and returned once per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(crate) enum Created {
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

/// How the reply a key keeps is encoded from the task a request created.
pub(crate) type KeptFor<'a> = &'a (dyn Fn(&Task) -> StoredReply + Sync);

/// Which tasks a caller lists.
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    /// Only these statuses; empty for all.
    pub statuses: Vec<TaskStatus>,
    /// Only this model's.
    pub model: Option<ModelId>,
    /// Only this client's (an admin's choice; other callers see only their own anyway).
    pub client: Option<lmsp_domain::ClientId>,
    /// Only tasks older than this one.
    pub before: Option<TaskId>,
    /// At most this many.
    pub limit: usize,
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

    /// P-2, I-8: creates the task a request asks for with its first event and, when the request
    /// holds an idempotency key, the key's record answered with `kept_for(task)` (the reply a
    /// retry is to get), in one transaction; returns only after the commit.
    pub(crate) async fn create_task(
        &self,
        caller: &Caller,
        request: &SubmitRequest,
        key: Option<(&KeyHold, KeptFor<'_>)>,
    ) -> Result<Created, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        if self.is_shutting_down() {
            return Err(AppError::ShuttingDown);
        }
        let inner = &self.inner;
        if inner.store.model(&request.model).await?.is_none() {
            return Err(AppError::ModelNotFound(request.model.to_string()));
        }
        let input = match request.previous_response_id {
            Some(previous) => {
                self.continued_input(caller, previous, &request.input)
                    .await?
            }
            None => request.input.clone(),
        };
        let seed = request.seed.unwrap_or_else(|| rand::rngs::OsRng.next_u64());
        let task = Task::new_queued(NewTask {
            id: TaskId::from_ulid(self.next_ulid()),
            client_id: caller.client_id,
            owner: inner.instance,
            model: request.model.clone(),
            on_restart: request
                .on_restart
                .unwrap_or(inner.settings.default_on_restart),
            background: request.background,
            spec: TaskSpec {
                input,
                instructions: request.instructions.clone(),
                max_output_tokens: request.max_output_tokens,
                seed,
                temperature: request.temperature,
                top_p: request.top_p,
                previous_response_id: request.previous_response_id,
            },
            metadata: request.metadata.clone(),
            created_at: self.now(),
        });
        let kept = key.map(|(_, kept_for)| kept_for(&task));
        let record = key
            .zip(kept.clone())
            .map(|((held, _), kept)| held.answered_record(kept, self.now()));
        match inner.store.create_task(task, record).await? {
            CreateOutcome::Created(task) => {
                inner.work_available.notify_one();
                Ok(Created::Task { task, kept })
            }
            // Only when this request's hold ran out and another request answered under the key.
            CreateOutcome::KeyAnswered(record) => {
                let digest = key.map_or(record.digest, |(held, _)| held.digest());
                match decide(Some(&record), &digest, self.now()) {
                    KeyDecision::Replay(reply) => Ok(Created::KeyAnswered(reply)),
                    KeyDecision::InUse => Err(AppError::KeyInUse),
                    _ => Err(AppError::KeyReused),
                }
            }
        }
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
            .store
            .task_by_response(previous)
            .await?
            .filter(|task| caller.may_see(task))
            .ok_or_else(unknown)?;
        let response = self
            .inner
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
            role: Role::Assistant,
            content: response.output_text,
        });
        messages.extend(input.messages());
        Ok(Input::Messages(messages))
    }

    /// A task the caller may see.
    pub async fn task(&self, caller: &Caller, task_id: TaskId) -> Result<Task, AppError> {
        caller.require(Scope::ResponsesRead)?;
        self.visible_task(caller, task_id).await
    }

    pub(crate) async fn visible_task(
        &self,
        caller: &Caller,
        task_id: TaskId,
    ) -> Result<Task, AppError> {
        match self.inner.store.task(task_id).await? {
            Some(task) if caller.may_see(&task) => Ok(task),
            _ => Err(AppError::NotFound),
        }
    }

    /// The caller's tasks (every task for an admin), newest first.
    pub async fn list_tasks(
        &self,
        caller: &Caller,
        query: TaskQuery,
    ) -> Result<Page<Task>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        let client_id = match caller.visibility() {
            Some(own) => Some(own),
            None => query.client,
        };
        if caller.visibility().is_some() && query.client.is_some_and(|c| c != caller.client_id) {
            // Another client's tasks are invisible: the list is empty, not an error.
            return Ok(Page {
                items: Vec::new(),
                has_more: false,
            });
        }
        let filter = TaskFilter {
            client_id,
            statuses: query.statuses,
            model: query.model,
            before: query.before,
            limit: query.limit,
        };
        Ok(self.inner.store.list_tasks(filter).await?)
    }

    /// Stored events of a task after `after`.
    pub async fn events(
        &self,
        caller: &Caller,
        task_id: TaskId,
        after: u64,
        limit: usize,
    ) -> Result<Page<Event>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        self.visible_task(caller, task_id).await?;
        Ok(self.inner.store.events(task_id, after, limit).await?)
    }

    /// A response in every status of its task: the task, and the stored response once it
    /// completed.
    pub async fn response(
        &self,
        caller: &Caller,
        response_id: ResponseId,
    ) -> Result<(Task, Option<Response>), AppError> {
        caller.require(Scope::ResponsesRead)?;
        let task = self.task_of_response(caller, response_id).await?;
        let response = if task.status == TaskStatus::Completed {
            self.inner.store.response(task.id).await?
        } else {
            None
        };
        Ok((task, response))
    }

    /// The task of a response the caller may see.
    pub async fn task_of_response(
        &self,
        caller: &Caller,
        response_id: ResponseId,
    ) -> Result<Task, AppError> {
        match self.inner.store.task_by_response(response_id).await? {
            Some(task) if caller.may_see(&task) => Ok(task),
            _ => Err(AppError::NotFound),
        }
    }

    /// The stored response of a completed task the caller may see.
    pub async fn completed_response(
        &self,
        caller: &Caller,
        task_id: TaskId,
    ) -> Result<Response, AppError> {
        self.visible_task(caller, task_id).await?;
        self.inner
            .store
            .response(task_id)
            .await?
            .ok_or(AppError::NotFound)
    }

    /// Deletes a finished task's response with its log (404 afterwards); an unfinished one stays.
    pub async fn delete_response(
        &self,
        caller: &Caller,
        response_id: ResponseId,
    ) -> Result<TaskId, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        let task = self.task_of_response(caller, response_id).await?;
        match self
            .inner
            .store
            .delete_finished(task.id, caller.visibility())
            .await?
        {
            DeleteOutcome::Deleted => Ok(task.id),
            DeleteOutcome::Unfinished => Err(AppError::Unfinished(task.status.as_str())),
            DeleteOutcome::NotFound => Err(AppError::NotFound),
        }
    }

    /// P-4: cancels a task; its worker, wherever it runs, hears of it from the committed
    /// `response.cancelling`.
    pub async fn cancel(
        &self,
        caller: &Caller,
        task_id: TaskId,
    ) -> Result<(CancelDecision, Task), AppError> {
        caller.require(Scope::ResponsesWrite)?;
        match self
            .inner
            .store
            .cancel(task_id, caller.visibility(), self.now())
            .await?
        {
            CancelOutcome::NotFound => Err(AppError::NotFound),
            CancelOutcome::Decided {
                decision: CancelDecision::NotCancellable,
                task,
            } => Err(AppError::NotCancellable(task.status.as_str())),
            CancelOutcome::Decided { decision, task } => Ok((decision, task)),
        }
    }

    /// Waits until a task is finished and returns it; `None` when `deadline` passes first (or
    /// the service stops).
    pub async fn wait_finished(
        &self,
        task_id: TaskId,
        deadline: Option<Duration>,
    ) -> Result<Option<Task>, AppError> {
        let inner = &self.inner;
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        let mut live = inner.listener.live.subscribe(task_id);
        loop {
            let task = inner.store.task(task_id).await?.ok_or(AppError::NotFound)?;
            if task.status.is_finished() {
                return Ok(Some(task));
            }
            let wake = tokio::time::sleep(Duration::from_secs(1));
            let end = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = live.recv() => {}
                () = wake => {}
                () = end => return Ok(None),
            }
            if live.is_closed() {
                live = inner.listener.live.subscribe(task_id);
            }
        }
    }
}
