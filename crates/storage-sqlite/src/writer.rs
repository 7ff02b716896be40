//! The write path (ARCHITECTURE.md): one thread owns the write connection and commits every pending
//! command in one `BEGIN IMMEDIATE` transaction with a savepoint per command (group commit). The
//! hook hears the batch's events after the commit; callers are answered after the commit.
//!
//! The writer is supervised at two levels. A command that panics (a bug) is rolled back to its
//! savepoint and answered with an error while the rest of its batch commits, and a listener that
//! panics loses only that notification. A failure of the write path itself (a panic outside any
//! command's savepoint) fails the batch it hit, tells the hook of a failed transaction (so health
//! turns 503 at once), and [`supervise`] restarts the loop on a fresh connection; past a budget
//! of restarts in a window it gives up, publishes why in its [`WriterStatus`], and every later
//! write fails, so the binary exits non-zero for its own supervisor to start it afresh. Either
//! way the service never keeps serving behind a dead writer.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmsp_domain::event::Event;
use lmsp_domain::ports::{CommitStats, StoreError, StoreListener};
use rusqlite::Connection;
use tokio::sync::{oneshot, watch};

use crate::error::DbError;

/// The most commands one transaction carries.
pub const MAX_BATCH: usize = 256;

/// A command's work inside its savepoint: its reply value and the events it wrote.
pub type Work<T> = Box<dyn FnOnce(&Connection) -> Result<(T, Vec<Event>), DbError> + Send>;

/// Where SQLite keeps a savepoint's journal (the pages the command changed that existed before
/// it, as they were, for a rollback to the savepoint) while a transaction runs: `temp_store`,
/// set between transactions, since SQLite reads it when a transaction begins.
///
/// In memory the journal costs a copy of each page a command first changes; in a file it costs
/// that copy and, past 64 KiB in one savepoint, a new unlinked file written through the kernel
/// (never synced: the WAL is the durable log), which was a fifth of the writer's time on fair
/// claims across tiers (≈ 20 pages each). A command that may touch any number of pages (a
/// batch's start, a recovery or purge pass) would hold all of them in memory until it commits
/// (+20 MiB for a 50 000-line batch's start), so only commands that change a bounded few rows
/// ([`Typed::small`]: one task's row, spec, events and snapshot, one key, one lease; at most a
/// request body's worth of pages) ask for memory, and a transaction gets it only if all its
/// commands do. A savepoint's journal is dropped when the command's savepoint is released, so
/// a transaction of many small commands holds one command's pages at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journal {
    /// `temp_store=MEMORY`.
    Memory,
    /// `temp_store=FILE`: past 64 KiB, an unlinked temporary file.
    File,
}

impl Journal {
    fn pragma(self) -> &'static str {
        match self {
            Journal::Memory => "PRAGMA temp_store = MEMORY",
            Journal::File => "PRAGMA temp_store = FILE",
        }
    }

    /// The journal a transaction of `batch` gets: in memory only if every command may have it so.
    fn for_batch(batch: &[Box<dyn Command>]) -> Journal {
        if batch
            .iter()
            .all(|command| command.journal() == Journal::Memory)
        {
            Journal::Memory
        } else {
            Journal::File
        }
    }
}

/// A command queued for the writer.
pub trait Command: Send {
    /// Where its savepoint's journal may be kept.
    fn journal(&self) -> Journal {
        Journal::File
    }
    /// Runs the command inside its savepoint; returns the events it wrote (empty on failure).
    fn run(&mut self, conn: &Connection) -> Vec<Event>;
    /// The error the command failed with, if it failed.
    fn failure(&self) -> Option<StoreError>;
    /// Answers the caller once the batch's fate is known.
    fn answer(self: Box<Self>, commit: Result<(), StoreError>);
}

/// A typed command: its work, its result and where the caller waits.
pub struct Typed<T> {
    journal: Journal,
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
        Self::with_journal(work, Journal::File)
    }

    /// A command that changes a bounded few rows (one task and what hangs on it, one key, one
    /// lease), whose savepoint journal may stay in memory ([`Journal`]).
    pub fn small(work: Work<T>) -> (Self, oneshot::Receiver<Result<T, StoreError>>) {
        Self::with_journal(work, Journal::Memory)
    }

    fn with_journal(
        work: Work<T>,
        journal: Journal,
    ) -> (Self, oneshot::Receiver<Result<T, StoreError>>) {
        let (reply, rx) = oneshot::channel();
        (
            Self {
                journal,
                work: Some(work),
                result: None,
                reply,
            },
            rx,
        )
    }
}

impl<T: Send> Command for Typed<T> {
    fn journal(&self) -> Journal {
        self.journal
    }

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

/// How often the writer may be restarted on a fresh connection before it gives up for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartBudget {
    /// The most restarts within `window`; one failure more and the writer stays stopped.
    pub restarts: u32,
    /// The window the restarts are counted in.
    pub window: Duration,
}

impl Default for RestartBudget {
    fn default() -> Self {
        Self {
            restarts: 5,
            window: Duration::from_secs(60),
        }
    }
}

/// What the writer's supervisor tells of the writer: how often it was restarted, and whether it
/// gave up (watch it with [`crate::SqliteStore::writer_status`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStatus {
    /// Restarts on a fresh connection so far.
    pub restarts: u64,
    /// Why the writer failed last, if it ever did.
    pub last_failure: Option<String>,
    /// Set when the writer failed past its [`RestartBudget`]: it stays stopped and every write
    /// fails, so the process must exit (non-zero) to be started afresh.
    pub stopped: Option<String>,
}

/// Opens a fresh write connection, configured like the first one.
pub type Reopen = Box<dyn Fn() -> Result<Connection, DbError> + Send>;

/// Why one run of the writer loop ended.
enum Ended {
    /// Every sender is gone: a clean close.
    Closed,
    /// The write path failed outside any command: the connection's state is unknown.
    Failed(String),
}

/// Runs the writer loop on `first` until every sender is gone, restarting it on a connection
/// from `reopen` whenever the write path itself fails, within `budget`; past it, gives up (every
/// later write fails with "the writer has stopped") and says why in `status`.
pub fn supervise(
    first: Connection,
    reopen: Reopen,
    rx: Receiver<Box<dyn Command>>,
    hook: Arc<dyn StoreListener>,
    budget: RestartBudget,
    status: Arc<watch::Sender<WriterStatus>>,
) {
    let mut conn = first;
    let mut failures = VecDeque::new();
    loop {
        let reason = match catch_unwind(AssertUnwindSafe(|| run(&conn, &rx, hook.as_ref()))) {
            Ok(Ended::Closed) => {
                // Every sender is gone: a clean close. Fold the WAL into the database file, so
                // that `lmsp.db` alone is complete (a copy of it is a backup).
                let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
                return;
            }
            Ok(Ended::Failed(reason)) => reason,
            Err(panic) => {
                // Failed between two batches: no caller waits, but health must hear of it.
                tell_failure(hook.as_ref(), 0, Duration::ZERO);
                format!("the writer failed: {}", panic_message(panic.as_ref()))
            }
        };
        // Closing the failed connection rolls back whatever it had begun.
        drop(conn);
        status.send_modify(|now| now.last_failure = Some(reason.clone()));
        match reconnect(&reopen, &mut failures, budget, reason) {
            Ok(fresh) => {
                conn = fresh;
                status.send_modify(|now| now.restarts += 1);
            }
            Err(last) => {
                // Say why first: a write that finds the writer gone then tells the reason.
                status.send_modify(|now| now.stopped = Some(last));
                drop(rx);
                return;
            }
        }
    }
}

/// Opens the connection a failed writer restarts on, backing off between failed attempts, unless
/// the budget of restarts in its window is spent: then the last reason the writer cannot go on.
fn reconnect(
    reopen: &Reopen,
    failures: &mut VecDeque<Instant>,
    budget: RestartBudget,
    mut reason: String,
) -> Result<Connection, String> {
    loop {
        let now = Instant::now();
        while failures
            .front()
            .is_some_and(|at| now.duration_since(*at) > budget.window)
        {
            failures.pop_front();
        }
        if failures.len() >= budget.restarts as usize {
            return Err(format!(
                "the writer failed {} times within {:?}, more than the {} restarts allowed; \
                 last: {reason}",
                failures.len() + 1,
                budget.window,
                budget.restarts
            ));
        }
        if !failures.is_empty() {
            let exponent = u32::try_from(failures.len() - 1).unwrap_or(u32::MAX).min(5);
            std::thread::sleep(Duration::from_millis(50) * 2_u32.pow(exponent));
        }
        failures.push_back(now);
        match catch_unwind(AssertUnwindSafe(reopen)) {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(error)) => reason = format!("cannot reopen the database: {error}"),
            Err(panic) => {
                reason = format!(
                    "cannot reopen the database: {}",
                    panic_message(panic.as_ref())
                );
            }
        }
    }
}

/// Tells the hook of a transaction that did not commit; a panicking hook loses it.
fn tell_failure(hook: &dyn StoreListener, commands: usize, duration: Duration) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        hook.transaction_measured(CommitStats {
            commands,
            events: 0,
            duration,
            committed: false,
        });
    }));
}

/// The writer loop on one connection: runs until every sender is gone, or the write path itself
/// fails (the batch it was committing is answered with the error first).
fn run(conn: &Connection, rx: &Receiver<Box<dyn Command>>, hook: &dyn StoreListener) -> Ended {
    let mut commits: u64 = 0;
    // Unknown until set: the connection may have been configured either way.
    let mut journal: Option<Journal> = None;
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::with_capacity(16);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let wanted = Journal::for_batch(&batch);
        if journal != Some(wanted) {
            // A failed switch leaves the setting unknown (either is correct, only slower or
            // larger), to be tried again with the next transaction.
            journal = exec(conn, wanted.pragma()).ok().map(|()| wanted);
        }
        let started = Instant::now();
        let (commit, events, failed) =
            match catch_unwind(AssertUnwindSafe(|| commit_batch(conn, &mut batch))) {
                Ok((commit, events)) => (commit, events, None),
                Err(panic) => {
                    let reason = format!("the writer failed: {}", panic_message(panic.as_ref()));
                    (
                        Err(StoreError::Unavailable(reason.clone())),
                        Vec::new(),
                        Some(reason),
                    )
                }
            };
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
        if let Some(reason) = failed {
            return Ended::Failed(reason);
        }
        commits += 1;
        if commits >= CHECKPOINT_EVERY {
            commits = 0;
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
    }
    Ended::Closed
}

/// A command that makes the write path itself fail (a panic outside any savepoint), as a bug in
/// the writer would: the seam of the tests that watch the writer be restarted.
#[derive(Debug)]
pub struct FailTheWriter;

impl Command for FailTheWriter {
    fn run(&mut self, _conn: &Connection) -> Vec<Event> {
        std::panic::panic_any(String::from("the write path failed on purpose (a test)"))
    }

    fn failure(&self) -> Option<StoreError> {
        None
    }

    fn answer(self: Box<Self>, _commit: Result<(), StoreError>) {}
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

    use std::sync::PoisonError;

    use super::*;

    type Answer = oneshot::Receiver<Result<u32, StoreError>>;

    /// Held by the tests whose commands spill a savepoint journal to a temporary file, so that
    /// the one that counts such files sees only its own.
    static SPILLING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn command(work: Work<u32>) -> (Box<dyn Command>, Answer) {
        let (command, rx) = Typed::new(work);
        (Box::new(command), rx)
    }

    fn small(work: Work<u32>) -> (Box<dyn Command>, Answer) {
        let (command, rx) = Typed::small(work);
        (Box::new(command), rx)
    }

    /// A writer on `conn`, supervised as the store's is (no reopen), fed through the sender;
    /// its status is watched.
    fn spawn_writer(
        conn: Connection,
    ) -> (
        std::sync::mpsc::Sender<Box<dyn Command>>,
        std::thread::JoinHandle<()>,
        watch::Receiver<WriterStatus>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn Command>>();
        let status = Arc::new(watch::channel(WriterStatus::default()).0);
        let watched = status.subscribe();
        let writer = std::thread::spawn(move || {
            let reopen: Reopen = Box::new(|| Err(crate::ops::corrupt(String::from("no reopen"))));
            let hook = Arc::new(crate::NoListener);
            supervise(conn, reopen, rx, hook, RestartBudget::default(), status);
        });
        (tx, writer, watched)
    }

    /// P-11: a command that panics is rolled back alone (nothing it wrote stays) and answered
    /// with an error, whether its savepoint's journal is in a file or in memory; the writer lives
    /// on and commits the other commands, of the same batch and later ones.
    #[test]
    fn a_panicking_command_fails_alone_and_the_writer_lives_on() {
        let _spilling = SPILLING.lock().unwrap_or_else(PoisonError::into_inner);
        for make in [command, small] {
            // A file database, and more than 64 KiB of pages changed before the panic: the
            // rollback reads them back from the journal, spilled to a file or in memory.
            let dir = tempfile::tempdir().unwrap();
            let conn = Connection::open(dir.path().join("fails-alone.db")).unwrap();
            conn.execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE t (v INTEGER);
                 CREATE TABLE big (n INTEGER, pad BLOB);
                 WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 400)
                 INSERT INTO big SELECT i, zeroblob(1000) FROM r;",
            )
            .unwrap();
            let (panicking, panicked) = make(Box::new(|conn| {
                conn.execute("UPDATE big SET n = 0", [])?;
                conn.execute("INSERT INTO t VALUES (1)", [])?;
                panic!("a bug");
            }));
            let (fine, answered) = make(Box::new(|conn| {
                conn.execute("INSERT INTO t VALUES (2)", [])?;
                Ok((2, Vec::new()))
            }));
            // Queued before the writer starts: one transaction.
            let (tx, writer, watched) = spawn_writer(conn);
            tx.send(panicking).unwrap();
            tx.send(fine).unwrap();
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
            let (big, summed) = command(Box::new(|conn| {
                Ok((
                    conn.query_row("SELECT sum(n) FROM big", [], |row| row.get(0))?,
                    Vec::new(),
                ))
            }));
            tx.send(big).unwrap();
            assert_eq!(
                summed.blocking_recv().unwrap(),
                Ok(80_200),
                "the panicking command's update is undone"
            );
            drop(tx);
            writer.join().unwrap();
            assert_eq!(
                *watched.borrow(),
                WriterStatus::default(),
                "a panicking command is no failure of the writer"
            );
        }
    }

    /// A transaction keeps its savepoints' journals in memory only when every command in it
    /// changes a bounded few rows: one that may change any number keeps the whole transaction's
    /// in a file, whatever came before it. Seen as SQLite does it: a command changes more than
    /// 64 KiB of pages that existed before it, and its journal either stays in memory or spills
    /// to a new unlinked temporary file (`etilqs_…`, counted among the process's open files).
    #[test]
    fn only_a_transaction_of_small_commands_keeps_its_journal_in_memory() {
        let _spilling = SPILLING.lock().unwrap_or_else(PoisonError::into_inner);
        const FILE: u32 = 1;
        const MEMORY: u32 = 0;
        fn spill_files() -> usize {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(Result::ok)
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.to_string_lossy().contains("etilqs_"))
                })
                .count()
        }
        // A transaction's spill file stays open until it ends, so a second command of it opens
        // none of its own: count those open while the command runs, beyond the ones before.
        let before = spill_files();
        let spilled = move || -> Work<u32> {
            Box::new(move |conn| {
                conn.execute("UPDATE t SET n = n + 1", [])?;
                let spilled = spill_files().saturating_sub(before);
                Ok((u32::try_from(spilled.min(1)).unwrap(), Vec::new()))
            })
        };
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("journal.db")).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE t (n INTEGER, pad BLOB);
             WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 400)
             INSERT INTO t SELECT i, zeroblob(1000) FROM r;",
        )
        .unwrap();
        let answer = |rx: Answer| rx.blocking_recv().unwrap().unwrap();
        let (tx, writer, _) = spawn_writer(conn);
        let (first, first_rx) = small(spilled());
        tx.send(first).unwrap();
        assert_eq!(answer(first_rx), MEMORY);

        // A command that holds the writer until told, so that the next two queue behind it and
        // are taken together, in one transaction.
        let (running, started) = std::sync::mpsc::channel();
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let (holder, held) = small(Box::new(move |_| {
            running.send(()).unwrap();
            gate.recv().unwrap();
            Ok((0, Vec::new()))
        }));
        tx.send(holder).unwrap();
        started.recv().unwrap();
        let (small_one, small_rx) = small(spilled());
        let (big_one, big_rx) = command(spilled());
        tx.send(small_one).unwrap();
        tx.send(big_one).unwrap();
        open.send(()).unwrap();
        answer(held);
        assert_eq!(
            (answer(small_rx), answer(big_rx)),
            (FILE, FILE),
            "a big command's transaction keeps every journal in a file"
        );

        let (last, last_rx) = small(spilled());
        tx.send(last).unwrap();
        assert_eq!(
            answer(last_rx),
            MEMORY,
            "and the next small one's in memory again"
        );
        drop(tx);
        writer.join().unwrap();
    }
}
