//! Events in their stored form (`lmsp_storage_codec::events`: the same rows as the SQLite
//! adapter's), written and read on PostgreSQL.

use lmsp_domain::event::{Event, EventKind};
use lmsp_domain::ids::TaskId;
use lmsp_domain::ports::Page;
use lmsp_domain::task::Response;

use crate::codec::{self, EventCode, EventRow, Sources};
use crate::ops::{key, load_task, to_i64, Db, Res};

/// Appends events.
pub async fn insert_events<C: Db>(db: &C, events: &[Event]) -> Res<()> {
    for event in events {
        let row = EventRow::encode(event)?;
        db.execute(
            "INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
             VALUES ($1, $2, $3, $4, $5, $6)",
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

/// The stored response of a task, checked to be that task's.
pub async fn response_of_task<C: Db>(db: &C, task_id: TaskId) -> Res<Option<Response>> {
    let doc: Option<String> = match db
        .query_opt(
            "SELECT doc FROM responses WHERE task_id = $1",
            &[&key(task_id)],
        )
        .await?
    {
        Some(row) => row.try_get(0)?,
        None => None,
    };
    Ok(codec::response_of_task(task_id, doc.as_deref())?)
}

/// Events after `after`, ascending, inside the current transaction (the caller opens a
/// repeatable-read one, so the events and the rows they are rebuilt from are one snapshot).
pub async fn events_in<C: Db>(
    db: &C,
    task_id: TaskId,
    after: u64,
    limit: usize,
) -> Res<Page<Event>> {
    // Sequence numbers fit in i64; an `after` past that simply has nothing after it.
    let after_key = i64::try_from(after).unwrap_or(i64::MAX);
    let found = db
        .query(
            "SELECT sequence_number, kind, created_at, data, item FROM task_events \
             WHERE task_id = $1 AND sequence_number > $2 ORDER BY sequence_number LIMIT $3",
            &[&key(task_id), &after_key, &to_i64(limit as u64 + 1)?],
        )
        .await?;
    let has_more = found.len() > limit;
    let rows = found
        .iter()
        .take(limit)
        .map(|row| {
            Ok(EventRow {
                sequence_number: row.try_get(0)?,
                code: row.try_get(1)?,
                created_at: row.try_get(2)?,
                data: row.try_get::<_, String>(3)?.into(),
                item: row.try_get(4)?,
            })
        })
        .collect::<Res<Vec<_>>>()?;
    // Read the task and its response only when a row is rebuilt from them.
    let needs = EventRow::needs_of(&rows);
    let task = if needs.task {
        load_task(db, task_id).await?
    } else {
        None
    };
    let response = if needs.response {
        response_of_task(db, task_id).await?
    } else {
        None
    };
    let sources = Sources {
        task: task.as_ref(),
        response: response.as_ref(),
    };
    let items = rows
        .into_iter()
        .map(|row| Ok(row.decode(task_id, sources)?))
        .collect::<Res<Vec<_>>>()?;
    Ok(Page { items, has_more })
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
