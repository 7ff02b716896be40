//! How the service behaves: its settings, built by the binary from flags and environment.

use std::time::Duration;

use lmsp_domain::{RestartPolicy, TierAging};

use crate::retry::RetryPolicy;
use crate::webhooks::WebhookSettings;

/// How the service behaves; built by the binary from flags and environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tasks run at once (at least 1).
    pub workers: usize,
    /// How long finished tasks are kept.
    pub retention: Duration,
    /// How often the purge job runs.
    pub purge_interval: Duration,
    /// How long idempotency keys are kept.
    pub idempotency_ttl: Duration,
    /// How long a request may hold its idempotency key at most (it is released when the request
    /// is answered, and when its instance stops).
    pub idempotency_hold: Duration,
    /// The policy of tasks whose request names none.
    pub default_on_restart: RestartPolicy,
    /// The version string shown by `GET /v1/service`.
    pub version: String,
    /// This instance's stable name (its incarnations share it).
    pub instance_name: String,
    /// How long an instance's lease runs without renewal.
    pub lease: Duration,
    /// For a store shared by several processes: how often to look for what notifications may
    /// have missed (cancels, events); `None` for a single-process store, whose notices are exact.
    pub poll_fallback: Option<Duration>,
    /// How store writes of a running task are retried when the store cannot commit.
    pub store_retry: RetryPolicy,
    /// How long a worker waits, after a cancel, for its engine to stop before it drops it.
    pub engine_stop_grace: Duration,
    /// How long a queued task waits before it is claimed one tier more urgently.
    pub tier_aging: TierAging,
    /// How many tasks may be queued in the whole service (`None`: no limit).
    pub max_queued: Option<u32>,
    /// The largest file a client may upload, in bytes.
    pub max_file_bytes: u64,
    /// How webhook deliveries are sent and retried.
    pub webhooks: WebhookSettings,
}

impl Settings {
    /// Settings with the defaults of `lmsp serve`.
    pub fn with_defaults(version: impl Into<String>) -> Self {
        Self {
            workers: 4,
            retention: Duration::from_secs(7 * 24 * 3600),
            purge_interval: Duration::from_secs(60),
            idempotency_ttl: Duration::from_secs(24 * 3600),
            idempotency_hold: Duration::from_secs(600),
            default_on_restart: RestartPolicy::Fail,
            version: version.into(),
            instance_name: String::from("lmsp"),
            lease: Duration::from_secs(10),
            poll_fallback: None,
            store_retry: RetryPolicy::default(),
            engine_stop_grace: Duration::from_secs(30),
            tier_aging: TierAging::DEFAULT,
            max_queued: None,
            max_file_bytes: 200 * 1024 * 1024,
            webhooks: WebhookSettings::default(),
        }
    }
}
