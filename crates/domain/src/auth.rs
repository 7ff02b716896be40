//! Clients, scopes, tokens and pairing codes. Secrets are kept only as SHA-256 hashes (I-7).

use std::collections::BTreeSet;
use std::fmt;

use sha2::{Digest as _, Sha256};
use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::ids::ClientId;
use crate::ports::Redemption;
use crate::time::Timestamp;

/// What a client may do. `admin` implies every other scope.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    EnumString,
    IntoStaticStr,
    VariantArray,
    strum::Display,
)]
pub enum Scope {
    /// Submit and cancel work.
    #[strum(serialize = "responses:write")]
    ResponsesWrite,
    /// Read tasks, events and responses.
    #[strum(serialize = "responses:read")]
    ResponsesRead,
    /// List models.
    #[strum(serialize = "models:read")]
    ModelsRead,
    /// Register and delete models.
    #[strum(serialize = "models:write")]
    ModelsWrite,
    /// Everything, including clients, pairing and metrics.
    #[strum(serialize = "admin")]
    Admin,
}

/// A string that names no scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope `{0}` (expected responses:write, responses:read, models:read, models:write or admin)")]
pub struct UnknownScope(pub String);

impl Scope {
    /// Every scope.
    pub const ALL: &'static [Scope] = Self::VARIANTS;

    /// The name, e.g. `responses:write`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name.
    pub fn parse(text: &str) -> Result<Self, UnknownScope> {
        text.parse().map_err(|_| UnknownScope(text.to_owned()))
    }
}

/// A set of scopes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scopes(BTreeSet<Scope>);

impl Scopes {
    /// The set of the given scopes.
    pub fn new(scopes: impl IntoIterator<Item = Scope>) -> Self {
        Self(scopes.into_iter().collect())
    }

    /// Whether these scopes allow what `needed` allows (`admin` allows everything).
    pub fn allows(&self, needed: Scope) -> bool {
        self.0.contains(&Scope::Admin) || self.0.contains(&needed)
    }

    /// Whether every scope of `self` is allowed by `granting` (pairing: requested ⊆ granted).
    pub fn is_subset_of(&self, granting: &Scopes) -> bool {
        self.0.iter().all(|scope| granting.allows(*scope))
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The scopes in a stable order.
    pub fn iter(&self) -> impl Iterator<Item = Scope> + '_ {
        self.0.iter().copied()
    }
}

/// The prefix of every token.
pub const TOKEN_PREFIX: &str = "lmsp_";

/// A bearer secret (a client token or a pairing code). Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps secret text.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The secret text, for showing once to its owner.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The SHA-256 hash the database keeps instead of the secret.
    pub fn hash(&self) -> SecretHash {
        SecretHash(Sha256::digest(self.0.as_bytes()).into())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The SHA-256 hash of a [`Secret`]. Looking a hash up by equality in an index does not reveal the
/// secret through timing: the attacker controls the secret, not its hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SecretHash(pub [u8; 32]);

impl SecretHash {
    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses [`SecretHash::to_hex`]'s form; `None` for anything but 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Self(bytes))
    }
}

impl fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretHash({}…)", &self.to_hex()[..8])
    }
}

/// Whether text has the shape of a token: `lmsp_` and 43 base64url characters (32 bytes).
pub fn looks_like_token(text: &str) -> bool {
    text.strip_prefix(TOKEN_PREFIX).is_some_and(|rest| {
        rest.len() == 43
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// A paired client as stored: never its token, only the token's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its id.
    pub id: ClientId,
    /// A human name.
    pub name: String,
    /// What it may do.
    pub scopes: Scopes,
    /// The hash of its token.
    pub token_hash: SecretHash,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was revoked; a revoked client's token no longer works.
    pub revoked_at: Option<Timestamp>,
}

/// A pairing code as stored (hashed), valid until `expires_at`, usable once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pairing {
    /// The hash of the code.
    pub code_hash: SecretHash,
    /// The scopes a client paired with it may receive.
    pub scopes: Scopes,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it stops working.
    pub expires_at: Timestamp,
}

/// How long a pairing code is valid: 10 minutes.
pub const PAIRING_TTL_MILLIS: i64 = 10 * 60 * 1000;
/// How many wrong codes within [`PAIRING_TTL_MILLIS`] burn every outstanding code.
pub const PAIRING_MAX_FAILURES: usize = 5;

/// The state of the pairing limit: recent wrong codes, and a lock once there were too many.
///
/// After [`PAIRING_MAX_FAILURES`] wrong codes within [`PAIRING_TTL_MILLIS`], every outstanding code
/// is burnt and pairing is locked for [`PAIRING_TTL_MILLIS`]. The store keeps this state and
/// updates it in the same transaction as the attempt, so concurrent guesses never pass the limit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PairingLimit {
    /// When the recent wrong codes were tried, oldest first.
    pub failures: Vec<Timestamp>,
    /// Until when pairing is locked.
    pub locked_until: Option<Timestamp>,
}

/// What a wrong code does to the pairing limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfterFailure {
    /// The limit to store.
    pub limit: PairingLimit,
    /// Whether this failure made the limit: every outstanding code must be burnt.
    pub burn_codes: bool,
}

impl PairingLimit {
    /// `Err(until)` while pairing is locked at `now`.
    pub fn check(&self, now: Timestamp) -> Result<(), Timestamp> {
        match self.locked_until {
            Some(until) if until > now => Err(until),
            _ => Ok(()),
        }
    }

    /// The limit after a wrong code at `now`: failures older than the window are forgotten; the
    /// one that makes [`PAIRING_MAX_FAILURES`] locks pairing and burns the codes.
    pub fn after_failure(&self, now: Timestamp) -> AfterFailure {
        if self.check(now).is_err() {
            // Locked already: the lock stands as it is, and nothing more is counted.
            return AfterFailure {
                limit: self.clone(),
                burn_codes: false,
            };
        }
        let mut failures: Vec<Timestamp> = self
            .failures
            .iter()
            .copied()
            .filter(|at| at.plus_millis(PAIRING_TTL_MILLIS) > now)
            .collect();
        failures.push(now);
        if failures.len() >= PAIRING_MAX_FAILURES {
            AfterFailure {
                limit: PairingLimit {
                    failures: Vec::new(),
                    locked_until: Some(now.plus_millis(PAIRING_TTL_MILLIS)),
                },
                burn_codes: true,
            }
        } else {
            AfterFailure {
                limit: PairingLimit {
                    failures,
                    locked_until: None,
                },
                burn_codes: false,
            }
        }
    }
}

/// What a redemption writes once the pairing limit let it try (`PairingLimit::check`) and the
/// code was looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedeemWrite {
    /// No unexpired code has the hash: store the limit after the failure, and burn every
    /// outstanding code when it says so.
    Failure(AfterFailure),
    /// The code does not grant every requested scope: nothing is written.
    ScopesNotGranted,
    /// The code is used up and the client stored.
    Pair,
}

impl RedeemWrite {
    /// What the redemption answers once this is written.
    pub fn redemption(&self) -> Redemption {
        match self {
            RedeemWrite::Failure(after) => Redemption::NoSuchCode {
                limit_reached: after.burn_codes,
            },
            RedeemWrite::ScopesNotGranted => Redemption::ScopesNotGranted,
            RedeemWrite::Pair => Redemption::Paired,
        }
    }
}

/// What redeeming a code writes at `now`: `granted` is what the unexpired code with the tried
/// hash grants (`None`: there is none), `requested` what the new client asks for.
pub fn redeem(
    limit: &PairingLimit,
    granted: Option<&Scopes>,
    requested: &Scopes,
    now: Timestamp,
) -> RedeemWrite {
    match granted {
        None => RedeemWrite::Failure(limit.after_failure(now)),
        Some(granted) if !requested.is_subset_of(granted) => RedeemWrite::ScopesNotGranted,
        Some(_) => RedeemWrite::Pair,
    }
}

/// Pairing codes have the shape `483-921`.
pub fn looks_like_pairing_code(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 7
        && bytes[3] == b'-'
        && bytes[..3].iter().chain(&bytes[4..]).all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redemption_pairs_only_with_a_code_that_grants_every_requested_scope() {
        let now = Timestamp::from_millis(1_000_000);
        let limit = PairingLimit::default();
        let read = Scopes::new([Scope::ResponsesRead]);
        let both = Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite]);
        assert_eq!(redeem(&limit, Some(&both), &read, now), RedeemWrite::Pair);
        assert_eq!(
            redeem(&limit, Some(&both), &both, now).redemption(),
            Redemption::Paired
        );
        let refused = redeem(&limit, Some(&read), &both, now);
        assert_eq!(refused, RedeemWrite::ScopesNotGranted);
        assert_eq!(refused.redemption(), Redemption::ScopesNotGranted);
        let failed = redeem(&limit, None, &read, now);
        assert_eq!(failed, RedeemWrite::Failure(limit.after_failure(now)));
        assert_eq!(
            failed.redemption(),
            Redemption::NoSuchCode {
                limit_reached: false
            }
        );
    }

    #[test]
    fn the_failure_that_makes_the_limit_burns_the_codes() {
        let now = Timestamp::from_millis(1_000_000);
        let mut limit = PairingLimit::default();
        for _ in 1..PAIRING_MAX_FAILURES {
            let RedeemWrite::Failure(after) = redeem(&limit, None, &Scopes::default(), now) else {
                panic!("a missing code is a failure");
            };
            assert!(!after.burn_codes);
            limit = after.limit;
        }
        let last = redeem(&limit, None, &Scopes::default(), now);
        assert_eq!(
            last.redemption(),
            Redemption::NoSuchCode {
                limit_reached: true
            }
        );
    }

    #[test]
    fn a_secret_hash_round_trips_through_hex_and_nothing_else_parses() {
        let hash = Secret::new("lmsp_x").hash();
        assert_eq!(SecretHash::from_hex(&hash.to_hex()), Some(hash));
        for bad in ["", "abc", &"g".repeat(64), &"a".repeat(66)] {
            assert_eq!(SecretHash::from_hex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn scopes_parse_from_their_names_only() {
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Ok(*scope));
        }
        assert_eq!(Scope::ResponsesWrite.as_str(), "responses:write");
        assert!(Scope::parse("responses_write").is_err());
        assert!(Scope::parse("Admin").is_err());
    }

    #[test]
    fn five_wrong_codes_within_the_window_lock_pairing_and_burn_the_codes() {
        let start = Timestamp::from_millis(1_000_000);
        let mut limit = PairingLimit::default();
        for i in 0..4 {
            assert_eq!(limit.check(start.plus_millis(i)), Ok(()));
            let after = limit.after_failure(start.plus_millis(i));
            assert!(!after.burn_codes, "failure {i}");
            limit = after.limit;
        }
        let fifth = limit.after_failure(start.plus_millis(4));
        assert!(fifth.burn_codes, "the fifth makes the limit");
        let until = start.plus_millis(4 + PAIRING_TTL_MILLIS);
        assert_eq!(fifth.limit.check(start.plus_millis(5)), Err(until));
        assert_eq!(fifth.limit.check(until), Ok(()));
    }

    #[test]
    fn wrong_codes_older_than_the_window_are_forgotten() {
        let start = Timestamp::from_millis(1_000_000);
        let mut limit = PairingLimit::default();
        for i in 0..4 {
            limit = limit.after_failure(start.plus_millis(i)).limit;
        }
        let later = start.plus_millis(PAIRING_TTL_MILLIS + 3);
        let after = limit.after_failure(later);
        assert!(!after.burn_codes);
        assert_eq!(after.limit.failures, vec![later]);
    }

    #[test]
    fn admin_implies_every_scope() {
        let admin = Scopes::new([Scope::Admin]);
        assert!(Scope::ALL.iter().all(|s| admin.allows(*s)));
        let reader = Scopes::new([Scope::ResponsesRead]);
        assert!(reader.allows(Scope::ResponsesRead));
        assert!(!reader.allows(Scope::ResponsesWrite));
    }

    #[test]
    fn requested_scopes_must_be_a_subset_of_the_granted_ones() {
        let granted = Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite]);
        assert!(Scopes::new([Scope::ResponsesRead]).is_subset_of(&granted));
        assert!(!Scopes::new([Scope::Admin]).is_subset_of(&granted));
        assert!(Scopes::new([Scope::ModelsWrite]).is_subset_of(&Scopes::new([Scope::Admin])));
    }

    /// I-7: a secret's `Debug` never shows it, and its hash is what is stored.
    #[test]
    fn secrets_are_redacted_and_hashed_i7() {
        let secret = Secret::new("lmsp_topsecret");
        assert!(!format!("{secret:?}").contains("topsecret"));
        assert_eq!(secret.hash(), Secret::new("lmsp_topsecret").hash());
        assert_ne!(secret.hash(), Secret::new("lmsp_other").hash());
    }

    #[test]
    fn token_and_code_shapes_are_checked() {
        assert!(looks_like_token(&format!("lmsp_{}", "A".repeat(43))));
        assert!(!looks_like_token("lmsp_short"));
        assert!(!looks_like_token(&format!("tok_{}", "A".repeat(43))));
        assert!(looks_like_pairing_code("483-921"));
        assert!(!looks_like_pairing_code("483921"));
        assert!(!looks_like_pairing_code("48a-921"));
    }
}
