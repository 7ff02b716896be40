//! The wire shapes of tools, function calls and log probabilities, shared by the renderings:
//! OpenAI's `function_call` output item, the token log probabilities of a delta, and the native
//! events' data about a call.

use serde::Serialize;
use utoipa::ToSchema;

use lmsp_domain::{CallItem, ItemId, TokenLogprob};

use crate::wire::constant;

constant!(
    /// `"function_call"`.
    FunctionCallTag = "function_call"
);

/// A function call output item (`{"type": "function_call", "id": "fc_…", "call_id": "call_…",
/// "name", "arguments", "status"}`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionCallItem {
    // Always `function_call`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: FunctionCallTag,
    /// The item's id (`fc_…`).
    pub id: String,
    /// The call's id (`call_…`), which the tool's answer names.
    pub call_id: String,
    /// The function called.
    pub name: String,
    /// Its arguments: JSON text (so far, while `in_progress`).
    pub arguments: String,
    /// `in_progress`, `completed` or `incomplete`.
    pub status: &'static str,
}

impl FunctionCallItem {
    /// The item of a call at `item`.
    pub fn of(item: ItemId, name: &str, arguments: &str, status: &'static str) -> Self {
        Self {
            kind: FunctionCallTag::Value,
            id: item.function_call_id(),
            call_id: item.call_id(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
            status,
        }
    }

    /// The item of a complete call.
    pub fn completed(call: &CallItem) -> Self {
        Self::of(call.item, &call.name, &call.arguments, "completed")
    }
}

/// One of the most likely tokens at a place.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TopLogprobObject {
    /// The token's text.
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log probability.
    pub logprob: f64,
}

/// A generated token's log probability, with the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct LogprobObject {
    /// The token's text.
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log probability.
    pub logprob: f64,
    /// The most likely tokens at its place (as many as `top_logprobs` asked).
    pub top_logprobs: Vec<TopLogprobObject>,
}

/// The wire form of tokens' log probabilities.
pub fn logprobs(tokens: &[TokenLogprob]) -> Vec<LogprobObject> {
    tokens
        .iter()
        .map(|token| LogprobObject {
            token: token.token.clone(),
            bytes: token.bytes.clone(),
            logprob: token.logprob.get(),
            top_logprobs: token
                .top
                .iter()
                .map(|top| TopLogprobObject {
                    token: top.token.clone(),
                    bytes: top.bytes.clone(),
                    logprob: top.logprob.get(),
                })
                .collect(),
        })
        .collect()
}

/// `data` of the native `response.function_call.added` and
/// `response.function_call_arguments.delta`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CallEventData {
    /// The call's item (`fc_…`).
    pub item_id: String,
    /// The call's id (`call_…`).
    pub call_id: String,
    /// Its index in the response's `output`.
    pub output_index: u32,
    /// The function called (on `.added`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A piece of the arguments (on `.delta`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<String>,
}

impl CallEventData {
    /// The data of a call's start.
    pub fn added(item: ItemId, name: &str) -> Self {
        Self {
            item_id: item.function_call_id(),
            call_id: item.call_id(),
            output_index: item.output_index(),
            name: Some(name.to_owned()),
            delta: None,
        }
    }

    /// The data of a piece of arguments.
    pub fn delta(item: ItemId, delta: &str) -> Self {
        Self {
            item_id: item.function_call_id(),
            call_id: item.call_id(),
            output_index: item.output_index(),
            name: None,
            delta: Some(delta.to_owned()),
        }
    }
}

/// `data` of the native `response.function_call_arguments.done` and
/// `response.function_call.done`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CallDoneData {
    /// The call's item (`fc_…`).
    pub item_id: String,
    /// The call's id (`call_…`).
    pub call_id: String,
    /// Its index in the response's `output`.
    pub output_index: u32,
    /// The function called.
    pub name: String,
    /// The whole arguments.
    pub arguments: String,
}

impl CallDoneData {
    /// The data of a complete call.
    pub fn of(call: &CallItem) -> Self {
        Self {
            item_id: call.item.function_call_id(),
            call_id: call.item.call_id(),
            output_index: call.item.output_index(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        }
    }
}
