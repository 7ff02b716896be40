//! The handlers: parse, call a use case, render. One function per route.
//!
//! Each handler's `#[utoipa::path]` is its OpenAPI operation: method, path, security, parameters,
//! bodies, every status and header. The route table in `lib.rs` registers a handler through it,
//! so a route cannot be served without being documented, nor documented without being served.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::IntoParams;

use lmsp_app::{AppError, Caller, SubmitReply};
use lmsp_domain::auth::Scope;
use lmsp_domain::idempotency::{
    decide, IdempotencyDecision, IdempotencyKey, IdempotencyRecord, IdempotencyScope,
    ReplyFromTask, RequestDigest, StoredReply,
};
use lmsp_domain::validation::validate_submit;
use lmsp_domain::{
    CancelReply, ClientId, ErrorCode, Event, ModelId, ResponseId, TaskId, TaskStatus,
};

use crate::error::{ApiError, ErrorEnvelope};
use crate::extract::{Authed, JsonBody};
use crate::openapi::{
    Forbidden, InternalError, PayloadTooLarge, RateLimited, ServiceUnavailable, Unauthorized,
    UnsupportedMediaType,
};
use crate::wire::{
    self, ClientList, CreateModelRequest, CreatePairingRequest, CreateResponseRequest, EventList,
    HealthObject, ModelList, ModelObject, PairRequest, PairedObject, PairingObject, ResponseObject,
    ServiceObject, TaskList, TaskObject,
};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

const TASK_ID_HEADER: &str = "lmsp-task-id";

/// Idempotency keys whose first request is still being answered (409 `idempotency_key_in_use`).
#[derive(Debug, Default)]
pub struct IdempotencyLocks(Mutex<HashSet<(ClientId, String, String)>>);

/// Holds one key while its first request is answered; releases it on drop.
struct KeyGuard<'a> {
    locks: &'a IdempotencyLocks,
    entry: (ClientId, String, String),
}

impl IdempotencyLocks {
    fn acquire(&self, scope: &IdempotencyScope, key: &IdempotencyKey) -> Option<KeyGuard<'_>> {
        let entry = (scope.client_id, scope.path.clone(), key.as_str().to_owned());
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Build the guard only when the key was free: a guard dropped here would release the
        // other request's hold (and lock this mutex again while it is held).
        if held.insert(entry.clone()) {
            Some(KeyGuard { locks: self, entry })
        } else {
            None
        }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.remove(&self.entry);
    }
}

fn parse_task_id(text: &str) -> ApiResult<TaskId> {
    TaskId::parse(text).map_err(|_| ApiError::not_found())
}

fn with_task_header(mut response: Response, task_id: TaskId) -> Response {
    if let Ok(value) = HeaderValue::from_str(&task_id.to_string()) {
        response.headers_mut().insert(TASK_ID_HEADER, value);
    }
    response
}

fn json_reply(status: StatusCode, body: impl Serialize) -> Response {
    (status, Json(body)).into_response()
}

/// A 200 whose body is already rendered text of `content_type`.
fn text_reply(content_type: &'static str, text: impl IntoResponse) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        text,
    )
        .into_response()
}

/// A reply body as JSON text (stored under an idempotency key).
fn json_text(body: &impl Serialize) -> ApiResult<String> {
    serde_json::to_string(body).map_err(|error| {
        tracing::error!(%error, "a reply could not be rendered");
        ApiError::new(
            ErrorCode::InternalError,
            "the service failed to answer; it has been logged",
        )
    })
}

/// Liveness.
///
/// Answers as soon as the listener is bound, which happens after recovery has finished.
#[utoipa::path(
    get,
    path = "/v1/health",
    tag = "service",
    operation_id = "health",
    responses((status = 200, description = "The service is up.", body = HealthObject))
)]
pub async fn health() -> Json<HealthObject> {
    Json(wire::health())
}

/// This API's OpenAPI 3.1 document.
///
/// Generated from the route table and the wire types of the code that serves it.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "service",
    operation_id = "openapi",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document.", body = Object,
            content_type = "application/json"),
        (status = 500, response = InternalError)
    )
)]
pub async fn openapi_json() -> ApiResult<Response> {
    let text = crate::openapi::document_json().ok_or_else(|| {
        ApiError::new(
            ErrorCode::InternalError,
            "the OpenAPI document could not be rendered",
        )
    })?;
    Ok(text_reply("application/json", text))
}

/// The service object.
///
/// Any valid token, whatever its scopes.
#[utoipa::path(
    get,
    path = "/v1/service",
    tag = "service",
    operation_id = "getService",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The service and its settings.", body = ServiceObject),
        (status = 401, response = Unauthorized),
        (status = 500, response = InternalError)
    )
)]
pub async fn service_info(
    State(state): State<AppState>,
    Authed(_caller): Authed,
) -> Json<ServiceObject> {
    Json(wire::service(&state.service))
}

/// Reads and checks an `Idempotency-Key` header.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<IdempotencyKey>> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::new(
            ErrorCode::InvalidIdempotencyKey,
            "an idempotency key is 1–255 visible ASCII characters",
        )
        .with_param("Idempotency-Key")
    };
    let text = value.to_str().map_err(|_| invalid())?;
    IdempotencyKey::parse(text).map(Some).map_err(|_| invalid())
}

fn replayed(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// Gives a stored reply again (`Idempotent-Replayed: true`): as stored, or rebuilt from its task
/// for a synchronous or streaming request.
async fn replay(state: &AppState, caller: &Caller, reply: &StoredReply) -> ApiResult<Response> {
    let response = match (reply.from_task, reply.task_id) {
        (Some(ReplyFromTask::Outcome), Some(task_id)) => {
            reply_from_stored(&task_outcome(state, caller, task_id).await?)
        }
        (Some(ReplyFromTask::Events), Some(task_id)) => {
            let events = state.service.follow_events(caller, task_id, 0).await?;
            with_task_header(sse_response(events).into_response(), task_id)
        }
        _ => reply_from_stored(reply),
    };
    Ok(replayed(response))
}

/// An idempotent request in progress: its key, scope and digest.
struct Idempotent {
    scope: IdempotencyScope,
    key: IdempotencyKey,
    digest: RequestDigest,
}

impl Idempotent {
    fn record(&self, state: &AppState, reply: StoredReply) -> IdempotencyRecord {
        let now = state.service.now();
        let ttl =
            i64::try_from(state.service.settings().idempotency_ttl.as_millis()).unwrap_or(i64::MAX);
        IdempotencyRecord {
            scope: self.scope.clone(),
            key: self.key.clone(),
            digest: self.digest,
            reply,
            created_at: now,
            expires_at: now.plus_millis(ttl),
        }
    }
}

/// What a request with an `Idempotency-Key` goes on with: the key, held against concurrent use
/// until the request is answered.
struct Held<'a> {
    key: Idempotent,
    _guard: KeyGuard<'a>,
}

/// Takes a request's key: holds it (409 while another request holds it), then looks it up.
/// `Err(response)` answers at once (a replay); `Ok(None)`: no key; `Ok(Some)`: go on holding it.
async fn hold_idempotency_key<'a>(
    state: &'a AppState,
    caller: &Caller,
    path: &str,
    key: Option<IdempotencyKey>,
    body: &Value,
) -> ApiResult<Result<Option<Held<'a>>, Response>> {
    let Some(key) = key else { return Ok(Ok(None)) };
    let scope = IdempotencyScope {
        client_id: caller.client_id,
        method: "POST".into(),
        path: path.into(),
    };
    // Held before the lookup, so a record stored by a request that just finished is seen.
    let guard = state
        .in_flight
        .acquire(&scope, &key)
        .ok_or_else(key_in_use)?;
    let digest = RequestDigest::of_json(body);
    let stored = state
        .service
        .store()
        .idempotency_record(&scope, &key, state.service.now())
        .await
        .map_err(AppError::from)?;
    if let Some(stored) = stored {
        return match decide(&stored, &digest) {
            IdempotencyDecision::Replay(reply) => Ok(Err(replay(state, caller, &reply).await?)),
            IdempotencyDecision::Reused => Err(key_reused()),
        };
    }
    Ok(Ok(Some(Held {
        key: Idempotent { scope, key, digest },
        _guard: guard,
    })))
}

fn key_reused() -> ApiError {
    ApiError::new(
        ErrorCode::IdempotencyKeyReused,
        "this idempotency key was used with another request body",
    )
    .with_param("Idempotency-Key")
}

fn key_in_use() -> ApiError {
    ApiError::new(
        ErrorCode::IdempotencyKeyInUse,
        "the first request with this idempotency key is still being answered",
    )
    .with_param("Idempotency-Key")
}

fn stored_reply_of(
    status: StatusCode,
    body: &impl Serialize,
    location: Option<String>,
    task_id: Option<TaskId>,
) -> ApiResult<StoredReply> {
    Ok(StoredReply {
        status: status.as_u16(),
        body: json_text(body)?,
        location,
        task_id,
        from_task: None,
    })
}

/// A reply given again from its task rather than stored.
fn reply_from_task(task_id: TaskId, from_task: ReplyFromTask) -> StoredReply {
    StoredReply {
        status: StatusCode::OK.as_u16(),
        body: String::new(),
        location: None,
        task_id: Some(task_id),
        from_task: Some(from_task),
    }
}

/// The reply of a synchronous request, once its task has ended: 200 with the response, 409
/// `task_cancelled`, or 500 with the task's error code.
async fn task_outcome(
    state: &AppState,
    caller: &Caller,
    task_id: TaskId,
) -> ApiResult<StoredReply> {
    let finished = state.service.wait_finished(task_id).await?;
    match finished.status {
        TaskStatus::Completed => {
            let response_id = finished.response_id.ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InternalError,
                    "the completed task has no response",
                )
            })?;
            let response = state.service.response(caller, response_id).await?;
            stored_reply_of(
                StatusCode::OK,
                &wire::response(&response),
                None,
                Some(task_id),
            )
        }
        TaskStatus::Cancelled => {
            let error = ApiError::new(ErrorCode::TaskCancelled, "the task was cancelled");
            stored_reply_of(error.status, &error.envelope(), None, Some(task_id))
        }
        _ => {
            let error = finished
                .error
                .clone()
                .unwrap_or_else(|| lmsp_domain::TaskError {
                    code: lmsp_domain::TaskErrorCode::EngineError,
                    message: "the task failed".into(),
                });
            stored_reply_of(
                StatusCode::INTERNAL_SERVER_ERROR,
                &ErrorEnvelope::new(error.code.as_str(), error.message),
                None,
                Some(task_id),
            )
        }
    }
}

fn reply_from_stored(reply: &StoredReply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    let mut response = (status, reply.body.clone()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(location) = reply
        .location
        .as_deref()
        .and_then(|l| HeaderValue::from_str(l).ok())
    {
        headers.insert(header::LOCATION, location);
    }
    match reply.task_id {
        Some(task_id) => with_task_header(response, task_id),
        None => response,
    }
}

/// Submit work.
///
/// Creates a task (validated before anything is stored: a rejected request creates no task) and
/// answers, per `background` and `stream`: 202 with the task at once; 200 with the response
/// once it completes (500 with the task's error code if it fails, 409 `task_cancelled` if it is
/// cancelled meanwhile); or, with `stream: true`, 200 `text/event-stream` of the task's events
/// from sequence 1 (see `GET /v1/tasks/{id}/events`). `Lmsp-Task-Id` names the task on each of
/// these replies. With `Idempotency-Key`, the same key and body replay the first reply with
/// `Idempotent-Replayed: true` (streams store no reply).
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "responses",
    operation_id = "createResponse",
    security(("bearer" = ["responses:write"])),
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            description = "1–255 visible ASCII characters; scoped to the client, method and path."),
    ),
    request_body(content = CreateResponseRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "`background: true`: the task, committed with its first \
            event before this reply.", body = TaskObject,
            headers(
                ("Location" = String, description = "`/v1/tasks/{id}`."),
                ("Lmsp-Task-Id" = String, description = "The task's id."),
                ("Idempotent-Replayed" = String, description = "`true` on a replay.")
            )),
        (status = 200, description = "`background: false`: the response of the completed task; \
            or, with `stream: true`, the task's events as Server-Sent Events (`id: <seq>`, \
            `event: <type>`, `data: <event JSON>`), closing after the terminal event.",
            content(
                (ResponseObject = "application/json"),
                (String = "text/event-stream")
            ),
            headers(
                ("Lmsp-Task-Id" = String, description = "The task's id."),
                ("Idempotent-Replayed" = String, description = "`true` on a replay.")
            )),
        (status = 400, description = "`invalid_request` (the body breaks a rule; `param` names \
            the field) or `invalid_idempotency_key`.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`model_not_found`: the request names an unknown model.",
            body = ErrorEnvelope),
        (status = 409, description = "`task_cancelled` (a waiting request's task was cancelled) \
            or `idempotency_key_in_use` (the first request with this key is still being \
            answered).", body = ErrorEnvelope,
            headers(("Lmsp-Task-Id" = String, description = "The task's id (`task_cancelled`)."))),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, description = "`idempotency_key_reused`: the key was used with another \
            body.", body = ErrorEnvelope),
        (status = 500, description = "A waiting request's task failed: the envelope carries the \
            task's error code (`model_unavailable`, `engine_error`, …); or `internal_error`.",
            body = ErrorEnvelope,
            headers(("Lmsp-Task-Id" = String, description = "The task's id, when one exists."))),
        (status = 503, response = ServiceUnavailable)
    )
)]
pub async fn create_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    caller.require(Scope::ResponsesWrite)?;
    let key = idempotency_key(&headers)?;
    let request = validate_submit(&body).map_err(|e| ApiError::from(AppError::from(e)))?;
    let held = match hold_idempotency_key(&state, &caller, "/v1/responses", key, &body).await? {
        Ok(held) => held,
        Err(replayed) => return Ok(replayed),
    };
    let task = state.service.prepare_task(&caller, &request).await?;
    let task_id = task.id;
    // The reply a retry with the same key gets, committed with the task (I-8): a background
    // request's whole 202; for a synchronous or streaming one a pointer to the task, whose
    // outcome or events a retry is given, so a retry after a dropped connection or a crash never
    // starts a second task. The first 202 is sent from the same stored reply, so a replay is the
    // same bytes by construction.
    let reply = if request.stream {
        reply_from_task(task_id, ReplyFromTask::Events)
    } else if request.background {
        stored_reply_of(
            StatusCode::ACCEPTED,
            &wire::task(&task),
            Some(format!("/v1/tasks/{task_id}")),
            Some(task_id),
        )?
    } else {
        reply_from_task(task_id, ReplyFromTask::Outcome)
    };
    let record = held
        .as_ref()
        .map(|held| held.key.record(&state, reply.clone()));
    if let SubmitReply::Existing(record) = state.service.submit(task, record).await? {
        // Only when the key was renewed meanwhile (its record had expired): answer from it.
        let digest = held.as_ref().map_or(record.digest, |held| held.key.digest);
        return match decide(&record, &digest) {
            IdempotencyDecision::Replay(reply) => replay(&state, &caller, &reply).await,
            IdempotencyDecision::Reused => Err(key_reused()),
        };
    }
    if request.stream {
        let events = state.service.follow_events(&caller, task_id, 0).await?;
        return Ok(with_task_header(
            sse_response(events).into_response(),
            task_id,
        ));
    }
    if request.background {
        return Ok(reply_from_stored(&reply));
    }
    // Synchronous: wait for the end.
    Ok(reply_from_stored(
        &task_outcome(&state, &caller, task_id).await?,
    ))
}

fn sse_response(
    events: impl Stream<Item = Event> + Send + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static> {
    let stream = events.map(|event| {
        // An event always renders; were it ever not to, the frame says so instead of panicking.
        let data = serde_json::to_string(&wire::event(&event))
            .unwrap_or_else(|_| String::from(r#"{"error": "unrenderable event"}"#));
        Ok(SseEvent::default()
            .id(event.sequence_number.to_string())
            .event(event.kind().wire_name())
            .data(data))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// A response.
///
/// Stored when its task completes; it goes when its task is purged. Another client's response
/// is 404.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}",
    tag = "responses",
    operation_id = "getResponse",
    security(("bearer" = ["responses:read"])),
    params(("id" = String, Path, description = "A response id (`resp_…`).")),
    responses(
        (status = 200, description = "The response.", body = ResponseObject),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown, purged or another \
            client's.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<ResponseObject>> {
    let response_id = ResponseId::parse(&id).map_err(|_| ApiError::not_found())?;
    let response = state.service.response(&caller, response_id).await?;
    Ok(Json(wire::response(&response)))
}

/// Query of `GET /v1/tasks` (any other parameter is 400).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Comma-separated statuses to keep, e.g. `queued,running`; every status when absent.
    #[param(value_type = Option<String>, example = "queued,running")]
    status: Option<String>,
    /// Tasks per page, 1…100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// A task id: continue with the tasks older than it.
    #[param(value_type = Option<String>)]
    after: Option<String>,
}

fn parse_limit(text: Option<&str>, default: usize, max: usize) -> ApiResult<usize> {
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

/// List tasks, newest first.
///
/// A client sees its own tasks; `admin` sees all.
#[utoipa::path(
    get,
    path = "/v1/tasks",
    tag = "tasks",
    operation_id = "listTasks",
    security(("bearer" = ["responses:read"])),
    params(ListQuery),
    responses(
        (status = 200, description = "A page of tasks.", body = TaskList),
        (status = 400, description = "`invalid_request`: a bad `status`, `limit` or `after`, or \
            an unknown parameter.", body = ErrorEnvelope),
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
    let Query(query) =
        query.map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.body_text()))?;
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
    let before = match query.after.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            TaskId::parse(text)
                .map_err(|_| ApiError::invalid("after", "`after` must be a task id"))?,
        ),
    };
    let page = state
        .service
        .list_tasks(&caller, statuses, before, limit)
        .await?;
    Ok(Json(TaskList::new(
        page.items.iter().map(wire::task).collect(),
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
    Ok(Json(wire::task(&task)))
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
        (status = 500, response = InternalError)
    )
)]
pub async fn cancel_task(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    caller.require(Scope::ResponsesWrite)?;
    let task_id = parse_task_id(&id)?;
    let (decision, task) = state.service.cancel(&caller, task_id).await?;
    let status = match decision.reply() {
        CancelReply::Cancelled => StatusCode::OK,
        CancelReply::Accepted => StatusCode::ACCEPTED,
        CancelReply::NotCancellable => StatusCode::CONFLICT,
    };
    Ok(with_task_header(
        json_reply(status, wire::task(&task)),
        task_id,
    ))
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
    let Query(query) =
        query.map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.body_text()))?;
    let task_id = parse_task_id(&id)?;
    let parse_seq = |text: &str, param: &str| {
        text.trim()
            .parse::<u64>()
            .map_err(|_| ApiError::invalid(param, format!("`{param}` must be a sequence number")))
    };
    // An explicit `stream` wins over the `Accept` header.
    let wants_stream = match query.stream.as_deref() {
        Some("true") | Some("1") => true,
        Some("false") | Some("0") => false,
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|accept| accept.contains("text/event-stream")),
        Some(_) => {
            return Err(ApiError::invalid(
                "stream",
                "`stream` must be true or false",
            ))
        }
    };
    let after = match query.after.as_deref() {
        Some(text) => parse_seq(text, "after")?,
        None => 0,
    };
    if wants_stream {
        let after = match headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
            Some(text) => parse_seq(text, "Last-Event-ID")?,
            None => after,
        };
        let events = state.service.follow_events(&caller, task_id, after).await?;
        return Ok(with_task_header(
            sse_response(events).into_response(),
            task_id,
        ));
    }
    let limit = parse_limit(query.limit.as_deref(), 100, 1000)?;
    let page = state.service.events(&caller, task_id, after, limit).await?;
    Ok(Json(EventList::new(
        page.items.iter().map(wire::event).collect(),
        page.has_more,
    ))
    .into_response())
}

/// List models.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "models",
    operation_id = "listModels",
    security(("bearer" = ["models:read"])),
    responses(
        (status = 200, description = "Every registered model.", body = ModelList),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_models(
    State(state): State<AppState>,
    Authed(caller): Authed,
) -> ApiResult<Json<ModelList>> {
    let models = state.service.models(&caller).await?;
    Ok(Json(ModelList::new(
        models.iter().map(wire::model).collect(),
        false,
    )))
}

fn parse_model_id(text: &str) -> ApiResult<ModelId> {
    ModelId::parse(text).map_err(|_| ApiError::not_found())
}

/// A model.
#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    tag = "models",
    operation_id = "getModel",
    security(("bearer" = ["models:read"])),
    params(("id" = String, Path, description = "A model id.")),
    responses(
        (status = 200, description = "The model.", body = ModelObject),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no such model.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_model(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<ModelObject>> {
    caller.require(Scope::ModelsRead)?;
    let model = state.service.model(&caller, &parse_model_id(&id)?).await?;
    Ok(Json(wire::model(&model)))
}

/// Register a model file.
///
/// The service hashes the file (streaming) and stores its path, size and digest; the file stays
/// where it is. With `Idempotency-Key`, the same key and body replay the first reply with
/// `Idempotent-Replayed: true`.
#[utoipa::path(
    post,
    path = "/v1/models",
    tag = "models",
    operation_id = "createModel",
    security(("bearer" = ["models:write"])),
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            description = "1–255 visible ASCII characters; scoped to the client, method and path."),
    ),
    request_body(content = CreateModelRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The registered model.", body = ModelObject,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replay."))),
        (status = 400, description = "`invalid_request` (a bad field, or a path that does not \
            resolve to a regular file inside `--models-dir`) or `invalid_idempotency_key`.",
            body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 409, description = "`already_exists` (the id is taken) or \
            `idempotency_key_in_use`.", body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, description = "`idempotency_key_reused`: the key was used with another \
            body.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn create_model(
    State(state): State<AppState>,
    Authed(caller): Authed,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    caller.require(Scope::ModelsWrite)?;
    let key = idempotency_key(&headers)?;
    let Value::Object(fields) = &body else {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "the body must be a JSON object",
        ));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| k.as_str() != "id" && k.as_str() != "path")
    {
        return Err(ApiError::invalid(
            unknown,
            format!("unknown field `{unknown}`"),
        ));
    }
    let id = match fields.get("id") {
        Some(Value::String(text)) => {
            ModelId::parse(text).map_err(|e| ApiError::invalid("id", e.to_string()))?
        }
        _ => {
            return Err(ApiError::invalid(
                "id",
                "`id` is required and must be a string",
            ))
        }
    };
    let path = match fields.get("path") {
        Some(Value::String(text)) if !text.is_empty() => text.clone(),
        _ => {
            return Err(ApiError::invalid(
                "path",
                "`path` is required and must be a string",
            ))
        }
    };
    let held = match hold_idempotency_key(&state, &caller, "/v1/models", key, &body).await? {
        Ok(held) => held,
        Err(replayed) => return Ok(replayed),
    };
    let record = state.service.register_model(&caller, id, &path).await?;
    let body = wire::model(&record);
    if let Some(held) = &held {
        let reply = stored_reply_of(StatusCode::CREATED, &body, None, None)?;
        state
            .service
            .store()
            .insert_idempotency_record(held.key.record(&state, reply))
            .await
            .map_err(AppError::from)?;
    }
    Ok(json_reply(StatusCode::CREATED, body))
}

/// Unregister a model.
///
/// The file itself is never touched.
#[utoipa::path(
    delete,
    path = "/v1/models/{id}",
    tag = "models",
    operation_id = "deleteModel",
    security(("bearer" = ["models:write"])),
    params(("id" = String, Path, description = "A model id.")),
    responses(
        (status = 204, description = "Unregistered."),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no such model.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn delete_model(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(Scope::ModelsWrite)?;
    state
        .service
        .delete_model(&caller, &parse_model_id(&id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List clients.
///
/// Never with tokens or their hashes.
#[utoipa::path(
    get,
    path = "/v1/clients",
    tag = "clients",
    operation_id = "listClients",
    security(("bearer" = ["admin"])),
    responses(
        (status = 200, description = "Every client, revoked ones included.",
            body = ClientList),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_clients(
    State(state): State<AppState>,
    Authed(caller): Authed,
) -> ApiResult<Json<ClientList>> {
    let clients = state.service.clients(&caller).await?;
    Ok(Json(ClientList::new(
        clients.iter().map(wire::client).collect(),
        false,
    )))
}

/// Revoke a client.
///
/// Its token stops working at once.
#[utoipa::path(
    delete,
    path = "/v1/clients/{id}",
    tag = "clients",
    operation_id = "deleteClient",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "A client id (`cli_…`).")),
    responses(
        (status = 204, description = "Revoked."),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown or already revoked.",
            body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn delete_client(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(Scope::Admin)?;
    let client_id = ClientId::parse(&id).map_err(|_| ApiError::not_found())?;
    state.service.revoke_client(&caller, client_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Any other path: 404 with the envelope.
pub async fn unknown_route() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

/// A known path with another method: 405 with the envelope.
pub async fn method_not_allowed() -> ApiError {
    let mut error = ApiError::new(
        ErrorCode::InvalidRequest,
        "this method is not allowed on this path",
    );
    error.status = StatusCode::METHOD_NOT_ALLOWED;
    error
}

fn parse_scopes(value: Option<&Value>) -> ApiResult<lmsp_domain::auth::Scopes> {
    let Some(Value::Array(items)) = value else {
        return Err(ApiError::invalid(
            "scopes",
            "`scopes` must be a list of scope names",
        ));
    };
    let scopes = items
        .iter()
        .map(|item| {
            item.as_str()
                .ok_or_else(|| ApiError::invalid("scopes", "each scope must be a string"))
                .and_then(|text| {
                    Scope::parse(text).map_err(|e| ApiError::invalid("scopes", e.to_string()))
                })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    if scopes.is_empty() {
        return Err(ApiError::invalid("scopes", "`scopes` must not be empty"));
    }
    Ok(lmsp_domain::auth::Scopes::new(scopes))
}

fn only_fields(body: &Value, allowed: &[&str]) -> ApiResult<()> {
    let Value::Object(fields) = body else {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "the body must be a JSON object",
        ));
    };
    match fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(unknown) => Err(ApiError::invalid(
            unknown,
            format!("unknown field `{unknown}`"),
        )),
        None => Ok(()),
    }
}

/// Create a pairing code.
///
/// A one-time code, valid 10 minutes, that a new client exchanges for a token at
/// `POST /v1/pair`.
#[utoipa::path(
    post,
    path = "/v1/pairings",
    tag = "clients",
    operation_id = "createPairing",
    security(("bearer" = ["admin"])),
    request_body(content = CreatePairingRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The code, shown once.", body = PairingObject),
        (status = 400, description = "`invalid_request`: missing, empty or unknown scopes, or an \
            unknown field.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError)
    )
)]
pub async fn create_pairing(
    State(state): State<AppState>,
    Authed(caller): Authed,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    caller.require(Scope::Admin)?;
    only_fields(&body, &["scopes"])?;
    let scopes = parse_scopes(body.get("scopes"))?;
    let pairing = state.service.create_pairing(&caller, scopes).await?;
    Ok(json_reply(StatusCode::CREATED, wire::pairing(&pairing)))
}

/// Pair a new client.
///
/// Exchanges a pairing code for a new client and its token (shown once). No token needed.
/// After 5 wrong codes within 10 minutes every outstanding code is burnt and this answers 429
/// until that window has passed.
#[utoipa::path(
    post,
    path = "/v1/pair",
    tag = "clients",
    operation_id = "pair",
    request_body(content = PairRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The new client and its token.", body = PairedObject),
        (status = 400, description = "`invalid_request`: a missing or bad field, or an unknown \
            one.", body = ErrorEnvelope),
        (status = 401, description = "`unauthorized`: the code is wrong, used or expired.",
            body = ErrorEnvelope,
            headers(("WWW-Authenticate" = String, description = "Always `Bearer`."))),
        (status = 403, description = "`forbidden`: the scopes asked for are not a subset of the \
            code's.", body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 429, response = RateLimited),
        (status = 500, response = InternalError)
    )
)]
pub async fn pair(State(state): State<AppState>, JsonBody(body): JsonBody) -> ApiResult<Response> {
    only_fields(&body, &["code", "name", "scopes"])?;
    let code = body
        .get("code")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("code", "`code` is required and must be a string"))?;
    let name = match body.get("name") {
        Some(Value::String(name)) if (1..=128).contains(&name.chars().count()) => name.clone(),
        _ => {
            return Err(ApiError::invalid(
                "name",
                "`name` is required: 1–128 characters",
            ))
        }
    };
    let scopes = parse_scopes(body.get("scopes"))?;
    let paired = state
        .service
        .pair(code, &name, scopes)
        .await
        .map_err(|error| match error {
            AppError::Unauthorized => ApiError::new(
                ErrorCode::Unauthorized,
                "the pairing code is wrong, used or expired",
            ),
            other => ApiError::from(other),
        })?;
    Ok(json_reply(StatusCode::CREATED, wire::paired(&paired)))
}

/// The content type of the OpenMetrics text format, which Prometheus scrapes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prometheus metrics.
///
/// Tasks by status, events written, the commit latency histogram, purge and recovery counters,
/// in the OpenMetrics text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    operation_id = "metrics",
    security(("bearer" = ["admin"])),
    responses(
        (status = 200, description = "The metrics.", body = String,
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn metrics(State(state): State<AppState>, Authed(caller): Authed) -> ApiResult<Response> {
    let text = state.service.metrics_text(&caller).await?;
    Ok(text_reply(OPENMETRICS, text))
}
