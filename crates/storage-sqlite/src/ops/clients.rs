//! Clients, pairing codes and the pairing limit.

use lmsp_domain::auth::{Client, Pairing, SecretHash};
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::Redemption;
use lmsp_domain::schedule::ClientLimits;
use lmsp_domain::time::Timestamp;
use rusqlite::{params, Connection, OptionalExtension};

use crate::codec;
use lmsp_storage_codec::flows::{self, ClientRows};

use crate::codec::{sql, ClientRow};
use crate::ops::{client_key, prepare, read, run, Res, Rows};

fn build_client(row: ClientRow) -> Res<Client> {
    Ok(row.decode()?)
}

/// Stores a client.
pub fn insert_client(conn: &Connection, client: &Client) -> Res<()> {
    let row = ClientRow::encode(client)?;
    prepare(conn, sql::INSERT_CLIENT)?.execute(params![
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
    let row = prepare(conn, &sql::client_by_token_hash())?
        .query_row([hash.to_hex()], read::<ClientRow>)
        .optional()?;
    row.map(build_client).transpose()
}

/// A client by id.
pub fn client(conn: &Connection, id: ClientId) -> Res<Option<Client>> {
    let row = prepare(conn, &sql::client_by_id())?
        .query_row([id.to_string()], read::<ClientRow>)
        .optional()?;
    row.map(build_client).transpose()
}

/// Every client, oldest first.
pub fn list_clients(conn: &Connection) -> Res<Vec<Client>> {
    let rows: Vec<_> = prepare(conn, &sql::all_clients())?
        .query_map([], read::<ClientRow>)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(build_client).collect()
}

/// Revokes a client.
pub fn revoke_client(conn: &Connection, id: ClientId, at: Timestamp) -> Res<bool> {
    let changed =
        prepare(conn, sql::REVOKE_CLIENT)?.execute(params![at.as_millis(), id.to_string()])?;
    Ok(changed == 1)
}

/// A client's limits, as `client_queues` keeps them.
pub fn client_limits(conn: &Connection, id: ClientId) -> Res<ClientLimits> {
    let limits: Option<(Option<i64>, Option<i64>)> = prepare(conn, sql::CLIENT_LIMITS)?
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
    let exists: Option<i64> = prepare(conn, sql::CLIENT_EXISTS)?
        .query_row([id.to_string()], |row| row.get(0))
        .optional()?;
    if exists.is_none() {
        return Ok(false);
    }
    prepare(conn, sql::SET_CLIENT_LIMITS)?.execute(params![
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

/// The client row's insert, for the codec's pairing flow.
impl ClientRows for Rows<'_> {
    async fn insert_client(&self, client: &Client) -> Res<()> {
        insert_client(self.0, client)
    }
}

/// Redeems a pairing code under the pairing limit, all in the current transaction
/// ([`flows::redeem_pairing`]).
pub fn redeem_pairing(
    conn: &Connection,
    hash: &SecretHash,
    client: &Client,
    at: Timestamp,
) -> Res<Redemption> {
    run(flows::redeem_pairing(&Rows(conn), hash, client, at))
}
