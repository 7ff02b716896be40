//! Serving the router over HTTP/1.1: one task per connection, no HTTP/2 machinery.
//!
//! LMSP speaks HTTP/1.1 (SSE included), so each connection runs hyper's HTTP/1 state machine
//! alone instead of the auto-detecting HTTP/1 + HTTP/2 one: an open connection then costs about
//! half the memory, which is what bounds 10 000 open event streams.

use std::convert::Infallible;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Accepts connections on `listener` and serves `router` on each until the task is dropped.
/// A failed accept (e.g. out of file descriptors) is logged and retried after a short pause.
pub async fn serve(listener: TcpListener, router: Router) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small replies go out at once instead of waiting for more to send.
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let router = router.clone();
                async move {
                    Ok::<_, Infallible>(
                        router
                            .oneshot(request.map(axum::body::Body::new))
                            .await
                            .unwrap_or_else(|never| match never {}),
                    )
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
}
