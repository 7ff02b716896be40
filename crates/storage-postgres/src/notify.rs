//! Notifications across processes: every write transaction that commits events sends, right
//! after its commit, one `NOTIFY` per task on [`CHANNEL`] (so nothing is announced before it is
//! durable); each store keeps one connection that `LISTEN`s and tells its [`StoreListener`] what
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

/// Sends, once a transaction has committed, one notification per task of its `events`:
/// `origin task_id last_sequence_number flag`, the flag saying whether the transaction was a
/// cancel. All of them go in one statement, outside any transaction. A notification that cannot
/// be sent is only logged: the write it reports is committed (reporting an error would have it
/// written twice), and the other instances' polling finds it.
pub async fn send(db: &Client, origin: &str, events: &[Event], cancel: bool) {
    let mut last: BTreeMap<TaskId, u64> = BTreeMap::new();
    for event in events {
        let seen = last.entry(event.task_id).or_insert(0);
        *seen = (*seen).max(event.sequence_number);
    }
    if last.is_empty() {
        return;
    }
    let flag = if cancel { CANCEL_FLAG } else { EVENTS_FLAG };
    let payloads: Vec<String> = last
        .into_iter()
        .map(|(task_id, sequence)| format!("{origin} {task_id} {sequence} {flag}"))
        .collect();
    if let Err(error) = db
        .execute(
            "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload",
            &[&CHANNEL, &payloads],
        )
        .await
    {
        tracing::warn!(%error, "a notification to the other instances was lost");
    }
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
