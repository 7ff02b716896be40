//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use tokio_postgres::Row;

use crate::codec::{sql, ModelRow};
use crate::ops::{read, to_i64, Db, Res};

fn build_model(row: &Row) -> Res<ModelRecord> {
    Ok(read::<ModelRow>(row)?.decode()?)
}

/// Stores a model unless the id exists.
pub async fn insert_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    let row = ModelRow::encode(model)?;
    let changed = db
        .execute(
            &sql::insert_model(),
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
            db.execute(sql::FORGET_REMOVED_MODEL_FILE, &[&path]).await?;
        }
    }
    Ok(changed == 1)
}

/// Stores a model found at startup unless its id exists or its file's model was deleted.
pub async fn insert_found_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    if let Some(file) = model.file() {
        let removed = db
            .query_opt(
                &format!("{} FOR SHARE", sql::REMOVED_MODEL_FILE),
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
    db.query_opt(&sql::model_by_id(), &[&id.as_str()])
        .await?
        .as_ref()
        .map(build_model)
        .transpose()
}

/// Every model by id.
pub async fn list_models<C: Db>(db: &C) -> Res<Vec<ModelRecord>> {
    db.query(&sql::all_models(), &[])
        .await?
        .iter()
        .map(build_model)
        .collect()
}

/// Deletes a model, remembering its file.
pub async fn delete_model<C: Db>(db: &C, id: &ModelId) -> Res<bool> {
    let locked = format!("{} FOR UPDATE", sql::model_by_id());
    let Some(found) = db
        .query_opt(&locked, &[&id.as_str()])
        .await?
        .as_ref()
        .map(build_model)
        .transpose()?
    else {
        return Ok(false);
    };
    if let Some(file) = found.file() {
        db.execute(sql::REMEMBER_REMOVED_MODEL_FILE, &[&file.path.as_str()])
            .await?;
    }
    Ok(db.execute(sql::DELETE_MODEL, &[&id.as_str()]).await? == 1)
}

/// Records a model's new fingerprint.
pub async fn update_model_file<C: Db>(db: &C, id: &ModelId, file: &FileFingerprint) -> Res<()> {
    db.execute(
        sql::UPDATE_MODEL_FILE,
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
