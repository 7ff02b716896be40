//! Paired clients and pairing codes.

use async_trait::async_trait;

use crate::auth::{Client, Pairing, SecretHash};
use crate::ids::ClientId;
use crate::ports::StoreError;
use crate::schedule::ClientLimits;
use crate::time::Timestamp;

/// How redeeming a pairing code ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redemption {
    /// The code was used up and the client stored.
    Paired,
    /// The code exists but does not grant every requested scope; nothing changed.
    ScopesNotGranted,
    /// No unexpired code has this hash (wrong, used or expired): the failure was counted, and
    /// when it made the limit (`limit_reached`) every outstanding code was burnt.
    NoSuchCode {
        /// Whether this failure locked pairing.
        limit_reached: bool,
    },
    /// Pairing is locked after too many wrong codes, until then; nothing was tried.
    Locked {
        /// When pairing opens again.
        until: Timestamp,
    },
}

/// Paired clients and pairing codes.
#[async_trait]
pub trait ClientStore: Send + Sync {
    /// Stores a new client.
    async fn insert_client(&self, client: Client) -> Result<(), StoreError>;
    /// The unrevoked client whose token has this hash.
    async fn client_by_token_hash(&self, hash: SecretHash) -> Result<Option<Client>, StoreError>;
    /// A client by id (revoked or not).
    async fn client(&self, client_id: ClientId) -> Result<Option<Client>, StoreError>;
    /// Every client, oldest first.
    async fn list_clients(&self) -> Result<Vec<Client>, StoreError>;
    /// Revokes a client; `false` when there is no such unrevoked client.
    async fn revoke_client(&self, client_id: ClientId, at: Timestamp) -> Result<bool, StoreError>;
    /// A client's limits (none set: both `None`).
    async fn client_limits(&self, client_id: ClientId) -> Result<ClientLimits, StoreError>;
    /// Replaces a client's limits; `false` when there is no such client.
    async fn set_client_limits(
        &self,
        client_id: ClientId,
        limits: ClientLimits,
    ) -> Result<bool, StoreError>;
    /// Stores a pairing code (hashed).
    async fn insert_pairing(&self, pairing: Pairing) -> Result<(), StoreError>;
    /// Redeems a pairing code in one transaction, under the pairing limit
    /// ([`crate::auth::PairingLimit`], kept in the store): when pairing is not locked and an
    /// unexpired code with this hash grants every scope `client` asks for, deletes the code (one
    /// use) and stores the client; a wrong code is counted, and the one that makes the limit burns
    /// every outstanding code. A code that does not grant the scopes stays usable.
    async fn redeem_pairing(
        &self,
        code_hash: SecretHash,
        client: Client,
        at: Timestamp,
    ) -> Result<Redemption, StoreError>;
}
