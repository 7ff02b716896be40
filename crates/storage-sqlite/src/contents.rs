//! The bytes of files, beside the SQLite database: one file per stored file in a directory
//! (`DATA_DIR/files/`), named by the file's id. A file is written under a `.part` name, synced and
//! renamed into place by [`ContentWriter::finish`], so its record (stored only after that) never
//! names bytes that are not all on disk; `.part` leftovers of an interrupted upload are removed at
//! open.

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
        let file = fs::File::create(&part)
            .await
            .map_err(|e| unavailable("create", &part, e))?;
        Ok(Box::new(DirWriter {
            file: BufWriter::with_capacity(256 * 1024, file),
            part,
            path,
            dir: self.dir.clone(),
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
        fs::rename(&self.part, &self.path)
            .await
            .map_err(|e| unavailable("rename", &self.part, e))?;
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
