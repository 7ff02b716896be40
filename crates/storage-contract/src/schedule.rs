//! Which queued task a claim takes: service tiers with aging, and fairness between clients
//! (the order of `lmsp_domain::schedule::next_claim`, which every adapter's claim must follow);
//! and the limits: a client's `max_running` and `max_queued`, the service's `max_queued`.

use lmsp_domain::auth::Scope;
use lmsp_domain::ids::ClientId;
use lmsp_domain::ports::CreateOutcome;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::{ClientLimits, QueueFull, ServiceTier, TierAging};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::Task;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// A minute, in milliseconds.
const MINUTE: i64 = 60_000;

fn aging() -> TierAging {
    TierAging::from_millis(5 * MINUTE as u64).unwrap()
}

fn of(client: ClientId, tier: ServiceTier) -> TaskBuilder {
    TaskBuilder::new(instance_id()).client(client).tier(tier)
}

/// `priority` tasks are claimed before `default` ones and `default` before `flex`, whatever their
/// age; a task keeps its tier when it is read back.
pub async fn claims_take_the_most_urgent_tier_first<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();
    let flex = create(&store, of(client, ServiceTier::Flex).build()).await;
    let default = create(&store, of(client, ServiceTier::Default).build()).await;
    let priority = create(&store, of(client, ServiceTier::Priority).build()).await;
    assert_eq!(
        store.task(flex.id).await.unwrap().unwrap().service_tier,
        ServiceTier::Flex
    );
    let mut order = Vec::new();
    for n in 0..3 {
        let claimed = store
            .claim(worker, time(n), aging())
            .await
            .unwrap()
            .unwrap();
        order.push(claimed.id);
    }
    assert_eq!(order, vec![priority.id, default.id, flex.id]);
    assert_eq!(store.claim(worker, time(3), aging()).await.unwrap(), None);
}

/// A task that has waited one aging period is claimed one tier more urgently (then it is the
/// oldest of that tier); after two periods a `flex` task goes before `priority` work that came
/// later.
pub async fn a_task_that_waited_an_aging_period_moves_up_a_tier<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();
    let flex = create(
        &store,
        of(client, ServiceTier::Flex).created(time(0)).build(),
    )
    .await;
    let default = create(
        &store,
        of(client, ServiceTier::Default)
            .created(time(MINUTE))
            .build(),
    )
    .await;
    // Before the period: default first.
    let claimed = store
        .claim(worker, time(2 * MINUTE), aging())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, default.id);
    let default_2 = create(
        &store,
        of(client, ServiceTier::Default)
            .created(time(3 * MINUTE))
            .build(),
    )
    .await;
    // After one period the flex task counts as default, and is older.
    let claimed = store
        .claim(worker, time(5 * MINUTE + 1), aging())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, flex.id, "aged into default, and oldest");
    let flex_2 = create(
        &store,
        of(client, ServiceTier::Flex)
            .created(time(4 * MINUTE))
            .build(),
    )
    .await;
    let priority = create(
        &store,
        of(client, ServiceTier::Priority)
            .created(time(13 * MINUTE))
            .build(),
    )
    .await;
    // At 14 minutes flex_2 has waited two periods (priority, and older than the priority task);
    // default_2 has waited two periods as well (priority, older still).
    let order: Vec<_> = [
        store.claim(worker, time(14 * MINUTE), aging()).await,
        store.claim(worker, time(14 * MINUTE), aging()).await,
        store.claim(worker, time(14 * MINUTE), aging()).await,
    ]
    .into_iter()
    .map(|claimed| claimed.unwrap().unwrap().id)
    .collect();
    assert_eq!(order, vec![default_2.id, flex_2.id, priority.id]);
}

/// Within a tier the next task comes from the client with the fewest tasks running, so a client
/// with many queued tasks does not hold every worker: with A's tasks queued first, B's one task
/// starts after at most one of A's.
pub async fn within_a_tier_the_client_with_fewer_running_tasks_goes_first<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let (a, b) = (client_id(), client_id());
    let worker = instance_id();
    let mut a_tasks = Vec::new();
    for _ in 0..5 {
        a_tasks.push(create(&store, of(a, ServiceTier::Default).build()).await);
    }
    let b_task = create(&store, of(b, ServiceTier::Default).build()).await;
    let first = store
        .claim(worker, time(0), aging())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.id, a_tasks[0].id, "the oldest, with equal loads");
    let second = store
        .claim(worker, time(1), aging())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.id, b_task.id, "B has none running, A one");
    let third = store
        .claim(worker, time(2), aging())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.id, a_tasks[1].id);
}

/// With equal loads (here: none running, as with one worker that ends each task before the next
/// claim) clients take turns: the client served least recently goes first.
pub async fn equal_loads_take_turns_by_the_client_served_least_recently<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let (a, b) = (client_id(), client_id());
    let worker = instance_id();
    let mut made: Vec<(ClientId, Task)> = Vec::new();
    for _ in 0..3 {
        made.push((a, create(&store, of(a, ServiceTier::Default).build()).await));
    }
    for _ in 0..3 {
        made.push((b, create(&store, of(b, ServiceTier::Default).build()).await));
    }
    let mut clients = Vec::new();
    for n in 0..6 {
        let claimed = store
            .claim(worker, time(10 * n), aging())
            .await
            .unwrap()
            .unwrap();
        clients.push(claimed.client_id);
        finish(&store, &claimed, worker, fail()).await;
    }
    assert_eq!(clients, vec![a, b, a, b, a, b]);
}

/// A task's tier is kept across recovery: a `flex` task put back in the queue is still claimed
/// after `default` work.
pub async fn a_requeued_task_keeps_its_tier<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let gone = register(&store, "gone", time(0)).await.id;
    let flex = task_in(
        &store,
        of(client, ServiceTier::Flex)
            .policy(RestartPolicy::Retry)
            .build(),
        gone,
        TaskStatus::Running,
    )
    .await;
    store.retire_instance(gone, time(1_000)).await.unwrap();
    let rescuer = register(&store, "rescuer", time(1_000)).await.id;
    store
        .recover_instance(gone, rescuer, time(1_000))
        .await
        .unwrap();
    let requeued = store.task(flex.id).await.unwrap().unwrap();
    assert_eq!(requeued.status, TaskStatus::Queued);
    assert_eq!(requeued.service_tier, ServiceTier::Flex);
    let default = create(&store, of(client, ServiceTier::Default).build()).await;
    let claimed = store
        .claim(rescuer, time(1_001), aging())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, default.id);
    let claimed = store
        .claim(rescuer, time(1_002), aging())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, flex.id);
}

/// A stored client with limits `limits`.
async fn limited<S: lmsp_domain::ports::Store + ?Sized>(
    store: &S,
    limits: ClientLimits,
) -> ClientId {
    let (client, _) = crate::fixtures::client(&[Scope::ResponsesWrite]);
    store.insert_client(client.clone()).await.unwrap();
    assert_eq!(
        store.client_limits(client.id).await.unwrap(),
        ClientLimits::default(),
        "no limits until set"
    );
    assert!(store.set_client_limits(client.id, limits).await.unwrap());
    assert_eq!(store.client_limits(client.id).await.unwrap(), limits);
    client.id
}

/// A client's limits are set, read back and replaced; an unknown client has none to set.
pub async fn client_limits_are_set_and_replaced<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let limits = ClientLimits {
        max_running: Some(2),
        max_queued: Some(10),
    };
    let client = limited(&store, limits).await;
    let lifted = ClientLimits {
        max_running: None,
        max_queued: Some(3),
    };
    assert!(store.set_client_limits(client, lifted).await.unwrap());
    assert_eq!(store.client_limits(client).await.unwrap(), lifted);
    assert!(!store.set_client_limits(client_id(), limits).await.unwrap());
}

/// P-2, I-9: past a client's `max_queued` queued tasks a create writes nothing (no task, no
/// event) and answers the full queue;
/// a claim or a cancel frees a place; other clients are not limited by it.
pub async fn a_client_past_its_max_queued_creates_nothing<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let client = limited(
        &store,
        ClientLimits {
            max_running: None,
            max_queued: Some(2),
        },
    )
    .await;
    let first = create(&store, of(client, ServiceTier::Default).build()).await;
    create(&store, of(client, ServiceTier::Flex).build()).await;
    let mark = listener.mark();
    let third = of(client, ServiceTier::Default).build();
    let outcome = store.create_task(third.clone(), None).await.unwrap();
    assert_eq!(outcome, CreateOutcome::QueueFull(QueueFull::Client(2)));
    assert_eq!(store.task(third.id).await.unwrap(), None, "nothing created");
    assert!(listener.events_since(mark).is_empty());
    create(&store, task(instance_id(), RestartPolicy::Fail)).await;
    store.claim(instance_id(), time(1), aging()).await.unwrap();
    assert_eq!(
        store.task(first.id).await.unwrap().unwrap().status,
        TaskStatus::Loading,
        "the claim took the client's oldest"
    );
    create(&store, third).await;
}

/// P-2, I-9: past the service's `max_queued` a create writes nothing and answers the full queue.
pub async fn a_create_past_the_services_max_queued_creates_nothing<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    for _ in 0..3 {
        let outcome = store
            .create_task_within(task(instance_id(), RestartPolicy::Fail), None, Some(3))
            .await
            .unwrap();
        assert!(matches!(outcome, CreateOutcome::Created(_)), "{outcome:?}");
    }
    let fourth = task(instance_id(), RestartPolicy::Fail);
    let outcome = store
        .create_task_within(fourth.clone(), None, Some(3))
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::QueueFull(QueueFull::Service(3)));
    assert_eq!(store.task(fourth.id).await.unwrap(), None);
    let outcome = store.create_task_within(fourth, None, None).await.unwrap();
    assert!(
        matches!(outcome, CreateOutcome::Created(_)),
        "no limit: {outcome:?}"
    );
}

/// A client at its `max_running` is passed over: its other tasks wait while another client's
/// newer task starts, and wait for nothing once nobody else has work.
pub async fn a_client_at_its_max_running_waits_while_others_run<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let busy = limited(
        &store,
        ClientLimits {
            max_running: Some(1),
            max_queued: None,
        },
    )
    .await;
    let worker = instance_id();
    let a1 = create(&store, of(busy, ServiceTier::Priority).build()).await;
    let a2 = create(&store, of(busy, ServiceTier::Priority).build()).await;
    let other = create(&store, of(client_id(), ServiceTier::Flex).build()).await;
    let claim = |n| store.claim(worker, time(n), aging());
    assert_eq!(claim(0).await.unwrap().unwrap().id, a1.id);
    assert_eq!(claim(1).await.unwrap().unwrap().id, other.id, "a2 waits");
    assert_eq!(claim(2).await.unwrap(), None, "a2 still waits");
    let running = store.task(a1.id).await.unwrap().unwrap();
    finish(&store, &running, worker, fail()).await;
    assert_eq!(claim(3).await.unwrap().unwrap().id, a2.id);
}
