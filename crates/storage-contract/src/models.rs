//! Registered models (P-1: metadata only): registering by a user and at startup, reading,
//! listing, re-hashing, and deletions that stick.

use lmsp_domain::model::{ModelFormat, ModelRecord, ModelSource};

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// P-1: a registered model reads back as stored, once: a second model under the same id is
/// refused and changes nothing; the list is ordered by id and holds file and upstream models.
pub async fn a_model_is_registered_once_and_listed_by_id_p1<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let file = file_model("b-model", "b-model.gguf");
    let upstream = upstream_model("a-model", "served-name");
    assert!(store.insert_model(file.clone()).await.unwrap());
    assert!(store.insert_model(upstream.clone()).await.unwrap());
    let mut clash = file_model("b-model", "elsewhere.gguf");
    clash.created_at = time(99);
    assert!(!store.insert_model(clash).await.unwrap(), "the id exists");
    assert_eq!(store.model(&file.id).await.unwrap(), Some(file.clone()));
    assert_eq!(
        store.model(&upstream.id).await.unwrap(),
        Some(upstream.clone())
    );
    assert_eq!(store.model(&model("missing")).await.unwrap(), None);
    assert_eq!(store.list_models().await.unwrap(), vec![upstream, file]);
    assert!(listener.events().is_empty(), "models write no task event");
}

/// A model id may hold `/` and `:` (as in `org/name:tag`); it reads back and deletes.
pub async fn a_model_id_with_slashes_reads_and_deletes<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let record = file_model("org/name:v1", "org-name-v1.gguf");
    assert!(store.insert_model(record.clone()).await.unwrap());
    assert_eq!(store.model(&record.id).await.unwrap(), Some(record.clone()));
    assert!(store.delete_model(&record.id).await.unwrap());
    assert_eq!(store.model(&record.id).await.unwrap(), None);
}

/// A deletion sticks: a model a user deleted is not registered again from the same file when
/// the models directory is scanned at startup; a user may still register the file again, and
/// after that deletion it stays away too.
pub async fn a_deleted_models_file_is_not_found_again_at_startup<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let record = file_model("tiny", "tiny.gguf");
    assert!(store.insert_found_model(record.clone()).await.unwrap());
    assert!(
        !store.insert_found_model(record.clone()).await.unwrap(),
        "found twice, stored once"
    );
    assert!(store.delete_model(&record.id).await.unwrap());
    assert!(
        !store.delete_model(&record.id).await.unwrap(),
        "deleted already"
    );
    assert!(
        !store.insert_found_model(record.clone()).await.unwrap(),
        "a deletion sticks"
    );
    assert_eq!(store.model(&record.id).await.unwrap(), None);
    let mut renamed = record.clone();
    renamed.id = model("tiny-again");
    assert!(
        !store.insert_found_model(renamed).await.unwrap(),
        "the file, not the id, was deleted"
    );
    assert!(
        store.insert_model(record.clone()).await.unwrap(),
        "a user may register it again"
    );
    assert_eq!(store.model(&record.id).await.unwrap(), Some(record));
    let other = file_model("other", "other.gguf");
    assert!(
        store.insert_found_model(other).await.unwrap(),
        "other files are found"
    );
}

/// A re-hashed file's fingerprint replaces the stored one; nothing else of the model changes.
pub async fn a_rehashed_fingerprint_replaces_the_stored_one<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let record = file_model("rehash", "rehash.gguf");
    assert!(store.insert_model(record.clone()).await.unwrap());
    let changed = fingerprint("rehash.gguf", 9);
    store
        .update_model_file(&record.id, changed.clone())
        .await
        .unwrap();
    let expected = ModelRecord {
        source: ModelSource::File {
            format: ModelFormat::Gguf,
            file: changed,
        },
        ..record.clone()
    };
    assert_eq!(store.model(&record.id).await.unwrap(), Some(expected));
}
