//! Webhook endpoints and the outbox of their deliveries (`WebhookStore`).
//!
//! No delivery is written here: the `webhook_task_events` and `webhook_batch_events` triggers
//! (schema version 5) record an event's deliveries in the same transaction as the end they
//! announce, as the domain's `webhooks::task_event` and `webhooks::batch_event` say, so that no
//! event is ever lost. Here deliveries are only claimed (leased to one deliverer), updated after
//! an attempt and read.

use lmsp_domain::ids::WebhookEndpointId;
use lmsp_domain::ports::Page;
use lmsp_domain::time::Timestamp;
use lmsp_domain::webhooks::{Delivery, WebhookEndpoint};
use tokio_postgres::Row;

use crate::codec::ops as shared;
use crate::codec::{DeliveryRow, DELIVERY_COLUMNS};
use crate::ops::{read, to_i64, Db, Res, Rows};

/// The advisory lock the claims of deliveries take (`pg_advisory_xact_lock`), so that claims in
/// every process take their turn: each sees what the one before leased, and "none of an endpoint
/// that has a delivery leased now" holds across processes.
const CLAIM_LOCK: i64 = 0x6c6d_7370_0003;

/// Decodes a delivery row selected with [`DELIVERY_COLUMNS`].
fn decode_delivery(row: &Row) -> Res<Delivery> {
    Ok(read::<DeliveryRow>(row)?.decode()?)
}

/// Stores a new endpoint.
pub async fn insert_endpoint<C: Db>(db: &C, endpoint: &WebhookEndpoint) -> Res<()> {
    shared::insert_endpoint(&Rows(db), endpoint).await
}

/// An endpoint.
pub async fn endpoint<C: Db>(db: &C, id: WebhookEndpointId) -> Res<Option<WebhookEndpoint>> {
    shared::endpoint(&Rows(db), id).await
}

/// Endpoints, newest first (ids are ULIDs: their order is creation order), older than `before`.
pub async fn list_endpoints<C: Db>(
    db: &C,
    before: Option<WebhookEndpointId>,
    limit: usize,
) -> Res<Page<WebhookEndpoint>> {
    shared::list_endpoints(&Rows(db), before, limit).await
}

/// Rewrites an endpoint (every column but its id and `created_at`); `false` when there is none.
pub async fn update_endpoint<C: Db>(db: &C, endpoint: &WebhookEndpoint) -> Res<bool> {
    shared::update_endpoint(&Rows(db), endpoint).await
}

/// Removes an endpoint and its deliveries (in the caller's transaction); `false` when there is
/// no such endpoint.
pub async fn delete_endpoint<C: Db>(db: &C, id: WebhookEndpointId) -> Res<bool> {
    shared::delete_endpoint(&Rows(db), id).await
}

/// The claim, in one statement: the due deliveries (`next_attempt_at` reached, not leased now)
/// of the endpoints that have none leased now, ranked per endpoint by when they are due, at most
/// `$3` of each and `$4` in all, oldest due first, leased until `$2`. The rows are locked with
/// `SKIP LOCKED` and their due and lease conditions checked again on the row as locked, so two
/// claims never take the same delivery.
fn claim_sql() -> String {
    format!(
        "WITH ranked AS ( \
         SELECT d.endpoint_id, d.event_id, d.next_attempt_at, row_number() OVER ( \
             PARTITION BY d.endpoint_id ORDER BY d.next_attempt_at, d.event_id) AS place \
         FROM webhook_deliveries d \
         WHERE d.next_attempt_at <= $1 AND (d.leased_until IS NULL OR d.leased_until < $1) \
             AND NOT EXISTS (SELECT 1 FROM webhook_deliveries l \
                 WHERE l.endpoint_id = d.endpoint_id AND l.leased_until >= $1)), \
     picked AS ( \
         SELECT d.endpoint_id, d.event_id FROM webhook_deliveries d \
         JOIN ranked r ON r.endpoint_id = d.endpoint_id AND r.event_id = d.event_id \
         WHERE r.place <= $3 AND d.next_attempt_at <= $1 \
             AND (d.leased_until IS NULL OR d.leased_until < $1) \
         ORDER BY r.next_attempt_at, r.event_id LIMIT $4 \
         FOR UPDATE OF d SKIP LOCKED), \
     claimed AS ( \
         UPDATE webhook_deliveries SET leased_until = $2 \
         WHERE (endpoint_id, event_id) IN (SELECT endpoint_id, event_id FROM picked) \
         RETURNING *) \
     SELECT {DELIVERY_COLUMNS} FROM claimed ORDER BY next_attempt_at, event_id"
    )
}

/// Leases the deliveries due at `now` until `lease_until`: at most `per_endpoint` of each
/// endpoint that has none leased now, oldest due first, at most `limit` in all. Claims take
/// their turn under [`CLAIM_LOCK`] (in the caller's transaction, held to its commit).
pub async fn claim_deliveries<C: Db>(
    db: &C,
    now: Timestamp,
    lease_until: Timestamp,
    per_endpoint: usize,
    limit: usize,
) -> Res<Vec<Delivery>> {
    if per_endpoint == 0 || limit == 0 {
        return Ok(Vec::new());
    }
    db.execute("SELECT pg_advisory_xact_lock($1)", &[&CLAIM_LOCK])
        .await?;
    let rows = db
        .query(
            &claim_sql(),
            &[
                &now.as_millis(),
                &lease_until.as_millis(),
                &to_i64(per_endpoint as u64)?,
                &to_i64(limit as u64)?,
            ],
        )
        .await?;
    rows.iter().map(decode_delivery).collect()
}

/// Stores a delivery after an attempt and ends its lease.
pub async fn record_attempt<C: Db>(db: &C, delivery: &Delivery) -> Res<()> {
    shared::record_attempt(&Rows(db), delivery).await
}

/// An endpoint's deliveries, the most recent event first, at most `limit`.
pub async fn deliveries<C: Db>(
    db: &C,
    endpoint: WebhookEndpointId,
    limit: usize,
) -> Res<Vec<Delivery>> {
    shared::deliveries(&Rows(db), endpoint, limit).await
}
