//! The purge (P-5, P-6, I-4): finished tasks past the retention, in small transactions.

use lmsp_domain::ports::PurgeReport;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::PURGED_STATUSES;
use lmsp_storage_codec::flows;
use rusqlite::{params, Connection};

use crate::ops::{from_i64, run, to_i64, Res, Rows};

/// One bounded purge batch: finished tasks (the domain's [`PURGED_STATUSES`]: never an unfinished
/// one, P-6) with `finished_at < cutoff`, oldest first, as many as the codec's
/// [`flows::purge_finished`] takes of them. A batch's tasks are left to
/// [`crate::ops::batches::purge_batches`]: they go with their batch, from its end.
pub fn purge_finished(
    conn: &Connection,
    cutoff: Timestamp,
    max_tasks: usize,
    max_events: u64,
) -> Res<PurgeReport> {
    let [first, second, third] = PURGED_STATUSES.map(|status| status.as_str());
    let candidates: Vec<(Vec<u8>, i64)> = conn
        .prepare_cached(
            "SELECT id, last_sequence_number FROM tasks WHERE finished_at IS NOT NULL \
             AND finished_at < ?1 AND status IN (?3, ?4, ?5) AND batch_id IS NULL \
             ORDER BY finished_at LIMIT ?2",
        )?
        .query_map(
            params![
                cutoff.as_millis(),
                to_i64(max_tasks as u64 + 1)?,
                first,
                second,
                third
            ],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?
        .collect::<Result<_, _>>()?;
    let candidates = candidates
        .into_iter()
        .map(|(id, events)| Ok((id, from_i64(events)?)))
        .collect::<Res<Vec<_>>>()?;
    run(flows::purge_finished(
        &Rows(conn),
        &candidates,
        max_tasks,
        max_events,
    ))
}
