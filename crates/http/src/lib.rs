//! The HTTP edge of the LMSP service: routes of API.md mapped to the app's use cases.
//!
//! [`router`] builds the whole API over an [`AppState`]; it can be driven with `oneshot` in tests
//! without binding a port. No business rule lives here: handlers parse, call a use case, render.
//! [`openapi`] documents exactly the routes [`router`] serves: both come from one route table.

pub mod error;
pub mod extract;
pub mod openapi;
mod routes;
pub mod server;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use lmsp_app::Service;

type Request = axum::http::Request<axum::body::Body>;
type Response = axum::http::Response<axum::body::Body>;

pub use routes::IdempotencyLocks;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The use cases.
    pub service: Service,
    /// Idempotency keys whose first request is still being answered.
    pub in_flight: Arc<IdempotencyLocks>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// The route table: every route of the API with its OpenAPI operation (the handler's
/// `#[utoipa::path]`). [`router`] serves these routes and [`openapi`] documents them. Add a route
/// here, never with a plain `Router::route`: that one would be served but not documented, which
/// `tests/openapi.rs` catches for every path of API.md.
fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(routes::health))
        .routes(routes!(routes::openapi_json))
        .routes(routes!(routes::service_info))
        .routes(routes!(routes::create_response))
        .routes(routes!(routes::get_response))
        .routes(routes!(routes::list_tasks))
        .routes(routes!(routes::get_task))
        .routes(routes!(routes::cancel_task))
        .routes(routes!(routes::task_events))
        .routes(routes!(routes::list_models, routes::create_model))
        .routes(routes!(routes::get_model, routes::delete_model))
        .routes(routes!(routes::metrics))
        .routes(routes!(routes::create_pairing))
        .routes(routes!(routes::pair))
        .routes(routes!(routes::list_clients))
        .routes(routes!(routes::delete_client))
}

/// The OpenAPI 3.1 document of the routes [`router`] serves (`GET /v1/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().into_openapi()
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let (served, _document) = api().split_for_parts();
    // One log line per request: method, path (never the query or a header, so never a token),
    // status and latency (for a stream: until its headers).
    let request_log = TraceLayer::new_for_http()
        .make_span_with(request_span)
        .on_request(())
        .on_response(log_answer)
        .on_body_chunk(())
        .on_eos(())
        .on_failure(());
    served
        .fallback(routes::unknown_route)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .layer(request_log)
        .with_state(state)
}

fn request_span(request: &Request) -> tracing::Span {
    tracing::info_span!("request", method = %request.method(), path = %request.uri().path())
}

fn log_answer(response: &Response, latency: Duration, _span: &tracing::Span) {
    tracing::info!(
        status = response.status().as_u16(),
        latency_us = latency.as_micros() as u64,
        "answered"
    );
}
