//! Health, the service object, metrics, this API's document, and the replies of paths and
//! methods the API does not serve.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::{ApiError, ErrorCode};
use crate::extract::Authed;
use crate::openapi::{InternalError, Unauthorized};
use crate::routes::{json_reply, ApiResult};
use crate::wire::service::{self as objects, HealthObject, ServiceObject};
use crate::AppState;

/// A 200 whose body is already rendered text of `content_type`.
fn text_reply(content_type: &'static str, text: impl IntoResponse) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        text,
    )
        .into_response()
}

/// Health.
///
/// 200 `{"status": "ok"}` while the store accepts commits; 503 `{"status": "unavailable",
/// "reason": "storage_unavailable"}` while it does not (with `Retry-After`). Needs no token.
#[utoipa::path(
    get,
    path = "/v1/health",
    tag = "service",
    operation_id = "health",
    responses(
        (status = 200, description = "The service is up and its store accepts commits.",
            body = HealthObject),
        (status = 503, description = "The store cannot commit now.", body = HealthObject,
            headers(("Retry-After" = u64, description = "Seconds to wait before asking again.")))
    )
)]
pub async fn health(State(state): State<AppState>) -> Response {
    if state.service.store_is_healthy() {
        json_reply(
            StatusCode::OK,
            HealthObject {
                status: "ok",
                reason: None,
            },
        )
    } else {
        let mut response = json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            HealthObject {
                status: "unavailable",
                reason: Some("storage_unavailable"),
            },
        );
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(lmsp_app::STORAGE_RETRY_AFTER_SECONDS),
        );
        response
    }
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
/// Any valid token, whatever its scopes. `engine` tells whether the engine can take work now
/// (for the `openai` engine: whether its upstream answers, asked at most every few seconds);
/// `caller` names the token's client and its scopes.
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
    Authed(caller): Authed,
) -> Json<ServiceObject> {
    let engine_health = state.service.engine_health().await;
    Json(objects::service(&state.service, &caller, engine_health))
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
        (status = 403, response = crate::openapi::Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn metrics(State(state): State<AppState>, Authed(caller): Authed) -> ApiResult<Response> {
    let text = state.service.metrics_text(&caller).await?;
    Ok(text_reply(OPENMETRICS, text))
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
