//! Whether a webhook receiver that hangs slows task completions: the same background work is
//! completed by a fresh `lmsp serve` with no webhook endpoint, and by one with an endpoint
//! subscribed to `response.completed` whose receiver accepts each connection, reads what is sent
//! and never answers (a TCP listener of the harness's own). Every completion then writes a
//! delivery in its own transaction, and the service's deliverer sits in an attempt until
//! `--webhook-timeout`.
//!
//! The work is the peer figure's (`peer::lmsp`): `tasks` background submits of the reference
//! engine (`max_output_tokens: 1`, zero delays) from `clients` concurrent clients, done when
//! `GET /v1/tasks?status=…` lists no unfinished task; completions per second from the first POST
//! to that moment. The deliveries still pending at the end are counted through the storage port
//! on the service's database once it is stopped.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use lmsp_domain::ports::WebhookStore;
use lmsp_domain::WebhookEndpointId;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::recovery::{close_store, DB_FILE};
use crate::server::Server;

/// How long the service waits for a receiver's answer (`--webhook-timeout`: its default).
pub const WEBHOOK_TIMEOUT: &str = "10s";

/// The flags the harness starts the service with for these figures: the Batch API figures'
/// workers and zero delays, and the webhook timeout said explicitly.
pub const SERVE_FLAGS: &[&str] = &[
    "--workers",
    "4",
    "--reference-token-delay",
    "0ms",
    "--reference-load-delay",
    "0ms",
    "--webhook-timeout",
    WEBHOOK_TIMEOUT,
];

/// A receiver that accepts connections, reads whatever comes, and never answers.
#[derive(Debug)]
pub struct HangingReceiver {
    url: String,
    accepted: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl HangingReceiver {
    /// Listens on a free port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot listen for the hanging receiver")?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let accepted = Arc::new(AtomicU64::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let task = {
            let (accepted, received) = (Arc::clone(&accepted), Arc::clone(&received));
            tokio::spawn(async move {
                // Aborting this task drops the set, which aborts every connection's reader.
                let mut connections = JoinSet::new();
                while let Ok((mut socket, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    let received = Arc::clone(&received);
                    connections.spawn(async move {
                        let mut buffer = vec![0_u8; 16 * 1024];
                        // Read until the sender gives up and closes; never write a byte.
                        while let Ok(n) = socket.read(&mut buffer).await {
                            if n == 0 {
                                break;
                            }
                            received.fetch_add(n as u64, Ordering::Relaxed);
                        }
                    });
                    while connections.try_join_next().is_some() {}
                }
            })
        };
        Ok(Self {
            url,
            accepted,
            received,
            task,
        })
    }

    /// Where it listens.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Bytes read so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

impl Drop for HangingReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Registers an endpoint at `url` subscribed to `response.completed` (`POST
/// /v1/webhook_endpoints` with the admin token); returns its id.
pub async fn register(
    http: &reqwest::Client,
    server: &Server,
    url: &str,
) -> anyhow::Result<WebhookEndpointId> {
    let response = http
        .post(server.url("/v1/webhook_endpoints"))
        .bearer_auth(&server.token)
        .json(&json!({
            "name": "lmsp-bench hanging receiver",
            "url": url,
            "event_types": ["response.completed"],
        }))
        .send()
        .await?;
    let status = response.status();
    let text = response.text().await?;
    if !status.is_success() {
        bail!("POST /v1/webhook_endpoints: {status}: {text}");
    }
    let body: serde_json::Value = serde_json::from_str(&text)?;
    let id = body["id"]
        .as_str()
        .ok_or_else(|| anyhow!("an endpoint without an id: {text}"))?;
    WebhookEndpointId::parse(id).map_err(|error| anyhow!("a bad endpoint id {id}: {error}"))
}

/// The endpoint's deliveries in the stopped service's data directory: (written, pending:
/// neither delivered nor given up, delivered).
pub async fn count_deliveries(
    data_dir: &Path,
    endpoint: WebhookEndpointId,
    at_most: usize,
) -> anyhow::Result<(usize, usize, usize)> {
    let store = Arc::new(
        SqliteStore::open_without_listener(&data_dir.join(DB_FILE), SqliteOptions::default())
            .context("cannot open the stopped service's database")?,
    );
    let read = store.deliveries(endpoint, at_most).await;
    close_store(store);
    let deliveries = read?;
    let pending = deliveries
        .iter()
        .filter(|d| d.delivered_at.is_none() && d.given_up_at.is_none())
        .count();
    let delivered = deliveries
        .iter()
        .filter(|d| d.delivered_at.is_some())
        .count();
    Ok((deliveries.len(), pending, delivered))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    #[tokio::test]
    async fn the_hanging_receiver_reads_a_request_and_never_answers() {
        let receiver = HangingReceiver::start().await.unwrap();
        let address = receiver
            .url()
            .strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix("/hook"))
            .unwrap()
            .to_owned();
        let mut socket = TcpStream::connect(&address).await.unwrap();
        let request = b"POST /hook HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}";
        socket.write_all(request).await.unwrap();

        let mut answer = [0_u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(200), socket.read(&mut answer)).await;

        assert!(read.is_err(), "the receiver answered: {read:?}");
        assert_eq!(receiver.accepted(), 1);
        assert_eq!(receiver.received(), request.len() as u64);
    }
}
