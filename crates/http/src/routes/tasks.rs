//! `/v1/tasks`: LMSP's own task API — tasks, their cancel, and their event logs.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use lmsp_app::TaskQuery;
use lmsp_domain::ports::ListOrder;
use lmsp_domain::{ClientId, ModelId, TaskId, TaskStatus};

use crate::error::{cancel_status, ApiError, ErrorCode, ErrorEnvelope};
use crate::extract::Authed;
use crate::openapi::{Forbidden, InternalError, StorageUnavailable, Unauthorized};
use crate::routes::submit::{self, task_reply};
use crate::routes::{parse_flag, parse_sequence, parse_task_id, ApiResult};
use crate::wire::native::{self, EventList, TaskList, TaskObject};
use crate::AppState;

/// Query of `GET /v1/tasks` (any other parameter is 400).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Comma-separated statuses to keep, e.g. `queued,running`; every status when absent.
    #[param(value_type = Option<String>, example = "queued,running")]
    status: Option<String>,
    /// Only tasks of this model.
    #[param(value_type = Option<String>)]
    model: Option<String>,
    /// Only tasks of this client (`cli_…`; an admin's filter: others see only their own).
    #[param(value_type = Option<String>)]
    client_id: Option<String>,
    /// Tasks per page, 1…100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// A task id: continue with the tasks older than it.
    #[param(value_type = Option<String>)]
    after: Option<String>,
}

pub(crate) fn parse_limit(text: Option<&str>, default: usize, max: usize) -> ApiResult<usize> {
    match text {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(
                "limit",
                format!("`limit` must be an integer from 1 to {max}"),
            )),
        },
    }
}

/// A list's `order`: `asc` or `desc`, `desc` (newest first) when not given, as OpenAI's lists.
pub(crate) fn parse_order(text: Option<&str>) -> ApiResult<ListOrder> {
    match text {
        None | Some("") => Ok(ListOrder::Desc),
        Some(text) => ListOrder::parse(text)
            .ok_or_else(|| ApiError::invalid("order", "`order` must be `asc` or `desc`")),
    }
}

pub(crate) fn query_error(error: axum::extract::rejection::QueryRejection) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, error.body_text())
}

/// List tasks, newest first.
///
/// A client sees its own tasks; `admin` sees all, and may filter by client.
#[utoipa::path(
    get,
    path = "/v1/tasks",
    tag = "tasks",
    operation_id = "listTasks",
    security(("bearer" = ["responses:read"])),
    params(ListQuery),
    responses(
        (status = 200, description = "A page of tasks.", body = TaskList),
        (status = 400, description = "`invalid_request`: a bad `status`, `model`, `client_id`, \
            `limit` or `after`, or an unknown parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_tasks(
    State(state): State<AppState>,
    Authed(caller): Authed,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<TaskList>> {
    let Query(query) = query.map_err(query_error)?;
    let limit = parse_limit(query.limit.as_deref(), 20, 100)?;
    let statuses = match query.status.as_deref() {
        None | Some("") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|s| {
                TaskStatus::parse(s.trim()).map_err(|e| ApiError::invalid("status", e.to_string()))
            })
            .collect::<ApiResult<Vec<_>>>()?,
    };
    let model = match query.model.as_deref() {
        None | Some("") => None,
        Some(text) => {
            Some(ModelId::parse(text).map_err(|e| ApiError::invalid("model", e.to_string()))?)
        }
    };
    let client = match query.client_id.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            ClientId::parse(text)
                .map_err(|_| ApiError::invalid("client_id", "`client_id` must be a client id"))?,
        ),
    };
    let before = match query.after.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            TaskId::parse(text)
                .map_err(|_| ApiError::invalid("after", "`after` must be a task id"))?,
        ),
    };
    let page = state
        .service
        .list_tasks(
            &caller,
            TaskQuery {
                statuses,
                model,
                client,
                before,
                limit,
            },
        )
        .await?;
    Ok(Json(TaskList::new(
        page.items.iter().map(native::task).collect(),
        page.has_more,
    )))
}

/// A task.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    tag = "tasks",
    operation_id = "getTask",
    security(("bearer" = ["responses:read"])),
    params(("id" = String, Path, description = "A task id (`task_…`).")),
    responses(
        (status = 200, description = "The task.", body = TaskObject),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown, purged or another \
            client's.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_task(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<TaskObject>> {
    let task = state.service.task(&caller, parse_task_id(&id)?).await?;
    Ok(Json(native::task(&task)))
}

/// Cancel a task, atomically.
///
/// `queued` → `cancelled` (200); `loading`/`running` → `cancelling`, and `cancelled` once the
/// worker stops (202); `cancelling` → nothing new (202); `cancelled` → nothing new (200);
/// `completed`/`failed` → 409 `task_not_cancellable`. Once answered 200 or 202, the task ends
/// `cancelled`.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/cancel",
    tag = "tasks",
    operation_id = "cancelTask",
    security(("bearer" = ["responses:write"])),
    params(("id" = String, Path, description = "A task id (`task_…`).")),
    responses(
        (status = 200, description = "The task is `cancelled`.", body = TaskObject,
            headers(("Lmsp-Task-Id" = String, description = "The task's id."))),
        (status = 202, description = "The task is `cancelling`: its worker is stopping.",
            body = TaskObject,
            headers(("Lmsp-Task-Id" = String, description = "The task's id."))),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown, purged or another \
            client's.", body = ErrorEnvelope),
        (status = 409, description = "`task_not_cancellable`: the task is `completed` or \
            `failed`.", body = ErrorEnvelope),
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn cancel_task(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let task_id = parse_task_id(&id)?;
    let cancel = state.service.cancel(&caller, task_id).await?;
    Ok(task_reply(cancel_status(cancel.state), &cancel.task))
}

/// Query of `GET /v1/tasks/{id}/events` (any other parameter is 400).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events with a sequence number above this one (default 0); for a stream,
    /// `Last-Event-ID` wins over it.
    #[param(value_type = Option<u64>, minimum = 0)]
    after: Option<String>,
    /// Events per page, 1…1000 (default 100); ignored by a stream.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// `true` (or `1`): Server-Sent Events, as with `Accept: text/event-stream`.
    #[param(value_type = Option<bool>)]
    stream: Option<String>,
}

/// A task's events: a JSON page, or a live stream.
///
/// JSON: the events with a sequence number above `after`, ascending. With
/// `Accept: text/event-stream` or `stream=true`: Server-Sent Events (`id: <seq>`,
/// `event: <type>`, `data: <event JSON>`) starting after `Last-Event-ID` (or `after`): what is
/// stored, then live, closing after the terminal event; a comment keep-alive every 15 s. No
/// event is sent before it is committed.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/events",
    tag = "tasks",
    operation_id = "listTaskEvents",
    security(("bearer" = ["responses:read"])),
    params(
        ("id" = String, Path, description = "A task id (`task_…`)."),
        EventsQuery,
        ("Accept" = Option<String>, Header,
            description = "`text/event-stream` asks for Server-Sent Events."),
        ("Last-Event-ID" = Option<u64>, Header,
            description = "For a stream: the last sequence number seen; the stream starts after it."),
    ),
    responses(
        (status = 200, description = "A page of events (JSON), or the event stream.",
            content(
                (EventList = "application/json"),
                (String = "text/event-stream")
            ),
            headers(("Lmsp-Task-Id" = String, description = "The task's id (streams)."))),
        (status = 400, description = "`invalid_request`: a bad `after`, `limit`, `stream` or \
            `Last-Event-ID`, or an unknown parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown, purged or another \
            client's.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn task_events(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(query) = query.map_err(query_error)?;
    let task_id = parse_task_id(&id)?;
    // An explicit `stream` wins over the `Accept` header.
    let wants_stream = match query.stream.as_deref() {
        Some(text) => parse_flag(text, "stream")?,
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|accept| accept.contains("text/event-stream")),
    };
    let after = match query.after.as_deref() {
        Some(text) => parse_sequence(text, "after")?,
        None => 0,
    };
    if wants_stream {
        let after = match headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
            Some(text) => parse_sequence(text, "Last-Event-ID")?,
            None => after,
        };
        return submit::native_events(&state, &caller, task_id, after).await;
    }
    let limit = parse_limit(query.limit.as_deref(), 100, 1000)?;
    let task = state.service.task(&caller, task_id).await?;
    let page = state.service.events(&caller, task_id, after, limit).await?;
    // The task as each event left it, for the items an event's rendering names.
    let mut view = task;
    let events = page
        .items
        .iter()
        .map(|event| {
            view.items.follow(&event.payload);
            native::event(event, &view)
        })
        .collect();
    Ok(Json(EventList::new(events, page.has_more)).into_response())
}
