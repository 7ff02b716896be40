//! `/v1/clients`, `/v1/pairings`, `/v1/pair`: clients and pairing.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;

use lmsp_domain::ClientId;

use crate::error::{ApiError, ErrorEnvelope};
use crate::extract::{Authed, JsonBody};
use crate::openapi::{
    Forbidden, InternalError, PayloadTooLarge, RateLimited, StorageUnavailable, Unauthorized,
    UnsupportedMediaType,
};
use crate::routes::{json_reply, ApiResult};
use crate::wire::requests::{parse_scopes, CreatePairingRequest, PairRequest};
use crate::wire::service::{
    self as objects, ClientList, ClientObject, PairedObject, PairingObject, UpdateClientRequest,
};
use crate::AppState;

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
        (status = 200, description = "Every client, revoked ones included.", body = ClientList),
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
        clients
            .iter()
            .map(|(client, limits)| objects::client(client, *limits))
            .collect(),
        false,
    )))
}

/// Change a client's limits.
///
/// `max_running`: the most of its tasks that run at once, from 1 (its other tasks wait while
/// other clients' run); `max_queued`: the most that may be queued, from 0 (a submit past it is
/// 429 `rate_limited` with `Retry-After`, and creates nothing). `null` lifts a limit; an absent
/// field keeps it. A revoked client is not found, as for `DELETE`; nothing is changed.
#[utoipa::path(
    patch,
    path = "/v1/clients/{id}",
    tag = "clients",
    operation_id = "updateClient",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "A client id (`cli_…`).")),
    request_body(content = UpdateClientRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The client with its limits.", body = ClientObject),
        (status = 400, description = "`invalid_request`: a limit that is not a whole number \
            (`max_running` from 1, `max_queued` from 0), or an unknown field.",
            body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown or revoked.",
            body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn update_client(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
    body: JsonBody<UpdateClientRequest>,
) -> ApiResult<Json<ClientObject>> {
    caller.require(lmsp_domain::auth::Scope::Admin)?;
    let client_id = ClientId::parse(&id).map_err(|_| ApiError::not_found())?;
    let (client, limits) = state
        .service
        .update_client_limits(&caller, client_id, body.value.update())
        .await?;
    Ok(Json(objects::client(&client, limits)))
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
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn delete_client(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(lmsp_domain::auth::Scope::Admin)?;
    let client_id = ClientId::parse(&id).map_err(|_| ApiError::not_found())?;
    state.service.revoke_client(&caller, client_id).await?;
    Ok(StatusCode::NO_CONTENT)
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
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn create_pairing(
    State(state): State<AppState>,
    Authed(caller): Authed,
    body: JsonBody<CreatePairingRequest>,
) -> ApiResult<Response> {
    caller.require(lmsp_domain::auth::Scope::Admin)?;
    let scopes = parse_scopes(&body.value.scopes)?;
    let pairing = state.service.create_pairing(&caller, scopes).await?;
    Ok(json_reply(StatusCode::CREATED, objects::pairing(&pairing)))
}

/// Pair a new client.
///
/// Exchanges a pairing code for a new client and its token (shown once). No token needed.
/// After 5 wrong codes within 10 minutes every outstanding code is burnt and this answers 429
/// until 10 minutes have passed.
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
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn pair(
    State(state): State<AppState>,
    body: JsonBody<PairRequest>,
) -> ApiResult<Response> {
    let request = body.value;
    if !(1..=128).contains(&request.name.chars().count()) {
        return Err(ApiError::invalid("name", "`name` is 1–128 characters"));
    }
    let scopes = parse_scopes(&request.scopes)?;
    let paired = state
        .service
        .pair(&request.code, &request.name, scopes)
        .await?;
    Ok(json_reply(StatusCode::CREATED, objects::paired(&paired)))
}
