//! A pairing code's redemption as both stores carry it out: the pairing limit's document and the
//! code's scopes as read (in the transaction that locks them, where the store locks), the
//! domain's [`redeem`] asked, and what to write back in stored form, so an adapter only reads
//! the two values and writes what [`plan_redemption`] returns.

use lmsp_domain::auth::{redeem, RedeemWrite, Scopes};
use lmsp_domain::ports::Redemption;
use lmsp_domain::time::Timestamp;

use crate::{pairing_limit_from_text, pairing_limit_to_text, scopes_from_text, DbError};

/// The `service_config` key of the pairing limit's document.
pub const PAIRING_LIMIT_KEY: &str = "pairing_limit";

/// What a redemption writes, in stored form, and what it answers once written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedemptionPlan {
    /// The answer.
    pub redemption: Redemption,
    /// The pairing limit's new document (under [`PAIRING_LIMIT_KEY`]), after a failure.
    pub limit: Option<String>,
    /// Every outstanding code is burnt (the failure made the limit).
    pub burn_codes: bool,
    /// The code is used up and the new client stored.
    pub pair: bool,
}

impl RedemptionPlan {
    fn answer(redemption: Redemption) -> Self {
        Self {
            redemption,
            limit: None,
            burn_codes: false,
            pair: false,
        }
    }
}

/// What redeeming a code at `at` writes: `limit` is the stored pairing limit (`None`: none yet),
/// `code_scopes` the scopes of the unexpired code with the tried hash (`None`: there is none),
/// `requested` what the new client asks for. While pairing is locked nothing is tried, and the
/// code's scopes are not even read.
pub fn plan_redemption(
    limit: Option<&str>,
    code_scopes: Option<&str>,
    requested: &Scopes,
    at: Timestamp,
) -> Result<RedemptionPlan, DbError> {
    let limit = limit
        .map(pairing_limit_from_text)
        .transpose()?
        .unwrap_or_default();
    if let Err(until) = limit.check(at) {
        return Ok(RedemptionPlan::answer(Redemption::Locked { until }));
    }
    let granted = code_scopes.map(scopes_from_text).transpose()?;
    let write = redeem(&limit, granted.as_ref(), requested, at);
    let mut plan = RedemptionPlan::answer(write.redemption());
    match write {
        RedeemWrite::Failure(after) => {
            plan.limit = Some(pairing_limit_to_text(&after.limit)?);
            plan.burn_codes = after.burn_codes;
        }
        RedeemWrite::ScopesNotGranted => {}
        RedeemWrite::Pair => plan.pair = true,
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use lmsp_domain::auth::{PairingLimit, Scope, PAIRING_MAX_FAILURES};

    use crate::scopes_to_text;

    fn read() -> Scopes {
        Scopes::new([Scope::ResponsesRead])
    }

    #[test]
    fn a_code_that_grants_the_scopes_pairs_and_writes_no_limit() {
        let at = Timestamp::from_millis(1_000);
        let scopes = scopes_to_text(&read()).unwrap();
        let plan = plan_redemption(None, Some(&scopes), &read(), at).unwrap();
        assert_eq!(plan.redemption, Redemption::Paired);
        assert!(plan.pair);
        assert_eq!((plan.limit, plan.burn_codes), (None, false));
    }

    #[test]
    fn a_missing_code_stores_the_limit_after_the_failure() {
        let at = Timestamp::from_millis(1_000);
        let plan = plan_redemption(None, None, &read(), at).unwrap();
        let after = PairingLimit::default().after_failure(at);
        assert_eq!(
            plan.redemption,
            Redemption::NoSuchCode {
                limit_reached: after.burn_codes
            }
        );
        assert_eq!(
            plan.limit,
            Some(pairing_limit_to_text(&after.limit).unwrap())
        );
        assert!(!plan.pair);
    }

    #[test]
    fn the_failure_that_makes_the_limit_burns_every_code_and_then_pairing_is_locked() {
        let mut limit: Option<String> = None;
        let mut burnt = Vec::new();
        for n in 0..PAIRING_MAX_FAILURES {
            let at = Timestamp::from_millis(1_000 + i64::try_from(n).unwrap());
            let plan = plan_redemption(limit.as_deref(), None, &read(), at).unwrap();
            burnt.push(plan.burn_codes);
            limit = plan.limit;
        }
        assert_eq!(burnt.iter().filter(|burn| **burn).count(), 1);
        assert_eq!(burnt.last(), Some(&true));
        let scopes = scopes_to_text(&read()).unwrap();
        let locked = plan_redemption(
            limit.as_deref(),
            Some(&scopes),
            &read(),
            Timestamp::from_millis(2_000),
        )
        .unwrap();
        assert!(matches!(locked.redemption, Redemption::Locked { .. }));
        assert_eq!(
            (locked.limit, locked.burn_codes, locked.pair),
            (None, false, false)
        );
    }

    #[test]
    fn a_code_that_grants_too_little_writes_nothing() {
        let at = Timestamp::from_millis(1_000);
        let scopes = scopes_to_text(&read()).unwrap();
        let both = Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite]);
        let plan = plan_redemption(None, Some(&scopes), &both, at).unwrap();
        assert_eq!(plan, RedemptionPlan::answer(Redemption::ScopesNotGranted));
    }
}
