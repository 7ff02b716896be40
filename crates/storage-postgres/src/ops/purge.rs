//! The purge (P-5, P-6, I-4): finished tasks past the retention, in small transactions.

use lmsp_domain::ports::PurgeReport;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::PURGED_STATUSES;
use lmsp_storage_codec::flows;

use crate::ops::{from_i64, to_i64, Db, Res, Rows};

/// One bounded purge batch: finished tasks (the domain's [`PURGED_STATUSES`]: never an unfinished
/// one, P-6) with `finished_at < cutoff`, oldest first, as many as the codec's
/// [`flows::purge_finished`] takes of them. The rows are locked with `SKIP LOCKED`, so a purge
/// never waits on a writer. A batch's tasks are left to
/// [`crate::ops::batches::purge_batches`]: they go with their batch, from its end.
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
    let rows = db
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
    let candidates = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, from_i64(row.try_get(1)?)?)))
        .collect::<Res<Vec<_>>>()?;
    flows::purge_finished(&Rows(db), &candidates, max_tasks, max_events).await
}
