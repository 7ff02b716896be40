//! Models: registration (a file inside the models directory, hashed as a stream; or an upstream
//! model name; under an idempotency key, committed with the key's reply), the list, deletion (a
//! deletion sticks: the file is not registered again at startup), and the models a start
//! registers by itself.

use lmsp_domain::auth::Scope;
use lmsp_domain::idempotency::{decide, KeyDecision, Operation, StoredReply};
use lmsp_domain::ports::{KeyedInsert, ModelFiles, Progress, Store};
use lmsp_domain::{FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource};

use crate::clients::Caller;
use crate::error::AppError;
use crate::idempotency::{Claim, IdempotentRequest, KeyHold, Keyed};
use crate::service::Service;
use crate::SystemClock;
use lmsp_domain::ports::Clock;

/// What a model is registered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelOrigin {
    /// A file: absolute, or relative to the models directory.
    File(String),
    /// A model an upstream server runs, by its name there.
    Upstream(String),
}

fn file_record(id: ModelId, file: FileFingerprint, at: lmsp_domain::Timestamp) -> ModelRecord {
    let format = ModelFormat::of_path(&file.path)
        .unwrap_or_else(|| ModelFormat::Other(String::from("unknown")));
    ModelRecord {
        id,
        source: ModelSource::File { format, file },
        created_at: at,
    }
}

impl Service {
    /// The registered models.
    pub async fn models(&self, caller: &Caller) -> Result<Vec<ModelRecord>, AppError> {
        caller.require(Scope::ModelsRead)?;
        Ok(self.inner.store.list_models().await?)
    }

    /// A registered model.
    pub async fn model(
        &self,
        caller: &Caller,
        model_id: &ModelId,
    ) -> Result<ModelRecord, AppError> {
        caller.require(Scope::ModelsRead)?;
        self.inner
            .store
            .model(model_id)
            .await?
            .ok_or(AppError::NotFound)
    }

    /// P-1, I-8: registers a model: a file inside the models directory (links followed), hashed
    /// as a stream, of which only the metadata and digest are kept; or an upstream model's name.
    /// Under the request's idempotency key, if it has one, the model and the reply a retry is to
    /// get (`reply` encodes it from the model) commit in one transaction, and a retry gets that
    /// reply again.
    pub async fn register_model(
        &self,
        caller: &Caller,
        model_id: ModelId,
        origin: ModelOrigin,
        key: Option<IdempotentRequest>,
        reply: &(dyn Fn(&ModelRecord) -> StoredReply + Sync),
    ) -> Result<Keyed<ModelRecord>, AppError> {
        caller.require(Scope::ModelsWrite)?;
        let hold = match self.claim(caller, Operation::RegisterModel, key).await? {
            Claim::Unkeyed => None,
            Claim::Held(hold) => Some(hold),
            Claim::Replay(_, kept) => return Ok(Keyed::Replay(kept)),
        };
        let registered = self
            .register_held(model_id, origin, hold.as_ref(), reply)
            .await;
        if let Some(hold) = hold {
            hold.release().await;
        }
        registered
    }

    /// Registers the model while the request holds its key (if it has one).
    async fn register_held(
        &self,
        model_id: ModelId,
        origin: ModelOrigin,
        hold: Option<&KeyHold>,
        reply: &(dyn Fn(&ModelRecord) -> StoredReply + Sync),
    ) -> Result<Keyed<ModelRecord>, AppError> {
        let store = &self.inner.store;
        let record = self.model_record(model_id, origin).await?;
        let Some(hold) = hold else {
            return if store.insert_model(record.clone()).await? {
                Ok(Keyed::Fresh(record))
            } else {
                Err(AppError::AlreadyExists(record.id.to_string()))
            };
        };
        let answered = hold.answered_record(reply(&record), self.now());
        match store
            .insert_model_with_key(record.clone(), answered)
            .await?
        {
            KeyedInsert::Inserted => Ok(Keyed::Fresh(record)),
            KeyedInsert::Taken => Err(AppError::AlreadyExists(record.id.to_string())),
            // This request's hold ran out and another one answered under the key meanwhile.
            KeyedInsert::KeyAnswered(other) => {
                match decide(Some(&other), &hold.digest(), self.now()) {
                    KeyDecision::Replay(kept) => Ok(Keyed::Replay(kept)),
                    KeyDecision::InUse => Err(AppError::KeyInUse),
                    _ => Err(AppError::KeyReused),
                }
            }
        }
    }

    /// The record of a model to register: a file's fingerprint (hashed as a stream) or an
    /// upstream model's name. A taken id is refused first, so it costs no hashing; the insert
    /// checks again atomically.
    async fn model_record(
        &self,
        model_id: ModelId,
        origin: ModelOrigin,
    ) -> Result<ModelRecord, AppError> {
        let inner = &self.inner;
        if inner.store.model(&model_id).await?.is_some() {
            return Err(AppError::AlreadyExists(model_id.to_string()));
        }
        match origin {
            ModelOrigin::File(path) => {
                let file = inner.model_files.fingerprint(&path).await?;
                if ModelFormat::of_path(&file.path).is_none() {
                    return Err(AppError::Invalid(
                        lmsp_domain::validation::ValidationError::new(
                            "path",
                            "the file is not a model: its name must end in .gguf or .txt",
                        ),
                    ));
                }
                Ok(file_record(model_id, file, self.now()))
            }
            ModelOrigin::Upstream(name) => Ok(ModelRecord {
                id: model_id,
                source: ModelSource::Upstream { name },
                created_at: self.now(),
            }),
        }
    }

    /// Forgets a model; its file is never touched (P-1), and is not registered again at startup.
    pub async fn delete_model(&self, caller: &Caller, model_id: &ModelId) -> Result<(), AppError> {
        caller.require(Scope::ModelsWrite)?;
        if self.inner.store.delete_model(model_id).await? {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// At startup: the built-in reference corpus (written into the models directory once) as
    /// model `reference`, and every model file of the models directory not yet registered (by
    /// file stem), unless a user deleted its model. Failures are logged: a start never fails
    /// over a model file.
    pub(crate) async fn register_builtin_models(&self) {
        let inner = &self.inner;
        let files = inner.model_files.as_ref();
        let reference = async {
            let path = files.install_reference_corpus().await?;
            let file = files.fingerprint(&path).await?;
            let id = ModelId::parse(ModelId::REFERENCE)
                .map_err(|e| AppError::ModelNotFound(e.to_string()))?;
            if inner.store.model(&id).await?.is_none() {
                inner
                    .store
                    .insert_model(file_record(id, file, self.now()))
                    .await?;
            }
            Ok::<(), AppError>(())
        };
        if let Err(error) = reference.await {
            tracing::warn!(%error, "the reference model could not be registered");
        }
        let found = match files.find_models().await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, "the models directory could not be read");
                return;
            }
        };
        for path in found {
            let Some(id) = std::path::Path::new(&path)
                .file_stem()
                .and_then(|stem| stem.to_str())
                .and_then(|stem| ModelId::parse(stem).ok())
            else {
                continue;
            };
            if matches!(inner.store.model(&id).await, Ok(Some(_))) {
                continue;
            }
            match files.fingerprint(&path).await {
                Ok(file) => {
                    let record = file_record(id.clone(), file, self.now());
                    if let Err(error) = inner.store.insert_found_model(record).await {
                        tracing::warn!(model = %id, %error, "a model file could not be registered");
                    }
                }
                Err(error) => tracing::warn!(%path, %error, "a model file was skipped"),
            }
        }
    }
}

/// The offline model command, on a store (no service running in this process).
pub mod offline {
    use super::*;

    /// Registers any readable model file as `model_id` (the machine's owner may name a file
    /// outside the models directory), hashing it with `progress` told how far it got.
    pub async fn register_model_file(
        store: &dyn Store,
        files: &dyn ModelFiles,
        model_id: ModelId,
        path: &str,
        progress: Option<Progress>,
    ) -> Result<ModelRecord, AppError> {
        if store.model(&model_id).await?.is_some() {
            return Err(AppError::AlreadyExists(model_id.to_string()));
        }
        let file = files.fingerprint_any(path, progress).await?;
        if ModelFormat::of_path(&file.path).is_none() {
            return Err(AppError::Invalid(
                lmsp_domain::validation::ValidationError::new(
                    "path",
                    "the file is not a model: its name must end in .gguf or .txt",
                ),
            ));
        }
        let record = file_record(model_id, file, SystemClock.now());
        if store.insert_model(record.clone()).await? {
            Ok(record)
        } else {
            Err(AppError::AlreadyExists(record.id.to_string()))
        }
    }
}
