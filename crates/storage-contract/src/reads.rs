//! The reads of the task port: `task`, `task_by_response`, `list_tasks`, `events`, `response`,
//! `snapshot`, `count_by_status`, `cancelling_tasks`.

use std::collections::BTreeMap;

use lmsp_domain::ids::ResponseId;
use lmsp_domain::ports::TaskFilter;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::Task;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// A task reads back, by its id and by its response's id, in every one of the seven statuses;
/// the response id of a task is its own ULID, unknown ids find nothing.
pub async fn a_task_reads_back_by_id_and_by_response_id_in_every_status<F: StoreFactory>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    for status in TaskStatus::ALL {
        let stored = task_in(&store, task(worker, RestartPolicy::Retry), worker, *status).await;
        assert_eq!(stored.status, *status);
        assert_eq!(stored.response_id, ResponseId::from_ulid(stored.id.ulid()));
        assert_eq!(
            store.task(stored.id).await.unwrap(),
            Some(stored.clone()),
            "{status}"
        );
        assert_eq!(
            store.task_by_response(stored.response_id).await.unwrap(),
            Some(stored.clone()),
            "{status}"
        );
        assert_log_consistent(&store, stored.id).await;
    }
    assert_eq!(store.task(task_id()).await.unwrap(), None);
    let unknown = ResponseId::from_ulid(task_id().ulid());
    assert_eq!(store.task_by_response(unknown).await.unwrap(), None);
}

fn ids(tasks: &[Task]) -> Vec<lmsp_domain::ids::TaskId> {
    tasks.iter().map(|task| task.id).collect()
}

/// `list_tasks` lists newest first, filtered by client, statuses, model and `before` (the tasks
/// older than one), at most `limit` of them, saying whether more follow.
pub async fn list_tasks_filters_by_client_status_model_and_age_newest_first<F: StoreFactory>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let mine = client_id();
    let other_model = model("other-model");
    let a = task_in(
        &store,
        TaskBuilder::new(worker).client(mine).build(),
        worker,
        TaskStatus::Queued,
    )
    .await;
    let b = task_in(
        &store,
        TaskBuilder::new(worker).client(mine).build(),
        worker,
        TaskStatus::Cancelled,
    )
    .await;
    let c = task_in(
        &store,
        TaskBuilder::new(worker)
            .client(mine)
            .model(other_model.clone())
            .build(),
        worker,
        TaskStatus::Running,
    )
    .await;
    let d = task_in(
        &store,
        TaskBuilder::new(worker).client(mine).build(),
        worker,
        TaskStatus::Completed,
    )
    .await;
    let theirs = create(&store, TaskBuilder::new(worker).build()).await;
    let list = |filter: TaskFilter| {
        let store = &store;
        async move { store.list_tasks(filter).await.unwrap() }
    };

    let all = list(TaskFilter {
        limit: 10,
        ..TaskFilter::default()
    })
    .await;
    assert_eq!(
        ids(&all.items),
        vec![theirs.id, d.id, c.id, b.id, a.id],
        "newest first"
    );
    assert!(!all.has_more);
    assert_eq!(all.items[1], d, "listed tasks are whole");

    let first = list(TaskFilter {
        client_id: Some(mine),
        limit: 2,
        ..TaskFilter::default()
    })
    .await;
    assert_eq!(ids(&first.items), vec![d.id, c.id]);
    assert!(first.has_more, "two more of this client");
    let rest = list(TaskFilter {
        client_id: Some(mine),
        before: Some(c.id),
        limit: 2,
        ..TaskFilter::default()
    })
    .await;
    assert_eq!(ids(&rest.items), vec![b.id, a.id]);
    assert!(!rest.has_more, "exactly the last two");

    let unfinished = list(TaskFilter {
        statuses: vec![TaskStatus::Queued, TaskStatus::Running],
        limit: 10,
        ..TaskFilter::default()
    })
    .await;
    assert_eq!(ids(&unfinished.items), vec![theirs.id, c.id, a.id]);
    let cancelled_of_mine = list(TaskFilter {
        client_id: Some(mine),
        statuses: vec![TaskStatus::Cancelled],
        limit: 10,
        ..TaskFilter::default()
    })
    .await;
    assert_eq!(ids(&cancelled_of_mine.items), vec![b.id]);
    let of_model = list(TaskFilter {
        model: Some(other_model),
        limit: 10,
        ..TaskFilter::default()
    })
    .await;
    assert_eq!(ids(&of_model.items), vec![c.id]);
    let none = list(TaskFilter {
        client_id: Some(client_id()),
        limit: 10,
        ..TaskFilter::default()
    })
    .await;
    assert!(none.items.is_empty() && !none.has_more);
    let oldest = list(TaskFilter {
        before: Some(a.id),
        limit: 10,
        ..TaskFilter::default()
    })
    .await;
    assert!(oldest.items.is_empty() && !oldest.has_more);
}

/// `events` pages through a log after a sequence number, ascending, at most `limit` at a time,
/// saying whether more follow; past the end, and for an unknown task, there is nothing.
pub async fn events_page_through_a_log_after_a_sequence_number<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let running = step(
        &store,
        &running,
        worker,
        vec![output("a"), output("b"), output("c")],
        None,
        time(10),
    )
    .await;
    let (_, log) = assert_log_consistent(&store, running.id).await;
    assert_eq!(log.len(), 8);
    let page = store.events(running.id, 2, 3).await.unwrap();
    assert_eq!(page.items, log[2..5].to_vec());
    assert!(page.has_more);
    let end = store.events(running.id, 5, 3).await.unwrap();
    assert_eq!(end.items, log[5..8].to_vec());
    assert!(!end.has_more, "exactly the last three");
    let past = store.events(running.id, 8, 10).await.unwrap();
    assert!(past.items.is_empty() && !past.has_more);
    let far = store.events(running.id, u64::MAX, 10).await.unwrap();
    assert!(far.items.is_empty() && !far.has_more);
    let unknown = store.events(task_id(), 0, 10).await.unwrap();
    assert!(unknown.items.is_empty() && !unknown.has_more);
    let whole = store.events(running.id, 0, 100).await.unwrap();
    assert_eq!(whole.items, log);
}

/// `count_by_status` counts the tasks in each status (statuses with none may be left out).
pub async fn count_by_status_counts_the_tasks_in_each_status<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let counted = |counts: Vec<(TaskStatus, u64)>| -> BTreeMap<TaskStatus, u64> {
        counts.into_iter().filter(|(_, n)| *n > 0).collect()
    };
    assert_eq!(
        counted(store.count_by_status().await.unwrap()),
        BTreeMap::new()
    );
    let worker = instance_id();
    let mut expected = BTreeMap::new();
    for (index, status) in TaskStatus::ALL.iter().enumerate() {
        for _ in 0..=index % 3 {
            task_in(&store, task(worker, RestartPolicy::Fail), worker, *status).await;
            *expected.entry(*status).or_insert(0) += 1;
        }
    }
    assert_eq!(counted(store.count_by_status().await.unwrap()), expected);
}

/// `cancelling_tasks` lists the `cancelling` tasks in the care of one owner, and no other task.
pub async fn cancelling_tasks_lists_the_cancelling_tasks_of_one_owner<F: StoreFactory>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let other = instance_id();
    let mut mine = Vec::new();
    for _ in 0..3 {
        let cancelling = task_in(
            &store,
            task(worker, RestartPolicy::Fail),
            worker,
            TaskStatus::Cancelling,
        )
        .await;
        mine.push(cancelling.id);
    }
    task_in(
        &store,
        task(other, RestartPolicy::Fail),
        other,
        TaskStatus::Cancelling,
    )
    .await;
    task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Cancelled,
    )
    .await;
    let mut found = store.cancelling_tasks(worker).await.unwrap();
    found.sort();
    assert_eq!(found, mine);
    assert!(store
        .cancelling_tasks(instance_id())
        .await
        .unwrap()
        .is_empty());
}
