//! The purge (P-5, P-6, I-4): finished tasks past the retention, in small transactions.

use lmsp_domain::ports::PurgeReport;
use lmsp_domain::time::Timestamp;

use crate::ops::tasks::delete_task_rows;
use crate::ops::{from_i64, to_i64, Db, Res, FINISHED_SQL};

/// One bounded purge batch: finished tasks with `finished_at < cutoff`, oldest first, at most
/// `max_tasks` of them and, past the first, no more than `max_events` events in all. The rows
/// are locked with `SKIP LOCKED`, so a purge never waits on a writer. Never an unfinished task
/// (P-6).
pub async fn purge_finished<C: Db>(
    db: &C,
    cutoff: Timestamp,
    max_tasks: usize,
    max_events: u64,
) -> Res<PurgeReport> {
    let sql = format!(
        "SELECT id, last_sequence_number FROM tasks WHERE finished_at IS NOT NULL \
         AND finished_at < $1 AND status IN {FINISHED_SQL} ORDER BY finished_at, id LIMIT $2 \
         FOR UPDATE SKIP LOCKED"
    );
    let candidates = db
        .query(&sql, &[&cutoff.as_millis(), &to_i64(max_tasks as u64 + 1)?])
        .await?;
    let mut report = PurgeReport::default();
    let mut budget_used: u64 = 0;
    for (index, row) in candidates.iter().enumerate() {
        let id: Vec<u8> = row.try_get(0)?;
        let events: i64 = row.try_get(1)?;
        let events = from_i64(events)?;
        let over_budget = index > 0 && budget_used + events > max_events;
        if index >= max_tasks || over_budget {
            report.more = true;
            break;
        }
        budget_used += events;
        report.events += delete_task_rows(db, &id).await?;
        report.tasks += 1;
    }
    Ok(report)
}
