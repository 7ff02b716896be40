//! Instances and the recovery of those that stopped (P-7…P-11, I-5).
//!
//! SQLite serves one process at a time (the data directory is locked), so registering declares
//! every other instance stopped, and the lease is never contested.

use lmsp_domain::event::Event;
use lmsp_domain::ids::{InstanceId, TaskId};
use lmsp_domain::ports::{InstanceInfo, RecoveryReport, Registration};
use lmsp_domain::recovery::{needs_open_item_text, recover};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::Task;
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Advanced;
use lmsp_domain::EventKind;
use rusqlite::{params, CachedStatement, Connection};

use crate::ops::{
    corrupt, events, from_i64, instance_key, key, raw_task, to_i64, ulid_of, update_task, RawTask,
    Res, LEFTOVER_STATUSES, SNAPSHOT_DELETE, TASK_COLUMNS, TASK_COLUMN_COUNT, TASK_FROM,
    TASK_UPDATE,
};

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

/// Where a recovery pass has got to: the status it is looking at, and the last task of that
/// status it looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryCursor {
    status_index: usize,
    after: Option<TaskId>,
}

impl RecoveryCursor {
    /// The start of a pass.
    pub const START: RecoveryCursor = RecoveryCursor {
        status_index: 0,
        after: None,
    };
}

/// What one recovery batch did, and where the next one starts (`None`: the pass is complete).
pub type RecoveryStep = (RecoveryReport, Option<RecoveryCursor>);

/// Reads the leftovers of one status, in key order: each row with the sequence number its
/// snapshot covers (if it has one), which says where `resume` continues and whether a finished
/// move has a snapshot to drop.
const LEFTOVER_SCAN: &str =
    "WHERE t.status = ?1 AND t.id > ?2 AND t.owner = ?3 ORDER BY t.id LIMIT ?4";

/// The statements a recovery batch writes with, prepared once for the whole batch.
struct RecoveryWrites<'c> {
    update: CachedStatement<'c>,
    insert_event: CachedStatement<'c>,
    drop_snapshot: CachedStatement<'c>,
}

impl<'c> RecoveryWrites<'c> {
    fn prepare(conn: &'c Connection) -> Res<Self> {
        Ok(Self {
            update: conn.prepare_cached(TASK_UPDATE)?,
            insert_event: conn.prepare_cached(events::INSERT_EVENT)?,
            drop_snapshot: conn.prepare_cached(SNAPSHOT_DELETE)?,
        })
    }

    /// Writes one decided move: the task row as a compare-and-set on what was read, its events,
    /// and for a move to a finished status the dropped snapshot.
    fn write(&mut self, old: &Task, advanced: &Advanced, has_snapshot: bool) -> Res<()> {
        let new = &advanced.task;
        let changed = update_task(&mut self.update, old, new)?;
        if changed != 1 {
            return Err(corrupt(format!(
                "task {} moved under its transaction",
                old.id
            )));
        }
        for event in &advanced.events {
            events::insert_event_with(&mut self.insert_event, event)?;
        }
        if new.status.is_finished() && has_snapshot {
            self.drop_snapshot.execute([key(old.id)])?;
        }
        Ok(())
    }
}

/// One recovery batch (P-7…P-11, I-5): up to `limit` leftover tasks of `stopped` from `cursor`
/// on, read in one scan per status (row, spec and snapshot in one statement), each decided in
/// memory by the domain's [`recover`] (the one place the table is applied), and the decisions
/// written with statements prepared once for the batch, as a compare-and-set on what was read.
/// A batch goes on into the next status while it has room, so a pass takes as few transactions
/// as its size allows.
pub fn recover_batch(
    conn: &Connection,
    stopped: InstanceId,
    rescuer: InstanceId,
    at: Timestamp,
    cursor: RecoveryCursor,
    limit: usize,
) -> Res<(RecoveryStep, Vec<Event>)> {
    let limit = limit.max(1);
    let sql = format!(
        "SELECT {TASK_COLUMNS}, (SELECT n.sequence_number FROM snapshots n WHERE n.task_id = t.id) \
         FROM {TASK_FROM} {LEFTOVER_SCAN}"
    );
    let mut scan = conn.prepare_cached(&sql)?;
    let mut writes = RecoveryWrites::prepare(conn)?;
    let mut report = RecoveryReport::default();
    let mut all_events = Vec::new();
    let mut cursor = cursor;
    let mut room = limit;
    while let Some(status) = LEFTOVER_STATUSES.get(cursor.status_index) {
        let after = cursor.after.map(key).unwrap_or_default();
        let rows: Vec<(RawTask, Option<i64>)> = scan
            .query_map(
                params![
                    status.as_str(),
                    after.as_slice(),
                    instance_key(stopped),
                    to_i64(room as u64)?
                ],
                |row| Ok((raw_task(row)?, row.get(TASK_COLUMN_COUNT)?)),
            )?
            .collect::<Result<_, _>>()?;
        let full = rows.len() >= room;
        room -= rows.len().min(room);
        for (raw, snapshot_seq) in rows {
            let task = raw.decode()?;
            cursor.after = Some(task.id);
            // Only a running task's snapshot decides anything (where `resume` continues).
            let covers = match task.status {
                TaskStatus::Running => snapshot_seq.map(from_i64).transpose()?,
                _ => None,
            };
            let item_text = if needs_open_item_text(&task) {
                let index = task.items.opened.saturating_sub(1);
                Some(events::item_text(conn, task.id, index)?)
            } else {
                None
            };
            match recover(&task, rescuer, covers, item_text, at) {
                None => report.untouched += 1,
                Some(advanced) => {
                    writes.write(&task, &advanced, snapshot_seq.is_some())?;
                    if advanced
                        .events
                        .iter()
                        .any(|event| event.kind() == EventKind::Resumed)
                    {
                        report.resumed.push(task.id);
                    }
                    report.moved += 1;
                    all_events.extend(advanced.events);
                }
            }
        }
        if full {
            break;
        }
        cursor = RecoveryCursor {
            status_index: cursor.status_index + 1,
            after: None,
        };
    }
    drop(writes);
    let next = (cursor.status_index < LEFTOVER_STATUSES.len()).then_some(cursor);
    Ok(((report, next), all_events))
}
