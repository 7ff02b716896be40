//! Webhooks: endpoints an admin registers, the events finished work announces to them, and when
//! a delivery is tried again.
//!
//! An event is fired by a background response's task reaching its end, or a batch reaching
//! its end ([`task_event`], [`batch_event`]). The store records one delivery per subscribed
//! endpoint in the same transaction as that end (an outbox), so an event is never lost; a
//! deliverer sends it after the commit and, until a receiver answers 2xx, tries again after
//! [`RetryPolicy::next_attempt`] with the same event id, so receivers can drop duplicates.

use strum::{IntoStaticStr, VariantArray};
use ulid::Ulid;

use crate::batch::BatchStatus;
use crate::ids::WebhookEndpointId;
use crate::status::TaskStatus;
use crate::time::Timestamp;

/// The longest endpoint name, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// The longest endpoint URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// What an event announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray)]
pub enum WebhookEventType {
    /// A background response completed.
    #[strum(serialize = "response.completed")]
    ResponseCompleted,
    /// A background response failed.
    #[strum(serialize = "response.failed")]
    ResponseFailed,
    /// A background response was cancelled.
    #[strum(serialize = "response.cancelled")]
    ResponseCancelled,
    /// A background response ended incomplete (accepted for OpenAI's SDKs; LMSP's responses
    /// complete or fail, so it is never sent).
    #[strum(serialize = "response.incomplete")]
    ResponseIncomplete,
    /// A batch completed.
    #[strum(serialize = "batch.completed")]
    BatchCompleted,
    /// A batch failed (its input was refused).
    #[strum(serialize = "batch.failed")]
    BatchFailed,
    /// A batch was cancelled.
    #[strum(serialize = "batch.cancelled")]
    BatchCancelled,
    /// A batch's completion window passed.
    #[strum(serialize = "batch.expired")]
    BatchExpired,
}

impl WebhookEventType {
    /// The name, e.g. `response.completed`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The type named `text`; `None` for any other.
    pub fn parse(text: &str) -> Option<Self> {
        Self::VARIANTS.iter().copied().find(|t| t.as_str() == text)
    }

    /// Whether the event is about a response (else a batch).
    pub fn is_response(self) -> bool {
        matches!(
            self,
            Self::ResponseCompleted
                | Self::ResponseFailed
                | Self::ResponseCancelled
                | Self::ResponseIncomplete
        )
    }
}

/// The event a background response's task fires on reaching `status`: one per end, none
/// before. (A synchronous or streamed request's task fires none: its client is there.)
pub fn task_event(status: TaskStatus) -> Option<WebhookEventType> {
    match status {
        TaskStatus::Completed => Some(WebhookEventType::ResponseCompleted),
        TaskStatus::Failed => Some(WebhookEventType::ResponseFailed),
        TaskStatus::Cancelled => Some(WebhookEventType::ResponseCancelled),
        TaskStatus::Queued | TaskStatus::Loading | TaskStatus::Running | TaskStatus::Cancelling => {
            None
        }
    }
}

/// The event a batch fires on reaching `status`: one per end.
pub fn batch_event(status: BatchStatus) -> Option<WebhookEventType> {
    match status {
        BatchStatus::Completed => Some(WebhookEventType::BatchCompleted),
        BatchStatus::Failed => Some(WebhookEventType::BatchFailed),
        BatchStatus::Cancelled => Some(WebhookEventType::BatchCancelled),
        BatchStatus::Expired => Some(WebhookEventType::BatchExpired),
        BatchStatus::Validating
        | BatchStatus::InProgress
        | BatchStatus::Finalizing
        | BatchStatus::Cancelling => None,
    }
}

/// The id of the event about the task or batch with this ULID (`evt_` and its 32 hex digits):
/// derived, because each ends once, so every delivery of one event, to every endpoint and in
/// every attempt, carries the same id, and a store can write it in SQL (`lower(hex(id))`).
pub fn event_id(subject: Ulid) -> String {
    format!("evt_{:032x}", u128::from(subject))
}

/// The id of the response or batch an event of `event_type` is about (`resp_…`, `batch_…`).
pub fn subject_id(event_type: WebhookEventType, subject: Ulid) -> String {
    if event_type.is_response() {
        crate::ids::ResponseId::from_ulid(subject).to_string()
    } else {
        crate::ids::BatchId::from_ulid(subject).to_string()
    }
}

/// A registered webhook endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// Its id.
    pub id: WebhookEndpointId,
    /// A name for people.
    pub name: String,
    /// Where events are posted (`http` or `https`).
    pub url: String,
    /// The events it receives (at least one, no repeats).
    pub event_types: Vec<WebhookEventType>,
    /// The signing secret (`whsec_` + base64 of the key).
    pub secret: String,
    /// The secret before the last rotation, and until when deliveries are signed with it too.
    pub previous_secret: Option<(String, Timestamp)>,
    /// When it was registered.
    pub created_at: Timestamp,
    /// When its configuration or secret last changed.
    pub updated_at: Timestamp,
}

impl WebhookEndpoint {
    /// Whether it receives events of `event_type`.
    pub fn subscribes(&self, event_type: WebhookEventType) -> bool {
        self.event_types.contains(&event_type)
    }

    /// A hint of the secret that gives nothing away: its prefix and last four characters.
    pub fn secret_hint(&self) -> String {
        let tail: String = {
            let chars: Vec<char> = self.secret.chars().collect();
            chars[chars.len().saturating_sub(4)..].iter().collect()
        };
        format!("whsec_…{tail}")
    }

    /// The secrets a delivery at `now` is signed with: the current one, and the previous one
    /// while it is kept after a rotation.
    pub fn signing_secrets(&self, now: Timestamp) -> Vec<&str> {
        let mut secrets = vec![self.secret.as_str()];
        if let Some((previous, until)) = &self.previous_secret {
            if now < *until {
                secrets.push(previous.as_str());
            }
        }
        secrets
    }
}

/// What a request says an endpoint is, checked: a name of 1–128 characters, an `http` or
/// `https` URL with a host, at least one event type, none repeated.
pub fn check_endpoint(
    name: &str,
    url: &str,
    event_types: &[String],
) -> Result<Vec<WebhookEventType>, (&'static str, String)> {
    if name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err((
            "name",
            format!("`name` must be 1–{MAX_NAME_CHARS} characters"),
        ));
    }
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let host = rest.map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
    if url.len() > MAX_URL_BYTES
        || host.is_none_or(str::is_empty)
        || url.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err((
            "url",
            String::from("`url` must be an http:// or https:// URL with a host"),
        ));
    }
    if event_types.is_empty() {
        return Err(("event_types", String::from("name at least one event type")));
    }
    let mut types = Vec::new();
    for (i, name) in event_types.iter().enumerate() {
        let Some(event_type) = WebhookEventType::parse(name) else {
            return Err((
                "event_types",
                format!("event_types[{i}]: `{name}` is not an event type LMSP sends"),
            ));
        };
        if !types.contains(&event_type) {
            types.push(event_type);
        }
    }
    Ok(types)
}

/// One event's delivery to one endpoint, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The endpoint.
    pub endpoint_id: WebhookEndpointId,
    /// The event's id (`evt_…`), the same in every attempt.
    pub event_id: String,
    /// What it announces.
    pub event_type: WebhookEventType,
    /// The response or batch it is about: its ULID.
    pub subject: Ulid,
    /// When the event happened (the end it announces).
    pub created_at: Timestamp,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due (`None` once delivered or given up).
    pub next_attempt_at: Option<Timestamp>,
    /// The receiver's status at the last attempt, if it answered.
    pub last_status: Option<u16>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// When the last attempt was made.
    pub last_attempt_at: Option<Timestamp>,
    /// When a receiver answered 2xx.
    pub delivered_at: Option<Timestamp>,
    /// When the retries ran out.
    pub given_up_at: Option<Timestamp>,
}

/// How one attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The receiver answered with this status.
    Answered(u16),
    /// No answer: the connection failed or timed out.
    NoAnswer(String),
}

/// When deliveries are tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait before the first retry (`--webhook-retry-base`), in milliseconds.
    pub base_ms: i64,
    /// The longest wait between two attempts, in milliseconds.
    pub max_ms: i64,
    /// How long after the event attempts go on (`--webhook-retry-for`), in milliseconds.
    pub retry_for_ms: i64,
}

impl RetryPolicy {
    /// One second, doubling, at most an hour apart, for 72 hours.
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        base_ms: 1_000,
        max_ms: 3_600_000,
        retry_for_ms: 72 * 3_600_000,
    };

    /// When to try again after `attempts` failed attempts, at `now`: `base · 2^(attempts-1)`,
    /// at most `max`, moved by `jitter` (−1…1) times 20 %; `None` when that is past the retry
    /// period from the event (`created_at`).
    pub fn next_attempt(
        &self,
        attempts: u32,
        created_at: Timestamp,
        now: Timestamp,
        jitter: f64,
    ) -> Option<Timestamp> {
        let doublings = attempts.saturating_sub(1).min(40);
        let wait = self
            .base_ms
            .saturating_mul(1_i64 << doublings)
            .min(self.max_ms);
        let jitter = jitter.clamp(-1.0, 1.0) * 0.2;
        // Rounded to whole milliseconds; the factor is within 0.8…1.2.
        let wait = (wait as f64 * (1.0 + jitter)).round() as i64;
        let at = now.plus_millis(wait.max(1));
        (at <= created_at.plus_millis(self.retry_for_ms)).then_some(at)
    }
}

impl Delivery {
    /// The delivery after an attempt at `now` that went `outcome`: delivered on a 2xx;
    /// otherwise due again per `policy` (with `jitter`), or given up once its period is over.
    pub fn after_attempt(
        &self,
        outcome: AttemptOutcome,
        policy: &RetryPolicy,
        now: Timestamp,
        jitter: f64,
    ) -> Delivery {
        let attempts = self.attempts.saturating_add(1);
        let (last_status, last_error) = match outcome {
            AttemptOutcome::Answered(status) => (Some(status), None),
            AttemptOutcome::NoAnswer(error) => (None, Some(error)),
        };
        let delivered = last_status.is_some_and(|status| (200..300).contains(&status));
        let next = if delivered {
            None
        } else {
            policy.next_attempt(attempts, self.created_at, now, jitter)
        };
        Delivery {
            attempts,
            next_attempt_at: next,
            last_status,
            last_error,
            last_attempt_at: Some(now),
            delivered_at: delivered.then_some(now),
            given_up_at: (!delivered && next.is_none()).then_some(now),
            ..self.clone()
        }
    }
}
