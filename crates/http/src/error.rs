//! The error envelope and the one place where error codes become HTTP statuses.
//!
//! Every error reply is `{"error": {"code", "message", "param", "type"}}`: `code` is one of
//! [`ErrorCode`] (or, for a synchronous request whose task failed, the task's error code),
//! `type` the class OpenAI's SDKs read. [`ErrorCode::status`] is the only code → status table;
//! [`cancel_status`] the only status of an accepted cancel (a refused one is an error code).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use strum::{IntoStaticStr, VariantArray};
use utoipa::ToSchema;

use lmsp_app::{AppError, CancelState, STORAGE_RETRY_AFTER_SECONDS};
use lmsp_domain::{QueueFull, TaskError};

/// The code of an error envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum ErrorCode {
    /// 400 (408, 414, 431 too: a request too slow, or a URI or headers too large).
    InvalidRequest,
    /// 400: the `Idempotency-Key` header is not 1–255 visible ASCII characters.
    InvalidIdempotencyKey,
    /// 401: missing, malformed, unknown or revoked token; or a bad pairing code.
    Unauthorized,
    /// 403: valid token, scope missing.
    Forbidden,
    /// 404: no such thing (or not yours).
    NotFound,
    /// 404: a task request names an unknown model.
    ModelNotFound,
    /// 409: the task is finished and cannot be cancelled.
    TaskNotCancellable,
    /// 409: a synchronous request's task was cancelled meanwhile.
    TaskCancelled,
    /// 409: the first request with this idempotency key is still being answered.
    IdempotencyKeyInUse,
    /// 409: the id exists already.
    AlreadyExists,
    /// 409: the task is unfinished, so its response cannot be deleted yet.
    TaskNotFinished,
    /// 409: an unfinished batch reads the file, so it cannot be deleted yet.
    FileInUse,
    /// 409: the batch ended (other than by a cancel) and cannot be cancelled.
    BatchNotCancellable,
    /// 413: the body is over 2 MiB (a file upload: over `--max-file-bytes`).
    PayloadTooLarge,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 422: the idempotency key was used with another body.
    IdempotencyKeyReused,
    /// 429: too many failures; see `Retry-After`.
    RateLimited,
    /// 503: the service is shutting down, or has too many connections.
    ServiceUnavailable,
    /// 503: the store cannot commit now.
    StorageUnavailable,
    /// 500: something failed inside; details are logged, never sent.
    InternalError,
}

impl ErrorCode {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The HTTP status of this code: the one table.
    pub const fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidRequest | ErrorCode::InvalidIdempotencyKey => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::NotFound | ErrorCode::ModelNotFound => StatusCode::NOT_FOUND,
            ErrorCode::TaskNotCancellable
            | ErrorCode::TaskCancelled
            | ErrorCode::IdempotencyKeyInUse
            | ErrorCode::AlreadyExists
            | ErrorCode::TaskNotFinished
            | ErrorCode::FileInUse
            | ErrorCode::BatchNotCancellable => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::ServiceUnavailable | ErrorCode::StorageUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorCode::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// P-4: the status of a cancel the task took: 200 once it is `cancelled`, 202 while its worker
/// stops (`cancelling`). A cancel of a finished task is refused as
/// [`ErrorCode::TaskNotCancellable`] (409).
pub const fn cancel_status(state: CancelState) -> StatusCode {
    match state {
        CancelState::Cancelled => StatusCode::OK,
        CancelState::Cancelling => StatusCode::ACCEPTED,
    }
}

/// The error class OpenAI's SDKs read (`error.type`), by status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    }
}

/// The body of every error reply.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorEnvelope {
    /// What went wrong.
    pub error: ErrorBody,
}

/// The inside of the error envelope.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable snake_case code; a synchronous request whose task failed carries the task's
    /// error code instead.
    #[schema(schema_with = crate::openapi::error_code)]
    pub code: String,
    /// Human text (never internals).
    pub message: String,
    /// The field (or header) at fault, or `null`.
    #[schema(required = true)]
    pub param: Option<String>,
    /// The error's class, as OpenAI's SDKs read it.
    #[schema(schema_with = crate::openapi::error_type)]
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// An error reply: the envelope with the status of its code, and its headers.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The code string.
    pub code: String,
    /// Human text (never internals).
    pub message: String,
    /// The field at fault.
    pub param: Option<String>,
    /// `Retry-After` seconds.
    pub retry_after: Option<u64>,
    /// Whether a client must not retry it (`x-should-retry: false`): the request's task is
    /// finished, so a retry could only start a second one.
    pub final_answer: bool,
}

impl ApiError {
    /// An error with a code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let retry_after = matches!(
            code,
            ErrorCode::ServiceUnavailable | ErrorCode::StorageUnavailable
        )
        .then_some(STORAGE_RETRY_AFTER_SECONDS);
        Self {
            status: code.status(),
            code: code.as_str().to_owned(),
            message: message.into(),
            param: None,
            retry_after,
            final_answer: false,
        }
    }

    /// The same error naming the field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 404 `not_found`.
    pub fn not_found() -> Self {
        Self::new(ErrorCode::NotFound, "no such resource")
    }

    /// 400 `invalid_request` for a field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message).with_param(param)
    }

    /// The 500 a synchronous request gets when its task failed: the task's own code, final.
    pub fn task_failed(error: &TaskError) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: error.code.as_str().to_owned(),
            message: error.message.clone(),
            param: None,
            retry_after: None,
            final_answer: true,
        }
    }

    /// The 409 a synchronous request gets when its task was cancelled, final.
    pub fn task_cancelled() -> Self {
        let mut error = Self::new(ErrorCode::TaskCancelled, "the task was cancelled");
        error.final_answer = true;
        error
    }

    /// The body of this error.
    pub fn envelope(&self) -> ErrorEnvelope {
        ErrorEnvelope {
            error: ErrorBody {
                code: self.code.clone(),
                message: self.message.clone(),
                param: self.param.clone(),
                kind: error_type(self.status),
            },
        }
    }
}

/// The `Retry-After` of a submit refused because its client's queue is full: a queue frees a
/// place whenever one of its tasks starts.
const QUEUE_RETRY_AFTER_SECONDS: u64 = 1;

impl From<AppError> for ApiError {
    fn from(error: AppError) -> Self {
        let code = match &error {
            AppError::Invalid(_) | AppError::ModelFile(_) => ErrorCode::InvalidRequest,
            AppError::Unauthorized | AppError::BadPairingCode => ErrorCode::Unauthorized,
            AppError::Forbidden(_) | AppError::ScopesNotGranted => ErrorCode::Forbidden,
            AppError::NotFound | AppError::UnknownReference { .. } => ErrorCode::NotFound,
            AppError::ModelNotFound(_) => ErrorCode::ModelNotFound,
            AppError::NotCancellable(_) => ErrorCode::TaskNotCancellable,
            AppError::Unfinished(_) => ErrorCode::TaskNotFinished,
            AppError::FileTooLarge(_) => ErrorCode::PayloadTooLarge,
            AppError::FileInUse => ErrorCode::FileInUse,
            AppError::BatchNotCancellable(_) => ErrorCode::BatchNotCancellable,
            AppError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            AppError::TaskCancelled => return ApiError::task_cancelled(),
            AppError::TaskFailed(task_error) => return ApiError::task_failed(task_error),
            AppError::KeyInUse => ErrorCode::IdempotencyKeyInUse,
            AppError::KeyReused => ErrorCode::IdempotencyKeyReused,
            AppError::RateLimited { .. } => ErrorCode::RateLimited,
            AppError::QueueFull(QueueFull::Client(_)) => ErrorCode::RateLimited,
            AppError::QueueFull(QueueFull::Service(_)) | AppError::ShuttingDown => {
                ErrorCode::ServiceUnavailable
            }
            AppError::StorageUnavailable => ErrorCode::StorageUnavailable,
            AppError::InstanceNameInUse(_) | AppError::Store(_) => {
                tracing::error!(%error, "a request failed inside the service");
                return ApiError::new(
                    ErrorCode::InternalError,
                    "the service failed to answer; it has been logged",
                );
            }
        };
        let mut api = ApiError::new(code, error.to_string());
        api.param = error.param();
        match error {
            AppError::RateLimited {
                retry_after_seconds,
            } => api.retry_after = Some(retry_after_seconds),
            AppError::QueueFull(QueueFull::Client(_)) => {
                api.retry_after = Some(QUEUE_RETRY_AFTER_SECONDS);
            }
            _ => {}
        }
        api
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.envelope())).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.final_answer {
            headers.insert("x-should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code has its status of the contract; 5xx and 429 tell clients to wait.
    #[test]
    fn each_code_has_the_status_of_the_contract() {
        let expected = [
            (ErrorCode::InvalidRequest, 400),
            (ErrorCode::InvalidIdempotencyKey, 400),
            (ErrorCode::Unauthorized, 401),
            (ErrorCode::Forbidden, 403),
            (ErrorCode::NotFound, 404),
            (ErrorCode::ModelNotFound, 404),
            (ErrorCode::TaskNotCancellable, 409),
            (ErrorCode::FileInUse, 409),
            (ErrorCode::BatchNotCancellable, 409),
            (ErrorCode::TaskCancelled, 409),
            (ErrorCode::IdempotencyKeyInUse, 409),
            (ErrorCode::AlreadyExists, 409),
            (ErrorCode::TaskNotFinished, 409),
            (ErrorCode::PayloadTooLarge, 413),
            (ErrorCode::UnsupportedMediaType, 415),
            (ErrorCode::IdempotencyKeyReused, 422),
            (ErrorCode::RateLimited, 429),
            (ErrorCode::ServiceUnavailable, 503),
            (ErrorCode::StorageUnavailable, 503),
            (ErrorCode::InternalError, 500),
        ];
        assert_eq!(expected.len(), ErrorCode::VARIANTS.len());
        for (code, status) in expected {
            assert_eq!(code.status().as_u16(), status, "{code:?}");
        }
        assert_eq!(
            ErrorCode::StorageUnavailable.as_str(),
            "storage_unavailable"
        );
        assert_eq!(
            ApiError::new(ErrorCode::StorageUnavailable, "x").retry_after,
            Some(STORAGE_RETRY_AFTER_SECONDS)
        );
    }

    /// P-4: a cancelled task answers 200, a cancelling one 202.
    #[test]
    fn a_cancel_answers_200_once_cancelled_and_202_while_the_worker_stops_p4() {
        assert_eq!(cancel_status(CancelState::Cancelled), StatusCode::OK);
        assert_eq!(cancel_status(CancelState::Cancelling), StatusCode::ACCEPTED);
    }

    #[test]
    fn the_error_type_follows_the_status_as_the_sdks_expect() {
        assert_eq!(error_type(StatusCode::BAD_REQUEST), "invalid_request_error");
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(error_type(StatusCode::FORBIDDEN), "permission_error");
        assert_eq!(error_type(StatusCode::NOT_FOUND), "not_found_error");
        assert_eq!(
            error_type(StatusCode::TOO_MANY_REQUESTS),
            "rate_limit_error"
        );
        assert_eq!(error_type(StatusCode::SERVICE_UNAVAILABLE), "server_error");
        assert_eq!(error_type(StatusCode::CONFLICT), "invalid_request_error");
    }

    #[test]
    fn a_finished_tasks_error_tells_sdks_not_to_retry() {
        let response = ApiError::task_cancelled().into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()["x-should-retry"], "false");
        let response = ApiError::new(ErrorCode::StorageUnavailable, "x").into_response();
        assert!(response.headers().get("x-should-retry").is_none());
        assert!(response.headers().get(header::RETRY_AFTER).is_some());
    }
}
