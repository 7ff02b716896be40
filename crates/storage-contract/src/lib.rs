//! The storage contract suite: one set of checks, generic over a factory of fresh stores, that
//! every storage adapter of LMSP runs from its own tests (atuin's story test, River's
//! `riverdrivertest`). Swapping adapters is safe because each passes the same suite.
//!
//! The crate holds no adapter and depends on no database library: it knows the ports of
//! `lmsp_domain::ports` only. An adapter's test file implements [`StoreFactory`] and invokes the
//! macros, which expand to one `#[tokio::test(flavor = "multi_thread")]` per check, named after
//! the check, so a failure names the rule it broke:
//!
//! ```ignore
//! struct Factory { /* temp dirs, a database URL… */ }
//! #[async_trait::async_trait]
//! impl lmsp_storage_contract::StoreFactory for Factory { /* fresh(listener) */ }
//! impl lmsp_storage_contract::SingleProcess for Factory {}
//!
//! lmsp_storage_contract::storage_contract_tests!(Factory::new());
//! lmsp_storage_contract::storage_contract_single_process_tests!(Factory::new());
//! ```
//!
//! The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) among its dependencies.
//!
//! # Single-process and multi-process adapters
//!
//! Some rules depend on how many processes share a store. A *single-process* adapter (SQLite: one
//! process at a time, behind a lock on its data directory) declares every other instance stopped
//! when one registers, and its one process always leads the maintenance. A *multi-process*
//! adapter (PostgreSQL) lets many live instances share the store: leases, names, leader election
//! and notifications across processes matter. An adapter says which it is *in its type*, by
//! implementing [`SingleProcess`] or [`MultiProcess`] (never both), and invokes the matching macro:
//!
//! - [`storage_contract_tests!`]: every adapter (every port method, the listener, idempotency,
//!   recovery, concurrency within one store);
//! - [`storage_contract_single_process_tests!`]: adapters that implement [`SingleProcess`];
//! - [`storage_contract_multi_process_tests!`]: adapters that implement [`MultiProcess`], whose
//!   factory can open a second store on the same database ([`MultiProcess::another_process`]):
//!   two stores claiming concurrently, lease expiry and recovery by the other process,
//!   notifications across stores, names, leadership and idempotency holds across processes.
//!
//! The checks of a kind an adapter is not are simply not generated for it (the macro's bound
//! would not compile), so nothing is skipped silently at run time.
//!
//! # What the suite holds adapters to, beyond the port's doc comments
//!
//! - The listener has heard a write's events (and its `transaction_measured`) by the time the
//!   write returns: the app answers a request after its events are in the live fan-out.
//! - A command that writes nothing (a refusal, a replay, an error) tells the listener no event.
//! - Time is the `at`/`now` the caller passes: no check sleeps to let a lease or a window run out.
//! - Waiting for news from another process is bounded ([`support::eventually`]); nothing else waits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fixtures;
pub mod recording;
pub mod support;

pub mod batches;
pub mod cancel;
pub mod clients;
pub mod concurrency;
pub mod idempotency;
pub mod listener;
pub mod models;
pub mod multi_process;
pub mod output;
pub mod reads;
pub mod recovery;
pub mod recovery_oracle;
pub mod retention;
pub mod schedule;
pub mod single_process;
pub mod steps;
pub mod tasks;
pub mod webhooks;

mod macros;

use std::sync::Arc;

use async_trait::async_trait;
use lmsp_domain::ports::{Store, StoreListener};

pub use fixtures::*;
pub use recording::RecordingListener;
pub use support::{all_events, assert_log_consistent, eventually};

/// Makes fresh stores for the checks: each check asks for its own, empty store.
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// The adapter's store.
    type Store: Store + 'static;

    /// A fresh, empty store (no task, client, model, key or instance; migrated and ready) whose
    /// commits are told to `listener`. It stays usable for as long as the factory lives.
    async fn fresh(&self, listener: Arc<dyn StoreListener>) -> Self::Store;
}

/// Marks an adapter whose store serves one process at a time (SQLite behind the lock on its
/// data directory): registering an instance declares every other one stopped, and the one
/// process leads the maintenance. Its factory runs [`storage_contract_single_process_tests!`].
pub trait SingleProcess: StoreFactory {}

/// An adapter whose store many live processes share (PostgreSQL). Its factory runs
/// [`storage_contract_multi_process_tests!`] besides the common suite.
#[async_trait]
pub trait MultiProcess: StoreFactory {
    /// A second store on the same database as `store`, as another process would open it: its own
    /// connections, and its own `listener`, which hears this store's commits and, as far as the
    /// adapter's notifications carry them, what other stores commit (`advanced_elsewhere`,
    /// `cancel_requested`).
    async fn another_process(
        &self,
        store: &Self::Store,
        listener: Arc<dyn StoreListener>,
    ) -> Self::Store;
}

/// A fresh store and the listener that hears it.
pub async fn fresh_store<F: StoreFactory>(factory: &F) -> (F::Store, Arc<RecordingListener>) {
    let listener = RecordingListener::new();
    let store = factory.fresh(listener.clone()).await;
    (store, listener)
}

#[cfg(test)]
mod tests {
    /// Every public check of every module is generated by one of the macros: a check that is
    /// written but never run would pass unnoticed.
    #[test]
    fn every_check_is_generated_by_a_macro() {
        let macros = include_str!("macros.rs");
        let modules = [
            ("batches", include_str!("batches.rs")),
            ("cancel", include_str!("cancel.rs")),
            ("clients", include_str!("clients.rs")),
            ("concurrency", include_str!("concurrency.rs")),
            ("idempotency", include_str!("idempotency.rs")),
            ("listener", include_str!("listener.rs")),
            ("models", include_str!("models.rs")),
            ("multi_process", include_str!("multi_process.rs")),
            ("output", include_str!("output.rs")),
            ("reads", include_str!("reads.rs")),
            ("recovery", include_str!("recovery.rs")),
            ("recovery_oracle", include_str!("recovery_oracle.rs")),
            ("retention", include_str!("retention.rs")),
            ("single_process", include_str!("single_process.rs")),
            ("steps", include_str!("steps.rs")),
            ("tasks", include_str!("tasks.rs")),
            ("webhooks", include_str!("webhooks.rs")),
        ];
        let mut checks = 0;
        for (module, source) in modules {
            for line in source.lines() {
                let Some(rest) = line.strip_prefix("pub async fn ") else {
                    continue;
                };
                let name = rest.split('<').next().unwrap_or(rest);
                let listed = format!("{module}::{name},");
                assert!(
                    macros.contains(&listed),
                    "the check {module}::{name} is not generated by any macro"
                );
                checks += 1;
            }
        }
        let generated = macros.matches("::").count();
        assert!(checks > 50, "only {checks} checks found");
        assert!(
            generated >= checks,
            "{generated} generated, {checks} checks"
        );
    }
}
