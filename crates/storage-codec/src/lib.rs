//! The storage adapters' encodings of the values they keep as text: the row codecs both the
//! SQLite and the PostgreSQL adapter use, so the two store the same documents.
//!
//! Domain types carry no serialization; what is stored, and how, is decided here, so renaming a
//! domain field can never silently change what is on disk. Each stored document has a serde
//! struct of its own whose field names are the stored names. The shapes are those the first
//! release wrote (a test opens a database file it wrote), extended only with optional fields.
//!
//! Beside the documents: the event rows ([`events`]: the on-disk event codes and each event's
//! stored data), the task row ([`rows`]) and the rows of clients, models and idempotency records
//! ([`records`]), which both adapters read and write column for column; only binding the values
//! is theirs.

pub mod batches;
pub mod columns;
pub mod events;
pub mod flows;
pub mod ops;
pub mod pairing;
pub mod query;
pub mod records;
pub mod recovery;
pub mod rows;
pub mod schema;
pub mod sql;
pub mod webhooks;

pub use batches::{
    batch_key, file_key, BatchRow, FileRow, StagedRow, BATCH_COLUMNS, FILE_COLUMNS, STAGING_COLUMNS,
};
pub use events::{decode_events, event_data, events_page, EventCode, EventRow, Needs, Sources};
pub use records::{
    hash_from_text, ClientRow, IdempotencyRow, ModelRow, CLIENT_COLUMNS, IDEMPOTENCY_COLUMNS,
    MODEL_COLUMNS,
};
pub use recovery::{Recovered, RecoveryBatch, RecoveryCursor, RecoveryStep};
pub use rows::{
    derived_response_id, error_text, from_i64, key_of, stored_response_id, tier_of, tier_rank,
    to_i64, u32_of, ulid_of, TaskRow, TASK_COLUMNS, TASK_COLUMN_COUNT, TASK_FROM,
};
pub use webhooks::{endpoint_key, DeliveryRow, EndpointRow, DELIVERY_COLUMNS, ENDPOINT_COLUMNS};

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use lmsp_domain::auth::{Scope, Scopes};
use lmsp_domain::event::{CallItem, Event};
use lmsp_domain::ids::{ItemId, ResponseId, ServiceId, TaskId};
use lmsp_domain::model::ModelId;
use lmsp_domain::ports::{Initialized, ServiceIdentity, StoreError};
use lmsp_domain::task::{
    Fraction, Input, Message, Metadata, Response, Role, TaskError, TaskSpec, Usage,
};
use lmsp_domain::tools::{
    Controls, FunctionTool, JsonText, OutputFormat, Penalty, ToolCall, ToolChoice,
};
use lmsp_domain::{TaskErrorCode, Timestamp};

/// A stored document that does not read, or a value that does not write.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The document is not the JSON it must be.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The document reads but makes no sense.
    #[error("{0}")]
    Corrupt(String),
}

/// A stored row or document that makes no sense.
pub fn corrupt(what: impl std::fmt::Display) -> DbError {
    DbError::Corrupt(what.to_string())
}

/// A database whose schema version (`found`) is newer than the one this build writes (`build`):
/// a newer build migrated it, and this one must not touch it.
pub fn newer_schema(found: i64, build: impl std::fmt::Display) -> DbError {
    corrupt(format!(
        "this database has schema version {found}, newer than this build's \
         {build}: run a newer lmsp"
    ))
}

/// The reply of a write that wrote no event (most writes but the task's own), as the adapters'
/// port methods answer it to their write paths.
pub fn no_events<T>(value: T) -> (T, Vec<Event>) {
    (value, Vec::new())
}

/// The defaults of the tuning both adapters have (their `Options`): how many tasks one recovery
/// transaction moves, and how many events one purge transaction removes at most past its first
/// task (I-4: short enough that writers never wait long behind a purge; 300 keeps one
/// transaction near a millisecond on SQLite).
pub mod tuning {
    /// Tasks per recovery transaction.
    pub const RECOVERY_BATCH: usize = 1000;
    /// Events one purge transaction removes at most (past its first task).
    pub const PURGE_MAX_EVENTS: u64 = 300;
}

/// To the port, a row or document that does not read is a corrupt store.
impl From<DbError> for StoreError {
    fn from(error: DbError) -> Self {
        match error {
            DbError::Json(other) => StoreError::Corrupt(other.to_string()),
            DbError::Corrupt(text) => StoreError::Corrupt(text),
        }
    }
}

/// `task_specs.spec`.
#[derive(Debug, Serialize, Deserialize)]
struct SpecDoc {
    input: InputDoc,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    instructions: Option<String>,
    max_output_tokens: u32,
    seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_response_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    controls: Option<ControlsDoc>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum InputDoc {
    Text(String),
    Messages(Vec<MessageDoc>),
}

#[derive(Debug, Serialize, Deserialize)]
struct MessageDoc {
    role: String,
    content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCallDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ToolCallDoc {
    call_id: String,
    name: String,
    arguments: String,
}

/// `task_specs.spec.controls`: absent in specs stored before tools existed, and when a task
/// asks for none of them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ControlsDoc {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ToolDoc>,
    /// `auto`, `none`, `required`, or `function:<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_choice: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format: Option<FormatDoc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    stop: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ToolDoc {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parameters: Option<String>,
    #[serde(default)]
    strict: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum FormatDoc {
    JsonObject,
    JsonSchema {
        name: String,
        schema: String,
        #[serde(default)]
        strict: bool,
    },
}

fn controls_to_doc(controls: &Controls) -> Option<ControlsDoc> {
    if *controls == Controls::default() {
        return None;
    }
    Some(ControlsDoc {
        tools: controls
            .tools
            .iter()
            .map(|tool| ToolDoc {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.parameters.as_ref().map(|p| p.as_str().to_owned()),
                strict: tool.strict,
            })
            .collect(),
        tool_choice: match &controls.tool_choice {
            ToolChoice::Auto => None,
            ToolChoice::None => Some("none".into()),
            ToolChoice::Required => Some("required".into()),
            ToolChoice::Function(name) => Some(format!("function:{name}")),
        },
        parallel_tool_calls: (!controls.parallel_tool_calls).then_some(false),
        format: match &controls.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(FormatDoc::JsonObject),
            OutputFormat::JsonSchema {
                name,
                schema,
                strict,
            } => Some(FormatDoc::JsonSchema {
                name: name.clone(),
                schema: schema.as_str().to_owned(),
                strict: *strict,
            }),
        },
        stop: controls.stop.clone(),
        presence_penalty: controls.presence_penalty.map(Penalty::get),
        frequency_penalty: controls.frequency_penalty.map(Penalty::get),
        top_logprobs: controls.top_logprobs,
    })
}

fn penalty(value: Option<f64>) -> Result<Option<Penalty>, DbError> {
    value
        .map(|v| Penalty::new(v).ok_or_else(|| corrupt(format!("a penalty of {v}"))))
        .transpose()
}

fn controls_from_doc(doc: Option<ControlsDoc>) -> Result<Controls, DbError> {
    let Some(doc) = doc else {
        return Ok(Controls::default());
    };
    let tool_choice = match doc.tool_choice.as_deref() {
        None | Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("required") => ToolChoice::Required,
        Some(other) => match other.strip_prefix("function:") {
            Some(name) => ToolChoice::Function(name.to_owned()),
            None => return Err(corrupt(format!("a tool choice `{other}`"))),
        },
    };
    Ok(Controls {
        tools: doc
            .tools
            .into_iter()
            .map(|tool| FunctionTool {
                name: tool.name,
                description: tool.description,
                parameters: tool.parameters.map(JsonText::parsed),
                strict: tool.strict,
            })
            .collect(),
        tool_choice,
        parallel_tool_calls: doc.parallel_tool_calls.unwrap_or(true),
        format: match doc.format {
            None => OutputFormat::Text,
            Some(FormatDoc::JsonObject) => OutputFormat::JsonObject,
            Some(FormatDoc::JsonSchema {
                name,
                schema,
                strict,
            }) => OutputFormat::JsonSchema {
                name,
                schema: JsonText::parsed(schema),
                strict,
            },
        },
        stop: doc.stop,
        presence_penalty: penalty(doc.presence_penalty)?,
        frequency_penalty: penalty(doc.frequency_penalty)?,
        top_logprobs: doc.top_logprobs,
    })
}

/// Encodes a task's spec.
pub fn spec_to_text(spec: &TaskSpec) -> Result<String, DbError> {
    let input = match &spec.input {
        Input::Text(text) => InputDoc::Text(text.clone()),
        Input::Messages(messages) => InputDoc::Messages(
            messages
                .iter()
                .map(|m| MessageDoc {
                    role: m.role.as_str().to_owned(),
                    content: m.content.clone(),
                    tool_calls: m
                        .tool_calls
                        .iter()
                        .map(|call| ToolCallDoc {
                            call_id: call.call_id.clone(),
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        })
                        .collect(),
                    tool_call_id: m.tool_call_id.clone(),
                })
                .collect(),
        ),
    };
    Ok(serde_json::to_string(&SpecDoc {
        input,
        instructions: spec.instructions.clone(),
        max_output_tokens: spec.max_output_tokens,
        seed: spec.seed,
        temperature: spec.temperature.map(Fraction::get),
        top_p: spec.top_p.map(Fraction::get),
        previous_response_id: spec.previous_response_id.map(|id| id.to_string()),
        controls: controls_to_doc(&spec.controls),
    })?)
}

fn fraction(value: Option<f64>) -> Result<Option<Fraction>, DbError> {
    value
        .map(|v| Fraction::new(v).ok_or_else(|| corrupt(format!("a sampling value of {v}"))))
        .transpose()
}

/// Decodes a task's spec.
pub fn spec_from_text(text: &str) -> Result<Arc<TaskSpec>, DbError> {
    let doc: SpecDoc = serde_json::from_str(text)?;
    let input = match doc.input {
        InputDoc::Text(text) => Input::Text(text),
        InputDoc::Messages(messages) => Input::Messages(
            messages
                .into_iter()
                .map(|m| {
                    Ok(Message {
                        role: Role::parse(&m.role)
                            .ok_or_else(|| corrupt(format!("a message role `{}`", m.role)))?,
                        content: m.content,
                        tool_calls: m
                            .tool_calls
                            .into_iter()
                            .map(|call| ToolCall {
                                call_id: call.call_id,
                                name: call.name,
                                arguments: call.arguments,
                            })
                            .collect(),
                        tool_call_id: m.tool_call_id,
                    })
                })
                .collect::<Result<_, DbError>>()?,
        ),
    };
    Ok(Arc::new(TaskSpec {
        input,
        instructions: doc.instructions,
        max_output_tokens: doc.max_output_tokens,
        seed: doc.seed,
        temperature: fraction(doc.temperature)?,
        top_p: fraction(doc.top_p)?,
        previous_response_id: doc
            .previous_response_id
            .map(|id| ResponseId::parse(&id).map_err(corrupt))
            .transpose()?,
        controls: controls_from_doc(doc.controls)?,
    }))
}

/// Encodes metadata (`task_specs.metadata`).
pub fn metadata_to_text(metadata: &Metadata) -> Result<String, DbError> {
    Ok(serde_json::to_string(metadata)?)
}

/// Decodes metadata.
pub fn metadata_from_text(text: &str) -> Result<Metadata, DbError> {
    Ok(serde_json::from_str::<BTreeMap<String, String>>(text)?)
}

#[derive(Debug, Serialize, Deserialize)]
struct ErrorDoc {
    code: String,
    message: String,
}

/// Encodes a task error (`tasks.error`, the data of `response.failed`).
pub fn error_to_text(error: &TaskError) -> Result<String, DbError> {
    Ok(serde_json::to_string(&ErrorDoc {
        code: error.code.as_str().to_owned(),
        message: error.message.clone(),
    })?)
}

/// Decodes a task error.
pub fn error_from_text(text: &str) -> Result<TaskError, DbError> {
    let doc: ErrorDoc = serde_json::from_str(text)?;
    let code = TaskErrorCode::parse(&doc.code)
        .ok_or_else(|| corrupt(format!("a task error code `{}`", doc.code)))?;
    Ok(TaskError::new(code, doc.message))
}

#[derive(Debug, Serialize, Deserialize)]
struct UsageDoc {
    input_tokens: u64,
    output_tokens: u64,
    /// Absent in responses stored before it existed.
    #[serde(default)]
    cached_tokens: u64,
}

/// `responses.doc`.
#[derive(Debug, Serialize, Deserialize)]
struct ResponseDoc {
    id: String,
    task_id: String,
    model: String,
    output_text: String,
    /// The run's function calls; absent when it made none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    calls: Vec<CallRowDoc>,
    /// The output's token log probabilities; absent when the task asked for none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    logprobs: Vec<events::TokenDoc>,
    usage: UsageDoc,
    created_at: i64,
    completed_at: i64,
}

/// A function call of a stored response: its output index, function and arguments.
#[derive(Debug, Serialize, Deserialize)]
struct CallRowDoc {
    index: u32,
    name: String,
    arguments: String,
}

/// Encodes a stored response.
pub fn response_to_text(response: &Response) -> Result<String, DbError> {
    Ok(serde_json::to_string(&ResponseDoc {
        id: response.id.to_string(),
        task_id: response.task_id.to_string(),
        model: response.model.as_str().to_owned(),
        output_text: response.output_text.clone(),
        calls: response
            .calls
            .iter()
            .map(|call| CallRowDoc {
                index: call.item.output_index(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })
            .collect(),
        logprobs: events::tokens_to_docs(&response.logprobs),
        usage: UsageDoc {
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
            cached_tokens: response.usage.cached_tokens,
        },
        created_at: response.created_at.as_millis(),
        completed_at: response.completed_at.as_millis(),
    })?)
}

/// Decodes a stored response.
/// The stored response document of task `task_id`, if it has one, checked to be that task's.
pub fn response_of_task(task_id: TaskId, doc: Option<&str>) -> Result<Option<Response>, DbError> {
    let Some(doc) = doc else {
        return Ok(None);
    };
    let response = response_from_text(doc)?;
    if response.task_id != task_id {
        return Err(corrupt(format!(
            "the response of {task_id} names another task"
        )));
    }
    Ok(Some(response))
}

pub fn response_from_text(text: &str) -> Result<Response, DbError> {
    let doc: ResponseDoc = serde_json::from_str(text)?;
    let task_id = TaskId::parse(&doc.task_id).map_err(corrupt)?;
    Ok(Response {
        id: ResponseId::parse(&doc.id).map_err(corrupt)?,
        task_id,
        model: ModelId::parse(&doc.model).map_err(corrupt)?,
        output_text: doc.output_text,
        calls: doc
            .calls
            .into_iter()
            .map(|call| CallItem {
                item: ItemId::of(task_id, call.index),
                name: call.name,
                arguments: call.arguments,
            })
            .collect(),
        logprobs: events::tokens_from_docs(doc.logprobs)?,
        usage: Usage {
            input_tokens: doc.usage.input_tokens,
            output_tokens: doc.usage.output_tokens,
            cached_tokens: doc.usage.cached_tokens,
        },
        created_at: Timestamp::from_millis(doc.created_at),
        completed_at: Timestamp::from_millis(doc.completed_at),
    })
}

/// Encodes scopes (`clients.scopes`, `pairings.scopes`): a list of names.
pub fn scopes_to_text(scopes: &Scopes) -> Result<String, DbError> {
    let names: Vec<&str> = scopes.iter().map(Scope::as_str).collect();
    Ok(serde_json::to_string(&names)?)
}

/// Decodes scopes.
pub fn scopes_from_text(text: &str) -> Result<Scopes, DbError> {
    let names: Vec<String> = serde_json::from_str(text)?;
    let scopes = names
        .iter()
        .map(|name| Scope::parse(name).map_err(corrupt))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Scopes::new(scopes))
}

#[derive(Debug, Serialize, Deserialize)]
struct IdentityDoc {
    id: String,
    created_at: i64,
}

/// Encodes the service identity (`service_config` key `identity`).
pub fn identity_to_text(identity: &ServiceIdentity) -> Result<String, DbError> {
    Ok(serde_json::to_string(&IdentityDoc {
        id: identity.id.to_string(),
        created_at: identity.created_at.as_millis(),
    })?)
}

/// Decodes the service identity.
pub fn identity_from_text(text: &str) -> Result<ServiceIdentity, DbError> {
    let doc: IdentityDoc = serde_json::from_str(text)?;
    Ok(ServiceIdentity {
        id: ServiceId::parse(&doc.id).map_err(corrupt)?,
        created_at: Timestamp::from_millis(doc.created_at),
    })
}

/// The `service_config` key of the service identity's document.
pub const IDENTITY_KEY: &str = "identity";

/// What initializing a store answers: `stored` is the identity document the store held already
/// (`None`: it was empty, so `candidate` was stored, with the admin client, and this is the first
/// start).
pub fn initialized(
    stored: Option<&str>,
    candidate: &ServiceIdentity,
) -> Result<Initialized, DbError> {
    Ok(match stored {
        Some(doc) => Initialized {
            identity: identity_from_text(doc)?,
            first_start: false,
        },
        None => Initialized {
            identity: candidate.clone(),
            first_start: true,
        },
    })
}

/// The pairing limit (`service_config` key `pairing_limit`).
#[derive(Debug, Default, Serialize, Deserialize)]
struct PairingLimitDoc {
    failures: Vec<i64>,
    locked_until: Option<i64>,
}

/// Encodes the pairing limit.
pub fn pairing_limit_to_text(limit: &lmsp_domain::auth::PairingLimit) -> Result<String, DbError> {
    Ok(serde_json::to_string(&PairingLimitDoc {
        failures: limit.failures.iter().map(|at| at.as_millis()).collect(),
        locked_until: limit.locked_until.map(Timestamp::as_millis),
    })?)
}

/// Decodes the pairing limit.
pub fn pairing_limit_from_text(text: &str) -> Result<lmsp_domain::auth::PairingLimit, DbError> {
    let doc: PairingLimitDoc = serde_json::from_str(text)?;
    Ok(lmsp_domain::auth::PairingLimit {
        failures: doc
            .failures
            .into_iter()
            .map(Timestamp::from_millis)
            .collect(),
        locked_until: doc.locked_until.map(Timestamp::from_millis),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_store_that_held_an_identity_keeps_it_and_an_empty_one_takes_the_candidate() {
        let stored = ServiceIdentity {
            id: ServiceId::from_ulid(ulid::Ulid::from_parts(1, 1)),
            created_at: Timestamp::from_millis(5),
        };
        let candidate = ServiceIdentity {
            id: ServiceId::from_ulid(ulid::Ulid::from_parts(2, 2)),
            created_at: Timestamp::from_millis(9),
        };
        let doc = identity_to_text(&stored).unwrap();
        let again = initialized(Some(&doc), &candidate).unwrap();
        assert_eq!((again.identity, again.first_start), (stored, false));
        let first = initialized(None, &candidate).unwrap();
        assert_eq!((first.identity, first.first_start), (candidate, true));
    }

    /// The documents the first release wrote decode, field by field.
    #[test]
    fn documents_of_the_first_release_decode() {
        let spec = spec_from_text(
            r#"{"input":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_output_tokens":2,"seed":2}"#,
        )
        .unwrap();
        assert_eq!(spec.max_output_tokens, 2);
        assert_eq!(spec.instructions, None);
        assert_eq!(spec.input.messages()[0].role, Role::System);
        assert_eq!(
            spec.controls,
            Controls::default(),
            "no controls: the defaults"
        );
        let response = response_from_text(
            r#"{"id":"resp_01M8XY941K0R7DKYWW76TXY2T5","task_id":"task_01M8XY93QXD0N2WZRTYKNEE4XH","model":"reference","output_text":"to read ","usage":{"input_tokens":3,"output_tokens":2},"created_at":1796301164286,"completed_at":1796301164595}"#,
        )
        .unwrap();
        assert_eq!(response.output_text, "to read ");
        assert!(response.calls.is_empty());
        assert_eq!(response.usage.total_tokens(), 5);
        let error = error_from_text(
            r#"{"code":"model_digest_mismatch","message":"the model file does not match its stored digest"}"#,
        )
        .unwrap();
        assert_eq!(error.code, TaskErrorCode::ModelDigestMismatch);
        let identity = identity_from_text(
            r#"{"id":"svc_01M8XY928A74TNTZY5YVERHMWE","created_at":1796301162762}"#,
        )
        .unwrap();
        assert_eq!(identity.created_at.as_millis(), 1_796_301_162_762);
        assert_eq!(
            scopes_from_text(r#"["responses:write","responses:read"]"#).unwrap(),
            Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite])
        );
    }

    #[test]
    fn a_full_spec_round_trips() {
        let spec = TaskSpec {
            input: Input::Messages(vec![
                Message::new(Role::Developer, "x"),
                Message {
                    tool_calls: vec![ToolCall {
                        call_id: "call_1".into(),
                        name: "get_weather".into(),
                        arguments: "{}".into(),
                    }],
                    ..Message::new(Role::Assistant, "")
                },
                Message {
                    tool_call_id: Some("call_1".into()),
                    ..Message::new(Role::Tool, "sunny")
                },
            ]),
            instructions: Some("Be brief.".into()),
            max_output_tokens: 9,
            seed: 3,
            temperature: Fraction::new(0.7),
            top_p: Fraction::new(0.5),
            previous_response_id: Some(
                ResponseId::parse("resp_01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap(),
            ),
            controls: Controls {
                tools: vec![FunctionTool {
                    name: "get_weather".into(),
                    description: Some("The weather".into()),
                    parameters: Some(JsonText::parsed(r#"{"type":"object"}"#)),
                    strict: true,
                }],
                tool_choice: ToolChoice::Function("get_weather".into()),
                parallel_tool_calls: false,
                format: OutputFormat::JsonSchema {
                    name: "answer".into(),
                    schema: JsonText::parsed(r#"{"type":"string"}"#),
                    strict: true,
                },
                stop: vec!["END".into()],
                presence_penalty: Penalty::new(0.5),
                frequency_penalty: Penalty::new(-1.0),
                top_logprobs: Some(3),
            },
        };
        assert_eq!(
            *spec_from_text(&spec_to_text(&spec).unwrap()).unwrap(),
            spec
        );
    }

    #[test]
    fn unknown_names_are_corrupt_not_guessed() {
        assert!(error_from_text(r#"{"code":"exploded","message":"x"}"#).is_err());
        assert!(scopes_from_text(r#"["root"]"#).is_err());
        assert!(spec_from_text(
            r#"{"input":[{"role":"bot","content":"x"}],"max_output_tokens":1,"seed":1}"#
        )
        .is_err());
    }
}
