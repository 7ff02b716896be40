//! Clients, pairing codes and the pairing limit (kept in `service_config`, its row locked by
//! every redemption, so the limit holds across processes).

use lmsp_domain::auth::{Client, Pairing, PairingLimit, SecretHash};
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::Redemption;
use lmsp_domain::time::Timestamp;
use tokio_postgres::Row;

use crate::codec;
use crate::ops::{config_value, corrupt, set_config_value, Db, Res};

fn parse_hash(text: &str) -> Res<SecretHash> {
    SecretHash::from_hex(text).ok_or_else(|| corrupt("a stored hash is not 64 hex digits"))
}

fn build_client(row: &Row) -> Res<Client> {
    let id: String = row.try_get(0)?;
    let hash: String = row.try_get(2)?;
    let scopes: String = row.try_get(3)?;
    let created_at: i64 = row.try_get(4)?;
    let revoked_at: Option<i64> = row.try_get(5)?;
    Ok(Client {
        id: ClientId::parse(&id).map_err(corrupt)?,
        name: row.try_get(1)?,
        scopes: codec::scopes_from_text(&scopes)?,
        token_hash: parse_hash(&hash)?,
        created_at: Timestamp::from_millis(created_at),
        revoked_at: revoked_at.map(Timestamp::from_millis),
    })
}

const CLIENT_COLUMNS: &str = "id, name, token_hash, scopes, created_at, revoked_at";

/// Stores a client.
pub async fn insert_client<C: Db>(db: &C, client: &Client) -> Res<()> {
    db.execute(
        "INSERT INTO clients (id, name, token_hash, scopes, created_at, revoked_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &client.id.to_string(),
            &client.name,
            &client.token_hash.to_hex(),
            &codec::scopes_to_text(&client.scopes)?,
            &client.created_at.as_millis(),
            &client.revoked_at.map(Timestamp::as_millis),
        ],
    )
    .await?;
    Ok(())
}

/// The unrevoked client with this token hash.
pub async fn client_by_token_hash<C: Db>(db: &C, hash: &SecretHash) -> Res<Option<Client>> {
    let sql = format!(
        "SELECT {CLIENT_COLUMNS} FROM clients WHERE token_hash = $1 AND revoked_at IS NULL"
    );
    db.query_opt(&sql, &[&hash.to_hex()])
        .await?
        .as_ref()
        .map(build_client)
        .transpose()
}

/// A client by id.
pub async fn client<C: Db>(db: &C, id: ClientId) -> Res<Option<Client>> {
    let sql = format!("SELECT {CLIENT_COLUMNS} FROM clients WHERE id = $1");
    db.query_opt(&sql, &[&id.to_string()])
        .await?
        .as_ref()
        .map(build_client)
        .transpose()
}

/// Every client, oldest first.
pub async fn list_clients<C: Db>(db: &C) -> Res<Vec<Client>> {
    let sql = format!("SELECT {CLIENT_COLUMNS} FROM clients ORDER BY created_at, id");
    db.query(&sql, &[])
        .await?
        .iter()
        .map(build_client)
        .collect()
}

/// Revokes a client.
pub async fn revoke_client<C: Db>(db: &C, id: ClientId, at: Timestamp) -> Res<bool> {
    let changed = db
        .execute(
            "UPDATE clients SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
            &[&at.as_millis(), &id.to_string()],
        )
        .await?;
    Ok(changed == 1)
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

const PAIRING_LIMIT: &str = "pairing_limit";

/// Redeems a pairing code under the pairing limit, all in the current transaction: the limit's
/// row is locked first, so redemptions in every process take their turn.
pub async fn redeem_pairing<C: Db>(
    db: &C,
    hash: &SecretHash,
    client: &Client,
    at: Timestamp,
) -> Res<Redemption> {
    let limit: PairingLimit = match config_value(db, PAIRING_LIMIT, true).await? {
        Some(text) => codec::pairing_limit_from_text(&text)?,
        None => PairingLimit::default(),
    };
    if let Err(until) = limit.check(at) {
        return Ok(Redemption::Locked { until });
    }
    let scopes: Option<String> = match db
        .query_opt(
            "SELECT scopes FROM pairings WHERE code_hash = $1 AND expires_at > $2 FOR UPDATE",
            &[&hash.to_hex(), &at.as_millis()],
        )
        .await?
    {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    };
    let Some(scopes) = scopes else {
        let after = limit.after_failure(at);
        set_config_value(
            db,
            PAIRING_LIMIT,
            &codec::pairing_limit_to_text(&after.limit)?,
        )
        .await?;
        if after.burn_codes {
            db.execute("DELETE FROM pairings", &[]).await?;
        }
        return Ok(Redemption::NoSuchCode {
            limit_reached: after.burn_codes,
        });
    };
    let granted = codec::scopes_from_text(&scopes)?;
    if !client.scopes.is_subset_of(&granted) {
        return Ok(Redemption::ScopesNotGranted);
    }
    db.execute(
        "DELETE FROM pairings WHERE code_hash = $1",
        &[&hash.to_hex()],
    )
    .await?;
    insert_client(db, client).await?;
    Ok(Redemption::Paired)
}
