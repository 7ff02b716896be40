//! What every part of the app shares: the store and the listener it reports to, the clock, the
//! settings, this instance's id, and ids in creation order.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lmsp_domain::ports::{Clock, Store};
use lmsp_domain::{InstanceId, Timestamp};

use crate::listener::Listener;
use crate::settings::Settings;

/// The ports and the identity of this process, shared by the use cases, the workers and the jobs.
pub(crate) struct Core {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) listener: Arc<Listener>,
    pub(crate) settings: Settings,
    /// This process's instance.
    pub(crate) instance: InstanceId,
    ids: Mutex<ulid::Generator>,
}

/// A duration in milliseconds, saturated.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Core {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        listener: Arc<Listener>,
        settings: Settings,
        instance: InstanceId,
    ) -> Self {
        Self {
            store,
            clock,
            listener,
            settings,
            instance,
            ids: Mutex::new(ulid::Generator::new()),
        }
    }

    /// Now, by the service's clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// `now` plus `duration`.
    pub(crate) fn after(&self, duration: Duration) -> Timestamp {
        self.now().plus_millis(millis(duration))
    }

    /// The next id, monotonic within this process so creation order is id order.
    pub(crate) fn next_ulid(&self) -> ulid::Ulid {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        ids.generate().unwrap_or_else(|_| ulid::Ulid::new())
    }
}
