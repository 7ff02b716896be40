//! Callers and clients: bearer tokens checked against their stored hashes (I-7), scopes, the
//! client list and revocation.

use lmsp_domain::auth::{looks_like_token, Client, Scope, Scopes, Secret};
use lmsp_domain::{ClientId, Task};

use crate::credentials::new_client;
use crate::error::AppError;
use crate::service::Service;

/// Who is calling: an authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The client.
    pub client_id: ClientId,
    /// Its scopes.
    pub scopes: Scopes,
}

impl Caller {
    /// `Ok` when the caller has `scope` (admin has all), else `Forbidden`.
    pub fn require(&self, scope: Scope) -> Result<(), AppError> {
        if self.scopes.allows(scope) {
            Ok(())
        } else {
            Err(AppError::Forbidden(scope.as_str()))
        }
    }

    /// Whether the caller has `scope`.
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.allows(scope)
    }

    /// The client whose tasks this caller may see; `None` for admin (all of them).
    pub fn visibility(&self) -> Option<ClientId> {
        (!self.scopes.allows(Scope::Admin)).then_some(self.client_id)
    }

    /// Whether the caller may see `task` (its own, or any for admin).
    pub fn may_see(&self, task: &Task) -> bool {
        self.visibility()
            .is_none_or(|client| client == task.client_id)
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
        match self.inner.store.client_by_token_hash(hash).await? {
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
        Ok(self.inner.store.list_clients().await?)
    }

    /// The metrics in the Prometheus text format (admin), with tasks by status as stored now.
    pub async fn metrics_text(&self, caller: &Caller) -> Result<String, AppError> {
        caller.require(Scope::Admin)?;
        let counts = self.inner.store.count_by_status().await?;
        Ok(self.inner.listener.metrics.render(&counts))
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
