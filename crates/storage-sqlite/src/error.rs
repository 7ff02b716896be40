//! Errors inside the adapter and their mapping to the port's [`StoreError`].

use lmsp_domain::ports::StoreError;

/// A failure inside a storage operation.
#[derive(Debug)]
pub enum DbError {
    /// SQLite failed.
    Sql(rusqlite::Error),
    /// A stored document could not be (de)serialised.
    Json(serde_json::Error),
    /// A stored row makes no sense.
    Corrupt(String),
}

impl From<rusqlite::Error> for DbError {
    fn from(error: rusqlite::Error) -> Self {
        DbError::Sql(error)
    }
}

impl From<serde_json::Error> for DbError {
    fn from(error: serde_json::Error) -> Self {
        DbError::Json(error)
    }
}

impl From<DbError> for StoreError {
    fn from(error: DbError) -> Self {
        match error {
            DbError::Sql(rusqlite::Error::SqliteFailure(code, _))
                if code.code == rusqlite::ErrorCode::DiskFull =>
            {
                StoreError::Full
            }
            DbError::Sql(other) => StoreError::Unavailable(other.to_string()),
            DbError::Json(other) => StoreError::Corrupt(other.to_string()),
            DbError::Corrupt(text) => StoreError::Corrupt(text),
        }
    }
}
