//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use rusqlite::{params, Connection, OptionalExtension};

use crate::codec::{sql, ModelRow};
use crate::ops::{prepare, read, to_i64, Res};

fn build_model(row: ModelRow) -> Res<ModelRecord> {
    Ok(row.decode()?)
}

/// Stores a model unless the id exists.
pub fn insert_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    let row = ModelRow::encode(model)?;
    let changed = prepare(conn, &sql::insert_model())?.execute(params![
        row.id,
        row.format,
        row.path,
        row.size_bytes,
        row.modified_millis,
        row.digest,
        row.upstream_model,
        row.created_at,
    ])?;
    if changed == 1 {
        if let Some(path) = &row.path {
            prepare(conn, sql::FORGET_REMOVED_MODEL_FILE)?.execute([path])?;
        }
    }
    Ok(changed == 1)
}

/// Stores a model found at startup unless its id exists or its file's model was deleted.
pub fn insert_found_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    if let Some(file) = model.file() {
        let removed: Option<i64> = prepare(conn, sql::REMOVED_MODEL_FILE)?
            .query_row([file.path.as_str()], |row| row.get(0))
            .optional()?;
        if removed.is_some() {
            return Ok(false);
        }
    }
    insert_model(conn, model)
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

/// Deletes a model, remembering its file.
pub fn delete_model(conn: &Connection, id: &ModelId) -> Res<bool> {
    let Some(found) = model(conn, id)? else {
        return Ok(false);
    };
    if let Some(file) = found.file() {
        prepare(conn, sql::REMEMBER_REMOVED_MODEL_FILE)?.execute([file.path.as_str()])?;
    }
    Ok(prepare(conn, sql::DELETE_MODEL)?.execute([id.as_str()])? == 1)
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
