//! The purge (P-5, P-6, I-4): finished tasks past the retention, in small transactions.

use lmsp_domain::ports::PurgeReport;
use lmsp_domain::time::Timestamp;
use rusqlite::{params, Connection};

use crate::ops::tasks::delete_task_rows;
use crate::ops::{from_i64, to_i64, Res, FINISHED_SQL};

/// One bounded purge batch: finished tasks with `finished_at < cutoff`, oldest first, at most
/// `max_tasks` of them and, past the first, no more than `max_events` events in all, so one
/// transaction stays short whatever the tasks' sizes. Never an unfinished task (P-6).
pub fn purge_finished(
    conn: &Connection,
    cutoff: Timestamp,
    max_tasks: usize,
    max_events: u64,
) -> Res<PurgeReport> {
    let sql = format!(
        "SELECT id, last_sequence_number FROM tasks WHERE finished_at IS NOT NULL \
         AND finished_at < ?1 AND status IN {FINISHED_SQL} ORDER BY finished_at LIMIT ?2"
    );
    let candidates: Vec<(Vec<u8>, i64)> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![cutoff.as_millis(), to_i64(max_tasks as u64 + 1)?],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?
        .collect::<Result<_, _>>()?;
    let mut report = PurgeReport::default();
    let mut budget_used: u64 = 0;
    for (index, (id, events)) in candidates.iter().enumerate() {
        let events = from_i64(*events)?;
        let over_budget = index > 0 && budget_used + events > max_events;
        if index >= max_tasks || over_budget {
            report.more = true;
            break;
        }
        budget_used += events;
        report.events += delete_task_rows(conn, id)?;
        report.tasks += 1;
    }
    Ok(report)
}
