//! Errors inside the adapter and their mapping to the port's [`StoreError`].

use lmsp_domain::ports::StoreError;
use tokio_postgres::error::SqlState;

/// A failure inside a storage operation.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// PostgreSQL (or the connection to it) failed.
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
    /// No pooled connection could be had.
    #[error("no connection to PostgreSQL: {0}")]
    Pool(String),
    /// A stored row or document makes no sense (the shared codec's error).
    #[error(transparent)]
    Codec(#[from] lmsp_storage_codec::DbError),
    /// The transaction lost a race it cannot decide (a row another transaction inserted under
    /// it); it is rolled back and run again from the start.
    #[error("the transaction must be run again")]
    Retry,
}

impl DbError {
    /// Whether running the whole transaction again may succeed: a serialization failure, a
    /// deadlock, or a lost insert race.
    pub fn is_retryable(&self) -> bool {
        match self {
            DbError::Retry => true,
            DbError::Sql(error) => matches!(
                error.code(),
                Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::T_R_DEADLOCK_DETECTED
            ),
            _ => false,
        }
    }
}

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        DbError::Pool(error.to_string())
    }
}

impl From<DbError> for StoreError {
    fn from(error: DbError) -> Self {
        match error {
            DbError::Sql(error) => match error.code() {
                Some(code) if *code == SqlState::DISK_FULL => StoreError::Full,
                _ => StoreError::Unavailable(describe(&error)),
            },
            DbError::Pool(text) => StoreError::Unavailable(text),
            DbError::Codec(error) => error.into(),
            DbError::Retry => StoreError::Unavailable(String::from(
                "the transaction kept losing races; try again",
            )),
        }
    }
}

/// The error with the server's message, when it sent one.
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{error}: {}", db.message()),
        None => error.to_string(),
    }
}
