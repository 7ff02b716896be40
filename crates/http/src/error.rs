//! The error envelope of API.md §2 and the one place where error codes become HTTP statuses.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use lmsp_app::AppError;
use lmsp_domain::ErrorCode;

/// The body of every error reply: `{"error": {"code", "message", "param"}}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorEnvelope {
    /// What went wrong.
    pub error: ErrorBody,
}

/// The inside of the error envelope.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable snake_case code of API.md §2; a synchronous `POST /v1/responses` whose task
    /// failed carries the task's error code instead.
    #[schema(schema_with = crate::openapi::error_code)]
    pub code: String,
    /// Human text (never internals).
    pub message: String,
    /// The field (or header) at fault, or `null`.
    #[schema(required = true)]
    pub param: Option<String>,
}

impl ErrorEnvelope {
    /// An envelope with this code and message and no `param`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody {
                code: code.into(),
                message: message.into(),
                param: None,
            },
        }
    }
}

/// An error reply: `{"error": {"code", "message", "param"}}` with the status of its code.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code string.
    pub code: String,
    /// Human text (never internals).
    pub message: String,
    /// The field at fault.
    pub param: Option<String>,
    /// `Retry-After` seconds, for 429.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with a code of API.md §2.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: code.as_str().to_owned(),
            message: message.into(),
            param: None,
            retry_after: None,
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

    /// The body of this error.
    pub fn envelope(&self) -> ErrorEnvelope {
        ErrorEnvelope {
            error: ErrorBody {
                code: self.code.clone(),
                message: self.message.clone(),
                param: self.param.clone(),
            },
        }
    }

    /// 400 `invalid_request` for a field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message).with_param(param)
    }
}

impl From<AppError> for ApiError {
    fn from(error: AppError) -> Self {
        match &error {
            AppError::Store(inner) => {
                tracing::error!(error = %inner, "storage failure");
                ApiError::new(
                    ErrorCode::InternalError,
                    "the service failed to answer; it has been logged",
                )
            }
            AppError::TaskFailed(task_error) => ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: task_error.code.as_str().to_owned(),
                message: task_error.message.clone(),
                param: None,
                retry_after: None,
            },
            AppError::RateLimited {
                retry_after_seconds,
            } => {
                let mut api = ApiError::new(ErrorCode::RateLimited, error.to_string());
                api.retry_after = Some(*retry_after_seconds);
                api
            }
            _ => {
                let mut api = ApiError::new(error.code(), error.to_string());
                api.param = error.param();
                api
            }
        }
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
        response
    }
}
