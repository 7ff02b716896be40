//! The request side of tools and structured outputs: function tools, the tool choice, the
//! output format, and a structural check of JSON Schemas (a malformed schema is a 400 naming the
//! keyword, never ignored).

use serde_json::Value;

use lmsp_domain::{FunctionTool, JsonText, OutputFormat, ToolChoice};

use crate::error::ApiError;

/// The instance types JSON Schema knows.
const TYPES: [&str; 7] = [
    "string", "number", "integer", "boolean", "object", "array", "null",
];

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message.into())
}

/// Checks that `schema` is a JSON Schema LMSP understands; the error names the keyword's path
/// (`param` is where the schema sits in the request).
pub fn check_schema(schema: &Value, param: &str) -> Result<(), ApiError> {
    let object = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(object) => object,
        _ => return Err(bad(param, "a JSON Schema must be an object or a boolean")),
    };
    for (keyword, value) in object {
        let at = format!("{param}.{keyword}");
        let ok = match keyword.as_str() {
            "type" => match value {
                Value::String(name) => TYPES.contains(&name.as_str()),
                Value::Array(names) => {
                    !names.is_empty()
                        && names
                            .iter()
                            .all(|n| n.as_str().is_some_and(|n| TYPES.contains(&n)))
                }
                _ => false,
            },
            "properties" | "$defs" | "definitions" | "patternProperties" => match value {
                Value::Object(map) => {
                    for (name, inner) in map {
                        check_schema(inner, &format!("{at}.{name}"))?;
                    }
                    true
                }
                _ => false,
            },
            "required" => value
                .as_array()
                .is_some_and(|names| names.iter().all(Value::is_string)),
            "items"
            | "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames" => {
                check_schema(value, &at)?;
                true
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => match value {
                Value::Array(list) if !list.is_empty() => {
                    for (index, inner) in list.iter().enumerate() {
                        check_schema(inner, &format!("{at}[{index}]"))?;
                    }
                    true
                }
                _ => false,
            },
            "enum" => value.as_array().is_some_and(|list| !list.is_empty()),
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => {
                value.is_number()
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties" => value.as_u64().is_some(),
            "uniqueItems" => value.is_boolean(),
            "pattern" | "$ref" | "description" | "title" | "format" | "$schema" | "$id"
            | "$comment" => value.is_string(),
            "const" | "default" | "examples" | "deprecated" | "readOnly" | "writeOnly" => true,
            // OpenAPI's annotation of a tagged union (pydantic writes it for a discriminated
            // union, and openai-python's strict schema keeps it): the `oneOf` branches' `const`
            // tags already constrain the value, so it adds no rule.
            "discriminator" => value.get("propertyName").is_some_and(Value::is_string),
            _ => {
                return Err(bad(
                    &at,
                    format!("`{keyword}` is not a JSON Schema keyword LMSP knows"),
                ))
            }
        };
        if !ok {
            return Err(bad(
                &at,
                format!("`{keyword}` has a value JSON Schema does not allow"),
            ));
        }
    }
    Ok(())
}

fn schema_text(schema: &Value, param: &str) -> Result<JsonText, ApiError> {
    check_schema(schema, param)?;
    Ok(JsonText::parsed(schema.to_string()))
}

fn string_field(
    object: &serde_json::Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<String>, ApiError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(bad(
            &format!("{at}.{key}"),
            format!("`{key}` must be a string"),
        )),
    }
}

fn function_of(
    object: &serde_json::Map<String, Value>,
    at: &str,
    allowed: &[&str],
) -> Result<FunctionTool, ApiError> {
    if let Some(unknown) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(
            &format!("{at}.{unknown}"),
            format!("unknown field `{unknown}`"),
        ));
    }
    let name = string_field(object, "name", at)?
        .ok_or_else(|| bad(&format!("{at}.name"), "`name` is required"))?;
    let parameters = match object.get("parameters") {
        None | Some(Value::Null) => None,
        Some(schema) => Some(schema_text(schema, &format!("{at}.parameters"))?),
    };
    let strict = match object.get("strict") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(strict)) => *strict,
        Some(_) => return Err(bad(&format!("{at}.strict"), "`strict` must be a boolean")),
    };
    Ok(FunctionTool {
        name,
        description: string_field(object, "description", at)?,
        parameters,
        strict,
    })
}

fn tool_type<'v>(
    value: &'v Value,
    at: &str,
) -> Result<(&'v serde_json::Map<String, Value>, &'v str), ApiError> {
    let object = value
        .as_object()
        .ok_or_else(|| bad(at, "a tool must be an object"))?;
    let kind = object
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(&format!("{at}.type"), "`type` is required"))?;
    if kind != "function" {
        return Err(bad(
            &format!("{at}.type"),
            format!("tools of type `{kind}` are not supported by LMSP: only `function`"),
        ));
    }
    Ok((object, kind))
}

/// Responses' `tools`: `{"type": "function", "name", "description", "parameters", "strict"}`.
pub fn response_tools(tools: &[Value]) -> Result<Vec<FunctionTool>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(index, value)| {
            let at = format!("tools[{index}]");
            let (object, _) = tool_type(value, &at)?;
            function_of(
                object,
                &at,
                &["type", "name", "description", "parameters", "strict"],
            )
        })
        .collect()
}

/// Chat's `tools`: `{"type": "function", "function": {"name", "description", "parameters",
/// "strict"}}`.
pub fn chat_tools(tools: &[Value]) -> Result<Vec<FunctionTool>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(index, value)| {
            let at = format!("tools[{index}]");
            let (object, _) = tool_type(value, &at)?;
            if let Some(unknown) = object.keys().find(|k| *k != "type" && *k != "function") {
                return Err(bad(
                    &format!("{at}.{unknown}"),
                    format!("unknown field `{unknown}`"),
                ));
            }
            let function = object
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| bad(&format!("{at}.function"), "`function` must be an object"))?;
            function_of(
                function,
                &format!("{at}.function"),
                &["name", "description", "parameters", "strict"],
            )
        })
        .collect()
}

/// `tool_choice`: `auto`, `none`, `required`, `{"type": "function", "name"}` or Chat's
/// `{"type": "function", "function": {"name"}}`.
pub fn tool_choice(value: Option<&Value>) -> Result<Option<ToolChoice>, ApiError> {
    let invalid = || {
        bad(
            "tool_choice",
            "`tool_choice` must be auto, none, required or {\"type\": \"function\", \"name\"}",
        )
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(choice)) => match choice.as_str() {
            "auto" => Ok(Some(ToolChoice::Auto)),
            "none" => Ok(Some(ToolChoice::None)),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(invalid()),
        },
        Some(Value::Object(object)) => {
            match object.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(bad(
                        "tool_choice.type",
                        format!("a tool choice of type `{other}` is not supported by LMSP"),
                    ))
                }
                None => return Err(invalid()),
            }
            let name = object
                .get("name")
                .or_else(|| object.get("function").and_then(|f| f.get("name")))
                .and_then(Value::as_str)
                .ok_or_else(invalid)?;
            Ok(Some(ToolChoice::Function(name.to_owned())))
        }
        Some(_) => Err(invalid()),
    }
}

/// A format object (`{"type": "text" | "json_object" | "json_schema", …}`); `schema_at` is where
/// a json_schema's fields are (the object itself for Responses, its `json_schema` for Chat).
fn format_of(value: &Value, at: &str, nested: bool) -> Result<OutputFormat, ApiError> {
    let object = value
        .as_object()
        .ok_or_else(|| bad(at, "the format must be an object"))?;
    match object.get("type").and_then(Value::as_str) {
        Some("text") => Ok(OutputFormat::Text),
        Some("json_object") => Ok(OutputFormat::JsonObject),
        Some("json_schema") => {
            let (fields, fields_at) = if nested {
                let inner = object
                    .get("json_schema")
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        bad(&format!("{at}.json_schema"), "`json_schema` is required")
                    })?;
                (inner, format!("{at}.json_schema"))
            } else {
                (object, at.to_owned())
            };
            let name = string_field(fields, "name", &fields_at)?
                .ok_or_else(|| bad(&format!("{fields_at}.name"), "`name` is required"))?;
            let schema = fields
                .get("schema")
                .ok_or_else(|| bad(&format!("{fields_at}.schema"), "`schema` is required"))?;
            let schema = schema_text(schema, &format!("{fields_at}.schema"))?;
            let strict = fields
                .get("strict")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            Ok(OutputFormat::JsonSchema {
                name,
                schema,
                strict,
            })
        }
        Some(other) => Err(bad(
            &format!("{at}.type"),
            format!("an output format of type `{other}` is not supported by LMSP"),
        )),
        None => Err(bad(&format!("{at}.type"), "`type` is required")),
    }
}

/// Responses' `text.format`.
pub fn text_format(value: Option<&Value>) -> Result<OutputFormat, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(OutputFormat::Text),
        Some(value) => format_of(value, "text.format", false),
    }
}

/// Chat's `response_format`.
pub fn response_format(value: Option<&Value>) -> Result<OutputFormat, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(OutputFormat::Text),
        Some(value) => format_of(value, "response_format", true),
    }
}

/// Chat's `stop`: a string, a list of strings, or `null`.
pub fn stop(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(stop)) => Ok(vec![stop.clone()]),
        Some(Value::Array(list)) => list
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad("stop", "`stop` must be a string or a list of strings"))
            })
            .collect(),
        Some(_) => Err(bad("stop", "`stop` must be a string or a list of strings")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(error: ApiError) -> Option<String> {
        error.param
    }

    #[test]
    fn a_malformed_schema_is_refused_naming_the_keyword() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integr"}}});
        let error = check_schema(&schema, "text.format.schema").unwrap_err();
        assert_eq!(
            param(error).as_deref(),
            Some("text.format.schema.properties.n.type")
        );
        let unknown = json!({"type": "string", "colour": "red"});
        assert_eq!(
            param(check_schema(&unknown, "s").unwrap_err()).as_deref(),
            Some("s.colour")
        );
        let fine = json!({"type": "object", "properties": {"a": {"type": ["string", "null"]},
            "b": {"type": "array", "items": {"enum": [1, 2]}}}, "required": ["a"],
            "additionalProperties": false});
        assert!(check_schema(&fine, "s").is_ok());
    }

    /// What pydantic writes for `Union[A, B] = Field(discriminator="kind")`.
    #[test]
    fn a_discriminated_union_is_accepted_and_a_malformed_discriminator_is_refused_i9() {
        let union = json!({"type": "object", "properties": {"d": {
            "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
            "discriminator": {"propertyName": "kind",
                              "mapping": {"a": "#/$defs/A", "b": "#/$defs/B"}}}},
            "$defs": {"A": {"type": "object", "properties": {"kind": {"const": "a"}}},
                      "B": {"type": "object", "properties": {"kind": {"const": "b"}}}}});
        assert!(check_schema(&union, "s").is_ok());
        let malformed = json!({"oneOf": [{"type": "string"}], "discriminator": "kind"});
        assert_eq!(
            param(check_schema(&malformed, "s").unwrap_err()).as_deref(),
            Some("s.discriminator")
        );
    }

    #[test]
    fn a_tool_of_another_type_is_refused_by_name() {
        let error = response_tools(&[json!({"type": "web_search"})]).unwrap_err();
        assert_eq!(param(error).as_deref(), Some("tools[0].type"));
        let chat = chat_tools(&[json!({"type": "function", "function": {"name": "f",
            "parameters": {"type": "object"}}})])
        .unwrap();
        assert_eq!(chat[0].name, "f");
    }

    #[test]
    fn every_tool_choice_shape_is_read() {
        assert_eq!(
            tool_choice(Some(&json!("required"))).unwrap(),
            Some(ToolChoice::Required)
        );
        assert_eq!(
            tool_choice(Some(
                &json!({"type": "function", "function": {"name": "f"}})
            ))
            .unwrap(),
            Some(ToolChoice::Function("f".into()))
        );
        assert!(tool_choice(Some(&json!({"type": "file_search"}))).is_err());
    }
}
