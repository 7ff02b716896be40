//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use tokio_postgres::Row;

use crate::codec::{ModelRow, MODEL_COLUMNS};
use crate::ops::{to_i64, Db, Res};

fn build_model(row: &Row) -> Res<ModelRecord> {
    Ok(ModelRow {
        id: row.try_get(0)?,
        format: row.try_get(1)?,
        path: row.try_get(2)?,
        size_bytes: row.try_get(3)?,
        modified_millis: row.try_get(4)?,
        digest: row.try_get(5)?,
        upstream_model: row.try_get(6)?,
        created_at: row.try_get(7)?,
    }
    .decode()?)
}

/// Stores a model unless the id exists.
pub async fn insert_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    let row = ModelRow::encode(model)?;
    let changed = db
        .execute(
            "INSERT INTO models (id, format, path, size_bytes, modified_millis, digest, \
             upstream_model, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (id) DO NOTHING",
            &[
                &row.id,
                &row.format,
                &row.path,
                &row.size_bytes,
                &row.modified_millis,
                &row.digest,
                &row.upstream_model,
                &row.created_at,
            ],
        )
        .await?;
    if changed == 1 {
        if let Some(path) = &row.path {
            db.execute("DELETE FROM removed_model_files WHERE path = $1", &[&path])
                .await?;
        }
    }
    Ok(changed == 1)
}

/// Stores a model found at startup unless its id exists or its file's model was deleted.
pub async fn insert_found_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    if let Some(file) = model.file() {
        let removed = db
            .query_opt(
                "SELECT 1 FROM removed_model_files WHERE path = $1 FOR SHARE",
                &[&file.path.as_str()],
            )
            .await?;
        if removed.is_some() {
            return Ok(false);
        }
    }
    insert_model(db, model).await
}

/// A model by id.
pub async fn model<C: Db>(db: &C, id: &ModelId) -> Res<Option<ModelRecord>> {
    let sql = format!("SELECT {MODEL_COLUMNS} FROM models WHERE id = $1");
    db.query_opt(&sql, &[&id.as_str()])
        .await?
        .as_ref()
        .map(build_model)
        .transpose()
}

/// Every model by id.
pub async fn list_models<C: Db>(db: &C) -> Res<Vec<ModelRecord>> {
    let sql = format!("SELECT {MODEL_COLUMNS} FROM models ORDER BY id");
    db.query(&sql, &[]).await?.iter().map(build_model).collect()
}

/// Deletes a model, remembering its file.
pub async fn delete_model<C: Db>(db: &C, id: &ModelId) -> Res<bool> {
    let sql = format!("SELECT {MODEL_COLUMNS} FROM models WHERE id = $1 FOR UPDATE");
    let Some(found) = db
        .query_opt(&sql, &[&id.as_str()])
        .await?
        .as_ref()
        .map(build_model)
        .transpose()?
    else {
        return Ok(false);
    };
    if let Some(file) = found.file() {
        db.execute(
            "INSERT INTO removed_model_files (path) VALUES ($1) ON CONFLICT (path) DO NOTHING",
            &[&file.path.as_str()],
        )
        .await?;
    }
    Ok(db
        .execute("DELETE FROM models WHERE id = $1", &[&id.as_str()])
        .await?
        == 1)
}

/// Records a model's new fingerprint.
pub async fn update_model_file<C: Db>(db: &C, id: &ModelId, file: &FileFingerprint) -> Res<()> {
    db.execute(
        "UPDATE models SET path = $1, size_bytes = $2, modified_millis = $3, digest = $4 \
         WHERE id = $5 AND upstream_model IS NULL",
        &[
            &file.path,
            &to_i64(file.size_bytes)?,
            &file.modified_millis,
            &file.digest.as_str(),
            &id.as_str(),
        ],
    )
    .await?;
    Ok(())
}
