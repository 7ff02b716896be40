//! Pairing (API.md §3): one-time codes that admins hand out and new clients exchange for a token.
//!
//! Codes are stored hashed, valid 10 minutes, usable once. After 5 wrong codes within 10 minutes
//! every outstanding code is burnt and pairing answers `rate_limited` until that window passes.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use lmsp_domain::auth::{
    Client, Pairing, Scope, Scopes, Secret, PAIRING_MAX_FAILURES, PAIRING_TTL_MILLIS,
};
use lmsp_domain::Timestamp;

use lmsp_domain::ports::Redemption;

use crate::credentials::{generate_pairing_code, new_client};
use crate::error::AppError;
use crate::service::{Caller, Service};

/// Recent wrong codes, oldest first, and the attempts being checked right now.
#[derive(Debug, Default)]
pub(crate) struct PairingFailures(Mutex<Attempts>);

#[derive(Debug, Default)]
struct Attempts {
    failures: VecDeque<Timestamp>,
    in_flight: usize,
}

impl PairingFailures {
    /// Reserves an attempt, or says when to try again. An attempt in flight counts as a possible
    /// failure, so concurrent guesses can never exceed the limit between two checks.
    fn begin(&self, now: Timestamp) -> Result<(), Timestamp> {
        let mut attempts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while attempts
            .failures
            .front()
            .is_some_and(|at| at.plus_millis(PAIRING_TTL_MILLIS) <= now)
        {
            attempts.failures.pop_front();
        }
        if attempts.failures.len() >= PAIRING_MAX_FAILURES {
            let newest = attempts.failures.back().copied().unwrap_or(now);
            return Err(newest.plus_millis(PAIRING_TTL_MILLIS));
        }
        if attempts.failures.len() + attempts.in_flight >= PAIRING_MAX_FAILURES {
            // Others are being checked and could make the limit: try again in a moment.
            return Err(now.plus_millis(1000));
        }
        attempts.in_flight += 1;
        Ok(())
    }

    /// Ends a reserved attempt; a wrong code is recorded. `true` when that makes the limit.
    fn end(&self, now: Timestamp, wrong: bool) -> bool {
        let mut attempts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        attempts.in_flight = attempts.in_flight.saturating_sub(1);
        if wrong {
            attempts.failures.push_back(now);
        }
        wrong && attempts.failures.len() >= PAIRING_MAX_FAILURES
    }
}

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
        self.inner.store.insert_pairing(pairing).await?;
        Ok(NewPairing {
            code,
            expires_at,
            scopes,
        })
    }

    /// `POST /v1/pair` (no auth): exchanges a code for a new client.
    pub async fn pair(&self, code: &str, name: &str, scopes: Scopes) -> Result<Paired, AppError> {
        let now = self.now();
        let failures = &self.inner.pairing_failures;
        if let Err(until) = failures.begin(now) {
            return Err(AppError::RateLimited {
                retry_after_seconds: seconds_until(now, until),
            });
        }
        let (client, token) = new_client(name, scopes, now);
        let redeemed = self
            .inner
            .store
            .redeem_pairing(Secret::new(code).hash(), client.clone(), now)
            .await;
        let wrong = matches!(redeemed, Ok(Redemption::NoSuchCode));
        if failures.end(now, wrong) {
            let burnt = self.inner.store.burn_pairings().await?;
            tracing::warn!(
                burnt,
                "too many wrong pairing codes: every outstanding code is burnt"
            );
        }
        match redeemed? {
            Redemption::Paired => Ok(Paired { client, token }),
            // The code stays usable with the scopes it grants.
            Redemption::ScopesNotGranted => Err(AppError::Forbidden(
                "a scope the pairing code does not grant",
            )),
            Redemption::NoSuchCode => Err(AppError::Unauthorized),
        }
    }
}

fn seconds_until(now: Timestamp, until: Timestamp) -> u64 {
    let millis = until.as_millis().saturating_sub(now.as_millis()).max(0) as u64;
    millis.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_within_ten_minutes_lock_pairing_until_the_window_passes() {
        let failures = PairingFailures::default();
        let start = Timestamp::from_millis(1_000_000);
        for i in 0..4 {
            assert_eq!(failures.begin(start.plus_millis(i)), Ok(()));
            assert!(!failures.end(start.plus_millis(i), true));
        }
        assert_eq!(failures.begin(start.plus_millis(4)), Ok(()));
        assert!(
            failures.end(start.plus_millis(4), true),
            "the fifth makes the limit"
        );
        assert_eq!(
            failures.begin(start.plus_millis(5)),
            Err(start.plus_millis(4 + PAIRING_TTL_MILLIS))
        );
        let later = start.plus_millis(PAIRING_TTL_MILLIS + 10);
        assert_eq!(failures.begin(later), Ok(()));
    }

    /// Concurrent guesses cannot slip past the limit: attempts being checked count against it.
    #[test]
    fn attempts_in_flight_count_against_the_limit() {
        let failures = PairingFailures::default();
        let now = Timestamp::from_millis(1_000_000);
        for _ in 0..PAIRING_MAX_FAILURES {
            assert_eq!(failures.begin(now), Ok(()));
        }
        assert!(
            failures.begin(now).is_err(),
            "a sixth guess at once is refused"
        );
        assert!(!failures.end(now, false), "a right code frees its slot");
        assert_eq!(failures.begin(now), Ok(()));
    }
}
