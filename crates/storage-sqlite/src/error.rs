//! Errors inside the adapter and their mapping to the port's [`StoreError`].

use lmsp_domain::ports::StoreError;

/// A failure inside a storage operation.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite failed.
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    /// A stored row or document makes no sense (the shared codec's error).
    #[error(transparent)]
    Codec(#[from] lmsp_storage_codec::DbError),
    /// The database or its file system has no room for new work (the health probe's finding).
    #[error("no room to write: {0}")]
    NoRoom(String),
    /// The operation panicked (a bug); it was rolled back and the writer lives on.
    #[error("the storage operation failed unexpectedly: {0}")]
    Panicked(String),
}

impl From<DbError> for StoreError {
    fn from(error: DbError) -> Self {
        match error {
            DbError::Sql(rusqlite::Error::SqliteFailure(code, _))
                if code.code == rusqlite::ErrorCode::DiskFull =>
            {
                StoreError::Full
            }
            DbError::NoRoom(_) => StoreError::Full,
            DbError::Sql(other) => StoreError::Unavailable(other.to_string()),
            DbError::Codec(error) => error.into(),
            DbError::Panicked(text) => StoreError::Unavailable(format!(
                "the storage operation failed unexpectedly: {text}"
            )),
        }
    }
}
