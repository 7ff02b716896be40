//! Model files on disk: path checks and streaming SHA-256.
//!
//! [`FsModelFiles`] implements the [`ModelFiles`] port: it resolves a path (links followed) to a
//! regular file inside the models directory, hashes it with a fixed 64 KiB buffer (memory stays
//! flat whatever the file's size) on a blocking thread, and re-checks registered files, re-hashing
//! only when their size or modification time changed. A file inside the models directory is
//! recorded by its path relative to the directory, so that instances sharing one store, each
//! with its own models directory, share the record. It never writes or deletes a user's file;
//! the only file this crate ever writes is the built-in reference corpus, and only where none
//! exists ([`write_reference_corpus`]).

mod corpus;

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use lmsp_domain::model::{Digest, FileFingerprint, ModelFormat};
use lmsp_domain::ports::{ModelFileError, ModelFiles, Progress, VerifiedFile};
use sha2::{Digest as _, Sha256};

pub use corpus::{write_reference_corpus, REFERENCE_CORPUS};

/// The size of the read buffer used while hashing.
pub const HASH_BUFFER_BYTES: usize = 64 * 1024;

/// Model files in a models directory on the local file system.
#[derive(Debug, Clone)]
pub struct FsModelFiles {
    models_dir: PathBuf,
}

impl FsModelFiles {
    /// Model files that must live inside `models_dir`. The directory is resolved (links followed)
    /// at each check, so it may be created after this call.
    pub fn new(models_dir: PathBuf) -> Self {
        Self { models_dir }
    }

    /// The models directory as given.
    pub fn models_dir(&self) -> &Path {
        &self.models_dir
    }

    /// The path to store for a canonical `path`: relative to the models directory when inside
    /// it, else absolute.
    pub fn stored_path(&self, canonical: &Path) -> String {
        let relative = std::fs::canonicalize(&self.models_dir)
            .ok()
            .and_then(|dir| canonical.strip_prefix(dir).ok().map(Path::to_path_buf));
        match relative {
            Some(relative) if !relative.as_os_str().is_empty() => {
                relative.to_string_lossy().into_owned()
            }
            _ => canonical.to_string_lossy().into_owned(),
        }
    }

    /// The file a stored path names on this machine.
    pub fn absolute(&self, stored: &str) -> PathBuf {
        let path = Path::new(stored);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.models_dir.join(path)
        }
    }

    fn with_stored_path(&self, mut fingerprint: FileFingerprint) -> FileFingerprint {
        fingerprint.path = self.stored_path(Path::new(&fingerprint.path));
        fingerprint
    }

    /// Resolves `path` to the canonical path of a regular file inside the models directory.
    ///
    /// An absolute path is taken as it is. A relative path is taken relative to the models
    /// directory when something exists there, else relative to the current directory. Either
    /// way the path is canonicalized (every link followed, `..` resolved) and must then be a
    /// regular file strictly inside the canonical models directory; anything else (traversal,
    /// links escaping the directory, directories, devices, paths that do not resolve) is
    /// [`ModelFileError::PathRejected`]. Errors other than "not found" while resolving (e.g. no
    /// permission) are [`ModelFileError::Unavailable`].
    pub fn resolve(&self, path: &str) -> Result<PathBuf, ModelFileError> {
        let dir = std::fs::canonicalize(&self.models_dir).map_err(|error| {
            ModelFileError::Unavailable(format!(
                "the models directory {} does not resolve: {error}",
                self.models_dir.display()
            ))
        })?;
        let given = Path::new(path);
        if path.is_empty() {
            return Err(ModelFileError::PathRejected(String::from(
                "the path is empty",
            )));
        }
        let candidate = if given.is_absolute() {
            given.to_path_buf()
        } else {
            let inside = self.models_dir.join(given);
            if inside.symlink_metadata().is_ok() {
                inside
            } else {
                given.to_path_buf()
            }
        };
        let canonical = std::fs::canonicalize(&candidate).map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => {
                ModelFileError::PathRejected(format!("{path} does not resolve: {error}"))
            }
            _ => ModelFileError::Unavailable(format!("{path}: {error}")),
        })?;
        if canonical == dir || !canonical.starts_with(&dir) {
            return Err(ModelFileError::PathRejected(format!(
                "{path} resolves to {}, outside the models directory {}",
                canonical.display(),
                dir.display()
            )));
        }
        let metadata = std::fs::metadata(&canonical)
            .map_err(|error| ModelFileError::Unavailable(format!("{path}: {error}")))?;
        if !metadata.is_file() {
            return Err(ModelFileError::PathRejected(format!(
                "{} is not a regular file",
                canonical.display()
            )));
        }
        Ok(canonical)
    }
}

#[async_trait]
impl ModelFiles for FsModelFiles {
    async fn fingerprint(&self, path: &str) -> Result<FileFingerprint, ModelFileError> {
        let this = self.clone();
        let path = path.to_owned();
        blocking(move || {
            let canonical = this.resolve(&path)?;
            let hashed = hash_file_with_progress(&canonical, |_, _| {})?;
            Ok(this.with_stored_path(hashed))
        })
        .await
    }

    async fn fingerprint_any(
        &self,
        path: &str,
        progress: Option<Progress>,
    ) -> Result<FileFingerprint, ModelFileError> {
        let this = self.clone();
        let path = PathBuf::from(path);
        blocking(move || {
            let hashed = hash_file_with_progress(&path, |done, total| {
                if let Some(progress) = &progress {
                    progress(done, total);
                }
            })?;
            Ok(this.with_stored_path(hashed))
        })
        .await
    }

    async fn verify(&self, known: &FileFingerprint) -> Result<VerifiedFile, ModelFileError> {
        let known = known.clone();
        let this = self.clone();
        blocking(move || {
            let path = this.absolute(&known.path);
            let metadata = std::fs::metadata(&path).map_err(|error| unavailable(&path, &error))?;
            if !metadata.is_file() {
                return Err(ModelFileError::Unavailable(format!(
                    "{} is no longer a regular file",
                    path.display()
                )));
            }
            let absolute = path.to_string_lossy().into_owned();
            if metadata.len() == known.size_bytes
                && modified_millis(&metadata) == known.modified_millis
            {
                return Ok(VerifiedFile {
                    path: absolute,
                    rehashed: None,
                });
            }
            let mut rehashed = hash_file_with_progress(&path, |_, _| {})?;
            rehashed.path = known.path.clone();
            if rehashed.digest == known.digest {
                Ok(VerifiedFile {
                    path: absolute,
                    rehashed: Some(rehashed),
                })
            } else {
                Err(ModelFileError::DigestMismatch)
            }
        })
        .await
    }

    async fn find_models(&self) -> Result<Vec<String>, ModelFileError> {
        let dir = self.models_dir.clone();
        blocking(move || {
            let entries = std::fs::read_dir(&dir).map_err(|error| unavailable(&dir, &error))?;
            let mut found: Vec<String> = entries
                .flatten()
                .filter(|entry| entry.path().is_file())
                .filter_map(|entry| entry.file_name().into_string().ok())
                .filter(|name| !name.starts_with('.') && ModelFormat::of_path(name).is_some())
                .collect();
            found.sort();
            Ok(found)
        })
        .await
    }

    async fn install_reference_corpus(&self) -> Result<String, ModelFileError> {
        let path = self.models_dir.join(REFERENCE_FILE);
        blocking(move || {
            write_reference_corpus(&path).map_err(|error| unavailable(&path, &error))?;
            Ok(String::from(REFERENCE_FILE))
        })
        .await
    }
}

/// The name of the reference corpus in the models directory.
pub const REFERENCE_FILE: &str = "reference.txt";

/// Hashes the file at `path` (links followed) with streaming SHA-256 and a fixed 64 KiB buffer,
/// calling `on_progress(bytes_done, total_bytes)` once before reading and after every chunk.
/// Blocking: call it from a blocking thread (e.g. `tokio::task::spawn_blocking`). Checks no
/// directory: use [`FsModelFiles::resolve`] first when the file must be inside one.
///
/// The fingerprint's `path` is the canonical path; size and modification time are those of the
/// file when it was opened. A file that changes size or modification time while being hashed
/// is [`ModelFileError::Unavailable`] (try again); a missing or unreadable file too, and a path
/// that is not a regular file is [`ModelFileError::PathRejected`].
pub fn hash_file_with_progress(
    path: &Path,
    mut on_progress: impl FnMut(u64, u64),
) -> Result<FileFingerprint, ModelFileError> {
    let canonical = std::fs::canonicalize(path).map_err(|error| unavailable(path, &error))?;
    let mut file = File::open(&canonical).map_err(|error| unavailable(&canonical, &error))?;
    let before = file
        .metadata()
        .map_err(|error| unavailable(&canonical, &error))?;
    if !before.is_file() {
        return Err(ModelFileError::PathRejected(format!(
            "{} is not a regular file",
            canonical.display()
        )));
    }
    let total = before.len();
    let mut hasher = Sha256::new();
    let mut buffer = vec![0_u8; HASH_BUFFER_BYTES];
    let mut done: u64 = 0;
    on_progress(done, total);
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(unavailable(&canonical, &error)),
        };
        hasher.update(&buffer[..read]);
        done = done.saturating_add(read as u64);
        on_progress(done, total.max(done));
    }
    let after = std::fs::metadata(&canonical).map_err(|error| unavailable(&canonical, &error))?;
    if after.len() != total || done != total || modified_millis(&after) != modified_millis(&before)
    {
        return Err(ModelFileError::Unavailable(format!(
            "{} changed while it was being hashed",
            canonical.display()
        )));
    }
    Ok(FileFingerprint {
        path: canonical.to_string_lossy().into_owned(),
        size_bytes: total,
        modified_millis: modified_millis(&before),
        digest: Digest::from_sha256(hasher.finalize().into()),
    })
}

/// A file's modification time in milliseconds since the epoch (negative before it; 0 when the
/// platform does not report one).
fn modified_millis(metadata: &Metadata) -> i64 {
    let Ok(modified) = metadata.modified() else {
        return 0;
    };
    match modified.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis())
            .map(|millis| -millis)
            .unwrap_or(i64::MIN),
    }
}

fn unavailable(path: &Path, error: &io::Error) -> ModelFileError {
    ModelFileError::Unavailable(format!("{}: {error}", path.display()))
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ModelFileError> + Send + 'static,
) -> Result<T, ModelFileError> {
    tokio::task::spawn_blocking(work).await.map_err(|error| {
        ModelFileError::Unavailable(format!("the hashing thread failed: {error}"))
    })?
}
