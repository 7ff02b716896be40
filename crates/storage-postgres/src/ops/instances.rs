//! Instances, their leases, and the recovery of those that stopped (P-7…P-11, I-5).
//!
//! Many live instances share the database. A name is held by the incarnation whose lease runs;
//! registering under it serializes on a transaction-level advisory lock of the name. Time is
//! always the caller's (`at`, `started_at`), never the database clock, so leases mean the same
//! to every instance and to the tests' fixed times.

use lmsp_domain::event::Event;
use lmsp_domain::ids::{InstanceId, TaskId};
use lmsp_domain::ports::{InstanceInfo, Registration};
use lmsp_domain::recovery::{needs_open_item_text, recover};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::{tally, TaskWrite};
use lmsp_storage_codec::flows;

use crate::ops::{
    decode_task, events, from_i64, instance_key, instance_of, key, to_i64, ulid_of, Db, Res, Rows,
    TASK_COLUMNS, TASK_COLUMN_COUNT, TASK_FROM,
};

/// Registers `instance` unless another incarnation of its name holds a lease that has not run
/// out at `instance.started_at`; declares the earlier incarnations stopped.
pub async fn register<C: Db>(db: &C, instance: &InstanceInfo) -> Res<Registration> {
    let me = instance_key(instance.id);
    let at = instance.started_at.as_millis();
    db.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))",
        &[&instance.name],
    )
    .await?;
    let rows = db
        .query(
            "SELECT id, lease_until, retired_at, recovered_at FROM instances \
             WHERE name = $1 AND id <> $2 ORDER BY started_at, id FOR UPDATE",
            &[&instance.name, &me],
        )
        .await?;
    let mut previous = Vec::new();
    let mut live_until: Option<i64> = None;
    for row in &rows {
        let id: Vec<u8> = row.try_get(0)?;
        let lease_until: i64 = row.try_get(1)?;
        let retired_at: Option<i64> = row.try_get(2)?;
        let recovered_at: Option<i64> = row.try_get(3)?;
        if recovered_at.is_some() {
            continue;
        }
        if retired_at.is_none() && lease_until > at {
            live_until = Some(live_until.map_or(lease_until, |until| until.max(lease_until)));
        }
        previous.push(instance_of(&id)?);
    }
    if let Some(until) = live_until {
        return Ok(Registration::NameInUse {
            lease_until: Timestamp::from_millis(until),
        });
    }
    db.execute(
        "UPDATE instances SET retired_at = $1 \
         WHERE name = $2 AND id <> $3 AND retired_at IS NULL",
        &[&at, &instance.name, &me],
    )
    .await?;
    db.execute(
        "INSERT INTO instances (id, name, started_at, lease_until, retired_at, recovered_at) \
         VALUES ($1, $2, $3, $4, NULL, NULL) ON CONFLICT (id) DO UPDATE SET \
         name = EXCLUDED.name, started_at = EXCLUDED.started_at, \
         lease_until = EXCLUDED.lease_until, retired_at = NULL, recovered_at = NULL",
        &[&me, &instance.name, &at, &instance.lease_until.as_millis()],
    )
    .await?;
    Ok(Registration::Registered { previous })
}

/// Renews a lease; `false` when the instance was declared stopped, or its lease had run out by
/// `at` (then it is declared stopped now: another instance may be recovering its tasks).
pub async fn renew<C: Db>(
    db: &C,
    instance: InstanceId,
    lease_until: Timestamp,
    at: Timestamp,
) -> Res<bool> {
    let id = instance_key(instance);
    let Some(row) = db
        .query_opt(
            "SELECT lease_until, retired_at, recovered_at FROM instances WHERE id = $1 \
             FOR UPDATE",
            &[&id],
        )
        .await?
    else {
        return Ok(false);
    };
    let current: i64 = row.try_get(0)?;
    let retired_at: Option<i64> = row.try_get(1)?;
    let recovered_at: Option<i64> = row.try_get(2)?;
    if retired_at.is_some() || recovered_at.is_some() {
        return Ok(false);
    }
    if current <= at.as_millis() {
        db.execute(
            "UPDATE instances SET retired_at = $1 WHERE id = $2",
            &[&at.as_millis(), &id],
        )
        .await?;
        return Ok(false);
    }
    db.execute(
        "UPDATE instances SET lease_until = $1 WHERE id = $2",
        &[&lease_until.as_millis(), &id],
    )
    .await?;
    Ok(true)
}

/// Ends a lease.
pub async fn retire<C: Db>(db: &C, instance: InstanceId, at: Timestamp) -> Res<()> {
    db.execute(
        "UPDATE instances SET retired_at = $1 WHERE id = $2 AND retired_at IS NULL",
        &[&at.as_millis(), &instance_key(instance)],
    )
    .await?;
    Ok(())
}

/// Stopped instances (retired, or whose lease ran out by `at`) not yet recovered, oldest first.
pub async fn stopped<C: Db>(db: &C, me: InstanceId, at: Timestamp) -> Res<Vec<InstanceId>> {
    let rows = db
        .query(
            "SELECT id FROM instances WHERE id <> $1 AND recovered_at IS NULL \
             AND (retired_at IS NOT NULL OR lease_until <= $2) ORDER BY started_at, id",
            &[&instance_key(me), &at.as_millis()],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let id: Vec<u8> = row.try_get(0)?;
            instance_of(&id)
        })
        .collect()
}

/// Marks an instance recovered, ending its idempotency holds.
pub async fn mark_recovered<C: Db>(db: &C, instance: InstanceId, at: Timestamp) -> Res<()> {
    crate::ops::idempotency::release_holds_of(db, instance).await?;
    db.execute(
        "UPDATE instances SET recovered_at = $1 WHERE id = $2 AND recovered_at IS NULL",
        &[&at.as_millis(), &instance_key(instance)],
    )
    .await?;
    Ok(())
}

pub use crate::codec::{Recovered, RecoveryBatch, RecoveryCursor, RecoveryStep};

/// One recovery batch (P-7…P-11, I-5): up to `limit` unfinished tasks of `stopped` from `cursor`
/// on, each locked and read again, then moved per [`recover`] with its events as a
/// compare-and-set. A task another rescuer moved meanwhile is no longer `stopped`'s when read
/// under the lock, and is left alone: each task moves once.
pub async fn recover_batch<C: Db>(db: &C, batch: RecoveryBatch) -> Res<(RecoveryStep, Vec<Event>)> {
    let RecoveryBatch {
        stopped,
        rescuer,
        at,
        cursor,
        limit,
    } = batch;
    let mut recovered = Recovered::default();
    let Some(status) = cursor.status() else {
        return Ok(recovered.until(None));
    };
    let owner = instance_key(stopped);
    let after = cursor.after.map(key).unwrap_or_default();
    let candidates = db
        .query(
            "SELECT id FROM tasks WHERE owner = $1 AND status = $2 AND id > $3 \
             ORDER BY id LIMIT $4",
            &[&owner, &status.as_str(), &after, &to_i64(limit as u64)?],
        )
        .await?;
    let full = candidates.len() >= limit;
    let ids: Vec<Vec<u8>> = candidates
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let last = match ids.last() {
        Some(id) => Some(TaskId::from_ulid(ulid_of(id)?)),
        None => cursor.after,
    };
    let sql = format!(
        "SELECT {TASK_COLUMNS}, \
         (SELECT n.sequence_number FROM snapshots n WHERE n.task_id = t.id) \
         FROM {TASK_FROM} WHERE t.id = ANY($1) AND t.owner = $2 ORDER BY t.id FOR UPDATE OF t"
    );
    let rows = if ids.is_empty() {
        Vec::new()
    } else {
        db.query(&sql, &[&ids, &owner]).await?
    };
    for row in &rows {
        let task = decode_task(row)?;
        if task.owner != stopped || task.status.is_finished() {
            continue;
        }
        let snapshot_seq: Option<i64> = row.try_get(TASK_COLUMN_COUNT)?;
        // Only a running task's snapshot decides anything (where `resume` continues).
        let covers = if task.status == TaskStatus::Running {
            snapshot_seq.map(from_i64).transpose()?
        } else {
            None
        };
        let item_text = if needs_open_item_text(&task) {
            let index = task.items.opened.saturating_sub(1);
            Some(events::item_text(db, task.id, index).await?)
        } else {
            None
        };
        let write = recover(&task, rescuer, covers, item_text, at).map(TaskWrite::from_advanced);
        if let Some(write) = &write {
            flows::write_task(&Rows(db), &task, write).await?;
            recovered.events.extend(write.events.iter().cloned());
        }
        tally(&mut recovered.report, task.id, write.as_ref());
    }
    let next = if full {
        RecoveryCursor {
            status_index: cursor.status_index,
            after: last,
        }
    } else {
        cursor.next_status()
    };
    Ok(recovered.until(next.unless_done()))
}
