//! Pairing: one-time codes that admins hand out and new clients exchange for a token.
//!
//! Codes are stored hashed, valid 10 minutes, usable once. After 5 wrong codes within 10 minutes
//! every outstanding code is burnt and pairing answers `rate_limited` until 10 minutes have
//! passed. The limit is kept in the store and updated in the same transaction as each attempt
//! ([`lmsp_domain::auth::PairingLimit`]), so it holds for concurrent guesses and across
//! processes.

use lmsp_domain::auth::{Client, Pairing, Scope, Scopes, Secret, PAIRING_TTL_MILLIS};
use lmsp_domain::ports::Redemption;
use lmsp_domain::Timestamp;

use crate::caller::Caller;
use crate::credentials::{generate_pairing_code, new_client};
use crate::error::AppError;
use crate::service::Service;

/// A new pairing code, shown once.
#[derive(Debug)]
pub struct NewPairing {
    /// The code, e.g. `483-921`.
    pub code: Secret,
    /// When it stops working.
    pub expires_at: Timestamp,
    /// The scopes it may grant.
    pub scopes: Scopes,
}

/// A client created by pairing, with its token (shown once).
#[derive(Debug)]
pub struct Paired {
    /// The new client.
    pub client: Client,
    /// Its token.
    pub token: Secret,
}

impl Service {
    /// `POST /v1/pairings` (admin): a one-time code valid 10 minutes.
    pub async fn create_pairing(
        &self,
        caller: &Caller,
        scopes: Scopes,
    ) -> Result<NewPairing, AppError> {
        caller.require(Scope::Admin)?;
        let now = self.now();
        let code = generate_pairing_code();
        let pairing = Pairing {
            code_hash: code.hash(),
            scopes: scopes.clone(),
            created_at: now,
            expires_at: now.plus_millis(PAIRING_TTL_MILLIS),
        };
        let expires_at = pairing.expires_at;
        self.inner.core.store.insert_pairing(pairing).await?;
        Ok(NewPairing {
            code,
            expires_at,
            scopes,
        })
    }

    /// `POST /v1/pair` (no auth): exchanges a code for a new client.
    pub async fn pair(&self, code: &str, name: &str, scopes: Scopes) -> Result<Paired, AppError> {
        let now = self.now();
        let (client, token) = new_client(name, scopes, now);
        let redeemed = self
            .inner
            .core
            .store
            .redeem_pairing(Secret::new(code).hash(), client.clone(), now)
            .await?;
        match redeemed {
            Redemption::Paired => Ok(Paired { client, token }),
            // The code stays usable with the scopes it grants.
            Redemption::ScopesNotGranted => Err(AppError::ScopesNotGranted),
            Redemption::NoSuchCode { limit_reached } => {
                if limit_reached {
                    tracing::warn!("too many wrong pairing codes: every outstanding code is burnt");
                }
                Err(AppError::BadPairingCode)
            }
            Redemption::Locked { until } => Err(AppError::RateLimited {
                retry_after_seconds: until.millis_since(now).div_ceil(1000).max(1),
            }),
        }
    }
}
