//! The app's error: every way a use case can fail. The HTTP edge decides the codes and statuses.

use lmsp_domain::ports::{ModelFileError, StoreError};
use lmsp_domain::validation::ValidationError;
use lmsp_domain::{QueueFull, TaskError};

/// How long a client is told to wait before trying again when the store cannot commit.
pub const STORAGE_RETRY_AFTER_SECONDS: u64 = 2;

/// Why a use case did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The request breaks a rule.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// The token is missing, malformed, unknown or revoked.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// The pairing code is wrong, used or expired.
    #[error("the pairing code is wrong, used or expired")]
    BadPairingCode,
    /// The token lacks the scope.
    #[error("the token lacks the scope `{0}`")]
    Forbidden(&'static str),
    /// The scopes asked for are not all granted by the pairing code.
    #[error("the pairing code does not grant every scope asked for")]
    ScopesNotGranted,
    /// No such thing, or not the caller's.
    #[error("not found")]
    NotFound,
    /// A field names something that does not exist (or is not the caller's).
    #[error("{message}")]
    UnknownReference {
        /// The field.
        param: &'static str,
        /// Human text.
        message: String,
    },
    /// The request names an unknown model.
    #[error("model `{0}` is not registered")]
    ModelNotFound(String),
    /// The task is finished and cannot be cancelled.
    #[error("the task is {0} and cannot be cancelled")]
    NotCancellable(&'static str),
    /// The task is unfinished and cannot be deleted.
    #[error("the task is {0}: only a finished task's response can be deleted")]
    Unfinished(&'static str),
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
    /// The first request with this idempotency key is still being answered.
    #[error("the first request with this idempotency key is still being answered")]
    KeyInUse,
    /// The idempotency key was used with another request.
    #[error("this idempotency key was used with another request body")]
    KeyReused,
    /// Too many failures; try again after this many seconds.
    #[error("too many wrong pairing codes; try again later")]
    RateLimited {
        /// Seconds until the window passes.
        retry_after_seconds: u64,
    },
    /// A queue is full: the client's `max_queued` (429) or the service's `--max-queued` (503);
    /// nothing was created.
    #[error("{0}; try again when some have run")]
    QueueFull(QueueFull),
    /// The service is shutting down.
    /// An upload past `--max-file-bytes` (nothing was stored).
    #[error("the file is larger than the {0} bytes a file may have")]
    FileTooLarge(u64),
    /// A file an unfinished batch reads cannot be deleted.
    #[error("an unfinished batch reads this file; delete it once the batch has ended")]
    FileInUse,
    /// A batch that ended (other than by a cancel) cannot be cancelled.
    #[error("the batch is {0} and cannot be cancelled")]
    BatchNotCancellable(&'static str),
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The store cannot commit now (disk full, I/O error, database unreachable).
    #[error("the storage cannot record this now; try again shortly")]
    StorageUnavailable,
    /// Another running instance has this instance's name (a multi-process store).
    #[error("another instance named `{0}` is running; give this one another name (--instance)")]
    InstanceNameInUse(String),
    /// The storage failed otherwise (unreadable data: a bug or corruption).
    #[error("storage: {0}")]
    Store(StoreError),
}

impl From<StoreError> for AppError {
    fn from(error: StoreError) -> Self {
        if error.is_transient() {
            AppError::StorageUnavailable
        } else {
            AppError::Store(error)
        }
    }
}

impl AppError {
    /// The field at fault, when there is one.
    pub fn param(&self) -> Option<String> {
        match self {
            AppError::Invalid(error) => error.param.clone(),
            AppError::UnknownReference { param, .. } => Some((*param).to_owned()),
            AppError::ModelNotFound(_) => Some(String::from("model")),
            AppError::ModelFile(_) => Some(String::from("path")),
            AppError::AlreadyExists(_) => Some(String::from("id")),
            AppError::KeyInUse | AppError::KeyReused => Some(String::from("Idempotency-Key")),
            AppError::ScopesNotGranted => Some(String::from("scopes")),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_store_failures_are_unavailable_and_the_others_are_not() {
        assert!(matches!(
            AppError::from(StoreError::Full),
            AppError::StorageUnavailable
        ));
        assert!(matches!(
            AppError::from(StoreError::Unavailable("io".into())),
            AppError::StorageUnavailable
        ));
        assert!(matches!(
            AppError::from(StoreError::Corrupt("x".into())),
            AppError::Store(_)
        ));
    }
}
