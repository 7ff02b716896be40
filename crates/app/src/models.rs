//! Models: registration (a file inside the models directory, hashed as a stream; or an upstream
//! model name; under an idempotency key, committed with the key's reply), the list, deletion (a
//! deletion sticks: the file is not registered again at startup), the models a start registers
//! by itself, and a task's model prepared for its engine (its file checked against its digest).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use lmsp_domain::auth::Scope;
use lmsp_domain::idempotency::{Operation, StoredReply};
use lmsp_domain::ports::{Clock, KeyedInsert, ModelFileError, ModelFiles, Progress, Store};
use lmsp_domain::{
    FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad, Task, TaskError,
    TaskErrorCode,
};

use crate::caller::Caller;
use crate::error::AppError;
use crate::idempotency::{idempotent, IdempotentRequest, KeyHold, Keyed, Ran};
use crate::retry::{retry, Abandoned};
use crate::shared::Core;
use crate::SystemClock;

/// The registered models and the model files: the model use cases, and the preparation of a
/// task's model for the worker that runs it.
#[derive(Clone)]
pub struct Models {
    core: Arc<Core>,
    files: Arc<dyn ModelFiles>,
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Models").finish_non_exhaustive()
    }
}

/// Why a task's model is not ready for its engine.
pub(crate) enum Unready {
    /// The task fails with this error (no such model, its file is gone or changed).
    Failed(TaskError),
    /// The process is stopping: leave the task for recovery.
    Stopping,
    /// The store could not be read: the run is given up.
    StoreGaveUp,
}

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

impl Models {
    pub(crate) fn new(core: Arc<Core>, files: Arc<dyn ModelFiles>) -> Self {
        Self { core, files }
    }

    fn now(&self) -> lmsp_domain::Timestamp {
        self.core.now()
    }

    /// The registered models.
    pub async fn list(&self, caller: &Caller) -> Result<Vec<ModelRecord>, AppError> {
        caller.require(Scope::ModelsRead)?;
        Ok(self.core.store.list_models().await?)
    }

    /// A registered model.
    pub async fn get(&self, caller: &Caller, model_id: &ModelId) -> Result<ModelRecord, AppError> {
        caller.require(Scope::ModelsRead)?;
        self.core
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
    pub async fn register(
        &self,
        caller: &Caller,
        model_id: ModelId,
        origin: ModelOrigin,
        key: Option<IdempotentRequest>,
        reply: &(dyn Fn(&ModelRecord) -> StoredReply + Sync),
    ) -> Result<Keyed<ModelRecord>, AppError> {
        caller.require(Scope::ModelsWrite)?;
        let act = |hold| self.register_held(model_id, origin, hold, reply);
        match idempotent(&self.core, caller, Operation::RegisterModel, key, act).await? {
            Ran::Answered(registered) => Ok(registered),
            Ran::Replay(_, kept) => Ok(Keyed::Replay(kept)),
        }
    }

    /// Registers the model while the request holds its key (if it has one).
    async fn register_held(
        &self,
        model_id: ModelId,
        origin: ModelOrigin,
        hold: Option<KeyHold>,
        reply: &(dyn Fn(&ModelRecord) -> StoredReply + Sync),
    ) -> Result<Keyed<ModelRecord>, AppError> {
        let store = &self.core.store;
        let record = self.model_record(model_id, origin).await?;
        let Some(hold) = hold else {
            return if store.insert_model(record.clone()).await? {
                Ok(Keyed::Fresh(record))
            } else {
                Err(AppError::AlreadyExists(record.id.to_string()))
            };
        };
        let answered = hold.answered_record(reply(&record));
        match store
            .insert_model_with_key(record.clone(), answered)
            .await?
        {
            KeyedInsert::Inserted => Ok(Keyed::Fresh(record)),
            KeyedInsert::Taken => Err(AppError::AlreadyExists(record.id.to_string())),
            // This request's hold ran out and another one answered under the key meanwhile.
            KeyedInsert::KeyAnswered(other) => hold.answered_elsewhere(&other).map(Keyed::Replay),
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
        let core = &self.core;
        if core.store.model(&model_id).await?.is_some() {
            return Err(AppError::AlreadyExists(model_id.to_string()));
        }
        match origin {
            ModelOrigin::File(path) => {
                let file = self.files.fingerprint(&path).await?;
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
    pub async fn delete(&self, caller: &Caller, model_id: &ModelId) -> Result<(), AppError> {
        caller.require(Scope::ModelsWrite)?;
        if self.core.store.delete_model(model_id).await? {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// At startup: the built-in reference corpus (written into the models directory once) as
    /// model `reference`, and every model file of the models directory not yet registered (by
    /// file stem), unless a user deleted its model. Failures are logged: a start never fails
    /// over a model file.
    pub(crate) async fn register_builtin(&self) {
        let store = &self.core.store;
        let files = self.files.as_ref();
        let reference = async {
            let path = files.install_reference_corpus().await?;
            let file = files.fingerprint(&path).await?;
            let id = ModelId::parse(ModelId::REFERENCE)
                .map_err(|e| AppError::ModelNotFound(e.to_string()))?;
            if store.model(&id).await?.is_none() {
                store
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
            if matches!(store.model(&id).await, Ok(Some(_))) {
                continue;
            }
            match files.fingerprint(&path).await {
                Ok(file) => {
                    let record = file_record(id.clone(), file, self.now());
                    if let Err(error) = store.insert_found_model(record).await {
                        tracing::warn!(model = %id, %error, "a model file could not be registered");
                    }
                }
                Err(error) => tracing::warn!(%path, %error, "a model file was skipped"),
            }
        }
    }

    /// The task's model, checked against its file's digest, ready for its engine.
    pub(crate) async fn prepare(
        &self,
        task: &Task,
        stop_now: &CancellationToken,
    ) -> Result<ModelToLoad, Unready> {
        let core = &self.core;
        let found = retry(core.settings.store_retry, stop_now, || {
            core.store.model(&task.model)
        })
        .await;
        let mut record = match found {
            Ok(Some(record)) => record,
            Ok(None) => {
                return Err(Unready::Failed(TaskError::new(
                    TaskErrorCode::ModelNotFound,
                    format!("model `{}` is not registered", task.model),
                )))
            }
            Err(Abandoned::Stopped) => return Err(Unready::Stopping),
            Err(_) => return Err(Unready::StoreGaveUp),
        };
        let Some(file) = record.file().cloned() else {
            return Ok(ModelToLoad { record, path: None });
        };
        match self.files.verify(&file).await {
            Ok(verified) => {
                if let Some(rehashed) = verified.rehashed {
                    if let Err(error) = core
                        .store
                        .update_model_file(&record.id, rehashed.clone())
                        .await
                    {
                        tracing::warn!(model = %record.id, %error, "a re-hashed model file was not recorded");
                    }
                    if let lmsp_domain::ModelSource::File { file, .. } = &mut record.source {
                        *file = rehashed;
                    }
                }
                Ok(ModelToLoad {
                    record,
                    path: Some(verified.path),
                })
            }
            Err(error) => Err(Unready::Failed(unverified(&record.id, &error))),
        }
    }
}

/// The task error of a model whose file failed its check. The task's client reads it (and may
/// not see where the file is kept): it names the model; the log keeps the file's detail.
fn unverified(model: &ModelId, error: &ModelFileError) -> TaskError {
    tracing::warn!(%model, %error, "a task's model file failed its check");
    match error {
        ModelFileError::DigestMismatch => TaskError::new(
            TaskErrorCode::ModelDigestMismatch,
            format!("the file of model `{model}` does not match its stored digest"),
        ),
        ModelFileError::Unavailable(_) | ModelFileError::PathRejected(_) => TaskError::new(
            TaskErrorCode::ModelUnavailable,
            format!("the file of model `{model}` is unavailable"),
        ),
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
