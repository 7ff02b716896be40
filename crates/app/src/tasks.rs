//! Tasks: reading tasks, responses and events, cancelling, deleting, waiting for a task to
//! finish. (Creating them is `submit.rs`.)

use std::time::Duration;

use lmsp_domain::auth::Scope;
use lmsp_domain::ports::{CancelOutcome, DeleteOutcome, Page, TaskFilter};
use lmsp_domain::{CancelDecision, Event, ModelId, Response, ResponseId, Task, TaskId, TaskStatus};

use crate::caller::Caller;
use crate::error::AppError;
use crate::service::Service;

/// A cancel the task took (P-4); a finished task refuses it ([`AppError::NotCancellable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    /// The task as the cancel left it.
    pub task: Task,
    /// Where the cancel left it.
    pub state: CancelState,
    /// Whether this request moved the task; `false` when it was cancelled or cancelling already
    /// (the cancel changed nothing).
    pub changed: bool,
}

/// Where an accepted cancel left its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelState {
    /// `cancelled`: it was queued, or was cancelled before.
    Cancelled,
    /// `cancelling`: its worker stops, then acknowledges; it ends `cancelled`.
    Cancelling,
}

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
        match self.inner.core.store.task(task_id).await? {
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
        Ok(self.inner.core.store.list_tasks(filter).await?)
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
        Ok(self.inner.core.store.events(task_id, after, limit).await?)
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
            self.inner.core.store.response(task.id).await?
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
        match self.inner.core.store.task_by_response(response_id).await? {
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
            .core
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
        // A batch line's response stays while its batch runs: the batch's files are written
        // from its tasks, one line each (it goes with the batch, by the retention, after).
        if let Some(line) = &task.batch {
            let batch = self.inner.core.store.batch(line.batch_id).await?;
            if let Some(batch) = batch.filter(|batch| !batch.status.is_finished()) {
                return Err(AppError::Unfinished(batch.status.as_str()));
            }
        }
        match self
            .inner
            .core
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
    pub async fn cancel(&self, caller: &Caller, task_id: TaskId) -> Result<Cancel, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        let store = &self.inner.core.store;
        let (decision, task) = match store
            .cancel(task_id, caller.visibility(), self.now())
            .await?
        {
            CancelOutcome::NotFound => return Err(AppError::NotFound),
            CancelOutcome::Decided { decision, task } => (decision, task),
        };
        let (state, changed) = match decision {
            CancelDecision::CancelledNow => (CancelState::Cancelled, true),
            CancelDecision::AlreadyCancelled => (CancelState::Cancelled, false),
            CancelDecision::CancellingNow => (CancelState::Cancelling, true),
            CancelDecision::AlreadyCancelling => (CancelState::Cancelling, false),
            CancelDecision::NotCancellable => {
                return Err(AppError::NotCancellable(task.status.as_str()))
            }
        };
        Ok(Cancel {
            task,
            state,
            changed,
        })
    }

    /// A cancel that, when the task was running, waits up to `wait` for its worker to stop, so
    /// that the answer usually shows the end (`cancelled`) rather than the `cancelling` of the
    /// few milliseconds the engine takes. A cancel that had to wait longer answers `cancelling`
    /// (the task still ends `cancelled`, P-4).
    pub async fn cancel_and_wait(
        &self,
        caller: &Caller,
        task_id: TaskId,
        wait: Duration,
    ) -> Result<Cancel, AppError> {
        let cancel = self.cancel(caller, task_id).await?;
        if cancel.state != CancelState::Cancelling {
            return Ok(cancel);
        }
        match self.wait_finished(task_id, Some(wait)).await? {
            Some(task) => Ok(Cancel {
                state: CancelState::Cancelled,
                task,
                ..cancel
            }),
            None => Ok(cancel),
        }
    }

    /// Waits until a task is finished and returns it; `None` when `deadline` passes first (or
    /// the service stops).
    pub async fn wait_finished(
        &self,
        task_id: TaskId,
        deadline: Option<Duration>,
    ) -> Result<Option<Task>, AppError> {
        let core = &self.inner.core;
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        let mut live = core.listener.live.subscribe(task_id);
        loop {
            let task = core.store.task(task_id).await?.ok_or(AppError::NotFound)?;
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
                live = core.listener.live.subscribe(task_id);
            }
        }
    }
}
