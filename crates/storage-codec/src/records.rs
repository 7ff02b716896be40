//! The rows of clients, models and idempotency records in their stored form, and back: the same
//! columns in both adapters, handed over as plain values so each adapter only binds them.

use lmsp_domain::auth::{Client, SecretHash};
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyState, RequestDigest, StoredReply,
};
use lmsp_domain::ids::{ClientId, InstanceId, TaskId};
use lmsp_domain::model::{Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource};
use lmsp_domain::time::Timestamp;

use crate::rows::{from_i64, key_of, to_i64, ulid_of};
use crate::{corrupt, scopes_from_text, scopes_to_text, DbError};

/// The columns a client is read with, in the order of [`ClientRow`]'s fields.
pub const CLIENT_COLUMNS: &str = "id, name, token_hash, scopes, created_at, revoked_at";

/// A `clients` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRow {
    /// `id`: the client id's text.
    pub id: String,
    /// `name`.
    pub name: String,
    /// `token_hash`: 64 hex digits.
    pub token_hash: String,
    /// `scopes`: [`scopes_to_text`].
    pub scopes: String,
    /// `created_at`.
    pub created_at: i64,
    /// `revoked_at`.
    pub revoked_at: Option<i64>,
}

/// A stored secret hash (a token's or a pairing code's).
pub fn hash_from_text(text: &str) -> Result<SecretHash, DbError> {
    SecretHash::from_hex(text).ok_or_else(|| corrupt("a stored hash is not 64 hex digits"))
}

impl ClientRow {
    /// The row of a client.
    pub fn encode(client: &Client) -> Result<Self, DbError> {
        Ok(ClientRow {
            id: client.id.to_string(),
            name: client.name.clone(),
            token_hash: client.token_hash.to_hex(),
            scopes: scopes_to_text(&client.scopes)?,
            created_at: client.created_at.as_millis(),
            revoked_at: client.revoked_at.map(Timestamp::as_millis),
        })
    }

    /// The client.
    pub fn decode(self) -> Result<Client, DbError> {
        Ok(Client {
            id: ClientId::parse(&self.id).map_err(corrupt)?,
            name: self.name,
            scopes: scopes_from_text(&self.scopes)?,
            token_hash: hash_from_text(&self.token_hash)?,
            created_at: Timestamp::from_millis(self.created_at),
            revoked_at: self.revoked_at.map(Timestamp::from_millis),
        })
    }
}

/// The columns a model is read with, in the order of [`ModelRow`]'s fields.
pub const MODEL_COLUMNS: &str =
    "id, format, path, size_bytes, modified_millis, digest, upstream_model, created_at";

/// A `models` row: a file's columns, or an upstream model's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRow {
    /// `id`.
    pub id: String,
    /// `format`.
    pub format: String,
    /// `path`, relative to the models directory.
    pub path: Option<String>,
    /// `size_bytes`.
    pub size_bytes: Option<i64>,
    /// `modified_millis`.
    pub modified_millis: Option<i64>,
    /// `digest`.
    pub digest: Option<String>,
    /// `upstream_model`.
    pub upstream_model: Option<String>,
    /// `created_at`.
    pub created_at: i64,
}

impl ModelRow {
    /// The row of a model.
    pub fn encode(model: &ModelRecord) -> Result<Self, DbError> {
        let mut row = ModelRow {
            id: model.id.as_str().to_owned(),
            format: model.format_name().to_owned(),
            path: None,
            size_bytes: None,
            modified_millis: None,
            digest: None,
            upstream_model: None,
            created_at: model.created_at.as_millis(),
        };
        match &model.source {
            ModelSource::File { file, .. } => {
                row.path = Some(file.path.clone());
                row.size_bytes = Some(to_i64(file.size_bytes)?);
                row.modified_millis = Some(file.modified_millis);
                row.digest = Some(file.digest.as_str().to_owned());
            }
            ModelSource::Upstream { name } => row.upstream_model = Some(name.clone()),
        }
        Ok(row)
    }

    /// The model.
    pub fn decode(self) -> Result<ModelRecord, DbError> {
        let source = match (
            self.upstream_model,
            self.path,
            self.size_bytes,
            self.modified_millis,
            self.digest,
        ) {
            (Some(name), _, _, _, _) => ModelSource::Upstream { name },
            (None, Some(path), Some(size), Some(mtime), Some(digest)) => ModelSource::File {
                format: ModelFormat::parse(&self.format),
                file: FileFingerprint {
                    path,
                    size_bytes: from_i64(size)?,
                    modified_millis: mtime,
                    digest: Digest::parse(&digest).map_err(corrupt)?,
                },
            },
            _ => {
                return Err(corrupt(format!(
                    "model {} has neither a file nor an upstream",
                    self.id
                )))
            }
        };
        Ok(ModelRecord {
            id: ModelId::parse(&self.id).map_err(corrupt)?,
            source,
            created_at: Timestamp::from_millis(self.created_at),
        })
    }
}

/// The columns an idempotency record is read with (its key aside), in the order of
/// [`IdempotencyRow`]'s fields.
pub const IDEMPOTENCY_COLUMNS: &str =
    "digest, reply, reply_task, held_until, held_by, created_at, expires_at";

/// An `idempotency_keys` row but for its key (`client_id`, `operation`, `key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRow {
    /// `digest`: 32 bytes.
    pub digest: Vec<u8>,
    /// `reply`: the answered reply's body; `NULL` while pending.
    pub reply: Option<Vec<u8>>,
    /// `reply_task`: the key of the task the reply is about.
    pub reply_task: Option<Vec<u8>>,
    /// `held_until`.
    pub held_until: Option<i64>,
    /// `held_by`: the key of the holding instance.
    pub held_by: Option<Vec<u8>>,
    /// `created_at`.
    pub created_at: i64,
    /// `expires_at`.
    pub expires_at: i64,
}

impl IdempotencyRow {
    /// The row of a record.
    pub fn encode(record: &IdempotencyRecord) -> Self {
        let (reply, reply_task) = match &record.state {
            KeyState::Pending => (None, None),
            KeyState::Answered(reply) => (
                Some(reply.body.clone()),
                reply.task_id.map(|id| key_of(id.ulid()).to_vec()),
            ),
        };
        IdempotencyRow {
            digest: record.digest.0.to_vec(),
            reply,
            reply_task,
            held_until: record.held_until.map(Timestamp::as_millis),
            held_by: record.held_by.map(|id| key_of(id.ulid()).to_vec()),
            created_at: record.created_at.as_millis(),
            expires_at: record.expires_at.as_millis(),
        }
    }

    /// The record stored under `key` in `scope`.
    pub fn decode(
        self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
    ) -> Result<IdempotencyRecord, DbError> {
        let digest: [u8; 32] = self
            .digest
            .try_into()
            .map_err(|_| corrupt("an idempotency digest is not 32 bytes"))?;
        let state = match self.reply {
            None => KeyState::Pending,
            Some(body) => KeyState::Answered(StoredReply {
                task_id: self
                    .reply_task
                    .map(|id| Ok::<_, DbError>(TaskId::from_ulid(ulid_of(&id)?)))
                    .transpose()?,
                body,
            }),
        };
        Ok(IdempotencyRecord {
            scope: scope.clone(),
            key: key.clone(),
            digest: RequestDigest(digest),
            state,
            held_until: self.held_until.map(Timestamp::from_millis),
            held_by: self
                .held_by
                .map(|id| Ok::<_, DbError>(InstanceId::from_ulid(ulid_of(&id)?)))
                .transpose()?,
            created_at: Timestamp::from_millis(self.created_at),
            expires_at: Timestamp::from_millis(self.expires_at),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use lmsp_domain::auth::{Scope, Scopes};
    use lmsp_domain::idempotency::Operation;
    use ulid::Ulid;

    use super::*;

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millis(millis)
    }

    #[test]
    fn a_client_reads_back_as_it_was_written_revoked_or_not() {
        let mut client = Client {
            id: ClientId::from_ulid(Ulid::from_parts(1, 2)),
            name: "laptop".into(),
            scopes: Scopes::new([Scope::ResponsesRead]),
            token_hash: SecretHash::from_hex(&"ab".repeat(32)).unwrap(),
            created_at: at(5),
            revoked_at: None,
        };
        assert_eq!(
            ClientRow::encode(&client).unwrap().decode().unwrap(),
            client
        );
        client.revoked_at = Some(at(9));
        let row = ClientRow::encode(&client).unwrap();
        assert_eq!(row.revoked_at, Some(9));
        assert_eq!(row.decode().unwrap(), client);
    }

    #[test]
    fn a_models_file_or_upstream_reads_back_and_a_row_with_neither_is_corrupt() {
        let file = ModelRecord {
            id: ModelId::parse("tiny.gguf").unwrap(),
            source: ModelSource::File {
                format: ModelFormat::Gguf,
                file: FileFingerprint {
                    path: "tiny.gguf".into(),
                    size_bytes: 42,
                    modified_millis: 7,
                    digest: Digest::from_sha256([3; 32]),
                },
            },
            created_at: at(11),
        };
        let upstream = ModelRecord {
            id: ModelId::parse("remote").unwrap(),
            source: ModelSource::Upstream {
                name: "qwen".into(),
            },
            created_at: at(12),
        };
        for model in [file, upstream] {
            assert_eq!(ModelRow::encode(&model).unwrap().decode().unwrap(), model);
        }
        let mut broken = ModelRow::encode(&ModelRecord {
            id: ModelId::parse("tiny.gguf").unwrap(),
            source: ModelSource::Upstream { name: "x".into() },
            created_at: at(1),
        })
        .unwrap();
        broken.upstream_model = None;
        assert!(broken.decode().is_err());
    }

    #[test]
    fn an_idempotency_record_reads_back_pending_or_answered() {
        let scope = IdempotencyScope {
            client_id: ClientId::from_ulid(Ulid::from_parts(3, 4)),
            operation: Operation::CreateResponse,
        };
        let key = IdempotencyKey::parse("k-1").unwrap();
        let pending = IdempotencyRecord {
            scope: scope.clone(),
            key: key.clone(),
            digest: RequestDigest::of_canonical(b"{}"),
            state: KeyState::Pending,
            held_until: Some(at(20)),
            held_by: Some(InstanceId::from_ulid(Ulid::from_parts(5, 6))),
            created_at: at(10),
            expires_at: at(30),
        };
        let answered = IdempotencyRecord {
            state: KeyState::Answered(StoredReply {
                task_id: Some(TaskId::from_ulid(Ulid::from_parts(7, 8))),
                body: b"202".to_vec(),
            }),
            held_until: None,
            held_by: None,
            ..pending.clone()
        };
        for record in [pending, answered] {
            let row = IdempotencyRow::encode(&record);
            assert_eq!(row.decode(&scope, &key).unwrap(), record);
        }
        let mut short = IdempotencyRow::encode(&IdempotencyRecord {
            scope: scope.clone(),
            key: key.clone(),
            digest: RequestDigest::of_canonical(b"{}"),
            state: KeyState::Pending,
            held_until: None,
            held_by: None,
            created_at: at(1),
            expires_at: at(2),
        });
        short.digest.pop();
        assert!(short.decode(&scope, &key).is_err());
    }
}
