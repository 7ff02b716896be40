//! The write path (ARCHITECTURE.md): one thread owns the write connection and commits every pending
//! command in one `BEGIN IMMEDIATE` transaction with a savepoint per command (group commit). The
//! hook hears the batch's events after the commit; callers are answered after the commit.
//!
//! The writer supervises itself: a command that panics (a bug) is rolled back to its savepoint
//! and answered with an error while the rest of its batch commits, and a listener that panics
//! loses only that notification. So the one thread every write depends on never dies while the
//! store is open, and a health check that commits through it tells the truth.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use lmsp_domain::event::Event;
use lmsp_domain::ports::{CommitStats, StoreError, StoreListener};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::error::DbError;

/// The most commands one transaction carries.
pub const MAX_BATCH: usize = 256;

/// A command's work inside its savepoint: its reply value and the events it wrote.
pub type Work<T> = Box<dyn FnOnce(&Connection) -> Result<(T, Vec<Event>), DbError> + Send>;

/// A command queued for the writer.
pub trait Command: Send {
    /// Runs the command inside its savepoint; returns the events it wrote (empty on failure).
    fn run(&mut self, conn: &Connection) -> Vec<Event>;
    /// The error the command failed with, if it failed.
    fn failure(&self) -> Option<StoreError>;
    /// Answers the caller once the batch's fate is known.
    fn answer(self: Box<Self>, commit: Result<(), StoreError>);
}

/// A typed command: its work, its result and where the caller waits.
pub struct Typed<T> {
    work: Option<Work<T>>,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T> std::fmt::Debug for Typed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Typed").finish_non_exhaustive()
    }
}

impl<T: Send> Typed<T> {
    /// A command and the receiver its answer arrives on.
    pub fn new(work: Work<T>) -> (Self, oneshot::Receiver<Result<T, StoreError>>) {
        let (reply, rx) = oneshot::channel();
        (
            Self {
                work: Some(work),
                result: None,
                reply,
            },
            rx,
        )
    }
}

impl<T: Send> Command for Typed<T> {
    fn run(&mut self, conn: &Connection) -> Vec<Event> {
        let Some(work) = self.work.take() else {
            return Vec::new();
        };
        if let Err(error) = exec(conn, "SAVEPOINT cmd") {
            self.result = Some(Err(DbError::from(error).into()));
            return Vec::new();
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| work(conn)))
            .unwrap_or_else(|panic| Err(DbError::Panicked(panic_message(panic.as_ref()))));
        match outcome {
            Ok((value, events)) => match exec(conn, "RELEASE cmd") {
                Ok(()) => {
                    self.result = Some(Ok(value));
                    events
                }
                Err(error) => {
                    let _ = conn.execute_batch("ROLLBACK TO cmd; RELEASE cmd");
                    self.result = Some(Err(DbError::from(error).into()));
                    Vec::new()
                }
            },
            Err(error) => {
                let _ = conn.execute_batch("ROLLBACK TO cmd; RELEASE cmd");
                self.result = Some(Err(error.into()));
                Vec::new()
            }
        }
    }

    fn failure(&self) -> Option<StoreError> {
        match &self.result {
            Some(Err(error)) => Some(error.clone()),
            _ => None,
        }
    }

    fn answer(self: Box<Self>, commit: Result<(), StoreError>) {
        let outcome = match (commit, self.result) {
            (Err(error), _) => Err(error),
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(StoreError::Unavailable(String::from("command never ran"))),
        };
        let _ = self.reply.send(outcome);
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| String::from("a panic"))
}

/// Runs a cached, parameterless statement.
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Commits between two passive WAL checkpoints.
const CHECKPOINT_EVERY: u64 = 512;

/// The writer loop: runs until every sender is gone.
pub fn run(conn: Connection, rx: Receiver<Box<dyn Command>>, hook: Arc<dyn StoreListener>) {
    let mut commits: u64 = 0;
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::with_capacity(16);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let started = Instant::now();
        let (commit, events) = commit_batch(&conn, &mut batch);
        let stats = CommitStats {
            commands: batch.len(),
            events: events.len(),
            duration: started.elapsed(),
            committed: commit.is_ok(),
        };
        // A panicking listener loses its notification, never the writer.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            hook.transaction_measured(stats);
            if commit.is_ok() && !events.is_empty() {
                hook.committed(&events);
            }
        }));
        for command in batch {
            command.answer(commit.clone());
        }
        commits += 1;
        if commits >= CHECKPOINT_EVERY {
            commits = 0;
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
    }
    // Every sender is gone: a clean close. Fold the WAL into the database file, so that
    // `lmsp.db` alone is complete (a copy of it is a backup).
    let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
}

fn commit_batch(
    conn: &Connection,
    batch: &mut [Box<dyn Command>],
) -> (Result<(), StoreError>, Vec<Event>) {
    if let Err(error) = exec(conn, "BEGIN IMMEDIATE") {
        return (Err(DbError::from(error).into()), Vec::new());
    }
    let mut events = Vec::new();
    for command in batch.iter_mut() {
        events.extend(command.run(conn));
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (SQLITE_FULL, I/O error): nothing of the
            // batch is written, so every caller of the batch gets the error.
            let error = command.failure().unwrap_or_else(|| {
                StoreError::Unavailable(String::from("the transaction was rolled back"))
            });
            return (Err(error), Vec::new());
        }
    }
    match exec(conn, "COMMIT") {
        Ok(()) => (Ok(()), events),
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            (Err(DbError::from(error).into()), Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    fn command(work: Work<u32>) -> (Box<dyn Command>, oneshot::Receiver<Result<u32, StoreError>>) {
        let (command, rx) = Typed::new(work);
        (Box::new(command), rx)
    }

    /// A command that panics is rolled back alone and answered with an error; the writer lives
    /// on and commits the other commands, of the same batch and later ones.
    #[test]
    fn a_panicking_command_fails_alone_and_the_writer_lives_on() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (v INTEGER)").unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn Command>>();
        let (panicking, panicked) = command(Box::new(|conn| {
            conn.execute("INSERT INTO t VALUES (1)", [])?;
            panic!("a bug");
        }));
        let (fine, answered) = command(Box::new(|conn| {
            conn.execute("INSERT INTO t VALUES (2)", [])?;
            Ok((2, Vec::new()))
        }));
        tx.send(panicking).unwrap();
        tx.send(fine).unwrap();
        let writer = std::thread::spawn(move || {
            run(conn, rx, Arc::new(crate::NoListener));
        });
        assert!(matches!(
            panicked.blocking_recv().unwrap(),
            Err(StoreError::Unavailable(message)) if message.contains("a bug")
        ));
        assert_eq!(answered.blocking_recv().unwrap(), Ok(2));
        let (count, counted) = command(Box::new(|conn| {
            let rows: u32 = conn.query_row("SELECT count(*) FROM t", [], |row| row.get(0))?;
            let values: u32 = conn.query_row("SELECT sum(v) FROM t", [], |row| row.get(0))?;
            Ok((rows * 10 + values, Vec::new()))
        }));
        tx.send(count).unwrap();
        assert_eq!(
            counted.blocking_recv().unwrap(),
            Ok(12),
            "only the second row is there"
        );
        drop(tx);
        writer.join().unwrap();
    }
}
