//! Validation of `POST /v1/responses` bodies (API.md §2, §4), before anything is stored (I-9).
//!
//! [`validate_submit`] takes the parsed JSON body and returns a [`SubmitRequest`] or the first
//! rule it breaks, with the offending `param`. It never panics, whatever the JSON (property-tested).

use serde_json::{Map, Value};

use crate::error_code::ErrorCode;
use crate::model::ModelId;
use crate::recovery::RestartPolicy;
use crate::task::{Input, Message, Metadata, Role, SubmitRequest, DEFAULT_MAX_OUTPUT_TOKENS};

/// The most metadata pairs a task may carry.
pub const MAX_METADATA_PAIRS: usize = 16;
/// The longest metadata key, in characters.
pub const MAX_METADATA_KEY_CHARS: usize = 64;
/// The longest metadata value, in characters.
pub const MAX_METADATA_VALUE_CHARS: usize = 512;
/// The largest `max_output_tokens`.
pub const MAX_OUTPUT_TOKENS: u64 = 100_000;

const FIELDS: [&str; 8] = [
    "model",
    "input",
    "background",
    "stream",
    "on_restart",
    "max_output_tokens",
    "seed",
    "metadata",
];

/// A rejected request: its error code, a message, and the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    /// The error code (always a 4xx code).
    pub code: ErrorCode,
    /// Human text.
    pub message: String,
    /// The offending field, e.g. `input[1].role`, or `None` for the body as a whole.
    pub param: Option<String>,
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> ValidationError {
    ValidationError {
        code: ErrorCode::InvalidRequest,
        message: message.into(),
        param: Some(param.into()),
    }
}

/// Validates a `POST /v1/responses` body.
pub fn validate_submit(body: &Value) -> Result<SubmitRequest, ValidationError> {
    let Value::Object(fields) = body else {
        return Err(ValidationError {
            code: ErrorCode::InvalidRequest,
            message: String::from("the body must be a JSON object"),
            param: None,
        });
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(invalid(
            unknown.clone(),
            format!("unknown field `{unknown}`"),
        ));
    }
    let model = match fields.get("model") {
        None | Some(Value::Null) => return Err(invalid("model", "`model` is required")),
        Some(Value::String(text)) => {
            ModelId::parse(text).map_err(|e| invalid("model", e.to_string()))?
        }
        Some(_) => return Err(invalid("model", "`model` must be a string")),
    };
    let input = validate_input(fields.get("input"))?;
    let background = optional_bool(fields, "background")?.unwrap_or(false);
    let stream = optional_bool(fields, "stream")?.unwrap_or(false);
    let on_restart = match fields.get("on_restart") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            Some(RestartPolicy::parse(text).map_err(|e| invalid("on_restart", e.to_string()))?)
        }
        Some(_) => return Err(invalid("on_restart", "`on_restart` must be a string")),
    };
    let max_output_tokens = match fields.get("max_output_tokens") {
        None | Some(Value::Null) => DEFAULT_MAX_OUTPUT_TOKENS,
        Some(value) => match value.as_u64() {
            Some(n @ 1..=MAX_OUTPUT_TOKENS) => n as u32,
            _ => {
                return Err(invalid(
                    "max_output_tokens",
                    "`max_output_tokens` must be an integer from 1 to 100000",
                ))
            }
        },
    };
    let seed =
        match fields.get("seed") {
            None | Some(Value::Null) => None,
            Some(value) => Some(value.as_u64().ok_or_else(|| {
                invalid("seed", "`seed` must be a non-negative integer below 2^64")
            })?),
        };
    let metadata = validate_metadata(fields.get("metadata"))?;
    Ok(SubmitRequest {
        model,
        input,
        background,
        stream,
        on_restart,
        max_output_tokens,
        seed,
        metadata,
    })
}

fn optional_bool(fields: &Map<String, Value>, name: &str) -> Result<Option<bool>, ValidationError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(_) => Err(invalid(name, format!("`{name}` must be a boolean"))),
    }
}

fn validate_input(value: Option<&Value>) -> Result<Input, ValidationError> {
    match value {
        None | Some(Value::Null) => Err(invalid("input", "`input` is required")),
        Some(Value::String(text)) if text.trim().is_empty() => {
            Err(invalid("input", "`input` must not be empty"))
        }
        Some(Value::String(text)) => Ok(Input::Text(text.clone())),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(invalid("input", "`input` must not be an empty list"))
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| validate_message(index, item))
            .collect::<Result<Vec<_>, _>>()
            .map(Input::Messages),
        Some(_) => Err(invalid(
            "input",
            "`input` must be a string or a list of {role, content} messages",
        )),
    }
}

fn validate_message(index: usize, item: &Value) -> Result<Message, ValidationError> {
    let at = |field: &str| format!("input[{index}]{field}");
    let Value::Object(fields) = item else {
        return Err(invalid(
            at(""),
            "each message must be an object with `role` and `content`",
        ));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| k.as_str() != "role" && k.as_str() != "content")
    {
        return Err(invalid(
            at(&format!(".{unknown}")),
            format!("unknown field `{unknown}`"),
        ));
    }
    let role = match fields.get("role").and_then(Value::as_str) {
        Some("system") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        _ => {
            return Err(invalid(
                at(".role"),
                "`role` must be system, user or assistant",
            ))
        }
    };
    let content = match fields.get("content") {
        Some(Value::String(text)) => text.clone(),
        _ => return Err(invalid(at(".content"), "`content` must be a string")),
    };
    Ok(Message { role, content })
}

fn validate_metadata(value: Option<&Value>) -> Result<Metadata, ValidationError> {
    let fields = match value {
        None | Some(Value::Null) => return Ok(Metadata::new()),
        Some(Value::Object(fields)) => fields,
        Some(_) => {
            return Err(invalid(
                "metadata",
                "`metadata` must be an object of strings",
            ))
        }
    };
    if fields.len() > MAX_METADATA_PAIRS {
        return Err(invalid("metadata", "`metadata` holds at most 16 pairs"));
    }
    let mut metadata = Metadata::new();
    for (key, value) in fields {
        let param = format!("metadata.{key}");
        if key.is_empty() || key.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(invalid(param, "metadata keys are 1–64 characters"));
        }
        let Value::String(text) = value else {
            return Err(invalid(param, "metadata values must be strings"));
        };
        if text.chars().count() > MAX_METADATA_VALUE_CHARS {
            return Err(invalid(param, "metadata values are at most 512 characters"));
        }
        metadata.insert(key.clone(), text.clone());
    }
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rejected(body: Value) -> (ErrorCode, Option<String>) {
        let error = validate_submit(&body).expect_err("the body must be rejected");
        (error.code, error.param)
    }

    #[test]
    fn a_full_request_is_accepted_with_its_values() {
        let request = validate_submit(&json!({
            "model": "reference", "input": "Once upon a time", "background": true,
            "stream": false, "on_restart": "resume", "max_output_tokens": 16, "seed": 42,
            "metadata": {"k": "v"}
        }))
        .unwrap();
        assert_eq!(request.model.as_str(), "reference");
        assert!(request.background);
        assert_eq!(request.on_restart, Some(RestartPolicy::Resume));
        assert_eq!(request.max_output_tokens, 16);
        assert_eq!(request.seed, Some(42));
        assert_eq!(request.metadata.get("k").map(String::as_str), Some("v"));
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let request = validate_submit(&json!({"model": "reference", "input": [
            {"role": "user", "content": "hi"}
        ]}))
        .unwrap();
        assert_eq!(request.max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS);
        assert!(!request.background && !request.stream);
        assert_eq!(request.on_restart, None);
    }

    /// I-9: every rule of API.md §4 rejects with `invalid_request` and names its field.
    #[test]
    fn each_broken_rule_names_its_field_i9() {
        let table = [
            (json!([]), None),
            (json!({"input": "x"}), Some("model")),
            (json!({"model": 7, "input": "x"}), Some("model")),
            (json!({"model": "reference"}), Some("input")),
            (json!({"model": "reference", "input": ""}), Some("input")),
            (json!({"model": "reference", "input": []}), Some("input")),
            (json!({"model": "reference", "input": 3}), Some("input")),
            (
                json!({"model": "reference", "input": [{"role": "bot", "content": "x"}]}),
                Some("input[0].role"),
            ),
            (
                json!({"model": "reference", "input": [{"role": "user"}]}),
                Some("input[0].content"),
            ),
            (
                json!({"model": "reference", "input": "x", "max_output_tokens": 0}),
                Some("max_output_tokens"),
            ),
            (
                json!({"model": "reference", "input": "x", "max_output_tokens": 100001}),
                Some("max_output_tokens"),
            ),
            (
                json!({"model": "reference", "input": "x", "max_output_tokens": 1.5}),
                Some("max_output_tokens"),
            ),
            (
                json!({"model": "reference", "input": "x", "background": "yes"}),
                Some("background"),
            ),
            (
                json!({"model": "reference", "input": "x", "on_restart": "later"}),
                Some("on_restart"),
            ),
            (
                json!({"model": "reference", "input": "x", "seed": -1}),
                Some("seed"),
            ),
            (
                json!({"model": "reference", "input": "x", "metadata": {"k": 1}}),
                Some("metadata.k"),
            ),
            (
                json!({"model": "reference", "input": "x", "extra": 1}),
                Some("extra"),
            ),
        ];
        for (body, param) in table {
            let shown = body.to_string();
            assert_eq!(
                rejected(body),
                (ErrorCode::InvalidRequest, param.map(String::from)),
                "{shown}"
            );
        }
    }

    #[test]
    fn metadata_holds_at_most_sixteen_pairs() {
        let pairs: Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        let body = json!({"model": "reference", "input": "x", "metadata": pairs});
        assert_eq!(rejected(body).1.as_deref(), Some("metadata"));
    }
}
