//! The outbound HTTP adapter of webhooks ([`WebhookSender`]): encodes an event as OpenAI sends
//! it (`{"object": "event", "id", "type", "created_at", "data": {"id"}}`), signs it as Standard
//! Webhooks do (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of
//! "id.timestamp.body">` under each secret's key), posts it to the receiver's URL (`http` or
//! `https`) following no redirect, and reports the receiver's status, or why there was none.

use std::time::Duration;

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

use lmsp_domain::ports::{OutgoingEvent, WebhookSender};
use lmsp_domain::webhooks::AttemptOutcome;
use lmsp_domain::Timestamp;

/// Why the sender could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the webhook HTTP client: {0}")]
pub struct SenderError(#[from] reqwest::Error);

/// An event's body.
#[derive(Debug, Serialize)]
struct EventBody<'a> {
    object: &'static str,
    id: &'a str,
    #[serde(rename = "type")]
    event_type: &'static str,
    created_at: i64,
    data: EventData<'a>,
}

#[derive(Debug, Serialize)]
struct EventData<'a> {
    id: &'a str,
}

/// The JSON body of `event`.
pub fn event_body(event: &OutgoingEvent) -> Vec<u8> {
    let body = EventBody {
        object: "event",
        id: &event.id,
        event_type: event.event_type.as_str(),
        created_at: event.created_at.as_unix_seconds(),
        data: EventData {
            id: &event.subject_id,
        },
    };
    // A struct of strings and integers always encodes.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The key of a secret: the base64 after `whsec_` (as OpenAI's SDKs read it), or the text's
/// bytes when it has no such prefix.
fn key_of(secret: &str) -> Vec<u8> {
    match secret.strip_prefix("whsec_") {
        Some(encoded) => STANDARD
            .decode(encoded)
            .unwrap_or_else(|_| secret.as_bytes().to_vec()),
        None => secret.as_bytes().to_vec(),
    }
}

/// The `webhook-signature` header: `v1,<signature>` under each secret, space-separated.
pub fn signature(secrets: &[String], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .filter_map(|secret| {
            let mut mac = Hmac::<Sha256>::new_from_slice(&key_of(secret)).ok()?;
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            Some(format!(
                "v1,{}",
                STANDARD.encode(mac.finalize().into_bytes())
            ))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Posts deliveries with one pooled HTTP client.
#[derive(Debug, Clone)]
pub struct HttpWebhookSender {
    client: reqwest::Client,
}

impl HttpWebhookSender {
    /// A sender; `connect_timeout` bounds opening a connection.
    pub fn new(connect_timeout: Duration) -> Result<Self, SenderError> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("lmsp-webhooks/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(connect_timeout)
            .build()?;
        Ok(Self { client })
    }
}

#[async_trait]
impl WebhookSender for HttpWebhookSender {
    async fn send(
        &self,
        url: &str,
        event: &OutgoingEvent,
        secrets: &[String],
        now: Timestamp,
        timeout: Duration,
    ) -> AttemptOutcome {
        let body = event_body(event);
        let timestamp = now.as_unix_seconds();
        let request = self
            .client
            .post(url)
            .timeout(timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &event.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                signature(secrets, &event.id, timestamp, &body),
            )
            .body(body);
        match request.send().await {
            Ok(response) => AttemptOutcome::Answered(response.status().as_u16()),
            Err(error) if error.is_timeout() => {
                AttemptOutcome::NoAnswer(format!("no answer within {} ms", timeout.as_millis()))
            }
            Err(error) => AttemptOutcome::NoAnswer(without_url(&error)),
        }
    }
}

/// An error's text without the URL (it may carry credentials in its user info).
fn without_url(error: &reqwest::Error) -> String {
    let text = error.to_string();
    match error.url() {
        Some(url) => text.replace(url.as_str(), "the endpoint"),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use axum::Router;
    use lmsp_domain::webhooks::WebhookEventType;

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        format!("http://{address}/hook")
    }

    fn event() -> OutgoingEvent {
        OutgoingEvent {
            id: String::from("evt_1"),
            event_type: WebhookEventType::ResponseCompleted,
            created_at: Timestamp::from_millis(1_700_000_000_000),
            subject_id: String::from("resp_1"),
        }
    }

    /// The signature of Standard Webhooks' own example: secret
    /// `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`, id `msg_p5jXN8AQM9LWM0D4loKWxJek`, timestamp
    /// 1614265330, body `{"test": 2432232314}`.
    #[test]
    fn the_signature_is_standard_webhooks() {
        let signed = signature(
            &[String::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signed, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let two = signature(
            &[
                String::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                String::from("other"),
            ],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert!(two.starts_with(&format!("{signed} v1,")), "{two}");
    }

    #[test]
    fn the_body_is_openais_event_shape() {
        let body: serde_json::Value = serde_json::from_slice(&event_body(&event())).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"object": "event", "id": "evt_1", "type": "response.completed",
                               "created_at": 1_700_000_000, "data": {"id": "resp_1"}})
        );
    }

    #[tokio::test]
    async fn a_post_carries_the_signed_headers_and_reports_the_status() {
        let router = Router::new().route(
            "/hook",
            post(|headers: HeaderMap, body: String| async move {
                let id = headers.get("webhook-id").and_then(|v| v.to_str().ok());
                let stamp = headers
                    .get("webhook-timestamp")
                    .and_then(|v| v.to_str().ok());
                let signed = headers
                    .get("webhook-signature")
                    .and_then(|v| v.to_str().ok());
                let expected = signature(
                    &[String::from("whsec_c2VjcmV0")],
                    "evt_1",
                    stamp.and_then(|s| s.parse().ok()).unwrap_or_default(),
                    body.as_bytes(),
                );
                if id == Some("evt_1") && signed == Some(expected.as_str()) {
                    StatusCode::ACCEPTED
                } else {
                    StatusCode::BAD_REQUEST
                }
            }),
        );
        let url = serve(router).await;
        let sender = HttpWebhookSender::new(Duration::from_secs(2)).unwrap();
        let outcome = sender
            .send(
                &url,
                &event(),
                &[String::from("whsec_c2VjcmV0")],
                Timestamp::from_millis(1_700_000_000_000),
                Duration::from_secs(5),
            )
            .await;
        assert_eq!(outcome, AttemptOutcome::Answered(202));
    }

    #[tokio::test]
    async fn a_receiver_that_hangs_is_no_answer_after_the_timeout() {
        let router = Router::new().route(
            "/hook",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                StatusCode::OK
            }),
        );
        let url = serve(router).await;
        let sender = HttpWebhookSender::new(Duration::from_secs(2)).unwrap();
        let outcome = sender
            .send(
                &url,
                &event(),
                &[],
                Timestamp::from_millis(0),
                Duration::from_millis(200),
            )
            .await;
        assert!(
            matches!(outcome, AttemptOutcome::NoAnswer(_)),
            "{outcome:?}"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_no_answer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let sender = HttpWebhookSender::new(Duration::from_secs(2)).unwrap();
        let outcome = sender
            .send(
                &format!("http://{address}/hook"),
                &event(),
                &[],
                Timestamp::from_millis(0),
                Duration::from_secs(2),
            )
            .await;
        assert!(
            matches!(outcome, AttemptOutcome::NoAnswer(_)),
            "{outcome:?}"
        );
    }
}
