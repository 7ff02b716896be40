//! Which JSON schemas the llama engine can enforce while it samples, and the grammars it samples
//! them with.
//!
//! The grammar is llama.cpp's own: its JSON-schema-to-grammar converter (`common/
//! json-schema-to-grammar.cpp`, through `llama_cpp_2::json_schema_to_grammar`). That converter
//! silently drops what it cannot express (a `multipleOf`, a number's bounds, an `email` format, a
//! regular expression beyond its subset, …), so an output sampled with its grammar could still
//! fail the schema. [`check_schema`] therefore refuses, naming it, every keyword the converter
//! would not enforce, and accepts exactly those it does, in the places it reads them (the same
//! dispatch as its schema builder, `common/json-schema.cpp`). Annotations (`title`,
//! `description`, `default`, …) constrain nothing and are accepted anywhere.

use serde_json::{Map, Value};

// The keywords that constrain nothing.
use lmsp_engine_kit::SCHEMA_ANNOTATIONS as ANNOTATIONS;

/// Why a JSON schema cannot constrain the llama engine's output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The text is not a JSON document.
    #[error("the JSON schema is not JSON: {0}")]
    NotJson(String),
    /// A keyword the grammar cannot enforce; `at` is its place as a JSON pointer fragment
    /// (`#/properties/tags`).
    #[error("the JSON schema keyword `{keyword}` at {at} cannot be enforced by the llama engine{detail}")]
    Unsupported {
        /// The keyword, as the schema spells it.
        keyword: String,
        /// Where the schema holds it.
        at: String,
        /// Why, when it is not the keyword itself (`: ...`), else empty.
        detail: String,
    },
    /// Not a valid schema (a wrong value for a keyword, an unknown type, a `$ref` that names
    /// nothing, …).
    #[error("the JSON schema is invalid at {at}: {reason}")]
    Invalid {
        /// Where.
        at: String,
        /// What is wrong.
        reason: String,
    },
}

impl SchemaError {
    /// The unsupported keyword, when that is the error.
    pub fn keyword(&self) -> Option<&str> {
        match self {
            SchemaError::Unsupported { keyword, .. } => Some(keyword),
            _ => None,
        }
    }
}

/// String formats the converter turns into grammar rules.
const FORMATS: &[&str] = &[
    "date",
    "time",
    "date-time",
    "uuid",
    "uuid1",
    "uuid2",
    "uuid3",
    "uuid4",
    "uuid5",
];

/// Checks that every constraint of `schema` (a JSON Schema document) is one the llama engine
/// enforces while sampling, so an output sampled under it always validates. Pure (no model, no
/// I/O): the HTTP layer may call it when a request is submitted.
pub fn check_schema(schema: &str) -> Result<(), SchemaError> {
    let value: Value =
        serde_json::from_str(schema).map_err(|error| SchemaError::NotJson(error.to_string()))?;
    check_value(&value)
}

/// [`check_schema`] on a parsed document.
pub fn check_value(schema: &Value) -> Result<(), SchemaError> {
    check_node(schema, "#")?;
    grammar_of(schema).map(|_| ())
}

/// The GBNF grammar of `schema` (llama.cpp's converter), root rule `root`.
pub(crate) fn grammar_of(schema: &Value) -> Result<String, SchemaError> {
    llama_cpp_2::json_schema_to_grammar(&schema.to_string()).map_err(|error| SchemaError::Invalid {
        at: String::from("#"),
        reason: format!("llama.cpp cannot make a grammar of it ({error})"),
    })
}

fn unsupported(keyword: &str, at: &str, detail: &str) -> SchemaError {
    SchemaError::Unsupported {
        keyword: keyword.to_owned(),
        at: at.to_owned(),
        detail: if detail.is_empty() {
            String::new()
        } else {
            format!(": {detail}")
        },
    }
}

fn invalid(at: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        at: at.to_owned(),
        reason: reason.into(),
    }
}

/// Refuses the first key of `object` that is neither an annotation nor in `allowed`.
fn only(
    object: &Map<String, Value>,
    allowed: &[&str],
    at: &str,
    why: &str,
) -> Result<(), SchemaError> {
    match object
        .keys()
        .find(|key| !ANNOTATIONS.contains(&key.as_str()) && !allowed.contains(&key.as_str()))
    {
        Some(key) => Err(unsupported(key, at, why)),
        None => Ok(()),
    }
}

fn check_definitions(object: &Map<String, Value>, at: &str) -> Result<(), SchemaError> {
    for container in ["$defs", "definitions"] {
        if let Some(definitions) = object.get(container) {
            let definitions = definitions
                .as_object()
                .ok_or_else(|| invalid(at, format!("{container} must be an object")))?;
            for (name, definition) in definitions {
                check_node(definition, &format!("{at}/{container}/{name}"))?;
            }
        }
    }
    Ok(())
}

fn check_node(schema: &Value, at: &str) -> Result<(), SchemaError> {
    let object = schema
        .as_object()
        .ok_or_else(|| invalid(at, "a schema must be an object"))?;
    check_definitions(object, at)?;
    // The converter's schema builder reads the first of these it finds and nothing beside it.
    if object.contains_key("$ref") {
        return only(object, &["$ref"], at, "it is ignored beside $ref");
    }
    if object.contains_key("oneOf") {
        return Err(unsupported(
            "oneOf",
            at,
            "the grammar cannot exclude a value that matches two alternatives (use anyOf)",
        ));
    }
    if object.contains_key("allOf") {
        return Err(unsupported("allOf", at, ""));
    }
    if let Some(alternatives) = object.get("anyOf") {
        only(object, &["anyOf"], at, "it is ignored beside anyOf")?;
        let alternatives = alternatives
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid(at, "anyOf must be a non-empty array"))?;
        for (index, alternative) in alternatives.iter().enumerate() {
            check_node(alternative, &format!("{at}/anyOf/{index}"))?;
        }
        return Ok(());
    }
    match object.get("type") {
        Some(Value::Array(types)) => {
            if types.is_empty() {
                return Err(invalid(at, "type must not be empty"));
            }
            // {"type": ["a", "b"], …} is {"anyOf": [{"type": "a", …}, {"type": "b", …}]}.
            for (index, kind) in types.iter().enumerate() {
                let mut alternative = object.clone();
                alternative.insert(String::from("type"), kind.clone());
                check_typed(&alternative, &format!("{at}/type/{index}"))?;
            }
            Ok(())
        }
        _ => check_typed(object, at),
    }
}

/// A schema whose `type` is absent or one name.
fn check_typed(object: &Map<String, Value>, at: &str) -> Result<(), SchemaError> {
    if object.contains_key("const") {
        return only(object, &["const", "type"], at, "it is ignored beside const");
    }
    if let Some(values) = object.get("enum") {
        if values.as_array().is_none_or(|v| v.is_empty()) {
            return Err(invalid(at, "enum must be a non-empty array"));
        }
        return only(object, &["enum", "type"], at, "it is ignored beside enum");
    }
    let kind = match object.get("type") {
        None => None,
        Some(Value::String(kind)) => Some(kind.as_str()),
        Some(_) => return Err(invalid(at, "type must be a string or an array of strings")),
    };
    let kind = kind.unwrap_or_else(|| {
        // Without a type the structural keywords decide, in the converter's order.
        let has = |key: &str| object.contains_key(key);
        if has("properties")
            || object
                .get("additionalProperties")
                .is_some_and(|a| a != &Value::Bool(true))
        {
            "object"
        } else if has("items") || has("prefixItems") {
            "array"
        } else if has("pattern") || has("minLength") || has("maxLength") || has("format") {
            "string"
        } else {
            "any"
        }
    });
    match kind {
        "object" => check_object(object, at),
        "array" => check_array(object, at),
        "string" => check_string(object, at),
        "integer" => {
            only(
                object,
                &[
                    "type",
                    "minimum",
                    "maximum",
                    "exclusiveMinimum",
                    "exclusiveMaximum",
                ],
                at,
                "",
            )?;
            for (inclusive, exclusive) in [
                ("minimum", "exclusiveMinimum"),
                ("maximum", "exclusiveMaximum"),
            ] {
                if object.contains_key(inclusive) && object.contains_key(exclusive) {
                    return Err(unsupported(
                        exclusive,
                        at,
                        &format!("it is ignored beside {inclusive}"),
                    ));
                }
                for key in [inclusive, exclusive] {
                    if object.get(key).is_some_and(|bound| !bound.is_number()) {
                        return Err(invalid(at, format!("{key} must be a number")));
                    }
                }
            }
            Ok(())
        }
        "number" => only(object, &["type"], at, "a number's grammar has no bounds"),
        "boolean" | "null" => only(object, &["type"], at, ""),
        "any" => only(
            object,
            &["type"],
            at,
            "it applies to no type the schema names",
        ),
        other => Err(invalid(at, format!("unrecognized type {other}"))),
    }
}

fn check_object(object: &Map<String, Value>, at: &str) -> Result<(), SchemaError> {
    only(
        object,
        &["type", "properties", "required", "additionalProperties"],
        at,
        "",
    )?;
    let properties = match object.get("properties") {
        None => None,
        Some(Value::Object(properties)) => Some(properties),
        Some(_) => return Err(invalid(at, "properties must be an object")),
    };
    for (name, property) in properties.into_iter().flatten() {
        check_node(property, &format!("{at}/properties/{name}"))?;
    }
    match object.get("additionalProperties") {
        None | Some(Value::Bool(_)) => {}
        Some(schema @ Value::Object(_)) => {
            check_node(schema, &format!("{at}/additionalProperties"))?;
        }
        Some(_) => {
            return Err(invalid(
                at,
                "additionalProperties must be a boolean or a schema",
            ))
        }
    }
    if let Some(required) = object.get("required") {
        let required = required
            .as_array()
            .ok_or_else(|| invalid(at, "required must be an array"))?;
        for name in required {
            let name = name
                .as_str()
                .ok_or_else(|| invalid(at, "required must name properties"))?;
            if !properties.is_some_and(|p| p.contains_key(name)) {
                return Err(unsupported(
                    "required",
                    at,
                    &format!("`{name}` is not among the properties, and only those are generated"),
                ));
            }
        }
    }
    Ok(())
}

fn check_array(object: &Map<String, Value>, at: &str) -> Result<(), SchemaError> {
    only(
        object,
        &["type", "items", "prefixItems", "minItems", "maxItems"],
        at,
        "",
    )?;
    if object.contains_key("items") && object.contains_key("prefixItems") {
        return Err(unsupported("prefixItems", at, "it is ignored beside items"));
    }
    for key in ["minItems", "maxItems"] {
        if object
            .get(key)
            .is_some_and(|count| count.as_u64().is_none())
        {
            return Err(invalid(at, format!("{key} must be a non-negative integer")));
        }
    }
    let key = if object.contains_key("items") {
        "items"
    } else {
        "prefixItems"
    };
    match object.get(key) {
        None => Ok(()),
        Some(Value::Array(items)) => {
            // A tuple: its length is its items'.
            for bound in ["minItems", "maxItems"] {
                if object.contains_key(bound) {
                    return Err(unsupported(
                        bound,
                        at,
                        &format!("it is ignored beside a tuple of {key}"),
                    ));
                }
            }
            for (index, item) in items.iter().enumerate() {
                check_node(item, &format!("{at}/{key}/{index}"))?;
            }
            Ok(())
        }
        Some(item) => check_node(item, &format!("{at}/{key}")),
    }
}

fn check_string(object: &Map<String, Value>, at: &str) -> Result<(), SchemaError> {
    only(
        object,
        &["type", "pattern", "format", "minLength", "maxLength"],
        at,
        "",
    )?;
    for key in ["minLength", "maxLength"] {
        if object
            .get(key)
            .is_some_and(|count| count.as_u64().is_none())
        {
            return Err(invalid(at, format!("{key} must be a non-negative integer")));
        }
    }
    if let Some(format) = object.get("format") {
        let format = format
            .as_str()
            .ok_or_else(|| invalid(at, "format must be a string"))?;
        if !FORMATS.contains(&format) {
            return Err(unsupported(
                "format",
                at,
                &format!("`{format}` is not one of {}", FORMATS[..4].join(", ")),
            ));
        }
    }
    if let Some(pattern) = object.get("pattern") {
        let pattern = pattern
            .as_str()
            .ok_or_else(|| invalid(at, "pattern must be a string"))?;
        for beside in ["format", "minLength", "maxLength"] {
            if object.contains_key(beside) {
                return Err(unsupported(beside, at, "it is ignored beside pattern"));
            }
        }
        check_pattern(pattern, at)?;
    } else if object.contains_key("format") {
        for beside in ["minLength", "maxLength"] {
            if object.contains_key(beside) {
                return Err(unsupported(beside, at, "it is ignored beside format"));
            }
        }
    }
    Ok(())
}

/// A pattern the converter cannot express becomes "any string" (with only a warning on
/// stderr): its grammar is then that of a pattern it never expresses (one without anchors),
/// which is how it is recognized here.
fn check_pattern(pattern: &str, at: &str) -> Result<(), SchemaError> {
    let plain = grammar_of(&serde_json::json!({"type": "string", "pattern": "unanchored"}))?;
    let constrained = grammar_of(&serde_json::json!({"type": "string", "pattern": pattern}))
        .map_err(|_| {
            invalid(
                at,
                format!("the pattern {pattern} is not a valid regular expression"),
            )
        })?;
    if constrained == plain {
        return Err(unsupported(
            "pattern",
            at,
            &format!("llama.cpp's grammar cannot express {pattern} (anchor it with ^ and $; no lookarounds, backreferences or \\b)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyword(schema: &str) -> Option<String> {
        check_schema(schema)
            .err()
            .and_then(|e| e.keyword().map(str::to_owned))
    }

    #[test]
    fn schemas_the_grammar_enforces_are_accepted() {
        for schema in [
            r#"{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["name", "age"], "additionalProperties": false}"#,
            r#"{"type": "object"}"#,
            r#"{"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}], "description": "when"}"#,
            r##"{"$defs": {"p": {"type": "object", "properties": {"x": {"type": "number"}}}}, "type": "array", "items": {"$ref": "#/$defs/p"}}"##,
            r#"{"type": "string", "pattern": "^[a-z]+-[0-9]{2,4}$"}"#,
            r#"{"type": ["string", "null"], "title": "t"}"#,
        ] {
            assert_eq!(check_schema(schema), Ok(()), "{schema}");
        }
    }

    #[test]
    fn keywords_the_grammar_cannot_enforce_are_refused_by_name() {
        for (schema, expected) in [
            (r#"{"type": "number", "minimum": 0}"#, "minimum"),
            (r#"{"type": "integer", "multipleOf": 3}"#, "multipleOf"),
            (r#"{"type": "array", "uniqueItems": true}"#, "uniqueItems"),
            (r#"{"type": "string", "format": "email"}"#, "format"),
            (
                r#"{"oneOf": [{"type": "string"}, {"type": "integer"}]}"#,
                "oneOf",
            ),
            (r#"{"allOf": [{"type": "string"}]}"#, "allOf"),
            (
                r#"{"type": "object", "properties": {"a": {"not": {"type": "null"}}}}"#,
                "not",
            ),
            (
                r#"{"type": "object", "patternProperties": {"^x": {}}}"#,
                "patternProperties",
            ),
            (r#"{"type": "object", "required": ["a"]}"#, "required"),
            (r#"{"type": "string", "pattern": "\\bword\\b"}"#, "pattern"),
            (
                r#"{"type": "string", "pattern": "^a+$", "maxLength": 3}"#,
                "maxLength",
            ),
            (
                r##"{"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {"type": "string"}}}"##,
                "type",
            ),
        ] {
            assert_eq!(keyword(schema).as_deref(), Some(expected), "{schema}");
            let message = check_schema(schema).unwrap_err().to_string();
            assert!(message.contains(&format!("`{expected}`")), "{message}");
        }
    }

    #[test]
    fn malformed_schemas_are_invalid_not_unsupported() {
        for schema in [
            "not json",
            r#"{"type": "strnig"}"#,
            r##"{"$ref": "#/$defs/missing"}"##,
            r#"{"type": "array", "minItems": -1}"#,
            "[1]",
        ] {
            let error = check_schema(schema).unwrap_err();
            assert_eq!(error.keyword(), None, "{schema}: {error}");
        }
    }
}
