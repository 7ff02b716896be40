//! Checks for adapters that many live processes share ([`crate::MultiProcess`]): two stores on
//! one database claim concurrently (each task once), a lease that runs out lets the other process
//! recover the tasks, commits and cancels reach the other process's listener, names and
//! leadership are exclusive, and an idempotency hold is seen by every process.

use std::collections::HashSet;
use std::sync::Arc;

use lmsp_domain::idempotency::{KeyDecision, Operation};
use lmsp_domain::ports::Registration;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;

use crate::fixtures::*;
use crate::recording::RecordingListener;
use crate::support::*;
use crate::{fresh_store, MultiProcess};

/// Two processes claiming from one queue at the same time claim every task exactly once.
pub async fn two_processes_claim_each_task_once<F: MultiProcess>(factory: &F) {
    let (first, _heard) = fresh_store(factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let mut created = HashSet::new();
    for _ in 0..30 {
        created.insert(
            create(&first, task(instance_id(), RestartPolicy::Fail))
                .await
                .id,
        );
    }
    let first = Arc::new(first);
    let second = Arc::new(second);
    let mut claimers = Vec::new();
    for index in 0..4 {
        let first = Arc::clone(&first);
        let second = Arc::clone(&second);
        claimers.push(tokio::spawn(async move {
            let me = instance_id();
            let mut mine = Vec::new();
            loop {
                let claimed = if index % 2 == 0 {
                    first.claim_next(me, time(10)).await.unwrap()
                } else {
                    second.claim_next(me, time(10)).await.unwrap()
                };
                match claimed {
                    Some(task) => mine.push(task.id),
                    None => return mine,
                }
            }
        }));
    }
    let mut claimed = Vec::new();
    for claimer in claimers {
        claimed.extend(claimer.await.unwrap());
    }
    let unique: HashSet<_> = claimed.iter().copied().collect();
    assert_eq!(unique.len(), claimed.len(), "a task was claimed twice");
    assert_eq!(unique, created, "every task was claimed");
}

/// P-7, I-5: when a process's lease runs out, the other process sees it stopped and recovers
/// its tasks; the stopped process can renew no lease and take no step on them.
pub async fn a_lease_that_ran_out_lets_another_process_recover_p7_i5<F: MultiProcess>(factory: &F) {
    let (first, _heard) = fresh_store(factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let gone = instance("host-a", time(0), 10_000);
    assert!(matches!(
        first.register_instance(gone.clone()).await.unwrap(),
        Registration::Registered { .. }
    ));
    let rescuer = instance("host-b", time(0), 60_000);
    assert!(matches!(
        second.register_instance(rescuer.clone()).await.unwrap(),
        Registration::Registered { .. }
    ));
    let left = task_in(
        &first,
        task(gone.id, RestartPolicy::Retry),
        gone.id,
        TaskStatus::Running,
    )
    .await;
    assert!(
        second
            .stopped_instances(rescuer.id, time(5_000))
            .await
            .unwrap()
            .is_empty(),
        "a live lease is not stopped"
    );
    let stopped = second
        .stopped_instances(rescuer.id, time(10_001))
        .await
        .unwrap();
    assert_eq!(stopped, vec![gone.id]);
    let report = second
        .recover_instance(gone.id, rescuer.id, time(10_001))
        .await
        .unwrap();
    assert_eq!(report.moved, 1);
    assert!(
        !first
            .renew_lease(gone.id, time(40_000), time(10_002))
            .await
            .unwrap(),
        "a recovered instance renews no lease"
    );
    let (after, _) = assert_log_consistent(&second, left.id).await;
    assert_eq!(after.status, TaskStatus::Queued);
    assert_eq!(after.restarts, left.restarts + 1);
    let late = first
        .append(
            left.id,
            gone.id,
            after.last_sequence_number,
            vec![output("late")],
            None,
            time(10_003),
        )
        .await
        .unwrap();
    refused(late);
}

/// Commits and cancels of one process reach the other's listener (`advanced_elsewhere`,
/// `cancel_requested`), within a bound.
pub async fn commits_and_cancels_reach_the_other_process<F: MultiProcess>(factory: &F) {
    let (first, _heard) = fresh_store(factory).await;
    let elsewhere = RecordingListener::new();
    let second = factory.another_process(&first, elsewhere.clone()).await;
    let worker = instance_id();
    let running = task_in(
        &first,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let seq = running.last_sequence_number;
    eventually("advanced_elsewhere", NEWS_DEADLINE, || {
        let found = elsewhere
            .advanced_elsewhere_to(running.id)
            .filter(|n| *n >= seq);
        async move { found }
    })
    .await;
    decided(first.cancel(running.id, None, time(20)).await.unwrap());
    eventually("cancel_requested", NEWS_DEADLINE, || {
        let heard = elsewhere.heard_cancel_of(running.id).then_some(());
        async move { heard }
    })
    .await;
    drop(second);
}

/// A name whose lease has not run out cannot be registered by another process; once it ran
/// out, the new incarnation registers and names the old one as previous.
pub async fn a_name_with_a_running_lease_is_in_use<F: MultiProcess>(factory: &F) {
    let (first, _heard) = fresh_store(factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let live = instance("shared-name", time(0), 10_000);
    assert!(matches!(
        first.register_instance(live.clone()).await.unwrap(),
        Registration::Registered { .. }
    ));
    let clash = instance("shared-name", time(1_000), 10_000);
    assert_eq!(
        second.register_instance(clash).await.unwrap(),
        Registration::NameInUse {
            lease_until: live.lease_until
        }
    );
    let later = instance("shared-name", time(10_001), 10_000);
    assert_eq!(
        second.register_instance(later).await.unwrap(),
        Registration::Registered {
            previous: vec![live.id]
        }
    );
}

/// At most one live instance leads the maintenance at a time.
pub async fn one_instance_leads_the_maintenance<F: MultiProcess>(factory: &F) {
    let (first, _heard) = fresh_store(factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let a = register(&first, "lead-a", time(0)).await.id;
    let b = register(&second, "lead-b", time(0)).await.id;
    let a_leads = first.lead_maintenance(a).await.unwrap();
    let b_leads = second.lead_maintenance(b).await.unwrap();
    assert!(
        a_leads != b_leads,
        "exactly one leads: a {a_leads}, b {b_leads}"
    );
    let again = if a_leads {
        first.lead_maintenance(a).await.unwrap()
    } else {
        second.lead_maintenance(b).await.unwrap()
    };
    assert!(again, "the leader keeps leading");
}

/// I-8: a key held by a request in one process is in use for a request in the other.
pub async fn a_key_held_in_one_process_is_in_use_in_the_other_i8<F: MultiProcess>(factory: &F) {
    let (first, _heard) = fresh_store(factory).await;
    let second = factory
        .another_process(&first, RecordingListener::new())
        .await;
    let claim = key_claim(
        client_id(),
        Operation::CreateResponse,
        "cross",
        "{}",
        instance_id(),
        time(0),
    );
    assert_eq!(
        first.claim_key(&claim, time(0)).await.unwrap(),
        KeyDecision::Proceed
    );
    assert_eq!(
        second.claim_key(&claim, time(1)).await.unwrap(),
        KeyDecision::InUse
    );
}
