//! Use cases of the LMSP service: submit, read, cancel, the worker pool, recovery at startup,
//! the purge job, clients and the live fan-out of committed events.
//!
//! The app knows the ports of `lmsp-domain`, never an adapter: `main` (in `lmsp-http`) builds the
//! adapters and hands them in as `Arc<dyn …>`.

mod credentials;
mod error;
mod live;
mod metrics;
mod pairing;
pub mod purge;
mod service;
mod worker;

pub use credentials::{generate_pairing_code, generate_token, new_client};
pub use error::AppError;
pub use live::{CommitListeners, LiveEvents};
pub use metrics::Metrics;
pub use pairing::{NewPairing, Paired};
pub use service::{Caller, Service, Settings, SubmitReply};

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
