//! Clients, pairing codes and the pairing limit (kept in `service_config`, its row locked by
//! every redemption, so the limit holds across processes).

use lmsp_domain::auth::{Client, Pairing, SecretHash};
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::Redemption;
use lmsp_domain::schedule::ClientLimits;
use lmsp_domain::time::Timestamp;
use tokio_postgres::Row;

use crate::codec;
use lmsp_storage_codec::flows::{self, ClientRows};

use crate::codec::{sql, ClientRow};
use crate::ops::{client_key, corrupt, read, Db, Res, Rows};

fn build_client(row: &Row) -> Res<Client> {
    Ok(read::<ClientRow>(row)?.decode()?)
}

/// Stores a client.
pub async fn insert_client<C: Db>(db: &C, client: &Client) -> Res<()> {
    let row = ClientRow::encode(client)?;
    db.execute(
        sql::INSERT_CLIENT,
        &[
            &row.id,
            &row.name,
            &row.token_hash,
            &row.scopes,
            &row.created_at,
            &row.revoked_at,
        ],
    )
    .await?;
    Ok(())
}

/// The unrevoked client with this token hash.
pub async fn client_by_token_hash<C: Db>(db: &C, hash: &SecretHash) -> Res<Option<Client>> {
    db.query_opt(&sql::client_by_token_hash(), &[&hash.to_hex()])
        .await?
        .as_ref()
        .map(build_client)
        .transpose()
}

/// A client by id.
pub async fn client<C: Db>(db: &C, id: ClientId) -> Res<Option<Client>> {
    db.query_opt(&sql::client_by_id(), &[&id.to_string()])
        .await?
        .as_ref()
        .map(build_client)
        .transpose()
}

/// Every client, oldest first.
pub async fn list_clients<C: Db>(db: &C) -> Res<Vec<Client>> {
    db.query(&sql::all_clients(), &[])
        .await?
        .iter()
        .map(build_client)
        .collect()
}

/// Revokes a client.
pub async fn revoke_client<C: Db>(db: &C, id: ClientId, at: Timestamp) -> Res<bool> {
    let changed = db
        .execute(sql::REVOKE_CLIENT, &[&at.as_millis(), &id.to_string()])
        .await?;
    Ok(changed == 1)
}

/// A client's limits, as `client_queues` keeps them.
pub async fn client_limits<C: Db>(db: &C, id: ClientId) -> Res<ClientLimits> {
    let row = db
        .query_opt(sql::CLIENT_LIMITS, &[&client_key(id).to_vec()])
        .await?;
    let Some(row) = row else {
        return Ok(ClientLimits::default());
    };
    let limit = |value: Option<i32>| value.map(|v| codec::u32_of(i64::from(v))).transpose();
    Ok(ClientLimits {
        max_running: limit(row.try_get(0)?)?,
        max_queued: limit(row.try_get(1)?)?,
    })
}

/// Replaces a client's limits; `false` when there is no such client.
pub async fn set_client_limits<C: Db>(db: &C, id: ClientId, limits: ClientLimits) -> Res<bool> {
    let exists = db.query_opt(sql::CLIENT_EXISTS, &[&id.to_string()]).await?;
    if exists.is_none() {
        return Ok(false);
    }
    let limit = |value: Option<u32>| value.map(i32::try_from).transpose();
    let (max_running, max_queued) = (
        limit(limits.max_running).map_err(|_| corrupt("a limit out of range"))?,
        limit(limits.max_queued).map_err(|_| corrupt("a limit out of range"))?,
    );
    db.execute(
        sql::SET_CLIENT_LIMITS,
        &[&client_key(id).to_vec(), &max_running, &max_queued],
    )
    .await?;
    Ok(true)
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

/// The client row's insert, for the codec's pairing flow.
impl<C: Db> ClientRows for Rows<'_, C> {
    async fn insert_client(&self, client: &Client) -> Res<()> {
        insert_client(self.0, client).await
    }
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
