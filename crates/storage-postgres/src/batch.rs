//! Group commit of the hot writes: creates, appends, finishes, claims and cancels.
//!
//! Callers queue a [`Request`]; a few *lanes* (tasks, each on a pooled connection) take whatever
//! has gathered (at most [`MAX_BATCH`]) and write it in **one transaction** — the SQLite writer's
//! rule on PostgreSQL:
//!
//! 1. `BEGIN` and the batch's reads, pipelined in one round trip: every task the batch names,
//!    locked in key order (`FOR UPDATE`, so two lanes never wait on each other in a circle), the
//!    queued tasks its claims may take (`FOR UPDATE SKIP LOCKED`), and the idempotency records
//!    its keyed creates name (`FOR UPDATE`).
//! 2. The domain decides each command in order, on the rows as read and as the commands before
//!    it in the batch left them (so a cancel after an append of the same batch sees the append).
//! 3. Every command's writes, pipelined in one round trip: a task write is one statement (the
//!    row's compare-and-set and its events), a create one statement (task, spec and first
//!    event), plus the key record, the response and the snapshot when there are any. They are
//!    sent without savepoints first (why: [`transaction`]). When one fails, the transaction is
//!    rolled back and steps 1–3 are run again with each command's writes inside a savepoint of
//!    its own (`SAVEPOINT`, its statements, `RELEASE`). When a command fails then, the
//!    transaction is rolled back to its savepoint: it fails alone (or, when it lost a race, is
//!    run again in the lane's next batch), and the commands after it are read, decided and
//!    written again (steps 1–3 on the rows as the transaction sees them now).
//! 4. `COMMIT`; only then are the callers answered, the other instances notified and the
//!    listener told, as for every other write.
//!
//! Before step 1, the commands whose outcome the domain decides without a read (a create without
//! a key, a step of a task whose row this store last committed: `fast.rs`) are written first,
//! the creates as one statement together and each step as its own, pipelined with the `BEGIN`
//! — and with the `COMMIT` when the batch has no other command, so that such a batch is **one
//! round trip** and no savepoint. Each statement checks its premise (the queue limits; the row
//! unchanged, every mutable column compared) and writes nothing when it is false; that command
//! (each create of a statement that wrote nothing) then takes steps 1–3 (in the same
//! transaction, or the next batch's when the `COMMIT` was already sent). If one of them fails,
//! the pipelined transaction is aborted and the whole batch is written again by steps 1–4.
//!
//! A transaction carries at most [`MAX_BATCH`] commands: each savepoint that writes is a
//! subtransaction, and PostgreSQL keeps only 64 of them per transaction in shared memory (past
//! that, every other session's snapshots must look them up in `pg_subtrans`).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::Instant;

use futures::FutureExt;
use lmsp_domain::event::Event;
use lmsp_domain::idempotency::IdempotencyRecord;
use lmsp_domain::ids::{ClientId, InstanceId, TaskId};
use lmsp_domain::ports::{
    CancelOutcome, CommitStats, CreateOutcome, Snapshot, StepOutcome, StoreError, StoreListener,
};
use lmsp_domain::schedule::{QueueLimits, TierAging};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use lmsp_domain::writes::TaskWrite;
use lmsp_storage_codec::flows::{self, CreateRows, TaskWrites};
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::codec::{self, EventRow};
use crate::error::DbError;
use crate::notify::Notifier;
use crate::ops::{
    self, client_key, decode_task, instance_key, key, to_i64, TASK_COLUMNS, TASK_FROM,
};

mod fast;

pub use fast::Rows;

/// The most commands one transaction carries (see the module's documentation).
pub const MAX_BATCH: usize = 64;

/// A hot write, as queued for a lane.
// Not boxed: each request is built once and matched once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Request {
    /// `create_task`.
    Create {
        /// The task.
        task: Task,
        /// The request's key record, if it has a key.
        idempotency: Option<IdempotencyRecord>,
        /// The service's `--max-queued`.
        service_max_queued: Option<u32>,
    },
    /// `append` (`expected: Some`) or `finish` (`None`).
    Append {
        /// The task.
        task_id: TaskId,
        /// The instance that runs it.
        by: InstanceId,
        /// The last sequence number the worker saw (`None`: a finish, whatever it is).
        expected: Option<u64>,
        /// The steps, all or nothing.
        steps: Vec<Step>,
        /// The worker's snapshot.
        snapshot: Option<Snapshot>,
        /// When.
        at: Timestamp,
    },
    /// `claim`.
    Claim {
        /// The instance claiming.
        by: InstanceId,
        /// When.
        at: Timestamp,
        /// How queued tasks age into more urgent tiers.
        aging: TierAging,
    },
    /// `cancel`.
    Cancel {
        /// The task.
        task_id: TaskId,
        /// The client asking (`None`: the service).
        client_id: Option<ClientId>,
        /// When.
        at: Timestamp,
    },
}

/// The answer to a [`Request`], of the matching kind.
#[derive(Debug)]
pub enum Reply {
    /// To a create.
    Created(CreateOutcome),
    /// To an append or a finish.
    Stepped(StepOutcome),
    /// To a claim.
    Claimed(Option<Task>),
    /// To a claim that took no task while others were claimable: concurrent claims held them.
    Held,
    /// To a cancel.
    Cancelled(CancelOutcome),
}

/// A queued request, the caller waiting for its answer, how often it lost a race, and whether
/// it must take the read–decide–write path (its one-round-trip statement found its premise
/// false).
struct Command {
    request: Request,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
    attempts: u32,
    slow: bool,
}

/// What the lanes share with the store.
pub struct Shared {
    /// Where the lanes take their connections.
    pub pool: deadpool_postgres::Pool,
    /// Told of every batch and its committed events.
    pub listener: Arc<dyn StoreListener>,
    /// Tells the other instances.
    pub notifier: Notifier,
    /// This store's mark on its notifications.
    pub origin: Arc<str>,
    /// How often a command that lost a race is run again before it fails.
    pub max_attempts: u32,
    /// The task rows as this store last committed them (what steps are decided on without a
    /// read).
    pub rows: Rows,
}

/// The queue of the hot writes and the lanes that write it: every lane takes from the shared
/// queue, and a client's creates and the status changes of its tasks (the steps and cancels that
/// move a task between queued, active and finished, as far as the rows held tell) go to the
/// queue of one lane per client (`own`). Those writes insert into and move the same index
/// entries (the client's queued and active tasks, the tail of the status index): in one lane
/// they are written one large batch at a time instead of in several small concurrent
/// transactions that wait for each other's buffer locks and commits. Measured (lmsp-bench
/// `--only postgres`, one cluster, alternated runs): three instances on one database reached
/// 86–102 % of one instance with it and 68–70 % without; persisted events 41–57 % of SQLite's
/// against 36–47 % (docs/postgres-performance.md). The other writes (a stream's deltas, claims)
/// spread over every lane.
pub struct Writer {
    queue: mpsc::UnboundedSender<Command>,
    own: Vec<mpsc::UnboundedSender<Command>>,
    lanes: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts `lanes` lanes (at least one) writing what [`Writer::run`] queues.
    pub fn start(shared: Shared, lanes: usize) -> Writer {
        let (queue, pending) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(pending));
        let shared = Arc::new(shared);
        let (own, lanes) = (0..lanes.max(1))
            .map(|_| {
                let (own, mine) = mpsc::unbounded_channel();
                let lane = tokio::spawn(lane(Arc::clone(&shared), Arc::clone(&pending), mine));
                (own, lane)
            })
            .unzip();
        Writer {
            queue,
            own,
            lanes,
            shared,
        }
    }

    /// Queues `request` and waits for its answer, given once its transaction committed (or
    /// failed).
    pub async fn run(&self, request: Request) -> Result<Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        let client = self.shared.rows.lane_client(&request);
        let queue = client
            .and_then(|client| {
                let lane = client.ulid().0 % self.own.len().max(1) as u128;
                usize::try_from(lane).ok()
            })
            .and_then(|lane| self.own.get(lane))
            .unwrap_or(&self.queue);
        queue
            .send(Command {
                request,
                reply,
                attempts: 0,
                slow: false,
            })
            .map_err(|_| StoreError::Unavailable(String::from("the store is closed")))?;
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(String::from(
                "the write was lost with its transaction (the writer failed)",
            )))
        })
    }

    /// Stops the lanes (a batch being written is abandoned, its transaction rolled back).
    pub fn stop(&self) {
        for lane in &self.lanes {
            lane.abort();
        }
    }
}

/// One lane: takes what has gathered in its own queue and the shared one, writes it, answers,
/// again; commands that lost a race are carried into its next batch.
async fn lane(
    shared: Arc<Shared>,
    pending: Arc<Mutex<mpsc::UnboundedReceiver<Command>>>,
    mut own: mpsc::UnboundedReceiver<Command>,
) {
    let mut carried: Vec<Command> = Vec::new();
    loop {
        let mut batch = std::mem::take(&mut carried);
        // A lane with commands to run again never waits for a queue: another lane may hold the
        // shared one while it waits for a request.
        if batch.is_empty() {
            let first = tokio::select! {
                biased;
                first = own.recv() => first,
                first = async { pending.lock().await.recv().await } => first,
            };
            match first {
                Some(first) => batch.push(first),
                None => return,
            }
        }
        while batch.len() < MAX_BATCH {
            match own.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        if let Ok(mut queue) = pending.try_lock() {
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
        }
        match AssertUnwindSafe(write_batch(&shared, batch))
            .catch_unwind()
            .await
        {
            Ok(again) => carried = again,
            Err(_) => {
                // The callers of the batch are answered by their dropped senders; the connection
                // was dropped rather than put back (see `Held`).
                tracing::error!("a PostgreSQL write batch panicked; its callers got an error");
                tell(shared.listener.as_ref(), 0, 0, Instant::now(), false);
            }
        }
    }
}

/// Tells the listener of a transaction; a panicking listener loses it.
fn tell(listener: &dyn StoreListener, commands: usize, events: usize, started: Instant, ok: bool) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        listener.transaction_measured(CommitStats {
            commands,
            events,
            duration: started.elapsed(),
            committed: ok,
        });
    }));
}

/// A pooled connection that goes back to the pool only once its transaction ended cleanly;
/// otherwise (an error mid-transaction, a panic, an abort) it is closed.
struct Held {
    conn: Option<deadpool_postgres::Object>,
    clean: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.clean {
            if let Some(conn) = self.conn.take() {
                drop(deadpool_postgres::Object::take(conn));
            }
        }
    }
}

/// How one command of a batch ended.
// Not boxed: each is built once and matched once.
#[allow(clippy::large_enum_variant)]
enum Ended {
    /// Written (committed once the batch commits): its answer, its events, whether it cancels.
    Done(Reply, Vec<Event>, bool),
    /// Failed alone.
    Failed(StoreError),
    /// Lost a race: run again in the next batch.
    Again,
    /// Its one-round-trip statement wrote nothing (a premise was false): run again in the next
    /// batch by the read–decide–write path.
    Slow,
}

/// Writes a batch in one transaction and answers its commands; returns those to run again.
async fn write_batch(shared: &Shared, mut batch: Vec<Command>) -> Vec<Command> {
    let started = Instant::now();
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        let conn = match shared.pool.get().await {
            Ok(conn) => conn,
            Err(error) => break Err(DbError::from(error)),
        };
        let mut held = Held {
            conn: Some(conn),
            clean: false,
        };
        let Some(conn) = held.conn.as_ref() else {
            break Err(DbError::Pool(String::from("no connection")));
        };
        match run(conn, &mut batch, &shared.rows).await {
            Ok(ended) => {
                held.clean = true;
                break Ok(ended);
            }
            Err(error) => {
                // Nothing of the batch is written; the connection is closed with it.
                if error.is_retryable() && attempt < shared.max_attempts {
                    continue;
                }
                break Err(error);
            }
        }
    };
    let ended = match outcome {
        Ok(ended) => ended,
        Err(error) => {
            tell(shared.listener.as_ref(), batch.len(), 0, started, false);
            let error = StoreError::from(error);
            for command in batch {
                let _ = command.reply.send(Err(error.clone()));
            }
            return Vec::new();
        }
    };
    let mut events = Vec::new();
    for ended in &ended {
        if let Ended::Done(_, written, cancel) = ended {
            // After the commit, never inside it (see `notify::Notifier`).
            shared.notifier.send(&shared.origin, written, *cancel);
            events.extend(written.iter().cloned());
        }
    }
    tell(
        shared.listener.as_ref(),
        batch.len(),
        events.len(),
        started,
        true,
    );
    if !events.is_empty() {
        let _ = catch_unwind(AssertUnwindSafe(|| shared.listener.committed(&events)));
    }
    // Before the answers: a worker's next step, sent on its answer, is decided on its row.
    for (command, ended) in batch.iter().zip(&ended) {
        match ended {
            Ended::Done(reply, _, _) => shared.rows.learn(&command.request, reply),
            Ended::Failed(_) | Ended::Again | Ended::Slow => {
                shared.rows.forget_request(&command.request);
            }
        }
    }
    let mut again = Vec::new();
    for (mut command, ended) in batch.drain(..).zip(ended) {
        match ended {
            Ended::Done(reply, _, _) => {
                let _ = command.reply.send(Ok(reply));
            }
            Ended::Slow => {
                command.slow = true;
                again.push(command);
            }
            Ended::Failed(error) => {
                let _ = command.reply.send(Err(error));
            }
            Ended::Again => {
                command.attempts += 1;
                if command.attempts >= shared.max_attempts {
                    let _ = command.reply.send(Err(DbError::Retry.into()));
                } else {
                    again.push(command);
                }
            }
        }
    }
    again
}

/// Writes a batch: the commands that have a one-round-trip plan (`fast.rs`) first, pipelined
/// with `BEGIN` (and with the `COMMIT` when every command has one), then the others in the
/// same transaction by [`transaction`]. Reorders `batch` (the plans first, then the written
/// ones first); the answer is in its new order. An error is the whole transaction's (nothing of
/// it is written).
async fn run(
    conn: &deadpool_postgres::ClientWrapper,
    batch: &mut Vec<Command>,
    rows: &Rows,
) -> Result<Vec<Ended>, DbError> {
    let plans: Vec<Option<fast::Fast>> = batch
        .iter()
        .map(|command| match command.slow {
            true => None,
            // A command whose plan cannot even be encoded fails on the other path, alone.
            false => fast::plan(&command.request, rows).ok().flatten(),
        })
        .collect();
    let planned = plans.iter().filter(|plan| plan.is_some()).count();
    if planned == 0 {
        return transaction(conn, batch).await;
    }
    let mut pairs: Vec<(Command, Option<fast::Fast>)> = batch.drain(..).zip(plans).collect();
    pairs.sort_by_key(|(_, plan)| plan.is_none());
    let (commands, plans): (Vec<Command>, Vec<Option<fast::Fast>>) = pairs.into_iter().unzip();
    *batch = commands;
    let (writes, outcomes): (Vec<fast::Write>, Vec<(Reply, Vec<Event>)>) = plans
        .into_iter()
        .flatten()
        .map(|plan| (plan.write, (plan.reply, plan.events)))
        .unzip();
    let (statements, place) = fast::statements(writes);
    let all = planned == batch.len();
    let mut items = Vec::with_capacity(statements.len() + 2);
    items.push(Item::Simple("BEGIN ISOLATION LEVEL READ COMMITTED"));
    items.extend(
        statements
            .iter()
            .map(|(statement, _)| Item::Statement(statement)),
    );
    if all {
        items.push(Item::Simple("COMMIT"));
    }
    let mut answers = pipeline(conn, &items).await?.into_iter();
    if let Some(Err(error)) = answers.next() {
        return Err(error.into());
    }
    let mut written = Vec::with_capacity(statements.len());
    let mut failed = false;
    for (_, count) in &statements {
        match answers.next() {
            Some(Ok(rows)) => written.push(
                rows.first()
                    .and_then(|row| row.try_get::<_, i64>(0).ok())
                    .is_some_and(|wrote| wrote == *count),
            ),
            Some(Err(_)) | None => {
                failed = true;
                written.push(false);
            }
        }
    }
    let wrote: Vec<bool> = place
        .iter()
        .map(|&at| written.get(at).copied().unwrap_or(false))
        .collect();
    if failed {
        // The transaction is aborted (its pipelined `COMMIT`, if any, rolled it back): write the
        // batch again by the savepoint path, where the failing command fails alone.
        if !all {
            conn.batch_execute("ROLLBACK").await?;
        }
        return with_savepoints(conn, batch).await;
    }
    if all {
        if let Some(Err(error)) = answers.next() {
            return Err(error.into());
        }
        return Ok(outcomes
            .into_iter()
            .zip(wrote)
            .map(|((reply, events), wrote)| match wrote {
                true => Ended::Done(reply, events, false),
                false => Ended::Slow,
            })
            .collect());
    }
    // Still in the transaction: the written ones first, then the others by the savepoint path.
    let rest = batch.split_off(planned);
    let (mut done, mut undone) = (Vec::new(), Vec::new());
    let mut ended = Vec::with_capacity(batch.len() + rest.len());
    for ((command, (reply, events)), wrote) in batch.drain(..).zip(outcomes).zip(wrote) {
        if wrote {
            ended.push(Ended::Done(reply, events, false));
            done.push(command);
        } else {
            undone.push(command);
        }
    }
    let written = done.len();
    *batch = done;
    batch.extend(undone);
    batch.extend(rest);
    // When a write fails, the transaction is rolled back with the one-statement writes before
    // it, so the whole batch is written again, each command in its savepoint.
    let first = attempt(conn, &batch[written..], false, false)
        .await?
        .map(|rest| {
            ended.extend(rest);
            ended
        });
    or_with_savepoints(conn, first, batch).await
}

/// The batch's transaction, begun here: reads, decisions and writes until every command
/// ended, then the commit. An error is the whole transaction's (nothing of it is written).
///
/// The commands' writes are first sent with no savepoint around them; only when one of them
/// fails is the transaction rolled back and run again with a savepoint around each command's
/// writes ([`with_savepoints`]).
///
/// Why not always savepoints: a row the batch's read locked (`FOR UPDATE`) and a savepoint of
/// the same transaction then updated gets a *MultiXact* as its `xmax` (the top transaction's
/// lock and the subtransaction's update, kept apart in case the savepoint rolls back).
/// PostgreSQL never marks the index entries of such a row's old version dead from a scan
/// (`HeapTupleIsSurelyDead` cannot tell without reading `pg_multixact`), so every claimed task's
/// entry stays at the front of the queue's index until a vacuum, and each claim after it visits
/// them all, waiting on the MultiXact caches (`pg_stat_activity`). Updated by the transaction
/// that locked it, the row has a plain `xmax`. With 100 000 tasks of one client queued
/// (`lmsp-bench --only pg-claims`, fresh queues, the same minutes), one instance claimed
/// 1 763–1 813/s with savepoints first and 2 587–2 706/s without; three instances 1 085–1 367
/// and 1 624–2 217/s.
async fn transaction(
    conn: &deadpool_postgres::ClientWrapper,
    batch: &[Command],
) -> Result<Vec<Ended>, DbError> {
    let first = attempt(conn, batch, true, false).await?;
    or_with_savepoints(conn, first, batch).await
}

/// The answers of a pass without savepoints (`first`); when a write of it failed (`None`), the
/// aborted transaction rolled back and `batch` written again by [`with_savepoints`].
async fn or_with_savepoints(
    conn: &deadpool_postgres::ClientWrapper,
    first: Option<Vec<Ended>>,
    batch: &[Command],
) -> Result<Vec<Ended>, DbError> {
    match first {
        Some(ended) => Ok(ended),
        None => {
            conn.batch_execute("ROLLBACK").await?;
            with_savepoints(conn, batch).await
        }
    }
}

/// The batch's transaction, begun here, with a savepoint around each command's writes, so
/// that a command that fails fails alone.
async fn with_savepoints(
    conn: &deadpool_postgres::ClientWrapper,
    batch: &[Command],
) -> Result<Vec<Ended>, DbError> {
    // With savepoints a failed write never aborts the transaction, so there is always an
    // answer; `Retry` (the batch again) if that ever broke.
    attempt(conn, batch, true, true)
        .await?
        .ok_or(DbError::Retry)
}

/// One pass of a batch's transaction (begun when `begin`, else already open): its commands'
/// writes each in a savepoint when `savepoints`. `None`: a write without a savepoint failed,
/// and the transaction is aborted (not yet rolled back).
async fn attempt(
    conn: &deadpool_postgres::ClientWrapper,
    batch: &[Command],
    begin: bool,
    savepoints: bool,
) -> Result<Option<Vec<Ended>>, DbError> {
    let mut ended: Vec<Option<Ended>> = batch.iter().map(|_| None).collect();
    let mut from = 0;
    let mut begin = begin;
    while from < batch.len() {
        let rest = &batch[from..];
        let mut overlay = read(conn, rest, begin).await?;
        begin = false;
        let decided: Vec<Result<Decided, DbError>> = rest
            .iter()
            .map(|command| {
                catch_unwind(AssertUnwindSafe(|| decide(&command.request, &mut overlay)))
                    .unwrap_or_else(|_| {
                        Err(crate::ops::corrupt(String::from(
                            "deciding a write panicked (a bug)",
                        )))
                    })
            })
            .collect();
        match write(conn, &decided, savepoints).await? {
            Written::Aborted => return Ok(None),
            Written::All => {
                for (slot, decision) in ended[from..].iter_mut().zip(decided) {
                    *slot = Some(match decision {
                        Ok(decided) => Ended::Done(decided.reply, decided.events, decided.cancel),
                        Err(error) => Ended::Failed(error.into()),
                    });
                }
                from = batch.len();
            }
            Written::Failed(failed, error) => {
                let mut decided = decided.into_iter();
                for slot in ended[from..from + failed].iter_mut() {
                    *slot = Some(match decided.next() {
                        Some(Ok(decided)) => {
                            Ended::Done(decided.reply, decided.events, decided.cancel)
                        }
                        Some(Err(error)) => Ended::Failed(error.into()),
                        None => Ended::Failed(DbError::Retry.into()),
                    });
                }
                ended[from + failed] = Some(if error.is_retryable() {
                    Ended::Again
                } else {
                    Ended::Failed(error.into())
                });
                from += failed + 1;
            }
        }
    }
    conn.batch_execute("COMMIT").await?;
    Ok(Some(
        ended
            .into_iter()
            .map(|slot| slot.unwrap_or(Ended::Again))
            .collect(),
    ))
}

/// A key's identity in a batch: client, operation, key.
type KeyId = (Vec<u8>, String, String);

fn key_id(record: &IdempotencyRecord) -> KeyId {
    (
        client_key(record.scope.client_id),
        record.scope.operation.as_str().to_owned(),
        record.key.as_str().to_owned(),
    )
}

/// The rows the batch read, as its commands have left them so far.
#[derive(Default)]
struct Overlay {
    tasks: HashMap<TaskId, Task>,
    claimable: VecDeque<TaskId>,
    /// Whether the claims' read found claimable tasks it could not take: held by concurrent
    /// claims (`SKIP LOCKED`), or claimed since its snapshot.
    claims_held: bool,
    keys: HashMap<KeyId, Option<IdempotencyRecord>>,
    /// For each client of the batch's creates that has a `max_queued`: it, and how many of its
    /// tasks are queued (counted up to it, then followed through the batch).
    client_queued: HashMap<ClientId, (u32, u64)>,
    /// How many tasks are queued in the store (counted up to `--max-queued`, then followed).
    service_queued: u64,
}

/// The `max_queued` of the clients `$1` that have one, with their queued tasks counted up to it.
const CLIENT_QUEUED_SQL: &str = "SELECT cq.client_id, cq.max_queued, \
     (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.status = 'queued' \
      AND t.batch_id IS NULL AND t.client_id = cq.client_id LIMIT cq.max_queued) x) \
     FROM client_queues cq WHERE cq.client_id = ANY($1) AND cq.max_queued IS NOT NULL";

/// The store's queued tasks, counted up to `$1`.
const SERVICE_QUEUED_SQL: &str =
    "SELECT count(*) FROM (SELECT 1 FROM tasks WHERE status = 'queued' AND batch_id IS NULL \
     LIMIT $1) x";

/// The tasks a batch names, locked in key order.
static LOCK_TASKS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE t.id = ANY($1) ORDER BY t.id FOR UPDATE OF t"
    )
});

/// One key's record, locked.
static LOCK_KEY_SQL: LazyLock<String> =
    LazyLock::new(|| format!("{} FOR UPDATE", codec::sql::idempotency_record()));

/// `BEGIN` (on the first pass) and the reads of `commands`, pipelined.
async fn read(
    conn: &deadpool_postgres::ClientWrapper,
    commands: &[Command],
    begin: bool,
) -> Result<Overlay, DbError> {
    let mut task_ids: Vec<TaskId> = Vec::new();
    let (mut claims, mut cancels) = (0_u64, 0_u64);
    let mut claim_order: Option<(Timestamp, TierAging)> = None;
    let mut creators: Vec<Vec<u8>> = Vec::new();
    let mut service_max: Option<u32> = None;
    let mut records: Vec<&IdempotencyRecord> = Vec::new();
    for command in commands {
        match &command.request {
            Request::Create {
                task,
                idempotency,
                service_max_queued,
            } => {
                records.extend(idempotency.as_ref());
                creators.push(client_key(task.client_id).to_vec());
                service_max = service_max.or(*service_max_queued);
            }
            Request::Append { task_id, .. } => task_ids.push(*task_id),
            Request::Cancel { task_id, .. } => {
                task_ids.push(*task_id);
                cancels += 1;
            }
            Request::Claim { at, aging, .. } => {
                claims += 1;
                let latest = claim_order.map_or(*at, |(seen, _)| seen.max(*at));
                claim_order = Some((latest, *aging));
            }
        }
    }
    if claims > 0 {
        // A cancel of the batch may take a queued task from under its claims.
        claims += cancels;
    }
    task_ids.sort();
    task_ids.dedup();
    records.sort_by_key(|record| key_id(record));
    records.dedup_by_key(|record| key_id(record));
    let mut reads: Vec<Stmt> = Vec::new();
    if !task_ids.is_empty() {
        let keys: Vec<Vec<u8>> = task_ids.iter().map(|id| key(*id)).collect();
        reads.push(Stmt::new(LOCK_TASKS_SQL.as_str(), vec![Box::new(keys)]));
    }
    if let Some((at, aging)) = claim_order {
        reads.push(Stmt::new(
            ops::tasks::claimable_sql(),
            vec![
                Box::new(to_i64(claims)?),
                Box::new(at.as_millis()),
                Box::new(to_i64(aging.as_millis())?),
            ],
        ));
    }
    creators.sort();
    creators.dedup();
    if !creators.is_empty() {
        reads.push(Stmt::new(
            CLIENT_QUEUED_SQL,
            vec![Box::new(creators.clone())],
        ));
    }
    if let Some(max) = service_max {
        reads.push(Stmt::new(
            SERVICE_QUEUED_SQL,
            vec![Box::new(i64::from(max))],
        ));
    }
    for record in &records {
        let (client, operation, key_text) = key_id(record);
        reads.push(Stmt::new(
            LOCK_KEY_SQL.as_str(),
            vec![Box::new(client), Box::new(operation), Box::new(key_text)],
        ));
    }
    let mut items: Vec<Item<'_>> = Vec::with_capacity(reads.len() + 1);
    if begin {
        items.push(Item::Simple("BEGIN ISOLATION LEVEL READ COMMITTED"));
    }
    items.extend(reads.iter().map(Item::Statement));
    let mut answers = pipeline(conn, &items).await?.into_iter();
    if begin {
        if let Some(Err(error)) = answers.next() {
            return Err(error.into());
        }
    }
    let mut results = answers.map(|answer| answer.map_err(DbError::from));
    let mut overlay = Overlay::default();
    let mut next = || {
        results
            .next()
            .unwrap_or_else(|| Err(crate::ops::corrupt(String::from("a read went missing"))))
    };
    if !task_ids.is_empty() {
        for row in next()? {
            let task = decode_task(&row)?;
            overlay.tasks.insert(task.id, task);
        }
    }
    if claims > 0 {
        let (mut taken, mut candidates) = (0_u64, 0_i64);
        for row in next()? {
            candidates = row.try_get("candidates")?;
            if row.try_get::<_, Option<Vec<u8>>>(0)?.is_none() {
                continue;
            }
            let task = decode_task(&row)?;
            overlay.claimable.push_back(task.id);
            overlay.tasks.entry(task.id).or_insert(task);
            taken += 1;
        }
        overlay.claims_held = codec::from_i64(candidates)? > taken;
    }
    if !creators.is_empty() {
        for row in next()? {
            let client: Vec<u8> = row.try_get(0)?;
            let max: i32 = row.try_get(1)?;
            let queued: i64 = row.try_get(2)?;
            overlay.client_queued.insert(
                ClientId::from_ulid(codec::ulid_of(&client)?),
                (codec::u32_of(i64::from(max))?, codec::from_i64(queued)?),
            );
        }
    }
    if service_max.is_some() {
        if let Some(row) = next()?.first() {
            overlay.service_queued = codec::from_i64(row.try_get(0)?)?;
        }
    }
    for record in &records {
        let rows = next()?;
        let stored = match rows.first() {
            Some(row) => Some(ops::idempotency::decode_record(
                row,
                &record.scope,
                &record.key,
            )?),
            None => None,
        };
        overlay.keys.insert(key_id(record), stored);
    }
    Ok(overlay)
}

/// A decided command: its statements, its answer, its events, whether it is a cancel.
struct Decided {
    statements: Vec<Stmt>,
    reply: Reply,
    events: Vec<Event>,
    cancel: bool,
}

/// The rows of a batch's [`Overlay`] as the codec's shared task flows read and write them
/// ([`flows::TaskWrites`], [`flows::CreateRows`]): a read answers from the rows the batch read,
/// as the commands before left them; a write becomes a statement of the command and leaves its
/// row in the overlay for the commands after it. Nothing waits ([`flows::run_ready`]).
struct Planner<'o> {
    overlay: RefCell<&'o mut Overlay>,
    statements: RefCell<Vec<Stmt>>,
}

impl Planner<'_> {
    fn push(&self, statement: Stmt) {
        self.statements.borrow_mut().push(statement);
    }
}

impl TaskWrites for Planner<'_> {
    type Error = DbError;

    async fn task_to_write(&self, id: TaskId) -> Result<Option<Task>, DbError> {
        Ok(self.overlay.borrow().tasks.get(&id).cloned())
    }

    /// A task's row as a compare-and-set on the row as read, and its events, in one statement
    /// (`WRITE_TASK_SQL`).
    async fn write_advanced(
        &self,
        old: &Task,
        new: &Task,
        events: &[Event],
    ) -> Result<(), DbError> {
        let params = update_params(old, new, events)?;
        self.push(Stmt::new(WRITE_TASK_SQL, params));
        self.overlay.borrow_mut().tasks.insert(old.id, new.clone());
        Ok(())
    }

    async fn put_response(&self, response: &Response) -> Result<(), DbError> {
        self.push(Stmt::new(
            RESPONSE_SQL,
            vec![
                Box::new(response.id.to_string()),
                Box::new(key(response.task_id)),
                Box::new(codec::response_to_text(response)?),
            ],
        ));
        Ok(())
    }

    async fn put_snapshot(&self, task: TaskId, snapshot: &Snapshot) -> Result<(), DbError> {
        self.push(Stmt::new(
            SNAPSHOT_PUT_SQL,
            vec![
                Box::new(key(task)),
                Box::new(to_i64(snapshot.sequence_number)?),
                Box::new(snapshot.state.clone()),
            ],
        ));
        Ok(())
    }

    async fn drop_snapshot(&self, task: TaskId) -> Result<(), DbError> {
        self.push(Stmt::new(SNAPSHOT_DROP_SQL, vec![Box::new(key(task))]));
        Ok(())
    }

    async fn mark_served(&self, client: ClientId, at: Timestamp) -> Result<(), DbError> {
        self.push(Stmt::new(
            ops::tasks::SERVED_SQL,
            vec![Box::new(client_key(client)), Box::new(at.as_millis())],
        ));
        Ok(())
    }
}

impl CreateRows for Planner<'_> {
    async fn stored_key(
        &self,
        record: &IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, DbError> {
        self.overlay
            .borrow()
            .keys
            .get(&key_id(record))
            .cloned()
            .ok_or_else(|| crate::ops::corrupt(String::from("a key was not read")))
    }

    async fn max_queued(&self, client: ClientId) -> Result<Option<u32>, DbError> {
        let overlay = self.overlay.borrow();
        Ok(overlay.client_queued.get(&client).map(|(max, _)| *max))
    }

    async fn queued(&self, client: ClientId, _limits: QueueLimits) -> Result<(u64, u64), DbError> {
        let overlay = self.overlay.borrow();
        let client = overlay.client_queued.get(&client);
        Ok((
            client.map_or(0, |(_, queued)| *queued),
            overlay.service_queued,
        ))
    }

    /// The task, its spec and first events in one statement (`fast::CREATES_SQL`), then the key's
    /// record; the queued counts followed.
    async fn insert_created(
        &self,
        write: &TaskWrite<'_>,
        record: Option<&IdempotencyRecord>,
        existed: bool,
    ) -> Result<(), DbError> {
        let mut overlay = self.overlay.borrow_mut();
        if let Some((_, queued)) = overlay.client_queued.get_mut(&write.task.client_id) {
            *queued += 1;
        }
        overlay.service_queued += 1;
        self.push(fast::Creates::of(&write.task, &write.events, None)?.admitted());
        if let Some(record) = record {
            self.push(put_record_statement(record, existed));
            overlay.keys.insert(key_id(record), Some(record.clone()));
        }
        overlay.tasks.insert(write.task.id, write.task.clone());
        Ok(())
    }
}

/// Asks the domain what `request` writes (the codec's shared flows), on the rows of `overlay`,
/// and leaves its new rows there for the commands after it.
fn decide(request: &Request, overlay: &mut Overlay) -> Result<Decided, DbError> {
    let planner = Planner {
        overlay: RefCell::new(overlay),
        statements: RefCell::new(Vec::new()),
    };
    let (reply, events) = match request {
        Request::Create {
            task,
            idempotency,
            service_max_queued,
        } => {
            let flow =
                flows::create_task(&planner, task, idempotency.as_ref(), *service_max_queued);
            let (outcome, events) = flows::run_ready(flow)?;
            (Reply::Created(outcome), events)
        }
        Request::Append {
            task_id,
            by,
            expected,
            steps,
            snapshot,
            at,
        } => {
            let flow = flows::append(
                &planner,
                *task_id,
                *by,
                *expected,
                steps,
                snapshot.as_ref(),
                *at,
            );
            let (outcome, events) = flows::run_ready(flow)?;
            (Reply::Stepped(outcome), events)
        }
        Request::Claim { by, at, .. } => {
            let next = loop {
                let Some(id) = planner.overlay.borrow_mut().claimable.pop_front() else {
                    break None;
                };
                match planner.overlay.borrow().tasks.get(&id) {
                    Some(old) if old.status == TaskStatus::Queued => break Some(old.clone()),
                    _ => continue,
                }
            };
            match next {
                Some(old) => {
                    let (task, events) = flows::run_ready(flows::claim(&planner, &old, *by, *at))?;
                    (Reply::Claimed(Some(task)), events)
                }
                None if planner.overlay.borrow().claims_held => (Reply::Held, Vec::new()),
                None => (Reply::Claimed(None), Vec::new()),
            }
        }
        Request::Cancel {
            task_id,
            client_id,
            at,
        } => {
            let flow = flows::cancel(&planner, *task_id, *client_id, *at);
            let (outcome, events) = flows::run_ready(flow)?;
            (Reply::Cancelled(outcome), events)
        }
    };
    let statements = planner.statements.into_inner();
    Ok(Decided {
        // A cancel that wrote something (one that found nothing to do tells no one).
        cancel: matches!(request, Request::Cancel { .. }) && !statements.is_empty(),
        statements,
        reply,
        events,
    })
}

/// Events as the five arrays the writes `unnest`: sequence numbers, codes, times, data, items.
type EventArrays = (Vec<i64>, Vec<i64>, Vec<i64>, Vec<String>, Vec<Option<i64>>);

fn event_arrays(events: &[Event]) -> Result<EventArrays, DbError> {
    let mut arrays: EventArrays = Default::default();
    for event in events {
        let row = EventRow::encode(event)?;
        arrays.0.push(row.sequence_number);
        arrays.1.push(row.code);
        arrays.2.push(row.created_at);
        arrays.3.push(row.data.into_owned());
        arrays.4.push(row.item);
    }
    Ok(arrays)
}

fn push_events(params: &mut Vec<Param>, events: &[Event]) -> Result<(), DbError> {
    let (sequences, codes, times, data, items) = event_arrays(events)?;
    params.push(Box::new(sequences));
    params.push(Box::new(codes));
    params.push(Box::new(times));
    params.push(Box::new(data));
    params.push(Box::new(items));
    Ok(())
}

/// P-3: a task's row as a compare-and-set on the row as read, and its events, in one statement;
/// a row that moved under the transaction fails it as a lost race (`lmsp_expect_one`).
const WRITE_TASK_SQL: &str = "WITH u AS (UPDATE tasks SET status = $1, started_at = $2, \
     finished_at = $3, last_sequence_number = $4, restarts = $5, error = $6, owner = $7, \
     items_opened = $8, item_open = $9 \
     WHERE id = $10 AND status = $11 AND last_sequence_number = $12 AND owner = $13 RETURNING 1), \
     e AS (INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
     SELECT $10, * FROM unnest($14::bigint[], $15::bigint[], $16::bigint[], $17::text[], \
     $18::bigint[])) \
     SELECT lmsp_expect_one(count(*)) FROM u";

const RESPONSE_SQL: &str = "INSERT INTO responses (id, task_id, doc) VALUES ($1, $2, $3) \
     ON CONFLICT (id) DO UPDATE SET task_id = EXCLUDED.task_id, doc = EXCLUDED.doc";

const SNAPSHOT_PUT_SQL: &str =
    "INSERT INTO snapshots (task_id, sequence_number, state) VALUES ($1, $2, $3) \
     ON CONFLICT (task_id) DO UPDATE SET sequence_number = EXCLUDED.sequence_number, \
     state = EXCLUDED.state";

const SNAPSHOT_DROP_SQL: &str = "DELETE FROM snapshots WHERE task_id = $1";

/// The parameters `$1`…`$18` of a task's guarded update from `old` to `new` with its `events`:
/// the new row's columns, the old row's guard, then the events as arrays. Shared by the
/// batched write's statement and the one-round-trip step's.
fn update_params(old: &Task, new: &Task, events: &[Event]) -> Result<Vec<Param>, DbError> {
    let mut params: Vec<Param> = vec![
        Box::new(new.status.as_str()),
        Box::new(new.started_at.map(Timestamp::as_millis)),
        Box::new(new.finished_at.map(Timestamp::as_millis)),
        Box::new(to_i64(new.last_sequence_number)?),
        Box::new(i64::from(new.restarts)),
        Box::new(codec::error_text(new)?),
        Box::new(instance_key(new.owner)),
        Box::new(i64::from(new.items.opened)),
        Box::new(new.items.open),
        Box::new(key(old.id)),
        Box::new(old.status.as_str()),
        Box::new(to_i64(old.last_sequence_number)?),
        Box::new(instance_key(old.owner)),
    ];
    push_events(&mut params, events)?;
    Ok(params)
}

/// A key's record, inserted: no `ON CONFLICT`, so a record inserted meanwhile is a unique
/// violation (a lost race).
const INSERT_RECORD_SQL: &str = "INSERT INTO idempotency_keys (client_id, operation, key, digest, \
     reply, reply_task, held_until, held_by, created_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// A key's record, replacing the one that existed (the codec's upsert).
static UPSERT_RECORD_SQL: LazyLock<String> =
    LazyLock::new(|| codec::sql::put_idempotency_record(true));

/// I-8: a key's record. Over a record the transaction read and locked it is an upsert; where it
/// read none, a plain insert, whose unique violation (a concurrent request inserted one
/// meanwhile) is a lost race: the command is run again and decides on that record.
fn put_record_statement(record: &IdempotencyRecord, existed: bool) -> Stmt {
    let sql = if existed {
        UPSERT_RECORD_SQL.as_str()
    } else {
        INSERT_RECORD_SQL
    };
    let mut stmt = Stmt::new(
        sql,
        codec::ops::record_params(record)
            .into_iter()
            .map(ops::boxed)
            .collect(),
    );
    stmt.race_on_conflict = !existed;
    stmt
}

/// What [`write`] did.
enum Written {
    /// Every command's writes.
    All,
    /// The `i`-th command failed with this error, and the transaction was rolled back to its
    /// savepoint: the commands before it stay written, those after it are not.
    Failed(usize, DbError),
    /// A command failed with no savepoint around it: the transaction is aborted.
    Aborted,
}

/// Writes the decided commands, pipelined, each in its savepoint when `savepoints`.
async fn write(
    conn: &deadpool_postgres::ClientWrapper,
    decided: &[Result<Decided, DbError>],
    savepoints: bool,
) -> Result<Written, DbError> {
    let mut items: Vec<Item<'_>> = Vec::new();
    // Which command each item belongs to.
    let mut owners: Vec<usize> = Vec::new();
    let mut races: Vec<bool> = Vec::new();
    for (index, decision) in decided.iter().enumerate() {
        let Ok(decided) = decision else { continue };
        if decided.statements.is_empty() {
            continue;
        }
        if savepoints {
            items.push(Item::Simple("SAVEPOINT cmd"));
            owners.push(index);
            races.push(false);
        }
        for statement in &decided.statements {
            items.push(Item::Statement(statement));
            owners.push(index);
            races.push(statement.race_on_conflict);
        }
        if savepoints {
            items.push(Item::Simple("RELEASE cmd"));
            owners.push(index);
            races.push(false);
        }
    }
    if items.is_empty() {
        return Ok(Written::All);
    }
    let results = pipeline(conn, &items).await?;
    let failed =
        results
            .into_iter()
            .zip(owners.iter().zip(&races))
            .find_map(|(result, (owner, race))| {
                result.err().map(|error| {
                    let error = match error.code() {
                        Some(code) if *race && *code == SqlState::UNIQUE_VIOLATION => {
                            DbError::Retry
                        }
                        _ => DbError::Sql(error),
                    };
                    (*owner, error)
                })
            });
    let Some((index, error)) = failed else {
        return Ok(Written::All);
    };
    if !savepoints {
        return Ok(Written::Aborted);
    }
    // Undoes the failed command alone; if even that fails, the transaction is lost.
    conn.batch_execute("ROLLBACK TO SAVEPOINT cmd; RELEASE SAVEPOINT cmd")
        .await?;
    Ok(Written::Failed(index, error))
}

/// A statement parameter.
type Param = Box<dyn ToSql + Sync + Send>;

/// A statement and its parameters, prepared (once per connection) when it is first run.
struct Stmt {
    /// Made once: every statement's text is a constant, or built once (`LazyLock`).
    sql: &'static str,
    params: Vec<Param>,
    /// Whether a unique violation of this statement is a lost race (run the command again).
    race_on_conflict: bool,
}

impl Stmt {
    fn new(sql: &'static str, params: Vec<Param>) -> Stmt {
        Stmt {
            sql,
            params,
            race_on_conflict: false,
        }
    }
}

/// One message of a pipeline: a simple-protocol command, or a statement.
#[derive(Clone, Copy)]
enum Item<'a> {
    Simple(&'static str),
    Statement(&'a Stmt),
}

/// A pipelined request's result: its rows, or the error it failed with.
type Answer = Result<Vec<Row>, tokio_postgres::Error>;

/// Sends `items` in order without waiting between them (one round trip for all), and returns
/// each one's result. After a failure PostgreSQL refuses the rest of the transaction's
/// statements, so each later one fails too. `Err`: a statement could not even be prepared.
async fn pipeline(
    conn: &deadpool_postgres::ClientWrapper,
    items: &[Item<'_>],
) -> Result<Vec<Answer>, DbError> {
    let mut prepared = Vec::with_capacity(items.len());
    for item in items {
        prepared.push(match item {
            Item::Simple(_) => None,
            Item::Statement(stmt) => Some(conn.prepare_cached(stmt.sql).await?),
        });
    }
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = items
        .iter()
        .map(|item| match item {
            Item::Simple(_) => Vec::new(),
            Item::Statement(stmt) => stmt
                .params
                .iter()
                .map(|param| param.as_ref() as &(dyn ToSql + Sync))
                .collect(),
        })
        .collect();
    let client: &tokio_postgres::Client = conn;
    let futures: Vec<Pin<Box<dyn Future<Output = Answer> + Send + '_>>> = items
        .iter()
        .zip(prepared.iter().zip(&params))
        .map(|(item, (statement, params))| {
            let future: Pin<Box<dyn Future<Output = Answer> + Send + '_>> = match (item, statement)
            {
                (_, Some(statement)) => Box::pin(client.query(statement, params)),
                (Item::Simple(sql), None) => {
                    let sql: &'static str = sql;
                    Box::pin(async move { client.batch_execute(sql).await.map(|()| Vec::new()) })
                }
                (Item::Statement(_), None) => Box::pin(std::future::ready(Ok(Vec::new()))),
            };
            future
        })
        .collect();
    Ok(in_order(futures).await)
}

/// Polls `futures` to their ends, each first poll in order (tokio-postgres sends a request on
/// its future's first poll, so the requests go out in this order, all before any answer).
/// Answers come back in order too, so later polls walk from the first unfinished one and stop at
/// the first that is still waiting.
async fn in_order<'a, T>(mut futures: Vec<Pin<Box<dyn Future<Output = T> + Send + 'a>>>) -> Vec<T> {
    let mut done: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let mut first = 0;
    let mut sent = false;
    std::future::poll_fn(|cx| {
        let mut index = first;
        while index < futures.len() {
            if done[index].is_none() {
                match futures[index].as_mut().poll(cx) {
                    Poll::Ready(value) => done[index] = Some(value),
                    Poll::Pending if sent => break,
                    Poll::Pending => {}
                }
            }
            index += 1;
        }
        sent = true;
        while first < done.len() && done[first].is_some() {
            first += 1;
        }
        if first == done.len() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Each future is polled first in the order given (so a pipeline's requests go out in that
    /// order), and each result comes back in its own place, whichever finished first.
    #[tokio::test]
    async fn in_order_polls_first_in_order_and_keeps_each_result_in_its_place() {
        let polled = Arc::new(std::sync::Mutex::new(Vec::new()));
        let futures: Vec<Pin<Box<dyn Future<Output = usize> + Send>>> = (0..5)
            .map(|index| {
                let polled = Arc::clone(&polled);
                let future: Pin<Box<dyn Future<Output = usize> + Send>> = Box::pin(async move {
                    polled.lock().unwrap().push(index);
                    // Later ones finish first.
                    tokio::task::yield_now().await;
                    for _ in 0..(5 - index) {
                        tokio::task::yield_now().await;
                    }
                    index * 10
                });
                future
            })
            .collect();
        assert_eq!(in_order(futures).await, vec![0, 10, 20, 30, 40]);
        assert_eq!(*polled.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }
}
