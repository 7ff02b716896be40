//! Clients, pairing codes and the pairing limit (kept in `service_config`, its row locked by
//! every redemption, so the limit holds across processes).

use lmsp_domain::auth::{Client, Pairing, SecretHash};
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::Redemption;
use lmsp_domain::schedule::ClientLimits;
use lmsp_domain::time::Timestamp;

use crate::codec;
use lmsp_storage_codec::flows;

use crate::codec::ops as shared;
use crate::codec::query::{Kind, Param};
use crate::ops::{corrupt, Db, Res, Rows};

/// Stores a client.
pub async fn insert_client<C: Db>(db: &C, client: &Client) -> Res<()> {
    shared::insert_client(&Rows(db), client).await
}

/// A client by id.
pub async fn client<C: Db>(db: &C, id: ClientId) -> Res<Option<Client>> {
    shared::client(&Rows(db), id).await
}

/// Every client, oldest first.
pub async fn list_clients<C: Db>(db: &C) -> Res<Vec<Client>> {
    shared::list_clients(&Rows(db)).await
}

/// Revokes a client.
pub async fn revoke_client<C: Db>(db: &C, id: ClientId, at: Timestamp) -> Res<bool> {
    shared::revoke_client(&Rows(db), id, at).await
}

/// A client's limits, as `client_queues` keeps them.
pub async fn client_limits<C: Db>(db: &C, id: ClientId) -> Res<ClientLimits> {
    shared::client_limits(&Rows(db), id).await
}

/// Replaces a client's limits; `false` when there is no such client.
pub async fn set_client_limits<C: Db>(db: &C, id: ClientId, limits: ClientLimits) -> Res<bool> {
    // An `integer` column: a limit past its range is refused.
    let limit = |value: Option<u32>| match value {
        Some(value) => i32::try_from(value)
            .map(Param::Int4)
            .map_err(|_| corrupt("a limit out of range")),
        None => Ok(Param::Null(Kind::Int4)),
    };
    let limits = [limit(limits.max_running)?, limit(limits.max_queued)?];
    flows::set_client_limits(&Rows(db), id, limits).await
}

/// Stores a pairing code hash.
pub async fn insert_pairing<C: Db>(db: &C, pairing: &Pairing) -> Res<()> {
    db.execute(
        "INSERT INTO pairings (code_hash, scopes, created_at, expires_at) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (code_hash) DO UPDATE SET \
         scopes = EXCLUDED.scopes, created_at = EXCLUDED.created_at, \
         expires_at = EXCLUDED.expires_at",
        &[
            &pairing.code_hash.to_hex(),
            &codec::scopes_to_text(&pairing.scopes)?,
            &pairing.created_at.as_millis(),
            &pairing.expires_at.as_millis(),
        ],
    )
    .await?;
    Ok(())
}

/// Redeems a pairing code under the pairing limit, all in the current transaction: the limit's
/// row is locked first, so redemptions in every process take their turn
/// ([`flows::redeem_pairing`]).
pub async fn redeem_pairing<C: Db>(
    db: &C,
    hash: &SecretHash,
    client: &Client,
    at: Timestamp,
) -> Res<Redemption> {
    flows::redeem_pairing(&Rows(db), hash, client, at).await
}
