//! Callers and clients: bearer tokens checked against their stored hashes (I-7), scopes, the
//! client list and revocation.

use lmsp_domain::auth::{looks_like_token, Client, Scope, Secret};
use lmsp_domain::validation::ValidationError;
use lmsp_domain::{ClientId, ClientLimits};

use crate::caller::Caller;
use crate::credentials::new_client;
use crate::error::AppError;
use crate::service::Service;

/// A change of a client's limits: `Some(limit)` sets one (`Some(None)`: no limit), `None` keeps
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitsUpdate {
    /// The new `max_running`.
    pub max_running: Option<Option<u32>>,
    /// The new `max_queued`.
    pub max_queued: Option<Option<u32>>,
}

impl LimitsUpdate {
    /// Refuses a `max_running` of 0: a client that may run nothing would only fill its queue
    /// (cancel or stop submitting instead). `max_queued` may be 0: every submit is then 429.
    pub fn check(self) -> Result<(), AppError> {
        if self.max_running == Some(Some(0)) {
            return Err(AppError::Invalid(ValidationError::new(
                "max_running",
                "`max_running` must be at least 1, or null for no limit",
            )));
        }
        Ok(())
    }

    /// `limits` with this update applied.
    pub fn applied_to(self, limits: ClientLimits) -> ClientLimits {
        ClientLimits {
            max_running: self.max_running.unwrap_or(limits.max_running),
            max_queued: self.max_queued.unwrap_or(limits.max_queued),
        }
    }
}

/// A new client and its token, shown once.
#[derive(Debug)]
pub struct NewClient {
    /// The client.
    pub client: Client,
    /// Its token.
    pub token: Secret,
}

impl Service {
    /// Checks a bearer token against the stored hashes (a revoked client fails at once).
    pub async fn authenticate(&self, token: &str) -> Result<Caller, AppError> {
        if !looks_like_token(token) {
            return Err(AppError::Unauthorized);
        }
        let hash = Secret::new(token).hash();
        match self.inner.core.store.client_by_token_hash(hash).await? {
            Some(client) if client.revoked_at.is_none() => Ok(Caller {
                client_id: client.id,
                scopes: client.scopes,
            }),
            _ => Err(AppError::Unauthorized),
        }
    }

    /// Every client with its limits (admin).
    pub async fn clients(&self, caller: &Caller) -> Result<Vec<(Client, ClientLimits)>, AppError> {
        caller.require(Scope::Admin)?;
        let store = &self.inner.core.store;
        let mut listed = Vec::new();
        for client in store.list_clients().await? {
            let limits = store.client_limits(client.id).await?;
            listed.push((client, limits));
        }
        Ok(listed)
    }

    /// Changes a client's limits (admin): `update` holds the ones to change.
    pub async fn update_client_limits(
        &self,
        caller: &Caller,
        client_id: ClientId,
        update: LimitsUpdate,
    ) -> Result<(Client, ClientLimits), AppError> {
        caller.require(Scope::Admin)?;
        offline::update_limits(self.inner.core.store.as_ref(), client_id, update).await
    }

    /// The metrics in the Prometheus text format (admin), with tasks by status as stored now.
    pub async fn metrics_text(&self, caller: &Caller) -> Result<String, AppError> {
        caller.require(Scope::Admin)?;
        let counts = self.inner.core.store.count_by_status().await?;
        Ok(self.inner.core.listener.metrics.render(&counts))
    }

    /// Revokes a client (admin); its token stops working at once.
    pub async fn revoke_client(
        &self,
        caller: &Caller,
        client_id: ClientId,
    ) -> Result<(), AppError> {
        caller.require(Scope::Admin)?;
        if self
            .inner
            .core
            .store
            .revoke_client(client_id, self.now())
            .await?
        {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }
}

/// The offline client commands, on a store (no service running in this process).
pub mod offline {
    use lmsp_domain::auth::Scopes;
    use lmsp_domain::ports::Store;
    use lmsp_domain::ClientId;

    use lmsp_domain::auth::Client;
    use lmsp_domain::ClientLimits;

    use super::{new_client, LimitsUpdate, NewClient};
    use crate::error::AppError;
    use crate::SystemClock;
    use lmsp_domain::ports::Clock;

    /// Adds a client with a new token.
    pub async fn add_client(
        store: &dyn Store,
        name: &str,
        scopes: Scopes,
    ) -> Result<NewClient, AppError> {
        let (client, token) = new_client(name, scopes, SystemClock.now());
        store.insert_client(client.clone()).await?;
        Ok(NewClient { client, token })
    }

    /// Changes a client's limits; the client and its limits after the change. A revoked client
    /// is not found, as for its revocation; `max_running` of 0 is refused (nothing changed).
    pub async fn update_limits(
        store: &dyn Store,
        client_id: ClientId,
        update: LimitsUpdate,
    ) -> Result<(Client, ClientLimits), AppError> {
        update.check()?;
        let client = store
            .client(client_id)
            .await?
            .filter(|client| client.revoked_at.is_none())
            .ok_or(AppError::NotFound)?;
        let limits = update.applied_to(store.client_limits(client_id).await?);
        if !store.set_client_limits(client_id, limits).await? {
            return Err(AppError::NotFound);
        }
        Ok((client, limits))
    }

    /// Revokes a client.
    pub async fn revoke_client(store: &dyn Store, client_id: ClientId) -> Result<(), AppError> {
        if store.revoke_client(client_id, SystemClock.now()).await? {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }
}
