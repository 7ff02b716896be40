//! The purge (P-5, P-6, I-4): finished tasks past the retention, in small transactions.

use lmsp_domain::ports::PurgeReport;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::PURGED_STATUSES;
use lmsp_storage_codec::flows::{self, PurgeRows};

use crate::ops::{from_i64, to_i64, Db, Res, Rows};

/// The purge's candidates: finished tasks (the domain's [`PURGED_STATUSES`]: never an unfinished
/// one, P-6) with `finished_at < cutoff`, oldest first, locked with `SKIP LOCKED`, so a purge
/// never waits on a writer. A batch's tasks are left to
/// [`crate::ops::batches::purge_batches`]: they go with their batch, from its end.
impl<C: Db> PurgeRows for Rows<'_, C> {
    async fn finished_candidates(
        &self,
        cutoff: Timestamp,
        limit: usize,
    ) -> Res<Vec<(Vec<u8>, u64)>> {
        let finished: Vec<&str> = PURGED_STATUSES
            .iter()
            .map(|status| status.as_str())
            .collect();
        let rows = self
            .0
            .query(
                "SELECT id, last_sequence_number FROM tasks WHERE finished_at IS NOT NULL \
                 AND finished_at < $1 AND status = ANY($3) AND batch_id IS NULL \
                 ORDER BY finished_at, id LIMIT $2 \
                 FOR UPDATE SKIP LOCKED",
                &[&cutoff.as_millis(), &to_i64(limit as u64)?, &finished],
            )
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, from_i64(row.try_get(1)?)?)))
            .collect()
    }
}

/// One bounded purge batch (the codec's [`flows::purge_finished`] over the candidates above), so
/// one transaction stays short whatever the tasks' sizes.
pub async fn purge_finished<C: Db>(
    db: &C,
    cutoff: Timestamp,
    max_tasks: usize,
    max_events: u64,
) -> Res<PurgeReport> {
    flows::purge_finished(&Rows(db), cutoff, max_tasks, max_events).await
}
