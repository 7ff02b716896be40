//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use rusqlite::Connection;

use lmsp_storage_codec::flows;

use crate::codec::ops as shared;
use crate::ops::{run, Res, Rows};

/// Stores a model unless the id exists ([`flows::insert_model`]).
pub fn insert_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    run(flows::insert_model(&Rows(conn), model))
}

/// Stores a model found at startup unless its id exists or its file's model was deleted.
pub fn insert_found_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    run(flows::insert_found_model(&Rows(conn), model))
}

/// A model by id.
pub fn model(conn: &Connection, id: &ModelId) -> Res<Option<ModelRecord>> {
    run(shared::model(&Rows(conn), id))
}

/// Every model by id.
pub fn list_models(conn: &Connection) -> Res<Vec<ModelRecord>> {
    run(shared::list_models(&Rows(conn)))
}

/// Deletes a model, remembering its file ([`flows::delete_model`]).
pub fn delete_model(conn: &Connection, id: &ModelId) -> Res<bool> {
    run(flows::delete_model(&Rows(conn), id))
}

/// Records a model's new fingerprint.
pub fn update_model_file(conn: &Connection, id: &ModelId, file: &FileFingerprint) -> Res<()> {
    run(shared::update_model_file(&Rows(conn), id, file))
}
