//! The reference engine's deterministic answers to tools and structured outputs, so that clients
//! can be tested without a model.
//!
//! The rule: with `tool_choice` `required` or a named function, the run calls that function (the
//! first tool for `required`); with `auto` and tools, it calls the first tool unless the
//! conversation's last message is a tool's answer; the call's arguments are the smallest valid
//! instance of the tool's `parameters`. Otherwise, with a `json_schema` format the text is the
//! smallest valid instance of the schema, with `json_object` it is `{}`. The output is cut into
//! pieces of at most [`PIECE_CHARS`] characters, each one token.

use serde_json::{Map, Value};

use lmsp_domain::{Controls, OutputFormat, Role, TaskSpec, ToolChoice};

/// The most characters in one piece (one token) of a scripted output.
pub const PIECE_CHARS: usize = 4;

/// How deep a schema is followed (`$ref` loops end here).
const MAX_DEPTH: usize = 32;

/// What a scripted run writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Script {
    /// A call of `name` with these arguments (JSON text).
    Call {
        /// The function.
        name: String,
        /// The arguments.
        arguments: String,
    },
    /// This JSON text.
    Json(String),
}

impl Script {
    /// The script of `spec`, or `None` for free text.
    pub fn of(spec: &TaskSpec) -> Option<Self> {
        let controls = &spec.controls;
        if let Some(tool) = called_tool(spec, controls) {
            let arguments = match tool.parameters.as_ref().map(|p| parse(p.as_str())) {
                Some(schema) => match smallest_instance(&schema, &schema, 0) {
                    object @ Value::Object(_) => object,
                    _ => Value::Object(Map::new()),
                },
                None => Value::Object(Map::new()),
            };
            return Some(Script::Call {
                name: tool.name.clone(),
                arguments: arguments.to_string(),
            });
        }
        match &controls.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(Script::Json(String::from("{}"))),
            OutputFormat::JsonSchema { schema, .. } => {
                let schema = parse(schema.as_str());
                Some(Script::Json(
                    smallest_instance(&schema, &schema, 0).to_string(),
                ))
            }
        }
    }

    /// The text the script writes (a call's arguments, or the JSON).
    pub fn text(&self) -> &str {
        match self {
            Script::Call { arguments, .. } => arguments,
            Script::Json(text) => text,
        }
    }

    /// The text cut into pieces of at most [`PIECE_CHARS`] characters.
    pub fn pieces(&self) -> Vec<String> {
        let chars: Vec<char> = self.text().chars().collect();
        chars
            .chunks(PIECE_CHARS)
            .map(|chunk| chunk.iter().collect())
            .collect()
    }
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Bool(true))
}

/// The tool a run calls under the rule of the module documentation.
fn called_tool<'a>(
    spec: &TaskSpec,
    controls: &'a Controls,
) -> Option<&'a lmsp_domain::FunctionTool> {
    let first = controls.callable_tools().into_iter().next()?;
    let answered = spec
        .conversation()
        .last()
        .is_some_and(|message| message.role == Role::Tool);
    match controls.tool_choice {
        ToolChoice::Required | ToolChoice::Function(_) => Some(first),
        ToolChoice::Auto if !answered => Some(first),
        _ => None,
    }
}

/// Resolves a local `$ref` (`#/$defs/…`, `#/definitions/…`, any JSON pointer into the root).
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

/// The smallest valid instance of `schema` (whose `$ref`s point into `root`): `null`, `false`,
/// `0`, `""`, `[]` or an object of its required properties, raised to the schema's minimums.
pub fn smallest_instance(schema: &Value, root: &Value, depth: usize) -> Value {
    let Value::Object(object) = schema else {
        return Value::Null;
    };
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    if let Some(constant) = object.get("const") {
        return constant.clone();
    }
    if let Some(first) = object
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|v| v.first())
    {
        return first.clone();
    }
    if let Some(target) = object
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| resolve(root, r))
    {
        return smallest_instance(target, root, depth + 1);
    }
    for keyword in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = object
            .get(keyword)
            .and_then(Value::as_array)
            .and_then(|v| v.first())
        {
            return smallest_instance(first, root, depth + 1);
        }
    }
    let kind = match object.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(Value::Array(kinds)) => {
            let names: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
            if names.contains(&"null") {
                "null"
            } else {
                names.first().copied().unwrap_or("null")
            }
        }
        _ if object.contains_key("properties") => "object",
        _ if object.contains_key("items") => "array",
        _ => "null",
    };
    let number = |integer: bool| -> Value {
        let bound = |key: &str| object.get(key).and_then(Value::as_f64);
        let mut value = 0.0_f64;
        if let Some(min) = bound("minimum") {
            value = value.max(min);
        }
        if let Some(min) = bound("exclusiveMinimum") {
            value = value.max(if integer {
                min.floor() + 1.0
            } else {
                min + 1.0
            });
        }
        if let Some(max) = bound("maximum") {
            value = value.min(max);
        }
        if let Some(max) = bound("exclusiveMaximum") {
            if value >= max {
                value = if integer { max.ceil() - 1.0 } else { max - 1.0 };
            }
        }
        if integer {
            let value = value.ceil();
            // Exactly representable: a schema's bounds are far inside i64.
            serde_json::Number::from_f64(value)
                .and_then(|n| n.as_f64())
                .map_or(Value::from(0), |v| Value::from(v as i64))
        } else {
            serde_json::Number::from_f64(value).map_or(Value::from(0), Value::Number)
        }
    };
    match kind {
        "boolean" => Value::Bool(false),
        "integer" => number(true),
        "number" => number(false),
        "string" => {
            let known = match object.get("format").and_then(Value::as_str) {
                Some("date-time") => Some("1970-01-01T00:00:00Z"),
                Some("date") => Some("1970-01-01"),
                Some("time") => Some("00:00:00Z"),
                Some("email") => Some("a@example.com"),
                Some("uuid") => Some("00000000-0000-0000-0000-000000000000"),
                Some("uri") => Some("https://example.com"),
                _ => None,
            };
            match known {
                Some(text) => Value::String(text.to_owned()),
                None => {
                    let min = object.get("minLength").and_then(Value::as_u64).unwrap_or(0);
                    Value::String("a".repeat(usize::try_from(min.min(4096)).unwrap_or(0)))
                }
            }
        }
        "array" => {
            let min = object.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let item = object.get("items").map_or(Value::Null, |items| {
                smallest_instance(items, root, depth + 1)
            });
            Value::Array(vec![item; usize::try_from(min.min(1024)).unwrap_or(0)])
        }
        "object" => {
            let properties = object.get("properties").and_then(Value::as_object);
            let required = object
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            let mut instance = Map::new();
            for name in required {
                let value = properties
                    .and_then(|p| p.get(name))
                    .map_or(Value::Null, |s| smallest_instance(s, root, depth + 1));
                instance.insert(name.to_owned(), value);
            }
            Value::Object(instance)
        }
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn smallest(schema: Value) -> Value {
        smallest_instance(&schema, &schema, 0)
    }

    #[test]
    fn the_smallest_instance_of_an_object_holds_its_required_properties() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer", "minimum": 18},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "kind": {"enum": ["cat", "dog"]}, "note": {"type": ["string", "null"]},
            "optional": {"type": "string"}},
            "required": ["name", "age", "tags", "kind", "note"], "additionalProperties": false});
        assert_eq!(
            smallest(schema),
            json!({"name": "", "age": 18, "tags": [""], "kind": "cat", "note": null})
        );
    }

    #[test]
    fn references_and_unions_are_followed() {
        let schema = json!({"$defs": {"Point": {"type": "object", "properties": {
            "x": {"type": "number"}}, "required": ["x"]}},
            "type": "object", "properties": {"p": {"$ref": "#/$defs/Point"},
            "q": {"anyOf": [{"type": "boolean"}, {"type": "string"}]}}, "required": ["p", "q"]});
        assert_eq!(smallest(schema), json!({"p": {"x": 0.0}, "q": false}));
        let looping = json!({"$ref": "#"});
        assert_eq!(smallest(looping), Value::Null);
    }

    #[test]
    fn a_script_is_cut_into_pieces_of_whole_characters() {
        let script = Script::Json(String::from("{\"é\":\"ab\"}"));
        let pieces = script.pieces();
        assert_eq!(pieces.concat(), "{\"é\":\"ab\"}");
        assert!(pieces.iter().all(|p| p.chars().count() <= PIECE_CHARS));
    }
}
