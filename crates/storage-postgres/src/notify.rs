//! Notifications across processes: every write transaction that commits events queues, right
//! after its commit, one `NOTIFY` per task on [`CHANNEL`] (so nothing is announced before it is
//! durable), which the [`Notifier`] sends, gathered; each store keeps one connection that `LISTEN`s and tells its [`StoreListener`] what
//! *other* stores committed. When that connection drops, a
//! supervisor reconnects it; news sent meanwhile is lost, which the app's polling covers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lmsp_domain::event::Event;
use lmsp_domain::ids::TaskId;
use lmsp_domain::ports::StoreListener;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use crate::error::DbError;

/// The channel the notifications go on.
pub const CHANNEL: &str = "lmsp_events";

/// The flag of a notification that carries a cancel.
const CANCEL_FLAG: &str = "c";
/// The flag of a notification that carries events only.
const EVENTS_FLAG: &str = "-";

/// The notifications of one committed transaction, one per task of its `events`:
/// `origin task_id last_sequence_number flag`, the flag saying whether the transaction was a
/// cancel.
fn payloads(origin: &str, events: &[Event], cancel: bool) -> Vec<String> {
    let mut last: BTreeMap<TaskId, u64> = BTreeMap::new();
    for event in events {
        let seen = last.entry(event.task_id).or_insert(0);
        *seen = (*seen).max(event.sequence_number);
    }
    let flag = if cancel { CANCEL_FLAG } else { EVENTS_FLAG };
    last.into_iter()
        .map(|(task_id, sequence)| format!("{origin} {task_id} {sequence} {flag}"))
        .collect()
}

/// The sending side: committed writes hand their notifications to [`Notifier::send`], which
/// never waits; one task sends whatever has gathered as one statement at a time, on a
/// connection of its own: one round trip (`SELECT pg_notify(…) FROM unnest(…)`, prepared once,
/// its own transaction).
///
/// PostgreSQL serializes notifying transactions (a global lock held through their commit), so a
/// notification sent by each write on its own connection would cap the whole service at one
/// notifying commit at a time, and hold each caller through it. Gathered, a busy service sends
/// one notifying transaction per round trip instead of one per write, and nobody waits for it.
/// The sending connection commits with `synchronous_commit` off (set for its session): it
/// writes nothing that must survive a crash (notifications are not kept across one anyway).
#[derive(Debug, Clone)]
pub struct Notifier {
    queue: tokio::sync::mpsc::UnboundedSender<Vec<String>>,
}

impl Notifier {
    /// Starts the sending task, which connects to the database of `config` (waiting at most
    /// `timeout`) when it first has something to send, and again after its connection failed;
    /// it ends once every [`Notifier`] is dropped and what was queued is sent.
    pub fn start(config: Config, timeout: Duration) -> Notifier {
        let (queue, mut pending) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
        tokio::spawn(async move {
            let mut sender: Option<Sender> = None;
            while let Some(first) = pending.recv().await {
                let mut batch = first;
                while let Ok(more) = pending.try_recv() {
                    batch.extend(more);
                }
                if let Err(error) = send_batch(&mut sender, &config, timeout, &batch).await {
                    // The writes it reports are committed (reporting an error would have them
                    // written twice); the other instances' polling finds them.
                    tracing::warn!(%error, lost = batch.len(), "notifications to the other instances were lost");
                }
            }
        });
        Notifier { queue }
    }

    /// Queues the notifications of a committed transaction's `events` (nothing when it has
    /// none).
    pub fn send(&self, origin: &str, events: &[Event], cancel: bool) {
        let payloads = payloads(origin, events, cancel);
        if !payloads.is_empty() {
            // Fails only once the sending task has ended (the store is closing).
            let _ = self.queue.send(payloads);
        }
    }
}

impl Notifier {
    /// Queues the notification that task `task_id` is at `sequence`, from a committed
    /// transaction that wrote its events set-based (a batch's start creates its tasks in SQL),
    /// so that the other instances hear of new work as they do of a create's.
    pub fn announce(&self, origin: &str, task_id: TaskId, sequence: u64) {
        let _ = self
            .queue
            .send(vec![format!("{origin} {task_id} {sequence} {EVENTS_FLAG}")]);
    }
}

/// The notifier's connection: its client, the task driving it, and its statement.
struct Sender {
    client: Client,
    driver: JoinHandle<()>,
    notify: tokio_postgres::Statement,
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Sends `payloads` as one statement (its own transaction) on the notifier's connection,
/// opening it first when there is none.
async fn send_batch(
    sender: &mut Option<Sender>,
    config: &Config,
    timeout: Duration,
    payloads: &[String],
) -> Result<(), DbError> {
    let open = match sender.take() {
        Some(open) if !open.client.is_closed() => open,
        _ => {
            let (client, connection) = tokio::time::timeout(timeout, config.connect(NoTls))
                .await
                .map_err(|_| DbError::Pool(String::from("timed out connecting to PostgreSQL")))??;
            let driver = tokio::spawn(async move {
                let _ = connection.await;
            });
            client
                .batch_execute("SET synchronous_commit TO OFF")
                .await?;
            let notify = client
                .prepare("SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload")
                .await?;
            Sender {
                client,
                driver,
                notify,
            }
        }
    };
    open.client
        .execute(&open.notify, &[&CHANNEL, &payloads])
        .await?;
    *sender = Some(open);
    Ok(())
}

/// Tells `listener` what one notification says, unless this store sent it.
fn dispatch(listener: &dyn StoreListener, origin: &str, payload: &str) {
    let mut parts = payload.split(' ');
    let (Some(from), Some(task), Some(sequence), Some(flag)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        tracing::debug!(payload, "an unreadable notification");
        return;
    };
    if from == origin {
        return;
    }
    let (Ok(task_id), Ok(sequence)) = (TaskId::parse(task), sequence.parse::<u64>()) else {
        tracing::debug!(payload, "an unreadable notification");
        return;
    };
    listener.advanced_elsewhere(task_id, sequence);
    if flag == CANCEL_FLAG {
        listener.cancel_requested(task_id);
    }
}

/// A listening connection: its client (which keeps it open) and the task driving it.
pub struct Listening {
    client: Client,
    driver: JoinHandle<()>,
}

/// Opens a connection, drives it on a task of its own that hands each notification to
/// `listener`, and `LISTEN`s; returns once the server has confirmed the `LISTEN`, so every
/// commit after that is heard.
pub async fn open(
    config: &Config,
    listener: Arc<dyn StoreListener>,
    origin: Arc<str>,
) -> Result<Listening, DbError> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(notification)) => {
                    if notification.channel() == CHANNEL {
                        dispatch(listener.as_ref(), &origin, notification.payload());
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "the PostgreSQL notification connection failed");
                    break;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok(Listening { client, driver })
}

/// Keeps a listening connection open: when it ends, opens another (retrying every
/// `retry_every`), until the returned task is aborted.
pub fn supervise(
    first: Listening,
    config: Config,
    listener: Arc<dyn StoreListener>,
    origin: Arc<str>,
    retry_every: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut current = first;
        loop {
            let _ = (&mut current.driver).await;
            drop(current.client);
            current = loop {
                tokio::time::sleep(retry_every).await;
                match open(&config, Arc::clone(&listener), Arc::clone(&origin)).await {
                    Ok(listening) => break listening,
                    Err(error) => {
                        tracing::warn!(%error, "cannot listen for notifications yet");
                    }
                }
            };
        }
    })
}
