//! The one flow of a request that creates a task (`POST /v1/responses`,
//! `POST /v1/chat/completions`): read the idempotency key, validate, hand both to the app's
//! [`lmsp_app::Service::request_task`], and render what it answers per `background` and `stream`
//! in the route's rendering; and the encoding of the replies a key keeps ([`TaskReplies`]).

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use lmsp_app::{Caller, IdempotentRequest, KeptReply, TaskAnswer, TaskReplies};
use lmsp_domain::idempotency::{Operation, StoredReply};
use lmsp_domain::validation::{validate_submit, SubmitDraft};
use lmsp_domain::{Response as TaskResponse, Task, TaskId, TaskStatus};

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
    let key = key.map(|key| IdempotentRequest {
        key,
        digest: digest.compute(),
    });
    let reply = state
        .service
        .request_task(
            caller,
            rendering.operation(),
            &request,
            key,
            Arc::new(Replies(rendering)),
        )
        .await?;
    let response = match reply.answer {
        TaskAnswer::Accepted(task) => accepted(&task).to_response(),
        TaskAnswer::Finished { task, response } => {
            finished(&task, response.as_ref(), rendering).to_response()
        }
        TaskAnswer::Stream(task) => stream_task(state, caller, task, rendering).await?,
        TaskAnswer::Kept(kept) => {
            let doc = ReplyDoc::of_stored(&kept)?;
            if doc.from_task.is_some() {
                // A pointer whose task it could not name: nothing to give again.
                return Err(ApiError::not_found());
            }
            doc.to_response()
        }
        TaskAnswer::Stopping(task_id) => {
            with_task_header(stopping_with_task(task_id).into_response(), task_id)
        }
        TaskAnswer::Gone(task_id) => with_task_header(gone(task_id).into_response(), task_id),
    };
    Ok(if reply.replayed {
        replayed(response)
    } else {
        response
    })
}

/// The replies a task request's key keeps, in this edge's encoding ([`ReplyDoc`]).
struct Replies(Rendering);

impl TaskReplies for Replies {
    fn accepted(&self, task: &Task) -> StoredReply {
        accepted(task).stored()
    }

    fn follow(&self, task: &Task, how: lmsp_app::FromTask) -> StoredReply {
        let how = match how {
            lmsp_app::FromTask::Outcome => FromTask::Outcome,
            lmsp_app::FromTask::Events => FromTask::Events,
        };
        ReplyDoc::from_task(task.id, how).stored()
    }

    fn finished(&self, task: &Task, response: Option<&TaskResponse>) -> StoredReply {
        finished(task, response, self.0).stored()
    }

    fn read(&self, kept: &StoredReply) -> KeptReply {
        let Ok(doc) = ReplyDoc::of_stored(kept) else {
            return KeptReply::Whole;
        };
        match (doc.from_task, doc.task()) {
            (Some(FromTask::Outcome), Ok(Some(task_id))) => {
                KeptReply::FromTask(task_id, lmsp_app::FromTask::Outcome)
            }
            (Some(FromTask::Events), Ok(Some(task_id))) => {
                KeptReply::FromTask(task_id, lmsp_app::FromTask::Events)
            }
            _ => KeptReply::Whole,
        }
    }
}

/// The 202 of a background request: the response object, `Location` and the task's id.
fn accepted(task: &Task) -> ReplyDoc {
    let body = openai::response(task, None);
    ReplyDoc::whole(
        StatusCode::ACCEPTED,
        &body,
        Some(format!("/v1/tasks/{}", task.id)),
        Some(task.id),
    )
    .unwrap_or_else(|error| unrenderable(error, task.id))
}

/// The reply of a synchronous request whose task finished: 200 with the response (or chat
/// completion), 409 `task_cancelled`, or 500 with the task's error code; each naming the task.
pub(crate) fn finished(
    task: &Task,
    response: Option<&TaskResponse>,
    rendering: Rendering,
) -> ReplyDoc {
    let doc = match (task.status, response) {
        (TaskStatus::Completed, Some(response)) => match rendering {
            Rendering::Responses => ReplyDoc::whole(
                StatusCode::OK,
                &openai::response(task, Some(response)),
                None,
                Some(task.id),
            ),
            Rendering::Chat { .. } => ReplyDoc::whole(
                StatusCode::OK,
                &chat::completion(task, response),
                None,
                Some(task.id),
            ),
        },
        (TaskStatus::Cancelled, _) => {
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
    };
    doc.unwrap_or_else(|error| unrenderable(error, task.id))
}

/// The reply kept when a reply cannot be encoded (never expected: the wire shapes are plain).
fn unrenderable(error: ApiError, task_id: TaskId) -> ReplyDoc {
    tracing::error!(message = %error.message, task = %task_id, "a reply could not be encoded");
    let internal = ApiError::new(
        ErrorCode::InternalError,
        "the service failed to answer; it has been logged",
    );
    ReplyDoc {
        status: internal.status.as_u16(),
        body: serde_json::to_string(&internal.envelope()).unwrap_or_default(),
        location: None,
        task_id: Some(task_id.to_string()),
        from_task: None,
    }
}

/// The 404 a retry gets when its key points at a task that is gone and kept no reply of it.
fn gone(task_id: TaskId) -> ApiError {
    let mut error = ApiError::new(
        ErrorCode::NotFound,
        format!(
            "task {task_id}, created under this idempotency key, was purged or deleted, and its \
             reply went with it; the key starts no new task until it expires"
        ),
    );
    error.final_answer = true;
    error
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
