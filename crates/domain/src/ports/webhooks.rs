//! Webhook endpoints and the outbox of their deliveries; and the sending of a delivery.

use std::time::Duration;

use async_trait::async_trait;

use crate::ids::WebhookEndpointId;
use crate::ports::{Page, StoreError};
use crate::time::Timestamp;
use crate::webhooks::{AttemptOutcome, Delivery, WebhookEndpoint, WebhookEventType};

/// Webhook endpoints and their deliveries.
///
/// Deliveries are not written through this port: a store records them itself, in the same
/// transaction as the end they announce (a background response's task reaching
/// [`crate::webhooks::task_event`]'s statuses, a batch reaching
/// [`crate::webhooks::batch_event`]'s), one per endpoint subscribed to the event then, due at
/// once.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Stores a new endpoint.
    async fn insert_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError>;

    /// An endpoint.
    async fn endpoint(&self, id: WebhookEndpointId) -> Result<Option<WebhookEndpoint>, StoreError>;

    /// Endpoints, newest first, older than `before`.
    async fn list_endpoints(
        &self,
        before: Option<WebhookEndpointId>,
        limit: usize,
    ) -> Result<Page<WebhookEndpoint>, StoreError>;

    /// Rewrites an endpoint (its name, URL, event types, secrets, `updated_at`); `false` when
    /// there is none.
    async fn update_endpoint(&self, endpoint: WebhookEndpoint) -> Result<bool, StoreError>;

    /// Removes an endpoint with its deliveries; `false` when there is none.
    async fn delete_endpoint(&self, id: WebhookEndpointId) -> Result<bool, StoreError>;

    /// Takes the deliveries due at `now` for sending, leased until `lease_until` so that no other
    /// deliverer (another instance) sends them meanwhile: at most `per_endpoint` of each
    /// endpoint, oldest due first, none of an endpoint that has a delivery leased now (a slow
    /// receiver holds back only its own), at most `limit` in all.
    async fn claim_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        per_endpoint: usize,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError>;

    /// Stores a delivery after an attempt (as [`Delivery::after_attempt`] made it) and ends its
    /// lease.
    async fn record_attempt(&self, delivery: Delivery) -> Result<(), StoreError>;

    /// An endpoint's deliveries, the most recent event first.
    async fn deliveries(
        &self,
        endpoint: WebhookEndpointId,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError>;
}

/// An event as it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingEvent {
    /// `evt_…`: the same in every attempt.
    pub id: String,
    /// What it announces.
    pub event_type: WebhookEventType,
    /// When it happened.
    pub created_at: Timestamp,
    /// The response or batch it is about (`resp_…`, `batch_…`).
    pub subject_id: String,
}

/// Sends an event to a receiver: encodes it, signs it (Standard Webhooks) with each of
/// `secrets`, posts it.
#[async_trait]
pub trait WebhookSender: Send + Sync {
    /// Posts `event` to `url`, signed at `now` with every one of `secrets`, waiting at most
    /// `timeout` for the answer's status.
    async fn send(
        &self,
        url: &str,
        event: &OutgoingEvent,
        secrets: &[String],
        now: Timestamp,
        timeout: Duration,
    ) -> AttemptOutcome;
}
