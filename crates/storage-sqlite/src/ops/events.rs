//! Events in their stored form, and back.
//!
//! One row per event: `kind` a small code ([`EventCode`]), `data` the event's data in its
//! shortest form (a delta's text as is), `item` the output index of the item the event is about.
//! What another row already holds is not copied: the task of `response.created` is rebuilt from
//! `tasks`/`task_specs`, and the response of `response.completed` and the text of a completed
//! item from `responses`.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use lmsp_domain::event::{ClosedItem, Event, EventKind, EventPayload, QueueReason};
use lmsp_domain::ids::{ItemId, TaskId};
use lmsp_domain::model::ModelId;
use lmsp_domain::ports::Page;
use lmsp_domain::task::{ItemStatus, Response, Task};
use lmsp_domain::time::Timestamp;
use rusqlite::{params, Connection, OptionalExtension, Statement};

use crate::codec;
use crate::ops::{corrupt, from_i64, key, load_task, to_i64, Res};

/// The code of each event kind in `task_events.kind`. Stored on disk: never renumber.
#[derive(Debug, Clone, Copy)]
pub struct EventCode;

impl EventCode {
    const KINDS: [(EventKind, i64); 15] = [
        (EventKind::Created, 1),
        (EventKind::Loading, 2),
        (EventKind::InProgress, 3),
        (EventKind::OutputTextDelta, 4),
        (EventKind::Cancelling, 5),
        (EventKind::Queued, 6),
        (EventKind::Resumed, 7),
        (EventKind::Completed, 8),
        (EventKind::Failed, 9),
        (EventKind::Cancelled, 10),
        (EventKind::OutputItemAdded, 11),
        (EventKind::ContentPartAdded, 12),
        (EventKind::OutputTextDone, 13),
        (EventKind::ContentPartDone, 14),
        (EventKind::OutputItemDone, 15),
    ];

    /// The code of a kind.
    pub fn of(kind: EventKind) -> i64 {
        Self::KINDS
            .iter()
            .find(|(known, _)| *known == kind)
            .map_or(0, |(_, code)| *code)
    }

    /// The kind of a code.
    pub fn kind(code: i64) -> Res<EventKind> {
        Self::KINDS
            .iter()
            .find(|(_, known)| *known == code)
            .map(|(kind, _)| *kind)
            .ok_or_else(|| corrupt(format!("unknown event code {code}")))
    }
}

/// The data of an item closed as incomplete: its text is nowhere else.
#[derive(Debug, Serialize, Deserialize)]
struct IncompleteItem {
    text: String,
}

/// An event's data in its stored form.
pub fn event_data(payload: &EventPayload) -> Res<Cow<'_, str>> {
    Ok(match payload {
        EventPayload::Created { .. }
        | EventPayload::InProgress
        | EventPayload::Cancelling
        | EventPayload::Completed { .. }
        | EventPayload::Cancelled
        | EventPayload::OutputItemAdded { .. }
        | EventPayload::ContentPartAdded { .. } => Cow::Borrowed(""),
        EventPayload::OutputTextDone(closed)
        | EventPayload::ContentPartDone(closed)
        | EventPayload::OutputItemDone(closed) => match closed.status {
            ItemStatus::Completed => Cow::Borrowed(""),
            ItemStatus::Incomplete => Cow::Owned(serde_json::to_string(&IncompleteItem {
                text: closed.text.clone(),
            })?),
        },
        EventPayload::Loading { model } => Cow::Borrowed(model.as_str()),
        EventPayload::OutputTextDelta { delta, .. } => Cow::Borrowed(delta.as_str()),
        EventPayload::Queued { reason } => Cow::Owned(serde_json::to_string(reason.as_str())?),
        EventPayload::Resumed {
            from_sequence_number,
        } => Cow::Owned(from_sequence_number.to_string()),
        EventPayload::Failed { error } => Cow::Owned(codec::error_to_text(error)?),
    })
}

/// Inserts one event: bound by [`insert_event_with`].
pub const INSERT_EVENT: &str = "INSERT INTO task_events (task_id, sequence_number, kind, \
     created_at, data, item) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// Inserts one event with [`INSERT_EVENT`], prepared by the caller.
pub fn insert_event_with(stmt: &mut Statement<'_>, event: &Event) -> Res<()> {
    stmt.execute(params![
        key(event.task_id),
        to_i64(event.sequence_number)?,
        EventCode::of(event.kind()),
        event.created_at.as_millis(),
        event_data(&event.payload)?.as_ref(),
        event.payload.item().map(|item| item.output_index()),
    ])?;
    Ok(())
}

/// Appends events.
pub fn insert_events(conn: &Connection, events: &[Event]) -> Res<()> {
    let mut stmt = conn.prepare_cached(INSERT_EVENT)?;
    for event in events {
        insert_event_with(&mut stmt, event)?;
    }
    Ok(())
}

/// The lazily read rows an event may be rebuilt from.
struct Sources<'c> {
    conn: &'c Connection,
    task_id: TaskId,
    task: Option<Task>,
    response: Option<Response>,
}

impl Sources<'_> {
    fn task(&mut self) -> Res<&Task> {
        if self.task.is_none() {
            self.task = Some(
                load_task(self.conn, self.task_id)?
                    .ok_or_else(|| corrupt(format!("events of no task {}", self.task_id)))?,
            );
        }
        self.task.as_ref().ok_or_else(|| corrupt("a task vanished"))
    }

    fn response(&mut self) -> Res<&Response> {
        if self.response.is_none() {
            self.response = Some(response_of_task(self.conn, self.task_id)?.ok_or_else(|| {
                corrupt(format!(
                    "task {} completed without a response",
                    self.task_id
                ))
            })?);
        }
        self.response
            .as_ref()
            .ok_or_else(|| corrupt("a response vanished"))
    }

    fn closed(&mut self, item: ItemId, data: &str) -> Res<ClosedItem> {
        if data.is_empty() {
            Ok(ClosedItem {
                item,
                text: self.response()?.output_text.clone(),
                status: ItemStatus::Completed,
            })
        } else {
            let incomplete: IncompleteItem = serde_json::from_str(data)?;
            Ok(ClosedItem {
                item,
                text: incomplete.text,
                status: ItemStatus::Incomplete,
            })
        }
    }

    fn payload(&mut self, kind: EventKind, data: String, item: Option<u32>) -> Res<EventPayload> {
        let item = ItemId::of(self.task_id, item.unwrap_or(0));
        Ok(match kind {
            EventKind::Created => EventPayload::Created {
                task: Box::new(self.task()?.as_created()),
            },
            EventKind::Loading => EventPayload::Loading {
                model: ModelId::parse(&data).map_err(corrupt)?,
            },
            EventKind::InProgress => EventPayload::InProgress,
            EventKind::OutputItemAdded => EventPayload::OutputItemAdded { item },
            EventKind::ContentPartAdded => EventPayload::ContentPartAdded { item },
            EventKind::OutputTextDelta => EventPayload::OutputTextDelta { item, delta: data },
            EventKind::OutputTextDone => EventPayload::OutputTextDone(self.closed(item, &data)?),
            EventKind::ContentPartDone => EventPayload::ContentPartDone(self.closed(item, &data)?),
            EventKind::OutputItemDone => EventPayload::OutputItemDone(self.closed(item, &data)?),
            EventKind::Cancelling => EventPayload::Cancelling,
            EventKind::Queued => {
                let name: String = serde_json::from_str(&data)?;
                let reason = name
                    .parse::<QueueReason>()
                    .map_err(|_| corrupt(format!("a queue reason `{name}`")))?;
                EventPayload::Queued { reason }
            }
            EventKind::Resumed => EventPayload::Resumed {
                from_sequence_number: data.parse().map_err(corrupt)?,
            },
            EventKind::Completed => EventPayload::Completed {
                response: Box::new(self.response()?.clone()),
            },
            EventKind::Failed => EventPayload::Failed {
                error: codec::error_from_text(&data)?,
            },
            EventKind::Cancelled => EventPayload::Cancelled,
        })
    }
}

/// The stored response of a task.
pub fn response_of_task(conn: &Connection, task_id: TaskId) -> Res<Option<Response>> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM responses WHERE task_id = ?1")?
        .query_row([key(task_id)], |row| row.get(0))
        .optional()?;
    doc.map(|doc| codec::response_from_text(&doc))
        .transpose()
        .map_err(Into::into)
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
    type Row = (i64, i64, i64, String, Option<i64>);
    let rows: Vec<Row> = conn
        .prepare_cached(
            "SELECT sequence_number, kind, created_at, data, item FROM task_events \
             WHERE task_id = ?1 AND sequence_number > ?2 ORDER BY sequence_number LIMIT ?3",
        )?
        .query_map(
            params![key(task_id), after_key, to_i64(limit as u64 + 1)?],
            |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            },
        )?
        .collect::<Result<_, _>>()?;
    let has_more = rows.len() > limit;
    let mut sources = Sources {
        conn,
        task_id,
        task: None,
        response: None,
    };
    let mut items = Vec::with_capacity(rows.len().min(limit));
    for (seq, code, created_at, data, item) in rows.into_iter().take(limit) {
        let item = item.map(u32::try_from).transpose().map_err(corrupt)?;
        items.push(Event {
            task_id,
            sequence_number: from_i64(seq)?,
            created_at: Timestamp::from_millis(created_at),
            payload: sources.payload(EventCode::kind(code)?, data, item)?,
        });
    }
    Ok(Page { items, has_more })
}

/// One stored event row as the domain's event (the rows it is rebuilt from are read only when
/// its kind needs them).
pub fn decode_event(
    conn: &Connection,
    task_id: TaskId,
    sequence_number: i64,
    code: i64,
    created_at: i64,
    data: String,
    item: Option<i64>,
) -> Res<Event> {
    let item = item.map(u32::try_from).transpose().map_err(corrupt)?;
    let mut sources = Sources {
        conn,
        task_id,
        task: None,
        response: None,
    };
    Ok(Event {
        task_id,
        sequence_number: from_i64(sequence_number)?,
        created_at: Timestamp::from_millis(created_at),
        payload: sources.payload(EventCode::kind(code)?, data, item)?,
    })
}
