//! The read-only connections: a small pool, at most as many reads at once as connections.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::error::DbError;

/// The read-only connections.
#[derive(Debug)]
pub struct ReadPool {
    /// The database file.
    pub path: PathBuf,
    busy_timeout: Duration,
    keep: usize,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    /// A pool of at most `keep` idle connections to `path`.
    pub fn new(path: PathBuf, busy_timeout: Duration, keep: usize) -> Self {
        Self {
            path,
            busy_timeout,
            keep: keep.max(1),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// How many connections it keeps.
    pub fn size(&self) -> usize {
        self.keep
    }

    fn open_one(&self) -> Result<Connection, DbError> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )?;
        conn.busy_timeout(self.busy_timeout)?;
        conn.set_prepared_statement_cache_capacity(64);
        Ok(conn)
    }

    /// Runs `f` on an idle connection (opening one when none is idle).
    pub fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T, DbError>) -> Result<T, DbError> {
        let taken = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match taken {
            Some(conn) => conn,
            None => self.open_one()?,
        };
        let result = f(&conn);
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < self.keep {
                idle.push(conn);
            }
        }
        result
    }
}
