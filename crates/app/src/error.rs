//! The app's error: every way a use case can fail, each with its stable error code.

use lmsp_domain::ports::{ModelFileError, StoreError};
use lmsp_domain::validation::ValidationError;
use lmsp_domain::{ErrorCode, TaskError};

/// Why a use case did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The request breaks a rule.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// The token is missing, malformed, unknown or revoked.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// The token lacks the scope.
    #[error("the token lacks the scope `{0}`")]
    Forbidden(&'static str),
    /// No such thing, or not the caller's.
    #[error("not found")]
    NotFound,
    /// The request names an unknown model.
    #[error("model `{0}` is not registered")]
    ModelNotFound(String),
    /// The task is finished and cannot be cancelled.
    #[error("the task is {0} and cannot be cancelled")]
    NotCancellable(&'static str),
    /// A waited-for task was cancelled.
    #[error("the task was cancelled")]
    TaskCancelled,
    /// A waited-for task failed.
    #[error("{}", .0.message)]
    TaskFailed(TaskError),
    /// The id exists already.
    #[error("`{0}` exists already")]
    AlreadyExists(String),
    /// A model file was rejected.
    #[error("{0}")]
    ModelFile(#[from] ModelFileError),
    /// Too many failures; try again after this many seconds.
    #[error("too many wrong pairing codes; try again later")]
    RateLimited {
        /// Seconds until the window passes.
        retry_after_seconds: u64,
    },
    /// The service is shutting down.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The storage failed.
    #[error("storage: {0}")]
    Store(#[from] StoreError),
}

impl AppError {
    /// The stable code of API.md §2.
    pub fn code(&self) -> ErrorCode {
        match self {
            AppError::Invalid(error) => error.code,
            AppError::Unauthorized => ErrorCode::Unauthorized,
            AppError::Forbidden(_) => ErrorCode::Forbidden,
            AppError::NotFound => ErrorCode::NotFound,
            AppError::ModelNotFound(_) => ErrorCode::ModelNotFound,
            AppError::NotCancellable(_) => ErrorCode::TaskNotCancellable,
            AppError::TaskCancelled => ErrorCode::TaskCancelled,
            AppError::TaskFailed(_) => ErrorCode::InternalError,
            AppError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            AppError::ModelFile(_) => ErrorCode::InvalidRequest,
            AppError::RateLimited { .. } => ErrorCode::RateLimited,
            AppError::ShuttingDown => ErrorCode::ServiceUnavailable,
            AppError::Store(_) => ErrorCode::InternalError,
        }
    }

    /// The field at fault, when there is one.
    pub fn param(&self) -> Option<String> {
        match self {
            AppError::Invalid(error) => error.param.clone(),
            AppError::ModelNotFound(_) => Some(String::from("model")),
            AppError::ModelFile(_) => Some(String::from("path")),
            AppError::AlreadyExists(_) => Some(String::from("id")),
            _ => None,
        }
    }
}
