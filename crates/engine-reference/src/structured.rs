//! The reference engine's deterministic answers to tools and structured outputs, so that clients
//! can be tested without a model.
//!
//! The rule: with `tool_choice` `required` or a named function, the run calls that function (the
//! first tool for `required`); with `auto` and tools, it calls the first tool unless the
//! conversation's last message is a tool's answer; the call's arguments are the smallest valid
//! instance of the tool's `parameters`. Otherwise, with a `json_schema` format the text is the
//! smallest valid instance of the schema, with `json_object` it is `{}`. The output is cut into
//! pieces of at most [`PIECE_CHARS`] characters, each one token.
//!
//! The instance is built to be valid by construction, so the engine takes only the keywords it
//! builds for ([`BUILT`]; types, `const`, `enum`, `$ref`, `anyOf`, `oneOf`, a one-schema
//! `allOf`, numbers' bounds and `multipleOf`, strings' lengths and a few formats, arrays' items,
//! counts and `uniqueItems`, objects' properties, `required`, `additionalProperties` and
//! counts). Any other keyword (`pattern`, `if`/`then`/`else`, `not`, `patternProperties`, …), an
//! unknown `format`, or constraints no value meets (`minimum` above `maximum`, …) is refused
//! before the task is created ([`check_controls`], through `Engine::check`): a 400 naming the
//! keyword, e.g. `text.format.schema.properties.a.pattern`, never an answer that does not
//! validate.

use std::cell::Cell;

use serde_json::{Map, Number, Value};

use lmsp_domain::ports::Unsupported;
// The keywords that constrain nothing.
use lmsp_domain::{Controls, FunctionTool, JsonText, OutputFormat, Role, TaskSpec, ToolChoice};
use lmsp_engine_kit::SCHEMA_ANNOTATIONS as ANNOTATIONS;

/// The most characters in one piece (one token) of a scripted output.
pub const PIECE_CHARS: usize = 4;

/// How deep a schema is followed (`$ref` loops end here).
const MAX_DEPTH: usize = 32;

/// The most characters, items or properties the engine writes for a minimum.
const MAX_COUNT: u64 = 4096;

/// The most schema nodes one answer visits, building and checking together. Alternatives are
/// tried in turn and counts multiply (an `anyOf` of `$ref`s back to itself, arrays of arrays
/// each with a `minItems`), so without a bound a small schema could ask for billions of steps
/// on the thread that checks a request; past this one it is refused instead (a 400), and an
/// answer's cost stays bounded whatever the schema.
const MAX_WORK: u64 = 200_000;

thread_local! {
    /// The nodes the current answer has visited ([`MAX_WORK`]). Building and checking are
    /// synchronous, so one answer runs on one thread from [`answer`]'s reset to its end.
    static WORK: Cell<u64> = const { Cell::new(0) };
}

/// Counts one more node of the current answer; whether it is still within [`MAX_WORK`].
fn within_work() -> bool {
    WORK.with(|work| {
        let spent = work.get().saturating_add(1);
        work.set(spent);
        spent <= MAX_WORK
    })
}

/// The keywords whose instances the engine builds.
pub const BUILT: &[&str] = &[
    "type",
    "const",
    "enum",
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "format",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
];

/// The string formats the engine writes, each with the string it writes.
const FORMATS: &[(&str, &str)] = &[
    ("date-time", "1970-01-01T00:00:00Z"),
    ("date", "1970-01-01"),
    ("time", "00:00:00Z"),
    ("email", "a@example.com"),
    ("uuid", "00000000-0000-0000-0000-000000000000"),
    ("uri", "https://example.com"),
    ("hostname", "example.com"),
    ("ipv4", "127.0.0.1"),
    ("ipv6", "::1"),
];

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
    /// The script of `spec`, or `None` for free text; a schema the engine cannot answer with a
    /// valid instance is refused (as [`check_controls`] refuses it).
    pub fn of(spec: &TaskSpec) -> Result<Option<Self>, Unsupported> {
        let controls = &spec.controls;
        if let Some((index, tool)) = called_tool(spec, controls) {
            let arguments = tool_arguments(index, tool)?;
            return Ok(Some(Script::Call {
                name: tool.name.clone(),
                arguments: arguments.to_string(),
            }));
        }
        Ok(match &controls.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(Script::Json(String::from("{}"))),
            OutputFormat::JsonSchema { schema, .. } => {
                Some(Script::Json(format_instance(schema)?.to_string()))
            }
        })
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

/// Checks that the engine answers every schema of `controls` (the format's, every tool's
/// parameters) with a valid instance; the error names the keyword, `text.format.schema…` or
/// `tools[i].parameters…` (`text.format.schema.properties.a.pattern`).
pub fn check_controls(controls: &Controls) -> Result<(), Unsupported> {
    if let OutputFormat::JsonSchema { schema, .. } = &controls.format {
        format_instance(schema)?;
    }
    for (index, tool) in controls.tools.iter().enumerate() {
        tool_arguments(index, tool)?;
    }
    Ok(())
}

/// The smallest valid instance of a `json_schema` format's schema; a refusal names the keyword
/// under `text.format.schema`.
fn format_instance(schema: &JsonText) -> Result<Value, Unsupported> {
    instance(schema).map_err(|refusal| refusal.at("text.format.schema"))
}

/// The arguments a call of tool `index` writes; a refusal names the keyword under
/// `tools[index].parameters`.
fn tool_arguments(index: usize, tool: &FunctionTool) -> Result<Value, Unsupported> {
    arguments(tool.parameters.as_ref())
        .map_err(|refusal| refusal.at(&format!("tools[{index}].parameters")))
}

/// Why a schema gets no instance: where (dot-separated, from the schema's root, down to the
/// keyword) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The place of the keyword at fault in the schema (`properties.a.pattern`; empty: the
    /// schema itself).
    pub place: String,
    /// Human text.
    pub reason: String,
}

impl Refusal {
    /// The refusal of a schema that sits at `field` of the request.
    fn at(self, field: &str) -> Unsupported {
        let param = join(field, &self.place);
        Unsupported {
            message: format!(
                "the reference engine cannot answer the schema at `{param}` with a valid instance: {}",
                self.reason
            ),
            param,
        }
    }
}

fn join(at: &str, part: &str) -> String {
    match (at.is_empty(), part.is_empty()) {
        (true, _) => part.to_owned(),
        (_, true) => at.to_owned(),
        _ => format!("{at}.{part}"),
    }
}

fn refuse(at: &str, keyword: &str, reason: impl Into<String>) -> Refusal {
    Refusal {
        place: join(at, keyword),
        reason: reason.into(),
    }
}

/// The smallest valid instance of the schema `text`.
fn instance(text: &JsonText) -> Result<Value, Refusal> {
    let schema: Value = serde_json::from_str(text.as_str())
        .map_err(|error| refuse("", "", format!("it is not JSON ({error})")))?;
    answer(&schema)
}

/// A function's arguments: the smallest valid instance of its parameters, an object.
fn arguments(parameters: Option<&JsonText>) -> Result<Value, Refusal> {
    let Some(text) = parameters else {
        return Ok(Value::Object(Map::new()));
    };
    let schema: Value = serde_json::from_str(text.as_str())
        .map_err(|error| refuse("", "", format!("it is not JSON ({error})")))?;
    match answer(&schema)? {
        object @ Value::Object(_) => Ok(object),
        _ if valid(&Value::Object(Map::new()), &schema, &schema, 0) => {
            Ok(Value::Object(Map::new()))
        }
        _ => Err(refuse(
            "",
            "type",
            "a function's arguments are an object, and no object is an instance",
        )),
    }
}

/// The smallest valid instance of `schema`: its keywords checked, built, then checked again.
fn answer(schema: &Value) -> Result<Value, Refusal> {
    WORK.with(|work| work.set(0));
    check_keywords(schema, "")?;
    let built = build(schema, schema, "", 0, 0)?;
    if valid(&built, schema, schema, 0) {
        Ok(built)
    } else {
        Err(refuse("", "", "no instance of it could be built"))
    }
}

/// The tool a run calls under the rule of the module documentation, with its index.
fn called_tool<'a>(spec: &TaskSpec, controls: &'a Controls) -> Option<(usize, &'a FunctionTool)> {
    let first = controls.callable_tools().into_iter().next()?;
    let index = controls
        .tools
        .iter()
        .position(|tool| tool.name == first.name)
        .unwrap_or(0);
    let answered = spec
        .conversation()
        .last()
        .is_some_and(|message| message.role == Role::Tool);
    match controls.tool_choice {
        ToolChoice::Required | ToolChoice::Function(_) => Some((index, first)),
        ToolChoice::Auto if !answered => Some((index, first)),
        _ => None,
    }
}

/// Resolves a local `$ref` (`#/$defs/…`, `#/definitions/…`, any JSON pointer into the root).
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

/// The place of a `$ref`'s target (`#/$defs/a` is `$defs.a`).
fn reference_place(reference: &str) -> String {
    reference
        .trim_start_matches('#')
        .split('/')
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(".")
}

/// Refuses, anywhere in `schema`, a keyword the engine does not build for, or one it builds only
/// alone.
fn check_keywords(schema: &Value, at: &str) -> Result<(), Refusal> {
    let object = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(object) => object,
        _ => return Err(refuse(at, "", "a schema is an object or a boolean")),
    };
    let constraining = |allowed: &[&str]| {
        object
            .keys()
            .find(|key| !ANNOTATIONS.contains(&key.as_str()) && !allowed.contains(&key.as_str()))
            .cloned()
    };
    if let Some(key) = constraining(BUILT) {
        return Err(refuse(
            at,
            &key,
            format!("the reference engine cannot build an instance that surely follows `{key}`"),
        ));
    }
    for keyword in ["$ref", "anyOf", "oneOf", "allOf"] {
        if object.contains_key(keyword) {
            if let Some(other) = constraining(&[keyword]) {
                return Err(refuse(
                    at,
                    &other,
                    format!("it is not built beside {keyword}"),
                ));
            }
        }
    }
    for keyword in ["const", "enum"] {
        if object.contains_key(keyword) {
            if let Some(other) = constraining(&[keyword, "type"]) {
                return Err(refuse(
                    at,
                    &other,
                    format!("it is not built beside {keyword}"),
                ));
            }
        }
    }
    if object
        .get("allOf")
        .and_then(Value::as_array)
        .is_some_and(|all| all.len() > 1)
    {
        return Err(refuse(at, "allOf", "only an allOf of one schema is built"));
    }
    if let Some(multiple) = object.get("multipleOf") {
        if multiple.as_f64().is_none_or(|m| m <= 0.0 || !m.is_finite()) {
            return Err(refuse(at, "multipleOf", "it must be a number above 0"));
        }
    }
    if let Some(format) = object.get("format") {
        let known = format
            .as_str()
            .is_some_and(|f| FORMATS.iter().any(|(name, _)| *name == f));
        if !known {
            let names: Vec<&str> = FORMATS.iter().map(|(name, _)| *name).collect();
            return Err(refuse(
                at,
                "format",
                format!("the formats built are {}", names.join(", ")),
            ));
        }
    }
    for keyword in ["properties", "$defs", "definitions"] {
        for (name, inner) in object
            .get(keyword)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            check_keywords(inner, &join(at, &format!("{keyword}.{name}")))?;
        }
    }
    for keyword in ["additionalProperties", "items"] {
        if let Some(inner) = object.get(keyword) {
            check_keywords(inner, &join(at, keyword))?;
        }
    }
    for keyword in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        for (index, inner) in object
            .get(keyword)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            check_keywords(inner, &join(at, &format!("{keyword}.{index}")))?;
        }
    }
    Ok(())
}

/// The refusal of a schema asked for more distinct instances than the engine builds.
fn no_more(at: &str) -> Refusal {
    refuse(
        at,
        "",
        "the reference engine builds no more distinct instances of it",
    )
}

/// The instance number `n` (0: the smallest; the others all distinct from each other) of
/// `schema`, whose keywords [`check_keywords`] took and whose `$ref`s point into `root`.
fn build(schema: &Value, root: &Value, at: &str, depth: usize, n: usize) -> Result<Value, Refusal> {
    if !within_work() {
        return Err(refuse(
            at,
            "",
            "building an instance of it takes more steps than the reference engine takes for \
             one answer",
        ));
    }
    let object = match schema {
        Value::Bool(true) => return Ok(any(n)),
        Value::Bool(false) => return Err(refuse(at, "", "the schema `false` has no instance")),
        Value::Object(object) => object,
        _ => return Err(refuse(at, "", "a schema is an object or a boolean")),
    };
    if depth > MAX_DEPTH {
        return Err(refuse(at, "$ref", "the schema nests deeper than 32 levels"));
    }
    if let Some(constant) = object.get("const") {
        return match (n, type_allows(object, constant)) {
            (0, true) => Ok(constant.clone()),
            (0, false) => Err(refuse(
                at,
                "const",
                "the constant is not of the schema's type",
            )),
            _ => Err(no_more(at)),
        };
    }
    if let Some(values) = object.get("enum").and_then(Value::as_array) {
        let mut distinct: Vec<&Value> = Vec::new();
        for value in values {
            if type_allows(object, value) && !distinct.iter().any(|d| json_eq(d, value)) {
                distinct.push(value);
            }
        }
        return match distinct.get(n) {
            Some(value) => Ok((*value).clone()),
            None if distinct.is_empty() => Err(refuse(
                at,
                "enum",
                "no value of the enum is of the schema's type",
            )),
            None => Err(no_more(at)),
        };
    }
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        let target = resolve(root, reference).ok_or_else(|| {
            refuse(
                at,
                "$ref",
                format!("{reference} names nothing in the schema"),
            )
        })?;
        return build(target, root, &reference_place(reference), depth + 1, n);
    }
    if let Some(alternatives) = object.get("anyOf").and_then(Value::as_array) {
        let mut first_refusal = None;
        for (index, alternative) in alternatives.iter().enumerate() {
            match build(
                alternative,
                root,
                &join(at, &format!("anyOf.{index}")),
                depth + 1,
                n,
            ) {
                Ok(value) => return Ok(value),
                Err(refusal) => {
                    first_refusal.get_or_insert(refusal);
                }
            }
        }
        return Err(first_refusal.unwrap_or_else(|| refuse(at, "anyOf", "it has no alternative")));
    }
    if let Some(alternatives) = object.get("oneOf").and_then(Value::as_array) {
        for (index, alternative) in alternatives.iter().enumerate() {
            let place = join(at, &format!("oneOf.{index}"));
            let Ok(value) = build(alternative, root, &place, depth + 1, n) else {
                continue;
            };
            let others = alternatives
                .iter()
                .enumerate()
                .filter(|(other, _)| *other != index)
                .any(|(_, other)| valid(&value, other, root, depth + 1));
            if !others {
                return Ok(value);
            }
        }
        return Err(refuse(
            at,
            "oneOf",
            "no alternative has an instance the others do not take",
        ));
    }
    if let Some(only) = object
        .get("allOf")
        .and_then(Value::as_array)
        .and_then(|all| all.first())
    {
        return build(only, root, &join(at, "allOf.0"), depth + 1, n);
    }
    let kinds: Vec<&str> = match object.get("type") {
        Some(Value::String(kind)) => vec![kind.as_str()],
        Some(Value::Array(kinds)) => {
            let mut kinds: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
            // The smallest instance is `null` when it may be.
            kinds.sort_by_key(|kind| *kind != "null");
            kinds
        }
        _ => vec![inferred_type(object)],
    };
    let mut first_refusal = None;
    for kind in kinds {
        let built = match kind {
            "null" if n == 0 => Ok(Value::Null),
            "boolean" if n < 2 => Ok(Value::Bool(n == 1)),
            "integer" => number(object, true, at, n),
            "number" => number(object, false, at, n),
            "string" => string(object, at, n),
            // One array or object each: the smallest.
            "array" if n == 0 => array(object, root, at, depth),
            "object" if n == 0 => properties(object, root, at, depth),
            "any" => Ok(any(n)),
            _ => Err(no_more(at)),
        };
        match built {
            Ok(value) => return Ok(value),
            Err(refusal) => {
                first_refusal.get_or_insert(refusal);
            }
        }
    }
    Err(first_refusal.unwrap_or_else(|| refuse(at, "type", "it names no type")))
}

/// The type of a schema without one: the first whose keywords it has (`any`: none).
fn inferred_type(object: &Map<String, Value>) -> &'static str {
    let has = |keys: &[&str]| keys.iter().any(|key| object.contains_key(*key));
    if has(&["properties", "required", "minProperties", "maxProperties"])
        || object
            .get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(true))
    {
        "object"
    } else if has(&[
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "uniqueItems",
    ]) {
        "array"
    } else if has(&["minLength", "maxLength", "format"]) {
        "string"
    } else if has(&[
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    ]) {
        "number"
    } else {
        "any"
    }
}

/// Value number `n` of any type: `null`, `false`, `true`, then 0, 1, 2, …
fn any(n: usize) -> Value {
    match n {
        0 => Value::Null,
        1 => Value::Bool(false),
        2 => Value::Bool(true),
        n => Value::from(n - 3),
    }
}

/// A bound of a number: its value, whether it is exclusive, and its keyword.
type Bound<'a> = (f64, bool, &'a str);

/// The tighter of a schema's two bounds on one side (`above`: the lower bound).
fn bound<'a>(
    object: &Map<String, Value>,
    inclusive: &'a str,
    exclusive: &'a str,
    above: bool,
) -> Option<Bound<'a>> {
    let inclusive = object
        .get(inclusive)
        .and_then(Value::as_f64)
        .map(|b| (b, false, inclusive));
    let exclusive = object
        .get(exclusive)
        .and_then(Value::as_f64)
        .map(|b| (b, true, exclusive));
    match (inclusive, exclusive) {
        (Some(i), Some(e)) => {
            let tighter = if above { e.0 >= i.0 } else { e.0 <= i.0 };
            Some(if tighter { e } else { i })
        }
        (one, other) => one.or(other),
    }
}

/// Number `n` of a number schema: the multiple of `multipleOf` (of 1 for an integer) nearest 0
/// within its bounds, then the next ones.
fn number(
    object: &Map<String, Value>,
    integer: bool,
    at: &str,
    n: usize,
) -> Result<Value, Refusal> {
    let lower = bound(object, "minimum", "exclusiveMinimum", true);
    let upper = bound(object, "maximum", "exclusiveMaximum", false);
    let above =
        |v: f64| lower.is_none_or(|(b, exclusive, _)| if exclusive { v > b } else { v >= b });
    let below =
        |v: f64| upper.is_none_or(|(b, exclusive, _)| if exclusive { v < b } else { v <= b });
    let fits = |v: f64| above(v) && below(v);
    if let (Some(low), Some(high)) = (lower, upper) {
        if low.0 > high.0 || (low.0 == high.0 && (low.1 || high.1)) {
            return Err(refuse(
                at,
                low.2,
                format!(
                    "no number lies between {} {} and {} {}",
                    low.2, low.0, high.2, high.0
                ),
            ));
        }
    }
    let multiple = object.get("multipleOf").and_then(Value::as_f64);
    let step = match (multiple, integer) {
        (Some(m), true) if m.fract() == 0.0 => Some(m),
        // Every integer is a multiple of 1/k.
        (Some(m), true) if (1.0 / m).fract() == 0.0 => Some(1.0),
        (Some(_), true) => {
            return Err(refuse(
                at,
                "multipleOf",
                "an integer's multipleOf is built when it is an integer or 1/k",
            ))
        }
        (Some(m), false) => Some(m),
        (None, true) => Some(1.0),
        (None, false) => None,
    };
    let value = match step {
        Some(step) => {
            on_grid(step, (lower, upper), (&above, &below), n).ok_or_else(|| match multiple {
                Some(m) if n == 0 => refuse(
                    at,
                    "multipleOf",
                    format!("no multiple of {m} lies within the bounds"),
                ),
                None if n == 0 => refuse(
                    at,
                    lower.map_or("maximum", |l| l.2),
                    "no integer lies within the bounds",
                ),
                _ => no_more(at),
            })?
        }
        None => off_grid((lower, upper), &fits, n).ok_or_else(|| no_more(at))?,
    };
    let exact = multiple.is_none_or(|m| (value / m).fract() == 0.0);
    if !fits(value) || !exact {
        return Err(refuse(
            at,
            "multipleOf",
            "its multiples are not exact in floating point",
        ));
    }
    if integer {
        // `value` is a whole number well inside i64 (the grid stops at 2^52).
        Ok(Value::from(value as i64))
    } else {
        Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| no_more(at))
    }
}

/// Multiple number `n` of `step` within the bounds: from the one nearest 0 upwards, then
/// downwards.
fn on_grid(
    step: f64,
    (lower, upper): (Option<Bound<'_>>, Option<Bound<'_>>),
    (above, below): (&dyn Fn(f64) -> bool, &dyn Fn(f64) -> bool),
    n: usize,
) -> Option<f64> {
    const LIMIT: f64 = 4_503_599_627_370_496.0; // 2^52
    let limit = (LIMIT / step.max(1.0)).floor();
    // The first multiple above the lower bound and the last below the upper: a step or two
    // from the division's, whatever its rounding.
    let kmin = match lower {
        None => -limit,
        Some((b, _, _)) => {
            let start = (b / step).ceil() - 1.0;
            (0..4)
                .map(|i| start + f64::from(i))
                .find(|k| above(k * step))?
        }
    }
    .max(-limit);
    let kmax = match upper {
        None => limit,
        Some((b, _, _)) => {
            let start = (b / step).floor() + 1.0;
            (0..4)
                .map(|i| start - f64::from(i))
                .find(|k| below(k * step))?
        }
    }
    .min(limit);
    if kmin > kmax {
        return None;
    }
    let k0 = 0.0_f64.clamp(kmin, kmax);
    let n = n as f64;
    let up = kmax - k0;
    let k = if n <= up { k0 + n } else { k0 - (n - up) };
    (k >= kmin).then_some(k * step)
}

/// Number `n` of a number schema without `multipleOf`: 0, else its inclusive bound, else the
/// first whole number past an exclusive one (or the middle of the range); then one further
/// from 0 each.
fn off_grid(
    (lower, upper): (Option<Bound<'_>>, Option<Bound<'_>>),
    fits: &dyn Fn(f64) -> bool,
    n: usize,
) -> Option<f64> {
    let middle = |low: Option<Bound<'_>>, high: Option<Bound<'_>>| match (low, high) {
        (Some(low), Some(high)) => Some((low.0 + high.0) / 2.0),
        _ => None,
    };
    let (start, direction) = if fits(0.0) {
        (0.0, 1.0)
    } else if let Some((b, exclusive, _)) =
        lower.filter(
            |(b, exclusive, _)| {
                if *exclusive {
                    0.0 <= *b
                } else {
                    0.0 < *b
                }
            },
        )
    {
        let whole = b.floor() + 1.0;
        let start = if !exclusive {
            b
        } else if fits(whole) {
            whole
        } else {
            middle(lower, upper)?
        };
        (start, 1.0)
    } else {
        let (b, exclusive, _) = upper?;
        let whole = b.ceil() - 1.0;
        let start = if !exclusive {
            b
        } else if fits(whole) {
            whole
        } else {
            middle(lower, upper)?
        };
        (start, -1.0)
    };
    let value = start + direction * n as f64;
    fits(value).then_some(value)
}

/// String number `n` of a string schema: its format's string, or `minLength` letters (`a`,
/// then `b`, …: the next ones count in letters).
fn string(object: &Map<String, Value>, at: &str, n: usize) -> Result<Value, Refusal> {
    let (min, max) = counts(object, ("minLength", "maxLength"), at, "characters")?;
    let text = match object.get("format").and_then(Value::as_str) {
        Some(format) => {
            let (_, text) = FORMATS
                .iter()
                .find(|(name, _)| *name == format)
                .ok_or_else(|| refuse(at, "format", "it is not a format the engine writes"))?;
            if n > 0 {
                return Err(no_more(at));
            }
            (*text).to_owned()
        }
        None => letters(usize::try_from(min).unwrap_or(0), n),
    };
    let length = text.chars().count() as u64;
    if length < min {
        return Err(refuse(at, "minLength", "the format's string is shorter"));
    }
    if max.is_some_and(|max| length > max) {
        return Err(if n == 0 {
            refuse(at, "maxLength", "the format's string is longer")
        } else {
            no_more(at)
        });
    }
    Ok(Value::String(text))
}

/// A schema's count bounds (`minLength`/`maxLength`, …): the minimum (0 without) and the
/// maximum, refused when the minimum is above the maximum or above what the engine writes.
fn counts(
    object: &Map<String, Value>,
    (min_key, max_key): (&str, &str),
    at: &str,
    what: &str,
) -> Result<(u64, Option<u64>), Refusal> {
    let min = object.get(min_key).and_then(Value::as_u64).unwrap_or(0);
    let max = object.get(max_key).and_then(Value::as_u64);
    if max.is_some_and(|max| min > max) {
        return Err(refuse(at, min_key, format!("it is above {max_key}")));
    }
    if min > MAX_COUNT {
        return Err(refuse(
            at,
            min_key,
            format!("the reference engine writes at most {MAX_COUNT} {what}"),
        ));
    }
    Ok((min, max))
}

/// Text number `n` of at least `min` letters: `n` in base 26, `a` to `z`, padded with `a` (the
/// empty text first when `min` is 0).
fn letters(min: usize, n: usize) -> String {
    if min == 0 && n == 0 {
        return String::new();
    }
    let mut rest = if min == 0 { n - 1 } else { n };
    let mut digits = Vec::new();
    while rest > 0 {
        digits.push(rest % 26);
        rest /= 26;
    }
    digits.resize(digits.len().max(min.max(1)), 0);
    digits
        .iter()
        .rev()
        .map(|digit| char::from(b'a' + u8::try_from(*digit).unwrap_or(0)))
        .collect()
}

/// The smallest array of an array schema: `minItems` items, each the smallest instance of its
/// schema (distinct ones under `uniqueItems`).
fn array(
    object: &Map<String, Value>,
    root: &Value,
    at: &str,
    depth: usize,
) -> Result<Value, Refusal> {
    let (min, _) = counts(object, ("minItems", "maxItems"), at, "items")?;
    let prefix = object
        .get("prefixItems")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let rest = object.get("items").unwrap_or(&Value::Bool(true));
    let unique = object.get("uniqueItems") == Some(&Value::Bool(true));
    let not_distinct = || {
        refuse(
            at,
            "uniqueItems",
            format!("the reference engine cannot build {min} distinct items"),
        )
    };
    let mut items: Vec<Value> = Vec::new();
    for index in 0..usize::try_from(min).unwrap_or(0) {
        let (schema, place, variant) = match prefix.get(index) {
            Some(schema) => (schema, join(at, &format!("prefixItems.{index}")), 0),
            None => (rest, join(at, "items"), index - prefix.len()),
        };
        let variant = if unique { variant } else { 0 };
        let item = build(schema, root, &place, depth + 1, variant).map_err(|refusal| {
            if variant > 0 {
                not_distinct()
            } else {
                refusal
            }
        })?;
        if unique && items.iter().any(|earlier| json_eq(earlier, &item)) {
            return Err(not_distinct());
        }
        items.push(item);
    }
    Ok(Value::Array(items))
}

/// The smallest object of an object schema: its required properties, then as many others as
/// `minProperties` asks (its optional properties first, then further ones under
/// `additionalProperties`).
fn properties(
    object: &Map<String, Value>,
    root: &Value,
    at: &str,
    depth: usize,
) -> Result<Value, Refusal> {
    let declared = object.get("properties").and_then(Value::as_object);
    let additional = object
        .get("additionalProperties")
        .unwrap_or(&Value::Bool(true));
    let (min, max) = counts(object, ("minProperties", "maxProperties"), at, "properties")?;
    let property = |name: &str| -> Result<Value, Refusal> {
        match declared.and_then(|declared| declared.get(name)) {
            Some(schema) => build(
                schema,
                root,
                &join(at, &format!("properties.{name}")),
                depth + 1,
                0,
            ),
            None => build(
                additional,
                root,
                &join(at, "additionalProperties"),
                depth + 1,
                0,
            ),
        }
    };
    let mut instance = Map::new();
    let required = object
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str);
    for name in required {
        if additional == &Value::Bool(false) && !declared.is_some_and(|d| d.contains_key(name)) {
            return Err(refuse(
                at,
                "required",
                format!("`{name}` is not among the properties, and no other property is allowed"),
            ));
        }
        let value = property(name)?;
        instance.insert(name.to_owned(), value);
    }
    if max.is_some_and(|max| instance.len() as u64 > max) {
        return Err(refuse(
            at,
            "maxProperties",
            "the required properties are more",
        ));
    }
    let wanted = usize::try_from(min).unwrap_or(usize::MAX);
    // Optional properties, in order, those that have an instance.
    for name in declared.into_iter().flat_map(Map::keys) {
        if instance.len() >= wanted {
            break;
        }
        if !instance.contains_key(name) {
            if let Ok(value) = property(name) {
                instance.insert(name.clone(), value);
            }
        }
    }
    let mut index = 0;
    while instance.len() < wanted {
        let name = format!("property{index}");
        index += 1;
        if declared.is_some_and(|d| d.contains_key(&name)) || instance.contains_key(&name) {
            continue;
        }
        let value = property(&name)
            .map_err(|_| refuse(at, "minProperties", "no further property is allowed"))?;
        instance.insert(name, value);
    }
    Ok(Value::Object(instance))
}

/// Whether `value` is of a type the schema's `type` names (any without one).
fn type_allows(object: &Map<String, Value>, value: &Value) -> bool {
    let is = |kind: &str| match kind {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "number" => value.is_number(),
        "integer" => value.as_f64().is_some_and(|v| v.fract() == 0.0),
        _ => false,
    };
    match object.get("type") {
        Some(Value::String(kind)) => is(kind),
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).any(is),
        _ => true,
    }
}

/// JSON equality, numbers by value (`1` is `1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| json_eq(x, y)))
        }
        _ => a == b,
    }
}

/// Whether `value` follows `schema` (whose `$ref`s point into `root`), for the keywords the engine
/// builds for; `format` is not checked (taken as followed).
fn valid(value: &Value, schema: &Value, root: &Value, depth: usize) -> bool {
    if !within_work() {
        return false;
    }
    let object = match schema {
        Value::Bool(allowed) => return *allowed,
        Value::Object(object) => object,
        _ => return false,
    };
    if depth > MAX_DEPTH {
        return false;
    }
    let follows = |schema: &Value, value: &Value| valid(value, schema, root, depth + 1);
    let list = |key: &str| object.get(key).and_then(Value::as_array);
    let count = |key: &str| object.get(key).and_then(Value::as_u64);
    let number = |key: &str| object.get(key).and_then(Value::as_f64);
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        if !resolve(root, reference).is_some_and(|target| follows(target, value)) {
            return false;
        }
    }
    if object.get("const").is_some_and(|c| !json_eq(c, value))
        || list("enum").is_some_and(|values| !values.iter().any(|v| json_eq(v, value)))
        || !type_allows(object, value)
        || list("anyOf").is_some_and(|any| !any.iter().any(|s| follows(s, value)))
        || list("allOf").is_some_and(|all| !all.iter().all(|s| follows(s, value)))
        || list("oneOf").is_some_and(|one| one.iter().filter(|s| follows(s, value)).count() != 1)
    {
        return false;
    }
    match value {
        Value::Number(n) => {
            let Some(v) = n.as_f64() else { return false };
            number("minimum").is_none_or(|b| v >= b)
                && number("maximum").is_none_or(|b| v <= b)
                && number("exclusiveMinimum").is_none_or(|b| v > b)
                && number("exclusiveMaximum").is_none_or(|b| v < b)
                && number("multipleOf").is_none_or(|m| (v / m).fract() == 0.0)
        }
        Value::String(text) => {
            let length = text.chars().count() as u64;
            count("minLength").is_none_or(|min| length >= min)
                && count("maxLength").is_none_or(|max| length <= max)
        }
        Value::Array(items) => {
            let prefix = list("prefixItems").map_or(&[][..], Vec::as_slice);
            let rest = object.get("items").unwrap_or(&Value::Bool(true));
            let unique = object.get("uniqueItems") != Some(&Value::Bool(true))
                || items
                    .iter()
                    .enumerate()
                    .all(|(i, a)| items[..i].iter().all(|b| !json_eq(a, b)));
            unique
                && count("minItems").is_none_or(|min| items.len() as u64 >= min)
                && count("maxItems").is_none_or(|max| items.len() as u64 <= max)
                && items
                    .iter()
                    .enumerate()
                    .all(|(i, item)| follows(prefix.get(i).unwrap_or(rest), item))
        }
        Value::Object(map) => {
            let declared = object.get("properties").and_then(Value::as_object);
            let additional = object
                .get("additionalProperties")
                .unwrap_or(&Value::Bool(true));
            count("minProperties").is_none_or(|min| map.len() as u64 >= min)
                && count("maxProperties").is_none_or(|max| map.len() as u64 <= max)
                && list("required").is_none_or(|required| {
                    required
                        .iter()
                        .filter_map(Value::as_str)
                        .all(|name| map.contains_key(name))
                })
                && map.iter().all(|(name, value)| {
                    follows(
                        declared.and_then(|d| d.get(name)).unwrap_or(additional),
                        value,
                    )
                })
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn smallest(schema: Value) -> Value {
        let built = answer(&schema).unwrap();
        assert!(valid(&built, &schema, &schema, 0), "{built} for {schema}");
        built
    }

    /// Where the engine refuses `schema`.
    fn refused(schema: Value) -> String {
        answer(&schema).unwrap_err().place
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
        assert_eq!(refused(json!({"$ref": "#"})), "$ref");
        // A oneOf's instance is one that only its alternative takes (a tagged union's).
        let tagged = |tag: &str| {
            json!({"type": "object", "properties": {"kind": {"const": tag}},
                   "required": ["kind"]})
        };
        let union = json!({"oneOf": [tagged("a"), tagged("b")],
                           "discriminator": {"propertyName": "kind"}});
        assert_eq!(smallest(union), json!({"kind": "a"}));
        // The first alternative's instance is the second's too: the second's is taken.
        let overlapping = json!({"oneOf": [tagged("b"), {"type": "object"}]});
        assert_eq!(smallest(overlapping), json!({}));
        assert_eq!(
            refused(json!({"oneOf": [{"type": "integer"}, {"type": "integer"}]})),
            "oneOf"
        );
        assert_eq!(
            smallest(json!({"allOf": [{"type": "string", "minLength": 2}]})),
            json!("aa")
        );
    }

    /// The cases of the audit: each either builds a valid instance or is refused by name.
    #[test]
    fn every_keyword_is_built_for_or_refused_by_name() {
        assert_eq!(
            smallest(json!({"type": "integer", "multipleOf": 7, "minimum": 1})),
            json!(7)
        );
        assert_eq!(
            smallest(json!({"type": "integer", "multipleOf": 7, "maximum": -1})),
            json!(-7)
        );
        assert_eq!(
            smallest(json!({"type": "number", "multipleOf": 0.25, "exclusiveMinimum": 1})),
            json!(1.25)
        );
        assert_eq!(
            smallest(json!({"type": "object", "minProperties": 1})),
            json!({"property0": null})
        );
        assert_eq!(
            smallest(
                json!({"type": "object", "properties": {"a": {"type": "integer"}},
                            "minProperties": 1, "additionalProperties": false})
            ),
            json!({"a": 0})
        );
        assert_eq!(
            smallest(
                json!({"type": "array", "items": {"enum": [1, 2]}, "minItems": 2,
                            "uniqueItems": true})
            ),
            json!([1, 2])
        );
        assert_eq!(
            smallest(
                json!({"type": "array", "items": {"type": "string", "minLength": 1},
                            "minItems": 3, "uniqueItems": true})
            ),
            json!(["a", "b", "c"])
        );
        assert_eq!(
            smallest(
                json!({"type": "array", "items": {"type": "integer", "minimum": 5},
                            "minItems": 2, "uniqueItems": true})
            ),
            json!([5, 6])
        );
        assert_eq!(
            smallest(json!({"type": "string", "format": "email"})),
            json!("a@example.com")
        );
        assert_eq!(
            smallest(json!({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.5})),
            json!(0.25)
        );
        for (schema, place) in [
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}},
                    "required": ["a"]}),
                "properties.a.pattern",
            ),
            (
                json!({"type": "string", "format": "email", "pattern": "x"}),
                "pattern",
            ),
            (
                json!({"type": "array", "items": {"enum": [1, 2]}, "minItems": 3,
                    "uniqueItems": true}),
                "uniqueItems",
            ),
            (
                json!({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}),
                "if",
            ),
            (
                json!({"type": "object", "patternProperties": {"^x": {}}, "minProperties": 1}),
                "patternProperties",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5,
                    "maximum": 1}}, "required": ["a"]}),
                "properties.a.minimum",
            ),
            (
                json!({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}),
                "multipleOf",
            ),
            (
                json!({"type": "integer", "minimum": 1.2, "maximum": 1.8}),
                "minimum",
            ),
            (
                json!({"type": "string", "format": "hostname-idn"}),
                "format",
            ),
            (
                json!({"type": "string", "minLength": 3, "maxLength": 2}),
                "minLength",
            ),
            (
                json!({"type": "object", "required": ["a"], "additionalProperties": false}),
                "required",
            ),
            (
                json!({"type": "object", "minProperties": 1, "additionalProperties": false}),
                "minProperties",
            ),
            (
                json!({"type": "object", "maxProperties": 1, "properties": {"a": {}, "b": {}},
                    "required": ["a", "b"]}),
                "maxProperties",
            ),
            (json!({"not": {"type": "null"}}), "not"),
            (
                json!({"anyOf": [{"type": "string"}], "minLength": 2}),
                "minLength",
            ),
            (
                json!({"allOf": [{"type": "string"}, {"minLength": 2}]}),
                "allOf",
            ),
            (json!({"const": 1, "type": "string"}), "const"),
            (json!({"enum": ["a"], "maxLength": 0}), "maxLength"),
            (
                json!({"$defs": {"a": {"type": "string", "pattern": "x"}}, "$ref": "#/$defs/a"}),
                "$defs.a.pattern",
            ),
            (
                json!({"type": ["null", "object"], "properties": {"a": {"contains": {}}}}),
                "properties.a.contains",
            ),
            (json!(false), ""),
        ] {
            assert_eq!(refused(schema.clone()), place, "{schema}");
        }
    }

    #[test]
    fn unsatisfiable_alternatives_and_optional_properties_are_passed_over() {
        assert_eq!(
            smallest(
                json!({"anyOf": [{"type": "integer", "minimum": 3, "maximum": 2},
                                      {"type": "string"}]})
            ),
            json!("")
        );
        assert_eq!(
            smallest(json!({"type": "object", "properties": {"never": false,
                            "b": {"type": "boolean"}}, "minProperties": 1})),
            json!({"b": false})
        );
    }

    #[test]
    fn the_controls_are_checked_with_the_field_of_each_schema() {
        let controls = Controls {
            format: OutputFormat::JsonSchema {
                name: String::from("x"),
                schema: JsonText::parsed(
                    r#"{"type":"object","properties":{"a":{"type":"string","pattern":"^a+$"}}}"#,
                ),
                strict: true,
            },
            ..Controls::default()
        };
        let refusal = check_controls(&controls).unwrap_err();
        assert_eq!(refusal.param, "text.format.schema.properties.a.pattern");
        assert!(refusal.message.contains("pattern"), "{}", refusal.message);
        let tool = |parameters: &str| FunctionTool {
            name: String::from("f"),
            description: None,
            parameters: Some(JsonText::parsed(parameters)),
            strict: true,
        };
        let controls = Controls {
            tools: vec![
                tool(r#"{"type":"object"}"#),
                tool(
                    r#"{"type":"object","properties":{"n":{"type":"integer","multipleOf":0.3}},"required":["n"]}"#,
                ),
            ],
            ..Controls::default()
        };
        assert_eq!(
            check_controls(&controls).unwrap_err().param,
            "tools[1].parameters.properties.n.multipleOf"
        );
        assert_eq!(check_controls(&Controls::default()), Ok(()));
        assert_eq!(arguments(Some(&JsonText::parsed("{}"))).unwrap(), json!({}));
        assert_eq!(
            arguments(Some(&JsonText::parsed(r#"{"type":"string"}"#)))
                .unwrap_err()
                .place,
            "type"
        );
    }

    #[test]
    fn a_schema_whose_alternatives_multiply_is_refused_in_bounded_time() {
        // Four alternatives, each the schema again: 4^32 paths if followed to the depth limit.
        let looping = json!({"$defs": {"a": {"anyOf": [
            {"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"},
            {"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}
        ]}}, "$ref": "#/$defs/a"});
        assert!(answer(&looping).is_err());
        // Arrays of arrays of arrays, 4096 items at each level: 4096^3 items.
        let wide = json!({"type": "array", "minItems": 4096, "items": {"type": "array",
            "minItems": 4096, "items": {"type": "array", "minItems": 4096}}});
        assert!(answer(&wide).is_err());
        // The budget is per answer: a plain schema after them is answered.
        assert_eq!(
            answer(&json!({"type": "array", "minItems": 2, "items": {"type": "integer"}})).unwrap(),
            json!([0, 0])
        );
    }

    #[test]
    fn letters_count_distinct_texts() {
        assert_eq!(letters(0, 0), "");
        assert_eq!(letters(0, 1), "a");
        assert_eq!(letters(2, 0), "aa");
        assert_eq!(letters(2, 27), "bb");
        assert_eq!(letters(1, 26), "ba");
        let texts: std::collections::BTreeSet<String> = (0..2000).map(|n| letters(1, n)).collect();
        assert_eq!(texts.len(), 2000);
    }

    #[test]
    fn a_script_is_cut_into_pieces_of_whole_characters() {
        let script = Script::Json(String::from("{\"é\":\"ab\"}"));
        let pieces = script.pieces();
        assert_eq!(pieces.concat(), "{\"é\":\"ab\"}");
        assert!(pieces.iter().all(|p| p.chars().count() <= PIECE_CHARS));
    }
}
