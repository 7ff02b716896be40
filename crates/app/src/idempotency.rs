//! Idempotency keys as one use case (I-8) for every idempotent operation: a request with a key
//! claims it (hold → look up → decide, in one store transaction), acts, commits the reply a retry
//! is to get together with what it created, lets go of the key, and a repeat gets that reply again
//! instead of acting twice. The driving adapter only reads the key and the request's digest, and
//! encodes the replies it wants kept ([`TaskReplies`] for task requests, a function for models):
//! the app keeps those bytes and hands them back without looking inside; the rules are the
//! domain's ([`lmsp_domain::idempotency::decide`], [`lmsp_domain::idempotency::settle`]), and the
//! hold lives in the store, so it holds across processes.
//!
//! A request that creates a task keeps, with the task, the reply a retry gets: a background
//! request its whole 202; a synchronous or streaming request a pointer to the task, since its
//! reply is not known yet. When a synchronous request's task finishes, its final reply is kept with
//! the key (settled) by a job of its own, so it is kept even if the waiting client went away, and
//! a retry gets the same bytes after the task was purged or deleted. A stream's key keeps its
//! pointer: once its task is gone, a retry is told so ([`TaskAnswer::Gone`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lmsp_domain::auth::Scope;
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, Operation,
    RequestDigest, StoredReply,
};
use lmsp_domain::validation::SubmitRequest;
use lmsp_domain::{Response, Task, TaskId, TaskStatus, Timestamp};

use crate::clients::Caller;
use crate::error::AppError;
use crate::service::Service;
use crate::tasks::{Created, KeptFor};

/// The `Idempotency-Key` of a request and the digest of the request's canonical form, as the
/// driving adapter read them.
#[derive(Debug, Clone)]
pub struct IdempotentRequest {
    /// The key.
    pub key: IdempotencyKey,
    /// The digest of the request's canonical form.
    pub digest: RequestDigest,
}

/// What an idempotent operation that creates no task answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keyed<T> {
    /// It ran now.
    Fresh(T),
    /// The same request was answered before: the reply kept under the key, to give again as it
    /// is (`Idempotent-Replayed`).
    Replay(StoredReply),
}

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

/// What claiming a request's key found.
pub(crate) enum Claim {
    /// The request has no key.
    Unkeyed,
    /// The request holds the key and goes on; let go with [`KeyHold::release`] once answered.
    Held(KeyHold),
    /// The same request was answered before: the claim it made and the reply kept.
    Replay(KeyClaim, StoredReply),
}

/// A request's hold on its key. Dropping it without [`KeyHold::release`] lets go in the
/// background; a process that dies lets go when its instance is recovered.
#[derive(Debug)]
pub(crate) struct KeyHold {
    service: Service,
    claim: KeyClaim,
    released: AtomicBool,
}

impl Service {
    /// Claims the key of a request to `operation`, if it has one: 409 ([`AppError::KeyInUse`])
    /// while another request holds it, 422 ([`AppError::KeyReused`]) for a key answered to
    /// another request, the kept reply for the same request again.
    pub(crate) async fn claim(
        &self,
        caller: &Caller,
        operation: Operation,
        key: Option<IdempotentRequest>,
    ) -> Result<Claim, AppError> {
        let Some(IdempotentRequest { key, digest }) = key else {
            return Ok(Claim::Unkeyed);
        };
        let settings = &self.inner.settings;
        let claim = KeyClaim {
            scope: IdempotencyScope {
                client_id: caller.client_id,
                operation,
            },
            key,
            digest,
            holder: self.inner.instance,
            hold_until: self.after(settings.idempotency_hold),
            expires_at: self.after(settings.idempotency_ttl),
        };
        match self.inner.store.claim_key(&claim, self.now()).await? {
            KeyDecision::Proceed => Ok(Claim::Held(KeyHold {
                service: self.clone(),
                claim,
                released: AtomicBool::new(false),
            })),
            KeyDecision::Replay(reply) => Ok(Claim::Replay(claim, reply)),
            KeyDecision::InUse => Err(AppError::KeyInUse),
            KeyDecision::Reused => Err(AppError::KeyReused),
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
        let hold = match self.claim(caller, operation, key).await? {
            Claim::Unkeyed => None,
            Claim::Held(hold) => Some(hold),
            Claim::Replay(claim, kept) => {
                return self.replay_task(caller, &claim, kept, replies).await;
            }
        };
        let answered = self
            .answer_task(caller, request, hold.as_ref(), replies)
            .await;
        if let Some(hold) = hold {
            hold.release().await;
        }
        answered
    }

    /// Creates the task and answers per the delivery, while the request holds its key.
    async fn answer_task(
        &self,
        caller: &Caller,
        request: &SubmitRequest,
        hold: Option<&KeyHold>,
        replies: Arc<dyn TaskReplies>,
    ) -> Result<TaskReply, AppError> {
        let delivery = Delivery::of(request);
        let kept_for = |task: &Task| match delivery {
            Delivery::Background => replies.accepted(task),
            Delivery::Synchronous => replies.follow(task, FromTask::Outcome),
            Delivery::Stream => replies.follow(task, FromTask::Events),
        };
        let key = hold.map(|hold| (hold, &kept_for as KeptFor<'_>));
        let (task, kept) = match self.create_task(caller, request, key).await? {
            Created::Task { task, kept } => (task, kept),
            // This request's hold ran out and another one answered under the key meanwhile.
            Created::KeyAnswered(reply) => {
                let Some(hold) = hold else {
                    return Err(AppError::KeyInUse);
                };
                return self.replay_task(caller, &hold.claim, reply, replies).await;
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
                    .map(|(hold, kept)| (hold.claim.clone(), kept));
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
            KeptReply::FromTask(task_id, how) => match self.inner.store.task(task_id).await? {
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
        let job = self.inner.tracker.spawn({
            let service = self.clone();
            async move { service.finished_outcome(task_id, under, replies).await }
        });
        match job.await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::error!(%error, task = %task_id, caller = %caller.client_id,
                    "waiting for a synchronous request's task stopped");
                Err(AppError::Store(
                    lmsp_domain::ports::StoreError::Unavailable(String::from(
                        "the outcome of the task could not be kept",
                    )),
                ))
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
            TaskStatus::Completed => match self.inner.store.response(task_id).await? {
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
        let store = &self.inner.store;
        let settled = store.settle_key(&claim.scope, &claim.key, &kept, reply.clone());
        if let Err(error) = settled.await {
            // A retry rebuilds the same reply from the task as long as the task is kept.
            tracing::warn!(%error, task = %task_id,
                "a synchronous request's final reply was not kept with its key");
        }
        Ok(TaskAnswer::Kept(reply))
    }
}

impl KeyHold {
    /// The digest of the request that holds the key.
    pub(crate) fn digest(&self) -> RequestDigest {
        self.claim.digest
    }

    /// The record that answers the key with `reply` (committed with what the request creates).
    pub(crate) fn answered_record(&self, reply: StoredReply, now: Timestamp) -> IdempotencyRecord {
        self.claim.answered_record(reply, now)
    }

    /// Lets go of the key: its record replays from now on (or, if nothing was answered, the key
    /// is free again).
    pub(crate) async fn release(self) {
        self.released.store(true, Ordering::SeqCst);
        let store = &self.service.inner.store;
        if let Err(error) = store.release_key(&self.claim.scope, &self.claim.key).await {
            tracing::warn!(%error, "an idempotency key was not released; its hold runs out later");
        }
    }
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        // The request was dropped mid-way (its client went away): let go in the background.
        let store = Arc::clone(&self.service.inner.store);
        let (scope, key) = (self.claim.scope.clone(), self.claim.key.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = store.release_key(&scope, &key).await;
            });
        }
    }
}
