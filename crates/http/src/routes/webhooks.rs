//! `/v1/webhook_endpoints`: webhook endpoints as OpenAI's API manages them (admin scope), and
//! LMSP's list of each endpoint's deliveries.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use lmsp_app::EndpointUpdate;
use lmsp_domain::WebhookEndpointId;

use crate::error::{ApiError, ErrorCode, ErrorEnvelope};
use crate::extract::{is_json, parse_json, Authed, JsonBody};
use crate::openapi::{
    Forbidden, InternalError, PayloadTooLarge, Unauthorized, UnsupportedMediaType,
};
use crate::routes::tasks::{parse_limit, query_error};
use crate::routes::ApiResult;
use crate::wire::webhooks::{
    CreateEndpointRequest, DeliveryList, DeliveryObject, EndpointDeleted, EndpointDeletedTag,
    EndpointList, EndpointObject, EndpointTestResult, EndpointTestTag, RotateSecretRequest,
    TestEndpointRequest, UpdateEndpointRequest,
};
use crate::wire::ListTag;
use crate::AppState;

fn parse_endpoint_id(text: &str) -> ApiResult<WebhookEndpointId> {
    WebhookEndpointId::parse(text).map_err(|_| ApiError::not_found())
}

/// Register a webhook endpoint.
///
/// Its signing secret (`whsec_…`) is in this answer only: keep it to verify deliveries (e.g.
/// with `OpenAI(webhook_secret=…).webhooks.unwrap(body, headers)`).
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints",
    tag = "webhooks",
    operation_id = "createWebhookEndpoint",
    security(("bearer" = ["admin"])),
    request_body(content = CreateEndpointRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The endpoint, with its signing secret.",
            body = EndpointObject),
        (status = 400, description = "`invalid_request`: a bad name, URL or event type.",
            body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError)
    )
)]
pub async fn create_endpoint(
    State(state): State<AppState>,
    Authed(caller): Authed,
    body: JsonBody<CreateEndpointRequest>,
) -> ApiResult<Json<EndpointObject>> {
    let request = body.value;
    let endpoint = state
        .service
        .create_endpoint(&caller, request.name, request.url, request.event_types)
        .await?;
    Ok(Json(EndpointObject::of(&endpoint, true)))
}

/// Query of `GET /v1/webhook_endpoints`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EndpointListQuery {
    /// Endpoints per page, 1…100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// An endpoint id: continue with the older ones.
    #[param(value_type = Option<String>)]
    after: Option<String>,
}

/// List webhook endpoints, newest first.
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints",
    tag = "webhooks",
    operation_id = "listWebhookEndpoints",
    security(("bearer" = ["admin"])),
    params(EndpointListQuery),
    responses(
        (status = 200, description = "A page of endpoints (no secrets).", body = EndpointList),
        (status = 400, description = "`invalid_request`: a bad parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_endpoints(
    State(state): State<AppState>,
    Authed(caller): Authed,
    query: Result<Query<EndpointListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<EndpointList>> {
    let Query(query) = query.map_err(query_error)?;
    let limit = parse_limit(query.limit.as_deref(), 20, 100)?;
    let after = match query.after.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            WebhookEndpointId::parse(text)
                .map_err(|_| ApiError::invalid("after", "`after` must be a webhook endpoint id"))?,
        ),
    };
    let page = state.service.list_endpoints(&caller, after, limit).await?;
    let data: Vec<EndpointObject> = page
        .items
        .iter()
        .map(|endpoint| EndpointObject::of(endpoint, false))
        .collect();
    Ok(Json(EndpointList::new(data, page.has_more)))
}

/// A webhook endpoint (no secret).
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints/{id}",
    tag = "webhooks",
    operation_id = "getWebhookEndpoint",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "An endpoint id (`we_…`).")),
    responses(
        (status = 200, description = "The endpoint.", body = EndpointObject),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_endpoint(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointObject>> {
    let endpoint = state
        .service
        .endpoint(&caller, parse_endpoint_id(&id)?)
        .await?;
    Ok(Json(EndpointObject::of(&endpoint, false)))
}

/// Change a webhook endpoint's name, URL or event types.
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints/{id}",
    tag = "webhooks",
    operation_id = "updateWebhookEndpoint",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "An endpoint id (`we_…`).")),
    request_body(content = UpdateEndpointRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The endpoint as it is now.", body = EndpointObject),
        (status = 400, description = "`invalid_request`.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError)
    )
)]
pub async fn update_endpoint(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    body: JsonBody<UpdateEndpointRequest>,
) -> ApiResult<Json<EndpointObject>> {
    let id = parse_endpoint_id(&id)?;
    let request = body.value;
    let endpoint = state
        .service
        .update_endpoint(
            &caller,
            id,
            EndpointUpdate {
                name: request.name,
                url: request.url,
                event_types: request.event_types,
            },
        )
        .await?;
    Ok(Json(EndpointObject::of(&endpoint, false)))
}

/// Delete a webhook endpoint; its pending deliveries go with it.
#[utoipa::path(
    delete,
    path = "/v1/webhook_endpoints/{id}",
    tag = "webhooks",
    operation_id = "deleteWebhookEndpoint",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "An endpoint id (`we_…`).")),
    responses(
        (status = 200, description = "Deleted.", body = EndpointDeleted),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn delete_endpoint(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointDeleted>> {
    let id = parse_endpoint_id(&id)?;
    state.service.delete_endpoint(&caller, id).await?;
    Ok(Json(EndpointDeleted {
        id: id.to_string(),
        object: EndpointDeletedTag::Value,
        deleted: true,
    }))
}

/// Give a webhook endpoint a new signing secret.
///
/// The new secret is in this answer only. With `keep_old_secret_active_for_24_hours`, deliveries
/// carry a signature under each secret for 24 hours.
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints/{id}/rotate_secret",
    tag = "webhooks",
    operation_id = "rotateWebhookSecret",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "An endpoint id (`we_…`).")),
    request_body(content = RotateSecretRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The endpoint, with its new signing secret.",
            body = EndpointObject),
        (status = 400, description = "`invalid_request`.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError)
    )
)]
pub async fn rotate_secret(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<EndpointObject>> {
    let id = parse_endpoint_id(&id)?;
    // An empty body is the default: the old secret stops at once.
    let request: RotateSecretRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RotateSecretRequest::default()
    } else if !is_json(&headers) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "the body must be application/json",
        ));
    } else {
        parse_json(&body)?
    };
    let keep_old = request.keep_old_secret_active_for_24_hours.unwrap_or(false);
    let endpoint = state.service.rotate_secret(&caller, id, keep_old).await?;
    Ok(Json(EndpointObject::of(&endpoint, true)))
}

/// Send a sample event to a webhook endpoint now.
///
/// One signed delivery of a made-up event (not stored, not retried); the answer carries the
/// receiver's status (0 when it did not answer).
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints/{id}/test",
    tag = "webhooks",
    operation_id = "testWebhookEndpoint",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "An endpoint id (`we_…`).")),
    request_body(content = TestEndpointRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "How the receiver answered.", body = EndpointTestResult),
        (status = 400, description = "`invalid_request`: an unknown event type.",
            body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError)
    )
)]
pub async fn test_endpoint(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    body: JsonBody<TestEndpointRequest>,
) -> ApiResult<Json<EndpointTestResult>> {
    let id = parse_endpoint_id(&id)?;
    let (event_type, status) = state
        .service
        .test_endpoint(&caller, id, &body.value.event_type)
        .await?;
    Ok(Json(EndpointTestResult {
        object: EndpointTestTag::Value,
        webhook_endpoint_id: id.to_string(),
        event_type: event_type.as_str(),
        status_code: status.unwrap_or(0),
        success: true,
    }))
}

/// Query of `GET /v1/webhook_endpoints/{id}/deliveries`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeliveryListQuery {
    /// Deliveries, 1…100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
}

/// A webhook endpoint's recent deliveries (LMSP's own).
///
/// One entry per event: its attempts, the last status or error, when it is next tried, and
/// whether it was delivered or given up.
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints/{id}/deliveries",
    tag = "webhooks",
    operation_id = "listWebhookDeliveries",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "An endpoint id (`we_…`)."), DeliveryListQuery),
    responses(
        (status = 200, description = "The most recent events first.", body = DeliveryList),
        (status = 400, description = "`invalid_request`: a bad parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_deliveries(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    query: Result<Query<DeliveryListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<DeliveryList>> {
    let Query(query) = query.map_err(query_error)?;
    let limit = parse_limit(query.limit.as_deref(), 20, 100)?;
    let mut deliveries = state
        .service
        .endpoint_deliveries(&caller, parse_endpoint_id(&id)?, limit + 1)
        .await?;
    let has_more = deliveries.len() > limit;
    deliveries.truncate(limit);
    Ok(Json(DeliveryList {
        object: ListTag::Value,
        data: deliveries.iter().map(DeliveryObject::of).collect(),
        has_more,
    }))
}
