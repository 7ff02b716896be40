//! Events in their stored form, and back: the same rows in both adapters.
//!
//! One row per event: `kind` a small code ([`EventCode`]), `data` the event's data in its
//! shortest form (a delta's text as is), `item` the output index of the item the event is about.
//! What another row already holds is not copied: the task of `response.created` is rebuilt from
//! `tasks`/`task_specs`, and the response of `response.completed` and the text of a completed
//! item from `responses`. [`EventRow::needs`] says which of those rows a stored event is rebuilt
//! from, so an adapter reads them only when a row needs them.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use lmsp_domain::event::{CallItem, ClosedItem, Event, EventKind, EventPayload, QueueReason};
use lmsp_domain::ids::{ItemId, TaskId};
use lmsp_domain::model::ModelId;
use lmsp_domain::ports::Page;
use lmsp_domain::task::{ItemStatus, Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::tools::{Logprob, TokenLogprob, TopLogprob};

use crate::{corrupt, error_from_text, error_to_text, from_i64, to_i64, DbError};

/// The code of each event kind in `task_events.kind`. Stored on disk: never renumber.
#[derive(Debug, Clone, Copy)]
pub struct EventCode;

impl EventCode {
    /// The code of a `response.output_text.delta` that carries log probabilities (its data is a
    /// document, not the bare text).
    pub const DELTA_WITH_LOGPROBS: i64 = 20;

    const KINDS: [(EventKind, i64); 20] = [
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
        (EventKind::FunctionCallAdded, 16),
        (EventKind::FunctionCallArgumentsDelta, 17),
        (EventKind::FunctionCallArgumentsDone, 18),
        (EventKind::FunctionCallDone, 19),
        (EventKind::OutputTextDelta, Self::DELTA_WITH_LOGPROBS),
    ];

    /// The code of an event's row: its kind's, but for a delta with log probabilities.
    pub fn of_payload(payload: &EventPayload) -> i64 {
        match payload {
            EventPayload::OutputTextLogprobs { .. } => Self::DELTA_WITH_LOGPROBS,
            other => Self::of(other.kind()),
        }
    }

    /// The code of a kind (a plain delta's, for [`EventKind::OutputTextDelta`]).
    pub fn of(kind: EventKind) -> i64 {
        Self::KINDS
            .iter()
            .find(|(known, _)| *known == kind)
            .map_or(0, |(_, code)| *code)
    }

    /// The kind of a code.
    pub fn kind(code: i64) -> Result<EventKind, DbError> {
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

/// The data of a delta with log probabilities.
#[derive(Debug, Serialize, Deserialize)]
struct LogprobsDelta {
    text: String,
    logprobs: Vec<TokenDoc>,
}

/// One token's log probability (short names: there is one per token).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TokenDoc {
    t: String,
    b: Vec<u8>,
    l: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    top: Vec<TokenDoc>,
}

fn token_doc(token: &str, bytes: &[u8], logprob: Logprob) -> TokenDoc {
    TokenDoc {
        t: token.to_owned(),
        b: bytes.to_vec(),
        l: logprob.get(),
        top: Vec::new(),
    }
}

fn logprob_of(value: f64) -> Result<Logprob, DbError> {
    Logprob::new(value).ok_or_else(|| corrupt(format!("a log probability of {value}")))
}

pub(crate) fn tokens_to_docs(tokens: &[TokenLogprob]) -> Vec<TokenDoc> {
    tokens
        .iter()
        .map(|token| TokenDoc {
            top: token
                .top
                .iter()
                .map(|top| token_doc(&top.token, &top.bytes, top.logprob))
                .collect(),
            ..token_doc(&token.token, &token.bytes, token.logprob)
        })
        .collect()
}

pub(crate) fn tokens_from_docs(docs: Vec<TokenDoc>) -> Result<Vec<TokenLogprob>, DbError> {
    docs.into_iter()
        .map(|doc| {
            Ok(TokenLogprob {
                logprob: logprob_of(doc.l)?,
                top: doc
                    .top
                    .into_iter()
                    .map(|top| {
                        Ok(TopLogprob {
                            logprob: logprob_of(top.l)?,
                            token: top.t,
                            bytes: top.b,
                        })
                    })
                    .collect::<Result<_, DbError>>()?,
                token: doc.t,
                bytes: doc.b,
            })
        })
        .collect()
}

/// The data of a function call's start.
#[derive(Debug, Serialize, Deserialize)]
struct CallStart {
    name: String,
}

/// The data of a function call's end.
#[derive(Debug, Serialize, Deserialize)]
struct CallDoc {
    name: String,
    arguments: String,
}

/// An event's data in its stored form.
pub fn event_data(payload: &EventPayload) -> Result<Cow<'_, str>, DbError> {
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
        EventPayload::OutputTextDelta { delta, .. }
        | EventPayload::FunctionCallArgumentsDelta { delta, .. } => Cow::Borrowed(delta.as_str()),
        EventPayload::OutputTextLogprobs {
            delta, logprobs, ..
        } => Cow::Owned(serde_json::to_string(&LogprobsDelta {
            text: delta.clone(),
            logprobs: tokens_to_docs(logprobs),
        })?),
        EventPayload::FunctionCallAdded { name, .. } => {
            Cow::Owned(serde_json::to_string(&CallStart { name: name.clone() })?)
        }
        EventPayload::FunctionCallArgumentsDone(call) | EventPayload::FunctionCallDone(call) => {
            Cow::Owned(serde_json::to_string(&CallDoc {
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })?)
        }
        EventPayload::Queued { reason } => Cow::Owned(serde_json::to_string(reason.as_str())?),
        EventPayload::Resumed {
            from_sequence_number,
        } => Cow::Owned(from_sequence_number.to_string()),
        EventPayload::Failed { error } => Cow::Owned(error_to_text(error)?),
    })
}

/// The columns of one `task_events` row of a task, but for its key (each adapter stores keys in
/// its own way): what is written, and what is read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow<'a> {
    /// `sequence_number`.
    pub sequence_number: i64,
    /// `kind`: the [`EventCode`].
    pub code: i64,
    /// `created_at`, in milliseconds.
    pub created_at: i64,
    /// `data`: [`event_data`].
    pub data: Cow<'a, str>,
    /// `item`: the output index of the item the event is about.
    pub item: Option<i64>,
}

/// Which other rows a stored event is rebuilt from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs {
    /// The task (`response.created` carries it).
    pub task: bool,
    /// The task's stored response (`response.completed`, and a completed item's text).
    pub response: bool,
}

impl Needs {
    /// What either needs.
    pub fn or(self, other: Needs) -> Needs {
        Needs {
            task: self.task || other.task,
            response: self.response || other.response,
        }
    }
}

/// A page of task `task_id`'s events from the rows read for it, in order, one more than `limit`
/// (so that the page knows whether there are more): the first `limit`, rebuilt with the task and
/// its stored response where they need them ([`EventRow::needs_of`], [`decode_events`]).
pub fn events_page(
    mut rows: Vec<EventRow<'_>>,
    task_id: TaskId,
    limit: usize,
    task: Option<&Task>,
    response: Option<&Response>,
) -> Result<Page<Event>, DbError> {
    let has_more = rows.len() > limit;
    rows.truncate(limit);
    let items = decode_events(rows, task_id, task, response)?;
    Ok(Page { items, has_more })
}

/// Rows of task `task_id`'s events as the domain's events, rebuilt with the task and its stored
/// response (which hold what [`EventRow::needs_of`] the rows says).
pub fn decode_events(
    rows: Vec<EventRow<'_>>,
    task_id: TaskId,
    task: Option<&Task>,
    response: Option<&Response>,
) -> Result<Vec<Event>, DbError> {
    let sources = Sources { task, response };
    rows.into_iter()
        .map(|row| row.decode(task_id, sources))
        .collect()
}

/// The rows stored events are rebuilt from, as read by the adapter (`None`: not read, or there
/// is none).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sources<'s> {
    /// The task of the events.
    pub task: Option<&'s Task>,
    /// Its stored response.
    pub response: Option<&'s Response>,
}

impl<'a> EventRow<'a> {
    /// The row of an event.
    pub fn encode(event: &'a Event) -> Result<Self, DbError> {
        Ok(EventRow {
            sequence_number: to_i64(event.sequence_number)?,
            code: EventCode::of_payload(&event.payload),
            created_at: event.created_at.as_millis(),
            data: event_data(&event.payload)?,
            item: event
                .payload
                .item()
                .map(|item| i64::from(item.output_index())),
        })
    }

    /// Which other rows this one is rebuilt from.
    pub fn needs(&self) -> Needs {
        let closed = [
            EventCode::of(EventKind::OutputTextDone),
            EventCode::of(EventKind::ContentPartDone),
            EventCode::of(EventKind::OutputItemDone),
        ];
        Needs {
            task: self.code == EventCode::of(EventKind::Created),
            response: self.code == EventCode::of(EventKind::Completed)
                || (closed.contains(&self.code) && self.data.is_empty()),
        }
    }

    /// Which other rows any of `rows` is rebuilt from.
    pub fn needs_of(rows: &[EventRow<'_>]) -> Needs {
        rows.iter()
            .fold(Needs::default(), |needs, row| needs.or(row.needs()))
    }

    /// The domain's event of task `task_id`, rebuilt with `sources` (which hold what
    /// [`EventRow::needs`] says).
    pub fn decode(self, task_id: TaskId, sources: Sources<'_>) -> Result<Event, DbError> {
        let index = self
            .item
            .map(u32::try_from)
            .transpose()
            .map_err(corrupt)?
            .unwrap_or(0);
        let item = ItemId::of(task_id, index);
        let data = self.data.into_owned();
        let task = || {
            sources
                .task
                .ok_or_else(|| corrupt(format!("events of no task {task_id}")))
        };
        let response = || {
            sources
                .response
                .ok_or_else(|| corrupt(format!("task {task_id} completed without a response")))
        };
        let closed = |data: &str| -> Result<ClosedItem, DbError> {
            if data.is_empty() {
                Ok(ClosedItem {
                    item,
                    text: response()?.output_text.clone(),
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
        };
        let call = |data: &str| -> Result<CallItem, DbError> {
            let doc: CallDoc = serde_json::from_str(data)?;
            Ok(CallItem {
                item,
                name: doc.name,
                arguments: doc.arguments,
            })
        };
        if self.code == EventCode::DELTA_WITH_LOGPROBS {
            let doc: LogprobsDelta = serde_json::from_str(&data)?;
            return Ok(Event {
                task_id,
                sequence_number: from_i64(self.sequence_number)?,
                created_at: Timestamp::from_millis(self.created_at),
                payload: EventPayload::OutputTextLogprobs {
                    item,
                    delta: doc.text,
                    logprobs: tokens_from_docs(doc.logprobs)?,
                },
            });
        }
        let payload = match EventCode::kind(self.code)? {
            EventKind::Created => EventPayload::Created {
                task: Box::new(task()?.as_created()),
            },
            EventKind::Loading => EventPayload::Loading {
                model: ModelId::parse(&data).map_err(corrupt)?,
            },
            EventKind::InProgress => EventPayload::InProgress,
            EventKind::OutputItemAdded => EventPayload::OutputItemAdded { item },
            EventKind::ContentPartAdded => EventPayload::ContentPartAdded { item },
            EventKind::OutputTextDelta => EventPayload::OutputTextDelta { item, delta: data },
            EventKind::OutputTextDone => EventPayload::OutputTextDone(closed(&data)?),
            EventKind::ContentPartDone => EventPayload::ContentPartDone(closed(&data)?),
            EventKind::OutputItemDone => EventPayload::OutputItemDone(closed(&data)?),
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
                response: Box::new(response()?.clone()),
            },
            EventKind::Failed => EventPayload::Failed {
                error: error_from_text(&data)?,
            },
            EventKind::Cancelled => EventPayload::Cancelled,
            EventKind::FunctionCallAdded => {
                let start: CallStart = serde_json::from_str(&data)?;
                EventPayload::FunctionCallAdded {
                    item,
                    name: start.name,
                }
            }
            EventKind::FunctionCallArgumentsDelta => {
                EventPayload::FunctionCallArgumentsDelta { item, delta: data }
            }
            EventKind::FunctionCallArgumentsDone => {
                EventPayload::FunctionCallArgumentsDone(call(&data)?)
            }
            EventKind::FunctionCallDone => EventPayload::FunctionCallDone(call(&data)?),
        };
        Ok(Event {
            task_id,
            sequence_number: from_i64(self.sequence_number)?,
            created_at: Timestamp::from_millis(self.created_at),
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The codes are on disk: each kind keeps its number, and every number names one kind.
    #[test]
    fn every_kind_keeps_its_stored_code_and_no_code_is_shared() {
        for (kind, code) in EventCode::KINDS {
            if code != EventCode::DELTA_WITH_LOGPROBS {
                assert_eq!(EventCode::of(kind), code);
            }
            assert_eq!(EventCode::kind(code).unwrap(), kind);
        }
        assert_eq!(EventCode::of(EventKind::OutputItemDone), 15);
        assert_eq!(EventCode::of(EventKind::OutputTextDelta), 4);
        assert!(EventCode::kind(0).is_err());
        assert!(EventCode::kind(21).is_err());
    }

    /// The events of tools and log probabilities read back as written, without other rows.
    #[test]
    fn call_and_logprob_events_round_trip_through_their_rows() {
        let task = TaskId::from_ulid(ulid::Ulid::from_parts(1_700_000_000_000, 9));
        let item = ItemId::of(task, 1);
        let token = |text: &str, logprob: f64| TokenLogprob {
            token: text.into(),
            bytes: text.as_bytes().to_vec(),
            logprob: Logprob::new(logprob).unwrap(),
            top: vec![TopLogprob {
                token: "x".into(),
                bytes: b"x".to_vec(),
                logprob: Logprob::new(-3.5).unwrap(),
            }],
        };
        let call = CallItem {
            item,
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        };
        let payloads = [
            EventPayload::OutputTextLogprobs {
                item,
                delta: "Hi there".into(),
                logprobs: vec![token("Hi", -0.25), token(" there", 0.0)],
            },
            EventPayload::FunctionCallAdded {
                item,
                name: "get_weather".into(),
            },
            EventPayload::FunctionCallArgumentsDelta {
                item,
                delta: r#"{"ci"#.into(),
            },
            EventPayload::FunctionCallArgumentsDone(call.clone()),
            EventPayload::FunctionCallDone(call),
        ];
        for (index, payload) in payloads.into_iter().enumerate() {
            let event = Event {
                task_id: task,
                sequence_number: index as u64 + 5,
                created_at: Timestamp::from_millis(1_700_000_000_000),
                payload,
            };
            let row = EventRow::encode(&event).unwrap();
            assert_eq!(row.needs(), Needs::default(), "{:?}", event.kind());
            let back = row.decode(task, Sources::default()).unwrap();
            assert_eq!(back, event);
        }
    }
}
