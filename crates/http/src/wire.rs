//! The JSON shapes of API.md: domain types rendered for the wire, and only here.

use serde_json::{json, Value};

use lmsp_domain::auth::Client;
use lmsp_domain::{Event, EventPayload, ModelRecord, Response, Task, Timestamp};

fn time(at: Timestamp) -> Value {
    Value::String(at.to_rfc3339())
}

fn optional_time(at: Option<Timestamp>) -> Value {
    at.map_or(Value::Null, time)
}

/// A task object.
pub fn task(task: &Task) -> Value {
    json!({
        "object": "task",
        "id": task.id.to_string(),
        "status": task.status.as_str(),
        "model": task.model.as_str(),
        "on_restart": task.on_restart.as_str(),
        "created_at": time(task.created_at),
        "started_at": optional_time(task.started_at),
        "finished_at": optional_time(task.finished_at),
        "last_sequence_number": task.last_sequence_number,
        "restarts": task.restarts,
        "error": task.error.as_ref().map(|e| json!({"code": e.code.as_str(), "message": e.message})),
        "response_id": task.response_id.map(|id| id.to_string()),
        "metadata": task.metadata,
    })
}

/// A response object.
pub fn response(response: &Response) -> Value {
    json!({
        "object": "response",
        "id": response.id.to_string(),
        "task_id": response.task_id.to_string(),
        "model": response.model.as_str(),
        "status": "completed",
        "output_text": response.output_text,
        "usage": {"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens},
        "created_at": time(response.created_at),
        "completed_at": time(response.completed_at),
    })
}

/// An event's `data`.
pub fn event_data(payload: &EventPayload) -> Value {
    match payload {
        EventPayload::Created { task: created } => json!({"task": task(created)}),
        EventPayload::Loading { model } => json!({"model": model.as_str()}),
        EventPayload::OutputTextDelta { delta } => json!({"delta": delta}),
        EventPayload::Queued { reason } => json!({"reason": reason}),
        EventPayload::Resumed {
            from_sequence_number,
        } => {
            json!({"from_sequence_number": from_sequence_number})
        }
        EventPayload::Completed { response: done } => json!({"response": response(done)}),
        EventPayload::Failed { error } => {
            json!({"error": {"code": error.code.as_str(), "message": error.message}})
        }
        EventPayload::InProgress {} | EventPayload::Cancelling {} | EventPayload::Cancelled {} => {
            json!({})
        }
    }
}

/// An event object.
pub fn event(event: &Event) -> Value {
    json!({
        "object": "event",
        "task_id": event.task_id.to_string(),
        "sequence_number": event.sequence_number,
        "type": event.kind().wire_name(),
        "created_at": time(event.created_at),
        "data": event_data(&event.payload),
    })
}

/// A model object.
pub fn model(model: &ModelRecord) -> Value {
    json!({
        "object": "model",
        "id": model.id.as_str(),
        "path": model.file.path,
        "format": model.format,
        "size_bytes": model.file.size_bytes,
        "digest": model.file.digest.as_str(),
        "created_at": time(model.created_at),
    })
}

/// A client object (never its token or hash).
pub fn client(client: &Client) -> Value {
    json!({
        "object": "client",
        "id": client.id.to_string(),
        "name": client.name,
        "scopes": client.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "created_at": time(client.created_at),
        "revoked_at": optional_time(client.revoked_at),
    })
}

/// A list object.
pub fn list(data: Vec<Value>, has_more: bool) -> Value {
    json!({"object": "list", "data": data, "has_more": has_more})
}
