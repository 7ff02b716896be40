//! Idempotency keys as the app's use case (I-8): claim, hold while answered, commit the reply
//! with the task, replay; another body is refused; a dropped request lets go of its key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use lmsp_app::{AppError, Claimed, Submitted};
use lmsp_domain::idempotency::{IdempotencyKey, Operation, RequestDigest, StoredReply};
use lmsp_domain::ports::TaskFilter;
use lmsp_domain::Task;

use support::*;

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

fn reply_naming(task: &Task) -> StoredReply {
    StoredReply {
        task_id: Some(task.id),
        body: task.id.to_string().into_bytes(),
    }
}

async fn task_count(h: &Harness) -> usize {
    let filter = TaskFilter {
        limit: 100,
        ..TaskFilter::default()
    };
    h.store.list_tasks(filter).await.unwrap().items.len()
}

/// I-8: the first request holds its key (a second one meanwhile is told it is in use); once
/// answered, the same request replays the reply committed with its task and creates nothing; a
/// request with another body is refused.
#[tokio::test]
async fn a_key_is_held_while_answered_then_replays_and_refuses_another_body_i8() {
    let h = harness(
        engine_with(Duration::ZERO, 1),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let digest = RequestDigest::of_canonical(b"first");
    let Claimed::Proceed(hold) = h
        .service
        .claim_key(&h.admin, Operation::CreateResponse, key("k"), digest)
        .await
        .unwrap()
    else {
        panic!("a fresh key proceeds");
    };
    assert!(matches!(
        h.service
            .claim_key(&h.admin, Operation::CreateResponse, key("k"), digest)
            .await,
        Err(AppError::KeyInUse)
    ));
    let Submitted::Created(task) = h
        .service
        .submit(&h.admin, &request(1), Some(&hold), &reply_naming)
        .await
        .unwrap()
    else {
        panic!("the first request creates its task");
    };
    hold.release().await;
    match h
        .service
        .claim_key(&h.admin, Operation::CreateResponse, key("k"), digest)
        .await
        .unwrap()
    {
        Claimed::Replay(reply) => assert_eq!(reply, reply_naming(&task)),
        Claimed::Proceed(_) => panic!("an answered key replays"),
    }
    assert!(matches!(
        h.service
            .claim_key(
                &h.admin,
                Operation::CreateResponse,
                key("k"),
                RequestDigest::of_canonical(b"other")
            )
            .await,
        Err(AppError::KeyReused)
    ));
    // Scoped by operation: the same key for another operation is another key.
    assert!(matches!(
        h.service
            .claim_key(&h.admin, Operation::RegisterModel, key("k"), digest)
            .await,
        Ok(Claimed::Proceed(_))
    ));
    assert_eq!(task_count(&h).await, 1);
}

/// A request dropped before it created anything lets go of its key: the next one proceeds.
#[tokio::test]
async fn a_hold_dropped_before_anything_was_created_frees_the_key() {
    let h = harness(
        engine_with(Duration::ZERO, 1),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let digest = RequestDigest::of_canonical(b"body");
    let claimed = h
        .service
        .claim_key(&h.admin, Operation::CreateResponse, key("dropped"), digest)
        .await
        .unwrap();
    drop(claimed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match h
            .service
            .claim_key(
                &h.admin,
                Operation::CreateResponse,
                key("dropped"),
                RequestDigest::of_canonical(b"new"),
            )
            .await
        {
            Ok(Claimed::Proceed(_)) => break,
            Err(AppError::KeyInUse) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => panic!("the key was not freed: {other:?}"),
        }
    }
}
