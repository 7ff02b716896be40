//! Events in their stored form (`lmsp_storage_codec::events`), written and read on SQLite.

use std::sync::LazyLock;

use lmsp_domain::event::Event;
use lmsp_domain::ids::TaskId;
use lmsp_domain::ports::Page;
use lmsp_domain::task::{Response, Task};
use rusqlite::{params, Connection, Statement};

use crate::codec::{self, ops as shared, EventRow, Needs};
use crate::ops::{key, load_task, run, to_i64, Res, Rows};

/// Inserts one event (the codec's statement, in SQLite's text once): bound by
/// [`insert_event_with`].
pub static INSERT_EVENT: LazyLock<String> =
    LazyLock::new(|| codec::sql::for_sqlite(codec::sql::INSERT_EVENT));

/// Inserts one event with [`INSERT_EVENT`], prepared by the caller.
pub fn insert_event_with(stmt: &mut Statement<'_>, event: &Event) -> Res<()> {
    let row = EventRow::encode(event)?;
    stmt.execute(params![
        key(event.task_id),
        row.sequence_number,
        row.code,
        row.created_at,
        row.data.as_ref(),
        row.item,
    ])?;
    Ok(())
}

/// Appends events.
pub fn insert_events(conn: &Connection, events: &[Event]) -> Res<()> {
    let mut stmt = conn.prepare_cached(&INSERT_EVENT)?;
    for event in events {
        insert_event_with(&mut stmt, event)?;
    }
    Ok(())
}

/// The stored response of a task, checked to be that task's.
pub fn response_of_task(conn: &Connection, task_id: TaskId) -> Res<Option<Response>> {
    run(shared::response_of_task(&Rows(conn), task_id))
}

/// Events after `after`, ascending. One read transaction, so the events and the task and response
/// they are rebuilt from are one snapshot even while a purge runs.
pub fn events(conn: &Connection, task_id: TaskId, after: u64, limit: usize) -> Res<Page<Event>> {
    let snapshot = conn.unchecked_transaction()?;
    let page = events_in(&snapshot, task_id, after, limit)?;
    snapshot.commit()?;
    Ok(page)
}

/// Events after `after` inside the current transaction.
pub fn events_in(conn: &Connection, task_id: TaskId, after: u64, limit: usize) -> Res<Page<Event>> {
    // Sequence numbers fit in i64; an `after` past that simply has nothing after it.
    let after_key = i64::try_from(after).unwrap_or(i64::MAX);
    let rows: Vec<EventRow<'static>> = conn
        .prepare_cached(
            "SELECT sequence_number, kind, created_at, data, item FROM task_events \
             WHERE task_id = ?1 AND sequence_number > ?2 ORDER BY sequence_number LIMIT ?3",
        )?
        .query_map(
            params![key(task_id), after_key, to_i64(limit as u64 + 1)?],
            |row| {
                Ok(EventRow {
                    sequence_number: row.get(0)?,
                    code: row.get(1)?,
                    created_at: row.get(2)?,
                    data: row.get::<_, String>(3)?.into(),
                    item: row.get(4)?,
                })
            },
        )?
        .collect::<Result<_, _>>()?;
    let kept = &rows[..rows.len().min(limit)];
    let (task, response) = sources(conn, task_id, EventRow::needs_of(kept))?;
    Ok(codec::events_page(
        rows,
        task_id,
        limit,
        task.as_ref(),
        response.as_ref(),
    )?)
}

/// Stored event rows of one task as the domain's events, reading the task and its response only
/// when a row is rebuilt from them.
pub fn decode_events(
    conn: &Connection,
    task_id: TaskId,
    rows: Vec<EventRow<'_>>,
) -> Res<Vec<Event>> {
    let (task, response) = sources(conn, task_id, EventRow::needs_of(&rows))?;
    Ok(codec::decode_events(
        rows,
        task_id,
        task.as_ref(),
        response.as_ref(),
    )?)
}

/// The rows that `needs` names.
fn sources(
    conn: &Connection,
    task_id: TaskId,
    needs: Needs,
) -> Res<(Option<Task>, Option<Response>)> {
    let task = if needs.task {
        load_task(conn, task_id)?
    } else {
        None
    };
    let response = if needs.response {
        response_of_task(conn, task_id)?
    } else {
        None
    };
    Ok((task, response))
}
