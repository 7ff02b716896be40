//! Tools, structured outputs and sampling controls a task asks for, the function calls a run
//! makes, and token log probabilities.
//!
//! JSON (a tool's `parameters`, a format's `schema`) is held as text an adapter has parsed: the
//! domain knows no JSON parser, and engines read the text with their own. The rules that need no
//! JSON (ranges, counts, names, which tool a choice names, which call an output answers) are
//! checked in [`crate::validation`].

/// The most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 4;
/// The largest `top_logprobs`.
pub const MAX_TOP_LOGPROBS: u8 = 20;
/// The largest absolute value of a penalty.
pub const MAX_PENALTY: f64 = 2.0;

/// JSON text that an adapter has parsed and checked (the domain never parses it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonText(String);

impl JsonText {
    /// Wraps text the caller has parsed as JSON.
    pub fn parsed(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A function the model may call (`{"type": "function", "name", "description", "parameters",
/// "strict"}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionTool {
    /// Its name: 1–64 of `a-z A-Z 0-9 _ -`.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object schema); `None`: any object.
    pub parameters: Option<JsonText>,
    /// Whether the arguments must follow `parameters` exactly.
    pub strict: bool,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (the default).
    #[default]
    Auto,
    /// No call: text only.
    None,
    /// At least one call of any of the tools.
    Required,
    /// A call of this tool (one of the request's tools).
    Function(String),
}

/// The form of the output text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// Free text (the default).
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON that validates against a schema.
    JsonSchema {
        /// The format's name (1–64 of `a-z A-Z 0-9 _ -`).
        name: String,
        /// The schema.
        schema: JsonText,
        /// Whether the output must follow the schema exactly.
        strict: bool,
    },
}

/// A presence or frequency penalty: a finite number from -2 to 2, compared by value. The only way
/// in is [`Penalty::new`], so it is never NaN.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Penalty(f64);

// Sound: `new` admits no NaN, so equality is reflexive.
impl Eq for Penalty {}

impl Penalty {
    /// `value` when it is finite and from -2 to 2.
    pub fn new(value: f64) -> Option<Self> {
        (value.is_finite() && value.abs() <= MAX_PENALTY).then_some(Self(value))
    }

    /// The number.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// What a task asks beyond its conversation and sampler: tools, the output's format, stop
/// strings, penalties and log probabilities. Part of the [`crate::TaskSpec`], so stored once and
/// never changed; the default asks for none of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controls {
    /// The functions the model may call (names unique).
    pub tools: Vec<FunctionTool>,
    /// Whether and which tool the model must call.
    pub tool_choice: ToolChoice,
    /// Whether a run may make more than one call (default `true`).
    pub parallel_tool_calls: bool,
    /// The form of the output text.
    pub format: OutputFormat,
    /// At most 4 non-empty strings: the text ends before the first one generated, which is not
    /// part of it.
    pub stop: Vec<String>,
    /// Penalizes tokens that appeared at all; `None`: 0.
    pub presence_penalty: Option<Penalty>,
    /// Penalizes tokens by how often they appeared; `None`: 0.
    pub frequency_penalty: Option<Penalty>,
    /// `Some(n)`: the output text's token log probabilities are asked for, each with the `n`
    /// (0–20) most likely alternatives.
    pub top_logprobs: Option<u8>,
}

impl Default for Controls {
    fn default() -> Self {
        Self {
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            format: OutputFormat::Text,
            stop: Vec::new(),
            presence_penalty: None,
            frequency_penalty: None,
            top_logprobs: None,
        }
    }
}

impl Controls {
    /// The tool named `name`.
    pub fn tool(&self, name: &str) -> Option<&FunctionTool> {
        self.tools.iter().find(|tool| tool.name == name)
    }

    /// The tools a run may call under the tool choice: none for `none` (or without tools), the
    /// named one for a named choice, all of them otherwise.
    pub fn callable_tools(&self) -> Vec<&FunctionTool> {
        match &self.tool_choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Function(name) => self.tool(name).into_iter().collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        }
    }

    /// Whether a run must call a tool (`required`, or a named tool).
    pub fn must_call(&self) -> bool {
        matches!(
            self.tool_choice,
            ToolChoice::Required | ToolChoice::Function(_)
        ) && !self.tools.is_empty()
    }

    /// Where `text` must end under the stop strings ([`stop_at`]).
    pub fn stop_at(&self, text: &str) -> Option<usize> {
        stop_at(&self.stop, text)
    }

    /// How many bytes at the end of `text` must be held back ([`stop_holdback`]).
    pub fn stop_holdback(&self, text: &str) -> usize {
        stop_holdback(&self.stop, text)
    }
}

/// Where `text` must end under the stop strings `stops`: the byte offset of the earliest stop
/// string in it, if any (empty strings are never met).
pub fn stop_at(stops: &[String], text: &str) -> Option<usize> {
    stops
        .iter()
        .filter(|stop| !stop.is_empty())
        .filter_map(|stop| text.find(stop.as_str()))
        .min()
}

/// How many bytes at the end of `text` may be the start of one of the stop strings `stops`, so
/// must be held back until the next text shows whether a stop string follows (never more than
/// the longest stop string less one byte; always at a character boundary).
pub fn stop_holdback(stops: &[String], text: &str) -> usize {
    let mut held = 0;
    for stop in stops.iter().filter(|stop| !stop.is_empty()) {
        for (cut, _) in stop.char_indices().skip(1) {
            if text.ends_with(&stop[..cut]) {
                held = held.max(cut);
            }
        }
    }
    held
}

/// A call the assistant made in an earlier turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id (`call_…`), which the tool's answer names.
    pub call_id: String,
    /// The function called.
    pub name: String,
    /// Its arguments, JSON text as the model wrote it.
    pub arguments: String,
}

/// The natural logarithm of a probability: finite and at most 0, compared by value (never NaN).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Logprob(f64);

// Sound: every constructor admits no NaN.
impl Eq for Logprob {}

impl Logprob {
    /// The floor of a log probability: what an impossible token (−∞) is given, since JSON has no
    /// infinity.
    pub const FLOOR: f64 = -9999.0;

    /// `value` when it is finite and at most 0.
    pub fn new(value: f64) -> Option<Self> {
        (value.is_finite() && value <= 0.0).then_some(Self(value))
    }

    /// `value` brought into range: NaN and values below [`Logprob::FLOOR`] (−∞) are the floor,
    /// positive values 0.
    pub fn clamped(value: f64) -> Self {
        if value.is_nan() || value < Self::FLOOR {
            Self(Self::FLOOR)
        } else {
            Self(value.min(0.0))
        }
    }

    /// The number.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// One alternative of a token: its text, bytes and log probability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopLogprob {
    /// The token's text (lossy when its bytes are not whole UTF-8 characters).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log probability.
    pub logprob: Logprob,
}

/// A generated token with its log probability and the most likely alternatives at its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenLogprob {
    /// The token's text (lossy when its bytes are not whole UTF-8 characters).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log probability.
    pub logprob: Logprob,
    /// The most likely tokens at its place, most likely first (as many as `top_logprobs` asked).
    pub top: Vec<TopLogprob>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(stop: &[&str]) -> Controls {
        Controls {
            stop: stop.iter().map(|s| (*s).to_owned()).collect(),
            ..Controls::default()
        }
    }

    #[test]
    fn the_earliest_stop_string_decides_where_text_ends() {
        let controls = stops(&["world", "lo"]);
        assert_eq!(controls.stop_at("hello world"), Some(3));
        assert_eq!(controls.stop_at("nothing here"), None);
        assert_eq!(Controls::default().stop_at("hello"), None);
    }

    #[test]
    fn a_possible_start_of_a_stop_string_is_held_back() {
        let controls = stops(&["END", "é!"]);
        assert_eq!(controls.stop_holdback("the EN"), 2);
        assert_eq!(controls.stop_holdback("the E"), 1);
        assert_eq!(controls.stop_holdback("the"), 0);
        assert_eq!(controls.stop_holdback("café"), "é".len());
    }

    #[test]
    fn penalties_and_logprobs_are_never_nan() {
        assert!(Penalty::new(f64::NAN).is_none());
        assert!(Penalty::new(2.5).is_none());
        assert_eq!(Penalty::new(-2.0).map(Penalty::get), Some(-2.0));
        assert!(Logprob::new(0.5).is_none());
        assert_eq!(Logprob::clamped(f64::NEG_INFINITY).get(), Logprob::FLOOR);
        assert_eq!(Logprob::clamped(f64::NAN).get(), Logprob::FLOOR);
        assert_eq!(Logprob::clamped(0.25).get(), 0.0);
    }

    #[test]
    fn the_tool_choice_decides_which_tools_a_run_may_call() {
        let tool = |name: &str| FunctionTool {
            name: name.into(),
            description: None,
            parameters: None,
            strict: false,
        };
        let mut controls = Controls {
            tools: vec![tool("a"), tool("b")],
            ..Controls::default()
        };
        assert_eq!(controls.callable_tools().len(), 2);
        assert!(!controls.must_call());
        controls.tool_choice = ToolChoice::Function("b".into());
        assert_eq!(controls.callable_tools()[0].name, "b");
        assert!(controls.must_call());
        controls.tool_choice = ToolChoice::None;
        assert!(controls.callable_tools().is_empty());
    }
}
