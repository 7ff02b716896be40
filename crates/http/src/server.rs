//! Serving the router over HTTP/1.1: one task per connection, no HTTP/2 machinery, with the
//! limits that keep a slow or hostile client from tying the service up.
//!
//! - A request whose headers do not all arrive within the request timeout (a silent connection,
//!   headers trickling in) is answered 408 with the error envelope and closed.
//! - A request body that stalls for the request timeout is answered 408 and the connection
//!   closed (see [`BodyTimedOut`], turned into the reply by the JSON extractor).
//! - An idle keep-alive connection is closed after the idle timeout.
//! - Past the connection limit, a new connection is answered 503 `service_unavailable` with
//!   `Retry-After` and closed; past a bound on those being answered at once, it is closed at
//!   once, so that a flood of connections cannot take the descriptors the service needs.
//! - The replies the HTTP library makes by itself (400 for a malformed request, 414, 431) carry
//!   the error envelope too.
//!
//! LMSP speaks HTTP/1.1 (SSE included), so each connection runs hyper's HTTP/1 state machine
//! alone instead of the auto-detecting HTTP/1 + HTTP/2 one: an open connection then costs about
//! half the memory, which is what bounds 10 000 open event streams.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use crate::error::{ApiError, ErrorCode};

/// The limits of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// How long a request's headers may take to arrive, and a body may stall.
    pub request_timeout: Duration,
    /// How long an idle keep-alive connection stays open.
    pub idle_timeout: Duration,
    /// The most connections served at once.
    pub max_connections: usize,
    /// The most connections past the limit being answered 503 at once; past it, a new
    /// connection is closed without a reply.
    pub max_refusing: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            max_refusing: 64,
        }
    }
}

/// Stops a running server: it accepts no more connections, lets the open ones end (each closes
/// after the reply it is sending), and after a grace closes the rest.
#[derive(Debug, Clone, Default)]
pub struct ServerStop {
    inner: Arc<StopInner>,
}

#[derive(Debug, Default)]
struct StopInner {
    stopping: tokio_util::sync::CancellationToken,
    open: AtomicUsize,
    closed: Notify,
}

impl ServerStop {
    /// A stop not yet asked for.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops accepting, and waits up to `grace` for the open connections to close.
    pub async fn stop(&self, grace: Duration) {
        self.inner.stopping.cancel();
        let deadline = Instant::now() + grace;
        while self.inner.open.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            let _ = tokio::time::timeout_at(deadline, self.inner.closed.notified()).await;
        }
    }
}

/// The error a request body stalled past the request timeout reads as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body stalled past the request timeout")]
pub struct BodyTimedOut;

/// A raw error reply with the envelope, written without hyper (before or instead of it).
fn raw_reply(status: u16, reason: &str, code: ErrorCode, message: &str, extra: &str) -> Vec<u8> {
    let error = ApiError::new(code, message);
    let body = serde_json::to_string(&error.envelope()).unwrap_or_default();
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn request_timeout_reply() -> Vec<u8> {
    raw_reply(
        408,
        "Request Timeout",
        ErrorCode::InvalidRequest,
        "the request did not arrive in time",
        "",
    )
}

fn too_many_connections_reply() -> Vec<u8> {
    raw_reply(
        503,
        "Service Unavailable",
        ErrorCode::ServiceUnavailable,
        "too many connections; try again shortly",
        "retry-after: 1\r\n",
    )
}

/// The envelope reply for an empty reply hyper made by itself.
fn library_reply(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let status: u16 = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let lower = text.to_ascii_lowercase();
    if !(400..600).contains(&status) || !lower.contains("content-length: 0") {
        return None;
    }
    let (reason, message) = match status {
        414 => ("URI Too Long", "the request's URI is too long"),
        431 => (
            "Request Header Fields Too Large",
            "the request's headers are too large",
        ),
        _ => ("Bad Request", "the request is not well-formed HTTP/1.1"),
    };
    Some(raw_reply(
        status,
        reason,
        ErrorCode::InvalidRequest,
        message,
        "",
    ))
}

/// What a connection is doing, shared by its IO and its requests.
#[derive(Debug)]
struct Connection {
    /// Requests whose replies are not yet done.
    in_flight: AtomicUsize,
    phase: Mutex<Phase>,
}

#[derive(Debug)]
struct Phase {
    /// When the current phase began: the connection's start, or the end of its last reply.
    since: Instant,
    /// Bytes read since the last reply ended.
    bytes: u64,
    /// Whether a reply was sent on it already.
    served: bool,
}

impl Connection {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicUsize::new(0),
            phase: Mutex::new(Phase {
                since: Instant::now(),
                bytes: 0,
                served: false,
            }),
        })
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reply_done(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut phase = self.phase();
        phase.since = Instant::now();
        phase.bytes = 0;
        phase.served = true;
    }
}

/// The socket as hyper sees it, with the connection's timers: while no request is being
/// answered, a request head not complete in time gets the 408 and an end of stream, and an idle
/// keep-alive connection an end of stream; a reply hyper makes by itself gets the envelope.
struct TimedIo {
    stream: TcpStream,
    connection: Arc<Connection>,
    limits: ServerLimits,
    timer: Pin<Box<Sleep>>,
    ended: bool,
    /// Bytes to write before anything else (a reply put in place of hyper's).
    pending: Vec<u8>,
}

impl TimedIo {
    fn flush_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let written = ready!(Pin::new(&mut self.stream).poll_write(cx, &self.pending))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..written);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.ended {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = (buf.filled().len() - before) as u64;
                let idle = self.connection.in_flight.load(Ordering::SeqCst) == 0;
                let mut phase = self.connection.phase();
                if read > 0 && idle && phase.bytes == 0 && phase.served {
                    // A new request begins: its head has the request timeout from now.
                    phase.since = Instant::now();
                }
                phase.bytes += read;
                return Poll::Ready(Ok(()));
            }
            Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
            Poll::Pending => {}
        }
        if self.connection.in_flight.load(Ordering::SeqCst) > 0 {
            // A request is being answered: its body has timers of its own, and a reply may
            // stream for as long as it needs.
            return Poll::Pending;
        }
        let (deadline, head_pending) = {
            let phase = self.connection.phase();
            if !phase.served || phase.bytes > 0 {
                (phase.since + self.limits.request_timeout, true)
            } else {
                (phase.since + self.limits.idle_timeout, false)
            }
        };
        self.timer.as_mut().reset(deadline);
        if self.timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.ended = true;
        if head_pending {
            // Tiny, on an idle socket: it fits in the send buffer at once.
            let _ = self.stream.try_write(&request_timeout_reply());
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.flush_pending(cx))?;
        if self.connection.in_flight.load(Ordering::SeqCst) == 0 {
            if let Some(reply) = library_reply(buf) {
                self.pending = reply;
                self.ended = true;
                ready!(self.flush_pending(cx))?;
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.flush_pending(cx))?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.flush_pending(cx))?;
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A request body whose frames must each arrive within the request timeout.
struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
    armed: bool,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.armed = false;
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => {
                if !this.armed {
                    this.armed = true;
                    let deadline = Instant::now() + this.timeout;
                    this.timer.as_mut().reset(deadline);
                }
                ready!(this.timer.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A reply body that marks its request answered when it is done with (sent, or dropped).
struct TrackedBody {
    inner: Body,
    connection: Option<Arc<Connection>>,
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            connection.reply_done();
        }
    }
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Accepts connections on `listener` and serves `router` on each, within `limits`, until
/// `stop` is asked for. A failed accept (e.g. out of file descriptors) is logged and retried
/// after a short pause.
pub async fn serve(listener: TcpListener, router: Router, limits: ServerLimits, stop: ServerStop) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(limits.max_refusing));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            () = stop.inner.stopping.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small replies go out at once instead of waiting for more to send.
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            // Each refusal holds its descriptor for a moment: bounded, or a flood would hold
            // them all. Past the bound the connection is closed at once (dropped).
            if let Ok(refusing) = Arc::clone(&refusals).try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(refusing);
                });
            }
            continue;
        };
        let connection = Connection::new();
        let io = TimedIo {
            stream,
            connection: Arc::clone(&connection),
            limits,
            timer: Box::pin(tokio::time::sleep(limits.request_timeout)),
            ended: false,
            pending: Vec::new(),
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let router = router.clone();
            let connection = Arc::clone(&connection);
            connection.in_flight.fetch_add(1, Ordering::SeqCst);
            let request = request.map(|incoming| {
                Body::new(TimedBody {
                    inner: incoming,
                    timeout: limits.request_timeout,
                    timer: Box::pin(tokio::time::sleep(limits.request_timeout)),
                    armed: false,
                })
            });
            async move {
                let response = router
                    .oneshot(request)
                    .await
                    .unwrap_or_else(|never: Infallible| match never {});
                Ok::<_, Infallible>(response.map(|body| TrackedBody {
                    inner: body,
                    connection: Some(connection),
                }))
            }
        });
        let served =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service);
        let watched = graceful.watch(served);
        let open = Arc::clone(&stop.inner);
        open.open.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            if let Err(error) = watched.await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
            open.open.fetch_sub(1, Ordering::SeqCst);
            open.closed.notify_waiters();
        });
    }
    // Every open connection closes after the reply it is sending.
    drop(graceful.shutdown());
}

/// How long a refused connection's request head is waited for before the refusal is written
/// anyway, and for how long what it sends after the refusal is read.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);

/// The most of a refused connection's request head read before the refusal is written.
const REFUSAL_HEAD_BYTES: usize = 16 * 1024;

/// Answers a connection past the limit with 503 and closes it. The request head is read first
/// (for at most [`REFUSAL_WAIT`]): an HTTP client that gets a reply before it has sent its
/// request reports a broken connection instead of the 503 and its `Retry-After`. What the
/// client sends after the reply is read for a moment too, so that it reads the reply instead of
/// a reset.
async fn refuse(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    let read_head = async {
        while !head.windows(4).any(|window| window == b"\r\n\r\n")
            && head.len() < REFUSAL_HEAD_BYTES
        {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(read) => head.extend_from_slice(&chunk[..read]),
            }
        }
        true
    };
    if let Ok(false) = tokio::time::timeout(REFUSAL_WAIT, read_head).await {
        // The client went away before its request was complete: nobody to answer.
        return;
    }
    let _ = stream.write_all(&too_many_connections_reply()).await;
    let _ = stream.shutdown().await;
    let drain = async {
        while let Ok(read) = stream.read(&mut chunk).await {
            if read == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_WAIT, drain).await;
}

/// Whether an error a request body read ended with is a stalled body.
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = current {
        if error.is::<BodyTimedOut>() {
            return true;
        }
        current = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_librarys_empty_error_replies_get_the_envelope() {
        let hyper_431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let reply =
            String::from_utf8(library_reply(hyper_431).unwrap_or_default()).unwrap_or_default();
        assert!(reply.starts_with("HTTP/1.1 431 "));
        assert!(reply.contains("\"code\":\"invalid_request\""));
        assert!(reply.contains("connection: close"));
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 80\r\n\r\n";
        assert_eq!(library_reply(ours), None);
        assert_eq!(
            library_reply(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"),
            None
        );
    }

    #[test]
    fn a_stalled_body_is_recognised_through_its_wrappers() {
        let wrapped = axum::Error::new(BodyTimedOut);
        assert!(is_body_timeout(&wrapped));
        let other = io::Error::other("reset");
        assert!(!is_body_timeout(&other));
    }
}
