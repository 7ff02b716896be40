//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use rusqlite::{params, Connection, OptionalExtension};

use lmsp_storage_codec::flows::{self, ModelRows};

use crate::codec::{sql, ModelRow};
use crate::ops::{prepare, read, run, to_i64, Res, Rows};

fn build_model(row: ModelRow) -> Res<ModelRecord> {
    Ok(row.decode()?)
}

/// The model row's insert, for the codec's model flows.
impl ModelRows for Rows<'_> {
    async fn insert_model_row(&self, row: &ModelRow) -> Res<bool> {
        let changed = prepare(self.0, &sql::insert_model())?.execute(params![
            row.id,
            row.format,
            row.path,
            row.size_bytes,
            row.modified_millis,
            row.digest,
            row.upstream_model,
            row.created_at,
        ])?;
        Ok(changed == 1)
    }
}

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
    let row = prepare(conn, &sql::model_by_id())?
        .query_row([id.as_str()], read::<ModelRow>)
        .optional()?;
    row.map(build_model).transpose()
}

/// Every model by id.
pub fn list_models(conn: &Connection) -> Res<Vec<ModelRecord>> {
    let rows: Vec<_> = prepare(conn, &sql::all_models())?
        .query_map([], read::<ModelRow>)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(build_model).collect()
}

/// Deletes a model, remembering its file ([`flows::delete_model`]).
pub fn delete_model(conn: &Connection, id: &ModelId) -> Res<bool> {
    run(flows::delete_model(&Rows(conn), id))
}

/// Records a model's new fingerprint.
pub fn update_model_file(conn: &Connection, id: &ModelId, file: &FileFingerprint) -> Res<()> {
    prepare(conn, sql::UPDATE_MODEL_FILE)?.execute(params![
        file.path,
        to_i64(file.size_bytes)?,
        file.modified_millis,
        file.digest.as_str(),
        id.as_str()
    ])?;
    Ok(())
}
