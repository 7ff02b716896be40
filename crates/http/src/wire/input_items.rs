//! A response's input items (`GET /v1/responses/{id}/input_items`, OpenAI's shape): the
//! conversation its task was given, item by item. Each item's id is derived from the task and
//! the item's place, so it needs no storage and never changes.

use serde::Serialize;
use utoipa::ToSchema;

use lmsp_domain::{Role, Task};

use crate::wire::{list_of, Listed};

/// A piece of a message's content.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type")]
pub enum InputContent {
    /// Text of a `user`, `system` or `developer` message.
    #[serde(rename = "input_text")]
    InputText {
        /// The text.
        text: String,
    },
    /// Text of an earlier `assistant` turn.
    #[serde(rename = "output_text")]
    OutputText {
        /// The text.
        text: String,
        /// Always empty.
        annotations: Vec<serde_json::Value>,
    },
}

/// One input item.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type")]
pub enum InputItem {
    /// A message.
    #[serde(rename = "message")]
    Message {
        /// Its id.
        id: String,
        /// `user`, `system`, `developer` or `assistant`.
        role: &'static str,
        /// Its text.
        content: Vec<InputContent>,
        /// Always `completed`.
        status: &'static str,
    },
    /// A call an earlier assistant turn made.
    #[serde(rename = "function_call")]
    FunctionCall {
        /// Its id.
        id: String,
        /// The call's id, which its output names.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments, JSON text.
        arguments: String,
        /// Always `completed`.
        status: &'static str,
    },
    /// A tool's answer to a call.
    #[serde(rename = "function_call_output")]
    FunctionCallOutput {
        /// Its id.
        id: String,
        /// The call it answers.
        call_id: String,
        /// The answer.
        output: String,
        /// Always `completed`.
        status: &'static str,
    },
}

impl InputItem {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            InputItem::Message { id, .. }
            | InputItem::FunctionCall { id, .. }
            | InputItem::FunctionCallOutput { id, .. } => id,
        }
    }
}

impl Listed for InputItem {
    fn list_id(&self) -> &str {
        self.id()
    }
}

list_of!(
    /// A page of input items, in the order asked for.
    InputItemList of InputItem, with ids
);

/// Every input item of `task`'s request, oldest first: its messages (with the earlier turns of
/// a response it continued), an assistant turn's calls after its text, a tool's answers.
pub fn input_items(task: &Task) -> Vec<InputItem> {
    let mut items = Vec::new();
    for message in task.spec.input.messages() {
        let place = items.len();
        let id = |kind: &str| format!("{kind}_in{}{place:04}", task.id.ulid());
        match message.role {
            Role::Tool => items.push(InputItem::FunctionCallOutput {
                id: id("fco"),
                call_id: message.tool_call_id.clone().unwrap_or_default(),
                output: message.content.clone(),
                status: "completed",
            }),
            Role::Assistant => {
                if !message.content.is_empty() || message.tool_calls.is_empty() {
                    items.push(InputItem::Message {
                        id: id("msg"),
                        role: "assistant",
                        content: vec![InputContent::OutputText {
                            text: message.content.clone(),
                            annotations: Vec::new(),
                        }],
                        status: "completed",
                    });
                }
                for call in &message.tool_calls {
                    let place = items.len();
                    items.push(InputItem::FunctionCall {
                        id: format!("fc_in{}{place:04}", task.id.ulid()),
                        call_id: call.call_id.clone(),
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                        status: "completed",
                    });
                }
            }
            role => items.push(InputItem::Message {
                id: id("msg"),
                role: role.as_str(),
                content: vec![InputContent::InputText {
                    text: message.content.clone(),
                }],
                status: "completed",
            }),
        }
    }
    items
}
