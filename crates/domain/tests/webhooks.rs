//! The webhook rules of `domain::webhooks`: which ends fire which events, the event id, what an
//! endpoint may be, when a failed delivery is tried again, and a delivery after an attempt.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_domain::batch::BatchStatus;
use lmsp_domain::webhooks::{
    batch_event, check_endpoint, event_id, task_event, AttemptOutcome, Delivery, RetryPolicy,
    WebhookEndpoint, WebhookEventType,
};
use lmsp_domain::{TaskStatus, Timestamp, WebhookEndpointId};
use ulid::Ulid;

fn at(millis: i64) -> Timestamp {
    Timestamp::from_millis(millis)
}

#[test]
fn each_end_of_a_response_or_batch_fires_its_event_and_nothing_else_fires() {
    assert_eq!(
        task_event(TaskStatus::Completed),
        Some(WebhookEventType::ResponseCompleted)
    );
    assert_eq!(
        task_event(TaskStatus::Failed),
        Some(WebhookEventType::ResponseFailed)
    );
    assert_eq!(
        task_event(TaskStatus::Cancelled),
        Some(WebhookEventType::ResponseCancelled)
    );
    for status in TaskStatus::UNFINISHED {
        assert_eq!(task_event(status), None, "{status}");
    }
    assert_eq!(
        batch_event(BatchStatus::Completed),
        Some(WebhookEventType::BatchCompleted)
    );
    assert_eq!(
        batch_event(BatchStatus::Failed),
        Some(WebhookEventType::BatchFailed)
    );
    assert_eq!(
        batch_event(BatchStatus::Cancelled),
        Some(WebhookEventType::BatchCancelled)
    );
    assert_eq!(
        batch_event(BatchStatus::Expired),
        Some(WebhookEventType::BatchExpired)
    );
    for status in BatchStatus::UNFINISHED {
        assert_eq!(batch_event(status), None, "{status}");
    }
}

#[test]
fn event_types_read_back_from_their_names_and_know_their_subject() {
    for name in [
        "response.completed",
        "response.failed",
        "response.cancelled",
        "response.incomplete",
        "batch.completed",
        "batch.failed",
        "batch.cancelled",
        "batch.expired",
    ] {
        let event_type = WebhookEventType::parse(name).unwrap();
        assert_eq!(event_type.as_str(), name);
        assert_eq!(event_type.is_response(), name.starts_with("response."));
    }
    assert_eq!(WebhookEventType::parse("eval.run.failed"), None);
}

#[test]
fn an_event_id_is_the_subjects_hex_digits_as_a_store_writes_them() {
    let subject = Ulid::from_parts(1_700_000_000_000, 0xabc);
    let id = event_id(subject);
    assert_eq!(id.len(), 4 + 32);
    assert!(id.starts_with("evt_"));
    let hex: String = subject
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(id, format!("evt_{hex}"));
}

#[test]
fn an_endpoint_needs_a_name_an_http_url_and_known_event_types() {
    let types = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        check_endpoint(
            "n",
            "https://example.com/hook",
            &types(&["batch.failed", "batch.failed"])
        ),
        Ok(vec![WebhookEventType::BatchFailed])
    );
    assert!(check_endpoint("n", "http://127.0.0.1:9/h?x=1", &types(&["batch.failed"])).is_ok());
    let param = |name: &str, url: &str, names: &[&str]| {
        check_endpoint(name, url, &types(names)).unwrap_err().0
    };
    assert_eq!(param("", "http://h/", &["batch.failed"]), "name");
    assert_eq!(param(" ", "http://h/", &["batch.failed"]), "name");
    assert_eq!(
        param(&"n".repeat(129), "http://h/", &["batch.failed"]),
        "name"
    );
    assert!(check_endpoint(&"n".repeat(128), "http://h/", &types(&["batch.failed"])).is_ok());
    for url in ["ftp://h/", "http://", "https:///x", "h/x", "http://h /", ""] {
        assert_eq!(param("n", url, &["batch.failed"]), "url", "{url:?}");
    }
    let long = format!("http://h/{}", "x".repeat(2048));
    assert_eq!(param("n", &long, &["batch.failed"]), "url");
    assert_eq!(param("n", "http://h/", &[]), "event_types");
    assert_eq!(param("n", "http://h/", &["video.failed"]), "event_types");
}

fn endpoint() -> WebhookEndpoint {
    WebhookEndpoint {
        id: WebhookEndpointId::from_ulid(Ulid::from_parts(1, 1)),
        name: String::from("n"),
        url: String::from("http://h/"),
        event_types: vec![WebhookEventType::ResponseCompleted],
        secret: String::from("whsec_abcdefgh"),
        previous_secret: None,
        created_at: at(0),
        updated_at: at(0),
    }
}

#[test]
fn an_endpoint_signs_with_its_old_secret_only_while_it_is_kept() {
    let plain = endpoint();
    assert!(plain.subscribes(WebhookEventType::ResponseCompleted));
    assert!(!plain.subscribes(WebhookEventType::BatchCompleted));
    assert_eq!(plain.secret_hint(), "whsec_…efgh");
    assert_eq!(plain.signing_secrets(at(5)), vec!["whsec_abcdefgh"]);
    let rotated = WebhookEndpoint {
        previous_secret: Some((String::from("whsec_old"), at(10))),
        ..endpoint()
    };
    assert_eq!(
        rotated.signing_secrets(at(9)),
        vec!["whsec_abcdefgh", "whsec_old"]
    );
    assert_eq!(rotated.signing_secrets(at(10)), vec!["whsec_abcdefgh"]);
}

#[test]
fn a_retry_waits_base_times_two_to_the_attempts_within_the_jitter_and_the_cap() {
    let policy = RetryPolicy {
        base_ms: 1_000,
        max_ms: 10_000,
        retry_for_ms: 1_000_000,
    };
    let wait = |attempts, jitter| {
        policy
            .next_attempt(attempts, at(0), at(100), jitter)
            .map(|t| t.as_millis() - 100)
    };
    assert_eq!(wait(1, 0.0), Some(1_000));
    assert_eq!(wait(2, 0.0), Some(2_000));
    assert_eq!(wait(3, 0.0), Some(4_000));
    assert_eq!(wait(5, 0.0), Some(10_000));
    assert_eq!(wait(60, 0.0), Some(10_000));
    assert_eq!(wait(1, 1.0), Some(1_200));
    assert_eq!(wait(1, -1.0), Some(800));
    assert_eq!(wait(1, 5.0), Some(1_200));
    assert_eq!(wait(0, 0.0), Some(1_000));
    // Past the retry period from the event: given up.
    assert_eq!(
        policy.next_attempt(1, at(0), at(999_000), 0.0),
        Some(at(1_000_000))
    );
    assert_eq!(policy.next_attempt(1, at(0), at(999_001), 0.0), None);
    assert_eq!(RetryPolicy::DEFAULT.base_ms, 1_000);
    assert_eq!(RetryPolicy::DEFAULT.max_ms, 3_600_000);
    assert_eq!(RetryPolicy::DEFAULT.retry_for_ms, 72 * 3_600_000);
}

fn delivery() -> Delivery {
    Delivery {
        endpoint_id: endpoint().id,
        event_id: String::from("evt_1"),
        event_type: WebhookEventType::ResponseCompleted,
        subject: Ulid::from_parts(2, 2),
        created_at: at(0),
        attempts: 0,
        next_attempt_at: Some(at(0)),
        last_status: None,
        last_error: None,
        last_attempt_at: None,
        delivered_at: None,
        given_up_at: None,
    }
}

#[test]
fn a_2xx_delivers_anything_else_retries_until_the_period_ends() {
    let policy = RetryPolicy {
        base_ms: 1_000,
        max_ms: 10_000,
        retry_for_ms: 5_000,
    };
    for status in [200, 204, 299] {
        let done = delivery().after_attempt(AttemptOutcome::Answered(status), &policy, at(7), 0.0);
        assert_eq!(
            (done.delivered_at, done.next_attempt_at, done.given_up_at),
            (Some(at(7)), None, None),
            "{status}"
        );
        assert_eq!(
            (done.attempts, done.last_status, done.last_attempt_at),
            (1, Some(status), Some(at(7)))
        );
    }
    for status in [199, 300, 404, 500] {
        let again = delivery().after_attempt(AttemptOutcome::Answered(status), &policy, at(7), 0.0);
        assert_eq!(
            (again.delivered_at, again.next_attempt_at, again.given_up_at),
            (None, Some(at(1_007)), None),
            "{status}"
        );
    }
    let silent = delivery().after_attempt(
        AttemptOutcome::NoAnswer(String::from("refused")),
        &policy,
        at(7),
        0.0,
    );
    assert_eq!(
        (silent.last_status, silent.last_error.as_deref()),
        (None, Some("refused"))
    );
    assert_eq!(silent.next_attempt_at, Some(at(1_007)));
    let late = Delivery {
        attempts: 3,
        ..delivery()
    }
    .after_attempt(AttemptOutcome::Answered(500), &policy, at(4_000), 0.0);
    assert_eq!(late.attempts, 4);
    assert_eq!(
        (late.next_attempt_at, late.given_up_at),
        (None, Some(at(4_000)))
    );
}
