//! The stable error codes of API.md §2: request error codes and task error codes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The code of an error envelope (`{"error": {"code": …}}`). Its HTTP status is decided in one
/// place at the HTTP edge; the code string is [`ErrorCode::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed or breaks a rule.
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
    /// 413: the body is over 2 MiB.
    PayloadTooLarge,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 422: the idempotency key was used with another body.
    IdempotencyKeyReused,
    /// 429: too many failures; see `Retry-After`.
    RateLimited,
    /// 503: the service is shutting down.
    ServiceUnavailable,
    /// 500: something failed inside; details are logged, never sent.
    InternalError,
}

impl ErrorCode {
    /// The snake_case wire form.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidIdempotencyKey => "invalid_idempotency_key",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::ModelNotFound => "model_not_found",
            ErrorCode::TaskNotCancellable => "task_not_cancellable",
            ErrorCode::TaskCancelled => "task_cancelled",
            ErrorCode::IdempotencyKeyInUse => "idempotency_key_in_use",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::ServiceUnavailable => "service_unavailable",
            ErrorCode::InternalError => "internal_error",
        }
    }

    /// The HTTP status API.md §2 assigns to this code.
    pub const fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest | ErrorCode::InvalidIdempotencyKey => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound | ErrorCode::ModelNotFound => 404,
            ErrorCode::TaskNotCancellable
            | ErrorCode::TaskCancelled
            | ErrorCode::IdempotencyKeyInUse
            | ErrorCode::AlreadyExists => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::RateLimited => 429,
            ErrorCode::ServiceUnavailable => 503,
            ErrorCode::InternalError => 500,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a task failed (`task.error.code`, `response.failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskErrorCode {
    /// The service restarted while the task was under way and its policy is `fail` (P-9).
    ServerRestarted,
    /// The task's model is no longer registered.
    ModelNotFound,
    /// The model file is missing or unreadable.
    ModelUnavailable,
    /// The model file no longer matches its stored digest.
    ModelDigestMismatch,
    /// The engine failed.
    EngineError,
    /// The work took too long.
    Timeout,
}

impl TaskErrorCode {
    /// The snake_case wire form.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskErrorCode::ServerRestarted => "server_restarted",
            TaskErrorCode::ModelNotFound => "model_not_found",
            TaskErrorCode::ModelUnavailable => "model_unavailable",
            TaskErrorCode::ModelDigestMismatch => "model_digest_mismatch",
            TaskErrorCode::EngineError => "engine_error",
            TaskErrorCode::Timeout => "timeout",
        }
    }
}

impl fmt::Display for TaskErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_serialise_as_their_snake_case_names() {
        for code in [
            ErrorCode::InvalidRequest,
            ErrorCode::IdempotencyKeyInUse,
            ErrorCode::UnsupportedMediaType,
            ErrorCode::InternalError,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
        assert_eq!(
            serde_json::to_value(TaskErrorCode::ModelDigestMismatch).unwrap(),
            "model_digest_mismatch"
        );
    }
}
