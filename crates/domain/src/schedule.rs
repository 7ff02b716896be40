//! Which queued task runs next: service tiers with aging, fairness between clients, and the
//! per-client and service-wide queue limits.
//!
//! A store cannot hand every queued task to a function (there may be a million), so the decision
//! is made over *queue heads*: for each client and tier, the oldest queued task. Within one
//! client's queue of one tier, the oldest task has waited longest, so it is also the one aging
//! has moved furthest; the heads are therefore enough to find the task the whole order puts
//! first.
//!
//! A store need not read every head either (there may be thousands of clients): it keeps one
//! *queue front* per client and tier (the head, and a copy of the client's load) indexed in claim
//! order within each tier, asks [`claim_window`] where the next claim is from the oldest open
//! front of each tier (at most three index seeks), reads the first front in claim order of each
//! tier the window names, and asks [`next_claim`] to choose among those (at most three).

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::ids::{ClientId, TaskId};
use crate::time::Timestamp;

/// How urgently a task runs (OpenAI's `service_tier`): `priority` tasks are claimed before
/// `default` ones, `default` before `flex` (batch lines).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    EnumString,
    IntoStaticStr,
    VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum ServiceTier {
    /// Claimed first.
    Priority,
    /// Claimed after `priority`; what a request that names no tier (or `auto`) gets.
    #[default]
    Default,
    /// Claimed after `default`.
    Flex,
}

impl ServiceTier {
    /// Every tier, most urgent first.
    pub const ALL: &'static [ServiceTier] = Self::VARIANTS;

    /// The name, e.g. `priority`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a request's `service_tier`: `auto` is `default`; `None` for an unknown name.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(Self::Default),
            _ => text.parse().ok(),
        }
    }

    /// The tier's rank, 0 for the most urgent: the number a store keeps and indexes.
    pub const fn rank(self) -> u8 {
        match self {
            Self::Priority => 0,
            Self::Default => 1,
            Self::Flex => 2,
        }
    }

    /// The tier of a stored rank; `None` for a rank no tier has.
    pub const fn from_rank(rank: u8) -> Option<Self> {
        match rank {
            0 => Some(Self::Priority),
            1 => Some(Self::Default),
            2 => Some(Self::Flex),
            _ => None,
        }
    }
}

/// How long a queued task waits before it is claimed as if it were one tier more urgent
/// (`--tier-aging`); each further period moves it up another tier, so no queued task waits
/// forever behind a steady stream of more urgent work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierAging {
    millis: u64,
}

impl TierAging {
    /// The default: five minutes.
    pub const DEFAULT: TierAging = TierAging {
        millis: 5 * 60 * 1000,
    };

    /// An aging period of `millis` milliseconds; `None` for 0 (a task would jump to the top
    /// tier at once, which would make tiers meaningless).
    pub const fn from_millis(millis: u64) -> Option<Self> {
        if millis == 0 {
            None
        } else {
            Some(Self { millis })
        }
    }

    /// The period in milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.millis
    }

    /// The rank a task of `tier` created at `created_at` is claimed at, at `now`: its tier's rank
    /// less one per whole period waited, never below 0.
    pub fn effective_rank(self, tier: ServiceTier, created_at: Timestamp, now: Timestamp) -> u8 {
        let periods = now.millis_since(created_at) / self.millis;
        let up = u8::try_from(periods).unwrap_or(u8::MAX);
        tier.rank().saturating_sub(up)
    }
}

impl Default for TierAging {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The oldest queued task of one client in one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueHead {
    /// The task.
    pub task: TaskId,
    /// Its client.
    pub client: ClientId,
    /// Its tier.
    pub tier: ServiceTier,
    /// When it was accepted.
    pub created_at: Timestamp,
}

/// What fairness needs to know of a client with queued work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientLoad {
    /// Its tasks now claimed and unfinished (`loading`, `running`, `cancelling`).
    pub running: u32,
    /// The most it may have running (`None`: no limit).
    pub max_running: Option<u32>,
    /// When one of its tasks was last claimed (`None`: never).
    pub last_served: Option<Timestamp>,
}

impl ClientLoad {
    /// Whether another of its tasks may start now.
    pub fn may_start(&self) -> bool {
        self.max_running.is_none_or(|max| self.running < max)
    }
}

/// The task to claim next among `heads` (each with its client's load), or `None` when no head's
/// client may start another task.
///
/// The order: the most urgent effective tier (a tier's rank, moved up by `aging`); within it, the
/// client with the fewest tasks running; then the client served least recently (never served
/// first); then the oldest task. Heads of clients at their `max_running` are passed over, so their
/// other tasks wait while other clients' run.
pub fn next_claim(
    heads: &[(QueueHead, ClientLoad)],
    aging: TierAging,
    now: Timestamp,
) -> Option<TaskId> {
    heads
        .iter()
        .filter(|(_, load)| load.may_start())
        .min_by_key(|(head, load)| {
            (
                aging.effective_rank(head.tier, head.created_at, now),
                load.running,
                load.last_served,
                head.task,
            )
        })
        .map(|(head, _)| head.task)
}

/// Where the next claim is among the queue fronts, found from the oldest open front of each tier
/// (see [`claim_window`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimWindow {
    /// The effective rank of the next claim: the least any open front has now.
    pub rank: u8,
    /// The tiers with fronts at that rank, most urgent first, each with the latest creation time
    /// of a head that has aged down to it (`None`: any head, the tier's own rank is the window's).
    pub tiers: Vec<(ServiceTier, Option<Timestamp>)>,
}

/// Where [`next_claim`] will find the next task, given for each tier with an *open* front (a
/// head whose client may start another task, [`ClientLoad::may_start`]) the creation time of its
/// oldest open head; `None` when there is none.
///
/// Every head is at least as urgent as its tier's oldest open one, so the rank of the next claim is
/// the least of those three ranks; a tier reaches it only if its oldest open head does, and then
/// exactly its heads created at or before the window's time for it. The next claim is the first of
/// those heads in claim order (fewest running, least recently served, oldest task) across the
/// window's tiers: a store reads, for each, the first open front in that order whose head was
/// created by the tier's time, and hands the (at most three) fronts to [`next_claim`], which picks
/// the one the whole order puts first.
pub fn claim_window(
    oldest: &[(ServiceTier, Timestamp)],
    aging: TierAging,
    now: Timestamp,
) -> Option<ClaimWindow> {
    let rank = oldest
        .iter()
        .map(|(tier, created)| aging.effective_rank(*tier, *created, now))
        .min()?;
    let mut tiers: Vec<(ServiceTier, Option<Timestamp>)> = oldest
        .iter()
        .filter(|(tier, created)| aging.effective_rank(*tier, *created, now) == rank)
        .map(|(tier, _)| {
            let periods = tier.rank().saturating_sub(rank);
            let by = (periods > 0).then(|| {
                let waited = u64::from(periods).saturating_mul(aging.as_millis());
                let waited = i64::try_from(waited).unwrap_or(i64::MAX);
                Timestamp::from_millis(now.as_millis().saturating_sub(waited))
            });
            (*tier, by)
        })
        .collect();
    tiers.sort_by_key(|(tier, _)| *tier);
    tiers.dedup_by_key(|(tier, _)| *tier);
    Some(ClaimWindow { rank, tiers })
}

/// What an admin allows one client (`None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientLimits {
    /// The most of its tasks that run at once; its other tasks wait while others' run.
    pub max_running: Option<u32>,
    /// The most of its tasks submitted one by one that may be queued; a submit past it is
    /// refused. A batch's lines do not count (a batch is bounded by its lines).
    pub max_queued: Option<u32>,
}

/// The queue limits a submit is checked against (`max_queued` of its client, `--max-queued` of
/// the service; `None`: no limit), over the queued tasks submitted one by one: a batch's lines
/// never count, so a queued batch makes no other request wait for a place (API §14, §16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueLimits {
    /// The client's `max_queued`.
    pub client: Option<u32>,
    /// The service's `--max-queued`.
    pub service: Option<u32>,
}

/// Why a submit was not queued: a queue is full (nothing is created).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueFull {
    /// The client has `max_queued` tasks queued already (429 `rate_limited`).
    #[error("the client has {0} tasks queued, its limit")]
    Client(u32),
    /// The service has `--max-queued` tasks queued already (503 `service_unavailable`).
    #[error("the service has {0} tasks queued, its limit")]
    Service(u32),
}

impl QueueLimits {
    /// Whether a new task may be queued when the client has `client_queued` tasks queued and the
    /// service `service_queued` (a store counts at most up to the limits, inside the transaction
    /// that would insert the task). The client's limit is checked first.
    pub fn admit(&self, client_queued: u64, service_queued: u64) -> Result<(), QueueFull> {
        if let Some(max) = self.client {
            if client_queued >= u64::from(max) {
                return Err(QueueFull::Client(max));
            }
        }
        if let Some(max) = self.service {
            if service_queued >= u64::from(max) {
                return Err(QueueFull::Service(max));
            }
        }
        Ok(())
    }

    /// Whether any limit is set (a store counts nothing when none is).
    pub fn any(&self) -> bool {
        self.client.is_some() || self.service.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ulid::Ulid;

    fn task(n: u64) -> TaskId {
        TaskId::from_ulid(Ulid::from_parts(1_700_000_000_000 + n, 0))
    }

    fn client(n: u64) -> ClientId {
        ClientId::from_ulid(Ulid::from_parts(1_600_000_000_000 + n, 0))
    }

    fn head(n: u64, of: u64, tier: ServiceTier, created: i64) -> QueueHead {
        QueueHead {
            task: task(n),
            client: client(of),
            tier,
            created_at: Timestamp::from_millis(created),
        }
    }

    const MINUTE: u64 = 60_000;

    #[test]
    fn tiers_parse_their_names_and_auto_is_default() {
        for tier in ServiceTier::ALL {
            assert_eq!(ServiceTier::parse(tier.as_str()), Some(*tier));
            assert_eq!(ServiceTier::from_rank(tier.rank()), Some(*tier));
        }
        assert_eq!(ServiceTier::parse("auto"), Some(ServiceTier::Default));
        assert_eq!(ServiceTier::parse("scale"), None);
        assert_eq!(ServiceTier::from_rank(3), None);
    }

    #[test]
    fn a_task_moves_up_one_tier_per_aging_period_waited_and_stops_at_the_top() {
        let aging = TierAging::from_millis(5 * MINUTE).unwrap();
        let at = |m: u64| Timestamp::from_millis((m * MINUTE) as i64);
        let flex = ServiceTier::Flex;
        assert_eq!(aging.effective_rank(flex, at(0), at(0)), 2);
        assert_eq!(aging.effective_rank(flex, at(0), at(4)), 2);
        assert_eq!(aging.effective_rank(flex, at(0), at(5)), 1);
        assert_eq!(aging.effective_rank(flex, at(0), at(10)), 0);
        assert_eq!(aging.effective_rank(flex, at(0), at(1_000_000)), 0);
        assert_eq!(
            aging.effective_rank(ServiceTier::Priority, at(0), at(60)),
            0
        );
        assert_eq!(
            aging.effective_rank(flex, at(10), at(0)),
            2,
            "a clock behind the task's creation ages nothing"
        );
        assert_eq!(TierAging::from_millis(0), None);
    }

    #[test]
    fn a_more_urgent_tier_goes_first_whatever_the_age_until_aging_moves_the_older() {
        let aging = TierAging::from_millis(5 * MINUTE).unwrap();
        let heads = [
            (head(1, 1, ServiceTier::Flex, 0), ClientLoad::default()),
            (
                head(2, 2, ServiceTier::Default, 1000),
                ClientLoad::default(),
            ),
        ];
        assert_eq!(
            next_claim(&heads, aging, Timestamp::from_millis(2000)),
            Some(task(2))
        );
        // After one period the flex task is claimed as default; older, it goes first.
        let later = Timestamp::from_millis((5 * MINUTE) as i64 + 1);
        assert_eq!(next_claim(&heads, aging, later), Some(task(1)));
    }

    #[test]
    fn within_a_tier_the_client_with_fewer_running_goes_first() {
        let aging = TierAging::DEFAULT;
        let busy = ClientLoad {
            running: 2,
            ..ClientLoad::default()
        };
        let idle = ClientLoad {
            running: 1,
            ..ClientLoad::default()
        };
        let heads = [
            (head(1, 1, ServiceTier::Default, 0), busy),
            (head(2, 2, ServiceTier::Default, 10), idle),
        ];
        assert_eq!(
            next_claim(&heads, aging, Timestamp::from_millis(20)),
            Some(task(2))
        );
    }

    #[test]
    fn equal_loads_go_to_the_client_served_least_recently_then_the_oldest_task() {
        let aging = TierAging::DEFAULT;
        let served = |at: i64| ClientLoad {
            last_served: Some(Timestamp::from_millis(at)),
            ..ClientLoad::default()
        };
        let heads = [
            (head(1, 1, ServiceTier::Default, 0), served(50)),
            (head(2, 2, ServiceTier::Default, 10), served(40)),
        ];
        let now = Timestamp::from_millis(60);
        assert_eq!(next_claim(&heads, aging, now), Some(task(2)));
        let heads = [
            (head(1, 1, ServiceTier::Default, 0), served(50)),
            (head(2, 2, ServiceTier::Default, 10), ClientLoad::default()),
        ];
        assert_eq!(
            next_claim(&heads, aging, now),
            Some(task(2)),
            "never served is least recently"
        );
        let heads = [
            (head(3, 1, ServiceTier::Default, 30), served(50)),
            (head(2, 2, ServiceTier::Default, 10), served(50)),
        ];
        assert_eq!(next_claim(&heads, aging, now), Some(task(2)), "oldest");
    }

    #[test]
    fn a_client_at_its_max_running_is_passed_over() {
        let aging = TierAging::DEFAULT;
        let full = ClientLoad {
            running: 1,
            max_running: Some(1),
            last_served: None,
        };
        let heads = [
            (head(1, 1, ServiceTier::Priority, 0), full),
            (head(2, 2, ServiceTier::Flex, 10), ClientLoad::default()),
        ];
        let now = Timestamp::from_millis(20);
        assert_eq!(next_claim(&heads, aging, now), Some(task(2)));
        assert_eq!(next_claim(&heads[..1], aging, now), None);
        assert_eq!(next_claim(&[], aging, now), None);
        let room = ClientLoad {
            running: 1,
            max_running: Some(2),
            last_served: None,
        };
        assert!(room.may_start());
        assert!(!ClientLoad {
            max_running: Some(0),
            ..ClientLoad::default()
        }
        .may_start());
    }

    /// What a store does with its queue fronts: the oldest open head of each tier, the window,
    /// then the first open head in claim order of each tier the window names (created by its
    /// time), and [`next_claim`] among those.
    fn through_the_fronts(
        heads: &[(QueueHead, ClientLoad)],
        aging: TierAging,
        now: Timestamp,
    ) -> Option<TaskId> {
        let open: Vec<&(QueueHead, ClientLoad)> =
            heads.iter().filter(|(_, load)| load.may_start()).collect();
        let oldest: Vec<(ServiceTier, Timestamp)> = ServiceTier::ALL
            .iter()
            .filter_map(|tier| {
                open.iter()
                    .filter(|(head, _)| head.tier == *tier)
                    .map(|(head, _)| head.created_at)
                    .min()
                    .map(|created| (*tier, created))
            })
            .collect();
        let window = claim_window(&oldest, aging, now)?;
        let fronts: Vec<(QueueHead, ClientLoad)> = window
            .tiers
            .iter()
            .filter_map(|(tier, by)| {
                open.iter()
                    .filter(|(head, _)| head.tier == *tier)
                    .filter(|(head, _)| by.is_none_or(|by| head.created_at <= by))
                    .min_by_key(|(head, load)| (load.running, load.last_served, head.task))
                    .map(|front| **front)
            })
            .collect();
        assert!(!fronts.is_empty(), "a window names a tier with a front");
        next_claim(&fronts, aging, now)
    }

    #[test]
    fn the_window_is_the_least_rank_of_the_oldest_heads_and_the_times_that_reach_it() {
        let aging = TierAging::from_millis(5 * MINUTE).unwrap();
        let at = |m: u64| Timestamp::from_millis((m * MINUTE) as i64);
        assert_eq!(claim_window(&[], aging, at(0)), None);
        // Nothing aged: the most urgent tier with work, all of its heads.
        let oldest = [(ServiceTier::Default, at(15)), (ServiceTier::Flex, at(11))];
        assert_eq!(
            claim_window(&oldest, aging, at(15)),
            Some(ClaimWindow {
                rank: 1,
                tiers: vec![(ServiceTier::Default, None)],
            })
        );
        // At 17 minutes the flex head counts as default: flex heads created by minute 12 (one
        // period before) join the window.
        assert_eq!(
            claim_window(&oldest, aging, at(17)),
            Some(ClaimWindow {
                rank: 1,
                tiers: vec![
                    (ServiceTier::Default, None),
                    (ServiceTier::Flex, Some(at(12)))
                ],
            })
        );
        // At 22 both reach priority: default heads created by minute 17, flex by 12.
        assert_eq!(
            claim_window(&oldest, aging, at(22)),
            Some(ClaimWindow {
                rank: 0,
                tiers: vec![
                    (ServiceTier::Default, Some(at(17))),
                    (ServiceTier::Flex, Some(at(12)))
                ],
            })
        );
    }

    #[test]
    fn through_the_window_a_claim_finds_what_next_claim_finds_over_every_head() {
        let aging = TierAging::from_millis(5 * MINUTE).unwrap();
        let idle = ClientLoad::default();
        let busy = ClientLoad {
            running: 3,
            ..ClientLoad::default()
        };
        // An old flex head of a busy client and a young one of an idle client: at 11 minutes
        // only the old one has aged to priority, and it beats the young priority head's client
        // only on rank, not load.
        let heads = [
            (head(1, 1, ServiceTier::Flex, 0), busy),
            (head(2, 2, ServiceTier::Flex, (10 * MINUTE) as i64), idle),
            (
                head(3, 3, ServiceTier::Priority, (10 * MINUTE) as i64),
                busy,
            ),
            (
                head(4, 4, ServiceTier::Priority, (10 * MINUTE) as i64),
                idle,
            ),
        ];
        let now = Timestamp::from_millis((11 * MINUTE) as i64);
        assert_eq!(next_claim(&heads, aging, now), Some(task(4)));
        assert_eq!(through_the_fronts(&heads, aging, now), Some(task(4)));
        let heads = [heads[0], heads[1], heads[2]];
        assert_eq!(next_claim(&heads, aging, now), Some(task(1)), "older");
        assert_eq!(through_the_fronts(&heads, aging, now), Some(task(1)));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Reading the fronts the window names finds exactly the task [`next_claim`] finds over
        /// every head (API §16: tiers with aging, then fewest running, least recently served,
        /// oldest; clients at their `max_running` passed over).
        #[test]
        fn a_claim_through_the_window_is_next_claim_over_every_head(
            fronts in proptest::collection::vec(
                (0u64..6, 0usize..3, 0i64..40, 0u64..1000), 0..14),
            loads in proptest::collection::vec(
                (0u32..4, proptest::option::of(0u32..4), proptest::option::of(0i64..40)), 6),
            now in 0i64..45,
            period in 1u64..12,
        ) {
            let aging = TierAging::from_millis(period * MINUTE).unwrap();
            let mut heads: Vec<(QueueHead, ClientLoad)> = Vec::new();
            for (n, (client_n, tier, created, order)) in fronts.iter().enumerate() {
                let tier = ServiceTier::ALL[*tier];
                if heads.iter().any(|(h, _)| h.client == client(*client_n) && h.tier == tier) {
                    continue;
                }
                let (running, max_running, served) = loads[*client_n as usize];
                let load = ClientLoad {
                    running,
                    max_running,
                    last_served: served.map(|m| Timestamp::from_millis(m * MINUTE as i64)),
                };
                let head = QueueHead {
                    task: task(order * 100 + n as u64),
                    client: client(*client_n),
                    tier,
                    created_at: Timestamp::from_millis(created * MINUTE as i64),
                };
                heads.push((head, load));
            }
            let now = Timestamp::from_millis(now * MINUTE as i64);
            proptest::prop_assert_eq!(
                through_the_fronts(&heads, aging, now),
                next_claim(&heads, aging, now)
            );
        }
    }

    #[test]
    fn a_full_queue_refuses_the_client_first_then_the_service() {
        let limits = QueueLimits {
            client: Some(5),
            service: Some(100),
        };
        assert_eq!(limits.admit(4, 99), Ok(()));
        assert_eq!(limits.admit(5, 0), Err(QueueFull::Client(5)));
        assert_eq!(limits.admit(5, 100), Err(QueueFull::Client(5)));
        assert_eq!(limits.admit(0, 100), Err(QueueFull::Service(100)));
        assert!(limits.any());
        let none = QueueLimits::default();
        assert!(!none.any());
        assert_eq!(none.admit(u64::MAX, u64::MAX), Ok(()));
        let service_only = QueueLimits {
            client: None,
            service: Some(1),
        };
        assert!(service_only.any());
        assert_eq!(service_only.admit(1000, 0), Ok(()));
    }
}
