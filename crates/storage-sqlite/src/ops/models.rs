//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use rusqlite::{params, Connection, OptionalExtension};

use crate::codec::{ModelRow, MODEL_COLUMNS};
use crate::ops::{to_i64, Res};

fn model_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ModelRow> {
    Ok(ModelRow {
        id: row.get(0)?,
        format: row.get(1)?,
        path: row.get(2)?,
        size_bytes: row.get(3)?,
        modified_millis: row.get(4)?,
        digest: row.get(5)?,
        upstream_model: row.get(6)?,
        created_at: row.get(7)?,
    })
}

fn build_model(row: ModelRow) -> Res<ModelRecord> {
    Ok(row.decode()?)
}

/// Stores a model unless the id exists.
pub fn insert_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    let row = ModelRow::encode(model)?;
    let changed = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO models (id, format, path, size_bytes, modified_millis, digest, \
             upstream_model, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
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
            conn.prepare_cached("DELETE FROM removed_model_files WHERE path = ?1")?
                .execute([path])?;
        }
    }
    Ok(changed == 1)
}

/// Stores a model found at startup unless its id exists or its file's model was deleted.
pub fn insert_found_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    if let Some(file) = model.file() {
        let removed: Option<i64> = conn
            .prepare_cached("SELECT 1 FROM removed_model_files WHERE path = ?1")?
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
    let sql = format!("SELECT {MODEL_COLUMNS} FROM models WHERE id = ?1");
    let row = conn
        .prepare_cached(&sql)?
        .query_row([id.as_str()], model_row)
        .optional()?;
    row.map(build_model).transpose()
}

/// Every model by id.
pub fn list_models(conn: &Connection) -> Res<Vec<ModelRecord>> {
    let sql = format!("SELECT {MODEL_COLUMNS} FROM models ORDER BY id");
    let rows: Vec<_> = conn
        .prepare_cached(&sql)?
        .query_map([], model_row)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(build_model).collect()
}

/// Deletes a model, remembering its file.
pub fn delete_model(conn: &Connection, id: &ModelId) -> Res<bool> {
    let Some(found) = model(conn, id)? else {
        return Ok(false);
    };
    if let Some(file) = found.file() {
        conn.prepare_cached("INSERT OR IGNORE INTO removed_model_files (path) VALUES (?1)")?
            .execute([file.path.as_str()])?;
    }
    Ok(conn
        .prepare_cached("DELETE FROM models WHERE id = ?1")?
        .execute([id.as_str()])?
        == 1)
}

/// Records a model's new fingerprint.
pub fn update_model_file(conn: &Connection, id: &ModelId, file: &FileFingerprint) -> Res<()> {
    conn.prepare_cached(
        "UPDATE models SET path = ?1, size_bytes = ?2, modified_millis = ?3, digest = ?4 \
         WHERE id = ?5 AND upstream_model IS NULL",
    )?
    .execute(params![
        file.path,
        to_i64(file.size_bytes)?,
        file.modified_millis,
        file.digest.as_str(),
        id.as_str()
    ])?;
    Ok(())
}
