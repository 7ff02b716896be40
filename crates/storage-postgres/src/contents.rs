//! The bytes of files ([`FileContents`]) on PostgreSQL: rows of `file_chunks`, each part at
//! most [`PART_BYTES`], in the shared database because every instance must read them.
//!
//! A writer buffers what it is given and inserts each full part as it fills (each insert its own
//! statement, committed at once), then the last part at [`ContentWriter::finish`]. The file's
//! record is stored only after that, so the parts of an upload that never finished are garbage
//! no record names: a writer dropped unfinished (an upload that failed, was refused or that its
//! client gave up on) deletes them in a task of its own, and a removal of the file's id drops
//! them too. A reader reads one part per call, in order.

use async_trait::async_trait;
use lmsp_domain::ids::FileId;
use lmsp_domain::ports::{ContentReader, ContentWriter, FileContents, StoreError};

use crate::error::DbError;
use crate::ops::{self, Db};

/// The most bytes one part (one `file_chunks` row) holds.
pub const PART_BYTES: usize = 1 << 20;

/// Files' bytes in the database of a [`crate::PostgresStore`]
/// ([`crate::PostgresStore::file_contents`]).
#[derive(Clone)]
pub struct PostgresFileContents {
    pool: deadpool_postgres::Pool,
}

impl std::fmt::Debug for PostgresFileContents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresFileContents")
            .finish_non_exhaustive()
    }
}

impl PostgresFileContents {
    /// The bytes of files in the database `pool` connects to.
    pub(crate) fn new(pool: deadpool_postgres::Pool) -> Self {
        Self { pool }
    }
}

async fn conn(pool: &deadpool_postgres::Pool) -> Result<deadpool_postgres::Object, DbError> {
    Ok(pool.get().await?)
}

#[async_trait]
impl FileContents for PostgresFileContents {
    async fn create(&self, id: FileId) -> Result<Box<dyn ContentWriter>, StoreError> {
        Ok(Box::new(PartWriter {
            pool: self.pool.clone(),
            file: ops::file_key(id),
            part: 0,
            buffer: Vec::new(),
            state: WriterState::Untouched,
        }))
    }

    async fn open(&self, id: FileId) -> Result<Option<Box<dyn ContentReader>>, StoreError> {
        let file = ops::file_key(id);
        let conn = conn(&self.pool).await?;
        let db: &deadpool_postgres::ClientWrapper = &conn;
        // An empty file has a record and no part; a file being written has parts and no record.
        let row = db
            .query_opt(
                "SELECT EXISTS (SELECT 1 FROM files WHERE id = $1) \
                 OR EXISTS (SELECT 1 FROM file_chunks WHERE file_id = $1 AND part = 0)",
                &[&file],
            )
            .await
            .map_err(DbError::from)?;
        let exists = match row {
            Some(row) => row.try_get::<_, bool>(0).map_err(DbError::from)?,
            None => false,
        };
        if !exists {
            return Ok(None);
        }
        Ok(Some(Box::new(PartReader {
            pool: self.pool.clone(),
            file,
            part: 0,
            done: false,
        })))
    }

    async fn remove(&self, id: FileId) -> Result<(), StoreError> {
        Ok(delete_parts(&self.pool, &ops::file_key(id)).await?)
    }
}

/// Deletes every part of the file whose key is `file`.
async fn delete_parts(pool: &deadpool_postgres::Pool, file: &[u8]) -> Result<(), DbError> {
    let conn = conn(pool).await?;
    let db: &deadpool_postgres::ClientWrapper = &conn;
    db.execute("DELETE FROM file_chunks WHERE file_id = $1", &[&file])
        .await?;
    Ok(())
}

/// Whether a writer's parts are to be deleted if it is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriterState {
    /// No part was inserted: nothing to delete.
    Untouched,
    /// Parts may be stored: dropped now, it deletes them.
    Writing,
    /// Every part is stored: the file's record names them next.
    Finished,
}

/// Writes one file's parts as they fill.
struct PartWriter {
    pool: deadpool_postgres::Pool,
    file: Vec<u8>,
    part: i32,
    buffer: Vec<u8>,
    state: WriterState,
}

impl Drop for PartWriter {
    /// An unfinished write leaves no parts: they are deleted in a task of its own (drop cannot
    /// wait). Without a runtime, or when the delete fails, they stay until the file's id is
    /// removed.
    fn drop(&mut self) {
        if self.state != WriterState::Writing {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, file) = (self.pool.clone(), std::mem::take(&mut self.file));
        runtime.spawn(async move {
            if let Err(error) = delete_parts(&pool, &file).await {
                tracing::warn!(%error, "could not delete the parts of an unfinished upload");
            }
        });
    }
}

impl PartWriter {
    /// Inserts `data` as the next part (again over a part an earlier attempt left).
    async fn insert(&mut self, data: Vec<u8>) -> Result<(), StoreError> {
        if self.state == WriterState::Untouched {
            self.state = WriterState::Writing;
        }
        let conn = conn(&self.pool).await?;
        let db: &deadpool_postgres::ClientWrapper = &conn;
        db.execute(
            "INSERT INTO file_chunks (file_id, part, data) VALUES ($1, $2, $3) \
             ON CONFLICT (file_id, part) DO UPDATE SET data = EXCLUDED.data",
            &[&self.file, &self.part, &data],
        )
        .await
        .map_err(DbError::from)?;
        self.part = self.part.checked_add(1).ok_or(StoreError::Full)?;
        Ok(())
    }
}

#[async_trait]
impl ContentWriter for PartWriter {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        self.buffer.extend_from_slice(chunk);
        while self.buffer.len() >= PART_BYTES {
            let rest = self.buffer.split_off(PART_BYTES);
            let full = std::mem::replace(&mut self.buffer, rest);
            self.insert(full).await?;
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<(), StoreError> {
        if !self.buffer.is_empty() {
            let last = std::mem::take(&mut self.buffer);
            self.insert(last).await?;
        }
        self.state = WriterState::Finished;
        Ok(())
    }
}

/// Reads one file's parts in order.
struct PartReader {
    pool: deadpool_postgres::Pool,
    file: Vec<u8>,
    part: i32,
    done: bool,
}

#[async_trait]
impl ContentReader for PartReader {
    async fn read(&mut self) -> Result<Vec<u8>, StoreError> {
        if self.done {
            return Ok(Vec::new());
        }
        let conn = conn(&self.pool).await?;
        let db: &deadpool_postgres::ClientWrapper = &conn;
        let row = db
            .query_opt(
                "SELECT data FROM file_chunks WHERE file_id = $1 AND part = $2",
                &[&self.file, &self.part],
            )
            .await
            .map_err(DbError::from)?;
        let data: Vec<u8> = match row {
            Some(row) => row.try_get(0).map_err(DbError::from)?,
            None => Vec::new(),
        };
        if data.is_empty() {
            self.done = true;
        } else {
            self.part += 1;
        }
        Ok(data)
    }
}
