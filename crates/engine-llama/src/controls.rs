//! What a task's controls (tools, the output's format, stop strings, penalties, log
//! probabilities) ask of a llama run: the [`Mode`] of its output, the grammars of its [`Plan`],
//! and the text that tells the model about its tools.

use lmsp_domain::ports::Unsupported;
use lmsp_domain::task::{Message, Role};
use lmsp_domain::tools::{Controls, FunctionTool, OutputFormat, ToolChoice};
use serde_json::Value;

use crate::schema::{check_value, SchemaError};
use crate::shape::{Mode, TRIGGER};
use crate::steer::Plan;

/// A run's controls, ready for the engine.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    /// What the output may be.
    pub(crate) mode: Mode,
    /// Its grammars and penalties.
    pub(crate) plan: Plan,
    /// The stop strings.
    pub(crate) stops: Vec<String>,
    /// `Some(n)`: each text token's log probability and the `n` likeliest alternatives.
    pub(crate) top_logprobs: Option<u8>,
    /// What the model is told about its tools (a system message), when it may call any.
    pub(crate) tools_text: Option<String>,
}

/// The JSON schema of a tool's parameters or of a format, checked.
fn schema(text: &str) -> Result<Value, SchemaError> {
    let value: Value =
        serde_json::from_str(text).map_err(|error| SchemaError::NotJson(error.to_string()))?;
    check_value(&value)?;
    Ok(value)
}

/// Checks what the llama engine must enforce of `controls`: the format's schema and every
/// callable tool's parameters (see [`crate::check_schema`]). Pure and cheap (no model); the
/// engine's [`lmsp_domain::ports::Engine::check`] answers with it before a task is created.
/// The error names the field at fault, `text.format.schema…` or `tools[i].parameters…`, down
/// to the keyword (`text.format.schema.properties.age.multipleOf`).
pub fn check_controls(controls: &Controls) -> Result<(), Unsupported> {
    if let OutputFormat::JsonSchema { schema: text, .. } = &controls.format {
        schema(text.as_str()).map_err(|error| unsupported("text.format.schema", &error))?;
    }
    for (index, tool) in controls.tools.iter().enumerate() {
        if let Some(parameters) = &tool.parameters {
            schema(parameters.as_str())
                .map_err(|error| unsupported(&format!("tools[{index}].parameters"), &error))?;
        }
    }
    Asked::of(controls)
        .map(|_| ())
        .map_err(|error| unsupported("tools", &error))
}

/// The domain's refusal of a schema error at `field`.
fn unsupported(field: &str, error: &SchemaError) -> Unsupported {
    let mut param = field.to_owned();
    let at = match error {
        SchemaError::Unsupported { at, .. } | SchemaError::Invalid { at, .. } => Some(at),
        SchemaError::NotJson(_) => None,
    };
    for part in at
        .map(|at| {
            at.trim_start_matches('#')
                .split('/')
                .filter(|p| !p.is_empty())
        })
        .into_iter()
        .flatten()
    {
        param.push('.');
        param.push_str(part);
    }
    if let Some(keyword) = error.keyword() {
        param.push('.');
        param.push_str(keyword);
    }
    Unsupported {
        param,
        message: error.to_string(),
    }
}

impl Asked {
    /// The run that `controls` ask for.
    pub(crate) fn of(controls: &Controls) -> Result<Self, SchemaError> {
        let format = match &controls.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(serde_json::json!({"type": "object"})),
            OutputFormat::JsonSchema { schema: text, .. } => Some(schema(text.as_str())?),
        };
        let callable: Vec<&FunctionTool> = controls.callable_tools();
        let names: Vec<String> = callable.iter().map(|tool| tool.name.clone()).collect();
        let mode = match (&controls.tool_choice, names.as_slice()) {
            (_, []) | (ToolChoice::None, _) => Mode::Text,
            (ToolChoice::Function(name), _) => Mode::Call { name: name.clone() },
            (ToolChoice::Required, [only]) => Mode::Call { name: only.clone() },
            (ToolChoice::Required, _) => Mode::Choose { names },
            // A format constrains text from its first token, which leaves no room for the
            // trigger of a call: the format wins (docs/llama-tools.md).
            (ToolChoice::Auto, _) if format.is_some() => Mode::Text,
            (ToolChoice::Auto, _) => Mode::Auto { names },
        };
        let mut parameters = Vec::new();
        if mode != Mode::Text {
            for tool in &callable {
                let parameters_schema = tool
                    .parameters
                    .as_ref()
                    .map(|text| schema(text.as_str()))
                    .transpose()?;
                parameters.push((tool.name.clone(), parameters_schema));
            }
        }
        let mut plan = Plan::new(&mode, format.as_ref(), &parameters)?;
        // Narrowing to llama.cpp's f32 is intended.
        #[allow(clippy::cast_possible_truncation)]
        {
            plan.presence = controls.presence_penalty.map_or(0.0, |p| p.get() as f32);
            plan.frequency = controls.frequency_penalty.map_or(0.0, |p| p.get() as f32);
        }
        let tools_text = (mode != Mode::Text).then(|| tools_text(&mode, &callable));
        Ok(Self {
            mode,
            plan,
            stops: controls.stop.clone(),
            top_logprobs: controls.top_logprobs,
            tools_text,
        })
    }
}

/// The system text that describes the tools and how a call is written.
fn tools_text(mode: &Mode, tools: &[&FunctionTool]) -> String {
    let mut text = String::from(match mode {
        Mode::Auto { .. } => {
            "You may call a function. To call one, write <tool_call> followed by the function's \
             name as a JSON string and its arguments as a JSON object, for example \
             <tool_call>\"name\"{\"argument\": 1}. Otherwise answer in text."
        }
        _ => "Call one of these functions: write its arguments as a JSON object.",
    });
    text.push_str("\nThe functions:");
    for tool in tools {
        let mut described = serde_json::Map::new();
        described.insert(String::from("name"), Value::String(tool.name.clone()));
        if let Some(description) = &tool.description {
            described.insert(
                String::from("description"),
                Value::String(description.clone()),
            );
        }
        if let Some(parameters) = &tool.parameters {
            if let Ok(parameters) = serde_json::from_str::<Value>(parameters.as_str()) {
                described.insert(String::from("parameters"), parameters);
            }
        }
        text.push('\n');
        text.push_str(&Value::Object(described).to_string());
    }
    text
}

/// The conversation the model reads: the tools' description first (in the system message), and
/// earlier calls and tool answers as text in the form a call is written.
pub(crate) fn conversation(messages: Vec<Message>, tools_text: Option<&str>) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut messages = messages.into_iter().peekable();
    if let Some(tools) = tools_text {
        match messages.peek() {
            Some(first) if first.role == Role::System => {
                if let Some(mut system) = messages.next() {
                    system.content = format!("{}\n\n{tools}", system.content);
                    out.push(system);
                }
            }
            _ => out.push(Message::new(Role::System, tools)),
        }
    }
    for mut message in messages {
        for call in std::mem::take(&mut message.tool_calls) {
            message.content.push_str(TRIGGER);
            message
                .content
                .push_str(&Value::String(call.name).to_string());
            message.content.push_str(&call.arguments);
        }
        out.push(message);
    }
    out
}
