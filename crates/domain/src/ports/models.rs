//! Registered models (metadata only, P-1).

use async_trait::async_trait;

use crate::model::{FileFingerprint, ModelId, ModelRecord};
use crate::ports::StoreError;

/// Registered models (metadata only, P-1).
#[async_trait]
pub trait ModelStore: Send + Sync {
    /// Stores a model a user registers; `false` (and nothing written) when the id exists. A file
    /// a user deleted the model of before may be found again at startup after this.
    async fn insert_model(&self, model: ModelRecord) -> Result<bool, StoreError>;
    /// Stores a model found in the models directory at startup, unless its id exists or a user
    /// deleted a model of this file (a deletion sticks); `false` when nothing was written.
    async fn insert_found_model(&self, model: ModelRecord) -> Result<bool, StoreError>;
    /// A model by id.
    async fn model(&self, model_id: &ModelId) -> Result<Option<ModelRecord>, StoreError>;
    /// Every model, by id.
    async fn list_models(&self) -> Result<Vec<ModelRecord>, StoreError>;
    /// Deletes a model record, and remembers that its file is not to be registered again at
    /// startup; `false` when there is none.
    async fn delete_model(&self, model_id: &ModelId) -> Result<bool, StoreError>;
    /// Records a re-hashed file's fingerprint.
    async fn update_model_file(
        &self,
        model_id: &ModelId,
        file: FileFingerprint,
    ) -> Result<(), StoreError>;
}
