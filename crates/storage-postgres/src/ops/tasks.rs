//! Tasks: the task writes (the group-committed hot writes are `batch.rs`'s), cancels' and steps' shared SQL, deletion, and the reads.

use std::sync::LazyLock;

use lmsp_domain::event::Event;
use lmsp_domain::ids::{ClientId, InstanceId, ResponseId, TaskId};
use lmsp_domain::ports::{DeleteOutcome, Page, Snapshot, TaskFilter};
use lmsp_domain::schedule::ServiceTier;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_storage_codec::flows::{self, TaskWrites};

use crate::codec;
use crate::codec::ops as shared;
use crate::error::DbError;
use crate::ops::{
    client_key, delete_snapshot, instance_key, key, lock_task, to_i64, ulid_of, write_advanced, Db,
    Res, Rows, TASK_COLUMNS,
};

async fn insert_response<C: Db>(db: &C, response: &Response) -> Res<()> {
    db.execute(
        "INSERT INTO responses (id, task_id, doc) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET task_id = EXCLUDED.task_id, doc = EXCLUDED.doc",
        &[
            &response.id.to_string(),
            &key(response.task_id),
            &codec::response_to_text(response)?,
        ],
    )
    .await?;
    Ok(())
}

async fn put_snapshot<C: Db>(db: &C, task_id: TaskId, snapshot: &Snapshot) -> Res<()> {
    db.execute(
        "INSERT INTO snapshots (task_id, sequence_number, state) VALUES ($1, $2, $3) \
         ON CONFLICT (task_id) DO UPDATE SET sequence_number = EXCLUDED.sequence_number, \
         state = EXCLUDED.state",
        &[
            &key(task_id),
            &to_i64(snapshot.sequence_number)?,
            &snapshot.state,
        ],
    )
    .await?;
    Ok(())
}

/// The queued tasks a batch of claims takes, at most `$1`, in the order they are taken, each row
/// locked with `SKIP LOCKED`: concurrent claimers (in any process) each take different tasks and
/// never wait on each other. The order is `lmsp_domain::schedule::next_claim`'s, applied to a
/// batch: the most urgent tier (a task's tier's rank less one per `$3` milliseconds waited at
/// `$2`), then the least loaded client (its running tasks, plus the ones this batch gives it
/// before), then the client served least recently, then the oldest; a client at its
/// `max_running` is passed over. It reads only queue heads: the clients with queued tasks one
/// index seek each (a loose scan of `tasks_queue`) with their running counts (`tasks_active`)
/// and each one's first queued task of each tier; then, for the `4 × $1` clients whose first task
/// comes first in that order, their first queued tasks of each tier: `$1` each, or more when
/// few clients have queued work (`8 × $1` heads a tier between them).
///
/// The more heads with few clients are for `SKIP LOCKED` too: concurrent claims (another lane's,
/// another instance's) take the same first heads, and with one client and `$1` heads a batch
/// that found them locked came back empty while thousands of that client's tasks waited, and its
/// workers slept until the next wake-up. With 100 000 queued tasks of one client and 16 claimers
/// (`lmsp-bench --only pg-claims`), one instance claims 1 594–1 670/s instead of 898–967; across
/// 1 000 clients nothing changes (343–357/s).
///
/// Only `$1` of those clients can be served by the batch: a client's first task (its most urgent
/// head, at its running count) comes before every other task of that client in the order, so a
/// client behind `$1` others' first tasks has nothing among the `$1` taken. The others are there
/// for `SKIP LOCKED`: when a concurrent claim holds the first clients' heads, the batch takes
/// the next clients' rather than nothing. Expanding every client's heads instead sorted `$1` × 3
/// rows per client (48 000 for 1 000 clients: 850 ms a claim; 50 to 110 ms now, the walk over
/// the clients being what is left).
///
/// Each row is a task taken ([`TASK_COLUMNS`] first, then its place in the order) with how many
/// tasks the read found claimable (`candidates`, its snapshot's count of the heads it ranked,
/// locks aside); when it took none, the one row has no task (its columns `NULL`) and that
/// count. A batch that took fewer tasks than it found claimable lost the others to concurrent
/// claims (or to changes since its snapshot), which is how the adapter tells a queue held by
/// others from an empty one (`Reply::Held`) without a second read.
pub fn claimable_sql() -> &'static str {
    CLAIMABLE_SQL.as_str()
}

/// [`claimable_sql`]'s text, made once: every batch with a claim sends it.
static CLAIMABLE_SQL: LazyLock<String> = LazyLock::new(|| {
    // Each tier's heads are a subquery of their own with the tier as a literal, not one subquery
    // joined to a list of tiers: with the tier a parameter the planner cannot tell an empty tier
    // from a full one, and for a client whose queue fills one tier it walked the primary key past
    // every queued task in search of the other tiers' heads (142 ms a claim with 100 000 queued;
    // 0.5 ms with the literals, each head an index seek in `tasks_queue`).
    let tier_heads = |limit: &str| {
        ServiceTier::ALL
            .iter()
            .map(|tier| {
                format!(
                    "(SELECT t.id, t.client_id, t.tier, t.created_at FROM tasks t \
                     WHERE t.status = 'queued' AND t.client_id = l.client_id AND t.tier = {} \
                     ORDER BY t.id LIMIT {limit})",
                    tier.rank()
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    };
    let (firsts, heads) = (tier_heads("1"), tier_heads("l.heads"));
    let urgency = "GREATEST(h.tier - GREATEST($2::bigint - h.created_at, 0) / $3::bigint, 0)";
    format!(
        "WITH RECURSIVE queued(client_id) AS ( \
            (SELECT client_id FROM tasks WHERE status = 'queued' ORDER BY client_id LIMIT 1) \
            UNION ALL \
            SELECT (SELECT t.client_id FROM tasks t WHERE t.status = 'queued' \
                    AND t.client_id > q.client_id ORDER BY t.client_id LIMIT 1) \
            FROM queued q WHERE q.client_id IS NOT NULL), \
         loads AS ( \
            SELECT q.client_id, cq.max_running, cq.served_at, \
                   (SELECT count(*) FROM tasks a WHERE a.client_id = q.client_id \
                    AND a.status IN ('loading', 'running', 'cancelling')) AS running \
            FROM queued q LEFT JOIN client_queues cq ON cq.client_id = q.client_id \
            WHERE q.client_id IS NOT NULL), \
         served AS ( \
            SELECT l.client_id, l.max_running, l.served_at, l.running, \
                   GREATEST($1::bigint, $1::bigint * 8 / count(*) OVER ()) AS heads \
            FROM loads l CROSS JOIN LATERAL ( \
                SELECT h.id, {urgency} AS urgency FROM ({firsts}) h \
                ORDER BY urgency, h.id LIMIT 1) f \
            WHERE l.max_running IS NULL OR l.running < l.max_running \
            ORDER BY f.urgency, l.running, l.served_at NULLS FIRST, f.id \
            LIMIT $1::bigint * 4), \
         heads AS ( \
            SELECT h.id, h.client_id, {urgency} AS urgency \
            FROM served l CROSS JOIN LATERAL ({heads}) h), \
         ranked AS ( \
            SELECT h.id, h.urgency, l.max_running, l.served_at, \
                   l.running + row_number() OVER ( \
                       PARTITION BY h.client_id ORDER BY h.urgency, h.id) - 1 AS load \
            FROM heads h JOIN served l ON l.client_id = h.client_id), \
         eligible AS ( \
            SELECT r.id, r.urgency, r.load, r.served_at FROM ranked r \
            WHERE r.max_running IS NULL OR r.load < r.max_running), \
         picked AS ( \
            SELECT {TASK_COLUMNS}, r.urgency, r.load, r.served_at AS served \
            FROM eligible r JOIN tasks t ON t.id = r.id JOIN task_specs s ON s.task_id = t.id \
            WHERE t.status = 'queued' \
            ORDER BY r.urgency, r.load, r.served_at NULLS FIRST, t.id \
            LIMIT $1 FOR UPDATE OF t SKIP LOCKED) \
         SELECT p.*, c.candidates \
         FROM (SELECT count(*) AS candidates FROM eligible) c LEFT JOIN picked p ON true \
         ORDER BY p.urgency, p.load, p.served NULLS FIRST, p.id"
    )
});

/// Records when a claim served client `$1` (at `$2`), for fairness between clients, without
/// waiting for another claim's transaction.
///
/// The client's row is updated only when no other transaction holds it (`SKIP LOCKED`): one that
/// does is a concurrent claim serving the same client at about the same time, and its commit
/// records that. Waiting for it instead made every claim of a client wait for the one before to
/// commit, across lanes and instances: with 100 000 tasks of one client queued, three instances
/// claimed 576–618/s together against 1 750–1 798/s for one alone (`lmsp-bench --only
/// pg-claims`; 842–1 076/s without the wait). `served_at` only breaks ties between clients equally loaded, so the cost is
/// small: when the other transaction rolls back, the client keeps its earlier `served_at` and
/// may be served again before an equally loaded client. The time never moves back. A client's
/// first row is inserted (which waits only for a concurrent insert of the same row); the update
/// does not see a row its own statement inserted (one snapshot), so it leaves that one as is.
pub const SERVED_SQL: &str = "WITH added AS (INSERT INTO client_queues (client_id, served_at) \
     VALUES ($1, $2) ON CONFLICT (client_id) DO NOTHING) \
     UPDATE client_queues SET served_at = $2 WHERE client_id = ( \
        SELECT client_id FROM client_queues WHERE client_id = $1 \
        FOR NO KEY UPDATE SKIP LOCKED) \
     AND (served_at IS NULL OR served_at < $2)";

/// The task writes on a transaction (a recovery's moves; the hot writes are `batch.rs`'s, which
/// implements them over the rows its batch read): a task read for a write is locked.
impl<C: Db> TaskWrites for Rows<'_, C> {
    type Error = DbError;

    async fn task_to_write(&self, id: TaskId) -> Res<Option<Task>> {
        lock_task(self.0, id).await
    }

    async fn write_advanced(&self, old: &Task, new: &Task, events: &[Event]) -> Res<()> {
        write_advanced(self.0, old, new, events).await
    }

    async fn put_response(&self, response: &Response) -> Res<()> {
        insert_response(self.0, response).await
    }

    async fn put_snapshot(&self, task: TaskId, snapshot: &Snapshot) -> Res<()> {
        put_snapshot(self.0, task, snapshot).await
    }

    async fn drop_snapshot(&self, task: TaskId) -> Res<()> {
        delete_snapshot(self.0, task).await
    }

    async fn mark_served(&self, client: ClientId, at: Timestamp) -> Res<()> {
        self.0
            .execute(SERVED_SQL, &[&client_key(client), &at.as_millis()])
            .await?;
        Ok(())
    }
}

/// Deletes one finished task now (P-6: never an unfinished one; [`flows::delete_finished`]).
pub async fn delete_finished<C: Db>(
    db: &C,
    task_id: TaskId,
    client_id: Option<ClientId>,
) -> Res<DeleteOutcome> {
    flows::delete_finished(&Rows(db), task_id, client_id).await
}

/// The task whose response has this id: a task's own response id is its ULID, unless another
/// one was stored with the task.
pub async fn task_by_response<C: Db>(db: &C, response_id: ResponseId) -> Res<Option<Task>> {
    shared::task_by_response(&Rows(db), response_id).await
}

/// Tasks, newest first.
pub async fn list_tasks<C: Db>(db: &C, filter: &TaskFilter) -> Res<Page<Task>> {
    shared::list_tasks(&Rows(db), filter).await
}

/// A task's snapshot.
pub async fn snapshot<C: Db>(db: &C, task_id: TaskId) -> Res<Option<Snapshot>> {
    shared::snapshot(&Rows(db), task_id).await
}

/// Counts per status.
pub async fn count_by_status<C: Db>(db: &C) -> Res<Vec<(TaskStatus, u64)>> {
    shared::count_by_status(&Rows(db)).await
}

/// The `cancelling` tasks in the care of `owner`.
pub async fn cancelling_tasks<C: Db>(db: &C, owner: InstanceId) -> Res<Vec<TaskId>> {
    let rows = db
        .query(
            "SELECT id FROM tasks WHERE status = 'cancelling' AND owner = $1 ORDER BY id",
            &[&instance_key(owner)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let id: Vec<u8> = row.try_get(0)?;
            Ok(TaskId::from_ulid(ulid_of(&id)?))
        })
        .collect()
}

/// The stored response of a task, with its id checked against the task's.
pub async fn response<C: Db>(db: &C, task_id: TaskId) -> Res<Option<Response>> {
    shared::response_of_task(&Rows(db), task_id).await
}
