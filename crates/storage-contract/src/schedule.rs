//! Which queued task a claim takes: service tiers with aging, and fairness between clients
//! (the order of `lmsp_domain::schedule::next_claim`, which every adapter's claim must follow);
//! and the limits: a client's `max_running` and `max_queued`, the service's `max_queued`.

use lmsp_domain::auth::Scope;
use lmsp_domain::ids::{ClientId, TaskId};
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

/// P-2, I-9: creates made at once fill a queue to its limit and no further, as if made one
/// after another. A client with 3 of its `max_queued` 5 queued sends 20 at once: 2 are created
/// and 18 answer the full queue and write nothing; another client's 20 at once (no limit) are
/// all created; then 20 at once under a service `max_queued` with 7 places left: 7 are created.
/// (A store may write concurrent creates in one statement; it must still admit each as
/// `QueueLimits::admit` does, and fail none for another's sake.)
pub async fn creates_made_at_once_fill_a_queue_to_its_limit_and_no_further<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let store = std::sync::Arc::new(store);
    let limits = ClientLimits {
        max_running: None,
        max_queued: Some(5),
    };
    let client = limited(&*store, limits).await;
    for _ in 0..3 {
        create(&*store, of(client, ServiceTier::Default).build()).await;
    }
    let at_once = |client: ClientId, service_max_queued: Option<u32>| {
        let tasks: Vec<Task> = (0..20)
            .map(|_| of(client, ServiceTier::Default).build())
            .collect();
        let racers: Vec<_> = tasks
            .iter()
            .map(|task| {
                let (store, task) = (std::sync::Arc::clone(&store), task.clone());
                tokio::spawn(async move {
                    store
                        .create_task_within(task, None, service_max_queued)
                        .await
                })
            })
            .collect();
        async move {
            let mut outcomes = Vec::new();
            for (task, racer) in tasks.into_iter().zip(racers) {
                outcomes.push((task, racer.await.unwrap().unwrap()));
            }
            outcomes
        }
    };
    let mark = listener.mark();
    let outcomes = at_once(client, None).await;
    let made = created(&outcomes);
    assert_eq!(made.len(), 2, "{outcomes:?}");
    refused_created_nothing(&*store, &outcomes, QueueFull::Client(5)).await;
    let announced: std::collections::HashSet<_> = listener
        .events_since(mark)
        .iter()
        .map(|event| event.task_id)
        .collect();
    assert_eq!(announced, made, "only the created announce");
    let free = client_id();
    assert_eq!(created(&at_once(free, None).await).len(), 20, "no limit");
    // 5 queued of the limited client and 20 of the other: 7 places left under 32.
    let outcomes = at_once(free, Some(32)).await;
    assert_eq!(created(&outcomes).len(), 7, "{outcomes:?}");
    refused_created_nothing(&*store, &outcomes, QueueFull::Service(32)).await;
}

/// The tasks of `outcomes` that were created.
fn created(outcomes: &[(Task, CreateOutcome)]) -> std::collections::HashSet<TaskId> {
    outcomes
        .iter()
        .filter(|(_, outcome)| matches!(outcome, CreateOutcome::Created(_)))
        .map(|(task, _)| task.id)
        .collect()
}

/// Every create of `outcomes` not made answered `full` and left no task.
async fn refused_created_nothing<S: lmsp_domain::ports::Store + ?Sized>(
    store: &S,
    outcomes: &[(Task, CreateOutcome)],
    full: QueueFull,
) {
    for (task, outcome) in outcomes {
        if !matches!(outcome, CreateOutcome::Created(_)) {
            assert_eq!(outcome, &CreateOutcome::QueueFull(full));
            assert_eq!(store.task(task.id).await.unwrap(), None, "nothing created");
        }
    }
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

/// The tasks a store holds, as plain rows, and what it should claim next: `next_claim` over the
/// heads computed from the list (for each client and tier, its queued task with the least id),
/// each with its client's load (its `loading`, `running` and `cancelling` tasks, its last claim,
/// its `max_running`). The oracle of the checks of the claim order through the queue fronts.
#[derive(Default)]
struct Model {
    tasks: Vec<Task>,
    served: std::collections::HashMap<ClientId, lmsp_domain::time::Timestamp>,
    max_running: std::collections::HashMap<ClientId, u32>,
}

impl Model {
    /// Records `task` as the store has it now.
    fn put(&mut self, task: Task) {
        match self.tasks.iter_mut().find(|known| known.id == task.id) {
            Some(known) => *known = task,
            None => self.tasks.push(task),
        }
    }

    fn running(&self, client: ClientId) -> u32 {
        self.tasks
            .iter()
            .filter(|task| task.client_id == client && is_claimed(task.status))
            .count() as u32
    }

    /// What a claim at `now` takes, by `next_claim` over every head of the list.
    fn expected(&self, now: lmsp_domain::time::Timestamp) -> Option<lmsp_domain::ids::TaskId> {
        use lmsp_domain::schedule::{next_claim, ClientLoad, QueueHead};
        let queued = self
            .tasks
            .iter()
            .filter(|task| task.status == TaskStatus::Queued);
        let heads: Vec<(QueueHead, ClientLoad)> = queued
            .clone()
            .filter(|task| {
                !queued.clone().any(|other| {
                    other.client_id == task.client_id
                        && other.service_tier == task.service_tier
                        && other.id < task.id
                })
            })
            .map(|task| {
                let head = QueueHead {
                    task: task.id,
                    client: task.client_id,
                    tier: task.service_tier,
                    created_at: task.created_at,
                };
                let load = ClientLoad {
                    running: self.running(task.client_id),
                    max_running: self.max_running.get(&task.client_id).copied(),
                    last_served: self.served.get(&task.client_id).copied(),
                };
                (head, load)
            })
            .collect();
        next_claim(&heads, aging(), now)
    }

    /// Claims at `now` through `store` and checks the claim against the list; the claimed task.
    async fn claim<S: lmsp_domain::ports::Store + ?Sized>(
        &mut self,
        store: &S,
        worker: lmsp_domain::ids::InstanceId,
        now: lmsp_domain::time::Timestamp,
        after: &str,
    ) -> Option<Task> {
        let expected = self.expected(now);
        let claimed = store.claim(worker, now, aging()).await.unwrap();
        assert_eq!(
            claimed.as_ref().map(|task| task.id),
            expected,
            "the claim after {after} is next_claim's over the heads"
        );
        let claimed = claimed?;
        self.served.insert(claimed.client_id, now);
        self.put(claimed.clone());
        Some(claimed)
    }

    /// Reads every task of the list back from `store` (after a write the list did not make).
    async fn refresh<S: lmsp_domain::ports::Store + ?Sized>(&mut self, store: &S) {
        for task in &mut self.tasks {
            *task = store.task(task.id).await.unwrap().unwrap();
        }
    }
}

fn is_claimed(status: TaskStatus) -> bool {
    matches!(
        status,
        TaskStatus::Loading | TaskStatus::Running | TaskStatus::Cancelling
    )
}

/// A stored client without limits.
async fn stored_client<S: lmsp_domain::ports::Store + ?Sized>(store: &S) -> ClientId {
    let (client, _) = crate::fixtures::client(&[Scope::ResponsesWrite]);
    store.insert_client(client.clone()).await.unwrap();
    client.id
}

/// API §16 through the queue fronts a store keeps: after each write path has moved them — a
/// create, a claim, the cancel of a queued head, a finish, recovery putting back a running task
/// older than its queue's head, a client's `max_running` set and lifted — the next claim is
/// still the one `next_claim` picks over every client's heads.
pub async fn the_claim_order_holds_after_every_write_path_moved_the_fronts<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let mut model = Model::default();
    let worker = instance_id();
    let (a, b, c) = (client_id(), stored_client(&store).await, client_id());
    let gone = register(&store, "gone", time(0)).await.id;
    // Oldest of all: a's default task, running in an instance that will stop.
    let lost = task_in(
        &store,
        of(a, ServiceTier::Default)
            .policy(RestartPolicy::Retry)
            .created(time(0))
            .build(),
        gone,
        TaskStatus::Running,
    )
    .await;
    model.put(lost.clone());
    // Creates, one client's heads in two tiers.
    for (client, tier, minute) in [
        (a, ServiceTier::Default, 1),
        (a, ServiceTier::Default, 2),
        (b, ServiceTier::Default, 2),
        (b, ServiceTier::Flex, 0),
        (b, ServiceTier::Flex, 1),
        (c, ServiceTier::Priority, 3),
        (c, ServiceTier::Default, 3),
    ] {
        let task = of(client, tier).created(time(minute * MINUTE)).build();
        model.put(create(&store, task).await);
    }
    let now = time(4 * MINUTE);
    let first = model.claim(&store, worker, now, "creates").await.unwrap();
    assert_eq!(
        (first.client_id, first.service_tier),
        (c, ServiceTier::Priority)
    );
    // Default tier: b has none running, a one (the lost task), c one.
    let second = model.claim(&store, worker, now, "a claim").await.unwrap();
    assert_eq!(second.client_id, b);
    // b's default queue is empty; cancel a's default head: a's next task becomes its head.
    let a_head = model
        .tasks
        .iter()
        .filter(|task| task.client_id == a && task.status == TaskStatus::Queued)
        .map(|task| task.id)
        .min()
        .unwrap();
    store.cancel(a_head, None, now).await.unwrap();
    model.refresh(&store).await;
    let third = model
        .claim(&store, worker, now, "the cancel of a queued head")
        .await
        .unwrap();
    // A finish lowers a client's running count.
    for task in [&first, &second, &third] {
        model.put(finish(&store, task, worker, fail()).await);
    }
    model
        .claim(&store, worker, time(5 * MINUTE), "finishes")
        .await;
    // Recovery puts the lost task back: older than a's head, it is a's head again.
    store.retire_instance(gone, time(6 * MINUTE)).await.unwrap();
    let rescuer = register(&store, "rescuer", time(6 * MINUTE)).await.id;
    store
        .recover_instance(gone, rescuer, time(6 * MINUTE))
        .await
        .unwrap();
    model.refresh(&store).await;
    assert_eq!(
        store.task(lost.id).await.unwrap().unwrap().status,
        TaskStatus::Queued
    );
    let mut after = Vec::new();
    while let Some(claimed) = model
        .claim(&store, worker, time(6 * MINUTE), "a recovery requeue")
        .await
    {
        after.push(claimed.id);
        if claimed.id == lost.id {
            break;
        }
    }
    assert!(after.contains(&lost.id), "the requeued task is claimed");
    // b at its max_running is passed over; lifted, its head is claimable again.
    let b_task = create(
        &store,
        of(b, ServiceTier::Priority)
            .created(time(6 * MINUTE))
            .build(),
    )
    .await;
    model.put(b_task.clone());
    let running_b = model.running(b);
    let limits = ClientLimits {
        max_running: Some(running_b),
        max_queued: None,
    };
    assert!(store.set_client_limits(b, limits).await.unwrap());
    model.max_running.insert(b, running_b);
    let passed = model
        .claim(&store, worker, time(7 * MINUTE), "a max_running set")
        .await;
    assert_ne!(passed.map(|task| task.id), Some(b_task.id));
    assert!(store
        .set_client_limits(b, ClientLimits::default())
        .await
        .unwrap());
    model.max_running.remove(&b);
    let lifted = model
        .claim(&store, worker, time(7 * MINUTE), "a max_running lifted")
        .await;
    assert_eq!(lifted.map(|task| task.id), Some(b_task.id));
    while model
        .claim(&store, worker, time(8 * MINUTE), "the rest")
        .await
        .is_some()
    {}
}

/// A small deterministic generator (xorshift), so that a failing sequence is the same every run.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// API §16: through random creates (any of four clients, any tier, of any age), claims,
/// finishes, cancels (of queued and claimed tasks) and changes of `max_running`, every claim is
/// the one `next_claim` picks over the heads computed from the plain list of the tasks.
pub async fn claims_follow_next_claim_over_the_heads_through_random_writes<F: StoreFactory>(
    factory: &F,
) {
    for seed in [0x9e37_79b9_7f4a_7c15_u64, 0x0123_4567_89ab_cdef, 42] {
        let (store, _) = fresh_store(factory).await;
        let mut draw = Draw(seed);
        let mut model = Model::default();
        let worker = instance_id();
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(stored_client(&store).await);
        }
        let mut now = 30 * MINUTE;
        for op in 0..160 {
            now += (draw.below(60) as i64) * 1_000;
            let at = time(now);
            let open: Vec<Task> = model
                .tasks
                .iter()
                .filter(|task| task.status == TaskStatus::Queued || is_claimed(task.status))
                .cloned()
                .collect();
            match draw.below(20) {
                0..=7 => {
                    let client = clients[draw.below(clients.len())];
                    let tier = ServiceTier::ALL[draw.below(3)];
                    let created = time(now - (draw.below(15) as i64) * MINUTE);
                    let task = of(client, tier).created(created).build();
                    model.put(create(&store, task).await);
                }
                8..=13 => {
                    model
                        .claim(&store, worker, at, &format!("op {op} (seed {seed:#x})"))
                        .await;
                }
                14..=16 => {
                    let loading: Vec<&Task> = open
                        .iter()
                        .filter(|task| task.status == TaskStatus::Loading)
                        .collect();
                    if !loading.is_empty() {
                        let task = loading[draw.below(loading.len())];
                        model.put(finish(&store, task, worker, fail()).await);
                    }
                }
                17..=18 => {
                    if !open.is_empty() {
                        let task = &open[draw.below(open.len())];
                        store.cancel(task.id, None, at).await.unwrap();
                        model.put(store.task(task.id).await.unwrap().unwrap());
                    }
                }
                _ => {
                    let client = clients[draw.below(clients.len())];
                    let max_running = [None, Some(0), Some(1), Some(2)][draw.below(4)];
                    let limits = ClientLimits {
                        max_running,
                        max_queued: None,
                    };
                    assert!(store.set_client_limits(client, limits).await.unwrap());
                    match max_running {
                        Some(max) => model.max_running.insert(client, max),
                        None => model.max_running.remove(&client),
                    };
                }
            }
        }
        // Every limit lifted, the queue drains in the order of the list.
        for client in &clients {
            assert!(store
                .set_client_limits(*client, ClientLimits::default())
                .await
                .unwrap());
            model.max_running.remove(client);
        }
        now += MINUTE;
        while model
            .claim(
                &store,
                worker,
                time(now),
                &format!("the drain (seed {seed:#x})"),
            )
            .await
            .is_some()
        {}
    }
}

/// API §16 over clients with and without a `max_running`: a head that has waited long enough to
/// go first does so whichever kind its client is, and as its client's limit is set, reached and
/// lifted, every claim is still the one `next_claim` picks over the heads of the plain list (a
/// store that keeps the heads of limited clients apart must read both kinds).
pub async fn aged_heads_go_first_whether_or_not_their_clients_have_a_max_running<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let mut model = Model::default();
    let worker = instance_id();
    let one = ClientLimits {
        max_running: Some(1),
        max_queued: None,
    };
    let limited_client = limited(&store, one).await;
    model.max_running.insert(limited_client, 1);
    let unlimited_client = stored_client(&store).await;
    let new_task = |client, tier, minute| of(client, tier).created(time(minute * MINUTE)).build();
    let aged = create(&store, new_task(limited_client, ServiceTier::Flex, 0)).await;
    for task in [
        new_task(limited_client, ServiceTier::Flex, 1),
        new_task(unlimited_client, ServiceTier::Flex, 2),
        new_task(unlimited_client, ServiceTier::Priority, 19),
        new_task(limited_client, ServiceTier::Priority, 19),
    ] {
        model.put(create(&store, task).await);
    }
    model.put(aged.clone());
    let now = time(20 * MINUTE);
    let first = model.claim(&store, worker, now, "creates").await.unwrap();
    assert_eq!(
        first.id, aged.id,
        "the limited client's aged flex task first"
    );
    // The limited client at its max_running: its heads wait, the other client's aged one goes.
    let second = model
        .claim(&store, worker, now, "a max_running reached")
        .await
        .unwrap();
    assert_eq!(second.client_id, unlimited_client);
    assert_eq!(second.service_tier, ServiceTier::Flex);
    // The unlimited client gets a limit it is below, the limited one loses its own.
    let two = ClientLimits {
        max_running: Some(2),
        max_queued: None,
    };
    assert!(store
        .set_client_limits(unlimited_client, two)
        .await
        .unwrap());
    model.max_running.insert(unlimited_client, 2);
    assert!(store
        .set_client_limits(limited_client, ClientLimits::default())
        .await
        .unwrap());
    model.max_running.remove(&limited_client);
    for task in [&first, &second] {
        model.put(finish(&store, task, worker, fail()).await);
    }
    while model
        .claim(&store, worker, time(21 * MINUTE), "limits swapped")
        .await
        .is_some()
    {}
}
