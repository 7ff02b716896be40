//! `/v1/responses`: OpenAI's Responses API on LMSP's tasks.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use lmsp_domain::ports::ListOrder;

use crate::error::{cancel_status, ApiError, ErrorEnvelope};
use crate::extract::{Authed, JsonBody};
use crate::openapi::{
    Forbidden, InternalError, PayloadTooLarge, ServiceUnavailable, StorageUnavailable,
    Unauthorized, UnsupportedMediaType,
};
use crate::replies::with_task_header;
use crate::routes::submit::{self, Rendering};
use crate::routes::tasks::{parse_limit, parse_order, query_error};
use crate::routes::{json_reply, parse_flag, parse_response_id, parse_sequence, ApiResult};
use crate::wire::input_items::{input_items, InputItemList};
use crate::wire::openai::{self, DeletedResponse, ResponseObject, ResponseStreamEvent};
use crate::wire::requests::CreateResponseRequest;
use crate::AppState;

/// Create a response.
///
/// Creates a task (validated before anything is stored: a rejected request creates no task) and
/// answers, per `background` and `stream`: 202 with the response object at once (`status:
/// queued`, committed with its first event before this reply); 200 with the response once it
/// completes (500 with the task's error code if it fails, 409 `task_cancelled` if it is
/// cancelled meanwhile, both with `x-should-retry: false`); or, with `stream: true`, 200
/// `text/event-stream` of OpenAI's stream events from the first. `Lmsp-Task-Id` names the task
/// on each of these replies. With `Idempotency-Key`, the same key and body get the first reply
/// again with `Idempotent-Replayed: true`.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "responses",
    operation_id = "createResponse",
    security(("bearer" = ["responses:write"])),
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            description = "1–255 visible ASCII characters; scoped to the client and operation."),
    ),
    request_body(content = CreateResponseRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "`background: true`: the response, `queued`.",
            body = ResponseObject,
            headers(
                ("Location" = String, description = "`/v1/tasks/{task_id}`."),
                ("Lmsp-Task-Id" = String, description = "The task's id."),
                ("Idempotent-Replayed" = String, description = "`true` on a replay.")
            )),
        (status = 200, description = "`background: false`: the completed response; or, with \
            `stream: true`, OpenAI's stream events as Server-Sent Events (`id: <seq>`, \
            `event: <type>`, `data: <event JSON>`, the `text/event-stream` schema being one \
            event's `data`), ending after the terminal event.",
            content(
                (ResponseObject = "application/json"),
                (ResponseStreamEvent = "text/event-stream")
            ),
            headers(
                ("Lmsp-Task-Id" = String, description = "The task's id."),
                ("Idempotent-Replayed" = String, description = "`true` on a replay.")
            )),
        (status = 400, description = "`invalid_request` (the body breaks a rule or asks for \
            what LMSP cannot do; `param` names the field) or `invalid_idempotency_key`.",
            body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`model_not_found`: the request names an unknown model; \
            `not_found`: an unknown `previous_response_id`.", body = ErrorEnvelope),
        (status = 409, description = "`task_cancelled` (a waiting request's task was cancelled) \
            or `idempotency_key_in_use`.", body = ErrorEnvelope,
            headers(("Lmsp-Task-Id" = String, description = "The task's id (`task_cancelled`)."))),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, description = "`idempotency_key_reused`: the key was used with another \
            body.", body = ErrorEnvelope),
        (status = 500, description = "A waiting request's task failed: the envelope carries the \
            task's error code; or `internal_error`.", body = ErrorEnvelope,
            headers(("Lmsp-Task-Id" = String, description = "The task's id, when one exists."))),
        (status = 503, response = ServiceUnavailable)
    )
)]
pub async fn create_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    headers: HeaderMap,
    body: JsonBody<CreateResponseRequest>,
) -> ApiResult<Response> {
    let (value, digest) = body.into_parts();
    let draft = value.into_draft()?;
    submit::create_task(
        &state,
        &caller,
        &headers,
        draft,
        digest,
        Rendering::Responses,
    )
    .await
}

/// Query of `GET /v1/responses/{id}` (any other parameter is 400).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RetrieveQuery {
    /// `true`: the response's stream events as Server-Sent Events.
    #[param(value_type = Option<bool>)]
    stream: Option<String>,
    /// For a stream: start after this sequence number (`Last-Event-ID` wins over it).
    #[param(value_type = Option<u64>, minimum = 0)]
    starting_after: Option<String>,
    /// Only empty: nothing extra can be included.
    #[param(value_type = Option<Vec<String>>)]
    #[serde(rename = "include[]", alias = "include")]
    include: Option<String>,
    /// Accepted, with no effect.
    #[param(value_type = Option<bool>)]
    #[allow(dead_code)]
    include_obfuscation: Option<String>,
}

/// A response, in every status of its task.
///
/// Before the task completes, the object is rendered from the task; once it completed, from the
/// stored response. With `stream=true`: OpenAI's stream events of the task's log after
/// `starting_after` (or `Last-Event-ID`), replayed then live, ending after the terminal event.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}",
    tag = "responses",
    operation_id = "getResponse",
    security(("bearer" = ["responses:read"])),
    params(
        ("id" = String, Path, description = "A response id (`resp_…`)."),
        RetrieveQuery,
        ("Last-Event-ID" = Option<u64>, Header,
            description = "For a stream: the last sequence number seen."),
    ),
    responses(
        (status = 200, description = "The response, or its stream: Server-Sent Events \
            (`id: <seq>`, `event: <type>`, `data: <event JSON>`; the `text/event-stream` schema \
            is one event's `data`).",
            content(
                (ResponseObject = "application/json"),
                (ResponseStreamEvent = "text/event-stream")
            ),
            headers(("Lmsp-Task-Id" = String, description = "The task's id."))),
        (status = 400, description = "`invalid_request`: a bad parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown, deleted, purged or \
            another client's.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<RetrieveQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(query) =
        query.map_err(|e| ApiError::new(crate::error::ErrorCode::InvalidRequest, e.body_text()))?;
    let response_id = parse_response_id(&id)?;
    if query.include.as_deref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::invalid(
            "include",
            "including extra output is not supported by LMSP",
        ));
    }
    let wants_stream = match query.stream.as_deref() {
        Some(text) => parse_flag(text, "stream")?,
        None => false,
    };
    let (task, stored) = state.service.response(&caller, response_id).await?;
    if wants_stream {
        let after = match headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
            Some(text) => parse_sequence(text, "Last-Event-ID")?,
            None => match query.starting_after.as_deref() {
                Some(text) => parse_sequence(text, "starting_after")?,
                None => 0,
            },
        };
        return submit::openai_events(&state, &caller, task, after).await;
    }
    let task_id = task.id;
    Ok(with_task_header(
        json_reply(StatusCode::OK, openai::response(&task, stored.as_ref())),
        task_id,
    ))
}

/// How long a cancel of a running response waits for its engine to stop before it answers.
const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// Cancel a response.
///
/// The same atomic cancel as `POST /v1/tasks/{id}/cancel`, answering the response object; a
/// running response's cancel waits up to 1 s for its engine to stop, so the answer is usually
/// 200 `cancelled` (202 `in_progress` when the engine took longer; it still ends `cancelled`),
/// 409 `task_not_cancellable` when it already completed or failed.
#[utoipa::path(
    post,
    path = "/v1/responses/{id}/cancel",
    tag = "responses",
    operation_id = "cancelResponse",
    security(("bearer" = ["responses:write"])),
    params(("id" = String, Path, description = "A response id (`resp_…`).")),
    responses(
        (status = 200, description = "The response, `cancelled`.", body = ResponseObject,
            headers(("Lmsp-Task-Id" = String, description = "The task's id."))),
        (status = 202, description = "The response, still `in_progress`: its worker took \
            longer than 1 s to stop, and it ends `cancelled`.", body = ResponseObject,
            headers(("Lmsp-Task-Id" = String, description = "The task's id."))),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 409, description = "`task_not_cancellable`: completed or failed.",
            body = ErrorEnvelope),
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn cancel_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let response_id = parse_response_id(&id)?;
    let task = state.service.task_of_response(&caller, response_id).await?;
    let cancel = state
        .service
        .cancel_and_wait(&caller, task.id, CANCEL_WAIT)
        .await?;
    let reply = json_reply(
        cancel_status(cancel.state),
        openai::response(&cancel.task, None),
    );
    Ok(with_task_header(reply, cancel.task.id))
}

/// Delete a response.
///
/// Deletes a finished task's response with its task and log (404 afterwards); an unfinished
/// task's is 409 `task_not_finished`.
#[utoipa::path(
    delete,
    path = "/v1/responses/{id}",
    tag = "responses",
    operation_id = "deleteResponse",
    security(("bearer" = ["responses:write"])),
    params(("id" = String, Path, description = "A response id (`resp_…`).")),
    responses(
        (status = 200, description = "Deleted.", body = DeletedResponse),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 409, description = "`task_not_finished`: the task is unfinished.",
            body = ErrorEnvelope),
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn delete_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<DeletedResponse>> {
    let response_id = parse_response_id(&id)?;
    state.service.delete_response(&caller, response_id).await?;
    Ok(Json(DeletedResponse {
        id: response_id.to_string(),
        object: "response.deleted",
        deleted: true,
    }))
}

/// Query of `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct InputItemsQuery {
    /// Items per page, 1…100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// An item id: continue with the items after it, in `order`.
    #[param(value_type = Option<String>)]
    after: Option<String>,
    /// `desc` (default, newest first) or `asc`.
    #[param(value_type = Option<String>)]
    order: Option<String>,
    /// Only empty: nothing extra can be included.
    #[param(value_type = Option<Vec<String>>)]
    #[serde(rename = "include[]", alias = "include")]
    include: Option<String>,
}

/// A response's input items.
///
/// The conversation its task was given: its messages (with the earlier turns of a
/// `previous_response_id`), an earlier assistant turn's function calls, tools' answers.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}/input_items",
    tag = "responses",
    operation_id = "listInputItems",
    security(("bearer" = ["responses:read"])),
    params(
        ("id" = String, Path, description = "A response id (`resp_…`)."),
        InputItemsQuery,
    ),
    responses(
        (status = 200, description = "A page of input items.", body = InputItemList),
        (status = 400, description = "`invalid_request`: a bad parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_input_items(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    query: Result<Query<InputItemsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<InputItemList>> {
    let Query(query) = query.map_err(query_error)?;
    let limit = parse_limit(query.limit.as_deref(), 20, 100)?;
    if query.include.as_deref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::invalid(
            "include",
            "including extra input data is not supported by LMSP",
        ));
    }
    let (task, _) = state
        .service
        .response(&caller, parse_response_id(&id)?)
        .await?;
    let mut items = input_items(&task);
    if parse_order(query.order.as_deref())? == ListOrder::Desc {
        items.reverse();
    }
    if let Some(after) = query.after.as_deref().filter(|a| !a.is_empty()) {
        let at = items
            .iter()
            .position(|item| item.id() == after)
            .ok_or_else(|| ApiError::invalid("after", "`after` must be an item of this list"))?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    Ok(Json(InputItemList::new(items, has_more)))
}
