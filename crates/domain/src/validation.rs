//! Validation of a request for work, before anything is stored (I-9).
//!
//! The driving adapter parses its wire format into a [`SubmitDraft`] of typed but unchecked values
//! (it rejects unknown fields and wrong JSON types itself); [`validate_submit`] checks the values
//! (ranges, lengths, names of roles and policies) and returns a [`SubmitRequest`] or the first rule
//! the draft breaks, with the offending `param`. It never panics (property-tested).

use crate::ids::ResponseId;
use crate::model::ModelId;
use crate::recovery::RestartPolicy;
use crate::schedule::ServiceTier;
use crate::task::{Fraction, Input, Message, Metadata, Role};
use crate::tools::{
    Controls, FunctionTool, OutputFormat, Penalty, ToolCall, ToolChoice, MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
};

/// The most metadata pairs a task may carry.
pub const MAX_METADATA_PAIRS: usize = 16;
/// The longest metadata key, in characters.
pub const MAX_METADATA_KEY_CHARS: usize = 64;
/// The longest metadata value, in characters.
pub const MAX_METADATA_VALUE_CHARS: usize = 512;
/// The largest `max_output_tokens`.
pub const MAX_OUTPUT_TOKENS: u64 = 100_000;
/// The default of `max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 256;
/// The largest `temperature`.
pub const MAX_TEMPERATURE: f64 = 2.0;

/// A request for work as the driving adapter parsed it: typed, not yet checked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubmitDraft {
    /// The model id.
    pub model: String,
    /// The prompt or conversation.
    pub input: DraftInput,
    /// Instructions for the model.
    pub instructions: Option<String>,
    /// Whether the request returns at once.
    pub background: Option<bool>,
    /// Whether the reply is a stream of events.
    pub stream: Option<bool>,
    /// The restart policy's name.
    pub on_restart: Option<String>,
    /// The output budget.
    pub max_output_tokens: Option<u64>,
    /// The sampler's seed.
    pub seed: Option<u64>,
    /// The sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling's mass.
    pub top_p: Option<f64>,
    /// The client's string pairs.
    pub metadata: Option<Metadata>,
    /// The earlier response this one continues.
    pub previous_response_id: Option<String>,
    /// Tools, format and sampling controls.
    pub controls: DraftControls,
    /// The service tier's name (`auto` is `default`).
    pub service_tier: Option<String>,
    /// The request shape it came in: the names its errors give the fields.
    pub shape: RequestShape,
}

/// Which of OpenAI's request shapes a request came in, so that an error names the field as the
/// client wrote it. The rules are written once, naming Responses' fields;
/// [`RequestShape::param`] renames them for Chat completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestShape {
    /// OpenAI's Responses (and LMSP's own names).
    #[default]
    Responses,
    /// OpenAI's Chat completions.
    Chat {
        /// Whether the output budget came in the older `max_tokens` (else
        /// `max_completion_tokens`).
        max_tokens: bool,
    },
}

/// The fields of a function tool that Chat nests in the tool's `function`.
const FUNCTION_FIELDS: [&str; 4] = ["name", "description", "parameters", "strict"];

impl RequestShape {
    /// `param`, a field as Responses names it (`input[1].call_id`, `text.format.schema.x`,
    /// `tools[0].parameters`, …), as this shape names it (`messages[1].tool_call_id`,
    /// `response_format.json_schema.schema.x`, `tools[0].function.parameters`, …).
    pub fn param(self, param: &str) -> String {
        let RequestShape::Chat { max_tokens } = self else {
            return param.to_owned();
        };
        if param == "max_output_tokens" {
            let name = if max_tokens {
                "max_tokens"
            } else {
                "max_completion_tokens"
            };
            return name.to_owned();
        }
        if param == "input" {
            return String::from("messages");
        }
        if let Some(rest) = param.strip_prefix("input[") {
            return match rest.split_once(']') {
                Some((index, ".call_id")) => format!("messages[{index}].tool_call_id"),
                _ => format!("messages[{rest}"),
            };
        }
        if param == "text.format" {
            return String::from("response_format");
        }
        if let Some(rest) = param.strip_prefix("text.format.") {
            return format!("response_format.json_schema.{rest}");
        }
        if let Some((tool, field)) = param
            .strip_prefix("tools[")
            .and_then(|rest| rest.split_once("]."))
        {
            let first = field.split(['.', '[']).next().unwrap_or_default();
            if FUNCTION_FIELDS.contains(&first) {
                return format!("tools[{tool}].function.{field}");
            }
        }
        param.to_owned()
    }
}

/// Tools, the output format and sampling controls as the adapter parsed them: typed (schemas
/// already parsed and checked as JSON by the adapter), their values not yet checked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DraftControls {
    /// The functions the model may call.
    pub tools: Vec<FunctionTool>,
    /// Whether and which tool to call (`None`: auto).
    pub tool_choice: Option<ToolChoice>,
    /// Whether a run may make several calls (`None`: yes).
    pub parallel_tool_calls: Option<bool>,
    /// The output's form.
    pub format: OutputFormat,
    /// Stop strings.
    pub stop: Vec<String>,
    /// -2…2.
    pub presence_penalty: Option<f64>,
    /// -2…2.
    pub frequency_penalty: Option<f64>,
    /// `Some(n)`: log probabilities asked for, with `n` (0…20) alternatives.
    pub top_logprobs: Option<u64>,
    /// How many choices (only 1).
    pub n: Option<u64>,
}

/// The input of a draft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraftInput {
    /// A prompt.
    Text(String),
    /// A conversation.
    Messages(Vec<DraftMessage>),
}

impl Default for DraftInput {
    fn default() -> Self {
        DraftInput::Text(String::new())
    }
}

/// One message of a draft's conversation (its text parts already joined by the adapter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftMessage {
    /// The role's name.
    pub role: String,
    /// What is said.
    pub content: String,
    /// The calls an `assistant` turn made.
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` turn answers.
    pub tool_call_id: Option<String>,
}

impl DraftMessage {
    /// A message with no tool calls.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A validated request for work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitRequest {
    /// The model to run.
    pub model: ModelId,
    /// The prompt or conversation.
    pub input: Input,
    /// Instructions that come before the input.
    pub instructions: Option<String>,
    /// Whether the request returns at once instead of waiting for the result.
    pub background: bool,
    /// Whether the reply is an event stream.
    pub stream: bool,
    /// The restart policy; `None` means the service default.
    pub on_restart: Option<RestartPolicy>,
    /// 1…100 000.
    pub max_output_tokens: u32,
    /// The sampler's seed; `None` means the service picks one and stores it.
    pub seed: Option<u64>,
    /// 0…2.
    pub temperature: Option<Fraction>,
    /// 0…1.
    pub top_p: Option<Fraction>,
    /// At most 16 string pairs.
    pub metadata: Metadata,
    /// The earlier response whose conversation comes first.
    pub previous_response_id: Option<ResponseId>,
    /// Tools, format and sampling controls.
    pub controls: Controls,
    /// How urgently it is claimed (`default` when the request names none).
    pub service_tier: ServiceTier,
    /// The request shape it came in: the names errors found later (tool answers, what the
    /// engine cannot do) give the fields.
    pub shape: RequestShape,
}

/// A rejected request: a message, and the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    /// Human text.
    pub message: String,
    /// The offending field, e.g. `input[1].role`, or `None` for the request as a whole.
    pub param: Option<String>,
}

impl ValidationError {
    /// An error naming `param`.
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// This error with its field named as `shape` names it, in `param` and where the message
    /// quotes it.
    pub fn in_shape(self, shape: RequestShape) -> Self {
        let Some(param) = self.param else {
            return self;
        };
        let renamed = shape.param(&param);
        Self {
            message: self
                .message
                .replace(&format!("`{param}`"), &format!("`{renamed}`")),
            param: Some(renamed),
        }
    }
}

fn invalid(param: &str, message: impl Into<String>) -> ValidationError {
    ValidationError::new(param, message)
}

/// Validates a request for work; an error names its field as the draft's shape does.
pub fn validate_submit(draft: SubmitDraft) -> Result<SubmitRequest, ValidationError> {
    let shape = draft.shape;
    validate(draft).map_err(|error| error.in_shape(shape))
}

fn validate(draft: SubmitDraft) -> Result<SubmitRequest, ValidationError> {
    let model = ModelId::parse(&draft.model).map_err(|e| invalid("model", e.to_string()))?;
    let input = validate_input(draft.input)?;
    let on_restart = draft
        .on_restart
        .map(|name| RestartPolicy::parse(&name).map_err(|e| invalid("on_restart", e.to_string())))
        .transpose()?;
    let max_output_tokens = match draft.max_output_tokens {
        None => DEFAULT_MAX_OUTPUT_TOKENS,
        Some(n @ 1..=MAX_OUTPUT_TOKENS) => n as u32,
        Some(_) => {
            return Err(invalid(
                "max_output_tokens",
                "`max_output_tokens` must be an integer from 1 to 100000",
            ))
        }
    };
    let temperature = sampling(draft.temperature, "temperature", MAX_TEMPERATURE)?;
    let top_p = sampling(draft.top_p, "top_p", 1.0)?;
    let metadata = validate_metadata(draft.metadata.unwrap_or_default())?;
    let controls = validate_controls(draft.controls)?;
    let previous_response_id = draft
        .previous_response_id
        .map(|id| {
            ResponseId::parse(&id).map_err(|_| {
                invalid(
                    "previous_response_id",
                    "`previous_response_id` must be a response id (`resp_…`)",
                )
            })
        })
        .transpose()?;
    let service_tier = match draft.service_tier {
        None => ServiceTier::Default,
        Some(name) => ServiceTier::parse(&name).ok_or_else(|| {
            invalid(
                "service_tier",
                "`service_tier` must be auto, default, priority or flex",
            )
        })?,
    };
    Ok(SubmitRequest {
        model,
        input,
        instructions: draft.instructions.filter(|text| !text.is_empty()),
        background: draft.background.unwrap_or(false),
        stream: draft.stream.unwrap_or(false),
        on_restart,
        max_output_tokens,
        seed: draft.seed,
        temperature,
        top_p,
        metadata,
        previous_response_id,
        controls,
        service_tier,
        shape: draft.shape,
    })
}

/// Whether `name` may name a function or a format: 1–64 of `a-z A-Z 0-9 _ -`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn penalty(value: Option<f64>, param: &str) -> Result<Option<Penalty>, ValidationError> {
    value
        .map(|value| {
            Penalty::new(value)
                .ok_or_else(|| invalid(param, format!("`{param}` must be a number from -2 to 2")))
        })
        .transpose()
}

fn validate_controls(draft: DraftControls) -> Result<Controls, ValidationError> {
    if draft.n.is_some_and(|n| n != 1) {
        return Err(invalid("n", "`n` must be 1: LMSP makes one choice"));
    }
    for (index, tool) in draft.tools.iter().enumerate() {
        if !is_valid_name(&tool.name) {
            return Err(invalid(
                &format!("tools[{index}].name"),
                "a function's name is 1–64 letters, digits, `_` or `-`",
            ));
        }
        if draft.tools[..index].iter().any(|t| t.name == tool.name) {
            return Err(invalid(
                &format!("tools[{index}].name"),
                format!("two tools are named `{}`", tool.name),
            ));
        }
    }
    let tool_choice = draft.tool_choice.unwrap_or_default();
    match &tool_choice {
        ToolChoice::Function(name) if !draft.tools.iter().any(|t| &t.name == name) => {
            return Err(invalid(
                "tool_choice",
                format!("`tool_choice` names `{name}`, which is not one of `tools`"),
            ));
        }
        ToolChoice::Required if draft.tools.is_empty() => {
            return Err(invalid(
                "tool_choice",
                "`tool_choice` is `required` but there are no `tools`",
            ));
        }
        _ => {}
    }
    if let OutputFormat::JsonSchema { name, .. } = &draft.format {
        if !is_valid_name(name) {
            return Err(invalid(
                "text.format.name",
                "a format's name is 1–64 letters, digits, `_` or `-`",
            ));
        }
    }
    if draft.stop.len() > MAX_STOP_STRINGS {
        return Err(invalid("stop", "`stop` holds at most 4 strings"));
    }
    if draft.stop.iter().any(String::is_empty) {
        return Err(invalid("stop", "stop strings must not be empty"));
    }
    let top_logprobs = match draft.top_logprobs {
        None => None,
        Some(n) if n <= u64::from(MAX_TOP_LOGPROBS) => u8::try_from(n).ok(),
        Some(_) => {
            return Err(invalid(
                "top_logprobs",
                "`top_logprobs` must be an integer from 0 to 20",
            ))
        }
    };
    Ok(Controls {
        tools: draft.tools,
        tool_choice,
        parallel_tool_calls: draft.parallel_tool_calls.unwrap_or(true),
        format: draft.format,
        stop: draft.stop,
        presence_penalty: penalty(draft.presence_penalty, "presence_penalty")?,
        frequency_penalty: penalty(draft.frequency_penalty, "frequency_penalty")?,
        top_logprobs,
    })
}

/// Checks that every `tool` message of a conversation from index `first` on answers a call an
/// earlier `assistant` message made (by `call_id`); the param names the first that does not, by
/// its index counted from `first` (the messages before it are an earlier response's).
pub fn check_tool_answers(input: &Input, first: usize) -> Result<(), ValidationError> {
    let Input::Messages(messages) = input else {
        return Ok(());
    };
    for (index, message) in messages.iter().enumerate().skip(first) {
        if message.role != Role::Tool {
            continue;
        }
        let answered = message.tool_call_id.as_deref().is_some_and(|id| {
            messages[..index]
                .iter()
                .flat_map(|earlier| &earlier.tool_calls)
                .any(|call| call.call_id == id)
        });
        if !answered {
            return Err(invalid(
                &format!("input[{}].call_id", index - first),
                format!(
                    "no earlier function call has the call id `{}`",
                    message.tool_call_id.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

fn sampling(
    value: Option<f64>,
    param: &str,
    max: f64,
) -> Result<Option<Fraction>, ValidationError> {
    match value {
        None => Ok(None),
        Some(value) => Fraction::new(value)
            .filter(|fraction| fraction.get() <= max)
            .map(Some)
            .ok_or_else(|| invalid(param, format!("`{param}` must be a number from 0 to {max}"))),
    }
}

fn validate_input(input: DraftInput) -> Result<Input, ValidationError> {
    match input {
        DraftInput::Text(text) if text.trim().is_empty() => {
            Err(invalid("input", "`input` must not be empty"))
        }
        DraftInput::Text(text) => Ok(Input::Text(text)),
        DraftInput::Messages(items) if items.is_empty() => {
            Err(invalid("input", "`input` must not be an empty list"))
        }
        DraftInput::Messages(items) => items
            .into_iter()
            .enumerate()
            .map(|(index, item)| {
                let role = Role::parse(&item.role).ok_or_else(|| {
                    invalid(
                        &format!("input[{index}].role"),
                        "`role` must be system, developer, user, assistant or tool",
                    )
                })?;
                Ok(Message {
                    role,
                    content: item.content,
                    tool_calls: item.tool_calls,
                    tool_call_id: item.tool_call_id,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Input::Messages),
    }
}

/// Metadata within its bounds: at most 16 pairs, keys of 1–64 characters, values of at most 512.
pub fn validate_metadata(metadata: Metadata) -> Result<Metadata, ValidationError> {
    if metadata.len() > MAX_METADATA_PAIRS {
        return Err(invalid("metadata", "`metadata` holds at most 16 pairs"));
    }
    for (key, value) in &metadata {
        let param = format!("metadata.{key}");
        if key.is_empty() || key.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(invalid(&param, "metadata keys are 1–64 characters"));
        }
        if value.chars().count() > MAX_METADATA_VALUE_CHARS {
            return Err(invalid(
                &param,
                "metadata values are at most 512 characters",
            ));
        }
    }
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft() -> SubmitDraft {
        SubmitDraft {
            model: "reference".into(),
            input: DraftInput::Text("Once upon a time".into()),
            ..SubmitDraft::default()
        }
    }

    fn rejected(draft: SubmitDraft) -> Option<String> {
        validate_submit(draft)
            .expect_err("the draft must be rejected")
            .param
    }

    /// Issue 25: a request's `service_tier` is parsed (`auto` is `default`, none is `default`);
    /// an unknown tier is a 400 naming the field.
    #[test]
    fn a_service_tier_is_parsed_and_an_unknown_one_is_rejected() {
        let tier = |name: Option<&str>| {
            validate_submit(SubmitDraft {
                service_tier: name.map(String::from),
                ..draft()
            })
            .map(|request| request.service_tier)
        };
        assert_eq!(tier(None).unwrap(), ServiceTier::Default);
        assert_eq!(tier(Some("auto")).unwrap(), ServiceTier::Default);
        assert_eq!(tier(Some("flex")).unwrap(), ServiceTier::Flex);
        assert_eq!(tier(Some("priority")).unwrap(), ServiceTier::Priority);
        assert_eq!(
            rejected(SubmitDraft {
                service_tier: Some("scale".into()),
                ..draft()
            }),
            Some(String::from("service_tier"))
        );
    }

    #[test]
    fn a_full_request_is_accepted_with_its_values() {
        let request = validate_submit(SubmitDraft {
            background: Some(true),
            stream: Some(false),
            on_restart: Some("resume".into()),
            max_output_tokens: Some(16),
            seed: Some(42),
            temperature: Some(0.0),
            top_p: Some(0.9),
            instructions: Some("Be brief.".into()),
            metadata: Some([("k".to_string(), "v".to_string())].into()),
            previous_response_id: Some("resp_01ARZ3NDEKTSV4RRFFQ69G5FAV".into()),
            ..draft()
        })
        .unwrap();
        assert_eq!(request.model.as_str(), "reference");
        assert!(request.background);
        assert_eq!(request.on_restart, Some(RestartPolicy::Resume));
        assert_eq!(request.max_output_tokens, 16);
        assert_eq!(request.seed, Some(42));
        assert_eq!(request.temperature.map(Fraction::get), Some(0.0));
        assert_eq!(request.top_p.map(Fraction::get), Some(0.9));
        assert_eq!(request.instructions.as_deref(), Some("Be brief."));
        assert_eq!(request.metadata.get("k").map(String::as_str), Some("v"));
        assert!(request.previous_response_id.is_some());
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let request = validate_submit(SubmitDraft {
            input: DraftInput::Messages(vec![DraftMessage::new("developer", "hi")]),
            instructions: Some(String::new()),
            ..draft()
        })
        .unwrap();
        assert_eq!(request.max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS);
        assert!(!request.background && !request.stream);
        assert_eq!(request.on_restart, None);
        assert_eq!(request.instructions, None, "empty instructions are none");
        assert_eq!(
            request.input,
            Input::Messages(vec![Message::new(Role::Developer, "hi")])
        );
    }

    /// I-9: every value rule rejects with the field it names.
    #[test]
    fn each_broken_rule_names_its_field_i9() {
        let message = |role: &str| DraftMessage::new(role, "x");
        let cases: Vec<(SubmitDraft, &str)> = vec![
            (
                SubmitDraft {
                    model: "../x".into(),
                    ..draft()
                },
                "model",
            ),
            (
                SubmitDraft {
                    model: String::new(),
                    ..draft()
                },
                "model",
            ),
            (
                SubmitDraft {
                    input: DraftInput::Text("  ".into()),
                    ..draft()
                },
                "input",
            ),
            (
                SubmitDraft {
                    input: DraftInput::Messages(vec![]),
                    ..draft()
                },
                "input",
            ),
            (
                SubmitDraft {
                    input: DraftInput::Messages(vec![message("user"), message("bot")]),
                    ..draft()
                },
                "input[1].role",
            ),
            (
                SubmitDraft {
                    max_output_tokens: Some(0),
                    ..draft()
                },
                "max_output_tokens",
            ),
            (
                SubmitDraft {
                    max_output_tokens: Some(100_001),
                    ..draft()
                },
                "max_output_tokens",
            ),
            (
                SubmitDraft {
                    on_restart: Some("later".into()),
                    ..draft()
                },
                "on_restart",
            ),
            (
                SubmitDraft {
                    temperature: Some(2.5),
                    ..draft()
                },
                "temperature",
            ),
            (
                SubmitDraft {
                    temperature: Some(-0.1),
                    ..draft()
                },
                "temperature",
            ),
            (
                SubmitDraft {
                    temperature: Some(f64::NAN),
                    ..draft()
                },
                "temperature",
            ),
            (
                SubmitDraft {
                    top_p: Some(1.5),
                    ..draft()
                },
                "top_p",
            ),
            (
                SubmitDraft {
                    previous_response_id: Some("task_x".into()),
                    ..draft()
                },
                "previous_response_id",
            ),
            (
                SubmitDraft {
                    metadata: Some([(String::new(), "v".to_string())].into()),
                    ..draft()
                },
                "metadata.",
            ),
            (
                SubmitDraft {
                    metadata: Some([("k".to_string(), "v".repeat(513))].into()),
                    ..draft()
                },
                "metadata.k",
            ),
        ];
        for (index, (draft, param)) in cases.into_iter().enumerate() {
            assert_eq!(rejected(draft).as_deref(), Some(param), "case {index}");
        }
    }

    /// A Chat request's errors name Chat's fields, in `param` and in the message.
    #[test]
    fn a_chat_request_s_errors_name_chat_s_fields() {
        let chat = RequestShape::Chat { max_tokens: false };
        let legacy = RequestShape::Chat { max_tokens: true };
        for (responses, shape, named) in [
            ("input", chat, "messages"),
            ("input[1].call_id", chat, "messages[1].tool_call_id"),
            ("input[12].role", chat, "messages[12].role"),
            ("max_output_tokens", chat, "max_completion_tokens"),
            ("max_output_tokens", legacy, "max_tokens"),
            ("text.format", chat, "response_format"),
            ("text.format.name", chat, "response_format.json_schema.name"),
            (
                "text.format.schema.properties.a.pattern",
                chat,
                "response_format.json_schema.schema.properties.a.pattern",
            ),
            ("tools[0].name", chat, "tools[0].function.name"),
            (
                "tools[2].parameters.properties.x",
                chat,
                "tools[2].function.parameters.properties.x",
            ),
            ("tools[0].type", chat, "tools[0].type"),
            ("tools", chat, "tools"),
            ("top_logprobs", chat, "top_logprobs"),
            (
                "input[1].call_id",
                RequestShape::Responses,
                "input[1].call_id",
            ),
        ] {
            assert_eq!(shape.param(responses), named, "{responses}");
        }
        let error = validate_submit(SubmitDraft {
            max_output_tokens: Some(0),
            shape: chat,
            ..draft()
        })
        .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("max_completion_tokens"));
        assert!(
            error.message.starts_with("`max_completion_tokens` must be"),
            "{}",
            error.message
        );
    }

    #[test]
    fn the_edges_of_each_range_are_accepted() {
        for (tokens, temperature, top_p) in [(1, 0.0, 0.0), (100_000, 2.0, 1.0)] {
            let request = validate_submit(SubmitDraft {
                max_output_tokens: Some(tokens),
                temperature: Some(temperature),
                top_p: Some(top_p),
                ..draft()
            })
            .unwrap();
            assert_eq!(u64::from(request.max_output_tokens), tokens);
        }
    }

    #[test]
    fn metadata_holds_at_most_sixteen_pairs() {
        let pairs: Metadata = (0..17)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        let sixteen: Metadata = pairs.clone().into_iter().take(16).collect();
        assert_eq!(
            rejected(SubmitDraft {
                metadata: Some(pairs),
                ..draft()
            })
            .as_deref(),
            Some("metadata")
        );
        assert!(validate_submit(SubmitDraft {
            metadata: Some(sixteen),
            ..draft()
        })
        .is_ok());
    }
}
