//! The notification port as this process hears it: every committed event reaches the listener
//! by the time the write returns, in log order, once; a write that commits nothing tells it no
//! event; every transaction is measured.

use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::transition::Step;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// The listener has heard every event of a task's life, exactly the stored log in order, by the
/// time each write returned (the app answers after the events are in its live fan-out).
pub async fn the_listener_hears_each_committed_event_once_in_log_order<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let created = create(&store, task(worker, RestartPolicy::Fail)).await;
    assert_eq!(
        kinds(&listener.events_of(created.id)),
        kinds(&all_events(&store, created.id).await),
        "heard by the time create_task returned"
    );
    let loading = step(
        &store,
        &created,
        worker,
        vec![claim(&created)],
        None,
        time(1),
    )
    .await;
    let running = step(&store, &loading, worker, vec![Step::Loaded], None, time(2)).await;
    assert_eq!(
        listener.events_of(created.id).len() as u64,
        running.last_sequence_number
    );
    let with_output = step(
        &store,
        &running,
        worker,
        vec![output("a"), output("b")],
        None,
        time(3),
    )
    .await;
    let done = finish(
        &store,
        &with_output,
        worker,
        complete(&with_output, "ab", time(4)),
    )
    .await;
    assert_eq!(done.status, TaskStatus::Completed);
    let (_, stored) = assert_log_consistent(&store, created.id).await;
    assert_eq!(
        listener.events_of(created.id),
        stored,
        "the listener heard the stored log, in order, once"
    );
}

/// A write that commits nothing (a refused step, a stale append, a cancel of a finished task)
/// tells the listener no event.
pub async fn a_write_that_commits_nothing_tells_no_event<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let mark = listener.mark();
    let stale = store
        .append(
            running.id,
            worker,
            running.last_sequence_number - 1,
            vec![output("x")],
            None,
            time(10),
        )
        .await
        .unwrap();
    refused(stale);
    let not_mine = store
        .append(
            running.id,
            instance_id(),
            running.last_sequence_number,
            vec![output("x")],
            None,
            time(10),
        )
        .await
        .unwrap();
    refused(not_mine);
    let completed = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Completed,
    )
    .await;
    let mark_after = listener.mark();
    decided(store.cancel(completed.id, None, time(11)).await.unwrap());
    assert!(
        listener.events_since(mark_after).is_empty(),
        "a cancel of a finished task"
    );
    let since = listener.events_since(mark);
    assert!(
        since.iter().all(|event| event.task_id == completed.id),
        "the refused steps told no event: {since:?}"
    );
}

/// Every transaction the adapter tried is measured: a committed one with its events, and the
/// measure is told by the time the write returns.
pub async fn every_transaction_is_measured<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let mark = listener.mark();
    let worker = instance_id();
    let created = create(&store, task(worker, RestartPolicy::Fail)).await;
    let measured = listener.transactions_since(mark);
    assert!(!measured.is_empty(), "create_task was measured");
    let committed: usize = measured
        .iter()
        .filter(|stats| stats.committed)
        .map(|stats| stats.events)
        .sum();
    assert_eq!(committed, 1, "one event committed: {measured:?}");
    assert!(measured.iter().all(|stats| stats.commands >= 1));
    let mark = listener.mark();
    step(
        &store,
        &created,
        worker,
        vec![claim(&created)],
        None,
        time(1),
    )
    .await;
    let measured = listener.transactions_since(mark);
    assert!(
        measured
            .iter()
            .any(|stats| stats.committed && stats.events == 1),
        "the claim was measured: {measured:?}"
    );
}
