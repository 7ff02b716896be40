//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource};
use lmsp_domain::time::Timestamp;
use tokio_postgres::Row;

use crate::ops::{corrupt, from_i64, to_i64, Db, Res};

fn build_model(row: &Row) -> Res<ModelRecord> {
    let id: String = row.try_get(0)?;
    let format: String = row.try_get(1)?;
    let path: Option<String> = row.try_get(2)?;
    let size: Option<i64> = row.try_get(3)?;
    let mtime: Option<i64> = row.try_get(4)?;
    let digest: Option<String> = row.try_get(5)?;
    let upstream: Option<String> = row.try_get(6)?;
    let created_at: i64 = row.try_get(7)?;
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
pub async fn insert_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
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
    let changed = db
        .execute(
            "INSERT INTO models (id, format, path, size_bytes, modified_millis, digest, \
             upstream_model, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (id) DO NOTHING",
            &[
                &model.id.as_str(),
                &model.format_name(),
                &path,
                &size,
                &mtime,
                &digest,
                &upstream,
                &model.created_at.as_millis(),
            ],
        )
        .await?;
    if changed == 1 {
        if let Some(path) = path {
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
