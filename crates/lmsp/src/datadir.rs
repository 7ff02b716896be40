//! The data directory: created readable by its owner only, and locked by the one `lmsp serve`
//! that uses it (an OS file lock, taken before the database is opened or anything recovered), so
//! that a second server on it exits at once and changes nothing.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
/// The database file in a data directory.
pub fn database_path(data_dir: &Path) -> PathBuf {
    data_dir.join("lmsp.db")
}

/// Makes every file and directory this process creates readable by its owner only (0600 and
/// 0700), the database, its WAL and the models directory included.
pub fn private_files() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Creates the data directory if needed and takes its lock; the lock holds while the returned
/// file lives.
pub fn lock(data_dir: &Path) -> anyhow::Result<File> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let path = data_dir.join("lmsp.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "the data directory {} is in use by another lmsp serve; stop it first, or give \
             this one another --data-dir",
            data_dir.display()
        ),
        Err(std::fs::TryLockError::Error(error)) => Err(error)
            .with_context(|| format!("cannot lock the data directory {}", data_dir.display())),
    }
}

/// The database of an existing data directory, for the offline commands: they never create one.
pub fn existing_database(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let path = database_path(data_dir);
    if !path.is_file() {
        bail!(
            "there is no LMSP database at {}: run `lmsp serve --data-dir {}` once to create it",
            path.display(),
            data_dir.display()
        );
    }
    Ok(path)
}
