//! Tasks: creation, the worker's steps, claims, cancels, deletion, and the reads.

use lmsp_domain::event::Event;
use lmsp_domain::idempotency::IdempotencyRecord;
use lmsp_domain::ids::{ClientId, InstanceId, ResponseId, TaskId};
use lmsp_domain::ports::{
    CancelOutcome, CreateOutcome, DeleteOutcome, Page, Snapshot, StepOutcome, TaskFilter,
};
use lmsp_domain::schedule::{
    claim_window, next_claim, ClientLoad, QueueHead, QueueLimits, ServiceTier, TierAging,
};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::TaskWrite;
use std::sync::LazyLock;

use lmsp_storage_codec::flows::{self, CreateRows, TaskWrites};
use lmsp_storage_codec::schema::OPEN_FRONT;
use rusqlite::{params, Connection, OptionalExtension};

use crate::codec;
use crate::codec::ops as shared;
use crate::error::DbError;
use crate::ops::clients;
use crate::ops::{
    client_key, corrupt, delete_snapshot, events, from_i64, insert_task_rows, instance_key, key,
    load_task, run, to_i64, write_advanced, Res, Rows,
};
use lmsp_domain::transition::Step;

/// P-2, I-1, I-8: the task, its `response.created` event and its idempotency record, unless a
/// queue is full ([`flows::create_task`]).
pub fn create_task(
    conn: &Connection,
    task: Task,
    idempotency: Option<IdempotencyRecord>,
    service_max_queued: Option<u32>,
) -> Res<(CreateOutcome, Vec<Event>)> {
    run(flows::create_task(
        &Rows(conn),
        &task,
        idempotency.as_ref(),
        service_max_queued,
    ))
}

fn insert_response(conn: &Connection, response: &Response) -> Res<()> {
    conn.prepare_cached("INSERT OR REPLACE INTO responses (id, task_id, doc) VALUES (?1, ?2, ?3)")?
        .execute(params![
            response.id.to_string(),
            key(response.task_id),
            codec::response_to_text(response)?,
        ])?;
    Ok(())
}

fn put_snapshot(conn: &Connection, task_id: TaskId, snapshot: &Snapshot) -> Res<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO snapshots (task_id, sequence_number, state) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![
        key(task_id),
        to_i64(snapshot.sequence_number)?,
        snapshot.state,
    ])?;
    Ok(())
}

/// P-3, I-2: folds a worker's steps through the domain, all or nothing ([`flows::append`]).
pub fn append(
    conn: &Connection,
    task_id: TaskId,
    by: InstanceId,
    expected: Option<u64>,
    steps: &[Step],
    snapshot: Option<&Snapshot>,
    at: Timestamp,
) -> Res<(StepOutcome, Vec<Event>)> {
    run(flows::append(
        &Rows(conn),
        task_id,
        by,
        expected,
        steps,
        snapshot,
        at,
    ))
}

/// Claims the next queued task for `by`: the one [`next_claim`] puts first among every client's
/// queue heads (tiers with aging, then fairness between clients), and records when its client
/// was served. It reads the queue fronts (`schema::queue_fronts`), never every client's heads:
/// the oldest open front of each tier (three seeks in `queue_fronts_age`, each passing over the
/// fronts of clients at their `max_running`), then, for each tier
/// [`claim_window`] names, the first open front in claim order whose head has aged into the
/// window (`queue_fronts_claim`), and hands those (at most three) to [`next_claim`]. Claiming
/// the task moves its front (triggers), in this transaction.
///
/// The cost does not grow with the number of clients with queued work, with two bounds. In a tier
/// that aging brought down into the window (its oldest head waited a whole period more than the
/// tier's rank allows), the read of its first front walks past the fronts, in claim order, whose
/// heads have not waited that long. They are fronts of clients whose oldest queued task of that
/// tier is younger than the aging period (or two): at most one per such client, and none once
/// every head has aged (a long backlog) or none has (a short queue). And the read of a tier's
/// oldest open front walks past the older fronts of clients at their `max_running` (at most one
/// per such client; such a client runs at least one task, so they are never more than the tasks
/// running).
pub fn claim_next(
    conn: &Connection,
    by: InstanceId,
    at: Timestamp,
    aging: TierAging,
) -> Res<(Option<Task>, Vec<Event>)> {
    let Some(id) = next_front(conn, at, aging)? else {
        return Ok((None, Vec::new()));
    };
    let old = load_task(conn, id)?.ok_or_else(|| corrupt("a queue front without its task"))?;
    let (task, events) = run(flows::claim(&Rows(conn), &old, by, at))?;
    Ok((Some(task), events))
}

// `INDEXED BY`: the claim's reads must stay seeks in the fronts' partial indexes however many
// clients have queued work; the conditions repeat the indexes' own so that they apply.

/// The creation time of the oldest open front's head in tier `?1` (a seek in `queue_fronts_age`,
/// then a walk past the fronts of clients at their `max_running`, which that index holds too:
/// schema version 9).
pub(crate) static OLDEST_FRONT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT head_created_at FROM queue_fronts INDEXED BY queue_fronts_age \
         WHERE tier = ?1 AND {OPEN_FRONT} ORDER BY head_created_at LIMIT 1"
    )
});

/// The first open front of tier `?1` in claim order whose head was created by `?2` (a seek in
/// `queue_fronts_claim`, then a walk while heads are newer than `?2`).
pub(crate) static FIRST_FRONT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT client_id, head_id, head_created_at, running, max_running, served_at \
         FROM queue_fronts INDEXED BY queue_fronts_claim \
         WHERE tier = ?1 AND {OPEN_FRONT} AND head_created_at <= ?2 \
         ORDER BY running, served_at, head_id LIMIT 1"
    )
});

/// The task the next claim takes, if any: [`claim_window`] over the oldest open front of each
/// tier, then [`next_claim`] over the first front of each tier in the window.
fn next_front(conn: &Connection, at: Timestamp, aging: TierAging) -> Res<Option<TaskId>> {
    let mut oldest = Vec::new();
    for tier in ServiceTier::ALL {
        let created: Option<i64> = conn
            .prepare_cached(&OLDEST_FRONT)?
            .query_row([codec::tier_rank(*tier)], |row| row.get(0))
            .optional()?;
        if let Some(created) = created {
            oldest.push((*tier, Timestamp::from_millis(created)));
        }
    }
    let Some(window) = claim_window(&oldest, aging, at) else {
        return Ok(None);
    };
    let mut fronts = Vec::new();
    for (tier, by) in window.tiers {
        let by = by.map_or(i64::MAX, Timestamp::as_millis);
        type Row = (Vec<u8>, Vec<u8>, i64, i64, Option<i64>, Option<i64>);
        let row: Option<Row> = conn
            .prepare_cached(&FIRST_FRONT)?
            .query_row(params![codec::tier_rank(tier), by], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            })
            .optional()?;
        let Some((client, head, created, running, max_running, served)) = row else {
            continue;
        };
        let head = QueueHead {
            task: TaskId::from_ulid(codec::ulid_of(&head)?),
            client: ClientId::from_ulid(codec::ulid_of(&client)?),
            tier,
            created_at: Timestamp::from_millis(created),
        };
        let load = ClientLoad {
            running: codec::u32_of(running)?,
            max_running: max_running.map(codec::u32_of).transpose()?,
            last_served: served.map(Timestamp::from_millis),
        };
        fronts.push((head, load));
    }
    Ok(next_claim(&fronts, aging, at))
}

/// P-4, I-3: decides and applies a cancel ([`flows::cancel`]).
pub fn cancel(
    conn: &Connection,
    task_id: TaskId,
    client_id: Option<ClientId>,
    at: Timestamp,
) -> Res<(CancelOutcome, Vec<Event>)> {
    run(flows::cancel(&Rows(conn), task_id, client_id, at))
}

/// Removes one task's rows (the codec's [`flows::delete_task_rows`]); how many events went.
pub fn delete_task_rows(conn: &Connection, id: &[u8]) -> Res<u64> {
    run(flows::delete_task_rows(&Rows(conn), id))
}

/// The task writes as the writer thread makes them: the one transaction there is, so nothing
/// to lock, and a key's record replaces whatever is stored under it.
impl TaskWrites for Rows<'_> {
    type Error = DbError;

    async fn task_to_write(&self, id: TaskId) -> Res<Option<Task>> {
        load_task(self.0, id)
    }

    async fn write_advanced(&self, old: &Task, new: &Task, events: &[Event]) -> Res<()> {
        write_advanced(self.0, old, new, events)
    }

    async fn put_response(&self, response: &Response) -> Res<()> {
        insert_response(self.0, response)
    }

    async fn put_snapshot(&self, task: TaskId, snapshot: &Snapshot) -> Res<()> {
        put_snapshot(self.0, task, snapshot)
    }

    async fn drop_snapshot(&self, task: TaskId) -> Res<()> {
        delete_snapshot(self.0, task)
    }

    async fn mark_served(&self, client: ClientId, at: Timestamp) -> Res<()> {
        self.0
            .prepare_cached(
                "INSERT INTO client_queues (client_id, served_at) VALUES (?1, ?2) \
                 ON CONFLICT (client_id) DO UPDATE SET served_at = excluded.served_at",
            )?
            .execute(params![client_key(client), at.as_millis()])?;
        Ok(())
    }
}

impl CreateRows for Rows<'_> {
    async fn stored_key(&self, record: &IdempotencyRecord) -> Res<Option<IdempotencyRecord>> {
        flows::stored_record(self, &record.scope, &record.key).await
    }

    async fn max_queued(&self, client: ClientId) -> Res<Option<u32>> {
        Ok(clients::client_limits(self.0, client)?.max_queued)
    }

    async fn queued(&self, client: ClientId, limits: QueueLimits) -> Res<(u64, u64)> {
        let count = |sql: &str, params: &[&dyn rusqlite::ToSql]| -> Res<u64> {
            let n: i64 = self
                .0
                .prepare_cached(sql)?
                .query_row(params, |row| row.get(0))?;
            Ok(from_i64(n)?)
        };
        let client_queued = match limits.client {
            Some(max) => count(
                "SELECT count(*) FROM (SELECT 1 FROM tasks INDEXED BY tasks_queued_direct \
                 WHERE status = 'queued' AND batch_id IS NULL AND client_id = ?1 LIMIT ?2)",
                &[&client_key(client), &max],
            )?,
            None => 0,
        };
        let service_queued = match limits.service {
            Some(max) => count(
                "SELECT count(*) FROM (SELECT 1 FROM tasks INDEXED BY tasks_queued_direct \
                 WHERE status = 'queued' AND batch_id IS NULL LIMIT ?1)",
                &[&max],
            )?,
            None => 0,
        };
        Ok((client_queued, service_queued))
    }

    async fn insert_created(
        &self,
        write: &TaskWrite<'_>,
        record: Option<&IdempotencyRecord>,
        _existed: bool,
    ) -> Res<()> {
        insert_task_rows(self.0, &write.task)?;
        events::insert_events(self.0, &write.events)?;
        if let Some(record) = record {
            shared::put_record(self, record, true).await?;
        }
        Ok(())
    }
}

/// Deletes one finished task now (P-6: never an unfinished one; [`flows::delete_finished`]).
pub fn delete_finished(
    conn: &Connection,
    task_id: TaskId,
    client_id: Option<ClientId>,
) -> Res<DeleteOutcome> {
    run(flows::delete_finished(&Rows(conn), task_id, client_id))
}

/// The task whose response has this id: a task's own response id is its ULID, unless the first
/// release stored another one (then `responses` or the row's `response_id` names it).
pub fn task_by_response(conn: &Connection, response_id: ResponseId) -> Res<Option<Task>> {
    run(shared::task_by_response(&Rows(conn), response_id))
}

/// Tasks, newest first.
pub fn list_tasks(conn: &Connection, filter: &TaskFilter) -> Res<Page<Task>> {
    run(shared::list_tasks(&Rows(conn), filter))
}

/// A task's snapshot.
pub fn snapshot(conn: &Connection, task_id: TaskId) -> Res<Option<Snapshot>> {
    run(shared::snapshot(&Rows(conn), task_id))
}

/// Counts per status.
pub fn count_by_status(conn: &Connection) -> Res<Vec<(TaskStatus, u64)>> {
    run(shared::count_by_status(&Rows(conn)))
}

/// The `cancelling` tasks in the care of `owner`.
pub fn cancelling_tasks(conn: &Connection, owner: InstanceId) -> Res<Vec<TaskId>> {
    let ids: Vec<Vec<u8>> = conn
        .prepare_cached("SELECT id FROM tasks WHERE status = 'cancelling' AND owner = ?1")?
        .query_map([instance_key(owner)], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ids.iter()
        .map(|id| Ok(TaskId::from_ulid(crate::ops::ulid_of(id)?)))
        .collect()
}

/// The stored response of a task, with its id checked against the task's.
pub fn response(conn: &Connection, task_id: TaskId) -> Res<Option<Response>> {
    run(shared::response_of_task(&Rows(conn), task_id))
}
