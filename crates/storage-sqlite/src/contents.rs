//! The bytes of files, beside the SQLite database: one file per stored file in a directory
//! (`DATA_DIR/files/`), named by the file's id. A file is written under a `.part` name, synced and
//! renamed into place by [`ContentWriter::finish`], so its record (stored only after that) never
//! names bytes that are not all on disk. A writer dropped unfinished (an upload that failed, was
//! refused or that its client gave up on) removes its `.part` file; the leftovers of a crash are
//! removed at open.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use tokio::fs;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};

use lmsp_domain::ids::FileId;
use lmsp_domain::ports::{ContentReader, ContentWriter, FileContents, StoreError};

/// How many bytes a read hands over at a time.
const READ_CHUNK: usize = 64 * 1024;

fn unavailable(what: &str, path: &Path, error: std::io::Error) -> StoreError {
    if error.raw_os_error() == Some(28) {
        return StoreError::Full;
    }
    StoreError::Unavailable(format!("cannot {what} {}: {error}", path.display()))
}

/// Files' bytes in a directory.
#[derive(Debug, Clone)]
pub struct FileDir {
    dir: PathBuf,
}

impl FileDir {
    /// The directory `dir` (created if missing), without the leftovers of interrupted writes.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| unavailable("create", dir, e))?;
        let entries = std::fs::read_dir(dir).map_err(|e| unavailable("read", dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "part") {
                // A leftover: no record names it. Failing to remove it only wastes space.
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Where file `id`'s bytes are. An id is a prefix and a ULID, never a path.
    fn path_of(&self, id: FileId) -> PathBuf {
        self.dir.join(id.to_string())
    }
}

#[async_trait]
impl FileContents for FileDir {
    async fn create(&self, id: FileId) -> Result<Box<dyn ContentWriter>, StoreError> {
        let path = self.path_of(id);
        let part = path.with_extension("part");
        // Created at once, not awaited: a request dropped while an asynchronous create was under
        // way would leave a `.part` that no writer is there to remove.
        let file = std::fs::File::create(&part).map_err(|e| unavailable("create", &part, e))?;
        Ok(Box::new(DirWriter {
            file: BufWriter::with_capacity(256 * 1024, fs::File::from_std(file)),
            part,
            path,
            dir: self.dir.clone(),
            renamed: false,
        }))
    }

    async fn open(&self, id: FileId) -> Result<Option<Box<dyn ContentReader>>, StoreError> {
        let path = self.path_of(id);
        match fs::File::open(&path).await {
            Ok(file) => Ok(Some(Box::new(DirReader { file, path }))),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(None),
            Err(error) => Err(unavailable("open", &path, error)),
        }
    }

    async fn remove(&self, id: FileId) -> Result<(), StoreError> {
        let path = self.path_of(id);
        match fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(()),
            Err(error) => Err(unavailable("remove", &path, error)),
        }
    }
}

struct DirWriter {
    file: BufWriter<fs::File>,
    part: PathBuf,
    path: PathBuf,
    dir: PathBuf,
    /// Whether the `.part` file became the file (then there is no `.part` to remove).
    renamed: bool,
}

impl Drop for DirWriter {
    /// An unfinished write leaves nothing: its `.part` file goes (whatever stopped it: an error,
    /// a refusal, or the request's future dropped when its client went away).
    fn drop(&mut self) {
        if !self.renamed {
            // Synchronous, as drop must be: unlinking one name does not wait for its bytes. A
            // failure only leaves a leftover that the next open removes.
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

#[async_trait]
impl ContentWriter for DirWriter {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        self.file
            .write_all(chunk)
            .await
            .map_err(|e| unavailable("write", &self.part, e))
    }

    async fn finish(mut self: Box<Self>) -> Result<(), StoreError> {
        self.file
            .flush()
            .await
            .map_err(|e| unavailable("write", &self.part, e))?;
        self.file
            .get_ref()
            .sync_all()
            .await
            .map_err(|e| unavailable("sync", &self.part, e))?;
        // Renamed at once, not awaited, for the same reason as the create: the writer knows
        // whether its `.part` is still there when it is dropped.
        std::fs::rename(&self.part, &self.path)
            .map_err(|e| unavailable("rename", &self.part, e))?;
        self.renamed = true;
        // The rename is durable once the directory is synced.
        let dir = fs::File::open(&self.dir)
            .await
            .map_err(|e| unavailable("open", &self.dir, e))?;
        dir.sync_all()
            .await
            .map_err(|e| unavailable("sync", &self.dir, e))
    }
}

struct DirReader {
    file: fs::File,
    path: PathBuf,
}

#[async_trait]
impl ContentReader for DirReader {
    async fn read(&mut self) -> Result<Vec<u8>, StoreError> {
        let mut chunk = vec![0; READ_CHUNK];
        let n = self
            .file
            .read(&mut chunk)
            .await
            .map_err(|e| unavailable("read", &self.path, e))?;
        chunk.truncate(n);
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use ulid::Ulid;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_writer_dropped_unfinished_leaves_no_part_file() {
        let temp = tempfile::tempdir().unwrap();
        let files = FileDir::open(temp.path()).unwrap();
        let mut writer = files.create(FileId::from_ulid(Ulid::new())).await.unwrap();
        writer.write(&[7; 300 * 1024]).await.unwrap();
        assert_eq!(
            names(temp.path()).len(),
            1,
            "the `.part` file while writing"
        );
        drop(writer);
        assert!(names(temp.path()).is_empty(), "{:?}", names(temp.path()));

        let empty = files.create(FileId::from_ulid(Ulid::new())).await.unwrap();
        drop(empty);
        assert!(names(temp.path()).is_empty(), "nor an empty one");
    }

    #[tokio::test]
    async fn a_finished_writer_leaves_the_file_only() {
        let temp = tempfile::tempdir().unwrap();
        let files = FileDir::open(temp.path()).unwrap();
        let id = FileId::from_ulid(Ulid::new());
        let mut writer = files.create(id).await.unwrap();
        writer.write(b"bytes").await.unwrap();
        writer.finish().await.unwrap();
        assert_eq!(names(temp.path()), vec![id.to_string()]);
        let mut reader = files.open(id).await.unwrap().unwrap();
        assert_eq!(reader.read().await.unwrap(), b"bytes");
    }
}
