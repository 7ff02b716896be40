//! Callers and clients: bearer tokens checked against their stored hashes (I-7), scopes, the
//! client list and revocation.

use lmsp_domain::auth::{looks_like_token, Client, Scope, Secret};
use lmsp_domain::ClientId;

use crate::caller::Caller;
use crate::credentials::new_client;
use crate::error::AppError;
use crate::service::Service;

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

    /// Every client (admin).
    pub async fn clients(&self, caller: &Caller) -> Result<Vec<Client>, AppError> {
        caller.require(Scope::Admin)?;
        Ok(self.inner.core.store.list_clients().await?)
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

    use super::{new_client, NewClient};
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

    /// Revokes a client.
    pub async fn revoke_client(store: &dyn Store, client_id: ClientId) -> Result<(), AppError> {
        if store.revoke_client(client_id, SystemClock.now()).await? {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }
}
