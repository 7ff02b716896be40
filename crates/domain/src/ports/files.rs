//! Model files on disk.

use async_trait::async_trait;

use crate::model::FileFingerprint;

/// Why a model file could not be checked or registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelFileError {
    /// The path is outside the models directory, not a regular file, or does not resolve.
    #[error("the path is not a regular file inside the models directory: {0}")]
    PathRejected(String),
    /// The file is missing or unreadable.
    #[error("the model file is unavailable: {0}")]
    Unavailable(String),
    /// The file no longer matches its stored digest.
    #[error("the model file does not match its stored digest")]
    DigestMismatch,
}

/// A checked model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedFile {
    /// Its absolute path on this machine.
    pub path: String,
    /// The fingerprint to store, when the file was re-hashed (its size or modification time
    /// changed) and still matches.
    pub rehashed: Option<FileFingerprint>,
}

/// Told how much of a file has been hashed: `(bytes done, bytes in all)`.
pub type Progress = Box<dyn Fn(u64, u64) + Send + Sync>;

/// Model files on disk: hashing and checking; never writes or deletes a user's file.
#[async_trait]
pub trait ModelFiles: Send + Sync {
    /// Resolves `path` (absolute, or relative to the models directory; links followed) to a
    /// regular file inside the models directory and hashes it as a stream. The fingerprint's path
    /// is relative to the models directory.
    async fn fingerprint(&self, path: &str) -> Result<FileFingerprint, ModelFileError>;

    /// Hashes any readable regular file, for the machine's owner (the offline command); the
    /// fingerprint's path is relative when the file is inside the models directory, else absolute.
    async fn fingerprint_any(
        &self,
        path: &str,
        progress: Option<Progress>,
    ) -> Result<FileFingerprint, ModelFileError>;

    /// Checks a registered file on this machine: re-hashes only when size or modification time
    /// changed.
    async fn verify(&self, known: &FileFingerprint) -> Result<VerifiedFile, ModelFileError>;

    /// The model files in the models directory (those with a model format), as paths
    /// [`ModelFiles::fingerprint`] takes.
    async fn find_models(&self) -> Result<Vec<String>, ModelFileError>;

    /// Writes the built-in reference corpus into the models directory unless it is there, and
    /// returns its path for [`ModelFiles::fingerprint`].
    async fn install_reference_corpus(&self) -> Result<String, ModelFileError>;
}
