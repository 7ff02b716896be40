//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource};
use lmsp_domain::time::Timestamp;
use rusqlite::{params, Connection, OptionalExtension};

use crate::ops::{corrupt, from_i64, to_i64, Res};

type ModelRow = (
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<String>,
    i64,
);

fn model_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ModelRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
    ))
}

fn build_model(fields: ModelRow) -> Res<ModelRecord> {
    let (id, format, path, size, mtime, digest, upstream, created_at) = fields;
    let source = match (upstream, path, size, mtime, digest) {
        (Some(name), _, _, _, _) => ModelSource::Upstream { name },
        (None, Some(path), Some(size), Some(mtime), Some(digest)) => ModelSource::File {
            format: ModelFormat::parse(&format),
            file: FileFingerprint {
                path,
                size_bytes: from_i64(size)?,
                modified_millis: mtime,
                digest: Digest::parse(&digest).map_err(corrupt)?,
            },
        },
        _ => {
            return Err(corrupt(format!(
                "model {id} has neither a file nor an upstream"
            )))
        }
    };
    Ok(ModelRecord {
        id: ModelId::parse(&id).map_err(corrupt)?,
        source,
        created_at: Timestamp::from_millis(created_at),
    })
}

const MODEL_COLUMNS: &str =
    "id, format, path, size_bytes, modified_millis, digest, upstream_model, created_at";

/// Stores a model unless the id exists.
pub fn insert_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    let (path, size, mtime, digest, upstream) = match &model.source {
        ModelSource::File { file, .. } => (
            Some(file.path.as_str()),
            Some(to_i64(file.size_bytes)?),
            Some(file.modified_millis),
            Some(file.digest.as_str()),
            None,
        ),
        ModelSource::Upstream { name } => (None, None, None, None, Some(name.as_str())),
    };
    let changed = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO models (id, format, path, size_bytes, modified_millis, digest, \
             upstream_model, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
            model.id.as_str(),
            model.format_name(),
            path,
            size,
            mtime,
            digest,
            upstream,
            model.created_at.as_millis(),
        ])?;
    if changed == 1 {
        if let Some(path) = path {
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
