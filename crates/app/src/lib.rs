//! Use cases of the LMSP service: submitting work (with idempotency keys), reading tasks,
//! responses and events, cancelling, the worker pool, recovery of stopped instances, the purge
//! job, models, clients and pairing, and the live fan-out of committed events.
//!
//! The app knows the ports of `lmsp-domain`, never an adapter: the `lmsp` binary builds the
//! adapters and hands them in as `Arc<dyn …>` ([`Adapters`]).

mod batches;
mod caller;
mod clients;
mod credentials;
mod engines;
mod error;
mod follow;
mod idempotency;
mod jobs;
mod lifecycle;
mod listener;
mod live;
mod metrics;
mod models;
mod pairing;
pub mod purge;
pub mod retry;
mod service;
mod settings;
mod shared;
mod submit;
mod tasks;
mod webhooks;
mod worker;

pub use batches::{BatchRequest, BatchWire, FileContent, ReadLine, Received};
pub use caller::Caller;
pub use clients::{offline as clients_offline, LimitsUpdate, NewClient};
pub use credentials::{generate_pairing_code, generate_token, new_client};
pub use engines::Engines;
pub use error::{AppError, STORAGE_RETRY_AFTER_SECONDS};
pub use idempotency::{IdempotentRequest, Keyed};
pub use listener::{Listener, RunningTasks, StoreHealth};
pub use live::{Live, LiveEvents};
pub use metrics::{DroppedLines, Metrics};
pub use models::{offline as models_offline, ModelOrigin, Models};
pub use pairing::{NewPairing, Paired};
pub use service::{Adapters, Service, Started};
pub use settings::Settings;
pub use submit::{Delivery, FromTask, KeptReply, TaskAnswer, TaskReplies, TaskReply};
pub use tasks::{Cancel, CancelState, TaskQuery};
pub use webhooks::{EndpointUpdate, WebhookSettings, MAX_LISTED_DELIVERIES};

use std::time::{SystemTime, UNIX_EPOCH};

use lmsp_domain::ports::Clock;
use lmsp_domain::Timestamp;

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Timestamp::from_millis(millis)
    }
}
