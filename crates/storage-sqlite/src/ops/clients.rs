//! Clients, pairing codes and the pairing limit.

use lmsp_domain::auth::{Client, Pairing, SecretHash};
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::Redemption;
use lmsp_domain::schedule::ClientLimits;
use lmsp_domain::time::Timestamp;
use rusqlite::{params, Connection};

use crate::codec;
use lmsp_storage_codec::flows;

use crate::codec::ops as shared;
use crate::codec::query::Param;
use crate::ops::{run, Res, Rows};

/// Stores a client.
pub fn insert_client(conn: &Connection, client: &Client) -> Res<()> {
    run(shared::insert_client(&Rows(conn), client))
}

/// The unrevoked client with this token hash.
pub fn client_by_token_hash(conn: &Connection, hash: &SecretHash) -> Res<Option<Client>> {
    run(shared::client_by_token_hash(&Rows(conn), hash.to_hex()))
}

/// A client by id.
pub fn client(conn: &Connection, id: ClientId) -> Res<Option<Client>> {
    run(shared::client(&Rows(conn), id))
}

/// Every client, oldest first.
pub fn list_clients(conn: &Connection) -> Res<Vec<Client>> {
    run(shared::list_clients(&Rows(conn)))
}

/// Revokes a client.
pub fn revoke_client(conn: &Connection, id: ClientId, at: Timestamp) -> Res<bool> {
    run(shared::revoke_client(&Rows(conn), id, at))
}

/// A client's limits, as `client_queues` keeps them.
pub fn client_limits(conn: &Connection, id: ClientId) -> Res<ClientLimits> {
    run(shared::client_limits(&Rows(conn), id))
}

/// Replaces a client's limits; `false` when there is no such client.
pub fn set_client_limits(conn: &Connection, id: ClientId, limits: ClientLimits) -> Res<bool> {
    let limit = |value: Option<u32>| Param::integer_or_null(value.map(i64::from));
    let limits = [limit(limits.max_running), limit(limits.max_queued)];
    run(flows::set_client_limits(&Rows(conn), id, limits))
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
