//! The HTTP edge of the LMSP service: the routes of the API mapped to the app's use cases —
//! LMSP's own task API and the OpenAI-compatible Responses and chat completions — the two
//! renderings of a task's log as Server-Sent Events, the error envelope, and the HTTP/1.1 server
//! with its timeouts and connection limit.
//!
//! [`router`] builds the whole API over an [`AppState`]; it can be driven with `oneshot` in tests
//! without binding a port. No business rule lives here: handlers parse, call a use case, render.
//! [`openapi`] documents exactly the routes [`router`] serves: both come from one route table.
//! [`router`] also mounts the web console (`lmsp_console::router`, static files under
//! `/console/`), which is not API and so not documented.

pub mod error;
pub mod extract;
pub mod openapi;
pub mod replies;
mod routes;
pub mod server;
pub mod sse;
pub mod wire;

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

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The use cases.
    pub service: Service,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("service", &self.service)
            .finish()
    }
}

/// The route table: every route of the API with its OpenAPI operation (the handler's
/// `#[utoipa::path]`). [`router`] serves these routes and [`openapi`] documents them. Add a route
/// here, never with a plain `Router::route`: that one would be served but not documented, which
/// `tests/openapi.rs` catches.
fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(routes::service::health))
        .routes(routes!(routes::service::openapi_json))
        .routes(routes!(routes::service::service_info))
        .routes(routes!(routes::service::metrics))
        .routes(routes!(routes::responses::create_response))
        .routes(routes!(
            routes::responses::get_response,
            routes::responses::delete_response
        ))
        .routes(routes!(routes::responses::cancel_response))
        .routes(routes!(routes::responses::list_input_items))
        .routes(routes!(routes::chat::create_chat_completion))
        .routes(routes!(routes::tasks::list_tasks))
        .routes(routes!(routes::tasks::get_task))
        .routes(routes!(routes::tasks::cancel_task))
        .routes(routes!(routes::tasks::task_events))
        .routes(routes!(
            routes::models::list_models,
            routes::models::create_model
        ))
        .routes(routes!(
            routes::models::get_model,
            routes::models::delete_model
        ))
        .routes(routes!(routes::clients::create_pairing))
        .routes(routes!(routes::clients::pair))
        .routes(routes!(routes::clients::list_clients))
        .routes(routes!(
            routes::clients::delete_client,
            routes::clients::update_client
        ))
        .routes(routes!(
            routes::batches::create_file,
            routes::batches::list_files
        ))
        .routes(routes!(
            routes::batches::get_file,
            routes::batches::delete_file
        ))
        .routes(routes!(routes::batches::get_file_content))
        .routes(routes!(
            routes::batches::create_batch,
            routes::batches::list_batches
        ))
        .routes(routes!(routes::batches::get_batch))
        .routes(routes!(routes::batches::cancel_batch))
        .routes(routes!(
            routes::webhooks::create_endpoint,
            routes::webhooks::list_endpoints
        ))
        .routes(routes!(
            routes::webhooks::get_endpoint,
            routes::webhooks::update_endpoint,
            routes::webhooks::delete_endpoint
        ))
        .routes(routes!(routes::webhooks::rotate_secret))
        .routes(routes!(routes::webhooks::test_endpoint))
        .routes(routes!(routes::webhooks::list_deliveries))
}

/// The OpenAPI 3.1 document of the routes [`router`] serves (`GET /v1/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut document = api().into_openapi();
    openapi::finish(&mut document);
    document
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
    // The web console (`/console/…`): static files, no token, not part of the API (so not in
    // the OpenAPI document). It only speaks to the API from the browser.
    served
        .fallback(routes::service::unknown_route)
        .method_not_allowed_fallback(routes::service::method_not_allowed)
        .with_state(state)
        .merge(lmsp_console::router())
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .layer(request_log)
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
