//! Bounded retries with backoff for store writes that meet a store that cannot commit now (a full
//! disk, an I/O error, an unreachable database): the write is tried again, later and later, until
//! it commits or the policy gives up.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use lmsp_domain::ports::StoreError;

/// How a write is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait before the first retry; each next wait doubles.
    pub first_delay: Duration,
    /// The longest wait between two tries.
    pub max_delay: Duration,
    /// How long to keep trying before giving up.
    pub give_up_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            first_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(2),
            give_up_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The same waits, never giving up.
    pub fn forever(self) -> Self {
        Self {
            give_up_after: Duration::MAX,
            ..self
        }
    }
}

/// Why a retried write did not commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Abandoned {
    /// The error was not one that goes away (unreadable data).
    #[error("{0}")]
    Permanent(StoreError),
    /// The store still could not commit when the policy gave up.
    #[error("gave up after retries: {0}")]
    GaveUp(StoreError),
    /// The service is stopping.
    #[error("the service is stopping")]
    Stopped,
}

/// Runs `write` until it succeeds, retrying transient store errors with backoff per `policy`;
/// stops at once when `stop` is cancelled.
pub async fn retry<T, F, Fut>(
    policy: RetryPolicy,
    stop: &CancellationToken,
    mut write: F,
) -> Result<T, Abandoned>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    let mut delay = policy.first_delay;
    loop {
        let error = tokio::select! {
            biased;
            () = stop.cancelled() => return Err(Abandoned::Stopped),
            result = write() => match result {
                Ok(value) => return Ok(value),
                Err(error) if !error.is_transient() => return Err(Abandoned::Permanent(error)),
                Err(error) => error,
            },
        };
        if started.elapsed() >= policy.give_up_after {
            return Err(Abandoned::GaveUp(error));
        }
        tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "a store write failed; retrying");
        tokio::select! {
            biased;
            () = stop.cancelled() => return Err(Abandoned::Stopped),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(policy.max_delay);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            first_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
            give_up_after: Duration::from_secs(1),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_is_retried_until_the_write_commits() {
        let tries = AtomicU32::new(0);
        let result = retry(policy(), &CancellationToken::new(), || async {
            if tries.fetch_add(1, Ordering::SeqCst) < 3 {
                Err(StoreError::Full)
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(result, Ok(7));
        assert_eq!(tries.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_policy_gives_up_after_its_time_and_never_retries_corruption() {
        let gave_up = retry(policy(), &CancellationToken::new(), || async {
            Err::<(), _>(StoreError::Unavailable("io".into()))
        })
        .await;
        assert!(matches!(gave_up, Err(Abandoned::GaveUp(_))));
        let tries = AtomicU32::new(0);
        let corrupt = retry(policy(), &CancellationToken::new(), || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(StoreError::Corrupt("x".into()))
        })
        .await;
        assert!(matches!(corrupt, Err(Abandoned::Permanent(_))));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_retries_at_once() {
        let stop = CancellationToken::new();
        stop.cancel();
        let stopped = retry(policy(), &stop, || async { Err::<(), _>(StoreError::Full) }).await;
        assert_eq!(stopped, Err(Abandoned::Stopped));
    }
}
