//! Webhook endpoints and the outbox of their deliveries. The deliveries are written by the
//! `webhook_task_events` and `webhook_batch_events` triggers (schema version 5), in the same
//! transaction as the end they announce; here they are only claimed, updated and read.

use lmsp_domain::ids::WebhookEndpointId;
use lmsp_domain::ports::Page;
use lmsp_domain::time::Timestamp;
use lmsp_domain::webhooks::{Delivery, WebhookEndpoint};
use rusqlite::{params, Connection};

use crate::codec::ops as shared;
use crate::codec::{DeliveryRow, DELIVERY_COLUMNS};
use crate::ops::{read, run, to_i64, Res, Rows};

/// Stores a new endpoint.
pub fn insert_endpoint(conn: &Connection, endpoint: &WebhookEndpoint) -> Res<()> {
    run(shared::insert_endpoint(&Rows(conn), endpoint))
}

/// An endpoint.
pub fn endpoint(conn: &Connection, id: WebhookEndpointId) -> Res<Option<WebhookEndpoint>> {
    run(shared::endpoint(&Rows(conn), id))
}

/// Endpoints, newest first, older than `before`.
pub fn list_endpoints(
    conn: &Connection,
    before: Option<WebhookEndpointId>,
    limit: usize,
) -> Res<Page<WebhookEndpoint>> {
    run(shared::list_endpoints(&Rows(conn), before, limit))
}

/// Rewrites an endpoint; `false` when there is none.
pub fn update_endpoint(conn: &Connection, endpoint: &WebhookEndpoint) -> Res<bool> {
    run(shared::update_endpoint(&Rows(conn), endpoint))
}

/// Removes an endpoint and its deliveries.
pub fn delete_endpoint(conn: &Connection, id: WebhookEndpointId) -> Res<bool> {
    run(shared::delete_endpoint(&Rows(conn), id))
}

/// Whether any delivery is due at `now` and not leased: a read on `webhook_deliveries_due`, so
/// the deliverer's poll takes the writer only when there is something to claim.
pub fn any_due(conn: &Connection, now: Timestamp) -> Res<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM webhook_deliveries \
             WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ?1 \
                 AND (leased_until IS NULL OR leased_until < ?1))",
        )?
        .query_row([now.as_millis()], |row| row.get(0))?)
}

/// Leases the due deliveries: at most `per_endpoint` of each endpoint that has none leased now,
/// oldest due first, at most `limit` in all.
pub fn claim_deliveries(
    conn: &Connection,
    now: Timestamp,
    lease_until: Timestamp,
    per_endpoint: usize,
    limit: usize,
) -> Res<Vec<Delivery>> {
    let rows: Vec<DeliveryRow> = conn
        .prepare_cached(&format!(
            "UPDATE webhook_deliveries SET leased_until = ?2 \
             WHERE (endpoint_id, event_id) IN ( \
                 SELECT endpoint_id, event_id FROM ( \
                     SELECT endpoint_id, event_id, next_attempt_at, row_number() OVER ( \
                         PARTITION BY endpoint_id ORDER BY next_attempt_at, event_id) AS place \
                     FROM webhook_deliveries \
                     WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ?1 \
                         AND (leased_until IS NULL OR leased_until < ?1) \
                         AND endpoint_id NOT IN (SELECT endpoint_id FROM webhook_deliveries \
                             WHERE leased_until IS NOT NULL AND leased_until >= ?1)) \
                 WHERE place <= ?3 ORDER BY next_attempt_at LIMIT ?4) \
             RETURNING {DELIVERY_COLUMNS}"
        ))?
        .query_map(
            params![
                now.as_millis(),
                lease_until.as_millis(),
                to_i64(per_endpoint as u64)?,
                to_i64(limit as u64)?
            ],
            read::<DeliveryRow>,
        )?
        .collect::<Result<_, _>>()?;
    rows.into_iter()
        .map(|row| row.decode().map_err(Into::into))
        .collect()
}

/// Stores a delivery after an attempt and ends its lease.
pub fn record_attempt(conn: &Connection, delivery: &Delivery) -> Res<()> {
    run(shared::record_attempt(&Rows(conn), delivery))
}

/// An endpoint's deliveries, the most recent event first.
pub fn deliveries(
    conn: &Connection,
    endpoint: WebhookEndpointId,
    limit: usize,
) -> Res<Vec<Delivery>> {
    run(shared::deliveries(&Rows(conn), endpoint, limit))
}
