//! Clients, pairing codes and the pairing limit.

use lmsp_domain::auth::{Client, Pairing, PairingLimit, SecretHash};
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::Redemption;
use lmsp_domain::schedule::ClientLimits;
use lmsp_domain::time::Timestamp;
use rusqlite::{params, Connection, OptionalExtension};

use crate::codec;
use crate::ops::{client_key, config_value, set_config_value, Res};

use crate::codec::{ClientRow, CLIENT_COLUMNS};

fn client_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ClientRow> {
    Ok(ClientRow {
        id: row.get(0)?,
        name: row.get(1)?,
        token_hash: row.get(2)?,
        scopes: row.get(3)?,
        created_at: row.get(4)?,
        revoked_at: row.get(5)?,
    })
}

fn build_client(row: ClientRow) -> Res<Client> {
    Ok(row.decode()?)
}

/// Stores a client.
pub fn insert_client(conn: &Connection, client: &Client) -> Res<()> {
    let row = ClientRow::encode(client)?;
    conn.prepare_cached(
        "INSERT INTO clients (id, name, token_hash, scopes, created_at, revoked_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        row.id,
        row.name,
        row.token_hash,
        row.scopes,
        row.created_at,
        row.revoked_at,
    ])?;
    Ok(())
}

/// The unrevoked client with this token hash.
pub fn client_by_token_hash(conn: &Connection, hash: &SecretHash) -> Res<Option<Client>> {
    let sql = format!(
        "SELECT {CLIENT_COLUMNS} FROM clients WHERE token_hash = ?1 AND revoked_at IS NULL"
    );
    let row = conn
        .prepare_cached(&sql)?
        .query_row([hash.to_hex()], client_row)
        .optional()?;
    row.map(build_client).transpose()
}

/// A client by id.
pub fn client(conn: &Connection, id: ClientId) -> Res<Option<Client>> {
    let sql = format!("SELECT {CLIENT_COLUMNS} FROM clients WHERE id = ?1");
    let row = conn
        .prepare_cached(&sql)?
        .query_row([id.to_string()], client_row)
        .optional()?;
    row.map(build_client).transpose()
}

/// Every client, oldest first.
pub fn list_clients(conn: &Connection) -> Res<Vec<Client>> {
    let sql = format!("SELECT {CLIENT_COLUMNS} FROM clients ORDER BY created_at, id");
    let rows: Vec<_> = conn
        .prepare_cached(&sql)?
        .query_map([], client_row)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(build_client).collect()
}

/// Revokes a client.
pub fn revoke_client(conn: &Connection, id: ClientId, at: Timestamp) -> Res<bool> {
    let changed = conn
        .prepare_cached("UPDATE clients SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL")?
        .execute(params![at.as_millis(), id.to_string()])?;
    Ok(changed == 1)
}

/// A client's limits, as `client_queues` keeps them.
pub fn client_limits(conn: &Connection, id: ClientId) -> Res<ClientLimits> {
    let limits: Option<(Option<i64>, Option<i64>)> = conn
        .prepare_cached("SELECT max_running, max_queued FROM client_queues WHERE client_id = ?1")?
        .query_row([client_key(id)], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let (max_running, max_queued) = limits.unwrap_or((None, None));
    Ok(ClientLimits {
        max_running: max_running.map(codec::u32_of).transpose()?,
        max_queued: max_queued.map(codec::u32_of).transpose()?,
    })
}

/// Replaces a client's limits; `false` when there is no such client.
pub fn set_client_limits(conn: &Connection, id: ClientId, limits: ClientLimits) -> Res<bool> {
    let exists: Option<i64> = conn
        .prepare_cached("SELECT 1 FROM clients WHERE id = ?1")?
        .query_row([id.to_string()], |row| row.get(0))
        .optional()?;
    if exists.is_none() {
        return Ok(false);
    }
    conn.prepare_cached(
        "INSERT INTO client_queues (client_id, max_running, max_queued) VALUES (?1, ?2, ?3) \
         ON CONFLICT (client_id) DO UPDATE SET max_running = excluded.max_running, \
         max_queued = excluded.max_queued",
    )?
    .execute(params![
        client_key(id),
        limits.max_running,
        limits.max_queued
    ])?;
    Ok(true)
}

/// Stores a pairing code hash.
pub fn insert_pairing(conn: &Connection, pairing: &Pairing) -> Res<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO pairings (code_hash, scopes, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        pairing.code_hash.to_hex(),
        codec::scopes_to_text(&pairing.scopes)?,
        pairing.created_at.as_millis(),
        pairing.expires_at.as_millis(),
    ])?;
    Ok(())
}

const PAIRING_LIMIT: &str = "pairing_limit";

fn pairing_limit(conn: &Connection) -> Res<PairingLimit> {
    config_value(conn, PAIRING_LIMIT)?
        .map(|text| codec::pairing_limit_from_text(&text))
        .transpose()
        .map_err(crate::error::DbError::from)
        .map(Option::unwrap_or_default)
}

/// Redeems a pairing code under the pairing limit, all in the current transaction.
pub fn redeem_pairing(
    conn: &Connection,
    hash: &SecretHash,
    client: &Client,
    at: Timestamp,
) -> Res<Redemption> {
    let limit = pairing_limit(conn)?;
    if let Err(until) = limit.check(at) {
        return Ok(Redemption::Locked { until });
    }
    let scopes: Option<String> = conn
        .prepare_cached("SELECT scopes FROM pairings WHERE code_hash = ?1 AND expires_at > ?2")?
        .query_row(params![hash.to_hex(), at.as_millis()], |row| row.get(0))
        .optional()?;
    let Some(scopes) = scopes else {
        let after = limit.after_failure(at);
        set_config_value(
            conn,
            PAIRING_LIMIT,
            &codec::pairing_limit_to_text(&after.limit)?,
        )?;
        if after.burn_codes {
            conn.prepare_cached("DELETE FROM pairings")?.execute([])?;
        }
        return Ok(Redemption::NoSuchCode {
            limit_reached: after.burn_codes,
        });
    };
    let granted = codec::scopes_from_text(&scopes)?;
    if !client.scopes.is_subset_of(&granted) {
        return Ok(Redemption::ScopesNotGranted);
    }
    conn.prepare_cached("DELETE FROM pairings WHERE code_hash = ?1")?
        .execute([hash.to_hex()])?;
    insert_client(conn, client)?;
    Ok(Redemption::Paired)
}
