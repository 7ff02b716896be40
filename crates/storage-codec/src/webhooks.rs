//! The rows of webhook endpoints and deliveries in their stored form: the same columns in both
//! adapters, which only bind them.

use lmsp_domain::ids::WebhookEndpointId;
use lmsp_domain::time::Timestamp;
use lmsp_domain::webhooks::{Delivery, WebhookEndpoint, WebhookEventType};

use crate::rows::{key_of, u32_of, ulid_of};
use crate::{corrupt, DbError};

/// The columns an endpoint is read with, in [`EndpointRow`]'s order.
pub const ENDPOINT_COLUMNS: &str = "id, name, url, event_types, secret, previous_secret, \
     previous_valid_until, created_at, updated_at";

/// The columns a delivery is read with, in [`DeliveryRow`]'s order.
pub const DELIVERY_COLUMNS: &str = "endpoint_id, event_id, event_type, subject, created_at, \
     attempts, next_attempt_at, last_status, last_error, last_attempt_at, delivered_at, \
     given_up_at";

/// The stored key of an endpoint id.
pub fn endpoint_key(id: WebhookEndpointId) -> [u8; 16] {
    key_of(id.ulid())
}

/// An endpoint's row.
#[derive(Debug, Clone)]
pub struct EndpointRow {
    /// `id`.
    pub id: Vec<u8>,
    /// `name`.
    pub name: String,
    /// `url`.
    pub url: String,
    /// `event_types`: the names between single spaces, with a space before the first and after
    /// the last (so a trigger finds one with `instr`/`strpos`).
    pub event_types: String,
    /// `secret`.
    pub secret: String,
    /// `previous_secret`.
    pub previous_secret: Option<String>,
    /// `previous_valid_until`.
    pub previous_valid_until: Option<i64>,
    /// `created_at`.
    pub created_at: i64,
    /// `updated_at`.
    pub updated_at: i64,
}

impl EndpointRow {
    /// The row of `endpoint`.
    pub fn encode(endpoint: &WebhookEndpoint) -> Self {
        let names: Vec<&str> = endpoint.event_types.iter().map(|t| t.as_str()).collect();
        Self {
            id: endpoint_key(endpoint.id).to_vec(),
            name: endpoint.name.clone(),
            url: endpoint.url.clone(),
            event_types: format!(" {} ", names.join(" ")),
            secret: endpoint.secret.clone(),
            previous_secret: endpoint.previous_secret.as_ref().map(|(s, _)| s.clone()),
            previous_valid_until: endpoint
                .previous_secret
                .as_ref()
                .map(|(_, until)| until.as_millis()),
            created_at: endpoint.created_at.as_millis(),
            updated_at: endpoint.updated_at.as_millis(),
        }
    }

    /// The endpoint.
    pub fn decode(self) -> Result<WebhookEndpoint, DbError> {
        let event_types = self
            .event_types
            .split_whitespace()
            .map(|name| {
                WebhookEventType::parse(name)
                    .ok_or_else(|| corrupt(format!("a webhook event type `{name}`")))
            })
            .collect::<Result<_, _>>()?;
        Ok(WebhookEndpoint {
            id: WebhookEndpointId::from_ulid(ulid_of(&self.id)?),
            name: self.name,
            url: self.url,
            event_types,
            secret: self.secret,
            previous_secret: match (self.previous_secret, self.previous_valid_until) {
                (Some(secret), Some(until)) => Some((secret, Timestamp::from_millis(until))),
                _ => None,
            },
            created_at: Timestamp::from_millis(self.created_at),
            updated_at: Timestamp::from_millis(self.updated_at),
        })
    }
}

/// A delivery's row.
#[derive(Debug, Clone)]
pub struct DeliveryRow {
    /// `endpoint_id`.
    pub endpoint_id: Vec<u8>,
    /// `event_id`.
    pub event_id: String,
    /// `event_type`.
    pub event_type: String,
    /// `subject`: the response's task's or the batch's id.
    pub subject: Vec<u8>,
    /// `created_at`.
    pub created_at: i64,
    /// `attempts`.
    pub attempts: i64,
    /// `next_attempt_at`.
    pub next_attempt_at: Option<i64>,
    /// `last_status`.
    pub last_status: Option<i64>,
    /// `last_error`.
    pub last_error: Option<String>,
    /// `last_attempt_at`.
    pub last_attempt_at: Option<i64>,
    /// `delivered_at`.
    pub delivered_at: Option<i64>,
    /// `given_up_at`.
    pub given_up_at: Option<i64>,
}

fn millis(at: Option<Timestamp>) -> Option<i64> {
    at.map(Timestamp::as_millis)
}

fn time(at: Option<i64>) -> Option<Timestamp> {
    at.map(Timestamp::from_millis)
}

impl DeliveryRow {
    /// The row of `delivery`.
    pub fn encode(delivery: &Delivery) -> Self {
        Self {
            endpoint_id: endpoint_key(delivery.endpoint_id).to_vec(),
            event_id: delivery.event_id.clone(),
            event_type: delivery.event_type.as_str().to_owned(),
            subject: key_of(delivery.subject).to_vec(),
            created_at: delivery.created_at.as_millis(),
            attempts: i64::from(delivery.attempts),
            next_attempt_at: millis(delivery.next_attempt_at),
            last_status: delivery.last_status.map(i64::from),
            last_error: delivery.last_error.clone(),
            last_attempt_at: millis(delivery.last_attempt_at),
            delivered_at: millis(delivery.delivered_at),
            given_up_at: millis(delivery.given_up_at),
        }
    }

    /// The delivery.
    pub fn decode(self) -> Result<Delivery, DbError> {
        Ok(Delivery {
            endpoint_id: WebhookEndpointId::from_ulid(ulid_of(&self.endpoint_id)?),
            event_type: WebhookEventType::parse(&self.event_type)
                .ok_or_else(|| corrupt(format!("a webhook event type `{}`", self.event_type)))?,
            event_id: self.event_id,
            subject: ulid_of(&self.subject)?,
            created_at: Timestamp::from_millis(self.created_at),
            attempts: u32_of(self.attempts)?,
            next_attempt_at: time(self.next_attempt_at),
            last_status: self
                .last_status
                .map(|status| {
                    u16::try_from(status).map_err(|_| corrupt(format!("an HTTP status {status}")))
                })
                .transpose()?,
            last_error: self.last_error,
            last_attempt_at: time(self.last_attempt_at),
            delivered_at: time(self.delivered_at),
            given_up_at: time(self.given_up_at),
        })
    }
}
