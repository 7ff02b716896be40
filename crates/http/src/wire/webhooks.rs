//! Webhook endpoints in OpenAI's shapes (`webhook_endpoint`, its deletion, its test) and
//! LMSP's own delivery list, with the request bodies that manage them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use lmsp_domain::webhooks::{subject_id, Delivery, WebhookEndpoint};

use crate::wire::{constant, list_of, ListTag, Listed};

constant!(
    /// `"webhook_endpoint"`.
    EndpointTag = "webhook_endpoint"
);
constant!(
    /// `"webhook_endpoint.deleted"`.
    EndpointDeletedTag = "webhook_endpoint.deleted"
);
constant!(
    /// `"webhook_endpoint.test"`.
    EndpointTestTag = "webhook_endpoint.test"
);
constant!(
    /// `"webhook_delivery"`.
    DeliveryTag = "webhook_delivery"
);

/// A webhook endpoint (its secret only on creation and rotation).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EndpointObject {
    /// `we_…`.
    pub id: String,
    // Always `webhook_endpoint`.
    #[schema(inline)]
    pub object: EndpointTag,
    /// A name for people.
    pub name: String,
    /// Where events are posted.
    pub url: String,
    /// The events it receives.
    pub event_types: Vec<&'static str>,
    /// When it was registered (Unix seconds).
    pub created_at: i64,
    /// When its configuration or secret last changed (Unix seconds).
    pub updated_at: i64,
    /// The signing secret (`whsec_…`): in the answers to create and rotate only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signing_secret: Option<String>,
    /// A hint of the secret (`whsec_…` and its last four characters).
    pub signing_secret_hint: String,
}

impl EndpointObject {
    /// The wire form of an endpoint; with `secret`, its signing secret too.
    pub fn of(endpoint: &WebhookEndpoint, secret: bool) -> Self {
        Self {
            id: endpoint.id.to_string(),
            object: EndpointTag::Value,
            name: endpoint.name.clone(),
            url: endpoint.url.clone(),
            event_types: endpoint.event_types.iter().map(|t| t.as_str()).collect(),
            created_at: endpoint.created_at.as_unix_seconds(),
            updated_at: endpoint.updated_at.as_unix_seconds(),
            signing_secret: secret.then(|| endpoint.secret.clone()),
            signing_secret_hint: endpoint.secret_hint(),
        }
    }
}

impl Listed for EndpointObject {
    fn list_id(&self) -> &str {
        &self.id
    }
}

list_of!(
    /// A page of endpoints, newest first.
    EndpointList of EndpointObject, with ids
);

/// The answer to a deletion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EndpointDeleted {
    /// The endpoint's id.
    pub id: String,
    // Always `webhook_endpoint.deleted`.
    #[schema(inline)]
    pub object: EndpointDeletedTag,
    /// Always `true`.
    pub deleted: bool,
}

/// The answer to a test delivery.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EndpointTestResult {
    // Always `webhook_endpoint.test`.
    #[schema(inline)]
    pub object: EndpointTestTag,
    /// The endpoint.
    pub webhook_endpoint_id: String,
    /// The event type sent.
    pub event_type: &'static str,
    /// The receiver's status; 0 when it did not answer (refused, unreachable, timed out).
    pub status_code: u16,
    /// Always `true`: the test was made; `status_code` says how it went.
    pub success: bool,
}

/// One event's delivery to the endpoint, as it stands.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeliveryObject {
    // Always `webhook_delivery`.
    #[schema(inline)]
    pub object: DeliveryTag,
    /// The event's id (`evt_…`), the same in every attempt (`webhook-id`).
    pub event_id: String,
    /// The event type.
    #[serde(rename = "type")]
    pub event_type: &'static str,
    /// The response or batch it is about.
    pub subject_id: String,
    /// When the event happened (Unix seconds).
    pub created_at: i64,
    /// `pending` (due again at `next_attempt_at`), `delivered` or `given_up`.
    pub status: &'static str,
    /// Attempts made.
    pub attempts: u32,
    /// The receiver's status at the last attempt, if it answered.
    pub last_status_code: Option<u16>,
    /// Why the last attempt got no answer, if it did not.
    pub last_error: Option<String>,
    /// When the last attempt was made (Unix seconds).
    pub last_attempt_at: Option<i64>,
    /// When the next attempt is due (Unix seconds).
    pub next_attempt_at: Option<i64>,
    /// When it was delivered (Unix seconds).
    pub delivered_at: Option<i64>,
}

impl DeliveryObject {
    /// The wire form of a delivery.
    pub fn of(delivery: &Delivery) -> Self {
        let seconds = |at: Option<lmsp_domain::Timestamp>| at.map(|t| t.as_unix_seconds());
        Self {
            object: DeliveryTag::Value,
            event_id: delivery.event_id.clone(),
            event_type: delivery.event_type.as_str(),
            subject_id: subject_id(delivery.event_type, delivery.subject),
            created_at: delivery.created_at.as_unix_seconds(),
            status: if delivery.delivered_at.is_some() {
                "delivered"
            } else if delivery.given_up_at.is_some() {
                "given_up"
            } else {
                "pending"
            },
            attempts: delivery.attempts,
            last_status_code: delivery.last_status,
            last_error: delivery.last_error.clone(),
            last_attempt_at: seconds(delivery.last_attempt_at),
            next_attempt_at: seconds(delivery.next_attempt_at),
            delivered_at: seconds(delivery.delivered_at),
        }
    }
}

/// An endpoint's recent deliveries, the most recent event first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeliveryList {
    // Always `list`.
    #[schema(inline)]
    pub object: ListTag,
    /// The deliveries.
    pub data: Vec<DeliveryObject>,
    /// Whether older ones exist beyond the limit.
    pub has_more: bool,
}

/// The body of `POST /v1/webhook_endpoints`. Unknown fields are refused (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpointRequest {
    /// A name for people, 1–128 characters.
    pub name: String,
    /// An `http://` or `https://` URL.
    pub url: String,
    /// The events it receives: `response.completed`, `response.failed`, `response.cancelled`,
    /// `response.incomplete`, `batch.completed`, `batch.failed`, `batch.cancelled`,
    /// `batch.expired`.
    pub event_types: Vec<String>,
}

/// The body of `POST /v1/webhook_endpoints/{id}`: what changes.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpointRequest {
    /// A new name.
    pub name: Option<String>,
    /// A new URL.
    pub url: Option<String>,
    /// The new, complete set of event types.
    pub event_types: Option<Vec<String>>,
}

/// The body of `POST /v1/webhook_endpoints/{id}/rotate_secret` (may be empty).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecretRequest {
    /// Whether the old secret still signs deliveries (beside the new) for 24 hours.
    #[serde(default)]
    pub keep_old_secret_active_for_24_hours: Option<bool>,
}

/// The body of `POST /v1/webhook_endpoints/{id}/test`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestEndpointRequest {
    /// The event type to send a sample of.
    pub event_type: String,
}
