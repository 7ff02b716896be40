//! Registered models: metadata only (P-1), and the files whose models a user deleted.

use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use tokio_postgres::Row;

use lmsp_storage_codec::flows::{self, ModelRows};

use crate::codec::{sql, ModelRow};
use crate::ops::{read, to_i64, Db, Res, Rows};

fn build_model(row: &Row) -> Res<ModelRecord> {
    Ok(read::<ModelRow>(row)?.decode()?)
}

/// The model row's insert, for the codec's model flows.
impl<C: Db> ModelRows for Rows<'_, C> {
    async fn insert_model_row(&self, row: &ModelRow) -> Res<bool> {
        let changed = self
            .0
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
        Ok(changed == 1)
    }
}

/// Stores a model unless the id exists ([`flows::insert_model`]).
pub async fn insert_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    flows::insert_model(&Rows(db), model).await
}

/// Stores a model found at startup unless its id exists or its file's model was deleted (that
/// file's row kept `FOR SHARE` until the transaction ends).
pub async fn insert_found_model<C: Db>(db: &C, model: &ModelRecord) -> Res<bool> {
    flows::insert_found_model(&Rows(db), model).await
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

/// Deletes a model (its row locked), remembering its file ([`flows::delete_model`]).
pub async fn delete_model<C: Db>(db: &C, id: &ModelId) -> Res<bool> {
    flows::delete_model(&Rows(db), id).await
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
