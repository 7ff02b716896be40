//! Webhook endpoints and the outbox of their deliveries. The deliveries are written by the
//! `webhook_task_events` and `webhook_batch_events` triggers (schema version 5), in the same
//! transaction as the end they announce; here they are only claimed, updated and read.

use lmsp_domain::ids::WebhookEndpointId;
use lmsp_domain::ports::Page;
use lmsp_domain::time::Timestamp;
use lmsp_domain::webhooks::{Delivery, WebhookEndpoint};
use rusqlite::{params, Connection, OptionalExtension};

use crate::codec::{endpoint_key, sql, DeliveryRow, EndpointRow, DELIVERY_COLUMNS};
use crate::ops::{prepare, read, to_i64, Res};

fn decode_deliveries(rows: Vec<DeliveryRow>) -> Res<Vec<Delivery>> {
    rows.into_iter()
        .map(|row| row.decode().map_err(Into::into))
        .collect()
}

/// Stores a new endpoint.
pub fn insert_endpoint(conn: &Connection, endpoint: &WebhookEndpoint) -> Res<()> {
    let row = EndpointRow::encode(endpoint);
    prepare(conn, &sql::insert_endpoint())?.execute(params![
        row.id,
        row.name,
        row.url,
        row.event_types,
        row.secret,
        row.previous_secret,
        row.previous_valid_until,
        row.created_at,
        row.updated_at
    ])?;
    Ok(())
}

/// An endpoint.
pub fn endpoint(conn: &Connection, id: WebhookEndpointId) -> Res<Option<WebhookEndpoint>> {
    prepare(conn, &sql::endpoint_by_id())?
        .query_row([endpoint_key(id)], read::<EndpointRow>)
        .optional()?
        .map(|row| row.decode().map_err(Into::into))
        .transpose()
}

/// Endpoints, newest first, older than `before`.
pub fn list_endpoints(
    conn: &Connection,
    before: Option<WebhookEndpointId>,
    limit: usize,
) -> Res<Page<WebhookEndpoint>> {
    // No `before`: every key is below sixteen 0xff bytes.
    let before = before.map_or([0xff; 16], endpoint_key);
    let rows: Vec<EndpointRow> = prepare(conn, &sql::endpoints_before())?
        .query_map(
            params![before, to_i64(limit as u64 + 1)?],
            read::<EndpointRow>,
        )?
        .collect::<Result<_, _>>()?;
    let items = rows
        .into_iter()
        .map(|row| row.decode().map_err(Into::into))
        .collect::<Res<Vec<_>>>()?;
    Ok(Page::of_fetched(items, limit))
}

/// Rewrites an endpoint; `false` when there is none.
pub fn update_endpoint(conn: &Connection, endpoint: &WebhookEndpoint) -> Res<bool> {
    let row = EndpointRow::encode(endpoint);
    let changed = prepare(conn, sql::UPDATE_ENDPOINT)?.execute(params![
        row.id,
        row.name,
        row.url,
        row.event_types,
        row.secret,
        row.previous_secret,
        row.previous_valid_until,
        row.updated_at
    ])?;
    Ok(changed == 1)
}

/// Removes an endpoint and its deliveries.
pub fn delete_endpoint(conn: &Connection, id: WebhookEndpointId) -> Res<bool> {
    prepare(conn, sql::DELETE_ENDPOINT_DELIVERIES)?.execute([endpoint_key(id)])?;
    let deleted = prepare(conn, sql::DELETE_ENDPOINT)?.execute([endpoint_key(id)])?;
    Ok(deleted == 1)
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
    decode_deliveries(rows)
}

/// Stores a delivery after an attempt and ends its lease.
pub fn record_attempt(conn: &Connection, delivery: &Delivery) -> Res<()> {
    let row = DeliveryRow::encode(delivery);
    prepare(conn, sql::RECORD_ATTEMPT)?.execute(params![
        row.endpoint_id,
        row.event_id,
        row.attempts,
        row.next_attempt_at,
        row.last_status,
        row.last_error,
        row.last_attempt_at,
        row.delivered_at,
        row.given_up_at
    ])?;
    Ok(())
}

/// An endpoint's deliveries, the most recent event first.
pub fn deliveries(
    conn: &Connection,
    endpoint: WebhookEndpointId,
    limit: usize,
) -> Res<Vec<Delivery>> {
    let rows: Vec<DeliveryRow> = prepare(conn, &sql::deliveries_of())?
        .query_map(
            params![endpoint_key(endpoint), to_i64(limit as u64)?],
            read::<DeliveryRow>,
        )?
        .collect::<Result<_, _>>()?;
    decode_deliveries(rows)
}
