//! Events in their stored form (`lmsp_storage_codec::events`: the same rows as the SQLite
//! adapter's), written and read on PostgreSQL.

use lmsp_domain::event::{Event, EventKind};
use lmsp_domain::ids::TaskId;

use crate::codec::{self, EventCode, EventRow};
use crate::ops::{key, Db, Res};

/// Appends events.
pub async fn insert_events<C: Db>(db: &C, events: &[Event]) -> Res<()> {
    for event in events {
        let row = EventRow::encode(event)?;
        db.execute(
            codec::sql::INSERT_EVENT,
            &[
                &key(event.task_id),
                &row.sequence_number,
                &row.code,
                &row.created_at,
                &row.data.as_ref(),
                &row.item,
            ],
        )
        .await?;
    }
    Ok(())
}

/// The text of the deltas of output item `index` of a task (an open item's text so far).
pub async fn item_text<C: Db>(db: &C, task_id: TaskId, index: u32) -> Res<String> {
    let rows = db
        .query(
            "SELECT data FROM task_events WHERE task_id = $1 AND kind = $2 AND \
             coalesce(item, 0) = $3 ORDER BY sequence_number",
            &[
                &key(task_id),
                &EventCode::of(EventKind::OutputTextDelta),
                &i64::from(index),
            ],
        )
        .await?;
    let mut text = String::new();
    for row in rows {
        let delta: String = row.try_get(0)?;
        text.push_str(&delta);
    }
    Ok(text)
}
