//! `/v1/files` and `/v1/batches`: OpenAI's Files and Batch APIs.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use lmsp_app::{BatchRequest, Caller, Received};
use lmsp_domain::batch::FilePurpose;
use lmsp_domain::{BatchId, FileId};

use crate::error::{ApiError, ErrorCode, ErrorEnvelope};
use crate::extract::{Authed, JsonBody};
use crate::openapi::{
    Forbidden, InternalError, PayloadTooLarge, ServiceUnavailable, Unauthorized,
    UnsupportedMediaType,
};
use crate::routes::tasks::{parse_limit, parse_order, query_error};
use crate::routes::ApiResult;
use crate::wire::batches::{
    BatchList, BatchObject, CreateBatchRequest, FileDeleted, FileList, FileObject, FileTag,
};
use crate::AppState;

/// The longest `purpose` field an upload reads.
const MAX_PURPOSE_BYTES: usize = 64;

fn parse_file_id(text: &str) -> ApiResult<FileId> {
    FileId::parse(text).map_err(|_| ApiError::not_found())
}

/// How long the service keeps ended batches, and so their output and error files.
fn retention(state: &AppState) -> std::time::Duration {
    state.service.settings().retention
}

fn parse_batch_id(text: &str) -> ApiResult<BatchId> {
    BatchId::parse(text).map_err(|_| ApiError::not_found())
}

fn multipart_error(error: multer::Error) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!("the multipart body does not read: {error}"),
    )
}

/// The form of `POST /v1/files` (`multipart/form-data`), as documented.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct UploadForm {
    /// The file's bytes; its name is kept. Any bytes: a batch checks its lines when created.
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    /// Must be `batch`.
    purpose: String,
}

/// Upload a file.
///
/// `multipart/form-data` with a `file` part and `purpose` `batch`, in either order, and no other
/// part; the bytes are streamed to storage (at most `--max-file-bytes`, 200 MB by default) and
/// taken as they are: a batch made from the file checks its lines. A refused upload keeps
/// nothing.
#[utoipa::path(
    post,
    path = "/v1/files",
    tag = "files",
    operation_id = "createFile",
    security(("bearer" = ["responses:write"])),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The stored file.", body = FileObject),
        (status = 400, description = "`invalid_request`: no `file` part, a `purpose` other \
            than `batch`, a part other than these two (`param` names it; OpenAI's \
            `expires_after` is not supported), or a body that is not multipart.",
            body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError),
        (status = 503, response = ServiceUnavailable)
    )
)]
pub async fn create_file(
    State(state): State<AppState>,
    Authed(caller): Authed,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<FileObject>> {
    caller.require(lmsp_domain::auth::Scope::ResponsesWrite)?;
    let boundary = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| multer::parse_boundary(value).ok())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be multipart/form-data with a `file` and a `purpose`",
            )
        })?;
    let mut form = multer::Multipart::new(body.into_data_stream(), boundary);
    let mut received: Option<Received> = None;
    let mut purpose: Option<String> = None;
    let read = read_form(&state, &caller, &mut form, &mut received, &mut purpose).await;
    match (read, received) {
        (Ok(()), Some(received)) => {
            let file = state
                .service
                .keep_file(&caller, received, purpose.as_deref())
                .await?;
            Ok(Json(FileObject::of(&file, retention(&state))))
        }
        (Ok(()), None) => Err(ApiError::invalid("file", "the form has no `file` part")),
        (Err(error), received) => {
            if let Some(received) = received {
                state.service.discard_file(received).await;
            }
            Err(error)
        }
    }
}

/// The refusal of a part other than `file` and `purpose`, never read past: the upload keeps
/// nothing.
fn unknown_part(name: Option<&str>) -> ApiError {
    match name {
        Some(name) if name.starts_with("expires_after") => ApiError::invalid(
            name,
            format!("`{name}` is not supported: an uploaded file stays until it is deleted"),
        ),
        Some(name) => ApiError::invalid(
            name,
            format!("unknown field `{name}`: the form has a `file` and a `purpose`"),
        ),
        None => ApiError::new(
            ErrorCode::InvalidRequest,
            "a part of the form has no name: the form has a `file` and a `purpose`",
        ),
    }
}

/// Reads the upload's parts: the file streamed to storage, the purpose kept; any other part is
/// refused.
async fn read_form(
    state: &AppState,
    caller: &Caller,
    form: &mut multer::Multipart<'static>,
    received: &mut Option<Received>,
    purpose: &mut Option<String>,
) -> ApiResult<()> {
    while let Some(field) = form.next_field().await.map_err(multipart_error)? {
        match field.name() {
            Some("file") if received.is_none() => {
                let filename = field.file_name().unwrap_or("upload.jsonl").to_owned();
                *received = Some(state.service.receive_file(caller, filename, field).await?);
            }
            Some("file") => return Err(ApiError::invalid("file", "the form has two `file` parts")),
            Some("purpose") => {
                let bytes = field.bytes().await.map_err(multipart_error)?;
                if bytes.len() > MAX_PURPOSE_BYTES {
                    return Err(ApiError::invalid("purpose", "`purpose` must be \"batch\""));
                }
                *purpose = Some(String::from_utf8_lossy(&bytes).trim().to_owned());
            }
            name => return Err(unknown_part(name)),
        }
    }
    Ok(())
}

/// Query of `GET /v1/files`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FileListQuery {
    /// Only files of this purpose (`batch` or `batch_output`).
    #[param(value_type = Option<String>)]
    purpose: Option<String>,
    /// Files per page, 1…10000 (default 10000).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// A file id: continue with the files after it, in `order`.
    #[param(value_type = Option<String>)]
    after: Option<String>,
    /// `desc` (default, newest first) or `asc` (oldest first); `after` continues in it.
    #[param(value_type = Option<String>)]
    order: Option<String>,
}

/// List the caller's files, newest first unless `order` is `asc`.
#[utoipa::path(
    get,
    path = "/v1/files",
    tag = "files",
    operation_id = "listFiles",
    security(("bearer" = ["responses:read"])),
    params(FileListQuery),
    responses(
        (status = 200, description = "A page of files.", body = FileList),
        (status = 400, description = "`invalid_request`: a bad parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_files(
    State(state): State<AppState>,
    Authed(caller): Authed,
    query: Result<Query<FileListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<FileList>> {
    let Query(query) = query.map_err(query_error)?;
    let limit = parse_limit(query.limit.as_deref(), 10_000, 10_000)?;
    let purpose = match query.purpose.as_deref() {
        None | Some("") => None,
        Some(text) => Some(FilePurpose::parse(text).ok_or_else(|| {
            ApiError::invalid("purpose", "`purpose` must be `batch` or `batch_output`")
        })?),
    };
    let order = parse_order(query.order.as_deref())?;
    let after = match query.after.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            FileId::parse(text)
                .map_err(|_| ApiError::invalid("after", "`after` must be a file id"))?,
        ),
    };
    let page = state
        .service
        .list_files(&caller, purpose, after, order, limit)
        .await?;
    Ok(Json(FileList::new(
        page.items
            .iter()
            .map(|file| FileObject::of(file, retention(&state)))
            .collect(),
        page.has_more,
    )))
}

/// A file.
#[utoipa::path(
    get,
    path = "/v1/files/{id}",
    tag = "files",
    operation_id = "getFile",
    security(("bearer" = ["responses:read"])),
    params(("id" = String, Path, description = "A file id (`file-…`).")),
    responses(
        (status = 200, description = "The file.", body = FileObject),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: malformed, unknown, deleted or another \
            client's.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_file(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<FileObject>> {
    let file = state.service.file(&caller, parse_file_id(&id)?).await?;
    Ok(Json(FileObject::of(&file, retention(&state))))
}

/// Delete a file: its record and its bytes.
///
/// A file an unfinished batch reads cannot be deleted (409 `file_in_use`).
#[utoipa::path(
    delete,
    path = "/v1/files/{id}",
    tag = "files",
    operation_id = "deleteFile",
    security(("bearer" = ["responses:write"])),
    params(("id" = String, Path, description = "A file id (`file-…`).")),
    responses(
        (status = 200, description = "Deleted.", body = FileDeleted),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 409, description = "`file_in_use`: an unfinished batch reads it.",
            body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn delete_file(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<FileDeleted>> {
    let id = parse_file_id(&id)?;
    state.service.delete_file(&caller, id).await?;
    Ok(Json(FileDeleted {
        id: id.to_string(),
        object: FileTag::Value,
        deleted: true,
    }))
}

/// A file's bytes, streamed.
#[utoipa::path(
    get,
    path = "/v1/files/{id}/content",
    tag = "files",
    operation_id = "getFileContent",
    security(("bearer" = ["responses:read"])),
    params(("id" = String, Path, description = "A file id (`file-…`).")),
    responses(
        (status = 200, description = "The bytes (`application/octet-stream`).",
            content_type = "application/octet-stream", body = Vec<u8>),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_file_content(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let content = state
        .service
        .file_content(&caller, parse_file_id(&id)?)
        .await?;
    let length = content.file.bytes;
    let id = content.file.id;
    let chunks = futures::stream::unfold(content.reader, move |mut reader| async move {
        match reader.read().await {
            Ok(chunk) if chunk.is_empty() => None,
            Ok(chunk) => Some((Ok(chunk), reader)),
            Err(error) => {
                tracing::error!(%error, file = %id, "a file's bytes could not be read");
                Some((Err(std::io::Error::other(error.to_string())), reader))
            }
        }
    });
    let mut response = Body::from_stream(chunks).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    Ok(response)
}

/// Create a batch from an uploaded file.
///
/// Answers at once with the batch in `validating`; its lines are then checked (a bad line fails
/// the batch and creates nothing) and each becomes a task at the `flex` tier.
#[utoipa::path(
    post,
    path = "/v1/batches",
    tag = "batches",
    operation_id = "createBatch",
    security(("bearer" = ["responses:write"])),
    request_body(content = CreateBatchRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The batch, `validating`.", body = BatchObject),
        (status = 400, description = "`invalid_request`: a bad field.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`: no such input file (or another client's).",
            body = ErrorEnvelope),
        (status = 413, response = PayloadTooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 500, response = InternalError),
        (status = 503, response = ServiceUnavailable)
    )
)]
pub async fn create_batch(
    State(state): State<AppState>,
    Authed(caller): Authed,
    body: JsonBody<CreateBatchRequest>,
) -> ApiResult<Json<BatchObject>> {
    let request = body.value;
    let batch = state
        .service
        .create_batch(
            &caller,
            BatchRequest {
                input_file_id: request.input_file_id,
                endpoint: request.endpoint,
                completion_window: request.completion_window,
                metadata: request.metadata,
            },
        )
        .await?;
    Ok(Json(BatchObject::of(&batch)))
}

/// Query of `GET /v1/batches`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BatchListQuery {
    /// Batches per page, 1…100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// A batch id: continue with the batches older than it.
    #[param(value_type = Option<String>)]
    after: Option<String>,
}

/// List the caller's batches, newest first.
#[utoipa::path(
    get,
    path = "/v1/batches",
    tag = "batches",
    operation_id = "listBatches",
    security(("bearer" = ["responses:read"])),
    params(BatchListQuery),
    responses(
        (status = 200, description = "A page of batches.", body = BatchList),
        (status = 400, description = "`invalid_request`: a bad parameter.", body = ErrorEnvelope),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 500, response = InternalError)
    )
)]
pub async fn list_batches(
    State(state): State<AppState>,
    Authed(caller): Authed,
    query: Result<Query<BatchListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<BatchList>> {
    let Query(query) = query.map_err(query_error)?;
    let limit = parse_limit(query.limit.as_deref(), 20, 100)?;
    let after = match query.after.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            BatchId::parse(text)
                .map_err(|_| ApiError::invalid("after", "`after` must be a batch id"))?,
        ),
    };
    let page = state.service.list_batches(&caller, after, limit).await?;
    Ok(Json(BatchList::new(
        page.items.iter().map(BatchObject::of).collect(),
        page.has_more,
    )))
}

/// A batch, with its counts as they are now.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}",
    tag = "batches",
    operation_id = "getBatch",
    security(("bearer" = ["responses:read"])),
    params(("id" = String, Path, description = "A batch id (`batch_…`).")),
    responses(
        (status = 200, description = "The batch.", body = BatchObject),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn get_batch(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<BatchObject>> {
    let batch = state.service.batch(&caller, parse_batch_id(&id)?).await?;
    Ok(Json(BatchObject::of(&batch)))
}

/// Cancel a batch.
///
/// The batch is `cancelling` at once: its queued lines are cancelled, its running ones stop as
/// any cancelled task does, then it is `cancelled` with the lines that finished in its output
/// file. A batch already cancelling or cancelled is answered as it is.
#[utoipa::path(
    post,
    path = "/v1/batches/{id}/cancel",
    tag = "batches",
    operation_id = "cancelBatch",
    security(("bearer" = ["responses:write"])),
    params(("id" = String, Path, description = "A batch id (`batch_…`).")),
    responses(
        (status = 200, description = "The batch, `cancelling` (or as it was).",
            body = BatchObject),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "`not_found`.", body = ErrorEnvelope),
        (status = 409, description = "`batch_not_cancellable`: it ended otherwise.",
            body = ErrorEnvelope),
        (status = 500, response = InternalError)
    )
)]
pub async fn cancel_batch(
    State(state): State<AppState>,
    Authed(caller): Authed,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<BatchObject>)> {
    let batch = state
        .service
        .cancel_batch(&caller, parse_batch_id(&id)?)
        .await?;
    Ok((StatusCode::OK, Json(BatchObject::of(&batch))))
}
