//! The one flow of a request that creates a task (`POST /v1/responses`,
//! `POST /v1/chat/completions`): validate, claim the idempotency key, create the task with the
//! reply a retry is to get, then answer per `background` and `stream` in the route's rendering;
//! and the replay of a reply kept under a key.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use lmsp_app::{Caller, Claimed, KeyHold, Submitted};
use lmsp_domain::idempotency::Operation;
use lmsp_domain::validation::{validate_submit, SubmitDraft};
use lmsp_domain::{Task, TaskId, TaskStatus};

use crate::error::{ApiError, ErrorCode};
use crate::extract::{idempotency_key, BodyDigest};
use crate::replies::{replayed, with_task_header, FromTask, ReplyDoc};
use crate::routes::ApiResult;
use crate::sse;
use crate::wire::chat::{self, ChunkRenderer};
use crate::wire::native;
use crate::wire::openai::{self, StreamRenderer};
use crate::AppState;

/// How a task request's replies look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    /// OpenAI's Responses: the response object, and its stream events.
    Responses,
    /// OpenAI's chat completions; with `include_usage`, a stream ends with a usage chunk.
    Chat {
        /// `stream_options.include_usage`.
        include_usage: bool,
    },
}

impl Rendering {
    fn operation(self) -> Operation {
        match self {
            Rendering::Responses => Operation::CreateResponse,
            Rendering::Chat { .. } => Operation::CreateChatCompletion,
        }
    }
}

/// Runs the flow; `digest` is the request body's (computed only for an idempotency key).
pub async fn create_task(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    draft: SubmitDraft,
    digest: BodyDigest,
    rendering: Rendering,
) -> ApiResult<Response> {
    let key = idempotency_key(headers)?;
    let request =
        validate_submit(draft).map_err(|e| ApiError::from(lmsp_app::AppError::from(e)))?;
    let service = &state.service;
    let hold = match key {
        None => None,
        Some(key) => match service
            .claim_key(caller, rendering.operation(), key, digest.compute())
            .await?
        {
            Claimed::Proceed(hold) => Some(hold),
            Claimed::Replay(reply) => {
                return replay(state, caller, &ReplyDoc::of_stored(&reply)?, rendering).await
            }
        },
    };
    // The reply a retry with the same key gets, committed with the task (I-8): a background
    // request's whole 202; for a synchronous or streaming one a pointer to the task, whose
    // outcome or events a retry is given, so a retry after a dropped connection or a crash never
    // starts a second task. The first 202 is sent from the same kept reply, so a replay is the
    // same bytes by construction.
    let stream = request.stream;
    let background = request.background && !stream;
    let reply_of = |task: &Task| -> ReplyDoc {
        if stream {
            ReplyDoc::from_task(task.id, FromTask::Events)
        } else if background {
            let body = openai::response(task, None);
            ReplyDoc::whole(
                StatusCode::ACCEPTED,
                &body,
                Some(format!("/v1/tasks/{}", task.id)),
                Some(task.id),
            )
            .unwrap_or_else(|_| ReplyDoc::from_task(task.id, FromTask::Outcome))
        } else {
            ReplyDoc::from_task(task.id, FromTask::Outcome)
        }
    };
    let stored_reply_of = |task: &Task| reply_of(task).stored();
    let task = match service
        .submit(caller, &request, hold.as_ref(), &stored_reply_of)
        .await?
    {
        Submitted::Created(task) => task,
        Submitted::Replay(reply) => {
            release(hold).await;
            return replay(state, caller, &ReplyDoc::of_stored(&reply)?, rendering).await;
        }
    };
    if stream {
        // The kept reply (the task's events) is complete: a retry may stream them at once.
        release(hold).await;
        return stream_task(state, caller, task, rendering).await;
    }
    if background {
        release(hold).await;
        return Ok(reply_of(&task).to_response());
    }
    // Synchronous: the key is held while the task runs; its outcome is kept with the key, so a
    // retry gets it even after the task is purged.
    let outcome = outcome(state, caller, task.id, rendering).await;
    if let (Some(hold), Ok(doc)) = (&hold, &outcome) {
        if let Err(error) = hold.answer(doc.stored()).await {
            tracing::warn!(%error, "a synchronous outcome was not kept with its key");
        }
    }
    release(hold).await;
    Ok(match outcome {
        Ok(doc) => doc.to_response(),
        Err(error) => with_task_header(error.into_response(), task.id),
    })
}

async fn release(hold: Option<KeyHold>) {
    if let Some(hold) = hold {
        hold.release().await;
    }
}

/// Gives a kept reply again (`Idempotent-Replayed: true`): as kept, or rebuilt from its task.
async fn replay(
    state: &AppState,
    caller: &Caller,
    doc: &ReplyDoc,
    rendering: Rendering,
) -> ApiResult<Response> {
    let response = match (doc.from_task, doc.task()?) {
        (Some(FromTask::Outcome), Some(task_id)) => {
            match outcome(state, caller, task_id, rendering).await {
                Ok(doc) => doc.to_response(),
                Err(error) => with_task_header(error.into_response(), task_id),
            }
        }
        (Some(FromTask::Events), Some(task_id)) => {
            let task = state.service.task(caller, task_id).await?;
            stream_task(state, caller, task, rendering).await?
        }
        (Some(_), None) => return Err(ApiError::not_found()),
        (None, _) => doc.to_response(),
    };
    Ok(replayed(response))
}

/// A task's events from the first, in the rendering.
async fn stream_task(
    state: &AppState,
    caller: &Caller,
    task: Task,
    rendering: Rendering,
) -> ApiResult<Response> {
    let task_id = task.id;
    let events = state.service.follow_events(caller, task_id, 0).await?;
    let stopping = state.service.stopping();
    let response = match rendering {
        Rendering::Responses => sse::openai_stream(events, StreamRenderer::new(task), stopping),
        Rendering::Chat { include_usage } => {
            sse::chat_stream(events, ChunkRenderer::new(task, include_usage), stopping)
        }
    };
    Ok(with_task_header(response, task_id))
}

/// Waits for a task to end and gives the reply a synchronous request gets: 200 with the
/// response (or chat completion), 409 `task_cancelled`, or 500 with the task's error code. When
/// the service stops first: 503 with the task's id and `Retry-After`.
async fn outcome(
    state: &AppState,
    caller: &Caller,
    task_id: TaskId,
    rendering: Rendering,
) -> ApiResult<ReplyDoc> {
    let service = &state.service;
    let finished = tokio::select! {
        finished = service.wait_finished(task_id, None) => finished?,
        () = service.stopping() => None,
    };
    let Some(task) = finished else {
        return Err(stopping_with_task(task_id));
    };
    match task.status {
        TaskStatus::Completed => {
            let response = service.completed_response(caller, task.id).await?;
            match rendering {
                Rendering::Responses => ReplyDoc::whole(
                    StatusCode::OK,
                    &openai::response(&task, Some(&response)),
                    None,
                    Some(task.id),
                ),
                Rendering::Chat { .. } => ReplyDoc::whole(
                    StatusCode::OK,
                    &chat::completion(&task, &response),
                    None,
                    Some(task.id),
                ),
            }
        }
        TaskStatus::Cancelled => {
            let error = ApiError::task_cancelled();
            ReplyDoc::whole(error.status, &error.envelope(), None, Some(task.id))
        }
        _ => {
            let task_error = task.error.clone().unwrap_or_else(|| {
                lmsp_domain::TaskError::new(
                    lmsp_domain::TaskErrorCode::EngineError,
                    "the task failed",
                )
            });
            let error = ApiError::task_failed(&task_error);
            ReplyDoc::whole(error.status, &error.envelope(), None, Some(task.id))
        }
    }
}

/// The 503 a waiting request gets when the service stops under it.
fn stopping_with_task(task_id: TaskId) -> ApiError {
    ApiError::new(
        ErrorCode::ServiceUnavailable,
        format!("the service is stopping; task {task_id} goes on after its restart"),
    )
}

/// The native event stream of a task from `after`.
pub async fn native_events(
    state: &AppState,
    caller: &Caller,
    task_id: TaskId,
    after: u64,
) -> ApiResult<Response> {
    let task = state.service.task(caller, task_id).await?;
    let events = state.service.follow_events(caller, task_id, after).await?;
    let response = sse::native_stream(events, task, state.service.stopping());
    Ok(with_task_header(response, task_id))
}

/// The OpenAI event stream of a task from `after`.
pub async fn openai_events(
    state: &AppState,
    caller: &Caller,
    task: Task,
    after: u64,
) -> ApiResult<Response> {
    let task_id = task.id;
    let events = state.service.follow_events(caller, task_id, after).await?;
    let response = sse::openai_stream(events, StreamRenderer::new(task), state.service.stopping());
    Ok(with_task_header(response, task_id))
}

/// A task object reply with its header (used by cancels).
pub fn task_reply(status: StatusCode, task: &Task) -> Response {
    let mut response = crate::routes::json_reply(status, native::task(task));
    if let Ok(value) = HeaderValue::from_str(&task.id.to_string()) {
        response
            .headers_mut()
            .insert(crate::replies::TASK_ID_HEADER, value);
    }
    response
}
