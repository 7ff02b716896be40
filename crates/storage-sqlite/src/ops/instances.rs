//! Instances and the recovery of those that stopped (P-7…P-11, I-5).
//!
//! SQLite serves one process at a time (the data directory is locked), so registering declares
//! every other instance stopped, and the lease is never contested.

use lmsp_domain::event::{Event, EventPayload};
use lmsp_domain::ids::{InstanceId, TaskId};
use lmsp_domain::ports::{InstanceInfo, Registration};
use lmsp_domain::recovery::{cells_of, move_event, Move};
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::{snapshot_change, SnapshotChange};
use lmsp_domain::EventKind;
use rusqlite::{params, Connection, OptionalExtension, ToSql};

use crate::codec;
use crate::codec::{EventCode, EventRow};
use crate::ops::events;
use crate::ops::{corrupt, from_i64, instance_key, key, to_i64, ulid_of, Res};

/// Registers `instance` and declares every other one stopped.
pub fn register(conn: &Connection, instance: &InstanceInfo) -> Res<Registration> {
    let me = instance_key(instance.id);
    let previous: Vec<Vec<u8>> = conn
        .prepare_cached("SELECT id FROM instances WHERE id != ?1 AND retired_at IS NULL")?
        .query_map([me], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    conn.prepare_cached(
        "UPDATE instances SET retired_at = ?1 WHERE id != ?2 AND retired_at IS NULL",
    )?
    .execute(params![instance.started_at.as_millis(), me])?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO instances (id, name, started_at, lease_until, retired_at, \
         recovered_at) VALUES (?1, ?2, ?3, ?4, NULL, NULL)",
    )?
    .execute(params![
        me,
        instance.name,
        instance.started_at.as_millis(),
        instance.lease_until.as_millis()
    ])?;
    let previous = previous
        .iter()
        .map(|id| Ok(InstanceId::from_ulid(ulid_of(id)?)))
        .collect::<Res<Vec<_>>>()?;
    Ok(Registration::Registered { previous })
}

/// Renews a lease; `false` when the instance was declared stopped.
pub fn renew(conn: &Connection, instance: InstanceId, lease_until: Timestamp) -> Res<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE instances SET lease_until = ?1 \
             WHERE id = ?2 AND retired_at IS NULL AND recovered_at IS NULL",
        )?
        .execute(params![lease_until.as_millis(), instance_key(instance)])?;
    Ok(changed == 1)
}

/// Ends a lease.
pub fn retire(conn: &Connection, instance: InstanceId, at: Timestamp) -> Res<()> {
    conn.prepare_cached(
        "UPDATE instances SET retired_at = ?1 WHERE id = ?2 AND retired_at IS NULL",
    )?
    .execute(params![at.as_millis(), instance_key(instance)])?;
    Ok(())
}

/// Stopped instances not yet recovered, oldest first.
pub fn stopped(conn: &Connection, me: InstanceId, at: Timestamp) -> Res<Vec<InstanceId>> {
    let ids: Vec<Vec<u8>> = conn
        .prepare_cached(
            "SELECT id FROM instances WHERE id != ?1 AND recovered_at IS NULL \
             AND (retired_at IS NOT NULL OR lease_until <= ?2) ORDER BY started_at, id",
        )?
        .query_map(params![instance_key(me), at.as_millis()], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ids.iter()
        .map(|id| Ok(InstanceId::from_ulid(ulid_of(id)?)))
        .collect()
}

/// Marks an instance recovered, ending its idempotency holds.
pub fn mark_recovered(conn: &Connection, instance: InstanceId, at: Timestamp) -> Res<()> {
    crate::ops::idempotency::release_holds_of(conn, instance)?;
    conn.prepare_cached("UPDATE instances SET recovered_at = ?1 WHERE id = ?2")?
        .execute(params![at.as_millis(), instance_key(instance)])?;
    Ok(())
}

pub use crate::codec::{Recovered, RecoveryBatch, RecoveryStep};

/// The tasks of one cell of the table that a statement applies to, bound as `?1`…`?5` (`t` is
/// `tasks`): of the stopped instance, in the cell's status under its policy, in the batch's range
/// of keys.
const CELL_TASKS: &str = "t.status = ?1 AND t.owner = ?2 AND t.on_restart = ?3 \
     AND t.id > ?4 AND t.id <= ?5";

/// The highest stored task key: the upper end of a range that leaves nothing out.
const LAST_KEY: [u8; 16] = [0xff; 16];

/// The columns a recovery insert returns, read by [`collect_returned`].
const RETURNED: &str = "RETURNING task_id, sequence_number, kind, created_at, data, item";

/// One cell's part of a batch: the parameters `?1`…`?5` of [`CELL_TASKS`].
struct CellSlice {
    status: &'static str,
    stopped: [u8; 16],
    policy: &'static str,
    after: Vec<u8>,
    upto: [u8; 16],
}

impl CellSlice {
    fn params(&self) -> [&dyn ToSql; 5] {
        [
            &self.status,
            &self.stopped,
            &self.policy,
            &self.after,
            &self.upto,
        ]
    }
}

/// One recovery batch (P-7…P-11, I-5): the next `limit` leftovers of `stopped` of one status, in
/// key order from `cursor` on (a batch that ends a status goes on into the next while it has
/// room). Each of the status's cells of the domain's recovery table ([`cells_of`]: the table as
/// data, the one place it lives) is applied to all the batch's tasks of that cell at once, its
/// statements built from the cell's [`Move`] alone, in the batch's one transaction: the item a restarted run leaves open closed as
/// incomplete, the event of the move (the domain's [`move_event`]), the snapshot dropped where
/// the domain's `snapshot_change` drops it, and the rows moved into the rescuer's care, each with its events and
/// `restarts + 1` (P-11). A moved task leaves the stopped instance, so a second pass finds
/// nothing to move (I-5); the `queued` tasks the table leaves alone are only counted. A batch
/// covers a range of consecutive keys of one status, so its statements touch neighbouring rows.
pub fn recover_batch(conn: &Connection, batch: RecoveryBatch) -> Res<(RecoveryStep, Vec<Event>)> {
    let RecoveryBatch {
        stopped,
        rescuer,
        at,
        mut cursor,
        limit,
    } = batch;
    let mut recovered = Recovered::default();
    let mut room = limit.max(1);
    while let Some(status) = cursor.status() {
        let mut slice = CellSlice {
            status: status.as_str(),
            stopped: instance_key(stopped),
            policy: "",
            after: cursor.after.map(|id| key(id).to_vec()).unwrap_or_default(),
            upto: LAST_KEY,
        };
        // The batch ends inside this status when it has `room` leftovers or more left.
        let last_of_batch = nth_leftover(conn, &slice, room)?;
        if let Some(last) = last_of_batch {
            slice.upto = last;
        }
        let mut covered = 0;
        for cell in cells_of(status) {
            slice.policy = cell.policy.as_str();
            match cell.moves {
                Move::Untouched => {
                    let sql = format!("SELECT count(*) FROM tasks t WHERE {CELL_TASKS}");
                    let count: i64 = conn
                        .prepare_cached(&sql)?
                        .query_row(&slice.params()[..], |row| row.get(0))?;
                    recovered.report.untouched += from_i64(count)?;
                    covered += from_i64(count)?;
                }
                moved @ Move::Moved { .. } => {
                    let events = &mut recovered.events;
                    let applied = apply_cell(conn, &slice, moved, rescuer, at, events)?;
                    recovered.report.moved += applied.moved;
                    recovered.report.resumed.extend(applied.resumed);
                    covered += applied.moved;
                }
            }
        }
        room = room.saturating_sub(usize::try_from(covered).unwrap_or(usize::MAX));
        match last_of_batch {
            Some(last) => {
                cursor.after = Some(TaskId::from_ulid(ulid_of(&last)?));
                break;
            }
            None => cursor = cursor.next_status(),
        }
        if room == 0 {
            break;
        }
    }
    Ok(recovered.until(cursor.unless_done()))
}

/// The key of the `n`-th leftover of the slice's status (from its cursor on), if it has that
/// many.
fn nth_leftover(conn: &Connection, slice: &CellSlice, n: usize) -> Res<Option<[u8; 16]>> {
    let offset = to_i64(n.saturating_sub(1) as u64)?;
    let found: Option<Vec<u8>> = conn
        .prepare_cached(
            "SELECT id FROM tasks WHERE status = ?1 AND owner = ?2 AND id > ?3 \
             ORDER BY id LIMIT 1 OFFSET ?4",
        )?
        .query_row(
            params![slice.status, slice.stopped, slice.after, offset],
            |row| row.get(0),
        )
        .optional()?;
    found
        .map(|bytes| {
            <[u8; 16]>::try_from(bytes.as_slice())
                .map_err(|_| corrupt(format!("a task key of {} bytes", bytes.len())))
        })
        .transpose()
}

/// What applying one cell's slice did.
struct CellApplied {
    moved: u64,
    resumed: Vec<TaskId>,
}

/// Applies a cell's move to every task of its slice, in the order [`recover`] writes a single
/// task: the open item closed as incomplete (with the text of its deltas), the event of the
/// move, the snapshot of a finished task dropped, the row moved to the rescuer.
fn apply_cell(
    conn: &Connection,
    slice: &CellSlice,
    moved: Move,
    rescuer: InstanceId,
    at: Timestamp,
    events: &mut Vec<Event>,
) -> Res<CellApplied> {
    let Move::Moved {
        status,
        event,
        increments_restarts,
        resumes_from_snapshot,
        closes_open_item,
        ..
    } = moved
    else {
        return Ok(CellApplied {
            moved: 0,
            resumed: Vec::new(),
        });
    };
    let at_millis = at.as_millis();
    let first_new = events.len();
    if closes_open_item {
        let sql = format!(
            "INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
             SELECT t.id, t.last_sequence_number + 1, ?6, ?7, json_object('text', coalesce(( \
                 SELECT group_concat(e.data, '' ORDER BY e.sequence_number) FROM task_events e \
                 WHERE e.task_id = t.id AND e.kind = ?8 \
                 AND coalesce(e.item, 0) = t.items_opened - 1), '')), t.items_opened - 1 \
             FROM tasks t WHERE {CELL_TASKS} AND t.item_open = 1 {RETURNED}"
        );
        let kind = EventCode::of(EventKind::OutputItemDone);
        let delta = EventCode::of(EventKind::OutputTextDelta);
        let mut params = slice.params().to_vec();
        params.extend([&kind as &dyn ToSql, &at_millis, &delta]);
        collect_returned(conn, &sql, &params, events)?;
    }
    // The event's stored data comes from the domain's payload, except where it differs per
    // task: where a resumed run continues (its snapshot's last event, else the task's last).
    let payload = move_event(event, 0);
    if payload.item().is_some() {
        return Err(corrupt("a recovery event about an output item"));
    }
    let data = if resumes_from_snapshot {
        None
    } else {
        Some(codec::event_data(&payload)?.into_owned())
    };
    let sql = format!(
        "INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
         SELECT t.id, t.last_sequence_number + 1 + (?6 AND t.item_open), ?7, ?8, coalesce(?9, \
             CAST(coalesce((SELECT n.sequence_number FROM snapshots n WHERE n.task_id = t.id), \
                 t.last_sequence_number) AS TEXT)), NULL \
         FROM tasks t WHERE {CELL_TASKS} {RETURNED}"
    );
    let kind = EventCode::of(event);
    let mut params = slice.params().to_vec();
    params.extend([&closes_open_item as &dyn ToSql, &kind, &at_millis, &data]);
    let written = collect_returned(conn, &sql, &params, events)?;
    if snapshot_change(status, None) == SnapshotChange::Drop {
        let sql = format!(
            "DELETE FROM snapshots WHERE task_id IN (SELECT t.id FROM tasks t WHERE {CELL_TASKS})"
        );
        conn.prepare_cached(&sql)?.execute(&slice.params()[..])?;
    }
    let error = match &payload {
        EventPayload::Failed { error } => Some(codec::error_to_text(error)?),
        _ => None,
    };
    let finished_at = status.is_finished().then_some(at_millis);
    let sql = format!(
        "UPDATE tasks AS t SET status = ?6, \
             last_sequence_number = t.last_sequence_number + 1 + (?7 AND t.item_open), \
             restarts = t.restarts + ?8, error = coalesce(?9, t.error), \
             finished_at = coalesce(?10, t.finished_at), owner = ?11, \
             item_open = CASE WHEN ?7 THEN 0 ELSE t.item_open END \
         WHERE {CELL_TASKS}"
    );
    let new_status = status.as_str();
    let restarts = i64::from(increments_restarts);
    let rescuer = instance_key(rescuer);
    let mut params = slice.params().to_vec();
    params.extend([
        &new_status as &dyn ToSql,
        &closes_open_item,
        &restarts,
        &error,
        &finished_at,
        &rescuer,
    ]);
    let moved = conn.prepare_cached(&sql)?.execute(&params[..])?;
    if moved != written {
        return Err(corrupt(format!(
            "recovery moved {moved} tasks but wrote {written} events"
        )));
    }
    let mut resumed: Vec<TaskId> = events[first_new..]
        .iter()
        .filter(|event| event.kind() == EventKind::Resumed)
        .map(|event| event.task_id)
        .collect();
    resumed.sort_unstable();
    Ok(CellApplied {
        moved: moved as u64,
        resumed,
    })
}

/// Runs an insert that returns the rows it wrote ([`RETURNED`]) and adds them to `events` as the
/// domain's events; how many it wrote.
fn collect_returned(
    conn: &Connection,
    sql: &str,
    params: &[&dyn ToSql],
    events: &mut Vec<Event>,
) -> Res<usize> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut written = 0;
    while let Some(row) = rows.next()? {
        let task_key: Vec<u8> = row.get(0)?;
        let task_id = TaskId::from_ulid(ulid_of(&task_key)?);
        let stored = EventRow {
            sequence_number: row.get(1)?,
            code: row.get(2)?,
            created_at: row.get(3)?,
            data: row.get::<_, String>(4)?.into(),
            item: row.get(5)?,
        };
        events.extend(events::decode_events(conn, task_id, vec![stored])?);
        written += 1;
    }
    Ok(written)
}
