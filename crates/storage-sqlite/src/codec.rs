//! The row codecs, shared with the other storage adapter (`lmsp-storage-codec`): both store the
//! same documents.

pub use lmsp_storage_codec::*;
