//! `/v1/chat/completions`: OpenAI's chat completions, each a durable task like any other.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use crate::error::ErrorEnvelope;
use crate::extract::{Authed, JsonBody};
use crate::openapi::{
    Forbidden, PayloadTooLarge, ServiceUnavailable, Unauthorized, UnsupportedMediaType,
};
use crate::routes::submit::{self, Rendering};
use crate::routes::ApiResult;
use crate::wire::chat::{ChatCompletion, ChatStreamData};
use crate::wire::requests::ChatCompletionRequest;
use crate::AppState;

/// Create a chat completion.
///
/// Runs as a task (listed under `/v1/tasks`, recovered per `on_restart`, `Lmsp-Task-Id` on the
/// reply, idempotency keys). Without `stream`: waits, then 200 `chat.completion` (500 with the
/// task's error code if it fails, 409 `task_cancelled` if it is cancelled, both with
/// `x-should-retry: false`). With `stream: true`: `chat.completion.chunk`s as Server-Sent Events
/// (`data: <chunk>`), ending with `data: [DONE]`; with `stream_options.include_usage`, the last
/// chunk before it carries the usage.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "chat",
    operation_id = "createChatCompletion",
    security(("bearer" = ["responses:write"])),
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            description = "1–255 visible ASCII characters; scoped to the client and operation."),
    ),
    request_body(content = ChatCompletionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The completion, or its chunks: Server-Sent Events \
            `data: <chat.completion.chunk>` (the `text/event-stream` schema is one frame's JSON \
            `data`: a chunk, or the error chunk of a task that failed or was cancelled), ending \
            with `data: [DONE]`.",
            content(
                (ChatCompletion = "application/json"),
                (ChatStreamData = "text/event-stream")
            ),
            headers(
                ("Lmsp-Task-Id" = String, description = "The task's id."),
                ("Idempotent-Replayed" = String, description = "`true` on a replay.")
            )),
        (status = 400, description = "`invalid_request` or `invalid_idempotency_key`.",
            body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`model_not_found`.", body = ErrorEnvelope),
        (status = 409, description = "`task_cancelled` or `idempotency_key_in_use`.",
            body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, description = "`idempotency_key_reused`.", body = ErrorEnvelope),
        (status = 500, description = "The task failed: its error code.", body = ErrorEnvelope),
        (status = 503, response = ServiceUnavailable)
    )
)]
pub async fn create_chat_completion(
    State(state): State<AppState>,
    Authed(caller): Authed,
    headers: HeaderMap,
    body: JsonBody<ChatCompletionRequest>,
) -> ApiResult<Response> {
    let (value, digest) = body.into_parts();
    let chat = value.into_draft()?;
    let rendering = Rendering::Chat {
        include_usage: chat.include_usage,
    };
    submit::create_task(&state, &caller, &headers, chat.draft, digest, rendering).await
}
