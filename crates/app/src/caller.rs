//! Who is calling: an authenticated client, its scopes, and what it may see (I-7).

use lmsp_domain::auth::{Scope, Scopes};
use lmsp_domain::{ClientId, Task};

use crate::error::AppError;

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
