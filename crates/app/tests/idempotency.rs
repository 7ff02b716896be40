//! Idempotency keys as the app's one use case (I-8): a request with a key holds it while it is
//! answered, commits the reply a retry gets with what it creates, and a retry gets that reply
//! again; another body is refused; a synchronous request keeps its final reply with its key even
//! when its client went away, so a retry gets it after the task was deleted; a stream whose task
//! is gone is answered as gone; a model registers with its key's reply in one transaction.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use lmsp_app::{
    AppError, FromTask, IdempotentRequest, KeptReply, Keyed, ModelOrigin, TaskAnswer, TaskReplies,
    TaskReply,
};
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyScope, KeyClaim, KeyDecision, Operation, RequestDigest, StoredReply,
};
use lmsp_domain::ports::{DeleteOutcome, TaskFilter};
use lmsp_domain::validation::SubmitRequest;
use lmsp_domain::{ModelId, ModelRecord, Response, Task, TaskId};

use support::*;

/// A test encoding of the replies a key keeps: `accepted <task>`, `outcome <task>`,
/// `events <task>`, `finished <task> <status> <output>`.
struct TextReplies;

impl TaskReplies for TextReplies {
    fn accepted(&self, task: &Task) -> StoredReply {
        text(task.id, format!("accepted {}", task.id))
    }

    fn follow(&self, task: &Task, how: FromTask) -> StoredReply {
        let word = match how {
            FromTask::Outcome => "outcome",
            FromTask::Events => "events",
        };
        text(task.id, format!("{word} {}", task.id))
    }

    fn finished(&self, task: &Task, response: Option<&Response>) -> StoredReply {
        let output = response.map_or("-", |r| r.output_text.as_str());
        text(
            task.id,
            format!("finished {} {} {output}", task.id, task.status),
        )
    }

    fn read(&self, kept: &StoredReply) -> KeptReply {
        let body = String::from_utf8(kept.body.clone()).unwrap();
        let mut words = body.split(' ');
        let how = match words.next() {
            Some("outcome") => FromTask::Outcome,
            Some("events") => FromTask::Events,
            _ => return KeptReply::Whole,
        };
        let task_id = TaskId::parse(words.next().unwrap()).unwrap();
        KeptReply::FromTask(task_id, how)
    }
}

fn text(task_id: TaskId, body: String) -> StoredReply {
    StoredReply {
        task_id: Some(task_id),
        body: body.into_bytes(),
    }
}

fn keyed(key: &str, body: &str) -> Option<IdempotentRequest> {
    Some(key_and_digest(key, body))
}

fn key_and_digest(key: &str, body: &str) -> IdempotentRequest {
    IdempotentRequest {
        key: IdempotencyKey::parse(key).unwrap(),
        digest: RequestDigest::of_canonical(body.as_bytes()),
    }
}

fn synchronous(tokens: u64) -> SubmitRequest {
    SubmitRequest {
        background: false,
        ..request(tokens)
    }
}

fn streaming(tokens: u64) -> SubmitRequest {
    SubmitRequest {
        stream: true,
        ..request(tokens)
    }
}

async fn ask(
    h: &Harness,
    request: &SubmitRequest,
    key: Option<IdempotentRequest>,
) -> Result<TaskReply, AppError> {
    h.service
        .request_task(
            &h.admin,
            Operation::CreateResponse,
            request,
            key,
            Arc::new(TextReplies),
        )
        .await
}

async fn tasks(h: &Harness) -> Vec<Task> {
    let filter = TaskFilter {
        limit: 100,
        ..TaskFilter::default()
    };
    h.store.list_tasks(filter).await.unwrap().items
}

fn kept_text(reply: &TaskReply) -> String {
    match &reply.answer {
        TaskAnswer::Kept(kept) => String::from_utf8(kept.body.clone()).unwrap(),
        other => panic!("a kept reply, not {other:?}"),
    }
}

/// I-8: a background request's key keeps its 202, which is also the first answer; the same
/// request again gets it back and creates nothing; another body is refused; the same key for
/// another operation is another key.
#[tokio::test]
async fn a_background_key_replays_its_202_and_refuses_another_body_i8() {
    let h = harness(
        engine_with(Duration::ZERO, 1),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;

    let first = ask(&h, &request(1), keyed("k", "first")).await.unwrap();
    let again = ask(&h, &request(1), keyed("k", "first")).await.unwrap();
    let other = ask(&h, &request(1), keyed("k", "other")).await;

    let created = tasks(&h).await;
    assert_eq!(created.len(), 1, "one task for the key");
    assert_eq!(kept_text(&first), format!("accepted {}", created[0].id));
    assert!(!first.replayed);
    assert_eq!(
        (kept_text(&again), again.replayed),
        (kept_text(&first), true)
    );
    assert!(matches!(other, Err(AppError::KeyReused)), "{other:?}");
    let chat = h
        .service
        .request_task(
            &h.admin,
            Operation::CreateChatCompletion,
            &request(1),
            keyed("k", "first"),
            Arc::new(TextReplies),
        )
        .await
        .unwrap();
    assert!(!chat.replayed, "a key is scoped to its operation");
    assert_eq!(tasks(&h).await.len(), 2);
}

/// I-8: while a synchronous request waits for its task the key is in use; its answer is the
/// final reply it kept with the key, which a retry then gets again.
#[tokio::test]
async fn a_synchronous_key_is_in_use_while_it_waits_then_replays_its_final_reply_i8() {
    let h = Arc::new(
        harness(
            engine_with(Duration::from_millis(30), 5),
            files_ok(),
            settings(Duration::from_secs(5)),
        )
        .await,
    );
    let first = tokio::spawn({
        let h = Arc::clone(&h);
        async move { ask(&h, &synchronous(5), keyed("sync", "body")).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tasks(&h).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no task was created"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let busy = ask(&h, &synchronous(5), keyed("sync", "body")).await;
    let first = first.await.unwrap().unwrap();
    let again = ask(&h, &synchronous(5), keyed("sync", "body"))
        .await
        .unwrap();

    assert!(matches!(busy, Err(AppError::KeyInUse)), "{busy:?}");
    let task = &tasks(&h).await[0];
    assert_eq!(
        kept_text(&first),
        format!("finished {} completed w0 w1 w2 w3 w4 ", task.id)
    );
    assert!(!first.replayed);
    assert_eq!(
        (kept_text(&again), again.replayed),
        (kept_text(&first), true)
    );
    assert_eq!(tasks(&h).await.len(), 1);
}

/// What the store keeps under the admin's `key` for `body` once it was let go (`None` while it
/// is held), without claiming anything.
async fn stored_reply(h: &Harness, key: &str, body: &str) -> Option<String> {
    let now = h.service.now();
    let IdempotentRequest { key, digest } = key_and_digest(key, body);
    let probe = KeyClaim {
        scope: IdempotencyScope {
            client_id: h.admin.client_id,
            operation: Operation::CreateResponse,
        },
        key,
        digest,
        holder: h.service.instance(),
        hold_until: now.plus_millis(60_000),
        expires_at: now.plus_millis(3_600_000),
    };
    match h.store.claim_key(&probe, now).await.unwrap() {
        KeyDecision::Replay(reply) => Some(String::from_utf8(reply.body).unwrap()),
        KeyDecision::InUse => None,
        other => panic!("the key was answered, not {other:?}"),
    }
}

/// I-8 (a retry after the task was purged or deleted answered 404): a synchronous request whose
/// client goes away while it waits lets go of its key at once, and its final reply is still kept
/// with the key when the task finishes; so a retry after the task was deleted gets that reply,
/// and starts no second task.
#[tokio::test]
async fn a_dropped_synchronous_request_still_keeps_its_final_reply_past_its_task_i8() {
    let h = Arc::new(
        harness(
            engine_with(Duration::from_millis(20), 3),
            files_ok(),
            settings(Duration::from_secs(5)),
        )
        .await,
    );
    let client = tokio::spawn({
        let h = Arc::clone(&h);
        async move { ask(&h, &synchronous(3), keyed("gone-client", "body")).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let task = loop {
        if let Some(task) = tasks(&h).await.pop() {
            break task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no task was created"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    client.abort();
    assert!(
        client.await.unwrap_err().is_cancelled(),
        "the client went away"
    );

    let finished_task = finished(&h, &task).await;
    let expected = format!("finished {} completed w0 w1 w2 ", finished_task.id);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stored = stored_reply(&h, "gone-client", "body").await;
        if stored.as_ref() == Some(&expected) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the final reply was never kept with the key: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deleted = h.store.delete_finished(task.id, None).await.unwrap();
    let retry = ask(&h, &synchronous(3), keyed("gone-client", "body"))
        .await
        .unwrap();

    assert_eq!(deleted, DeleteOutcome::Deleted);
    assert_eq!((kept_text(&retry), retry.replayed), (expected, true));
    assert!(tasks(&h).await.is_empty(), "no second task was started");
}

/// I-8: a streaming request's key keeps a pointer to its task: a retry streams the same task;
/// once the task is deleted, a retry is told it is gone and starts nothing.
#[tokio::test]
async fn a_stream_key_follows_its_task_and_says_when_it_is_gone_i8() {
    let h = harness(
        engine_with(Duration::ZERO, 2),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let first = ask(&h, &streaming(2), keyed("stream", "body"))
        .await
        .unwrap();
    let TaskAnswer::Stream(task) = first.answer else {
        panic!("a stream, not {:?}", first.answer);
    };
    finished(&h, &task).await;

    let retry = ask(&h, &streaming(2), keyed("stream", "body"))
        .await
        .unwrap();
    h.store.delete_finished(task.id, None).await.unwrap();
    let after_delete = ask(&h, &streaming(2), keyed("stream", "body"))
        .await
        .unwrap();

    assert!(
        matches!(&retry.answer, TaskAnswer::Stream(again) if again.id == task.id),
        "{retry:?}"
    );
    assert!(retry.replayed);
    assert_eq!(after_delete.answer, TaskAnswer::Gone(task.id));
    assert!(after_delete.replayed);
    assert!(tasks(&h).await.is_empty(), "no second task was started");
}

/// I-8: a request that fails before it creates anything lets go of its key: the next request
/// with the key proceeds, with another body too.
#[tokio::test]
async fn a_request_that_fails_before_creating_anything_frees_its_key_i8() {
    let h = harness(
        engine_with(Duration::ZERO, 1),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let unknown = SubmitRequest {
        model: ModelId::parse("no-such-model").unwrap(),
        ..request(1)
    };

    let failed = ask(&h, &unknown, keyed("free", "first")).await;
    let next = ask(&h, &request(1), keyed("free", "second")).await.unwrap();

    assert!(
        matches!(failed, Err(AppError::ModelNotFound(_))),
        "{failed:?}"
    );
    assert!(!next.replayed);
    assert_eq!(tasks(&h).await.len(), 1);
}

/// P-1, I-8: a model registered under a key commits with the key's reply; the same request
/// again gets that reply and registers nothing; another body is refused; a registration that
/// fails (the id is taken) lets go of its key.
#[tokio::test]
async fn a_model_registers_with_its_keys_reply_i8() {
    let h = harness(
        engine_with(Duration::ZERO, 1),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let reply = |record: &ModelRecord| StoredReply {
        task_id: None,
        body: format!("201 {}", record.id).into_bytes(),
    };
    let register = |id: &str, key: &str, body: &str| {
        h.service.models().register(
            &h.admin,
            ModelId::parse(id).unwrap(),
            ModelOrigin::Upstream(String::from("upstream-name")),
            keyed(key, body),
            &reply,
        )
    };

    let first = register("m", "model-key", "m").await.unwrap();
    let again = register("m", "model-key", "m").await.unwrap();
    let other = register("m2", "model-key", "m2").await;
    let taken = register("m", "taken-key", "m").await;
    let freed = register("m3", "taken-key", "m3").await.unwrap();

    assert!(matches!(&first, Keyed::Fresh(record) if record.id.as_str() == "m"));
    assert_eq!(
        again,
        Keyed::Replay(StoredReply {
            task_id: None,
            body: b"201 m".to_vec(),
        })
    );
    assert!(matches!(other, Err(AppError::KeyReused)), "{other:?}");
    assert!(
        matches!(taken, Err(AppError::AlreadyExists(_))),
        "{taken:?}"
    );
    assert!(matches!(&freed, Keyed::Fresh(record) if record.id.as_str() == "m3"));
    let models = h.service.models().list(&h.admin).await.unwrap();
    let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
    assert!(!ids.contains(&"m2"), "{ids:?}");
}
