//! `/v1/models`: registered model files and upstream models.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;

use lmsp_app::{IdempotentRequest, Keyed, ModelOrigin};
use lmsp_domain::auth::Scope;
use lmsp_domain::idempotency::StoredReply;
use lmsp_domain::{ModelId, ModelRecord};

use crate::error::{ApiError, ErrorEnvelope};
use crate::extract::{idempotency_key, Authed, JsonBody};
use crate::openapi::{
    Forbidden, InternalError, PayloadTooLarge, StorageUnavailable, Unauthorized,
    UnsupportedMediaType,
};
use crate::replies::{replayed, ReplyDoc};
use crate::routes::{json_reply, ApiResult};
use crate::wire::requests::CreateModelRequest;
use crate::wire::service::{self as objects, ModelList, ModelObject};
use crate::AppState;

fn parse_model_id(text: &str) -> ApiResult<ModelId> {
    ModelId::parse(text).map_err(|_| ApiError::not_found())
}

/// List models.
///
/// `path` is shown to `admin` and `models:write` only.
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
    let models = state.service.models().list(&caller).await?;
    let show_path = caller.has(Scope::ModelsWrite);
    Ok(Json(ModelList::new(
        models
            .iter()
            .map(|m| objects::model(m, show_path))
            .collect(),
        false,
    )))
}

/// A model.
///
/// Ids may contain `/` (e.g. `org/model:v1`); the path takes the whole rest.
#[utoipa::path(
    get,
    path = "/v1/models/{*id}",
    tag = "models",
    operation_id = "getModel",
    security(("bearer" = ["models:read"])),
    params(("id" = String, Path, description = "A model id (it may contain `/`).")),
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
    let model = state
        .service
        .models()
        .get(&caller, &parse_model_id(&id)?)
        .await?;
    Ok(Json(objects::model(&model, caller.has(Scope::ModelsWrite))))
}

/// Register a model.
///
/// A file (`path`): the service hashes it (streaming) and stores its path, size and digest; the
/// file stays where it is and must be a `.gguf` or `.txt` file inside `--models-dir`. Or an
/// upstream model (`upstream_model`): a name the upstream server (`--engine openai`) runs. With
/// `Idempotency-Key`, the same key and body get the first reply again with
/// `Idempotent-Replayed: true`.
#[utoipa::path(
    post,
    path = "/v1/models",
    tag = "models",
    operation_id = "createModel",
    security(("bearer" = ["models:write"])),
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            description = "1–255 visible ASCII characters; scoped to the client and operation."),
    ),
    request_body(content = CreateModelRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The registered model.", body = ModelObject,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replay."))),
        (status = 400, description = "`invalid_request` (a bad field; a path that does not \
            resolve to a model file inside `--models-dir`; both or neither of `path` and \
            `upstream_model`) or `invalid_idempotency_key`.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 409, description = "`already_exists` (the id is taken) or \
            `idempotency_key_in_use`.", body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, description = "`idempotency_key_reused`: the key was used with another \
            body.", body = ErrorEnvelope),
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn create_model(
    State(state): State<AppState>,
    Authed(caller): Authed,
    headers: HeaderMap,
    body: JsonBody<CreateModelRequest>,
) -> ApiResult<Response> {
    caller.require(Scope::ModelsWrite)?;
    let key = idempotency_key(&headers)?.map(|key| IdempotentRequest {
        key,
        digest: body.digest(),
    });
    let request = body.value;
    let id = ModelId::parse(&request.id).map_err(|e| ApiError::invalid("id", e.to_string()))?;
    let origin = match (request.path, request.upstream_model) {
        (Some(path), None) if !path.is_empty() => ModelOrigin::File(path),
        (None, Some(name)) if !name.is_empty() => ModelOrigin::Upstream(name),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "upstream_model",
                "give either `path` or `upstream_model`, not both",
            ))
        }
        _ => {
            return Err(ApiError::invalid(
                "path",
                "`path` (a model file) or `upstream_model` is required",
            ))
        }
    };
    // The reply a retry with the same key gets, committed with the model.
    let kept = |record: &ModelRecord| -> StoredReply {
        match ReplyDoc::whole(
            StatusCode::CREATED,
            &objects::model(record, true),
            None,
            None,
        ) {
            Ok(doc) => doc.stored(),
            Err(error) => {
                tracing::error!(message = %error.message, "a model reply could not be encoded");
                StoredReply {
                    task_id: None,
                    body: Vec::new(),
                }
            }
        }
    };
    match state
        .service
        .models()
        .register(&caller, id, origin, key, &kept)
        .await?
    {
        Keyed::Fresh(record) => Ok(json_reply(
            StatusCode::CREATED,
            objects::model(&record, true),
        )),
        Keyed::Replay(reply) => Ok(replayed(ReplyDoc::of_stored(&reply)?.to_response())),
    }
}

/// Unregister a model.
///
/// The file itself is never touched, and is not registered again at startup.
#[utoipa::path(
    delete,
    path = "/v1/models/{*id}",
    tag = "models",
    operation_id = "deleteModel",
    security(("bearer" = ["models:write"])),
    params(("id" = String, Path, description = "A model id (it may contain `/`).")),
    responses(
        (status = 204, description = "Unregistered."),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no such model.", body = ErrorEnvelope),
        (status = 500, response = InternalError),
        (status = 503, response = StorageUnavailable)
    )
)]
pub async fn delete_model(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    state
        .service
        .models()
        .delete(&caller, &parse_model_id(&id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
