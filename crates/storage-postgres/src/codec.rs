//! The row codecs, shared with the other storage adapter (`lmsp-storage-codec`): both store the
//! same documents.

pub use lmsp_storage_codec::*;

impl From<lmsp_storage_codec::DbError> for crate::error::DbError {
    fn from(error: lmsp_storage_codec::DbError) -> Self {
        match error {
            lmsp_storage_codec::DbError::Json(error) => crate::error::DbError::Json(error),
            lmsp_storage_codec::DbError::Corrupt(text) => crate::error::DbError::Corrupt(text),
        }
    }
}
