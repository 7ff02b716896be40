//! Raw SQLite ceilings (the README's performance targets): what a durable service on this machine cannot beat,
//! measured with bare SQL on a connection of its own — WAL, `synchronous=FULL`, prepared
//! statements, nothing but the rows — so the service's figures can be printed as ratios to them.
//!
//! Each function opens (creating if needed) the database file it is given, creates the tables it
//! needs, and measures one thing. The storage benchmark (`src/bin/storage_bench.rs`) and the
//! service-level harness (`crates/bench`) both call them, so this file holds the only definition
//! of each ceiling.
//!
//! The PostgreSQL ceiling is `pgbench`'s (a client of its own, as the SQLite ones are bare SQL):
//! this file holds its SQL ([`PG_INSERT_TABLE`], [`PG_INSERT_SCRIPT`]); the harness runs it.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};

/// A failure while measuring a ceiling.
#[derive(Debug)]
pub struct CeilingError(rusqlite::Error);

impl std::fmt::Display for CeilingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "raw SQLite ceiling: {}", self.0)
    }
}

impl std::error::Error for CeilingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl From<rusqlite::Error> for CeilingError {
    fn from(error: rusqlite::Error) -> Self {
        Self(error)
    }
}

/// The result type of this module.
pub type CeilingResult<T> = Result<T, CeilingError>;

/// What a timed write loop achieved.
#[derive(Debug, Clone, PartialEq)]
pub struct Throughput {
    /// Rows (or events) written.
    pub items: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Wall time of the loop.
    pub elapsed: Duration,
    /// The wall time of every commit (`BEGIN IMMEDIATE` … `COMMIT`), ascending.
    pub commit_latencies: Vec<Duration>,
}

impl Throughput {
    /// Items per second.
    pub fn per_second(&self) -> f64 {
        self.items as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Commits per second.
    pub fn commits_per_second(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// The `q`-quantile (0.0…1.0, nearest rank) of the commit latencies; zero when none.
    pub fn commit_latency(&self, q: f64) -> Duration {
        if self.commit_latencies.is_empty() {
            return Duration::ZERO;
        }
        let last = self.commit_latencies.len() - 1;
        let rank = ((q.clamp(0.0, 1.0) * last as f64).round() as usize).min(last);
        self.commit_latencies[rank]
    }
}

/// The payload every raw row carries (about the size of a small task document or event).
const BODY_BYTES: usize = 200;

/// Opens `path` the way the service opens its writer: WAL, `synchronous=FULL`.
fn open(path: &Path) -> CeilingResult<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS raw_rows (id INTEGER PRIMARY KEY, task TEXT, body TEXT);
         CREATE TABLE IF NOT EXISTS raw_tasks (id TEXT PRIMARY KEY, lsn INTEGER, doc TEXT);
         CREATE TABLE IF NOT EXISTS raw_events (task_id TEXT, seq INTEGER, payload TEXT,
             PRIMARY KEY (task_id, seq)) WITHOUT ROWID;",
    )?;
    Ok(conn)
}

/// Runs `commit` (one whole transaction that writes `per_commit` items) for `duration`.
fn timed_loop(
    duration: Duration,
    per_commit: usize,
    mut commit: impl FnMut(u64) -> CeilingResult<()>,
) -> CeilingResult<Throughput> {
    let start = Instant::now();
    let mut latencies = Vec::new();
    let mut commits: u64 = 0;
    while start.elapsed() < duration || commits == 0 {
        let began = Instant::now();
        commit(commits)?;
        latencies.push(began.elapsed());
        commits += 1;
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Ok(Throughput {
        items: commits * per_commit as u64,
        commits,
        elapsed,
        commit_latencies: latencies,
    })
}

/// Fsync'd single-row commits for `duration`: commits per second and the latency of one
/// durable commit (the floor of any durable request's latency).
pub fn single_row_commits(path: &Path, duration: Duration) -> CeilingResult<Throughput> {
    rows_per_commit(path, 1, duration)
}

/// Rows per second when `per_commit` rows share each fsync'd transaction, for `duration`
/// (rows of about 200 bytes into a rowid table, like a task insert without its indexes).
pub fn rows_per_commit(
    path: &Path,
    per_commit: usize,
    duration: Duration,
) -> CeilingResult<Throughput> {
    let conn = open(path)?;
    let body = "x".repeat(BODY_BYTES);
    let per_commit = per_commit.max(1);
    timed_loop(duration, per_commit, |_| {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        {
            let mut stmt =
                conn.prepare_cached("INSERT INTO raw_rows (task, body) VALUES (?1, ?2)")?;
            for _ in 0..per_commit {
                stmt.execute(params!["task", body])?;
            }
        }
        conn.execute_batch("COMMIT")?;
        Ok(())
    })
}

/// Event appends per second, each an event insert plus its task's update (compare-and-set on the
/// last sequence number), `per_commit` of them — one per task of `per_commit` tasks — in each
/// fsync'd transaction, for `duration`.
pub fn event_appends(
    path: &Path,
    per_commit: usize,
    duration: Duration,
) -> CeilingResult<Throughput> {
    let conn = open(path)?;
    let body = "x".repeat(BODY_BYTES);
    let per_commit = per_commit.max(1);
    let ids: Vec<String> = (0..per_commit).map(|i| format!("task{i}")).collect();
    conn.execute_batch("BEGIN IMMEDIATE; DELETE FROM raw_events; DELETE FROM raw_tasks;")?;
    for id in &ids {
        conn.execute(
            "INSERT INTO raw_tasks (id, lsn, doc) VALUES (?1, 0, ?2)",
            params![id, body],
        )?;
    }
    conn.execute_batch("COMMIT")?;
    timed_loop(duration, per_commit, |round| {
        let seq = i64::try_from(round).unwrap_or(i64::MAX - 1) + 1;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        {
            let mut insert = conn.prepare_cached(
                "INSERT INTO raw_events (task_id, seq, payload) VALUES (?1, ?2, ?3)",
            )?;
            let mut update = conn.prepare_cached(
                "UPDATE raw_tasks SET lsn = ?1, doc = ?2 WHERE id = ?3 AND lsn = ?4",
            )?;
            for id in &ids {
                insert.execute(params![id, seq, body])?;
                update.execute(params![seq, body, id, seq - 1])?;
            }
        }
        conn.execute_batch("COMMIT")?;
        Ok(())
    })
}

/// The time to update `rows` existing task rows and insert one event row for each, `batch` of
/// them per fsync'd transaction (what a recovery of `rows` leftovers writes, with nothing
/// decided and nothing read). The rows are prepared first, untimed.
pub fn update_insert(path: &Path, rows: usize, batch: usize) -> CeilingResult<Duration> {
    let conn = open(path)?;
    let body = "x".repeat(BODY_BYTES);
    let batch = batch.max(1);
    conn.execute_batch(
        "DROP TABLE IF EXISTS raw_leftovers; DROP TABLE IF EXISTS raw_leftover_events;
         CREATE TABLE raw_leftovers (id TEXT PRIMARY KEY, status TEXT, lsn INTEGER, doc TEXT);
         CREATE TABLE raw_leftover_events (task_id TEXT, seq INTEGER, payload TEXT,
             PRIMARY KEY (task_id, seq)) WITHOUT ROWID;",
    )?;
    let ids: Vec<String> = (0..rows).map(|i| format!("task_{i:012}")).collect();
    conn.execute_batch("BEGIN IMMEDIATE")?;
    {
        let mut insert = conn.prepare_cached(
            "INSERT INTO raw_leftovers (id, status, lsn, doc) VALUES (?1, 'running', 3, ?2)",
        )?;
        for id in &ids {
            insert.execute(params![id, body])?;
        }
    }
    conn.execute_batch("COMMIT")?;
    let start = Instant::now();
    for chunk in ids.chunks(batch) {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        {
            let mut update = conn.prepare_cached(
                "UPDATE raw_leftovers SET status = 'queued', lsn = lsn + 1, doc = ?2 \
                 WHERE id = ?1 AND lsn = 3",
            )?;
            let mut insert = conn.prepare_cached(
                "INSERT INTO raw_leftover_events (task_id, seq, payload) VALUES (?1, 4, ?2)",
            )?;
            for id in chunk {
                update.execute(params![id, body])?;
                insert.execute(params![id, body])?;
            }
        }
        conn.execute_batch("COMMIT")?;
    }
    Ok(start.elapsed())
}

/// The PostgreSQL insert-commit ceiling (run by `pgbench` with a custom script, one transaction
/// per line of [`PG_INSERT_SCRIPT`]): its table, created in a fresh database before the run.
pub const PG_INSERT_TABLE: &str =
    "CREATE TABLE raw_insert (id bigserial PRIMARY KEY, body text NOT NULL)";

/// The `pgbench -f` script of the PostgreSQL insert-commit ceiling: one single-row insert of a
/// [`BODY_BYTES`]-byte payload per transaction (autocommit: each is its own fsync'd commit).
pub const PG_INSERT_SCRIPT: &str = "INSERT INTO raw_insert (body) VALUES (repeat('x', 200));\n";

/// `CREATE DATABASE` of a throwaway database (`name` is the harness's own, never user input).
pub fn pg_create_database(name: &str) -> String {
    format!("CREATE DATABASE {name}")
}

/// `DROP DATABASE` of a throwaway database, closing whatever is still connected to it.
pub fn pg_drop_database(name: &str) -> String {
    format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn every_ceiling_measures_something() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.db");
        let short = Duration::from_millis(20);
        let single = single_row_commits(&path, short).unwrap();
        assert!(single.commits >= 1 && single.items == single.commits);
        assert!(single.commit_latency(0.5) > Duration::ZERO);
        let batched = rows_per_commit(&path, 8, short).unwrap();
        assert_eq!(batched.items, batched.commits * 8);
        let events = event_appends(&path, 4, short).unwrap();
        assert_eq!(events.items, events.commits * 4);
        assert!(events.per_second() > 0.0);
        assert!(update_insert(&path, 100, 30).unwrap() > Duration::ZERO);
    }
}
