//! Webhooks: the endpoints an admin manages, and the deliverer that sends the outbox's
//! deliveries.
//!
//! The store writes a delivery per subscribed endpoint in the same transaction as the end it
//! announces (never lost). The deliverer, in every instance, leases due deliveries (so one
//! instance at a time sends each), sends each endpoint's in order in a job of its own (so a slow
//! or dead receiver delays only itself, never a task or another endpoint), and records each
//! attempt: delivered on a 2xx, else due again after [`RetryPolicy::next_attempt`], with the
//! same event id, until `--webhook-retry-for` has passed.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand::{Rng, RngCore};

use lmsp_domain::auth::Scope;
use lmsp_domain::ports::{OutgoingEvent, Page, StoreError};
use lmsp_domain::validation::ValidationError;
use lmsp_domain::webhooks::{
    check_endpoint, subject_id, AttemptOutcome, Delivery, RetryPolicy, WebhookEndpoint,
    WebhookEventType,
};
use lmsp_domain::WebhookEndpointId;

use crate::caller::Caller;
use crate::error::AppError;
use crate::service::Service;
use crate::shared::millis;

/// How often the deliverer looks for due deliveries when nothing woke it sooner.
const POLL: Duration = Duration::from_millis(200);
/// Deliveries of one endpoint taken at once (sent one after another).
const PER_ENDPOINT: usize = 8;
/// Deliveries taken per look.
const PER_LOOK: usize = 256;
/// Deliveries listed by `GET …/deliveries` at most.
pub const MAX_LISTED_DELIVERIES: usize = 100;
/// How long a rotated-out secret still signs deliveries when asked to be kept.
const KEEP_OLD_SECRET: Duration = Duration::from_secs(24 * 3600);

/// What `POST /v1/webhook_endpoints/{id}` changes; `None` keeps a field.
#[derive(Debug, Clone, Default)]
pub struct EndpointUpdate {
    /// A new name.
    pub name: Option<String>,
    /// A new URL.
    pub url: Option<String>,
    /// The new, complete set of event types.
    pub event_types: Option<Vec<String>>,
}

/// An endpoint's deliverer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookSettings {
    /// How long a receiver has to answer one attempt (`--webhook-timeout`).
    pub timeout: Duration,
    /// When attempts are repeated (`--webhook-retry-base`, `--webhook-retry-for`).
    pub retry: RetryPolicy,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            retry: RetryPolicy::DEFAULT,
        }
    }
}

fn invalid((param, message): (&'static str, String)) -> AppError {
    AppError::Invalid(ValidationError::new(param, message))
}

/// A new signing secret: `whsec_` and the base64 of 32 random bytes.
fn new_secret() -> String {
    let mut key = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    format!("whsec_{}", STANDARD.encode(key))
}

impl Service {
    async fn admin_endpoint(
        &self,
        caller: &Caller,
        id: WebhookEndpointId,
    ) -> Result<WebhookEndpoint, AppError> {
        caller.require(Scope::Admin)?;
        self.inner
            .core
            .store
            .endpoint(id)
            .await?
            .ok_or(AppError::NotFound)
    }

    /// Registers an endpoint with a new signing secret (shown in this answer only).
    pub async fn create_endpoint(
        &self,
        caller: &Caller,
        name: String,
        url: String,
        event_types: Vec<String>,
    ) -> Result<WebhookEndpoint, AppError> {
        caller.require(Scope::Admin)?;
        let event_types = check_endpoint(&name, &url, &event_types).map_err(invalid)?;
        let core = &self.inner.core;
        let now = self.now();
        let endpoint = WebhookEndpoint {
            id: WebhookEndpointId::from_ulid(core.next_ulid()),
            name,
            url,
            event_types,
            secret: new_secret(),
            previous_secret: None,
            created_at: now,
            updated_at: now,
        };
        core.store.insert_endpoint(endpoint.clone()).await?;
        Ok(endpoint)
    }

    /// An endpoint.
    pub async fn endpoint(
        &self,
        caller: &Caller,
        id: WebhookEndpointId,
    ) -> Result<WebhookEndpoint, AppError> {
        self.admin_endpoint(caller, id).await
    }

    /// Endpoints, newest first, older than `after`.
    pub async fn list_endpoints(
        &self,
        caller: &Caller,
        after: Option<WebhookEndpointId>,
        limit: usize,
    ) -> Result<Page<WebhookEndpoint>, AppError> {
        caller.require(Scope::Admin)?;
        Ok(self.inner.core.store.list_endpoints(after, limit).await?)
    }

    /// Changes an endpoint's name, URL or event types (`updated_at` moves only when something
    /// changed).
    pub async fn update_endpoint(
        &self,
        caller: &Caller,
        id: WebhookEndpointId,
        update: EndpointUpdate,
    ) -> Result<WebhookEndpoint, AppError> {
        let endpoint = self.admin_endpoint(caller, id).await?;
        let name = update.name.unwrap_or_else(|| endpoint.name.clone());
        let url = update.url.unwrap_or_else(|| endpoint.url.clone());
        let names = update.event_types.unwrap_or_else(|| {
            endpoint
                .event_types
                .iter()
                .map(|t| t.as_str().to_owned())
                .collect()
        });
        let event_types = check_endpoint(&name, &url, &names).map_err(invalid)?;
        let changed = WebhookEndpoint {
            name,
            url,
            event_types,
            ..endpoint.clone()
        };
        if changed == endpoint {
            return Ok(endpoint);
        }
        let changed = WebhookEndpoint {
            updated_at: self.now(),
            ..changed
        };
        if !self
            .inner
            .core
            .store
            .update_endpoint(changed.clone())
            .await?
        {
            return Err(AppError::NotFound);
        }
        Ok(changed)
    }

    /// Removes an endpoint and its pending deliveries.
    pub async fn delete_endpoint(
        &self,
        caller: &Caller,
        id: WebhookEndpointId,
    ) -> Result<(), AppError> {
        caller.require(Scope::Admin)?;
        if self.inner.core.store.delete_endpoint(id).await? {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// A new signing secret (shown in this answer only); with `keep_old`, the old one still
    /// signs deliveries (beside the new) for 24 hours.
    pub async fn rotate_secret(
        &self,
        caller: &Caller,
        id: WebhookEndpointId,
        keep_old: bool,
    ) -> Result<WebhookEndpoint, AppError> {
        let endpoint = self.admin_endpoint(caller, id).await?;
        let now = self.now();
        let rotated = WebhookEndpoint {
            previous_secret: keep_old.then(|| {
                (
                    endpoint.secret.clone(),
                    now.plus_millis(millis(KEEP_OLD_SECRET)),
                )
            }),
            secret: new_secret(),
            updated_at: now,
            ..endpoint
        };
        if !self
            .inner
            .core
            .store
            .update_endpoint(rotated.clone())
            .await?
        {
            return Err(AppError::NotFound);
        }
        Ok(rotated)
    }

    /// Sends a sample event of `event_type` to the endpoint now, once (nothing is stored), and
    /// answers the receiver's status; `None` when it did not answer.
    pub async fn test_endpoint(
        &self,
        caller: &Caller,
        id: WebhookEndpointId,
        event_type: &str,
    ) -> Result<(WebhookEventType, Option<u16>), AppError> {
        let endpoint = self.admin_endpoint(caller, id).await?;
        let event_type = WebhookEventType::parse(event_type).ok_or_else(|| {
            invalid((
                "event_type",
                format!("`{event_type}` is not an event type LMSP sends"),
            ))
        })?;
        let now = self.now();
        let subject = self.inner.core.next_ulid();
        let event = OutgoingEvent {
            id: format!("evt_test_{subject}"),
            event_type,
            created_at: now,
            subject_id: subject_id(event_type, subject),
        };
        let secrets: Vec<String> = endpoint
            .signing_secrets(now)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let settings = self.inner.core.settings.webhooks;
        let outcome = self
            .inner
            .webhook_sender
            .send(&endpoint.url, &event, &secrets, now, settings.timeout)
            .await;
        Ok(match outcome {
            AttemptOutcome::Answered(status) => (event_type, Some(status)),
            AttemptOutcome::NoAnswer(_) => (event_type, None),
        })
    }

    /// An endpoint's recent deliveries, the most recent event first.
    pub async fn endpoint_deliveries(
        &self,
        caller: &Caller,
        id: WebhookEndpointId,
        limit: usize,
    ) -> Result<Vec<Delivery>, AppError> {
        self.admin_endpoint(caller, id).await?;
        Ok(self
            .inner
            .core
            .store
            .deliveries(id, limit.min(MAX_LISTED_DELIVERIES))
            .await?)
    }

    /// The deliverer: every [`POLL`], the due deliveries, each endpoint's sent in a job of its
    /// own; until the service stops.
    pub(crate) async fn run_deliverer(self) {
        let life = Arc::clone(&self.inner.life);
        let busy: Arc<Mutex<HashSet<WebhookEndpointId>>> = Arc::default();
        loop {
            if let Err(error) = self.deliver_due(&busy).await {
                tracing::warn!(%error, "could not take the due webhook deliveries");
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = life.stop_now.cancelled() => return,
            }
        }
    }

    /// Takes the due deliveries and starts a sending job per endpoint not already sending.
    async fn deliver_due(
        &self,
        busy: &Arc<Mutex<HashSet<WebhookEndpointId>>>,
    ) -> Result<(), StoreError> {
        let settings = self.inner.core.settings.webhooks;
        let now = self.now();
        // The lease covers every attempt of the endpoint's batch, each bounded by the timeout.
        let lease = (settings.timeout + Duration::from_secs(1)) * PER_ENDPOINT as u32;
        let claimed = self
            .inner
            .core
            .store
            .claim_deliveries(now, now.plus_millis(millis(lease)), PER_ENDPOINT, PER_LOOK)
            .await?;
        let mut by_endpoint: BTreeMap<WebhookEndpointId, Vec<Delivery>> = BTreeMap::new();
        for delivery in claimed {
            by_endpoint
                .entry(delivery.endpoint_id)
                .or_default()
                .push(delivery);
        }
        for (endpoint, deliveries) in by_endpoint {
            let fresh = busy
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(endpoint);
            if !fresh {
                // Its job is still sending (its lease ran out early): leave these to the lease.
                continue;
            }
            let service = self.clone();
            let busy = Arc::clone(busy);
            self.inner.life.jobs.spawn(async move {
                service.send_all(endpoint, deliveries).await;
                busy.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&endpoint);
            });
        }
        Ok(())
    }

    /// Sends one endpoint's deliveries in order, recording each attempt.
    async fn send_all(&self, endpoint_id: WebhookEndpointId, deliveries: Vec<Delivery>) {
        let store = &self.inner.core.store;
        let endpoint = match store.endpoint(endpoint_id).await {
            Ok(Some(endpoint)) => endpoint,
            // Deleted meanwhile: its deliveries went with it.
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, endpoint = %endpoint_id, "could not read a webhook endpoint");
                return;
            }
        };
        let settings = self.inner.core.settings.webhooks;
        let metrics = &self.inner.core.listener.metrics;
        for delivery in deliveries {
            let now = self.now();
            let event = OutgoingEvent {
                id: delivery.event_id.clone(),
                event_type: delivery.event_type,
                created_at: delivery.created_at,
                subject_id: subject_id(delivery.event_type, delivery.subject),
            };
            let secrets: Vec<String> = endpoint
                .signing_secrets(now)
                .into_iter()
                .map(str::to_owned)
                .collect();
            let outcome = self
                .inner
                .webhook_sender
                .send(&endpoint.url, &event, &secrets, now, settings.timeout)
                .await;
            let jitter = rand::thread_rng().gen_range(-1.0..=1.0);
            let after = delivery.after_attempt(outcome, &settings.retry, self.now(), jitter);
            metrics.record_webhook_attempt(&after);
            if after.given_up_at.is_some() {
                tracing::warn!(event = %after.event_id, endpoint = %endpoint_id,
                    attempts = after.attempts, "a webhook delivery was given up");
            }
            if let Err(error) = store.record_attempt(after).await {
                // The lease runs out and the delivery is sent again: the receiver sees the same
                // event id twice, never none.
                tracing::warn!(%error, event = %delivery.event_id, "could not record a webhook attempt");
            }
        }
    }
}
