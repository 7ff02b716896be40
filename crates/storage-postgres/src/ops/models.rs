//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};

use lmsp_storage_codec::flows;

use crate::codec::ops as shared;
use crate::ops::{Db, Res, Rows};

/// Stores a model unless the id exists ([`flows::insert_model`]).
pub async fn insert_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    flows::insert_model(&Rows(db), model).await
}

/// Stores a model found at startup unless its id exists or its file's model was deleted (that
/// file's row kept `FOR SHARE` until the transaction ends).
pub async fn insert_found_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    flows::insert_found_model(&Rows(db), model).await
}

/// Every model by id.
pub async fn list_models<C: Db>(db: &C) -> Res<Vec<ModelRecord>> {
    shared::list_models(&Rows(db)).await
}

/// Deletes a model (its row locked), remembering its file ([`flows::delete_model`]).
pub async fn delete_model<C: Db>(db: &C, id: &ModelId) -> Res<bool> {
    flows::delete_model(&Rows(db), id).await
}

/// Records a model's new fingerprint.
pub async fn update_model_file<C: Db>(db: &C, id: &ModelId, file: &FileFingerprint) -> Res<()> {
    shared::update_model_file(&Rows(db), id, file).await
}
