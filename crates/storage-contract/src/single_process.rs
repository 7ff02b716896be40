//! Checks for adapters whose store serves one process at a time ([`crate::SingleProcess`]):
//! registering declares every other instance stopped, so a restarted service recovers what its
//! previous incarnation left (P-7…P-11) at once, and that incarnation can renew no lease.

use lmsp_domain::ports::Registration;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, SingleProcess};

/// Registering declares every other instance stopped, whatever its name and lease: the earlier
/// ones are named as previous, are listed as stopped, and can renew no lease.
pub async fn registering_declares_every_other_instance_stopped<F: SingleProcess>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let first = instance("host-a", time(0), 3_600_000);
    assert_eq!(
        store.register_instance(first.clone()).await.unwrap(),
        Registration::Registered { previous: vec![] }
    );
    let second = instance("host-b", time(1_000), 3_600_000);
    assert_eq!(
        store.register_instance(second.clone()).await.unwrap(),
        Registration::Registered {
            previous: vec![first.id]
        },
        "a lease that has not run out does not keep the earlier process alive"
    );
    assert_eq!(
        store
            .stopped_instances(second.id, time(1_000))
            .await
            .unwrap(),
        vec![first.id]
    );
    assert!(
        !store
            .renew_lease(first.id, time(7_200_000), time(2_000))
            .await
            .unwrap(),
        "the earlier process is stopped"
    );
    assert!(store
        .renew_lease(second.id, time(7_200_000), time(2_000))
        .await
        .unwrap());
    assert!(
        store.lead_maintenance(second.id).await.unwrap(),
        "the one process leads"
    );
}

/// P-7…P-11, I-5: a restart (the next incarnation registering) recovers every leftover task of
/// the previous one at once, without waiting for its lease, and then no instance is stopped.
pub async fn a_restart_recovers_the_previous_incarnation_at_once_p7_i5<F: SingleProcess>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let before = register(&store, "host", time(0)).await.id;
    let running = task_in(
        &store,
        task(before, RestartPolicy::Retry),
        before,
        TaskStatus::Running,
    )
    .await;
    let queued = task_in(
        &store,
        task(before, RestartPolicy::Fail),
        before,
        TaskStatus::Queued,
    )
    .await;
    let after = register(&store, "host", time(10)).await.id;
    let stopped = store.stopped_instances(after, time(10)).await.unwrap();
    assert_eq!(stopped, vec![before]);
    let report = store
        .recover_instance(before, after, time(11))
        .await
        .unwrap();
    assert_eq!(report.moved, 2, "{report:?}");
    let (requeued, _) = assert_log_consistent(&store, running.id).await;
    assert_eq!(requeued.status, TaskStatus::Queued, "P-8: retry requeues");
    assert_eq!(requeued.restarts, running.restarts + 1);
    let (failed, _) = assert_log_consistent(&store, queued.id).await;
    assert_eq!(failed.status, TaskStatus::Failed, "P-9: fail fails");
    assert!(
        store
            .stopped_instances(after, time(12))
            .await
            .unwrap()
            .is_empty(),
        "a recovered instance is no longer listed"
    );
}
