//! The purge (P-5, P-6, I-4): finished tasks past the retention, in small transactions.

use lmsp_domain::ports::PurgeReport;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::{purge_batch, PURGED_STATUSES};

use crate::ops::tasks::delete_task_rows;
use crate::ops::{from_i64, to_i64, Db, Res};

/// One bounded purge batch: finished tasks (the domain's [`PURGED_STATUSES`]: never an unfinished
/// one, P-6) with `finished_at < cutoff`, oldest first, as many as the domain's [`purge_batch`]
/// takes of them. The rows are locked with `SKIP LOCKED`, so a purge never waits on a writer. A
/// batch's tasks are left to [`crate::ops::batches::purge_batches`]: they go with their batch,
/// from its end.
pub async fn purge_finished<C: Db>(
    db: &C,
    cutoff: Timestamp,
    max_tasks: usize,
    max_events: u64,
) -> Res<PurgeReport> {
    let finished: Vec<&str> = PURGED_STATUSES
        .iter()
        .map(|status| status.as_str())
        .collect();
    let candidates = db
        .query(
            "SELECT id, last_sequence_number FROM tasks WHERE finished_at IS NOT NULL \
             AND finished_at < $1 AND status = ANY($3) AND batch_id IS NULL \
             ORDER BY finished_at, id LIMIT $2 \
             FOR UPDATE SKIP LOCKED",
            &[
                &cutoff.as_millis(),
                &to_i64(max_tasks as u64 + 1)?,
                &finished,
            ],
        )
        .await?;
    let mut ids = Vec::with_capacity(candidates.len());
    let mut sizes = Vec::with_capacity(candidates.len());
    for row in &candidates {
        ids.push(row.try_get::<_, Vec<u8>>(0)?);
        sizes.push(from_i64(row.try_get(1)?)?);
    }
    let batch = purge_batch(&sizes, max_tasks, max_events);
    let mut events = 0;
    for id in ids.iter().take(batch.tasks) {
        events += delete_task_rows(db, id).await?;
    }
    Ok(batch.report(events))
}
