//! The one-round-trip path of the group commit: creates and steps whose outcome the domain can
//! decide without reading the database first.
//!
//! - A **create** without an idempotency key is always `plan_create(task, None)`'s write; what
//!   only the database knows is whether the queue limits admit it. Its statement checks them as
//!   [`QueueLimits::admit`](lmsp_domain::schedule::QueueLimits::admit) does (the client's
//!   `max_queued`, then the service's) and inserts the task, its spec and its first event only
//!   when they admit it.
//! - A **step** (`append`, `finish`) of a task whose row this store holds as last committed
//!   ([`Rows`]: what its own commits and locked reads left) is decided by `plan_append` on that
//!   row; its statement is the row's compare-and-set on **every** mutable column, so it writes
//!   only when the row is still exactly the one decided on, then the events, the response and
//!   the snapshot change.
//!
//! Each statement says whether it wrote (`count = 1`) or found its premise false and wrote
//! nothing (`0`): a queue at its limit, a row that moved. Those commands, and every other kind,
//! take the read–decide–write path of `batch.rs`, whose answer the domain gives on the rows as
//! read (a refusal, a full queue, a key's reply are never decided here). A statement that fails
//! aborts the pipelined transaction; the batch is then written again by that path, where each
//! command has its savepoint and fails alone.

use std::collections::HashMap;
use std::sync::Mutex;

use lmsp_domain::event::Event;
use lmsp_domain::ids::{ClientId, TaskId};
use lmsp_domain::ports::{CancelOutcome, CreateOutcome, StepOutcome};
use lmsp_domain::task::Task;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::{plan_append, plan_create, CreatePlan, SnapshotChange, TaskWrite};

use super::{create_statement, update_params, Reply, Request, Stmt};
use crate::codec;
use crate::error::DbError;
use crate::ops::{key, to_i64};

/// Rows kept at most before the view is emptied (a few bytes over a task each; steps of the
/// running tasks find theirs again at their next locked read).
const MAX_ROWS: usize = 16_384;

/// The task rows this store last committed or read under lock, by id: what a step is decided on
/// without reading. A stale row costs a compare-and-set that writes nothing (then the read–
/// decide–write path), never a wrong write.
#[derive(Debug, Default)]
pub struct Rows {
    rows: Mutex<HashMap<TaskId, Task>>,
}

impl Rows {
    /// The row of `id`, if held.
    fn get(&self, id: TaskId) -> Option<Task> {
        let rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        rows.get(&id).cloned()
    }

    /// The client whose lane takes `request` (see `Writer`), as far as the rows held tell: a
    /// create's, and the client of a task a cancel or a status-changing step is for.
    pub fn lane_client(&self, request: &Request) -> Option<ClientId> {
        match request {
            Request::Create { task, .. } => Some(task.client_id),
            Request::Cancel { task_id, .. } => self.get(*task_id).map(|task| task.client_id),
            Request::Append {
                task_id,
                by,
                expected,
                steps,
                at,
                ..
            } => {
                let old = self.get(*task_id)?;
                match plan_append(&old, steps, *by, *expected, None, *at) {
                    Ok(write) if write.task.status == old.status => None,
                    _ => Some(old.client_id),
                }
            }
            Request::Claim { .. } => None,
        }
    }

    /// Holds `task` as committed, unless a later version of it is held; forgets a finished one.
    fn put(&self, task: &Task) {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if task.status.is_finished() {
            rows.remove(&task.id);
            return;
        }
        if rows
            .get(&task.id)
            .is_some_and(|held| held.last_sequence_number > task.last_sequence_number)
        {
            return;
        }
        if rows.len() >= MAX_ROWS && !rows.contains_key(&task.id) {
            rows.clear();
        }
        rows.insert(task.id, task.clone());
    }

    /// Forgets the row of `id`.
    fn forget(&self, id: TaskId) {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        rows.remove(&id);
    }

    /// Learns from a committed command: the row its answer carries (the row as written, or as
    /// read under lock), or that its task is gone.
    pub fn learn(&self, request: &Request, reply: &Reply) {
        match reply {
            Reply::Created(CreateOutcome::Created(task))
            | Reply::Stepped(StepOutcome::Applied { task, .. })
            | Reply::Stepped(StepOutcome::Refused { task, .. })
            | Reply::Claimed(Some(task))
            | Reply::Cancelled(CancelOutcome::Decided { task, .. }) => self.put(task),
            _ => self.forget_request(request),
        }
    }

    /// Forgets the task `request` names (a command that failed or will be run again).
    pub fn forget_request(&self, request: &Request) {
        match request {
            Request::Append { task_id, .. } | Request::Cancel { task_id, .. } => {
                self.forget(*task_id);
            }
            Request::Create { .. } | Request::Claim { .. } => {}
        }
    }
}

/// A command decided without a read: its statement and what it answers once written.
pub struct Fast {
    /// The statement: one row, `count`, 1 when it wrote.
    pub statement: Stmt,
    /// The answer.
    pub reply: Reply,
    /// The events it writes.
    pub events: Vec<Event>,
}

/// The one-round-trip plan of `request`, if it has one (see the module's documentation).
pub fn plan(request: &Request, rows: &Rows) -> Result<Option<Fast>, DbError> {
    match request {
        Request::Create {
            task,
            idempotency: None,
            service_max_queued,
        } => {
            let CreatePlan::Write(write) = plan_create(task, None) else {
                return Ok(None);
            };
            let mut statement = create_statement(&write.task, &write.events)?;
            statement.sql = String::from(FAST_CREATE_SQL);
            statement
                .params
                .push(Box::new(service_max_queued.map(i64::from)));
            Ok(Some(Fast {
                statement,
                events: write.events,
                reply: Reply::Created(CreateOutcome::Created(write.task)),
            }))
        }
        Request::Append {
            task_id,
            by,
            expected,
            steps,
            snapshot,
            at,
        } => {
            let Some(old) = rows.get(*task_id) else {
                return Ok(None);
            };
            let Ok(write) = plan_append(&old, steps, *by, *expected, snapshot.as_ref(), *at) else {
                // A refusal is decided on the row as read under lock, never on a held one.
                return Ok(None);
            };
            if write.responses.len() > 1 {
                return Ok(None);
            }
            let statement = step_statement(&old, &write)?;
            let (outcome, events) = write.applied();
            Ok(Some(Fast {
                statement,
                events,
                reply: Reply::Stepped(outcome),
            }))
        }
        _ => Ok(None),
    }
}

/// A create without a key (its parameters are `create_statement`'s, then the service's
/// `--max-queued` as `$29`): the task, its spec and its first events, written only when the
/// queue limits admit it (the client's `max_queued` counted over its queued tasks, then the
/// service's over all of them, as `QueueLimits::admit`).
const FAST_CREATE_SQL: &str = "WITH go AS (SELECT 1 WHERE \
     (SELECT cq.max_queued IS NULL OR (SELECT count(*) FROM (SELECT 1 FROM tasks q \
        WHERE q.status = 'queued' AND q.batch_id IS NULL AND q.client_id = $2 \
        LIMIT cq.max_queued) x) < cq.max_queued \
      FROM client_queues cq WHERE cq.client_id = $2) IS NOT FALSE \
     AND ($29::bigint IS NULL OR (SELECT count(*) FROM (SELECT 1 FROM tasks q \
        WHERE q.status = 'queued' AND q.batch_id IS NULL LIMIT $29) x) < $29)), \
     t AS (INSERT INTO tasks (id, client_id, status, model, on_restart, created_at, started_at, \
     finished_at, last_sequence_number, restarts, error, response_id, owner, background, \
     items_opened, item_open, tier, batch_id, batch_line) \
     SELECT $1::bytea, $2::bytea, $3::text, $4::text, $5::text, $6::bigint, $7::bigint, \
     $8::bigint, $9::bigint, $10::bigint, $11::text, $12::text, $13::bytea, $14::boolean, \
     $15::bigint, $16::boolean, $25::smallint, $26::bytea, $27::integer FROM go RETURNING id), \
     s AS (INSERT INTO task_specs (task_id, spec, metadata, accepted_by, custom_id) \
     SELECT t.id, $17::text, $18::text, $19::bytea, $28::text FROM t), \
     e AS (INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
     SELECT t.id, u.* FROM t CROSS JOIN unnest($20::bigint[], $21::bigint[], $22::bigint[], \
     $23::text[], $24::bigint[]) AS u) \
     SELECT count(*) FROM t";

/// A step on a held row: the row's compare-and-set on every mutable column, its events, its
/// response and its snapshot change, each written only when the row was the held one.
const FAST_STEP_SQL: &str = "WITH u AS (UPDATE tasks SET status = $1, started_at = $2, \
     finished_at = $3, last_sequence_number = $4, restarts = $5, error = $6, owner = $7, \
     items_opened = $8, item_open = $9 \
     WHERE id = $10 AND status = $11 AND last_sequence_number = $12 AND owner = $13 \
     AND started_at IS NOT DISTINCT FROM $19::bigint AND finished_at IS NOT DISTINCT FROM \
     $20::bigint AND restarts = $21 AND error IS NOT DISTINCT FROM $22::text \
     AND items_opened = $23 AND item_open = $24 RETURNING id), \
     e AS (INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
     SELECT u.id, x.* FROM u CROSS JOIN unnest($14::bigint[], $15::bigint[], $16::bigint[], \
     $17::text[], $18::bigint[]) AS x), \
     r AS (INSERT INTO responses (id, task_id, doc) SELECT $25::text, $30::bytea, $26::text FROM u \
     WHERE $25::text IS NOT NULL \
     ON CONFLICT (id) DO UPDATE SET task_id = EXCLUDED.task_id, doc = EXCLUDED.doc), \
     p AS (INSERT INTO snapshots (task_id, sequence_number, state) \
     SELECT u.id, $27::bigint, $28::bytea FROM u WHERE $27::bigint IS NOT NULL \
     ON CONFLICT (task_id) DO UPDATE SET sequence_number = EXCLUDED.sequence_number, \
     state = EXCLUDED.state), \
     d AS (DELETE FROM snapshots WHERE $29::boolean AND task_id IN (SELECT id FROM u)) \
     SELECT count(*) FROM u";

/// The statement of a step decided on the held row `old`.
fn step_statement(old: &Task, write: &TaskWrite<'_>) -> Result<Stmt, DbError> {
    let (new, events) = (&write.task, &write.events);
    let mut params = update_params(old, new, events)?;
    params.push(Box::new(old.started_at.map(Timestamp::as_millis)));
    params.push(Box::new(old.finished_at.map(Timestamp::as_millis)));
    params.push(Box::new(i64::from(old.restarts)));
    params.push(Box::new(codec::error_text(old)?));
    params.push(Box::new(i64::from(old.items.opened)));
    params.push(Box::new(old.items.open));
    match write.responses.first() {
        Some(response) => {
            params.push(Box::new(Some(response.id.to_string())));
            params.push(Box::new(Some(codec::response_to_text(response)?)));
        }
        None => {
            params.push(Box::new(None::<String>));
            params.push(Box::new(None::<String>));
        }
    }
    let response_task = write
        .responses
        .first()
        .map(|response| key(response.task_id));
    match write.snapshot {
        SnapshotChange::Put(snapshot) => {
            params.push(Box::new(Some(to_i64(snapshot.sequence_number)?)));
            params.push(Box::new(Some(snapshot.state.clone())));
            params.push(Box::new(false));
        }
        SnapshotChange::Drop => {
            params.push(Box::new(None::<i64>));
            params.push(Box::new(None::<Vec<u8>>));
            params.push(Box::new(true));
        }
        SnapshotChange::Keep => {
            params.push(Box::new(None::<i64>));
            params.push(Box::new(None::<Vec<u8>>));
            params.push(Box::new(false));
        }
    }
    params.push(Box::new(response_task));
    Ok(Stmt::new(String::from(FAST_STEP_SQL), params))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use lmsp_domain::ids::InstanceId;
    use lmsp_domain::recovery::RestartPolicy;
    use lmsp_domain::status::TaskStatus;
    use lmsp_storage_contract::fixtures;

    use super::*;

    fn task() -> Task {
        fixtures::task(
            InstanceId::from_ulid(ulid::Ulid::new()),
            RestartPolicy::Fail,
        )
    }

    /// A later version of a row is never replaced by an earlier one (two lanes may learn of the
    /// same task out of order), a finished task is forgotten, and a full view starts afresh.
    #[test]
    fn rows_keep_the_latest_version_and_forget_finished_tasks() {
        let rows = Rows::default();
        let first = task();
        let mut later = first.clone();
        later.last_sequence_number = 5;
        rows.put(&later);
        rows.put(&first);
        assert_eq!(rows.get(first.id).unwrap().last_sequence_number, 5);
        let cancel = Request::Cancel {
            task_id: first.id,
            client_id: None,
            at: Timestamp::from_millis(1),
        };
        assert_eq!(rows.lane_client(&cancel), Some(first.client_id));
        let mut done = later.clone();
        done.last_sequence_number = 6;
        done.status = TaskStatus::Completed;
        rows.put(&done);
        assert!(rows.get(first.id).is_none(), "a finished task is forgotten");
        assert_eq!(rows.lane_client(&cancel), None);
        for _ in 0..=MAX_ROWS {
            rows.put(&task());
        }
        assert!(rows.rows.lock().unwrap().len() <= MAX_ROWS);
    }
}
