//! Idempotency keys (I-8): the key newtype, the request digest, the operations a key may name,
//! the stored record, and the decision a record makes about a new request with the same key.
//!
//! A key is scoped to its client and its operation. Its record is first a *hold* (the first
//! request is being answered; other requests with the key are told it is in use) and then the
//! first reply, kept for the key's time to live. A hold ends with the instance that holds it (the
//! recovery of a stopped instance releases its holds) and has an expiry besides, so a process that
//! dies while answering never leaves a key held.

use std::fmt;

use sha2::{Digest as _, Sha256};
use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::ids::{ClientId, InstanceId, TaskId};
use crate::time::Timestamp;

/// An `Idempotency-Key` that is not 1–255 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an idempotency key is 1–255 visible ASCII characters")]
pub struct InvalidIdempotencyKey;

/// A well-formed idempotency key.
#[derive(Clone, PartialEq, Eq, Hash)]
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

/// The SHA-256 of a request's canonical form (for a JSON body: keys sorted, no insignificant
/// whitespace); the driving adapter decides the canonical form, the digest is all that is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestDigest(pub [u8; 32]);

impl RequestDigest {
    /// The digest of a request's canonical bytes.
    pub fn of_canonical(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

/// The operations an idempotency key may name; a key is scoped to one of them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, VariantArray, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum Operation {
    /// Creating a response (a task).
    CreateResponse,
    /// Creating a chat completion (a task).
    CreateChatCompletion,
    /// Registering a model.
    RegisterModel,
}

impl Operation {
    /// The stored name, e.g. `create_response`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a stored name.
    pub fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

/// Whose key it is and for what: a key is scoped to its client and its operation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyScope {
    /// The client that sent the key.
    pub client_id: ClientId,
    /// The operation.
    pub operation: Operation,
}

/// The first reply to a request, as the driving adapter wrote it: opaque to the service, which
/// only keeps it and gives it back. It may name the task the request created, so that purging
/// the task does not leave the reply pointing at nothing unnoticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReply {
    /// The task the request created, if any.
    pub task_id: Option<TaskId>,
    /// The reply, in the driving adapter's own encoding.
    pub body: Vec<u8>,
}

/// Where a key's first request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// It is being answered and has created nothing yet.
    Pending,
    /// It was answered (or created what it creates): this is the reply to give again.
    Answered(StoredReply),
}

/// A stored idempotency record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// Client and operation.
    pub scope: IdempotencyScope,
    /// The key.
    pub key: IdempotencyKey,
    /// The digest of the first request.
    pub digest: RequestDigest,
    /// Where the first request is.
    pub state: KeyState,
    /// Until when the first request holds the key (other requests are told it is in use); `None`
    /// once it was answered.
    pub held_until: Option<Timestamp>,
    /// The instance whose request holds the key: when that instance stops, its holds end with
    /// it (recovery releases them), so a retry after a crash is answered at once.
    pub held_by: Option<InstanceId>,
    /// When it was stored.
    pub created_at: Timestamp,
    /// When it may be purged.
    pub expires_at: Timestamp,
}

/// A request's claim on its key: what [`crate::ports::IdempotencyStore::claim_key`] decides and,
/// when the request proceeds, stores as a pending record that holds the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyClaim {
    /// Client and operation.
    pub scope: IdempotencyScope,
    /// The key.
    pub key: IdempotencyKey,
    /// The digest of the request.
    pub digest: RequestDigest,
    /// The instance answering the request.
    pub holder: InstanceId,
    /// Until when the request holds the key at most.
    pub hold_until: Timestamp,
    /// When the record may be purged.
    pub expires_at: Timestamp,
}

impl KeyClaim {
    /// The pending record that holds the key, stored at `now`.
    pub fn pending_record(&self, now: Timestamp) -> IdempotencyRecord {
        IdempotencyRecord {
            scope: self.scope.clone(),
            key: self.key.clone(),
            digest: self.digest,
            state: KeyState::Pending,
            held_until: Some(self.hold_until),
            held_by: Some(self.holder),
            created_at: now,
            expires_at: self.expires_at,
        }
    }

    /// The record that answers the key with `reply`, still held by the request.
    pub fn answered_record(&self, reply: StoredReply, now: Timestamp) -> IdempotencyRecord {
        IdempotencyRecord {
            state: KeyState::Answered(reply),
            ..self.pending_record(now)
        }
    }
}

/// What a stored record says about a new request with the same key, at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyDecision {
    /// No live record: the new request holds the key and goes on.
    Proceed,
    /// The first request is still being answered: 409 `idempotency_key_in_use`.
    InUse,
    /// Another request was made with this key: 422 `idempotency_key_reused`.
    Reused,
    /// The same request was answered: give its reply again, create nothing.
    Replay(StoredReply),
}

/// Decides a request with digest `digest` at `now` against the record stored under its key.
///
/// An expired record is no record. A held key is in use whatever the body. A pending record whose
/// hold expired belonged to a request that died before it created anything: the new request
/// proceeds (with another body too, since nothing was created under the old one).
pub fn decide(
    stored: Option<&IdempotencyRecord>,
    digest: &RequestDigest,
    now: Timestamp,
) -> KeyDecision {
    let Some(stored) = stored.filter(|record| record.expires_at > now) else {
        return KeyDecision::Proceed;
    };
    if stored.held_until.is_some_and(|until| until > now) {
        return KeyDecision::InUse;
    }
    match &stored.state {
        KeyState::Pending => KeyDecision::Proceed,
        KeyState::Answered(_) if &stored.digest != digest => KeyDecision::Reused,
        KeyState::Answered(reply) => KeyDecision::Replay(reply.clone()),
    }
}

/// What settling a key does to its stored record, once the final reply of a request is known (a
/// synchronous request's task finished): the record takes `reply` only while its reply is still
/// `expected`, the one the settler read (a pointer to the task, kept with the task when it was
/// created). A record that is gone, pending, or answered otherwise since (settled already, or
/// expired and claimed afresh) is left as it is: `None`. The settled record keeps the task it names
/// as stored (none once the task was purged or deleted), its hold, its digest and its expiry.
pub fn settle(
    stored: Option<&IdempotencyRecord>,
    expected: &StoredReply,
    reply: StoredReply,
) -> Option<IdempotencyRecord> {
    let stored = stored?;
    match &stored.state {
        KeyState::Answered(kept) if kept.body == expected.body => Some(IdempotencyRecord {
            state: KeyState::Answered(StoredReply {
                task_id: kept.task_id,
                body: reply.body,
            }),
            ..stored.clone()
        }),
        KeyState::Answered(_) | KeyState::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ulid::Ulid;

    #[test]
    fn keys_are_one_to_255_visible_ascii_characters() {
        assert!(IdempotencyKey::parse("a").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        for bad in ["", " ", "has space", "tab\t", "é", &"k".repeat(256)] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn operations_have_stable_names() {
        for operation in Operation::VARIANTS {
            assert_eq!(Operation::parse(operation.as_str()), Some(*operation));
        }
        assert_eq!(Operation::CreateResponse.as_str(), "create_response");
        assert_eq!(Operation::parse("POST /v1/responses"), None);
    }

    fn record(state: KeyState, held_until: Option<i64>, expires_at: i64) -> IdempotencyRecord {
        IdempotencyRecord {
            scope: IdempotencyScope {
                client_id: ClientId::from_ulid(Ulid::from_parts(1, 1)),
                operation: Operation::CreateResponse,
            },
            key: IdempotencyKey::parse("k").unwrap(),
            digest: RequestDigest::of_canonical(b"first"),
            state,
            held_until: held_until.map(Timestamp::from_millis),
            held_by: None,
            created_at: Timestamp::from_millis(0),
            expires_at: Timestamp::from_millis(expires_at),
        }
    }

    /// I-8: each kind of record decides a new request as docs/idempotency.md says.
    #[test]
    fn a_record_decides_a_new_request_i8() {
        let first = RequestDigest::of_canonical(b"first");
        let other = RequestDigest::of_canonical(b"other");
        let now = Timestamp::from_millis(100);
        let reply = StoredReply {
            task_id: None,
            body: b"202".to_vec(),
        };
        let answered = KeyState::Answered(reply.clone());
        let cases = [
            (None, &first, KeyDecision::Proceed),
            (
                Some(record(answered.clone(), None, 1_000)),
                &first,
                KeyDecision::Replay(reply),
            ),
            (
                Some(record(answered.clone(), None, 1_000)),
                &other,
                KeyDecision::Reused,
            ),
            (
                Some(record(answered.clone(), None, 100)),
                &other,
                KeyDecision::Proceed,
            ),
            (
                Some(record(answered.clone(), Some(101), 1_000)),
                &first,
                KeyDecision::InUse,
            ),
            (
                Some(record(answered, Some(100), 1_000)),
                &other,
                KeyDecision::Reused,
            ),
            (
                Some(record(KeyState::Pending, Some(500), 1_000)),
                &other,
                KeyDecision::InUse,
            ),
            (
                Some(record(KeyState::Pending, Some(50), 1_000)),
                &other,
                KeyDecision::Proceed,
            ),
        ];
        for (index, (stored, digest, expected)) in cases.into_iter().enumerate() {
            assert_eq!(
                decide(stored.as_ref(), digest, now),
                expected,
                "case {index}"
            );
        }
    }
}
