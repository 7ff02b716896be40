//! The handlers: parse, call a use case, render. One function per route.

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
use serde::Deserialize;
use serde_json::{json, Value};

use lmsp_app::{AppError, Caller, SubmitReply};
use lmsp_domain::auth::Scope;
use lmsp_domain::idempotency::{
    decide, IdempotencyDecision, IdempotencyKey, IdempotencyRecord, IdempotencyScope,
    RequestDigest, StoredReply,
};
use lmsp_domain::validation::validate_submit;
use lmsp_domain::{
    model::format_of_path, CancelReply, ClientId, ErrorCode, Event, ModelId, ModelRecord,
    ResponseId, TaskId, TaskStatus,
};

use crate::error::ApiError;
use crate::extract::{Authed, JsonBody};
use crate::{wire, AppState};

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
        held.insert(entry.clone())
            .then_some(KeyGuard { locks: self, entry })
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

fn json_reply(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

/// `GET /v1/health`.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /v1/service` (any token).
pub async fn service_info(State(state): State<AppState>, Authed(_caller): Authed) -> Json<Value> {
    let service = &state.service;
    let settings = service.settings();
    Json(json!({
        "object": "service",
        "id": service.identity().id.to_string(),
        "spec": "LMSP 1.0",
        "version": settings.version,
        "started_at": service.started_at().to_rfc3339(),
        "retention_seconds": settings.retention.as_secs(),
        "default_on_restart": settings.default_on_restart.as_str(),
    }))
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

fn replay(reply: &StoredReply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    let mut response = (status, reply.body.clone()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
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

/// Looks a key up: `Err(response)` answers the request at once (replay, 422); `Ok` carries on.
async fn check_idempotency(
    state: &AppState,
    caller: &Caller,
    path: &str,
    key: Option<IdempotencyKey>,
    body: &Value,
) -> ApiResult<Result<Option<Idempotent>, Response>> {
    let Some(key) = key else { return Ok(Ok(None)) };
    let scope = IdempotencyScope {
        client_id: caller.client_id,
        method: "POST".into(),
        path: path.into(),
    };
    let digest = RequestDigest::of_json(body);
    let stored = state
        .service
        .store()
        .idempotency_record(&scope, &key, state.service.now())
        .await
        .map_err(AppError::from)?;
    if let Some(stored) = stored {
        return match decide(&stored, &digest) {
            IdempotencyDecision::Replay(reply) => Ok(Err(replay(&reply))),
            IdempotencyDecision::Reused => Err(ApiError::new(
                ErrorCode::IdempotencyKeyReused,
                "this idempotency key was used with another request body",
            )
            .with_param("Idempotency-Key")),
        };
    }
    Ok(Ok(Some(Idempotent { scope, key, digest })))
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
    body: &Value,
    location: Option<String>,
    task_id: Option<TaskId>,
) -> StoredReply {
    StoredReply {
        status: status.as_u16(),
        body: body.to_string(),
        location,
        task_id,
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

/// `POST /v1/responses` (`responses:write`).
pub async fn create_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    caller.require(Scope::ResponsesWrite)?;
    let key = idempotency_key(&headers)?;
    let request = validate_submit(&body).map_err(|e| ApiError::from(AppError::from(e)))?;
    let idempotent = match check_idempotency(&state, &caller, "/v1/responses", key, &body).await? {
        Ok(idempotent) => idempotent,
        Err(replayed) => return Ok(replayed),
    };
    let _guard = match &idempotent {
        Some(i) => Some(
            state
                .in_flight
                .acquire(&i.scope, &i.key)
                .ok_or_else(key_in_use)?,
        ),
        None => None,
    };
    let task = state.service.prepare_task(&caller, &request).await?;
    let task_id = task.id;
    let location = format!("/v1/tasks/{task_id}");
    // Background: the key, its reply and the task commit in one transaction (I-8).
    let record = match (&idempotent, request.background && !request.stream) {
        (Some(i), true) => Some(i.record(
            &state,
            stored_reply_of(
                StatusCode::ACCEPTED,
                &wire::task(&task),
                Some(location.clone()),
                Some(task_id),
            ),
        )),
        _ => None,
    };
    let task = match state.service.submit(task, record).await? {
        SubmitReply::Created(task) => task,
        SubmitReply::Existing(record) => {
            return match decide(
                &record,
                &idempotent.as_ref().map_or(record.digest, |i| i.digest),
            ) {
                IdempotencyDecision::Replay(reply) => Ok(replay(&reply)),
                IdempotencyDecision::Reused => Err(ApiError::new(
                    ErrorCode::IdempotencyKeyReused,
                    "this idempotency key was used with another request body",
                )),
            }
        }
    };
    if request.stream {
        let events = state.service.follow_events(&caller, task_id, 0).await?;
        return Ok(with_task_header(
            sse_response(events).into_response(),
            task_id,
        ));
    }
    if request.background {
        let mut response = json_reply(StatusCode::ACCEPTED, wire::task(&task));
        if let Ok(value) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, value);
        }
        return Ok(with_task_header(response, task_id));
    }
    // Synchronous: wait for the end, and remember the reply under the key, if any.
    let finished = state.service.wait_finished(task_id).await?;
    let (status, reply_body) = match finished.status {
        TaskStatus::Completed => {
            let response_id = finished.response_id.ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InternalError,
                    "the completed task has no response",
                )
            })?;
            let response = state.service.response(&caller, response_id).await?;
            (StatusCode::OK, wire::response(&response))
        }
        TaskStatus::Cancelled => {
            let error = ApiError::new(ErrorCode::TaskCancelled, "the task was cancelled");
            (
                error.status,
                json!({"error": {"code": error.code, "message": error.message, "param": null}}),
            )
        }
        _ => {
            let error = finished
                .error
                .clone()
                .unwrap_or_else(|| lmsp_domain::TaskError {
                    code: lmsp_domain::TaskErrorCode::EngineError,
                    message: "the task failed".into(),
                });
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"code": error.code.as_str(), "message": error.message, "param": null}}),
            )
        }
    };
    let reply = stored_reply_of(status, &reply_body, None, Some(task_id));
    if let Some(i) = &idempotent {
        let record = i.record(&state, reply.clone());
        state
            .service
            .store()
            .insert_idempotency_record(record)
            .await
            .map_err(AppError::from)?;
    }
    Ok(reply_from_stored(&reply))
}

fn sse_response(
    events: impl Stream<Item = Event> + Send + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static> {
    let stream = events.map(|event| {
        let data = wire::event(&event).to_string();
        Ok(SseEvent::default()
            .id(event.sequence_number.to_string())
            .event(event.kind().wire_name())
            .data(data))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `GET /v1/responses/{id}` (`responses:read`).
pub async fn get_response(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let response_id = ResponseId::parse(&id).map_err(|_| ApiError::not_found())?;
    let response = state.service.response(&caller, response_id).await?;
    Ok(Json(wire::response(&response)))
}

/// Query of `GET /v1/tasks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    limit: Option<String>,
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

/// `GET /v1/tasks` (`responses:read`): newest first.
pub async fn list_tasks(
    State(state): State<AppState>,
    Authed(caller): Authed,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
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
    Ok(Json(wire::list(
        page.items.iter().map(wire::task).collect(),
        page.has_more,
    )))
}

/// `GET /v1/tasks/{id}` (`responses:read`).
pub async fn get_task(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let task = state.service.task(&caller, parse_task_id(&id)?).await?;
    Ok(Json(wire::task(&task)))
}

/// `POST /v1/tasks/{id}/cancel` (`responses:write`): 200, 202 or 409 per API.md §4.
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

/// Query of `GET /v1/tasks/{id}/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    after: Option<String>,
    limit: Option<String>,
    stream: Option<String>,
}

/// `GET /v1/tasks/{id}/events` (`responses:read`): a JSON list, or SSE.
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
    let wants_stream = match query.stream.as_deref() {
        Some("true") | Some("1") => true,
        Some("false") | Some("0") | None => headers
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
    Ok(Json(wire::list(
        page.items.iter().map(wire::event).collect(),
        page.has_more,
    ))
    .into_response())
}

/// `GET /v1/models` (`models:read`).
pub async fn list_models(
    State(state): State<AppState>,
    Authed(caller): Authed,
) -> ApiResult<Json<Value>> {
    let models = state.service.models(&caller).await?;
    Ok(Json(wire::list(
        models.iter().map(wire::model).collect(),
        false,
    )))
}

fn parse_model_id(text: &str) -> ApiResult<ModelId> {
    ModelId::parse(text).map_err(|_| ApiError::not_found())
}

/// `GET /v1/models/{id}` (`models:read`).
pub async fn get_model(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require(Scope::ModelsRead)?;
    let model_id = parse_model_id(&id)?;
    let model = state
        .service
        .store()
        .model(&model_id)
        .await
        .map_err(AppError::from)?
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(wire::model(&model)))
}

/// `POST /v1/models` (`models:write`): hashes the file and registers it.
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
    let idempotent = match check_idempotency(&state, &caller, "/v1/models", key, &body).await? {
        Ok(idempotent) => idempotent,
        Err(replayed) => return Ok(replayed),
    };
    let _guard = match &idempotent {
        Some(i) => Some(
            state
                .in_flight
                .acquire(&i.scope, &i.key)
                .ok_or_else(key_in_use)?,
        ),
        None => None,
    };
    let store = state.service.store();
    if store.model(&id).await.map_err(AppError::from)?.is_some() {
        return Err(ApiError::new(
            ErrorCode::AlreadyExists,
            format!("model `{id}` exists already"),
        )
        .with_param("id"));
    }
    let file = state
        .model_files
        .fingerprint(&path)
        .await
        .map_err(|e| ApiError::invalid("path", e.to_string()))?;
    let record = ModelRecord {
        id: id.clone(),
        format: format_of_path(&file.path),
        file,
        created_at: state.service.now(),
    };
    if !store
        .insert_model(record.clone())
        .await
        .map_err(AppError::from)?
    {
        return Err(ApiError::new(
            ErrorCode::AlreadyExists,
            format!("model `{id}` exists already"),
        )
        .with_param("id"));
    }
    let body = wire::model(&record);
    if let Some(i) = &idempotent {
        let reply = stored_reply_of(StatusCode::CREATED, &body, None, None);
        store
            .insert_idempotency_record(i.record(&state, reply))
            .await
            .map_err(AppError::from)?;
    }
    Ok(json_reply(StatusCode::CREATED, body))
}

/// `DELETE /v1/models/{id}` (`models:write`): the file itself is never touched.
pub async fn delete_model(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(Scope::ModelsWrite)?;
    let model_id = parse_model_id(&id)?;
    if state
        .service
        .store()
        .delete_model(&model_id)
        .await
        .map_err(AppError::from)?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found())
    }
}

/// `GET /v1/clients` (admin): never with hashes.
pub async fn list_clients(
    State(state): State<AppState>,
    Authed(caller): Authed,
) -> ApiResult<Json<Value>> {
    let clients = state.service.clients(&caller).await?;
    Ok(Json(wire::list(
        clients.iter().map(wire::client).collect(),
        false,
    )))
}

/// `DELETE /v1/clients/{id}` (admin): the token stops working at once.
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

/// `POST /v1/pairings` (admin): a one-time code valid 10 minutes.
pub async fn create_pairing(
    State(state): State<AppState>,
    Authed(caller): Authed,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    caller.require(Scope::Admin)?;
    only_fields(&body, &["scopes"])?;
    let scopes = parse_scopes(body.get("scopes"))?;
    let pairing = state.service.create_pairing(&caller, scopes).await?;
    let body = json!({
        "code": pairing.code.expose(),
        "expires_at": pairing.expires_at.to_rfc3339(),
        "scopes": pairing.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    });
    Ok(json_reply(StatusCode::CREATED, body))
}

/// `POST /v1/pair` (no auth): exchanges a code for a new client and its token.
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
    let body = json!({
        "client_id": paired.client.id.to_string(),
        "token": paired.token.expose(),
        "scopes": paired.client.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    });
    Ok(json_reply(StatusCode::CREATED, body))
}
