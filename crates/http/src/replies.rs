//! The replies idempotency keys keep: the HTTP edge's own encoding of a first reply, opaque to
//! the service. A reply is kept whole (status, body, `Location`, task), or as a pointer to the
//! task whose outcome or events a retry is given (a synchronous or streaming request, whose key
//! commits with its task before the reply is known; a synchronous request's pointer gives way to
//! its whole final reply once the task finished). The shape is the one the first release
//! stored, so its keys still replay.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use lmsp_domain::idempotency::StoredReply;
use lmsp_domain::TaskId;

use crate::error::{ApiError, ErrorCode};

/// The header that names a request's task.
pub const TASK_ID_HEADER: &str = "lmsp-task-id";

/// How a reply is given again from the task it created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FromTask {
    /// Wait for the task to end and answer with its outcome, as a synchronous request does.
    Outcome,
    /// Stream the task's events from the first, as a streaming request does.
    Events,
}

/// A first reply as kept under its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyDoc {
    /// Its HTTP status.
    pub status: u16,
    /// Its JSON body, exactly as sent.
    #[serde(default)]
    pub body: String,
    /// Its `Location` header.
    #[serde(default)]
    pub location: Option<String>,
    /// The task it names (`Lmsp-Task-Id`).
    #[serde(default)]
    pub task_id: Option<String>,
    /// Set when the reply is given again from its task; `status` and `body` are then unused.
    #[serde(default)]
    pub from_task: Option<FromTask>,
}

impl ReplyDoc {
    /// A whole reply.
    pub fn whole(
        status: StatusCode,
        body: &impl Serialize,
        location: Option<String>,
        task_id: Option<TaskId>,
    ) -> Result<Self, ApiError> {
        Ok(Self {
            status: status.as_u16(),
            body: serde_json::to_string(body).map_err(|_| unrenderable())?,
            location,
            task_id: task_id.map(|id| id.to_string()),
            from_task: None,
        })
    }

    /// A reply given again from `task_id`.
    pub fn from_task(task_id: TaskId, how: FromTask) -> Self {
        Self {
            status: StatusCode::OK.as_u16(),
            body: String::new(),
            location: None,
            task_id: Some(task_id.to_string()),
            from_task: Some(how),
        }
    }

    /// As the service keeps it.
    pub fn stored(&self) -> StoredReply {
        StoredReply {
            task_id: self.task().ok().flatten(),
            body: serde_json::to_vec(self).unwrap_or_default(),
        }
    }

    /// What the service kept.
    pub fn of_stored(reply: &StoredReply) -> Result<Self, ApiError> {
        serde_json::from_slice(&reply.body).map_err(|error| {
            tracing::error!(%error, "a stored idempotent reply cannot be read");
            unrenderable()
        })
    }

    /// The task it names.
    pub fn task(&self) -> Result<Option<TaskId>, ApiError> {
        self.task_id
            .as_deref()
            .map(|id| TaskId::parse(id).map_err(|_| unrenderable()))
            .transpose()
    }

    /// The reply as it was sent.
    pub fn to_response(&self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::OK);
        let mut response = (status, self.body.clone()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(location) = self
            .location
            .as_deref()
            .and_then(|l| HeaderValue::from_str(l).ok())
        {
            headers.insert(header::LOCATION, location);
        }
        if let Some(task) = self
            .task_id
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            headers.insert(TASK_ID_HEADER, task);
        }
        if status.is_client_error() || status.is_server_error() {
            headers.insert("x-should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}

fn unrenderable() -> ApiError {
    ApiError::new(
        ErrorCode::InternalError,
        "the service failed to answer; it has been logged",
    )
}

/// Marks a reply as given again.
pub fn replayed(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// Names a reply's task.
pub fn with_task_header(mut response: Response, task_id: TaskId) -> Response {
    if let Ok(value) = HeaderValue::from_str(&task_id.to_string()) {
        response.headers_mut().insert(TASK_ID_HEADER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A reply the first release stored replays with its status, body and headers.
    #[test]
    fn a_first_release_reply_replays() {
        let stored = StoredReply {
            task_id: None,
            body: br#"{"status":202,"body":"{\"object\":\"task\"}","location":"/v1/tasks/task_01M8XY93QCKCYBD48NBM4DP3RK","task_id":"task_01M8XY93QCKCYBD48NBM4DP3RK","from_task":null}"#.to_vec(),
        };
        let doc = ReplyDoc::of_stored(&stored).unwrap();
        assert_eq!(doc.status, 202);
        assert!(doc.task().unwrap().is_some());
        let response = doc.to_response();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert!(response.headers().get(header::LOCATION).is_some());
        assert!(response.headers().get(TASK_ID_HEADER).is_some());
    }

    #[test]
    fn a_reply_round_trips_through_its_stored_form() {
        let task = TaskId::parse("task_01M8XY93QCKCYBD48NBM4DP3RK").unwrap();
        let doc = ReplyDoc::from_task(task, FromTask::Events);
        let stored = doc.stored();
        assert_eq!(stored.task_id, Some(task));
        assert_eq!(ReplyDoc::of_stored(&stored).unwrap(), doc);
    }
}
