//! The one-round-trip path of the group commit: creates and steps whose outcome the domain can
//! decide without reading the database first.
//!
//! - A **create** without an idempotency key is always `plan_create(task, None)`'s write; what
//!   only the database knows is whether the queue limits admit it. The batch's creates are one
//!   statement ([`Creates`]), which checks the limits as
//!   [`QueueLimits::admit`](lmsp_domain::schedule::QueueLimits::admit) would, one create after
//!   another (each client's `max_queued`, then the service's), and inserts the tasks, their
//!   specs and their first events only when every one of them is admitted.
//! - A **step** (`append`, `finish`) of a task whose row this store holds as last committed
//!   ([`Rows`]: what its own commits and locked reads left) is decided by `plan_append` on that
//!   row; its statement is the row's compare-and-set on **every** mutable column, so it writes
//!   only when the row is still exactly the one decided on, then the events, the response and
//!   the snapshot change.
//!
//! Each statement says whether it wrote (`count`: 1, or its number of creates) or found its
//! premise false and wrote nothing (`0`): a queue at its limit, a row that moved. Those
//! commands, and every other kind, take the read–decide–write path of `batch.rs`, whose answer
//! the domain gives on the rows as read (a refusal, a full queue, a key's reply are never
//! decided here). A statement that fails
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

use super::{event_arrays, update_params, EventArrays, Param, Reply, Request, Stmt};
use crate::codec;
use crate::error::DbError;
use crate::ops::{self, client_key, instance_key, key, to_i64};

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

/// A command decided without a read: how it is written and what it answers once written.
pub struct Fast {
    /// How it is written.
    pub write: Write,
    /// The answer.
    pub reply: Reply,
    /// The events it writes.
    pub events: Vec<Event>,
}

/// How a command decided without a read is written.
pub enum Write {
    /// A statement of its own: one row, `count`, 1 when it wrote.
    Statement(Stmt),
    /// A create: one row of the batch's statement of creates ([`Creates`]).
    Create(Box<Creates>),
}

/// The one-round-trip statements of a batch's `writes`, in their order, and for each write the
/// index of its statement. The creates under the same service limit are one statement
/// ([`Creates`]), placed first; every other write is a statement of its own. Each statement
/// comes with the `count` it answers when it wrote: its creates, or 1.
pub fn statements(writes: Vec<Write>) -> (Vec<(Stmt, i64)>, Vec<usize>) {
    /// Where a write went, before the statements are put in their order.
    enum At {
        /// The statement of creates `n`.
        Creates(usize),
        /// The statement of its own `n`.
        Own(usize),
    }
    let mut creates: Vec<Creates> = Vec::new();
    let mut own = Vec::new();
    let mut place = Vec::with_capacity(writes.len());
    for write in writes {
        match write {
            Write::Statement(statement) => {
                place.push(At::Own(own.len()));
                own.push((statement, 1));
            }
            Write::Create(row) => {
                match creates
                    .iter()
                    .position(|group| group.service_max_queued == row.service_max_queued)
                {
                    Some(group) => {
                        place.push(At::Creates(group));
                        creates[group].append(*row);
                    }
                    None => {
                        place.push(At::Creates(creates.len()));
                        creates.push(*row);
                    }
                }
            }
        }
    }
    let groups = creates.len();
    let place = place
        .into_iter()
        .map(|at| match at {
            At::Creates(group) => group,
            At::Own(n) => groups + n,
        })
        .collect();
    let mut statements: Vec<(Stmt, i64)> = creates
        .into_iter()
        .map(|group| {
            let rows = i64::try_from(group.ids.len()).unwrap_or(i64::MAX);
            (group.statement(), rows)
        })
        .collect();
    statements.extend(own);
    (statements, place)
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
            let row = Creates::of(&write.task, &write.events, *service_max_queued)?;
            Ok(Some(Fast {
                write: Write::Create(Box::new(row)),
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
                write: Write::Statement(statement),
                events,
                reply: Reply::Stepped(outcome),
            }))
        }
        _ => Ok(None),
    }
}

/// The rows of [`Creates`]: each column as an array (`$1`…`$23`), unnested.
macro_rules! creates_rows {
    () => {
        "WITH n AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::text[], $4::text[], \
         $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], \
         $11::text[], $12::text[], $13::bytea[], $14::boolean[], $15::bigint[], $16::boolean[], \
         $17::text[], $18::text[], $19::bytea[], $20::smallint[], $21::bytea[], $22::integer[], \
         $23::text[]) AS n (id, client_id, status, model, on_restart, created_at, started_at, \
         finished_at, last_sequence_number, restarts, error, response_id, owner, background, \
         items_opened, item_open, spec, metadata, accepted_by, tier, batch_id, batch_line, \
         custom_id)), "
    };
}

/// The tasks of `n`, their specs and their events (`$24`…`$29`, each with its task), written
/// when `go` has a row; answers how many tasks it wrote.
macro_rules! creates_insert {
    () => {
        "t AS (INSERT INTO tasks (id, client_id, status, model, on_restart, created_at, \
         started_at, finished_at, last_sequence_number, restarts, error, response_id, owner, \
         background, items_opened, item_open, tier, batch_id, batch_line) \
         SELECT id, client_id, status, model, on_restart, created_at, started_at, finished_at, \
         last_sequence_number, restarts, error, response_id, owner, background, items_opened, \
         item_open, tier, batch_id, batch_line FROM n WHERE EXISTS (SELECT 1 FROM go) \
         RETURNING id), \
         s AS (INSERT INTO task_specs (task_id, spec, metadata, accepted_by, custom_id) \
         SELECT n.id, n.spec, n.metadata, n.accepted_by, n.custom_id \
         FROM n JOIN t ON t.id = n.id), \
         e AS (INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
         SELECT v.* FROM unnest($24::bytea[], $25::bigint[], $26::bigint[], $27::bigint[], \
         $28::text[], $29::bigint[]) AS v WHERE EXISTS (SELECT 1 FROM t)) \
         SELECT count(*) FROM t"
    };
}

/// Creates without a key, as one statement ([`Creates`], then the service's `--max-queued` as
/// `$30`). The rows are written only when the queue limits admit every one of them, as
/// `QueueLimits::admit` would admit them one after another: each client's queued tasks
/// (counted up to its `max_queued`) plus its rows here at most its `max_queued`, and all queued
/// tasks plus all the rows at most the service's. When they do not, nothing is written and each
/// create is decided alone on the read–decide–write path, which admits exactly those that fit.
/// One statement instead of one per create: with 20 creates a transaction, a single backend
/// wrote 6.5 times as many (`pgbench -M prepared -c 1`, 2026-12-07: 5 800 against 38 000
/// creates/s), the executor's start and the statement's protocol being most of a one-row
/// create's cost.
const FAST_CREATES_SQL: &str = concat!(
    creates_rows!(),
    "go AS (SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM (SELECT client_id, count(*) AS adding \
        FROM n GROUP BY client_id) k JOIN client_queues cq ON cq.client_id = k.client_id \
        WHERE cq.max_queued IS NOT NULL AND (SELECT count(*) FROM (SELECT 1 FROM tasks q \
        WHERE q.status = 'queued' AND q.batch_id IS NULL AND q.client_id = k.client_id \
        LIMIT cq.max_queued) x) + k.adding > cq.max_queued) \
     AND ($30::bigint IS NULL OR (SELECT count(*) FROM (SELECT 1 FROM tasks q \
        WHERE q.status = 'queued' AND q.batch_id IS NULL LIMIT $30) x) \
        + (SELECT count(*) FROM n) <= $30)), ",
    creates_insert!()
);

/// P-2: creates the domain admitted on the rows read under lock (the read–decide–write path),
/// written as they are: their tasks, specs and first events in one statement.
const CREATES_SQL: &str = concat!(creates_rows!(), "go AS (SELECT 1), ", creates_insert!());

/// Creates, column by column: one or more rows of [`FAST_CREATES_SQL`] (under one service
/// limit) or of [`CREATES_SQL`].
pub struct Creates {
    service_max_queued: Option<u32>,
    ids: Vec<Vec<u8>>,
    client_ids: Vec<Vec<u8>>,
    statuses: Vec<&'static str>,
    models: Vec<String>,
    on_restarts: Vec<&'static str>,
    created_ats: Vec<i64>,
    started_ats: Vec<Option<i64>>,
    finished_ats: Vec<Option<i64>>,
    last_sequence_numbers: Vec<i64>,
    restarts: Vec<i64>,
    errors: Vec<Option<String>>,
    response_ids: Vec<Option<String>>,
    owners: Vec<Vec<u8>>,
    backgrounds: Vec<bool>,
    items_opened: Vec<i64>,
    item_opens: Vec<bool>,
    specs: Vec<String>,
    metadata: Vec<String>,
    accepted_bys: Vec<Vec<u8>>,
    tiers: Vec<i16>,
    batch_ids: Vec<Option<Vec<u8>>>,
    batch_lines: Vec<Option<i32>>,
    custom_ids: Vec<Option<String>>,
    event_tasks: Vec<Vec<u8>>,
    events: EventArrays,
}

impl Creates {
    /// The row of `task`, created with `events`, under the service limit `service_max_queued`.
    pub fn of(
        task: &Task,
        events: &[Event],
        service_max_queued: Option<u32>,
    ) -> Result<Creates, DbError> {
        let line = task.batch.as_ref();
        let events = event_arrays(events)?;
        Ok(Creates {
            service_max_queued,
            ids: vec![key(task.id)],
            client_ids: vec![client_key(task.client_id)],
            statuses: vec![task.status.as_str()],
            models: vec![task.model.as_str().to_owned()],
            on_restarts: vec![task.on_restart.as_str()],
            created_ats: vec![task.created_at.as_millis()],
            started_ats: vec![task.started_at.map(Timestamp::as_millis)],
            finished_ats: vec![task.finished_at.map(Timestamp::as_millis)],
            last_sequence_numbers: vec![to_i64(task.last_sequence_number)?],
            restarts: vec![i64::from(task.restarts)],
            errors: vec![codec::error_text(task)?],
            response_ids: vec![codec::stored_response_id(task)],
            owners: vec![instance_key(task.owner)],
            backgrounds: vec![task.background],
            items_opened: vec![i64::from(task.items.opened)],
            item_opens: vec![task.items.open],
            specs: vec![codec::spec_to_text(&task.spec)?],
            metadata: vec![codec::metadata_to_text(&task.metadata)?],
            accepted_bys: vec![instance_key(task.accepted_by)],
            tiers: vec![i16::from(task.service_tier.rank())],
            batch_ids: vec![line.map(|line| ops::batch_key(line.batch_id))],
            batch_lines: vec![line
                .map(|line| ops::batches::line_key(line.line))
                .transpose()?],
            custom_ids: vec![line.map(|line| line.custom_id.clone())],
            event_tasks: vec![key(task.id); events.0.len()],
            events,
        })
    }

    /// Adds `other`'s rows after these.
    fn append(&mut self, other: Creates) {
        self.ids.extend(other.ids);
        self.client_ids.extend(other.client_ids);
        self.statuses.extend(other.statuses);
        self.models.extend(other.models);
        self.on_restarts.extend(other.on_restarts);
        self.created_ats.extend(other.created_ats);
        self.started_ats.extend(other.started_ats);
        self.finished_ats.extend(other.finished_ats);
        self.last_sequence_numbers
            .extend(other.last_sequence_numbers);
        self.restarts.extend(other.restarts);
        self.errors.extend(other.errors);
        self.response_ids.extend(other.response_ids);
        self.owners.extend(other.owners);
        self.backgrounds.extend(other.backgrounds);
        self.items_opened.extend(other.items_opened);
        self.item_opens.extend(other.item_opens);
        self.specs.extend(other.specs);
        self.metadata.extend(other.metadata);
        self.accepted_bys.extend(other.accepted_bys);
        self.tiers.extend(other.tiers);
        self.batch_ids.extend(other.batch_ids);
        self.batch_lines.extend(other.batch_lines);
        self.custom_ids.extend(other.custom_ids);
        self.event_tasks.extend(other.event_tasks);
        self.events.0.extend(other.events.0);
        self.events.1.extend(other.events.1);
        self.events.2.extend(other.events.2);
        self.events.3.extend(other.events.3);
        self.events.4.extend(other.events.4);
    }

    /// The statement writing these rows when the queue limits admit them all
    /// ([`FAST_CREATES_SQL`]).
    fn statement(self) -> Stmt {
        let limit = self.service_max_queued.map(i64::from);
        let mut params = self.params();
        params.push(Box::new(limit));
        Stmt::new(FAST_CREATES_SQL, params)
    }

    /// The statement writing these rows, admitted already ([`CREATES_SQL`]).
    pub fn admitted(self) -> Stmt {
        Stmt::new(CREATES_SQL, self.params())
    }

    /// The parameters `$1`…`$29` of both statements.
    fn params(self) -> Vec<Param> {
        let (sequences, codes, times, data, items) = self.events;
        vec![
            Box::new(self.ids),
            Box::new(self.client_ids),
            Box::new(self.statuses),
            Box::new(self.models),
            Box::new(self.on_restarts),
            Box::new(self.created_ats),
            Box::new(self.started_ats),
            Box::new(self.finished_ats),
            Box::new(self.last_sequence_numbers),
            Box::new(self.restarts),
            Box::new(self.errors),
            Box::new(self.response_ids),
            Box::new(self.owners),
            Box::new(self.backgrounds),
            Box::new(self.items_opened),
            Box::new(self.item_opens),
            Box::new(self.specs),
            Box::new(self.metadata),
            Box::new(self.accepted_bys),
            Box::new(self.tiers),
            Box::new(self.batch_ids),
            Box::new(self.batch_lines),
            Box::new(self.custom_ids),
            Box::new(self.event_tasks),
            Box::new(sequences),
            Box::new(codes),
            Box::new(times),
            Box::new(data),
            Box::new(items),
        ]
    }
}

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
    Ok(Stmt::new(FAST_STEP_SQL, params))
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

    /// The creates under one service limit are one statement, placed first, answering their
    /// number when written; other writes keep a statement each; every write knows its statement.
    #[test]
    fn creates_under_one_limit_are_one_statement() {
        let create = |limit| {
            let task = task();
            Write::Create(Box::new(Creates::of(&task, &[], limit).unwrap()))
        };
        let step = || Write::Statement(Stmt::new("SELECT 1", Vec::new()));
        let writes = vec![step(), create(None), create(Some(3)), create(None), step()];
        let (statements, place) = statements(writes);
        let counts: Vec<i64> = statements.iter().map(|(_, count)| *count).collect();
        assert_eq!(counts, [2, 1, 1, 1]);
        assert_eq!(place, [2, 0, 1, 0, 3]);
        assert_eq!(statements[0].0.params.len(), 30);
        assert_eq!(statements[2].0.sql, "SELECT 1");
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
