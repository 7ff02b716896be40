//! The JSON shapes of API.md: domain types rendered for the wire, and only here.
//!
//! Every reply body is one of these structs, so the OpenAPI document (`GET /v1/openapi.json`) is
//! derived from the very types the handlers serialise. Request bodies are validated from JSON by
//! the domain (unknown fields are 400 there); their structs here document those bodies and are
//! checked against the validator in the tests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use lmsp_domain::auth::{Client, Scopes};
use lmsp_domain::{Event, EventPayload, ModelRecord, Response, Task, TaskError, Timestamp};

use crate::openapi as schema;

/// A single-valued string, e.g. the `object` field of every API object; its schema is that one
/// value.
macro_rules! constant {
    ($(#[$meta:meta])* $name:ident = $value:tt) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
        pub enum $name {
            /// The one value.
            #[default]
            #[serde(rename = $value)]
            Value,
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                schema::constant($value).into()
            }
        }

        impl ToSchema for $name {}
    };
}

constant!(
    /// `"task"`.
    TaskTag = "task"
);
constant!(
    /// `"response"`.
    ResponseTag = "response"
);
constant!(
    /// `"event"`.
    EventTag = "event"
);
constant!(
    /// `"model"`.
    ModelTag = "model"
);
constant!(
    /// `"client"`.
    ClientTag = "client"
);
constant!(
    /// `"service"`.
    ServiceTag = "service"
);
constant!(
    /// `"list"`.
    ListTag = "list"
);
constant!(
    /// `"completed"`: a response exists only for a completed task.
    CompletedTag = "completed"
);
constant!(
    /// `"ok"`.
    OkTag = "ok"
);
constant!(
    /// `"LMSP 1.0"`.
    SpecTag = "LMSP 1.0"
);

fn time(at: Timestamp) -> String {
    at.to_rfc3339()
}

fn scope_names(scopes: &Scopes) -> Vec<&'static str> {
    scopes.iter().map(|s| s.as_str()).collect()
}

/// Why a task failed (`task.error`, `response.failed`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskErrorObject {
    /// The task error code of API.md §2.
    #[schema(schema_with = schema::task_error_code)]
    pub code: &'static str,
    /// Human text.
    pub message: String,
}

impl TaskErrorObject {
    fn of(error: &TaskError) -> Self {
        Self {
            code: error.code.as_str(),
            message: error.message.clone(),
        }
    }
}

/// A task: one unit of inference work (API.md §4).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskObject {
    // Always `task`.
    #[schema(inline)]
    pub object: TaskTag,
    /// Its id.
    #[schema(schema_with = schema::task_id)]
    pub id: String,
    /// Where it is; `completed`, `failed` and `cancelled` are finished and never left.
    #[schema(schema_with = schema::task_status)]
    pub status: &'static str,
    /// The model it runs on.
    pub model: String,
    /// What happens to it when the service restarts before it finishes.
    #[schema(schema_with = schema::restart_policy)]
    pub on_restart: &'static str,
    /// When it was accepted.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// When a worker first claimed it, or `null`.
    #[schema(schema_with = schema::nullable_timestamp, required = true)]
    pub started_at: Option<String>,
    /// When it finished, or `null`.
    #[schema(schema_with = schema::nullable_timestamp, required = true)]
    pub finished_at: Option<String>,
    /// The highest sequence number of its event log.
    pub last_sequence_number: u64,
    /// How many service restarts moved it.
    pub restarts: u32,
    /// Why it failed, or `null`.
    #[schema(required = true)]
    pub error: Option<TaskErrorObject>,
    /// Its response once completed, or `null`.
    #[schema(schema_with = schema::nullable_response_id, required = true)]
    pub response_id: Option<String>,
    /// The client's string pairs.
    pub metadata: BTreeMap<String, String>,
}

/// A task object.
pub fn task(task: &Task) -> TaskObject {
    TaskObject {
        object: TaskTag::Value,
        id: task.id.to_string(),
        status: task.status.as_str(),
        model: task.model.as_str().to_owned(),
        on_restart: task.on_restart.as_str(),
        created_at: time(task.created_at),
        started_at: task.started_at.map(time),
        finished_at: task.finished_at.map(time),
        last_sequence_number: task.last_sequence_number,
        restarts: task.restarts,
        error: task.error.as_ref().map(TaskErrorObject::of),
        response_id: task.response_id.map(|id| id.to_string()),
        metadata: task.metadata.clone(),
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct UsageObject {
    /// Tokens in the input.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
}

/// The result of a completed task (API.md §4).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseObject {
    // Always `response`.
    #[schema(inline)]
    pub object: ResponseTag,
    /// Its id.
    #[schema(schema_with = schema::response_id)]
    pub id: String,
    /// The task that produced it.
    #[schema(schema_with = schema::task_id)]
    pub task_id: String,
    /// The model that produced it.
    pub model: String,
    // Always `completed`.
    #[schema(inline)]
    pub status: CompletedTag,
    /// The generated text.
    pub output_text: String,
    /// Token counts.
    pub usage: UsageObject,
    /// When its task was created.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// When its task completed.
    #[schema(schema_with = schema::timestamp)]
    pub completed_at: String,
}

/// A response object.
pub fn response(response: &Response) -> ResponseObject {
    ResponseObject {
        object: ResponseTag::Value,
        id: response.id.to_string(),
        task_id: response.task_id.to_string(),
        model: response.model.as_str().to_owned(),
        status: CompletedTag::Value,
        output_text: response.output_text.clone(),
        usage: UsageObject {
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
        },
        created_at: time(response.created_at),
        completed_at: time(response.completed_at),
    }
}

/// `data` of `response.created`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedData {
    /// The task as it was created.
    pub task: TaskObject,
}

/// `data` of `response.loading`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LoadingData {
    /// The model being loaded.
    pub model: String,
}

/// `data` of `response.output_text.delta`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeltaData {
    /// A piece of output; the deltas after the last `response.queued` joined are `output_text`.
    pub delta: String,
}

/// `data` of `response.queued`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueuedData {
    /// Why the task went back to the queue.
    #[schema(schema_with = schema::queue_reason)]
    pub reason: lmsp_domain::QueueReason,
}

/// `data` of `response.resumed`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResumedData {
    /// The sequence number of the last event the snapshot covers.
    pub from_sequence_number: u64,
}

/// `data` of `response.completed`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletedData {
    /// The response.
    pub response: ResponseObject,
}

/// `data` of `response.failed`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FailedData {
    /// Why the task failed.
    pub error: TaskErrorObject,
}

/// `data` of `response.in_progress`, `response.cancelling` and `response.cancelled`: `{}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmptyData {}

/// An event's `type` with its `data` (API.md §5).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", content = "data")]
pub enum EventBody {
    /// Always sequence 1, with the task's insert.
    #[serde(rename = "response.created")]
    Created(CreatedData),
    /// The model is being loaded.
    #[serde(rename = "response.loading")]
    Loading(LoadingData),
    /// Generation starts.
    #[serde(rename = "response.in_progress")]
    InProgress(EmptyData),
    /// Output.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta(DeltaData),
    /// A cancel was accepted while work was under way.
    #[serde(rename = "response.cancelling")]
    Cancelling(EmptyData),
    /// Put back in the queue at startup.
    #[serde(rename = "response.queued")]
    Queued(QueuedData),
    /// Continued from its snapshot at startup.
    #[serde(rename = "response.resumed")]
    Resumed(ResumedData),
    /// Terminal: completed.
    #[serde(rename = "response.completed")]
    Completed(CompletedData),
    /// Terminal: failed.
    #[serde(rename = "response.failed")]
    Failed(FailedData),
    /// Terminal: cancelled.
    #[serde(rename = "response.cancelled")]
    Cancelled(EmptyData),
}

/// An event's `type` and `data`.
pub fn event_body(payload: &EventPayload) -> EventBody {
    match payload {
        EventPayload::Created { task: created } => EventBody::Created(CreatedData {
            task: task(created),
        }),
        EventPayload::Loading { model } => EventBody::Loading(LoadingData {
            model: model.as_str().to_owned(),
        }),
        EventPayload::InProgress {} => EventBody::InProgress(EmptyData {}),
        EventPayload::OutputTextDelta { delta } => EventBody::OutputTextDelta(DeltaData {
            delta: delta.clone(),
        }),
        EventPayload::Cancelling {} => EventBody::Cancelling(EmptyData {}),
        EventPayload::Queued { reason } => EventBody::Queued(QueuedData { reason: *reason }),
        EventPayload::Resumed {
            from_sequence_number,
        } => EventBody::Resumed(ResumedData {
            from_sequence_number: *from_sequence_number,
        }),
        EventPayload::Completed { response: done } => EventBody::Completed(CompletedData {
            response: response(done),
        }),
        EventPayload::Failed { error } => EventBody::Failed(FailedData {
            error: TaskErrorObject::of(error),
        }),
        EventPayload::Cancelled {} => EventBody::Cancelled(EmptyData {}),
    }
}

/// One event of a task's log (API.md §5); `type` decides the shape of `data`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventObject {
    // Always `event`.
    #[schema(inline)]
    pub object: EventTag,
    /// The task whose log holds it.
    #[schema(schema_with = schema::task_id)]
    pub task_id: String,
    /// 1, 2, 3, … without gap or repeat within the task.
    pub sequence_number: u64,
    /// When it was written.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// `type` and `data`.
    #[serde(flatten)]
    pub body: EventBody,
}

/// An event object.
pub fn event(event: &Event) -> EventObject {
    EventObject {
        object: EventTag::Value,
        task_id: event.task_id.to_string(),
        sequence_number: event.sequence_number,
        created_at: time(event.created_at),
        body: event_body(&event.payload),
    }
}

/// A registered model (API.md §8).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelObject {
    // Always `model`.
    #[schema(inline)]
    pub object: ModelTag,
    /// Its id.
    pub id: String,
    /// The file's canonical absolute path.
    pub path: String,
    /// The file's format, e.g. `text` or `gguf`.
    pub format: String,
    /// The file's size.
    pub size_bytes: u64,
    /// `sha256:` and the file's SHA-256 in hex.
    #[schema(pattern = "^sha256:[0-9a-f]{64}$")]
    pub digest: String,
    /// When it was registered.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
}

/// A model object.
pub fn model(model: &ModelRecord) -> ModelObject {
    ModelObject {
        object: ModelTag::Value,
        id: model.id.as_str().to_owned(),
        path: model.file.path.clone(),
        format: model.format.clone(),
        size_bytes: model.file.size_bytes,
        digest: model.file.digest.as_str().to_owned(),
        created_at: time(model.created_at),
    }
}

/// A paired client: never its token or the token's hash.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClientObject {
    // Always `client`.
    #[schema(inline)]
    pub object: ClientTag,
    /// Its id.
    #[schema(schema_with = schema::client_id)]
    pub id: String,
    /// A human name.
    pub name: String,
    /// What it may do.
    #[schema(schema_with = schema::scopes)]
    pub scopes: Vec<&'static str>,
    /// When it was created.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// When it was revoked, or `null`.
    #[schema(schema_with = schema::nullable_timestamp, required = true)]
    pub revoked_at: Option<String>,
}

/// A client object (never its token or hash).
pub fn client(client: &Client) -> ClientObject {
    ClientObject {
        object: ClientTag::Value,
        id: client.id.to_string(),
        name: client.name.clone(),
        scopes: scope_names(&client.scopes),
        created_at: time(client.created_at),
        revoked_at: client.revoked_at.map(time),
    }
}

/// A page of a list: `{"object": "list", "data": [...], "has_more": bool}`, one type per item.
macro_rules! list_of {
    ($(#[$meta:meta])* $name:ident of $item:ty) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Serialize, ToSchema)]
        pub struct $name {
            // Always `list`.
            #[schema(inline)]
            pub object: ListTag,
            /// The items.
            pub data: Vec<$item>,
            /// Whether more items follow this page.
            pub has_more: bool,
        }

        impl $name {
            /// A page of these items.
            pub fn new(data: Vec<$item>, has_more: bool) -> Self {
                Self {
                    object: ListTag::Value,
                    data,
                    has_more,
                }
            }
        }
    };
}

list_of!(
    /// A page of tasks, newest first.
    TaskList of TaskObject
);
list_of!(
    /// A page of a task's events, ascending.
    EventList of EventObject
);
list_of!(
    /// Every registered model.
    ModelList of ModelObject
);
list_of!(
    /// Every client.
    ClientList of ClientObject
);

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HealthObject {
    // Always `ok`.
    #[schema(inline)]
    pub status: OkTag,
}

/// The health reply.
pub fn health() -> HealthObject {
    HealthObject {
        status: OkTag::Value,
    }
}

/// The service and its settings (API.md §9).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ServiceObject {
    // Always `service`.
    #[schema(inline)]
    pub object: ServiceTag,
    /// The service's id; it never changes for a data directory.
    #[schema(schema_with = schema::service_id)]
    pub id: String,
    // Always `LMSP 1.0`.
    #[schema(inline)]
    pub spec: SpecTag,
    /// The implementation's version.
    pub version: String,
    /// When this process started.
    #[schema(schema_with = schema::timestamp)]
    pub started_at: String,
    /// How long finished tasks are kept (`--retention`).
    pub retention_seconds: u64,
    /// The policy of tasks whose request names none (`--default-on-restart`).
    #[schema(schema_with = schema::restart_policy)]
    pub default_on_restart: &'static str,
}

/// The service object.
pub fn service(service: &lmsp_app::Service) -> ServiceObject {
    let settings = service.settings();
    ServiceObject {
        object: ServiceTag::Value,
        id: service.identity().id.to_string(),
        spec: SpecTag::Value,
        version: settings.version.clone(),
        started_at: time(service.started_at()),
        retention_seconds: settings.retention.as_secs(),
        default_on_restart: settings.default_on_restart.as_str(),
    }
}

/// A one-time pairing code (`POST /v1/pairings`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PairingObject {
    /// The code, shown once.
    #[schema(pattern = "^[0-9]{3}-[0-9]{3}$", examples("483-921"))]
    pub code: String,
    /// When it stops working (10 minutes after creation).
    #[schema(schema_with = schema::timestamp)]
    pub expires_at: String,
    /// The scopes a client paired with it may receive.
    #[schema(schema_with = schema::scopes)]
    pub scopes: Vec<&'static str>,
}

/// The reply to `POST /v1/pairings`.
pub fn pairing(pairing: &lmsp_app::NewPairing) -> PairingObject {
    PairingObject {
        code: pairing.code.expose().to_owned(),
        expires_at: time(pairing.expires_at),
        scopes: scope_names(&pairing.scopes),
    }
}

/// A new client and its token (`POST /v1/pair`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PairedObject {
    /// The new client's id.
    #[schema(schema_with = schema::client_id)]
    pub client_id: String,
    /// Its bearer token, shown once: `lmsp_` and 43 base64url characters.
    #[schema(pattern = "^lmsp_[A-Za-z0-9_-]{43}$")]
    pub token: String,
    /// What it may do.
    #[schema(schema_with = schema::scopes)]
    pub scopes: Vec<&'static str>,
}

/// The reply to `POST /v1/pair`.
pub fn paired(paired: &lmsp_app::Paired) -> PairedObject {
    PairedObject {
        client_id: paired.client.id.to_string(),
        token: paired.token.expose().to_owned(),
        scopes: scope_names(&paired.client.scopes),
    }
}

// ---- request bodies (documentation; the handlers validate the JSON itself) ----

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputRole {
    /// Instructions for the model.
    System,
    /// The user's turn.
    User,
    /// The model's earlier turn.
    Assistant,
}

/// One message of a conversation input.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// Who speaks.
    #[schema(inline)]
    pub role: InputRole,
    /// What is said.
    pub content: String,
}

/// A non-empty prompt, or a non-empty conversation (schema: [`schema::response_input`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    /// A prompt.
    Text(String),
    /// A conversation.
    Messages(Vec<InputMessage>),
}

/// The body of `POST /v1/responses`. Unknown fields are rejected (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"model": "reference", "input": "Once upon a time", "background": true,
    "stream": false, "on_restart": "resume", "max_output_tokens": 256, "seed": 42,
    "metadata": {"k": "v"}})))]
pub struct CreateResponseRequest {
    /// The model to run (a registered model id).
    #[schema(min_length = 1, max_length = 128)]
    pub model: String,
    /// A non-empty prompt, or a non-empty list of messages.
    #[schema(schema_with = schema::response_input)]
    pub input: ResponseInput,
    /// `true`: answer 202 with the task at once; `false` (default): wait for the response.
    #[schema(default = false)]
    pub background: Option<bool>,
    /// `true`: answer 200 `text/event-stream` of the task's events from sequence 1.
    #[schema(default = false)]
    pub stream: Option<bool>,
    /// What happens to the task when the service restarts before it finishes; defaults to the
    /// service's `--default-on-restart`.
    #[schema(schema_with = schema::nullable_restart_policy)]
    pub on_restart: Option<String>,
    /// The most tokens to generate, 1…100000.
    #[schema(minimum = 1, maximum = 100_000, default = 256)]
    pub max_output_tokens: Option<u32>,
    /// The sampler's seed; without one the service picks one and stores it with the task.
    pub seed: Option<u64>,
    /// At most 16 string pairs (keys 1–64 characters, values at most 512).
    #[schema(schema_with = schema::metadata_request)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The body of `POST /v1/models`. Unknown fields are rejected (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"id": "my-model", "path": "/srv/models/my-model.gguf"})))]
pub struct CreateModelRequest {
    /// The new model's id: 1–128 letters, digits, `.`, `_`, `-`, `:`, `/`, not starting with `.`
    /// or `/`.
    #[schema(min_length = 1, max_length = 128)]
    pub id: String,
    /// The file; after following links it must be a regular file inside `--models-dir`.
    #[schema(min_length = 1)]
    pub path: String,
}

/// The body of `POST /v1/pairings`. Unknown fields are rejected (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"scopes": ["responses:write", "responses:read"]})))]
pub struct CreatePairingRequest {
    /// The scopes a client paired with the code may receive.
    #[schema(schema_with = schema::scopes_request)]
    pub scopes: Vec<String>,
}

/// The body of `POST /v1/pair`. Unknown fields are rejected (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"code": "483-921", "name": "laptop", "scopes": ["responses:read"]})))]
pub struct PairRequest {
    /// The one-time code.
    #[schema(pattern = "^[0-9]{3}-[0-9]{3}$", examples("483-921"))]
    pub code: String,
    /// A human name for the new client, 1–128 characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    /// The scopes asked for: a subset of the code's (else 403).
    #[schema(schema_with = schema::scopes_request)]
    pub scopes: Vec<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use lmsp_domain::task::{Input, TaskSpec, Usage};
    use lmsp_domain::{
        ClientId, EventKind, ModelId, QueueReason, ResponseId, RestartPolicy, TaskErrorCode, TaskId,
    };
    use serde_json::{json, Value};
    use utoipa::PartialSchema;

    fn sample_task() -> Task {
        Task::new_queued(
            TaskId::parse("task_01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap(),
            ClientId::parse("cli_01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap(),
            ModelId::parse("reference").unwrap(),
            RestartPolicy::Resume,
            TaskSpec {
                input: Input::Text(String::from("hi")),
                max_output_tokens: 4,
                seed: 1,
            },
            Default::default(),
            Timestamp::from_millis(0),
        )
    }

    fn every_payload() -> Vec<EventPayload> {
        let task = sample_task();
        let response = Response {
            id: ResponseId::parse("resp_01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap(),
            task_id: task.id,
            model: task.model.clone(),
            output_text: String::from("forest"),
            usage: Usage::default(),
            created_at: Timestamp::from_millis(0),
            completed_at: Timestamp::from_millis(1),
        };
        vec![
            EventPayload::Created {
                task: Box::new(task.clone()),
            },
            EventPayload::Loading {
                model: task.model.clone(),
            },
            EventPayload::InProgress {},
            EventPayload::OutputTextDelta {
                delta: String::from("forest "),
            },
            EventPayload::Cancelling {},
            EventPayload::Queued {
                reason: QueueReason::ServerRestarted,
            },
            EventPayload::Resumed {
                from_sequence_number: 7,
            },
            EventPayload::Completed {
                response: Box::new(response),
            },
            EventPayload::Failed {
                error: TaskError {
                    code: TaskErrorCode::EngineError,
                    message: String::from("boom"),
                },
            },
            EventPayload::Cancelled {},
        ]
    }

    #[test]
    fn every_event_kind_is_sent_with_its_wire_name_and_data() {
        let payloads = every_payload();
        for kind in EventKind::ALL {
            assert!(payloads.iter().any(|p| p.kind() == kind), "{kind:?}");
        }
        for payload in payloads {
            let event = Event {
                task_id: sample_task().id,
                sequence_number: 3,
                created_at: Timestamp::from_millis(5),
                payload,
            };
            let sent = serde_json::to_value(super::event(&event)).unwrap();
            assert_eq!(sent["type"], event.kind().wire_name());
            assert_eq!(sent["object"], "event");
            assert_eq!(sent["sequence_number"], 3);
            assert_eq!(sent["created_at"], "1970-01-01T00:00:00.005Z");
            assert!(sent["data"].is_object());
            assert_eq!(sent.as_object().unwrap().len(), 6);
        }
    }

    #[test]
    fn a_task_is_sent_with_every_field_and_explicit_nulls() {
        let sent = serde_json::to_value(task(&sample_task())).unwrap();
        assert_eq!(
            sent,
            json!({"object": "task", "id": "task_01ARZ3NDEKTSV4RRFFQ69G5FAV", "status": "queued",
                "model": "reference", "on_restart": "resume",
                "created_at": "1970-01-01T00:00:00.000Z", "started_at": null, "finished_at": null,
                "last_sequence_number": 1, "restarts": 0, "error": null, "response_id": null,
                "metadata": {}})
        );
    }

    #[test]
    fn the_documented_submit_body_is_the_one_the_validator_takes() {
        let schema = serde_json::to_value(CreateResponseRequest::schema()).unwrap();
        let example = schema["examples"][0].clone();
        assert!(example.is_object(), "{schema}");
        assert!(lmsp_domain::validation::validate_submit(&example).is_ok());
        assert!(serde_json::from_value::<CreateResponseRequest>(example.clone()).is_ok());
        let documented: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        for field in &documented {
            // Every documented field is one the validator knows (a null is "absent").
            let mut body = json!({"model": "reference", "input": "x"});
            body[field.as_str()] = example[field.as_str()].clone();
            assert!(
                lmsp_domain::validation::validate_submit(&body).is_ok(),
                "{field}"
            );
        }
        let mut unknown = example.clone();
        unknown["colour"] = Value::from("blue");
        assert!(lmsp_domain::validation::validate_submit(&unknown).is_err());
        assert!(serde_json::from_value::<CreateResponseRequest>(unknown).is_err());
        assert_eq!(schema["additionalProperties"], false);
    }
}
