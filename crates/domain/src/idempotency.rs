//! Idempotency keys (API.md §6, I-8): the key newtype, the request digest, the stored reply.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::ids::{ClientId, TaskId};
use crate::time::Timestamp;

/// An `Idempotency-Key` that is not 1–255 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an idempotency key is 1–255 visible ASCII characters")]
pub struct InvalidIdempotencyKey;

/// A well-formed idempotency key.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses a header value: 1–255 visible ASCII characters (`!`…`~`).
    pub fn parse(text: &str) -> Result<Self, InvalidIdempotencyKey> {
        if (1..=255).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_graphic()) {
            Ok(Self(text.to_owned()))
        } else {
            Err(InvalidIdempotencyKey)
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({})", self.0)
    }
}

/// The SHA-256 of a request body's canonical JSON (keys sorted, no insignificant whitespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestDigest(pub [u8; 32]);

impl RequestDigest {
    /// The digest of a parsed JSON body, over its canonical form ([`canonical_json`]).
    pub fn of_json(body: &serde_json::Value) -> Self {
        Self(Sha256::digest(canonical_json(body).as_bytes()).into())
    }
}

/// The canonical JSON of a value: object keys sorted by their bytes, no
/// insignificant whitespace, strings and numbers as `serde_json` writes them.
///
/// Written out here rather than left to `Value::to_string`, whose key order depends on whether
/// any crate in the build turns on `serde_json`'s `preserve_order` feature.
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn write(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(fields) => {
                let mut keys: Vec<&String> = fields.keys().collect();
                keys.sort();
                out.push('{');
                for (index, key) in keys.into_iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(key.clone()).to_string());
                    out.push(':');
                    if let Some(field) = fields.get(key) {
                        write(field, out);
                    }
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            leaf => out.push_str(&leaf.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// Which endpoint a key belongs to; a key is scoped to client, method and path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdempotencyScope {
    /// The client that sent the key.
    pub client_id: ClientId,
    /// The HTTP method, e.g. `POST`.
    pub method: String,
    /// The path, e.g. `/v1/responses`.
    pub path: String,
}

/// The first reply to a request, stored to be sent again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReply {
    /// Its HTTP status.
    pub status: u16,
    /// Its body, exactly as sent.
    pub body: String,
    /// Its `Location` header, if any.
    pub location: Option<String>,
    /// The task it created, if any (`Lmsp-Task-Id`).
    pub task_id: Option<TaskId>,
    /// Set when the reply is not stored whole but given again from its task (a synchronous or a
    /// streaming request, whose key commits with the task before the reply is known); `status`
    /// and `body` are then unused.
    #[serde(default)]
    pub from_task: Option<ReplyFromTask>,
}

/// How a reply is given again from the task it created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyFromTask {
    /// Wait for the task to end and answer with its outcome, as a synchronous request does.
    Outcome,
    /// Stream the task's events from the first, as a streaming request does.
    Events,
}

/// An idempotency record to store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// Client, method and path.
    pub scope: IdempotencyScope,
    /// The key.
    pub key: IdempotencyKey,
    /// The digest of the first request's body.
    pub digest: RequestDigest,
    /// The first reply.
    pub reply: StoredReply,
    /// When it was stored.
    pub created_at: Timestamp,
    /// When it may be purged.
    pub expires_at: Timestamp,
}

/// What a stored record says about a new request with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyDecision {
    /// Same body: send the stored reply again, create nothing.
    Replay(StoredReply),
    /// Another body: 422 `idempotency_key_reused`.
    Reused,
}

/// Decides a request against the record stored under its key.
pub fn decide(stored: &IdempotencyRecord, digest: &RequestDigest) -> IdempotencyDecision {
    if &stored.digest == digest {
        IdempotencyDecision::Replay(stored.reply.clone())
    } else {
        IdempotencyDecision::Reused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_255_visible_ascii_characters() {
        assert!(IdempotencyKey::parse("a").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        for bad in ["", " ", "has space", "tab\t", "é", &"k".repeat(256)] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_digest_ignores_key_order_and_whitespace() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b": 1, "a": [1, 2]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":[1,2],"b":1}"#).unwrap();
        let c: serde_json::Value = serde_json::from_str(r#"{"a":[2,1],"b":1}"#).unwrap();
        assert_eq!(RequestDigest::of_json(&a), RequestDigest::of_json(&b));
        assert_ne!(RequestDigest::of_json(&a), RequestDigest::of_json(&c));
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_whitespace() {
        let value: serde_json::Value = serde_json::from_str(
            r#" {"z": {"y": "\u00e9\"", "x": null}, "a": [ {"d": 1.5, "c": true} ]} "#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&value),
            r#"{"a":[{"c":true,"d":1.5}],"z":{"x":null,"y":"é\""}}"#
        );
    }
}
