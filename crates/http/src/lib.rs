//! The HTTP edge of the LMSP service: routes of API.md mapped to the app's use cases.
//!
//! [`router`] builds the whole API over an [`AppState`]; it can be driven with `oneshot` in tests
//! without binding a port. No business rule lives here: handlers parse, call a use case, render.

pub mod error;
pub mod extract;
mod routes;
pub mod wire;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use lmsp_app::Service;
use lmsp_domain::ports::ModelFiles;

pub use routes::IdempotencyLocks;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The use cases.
    pub service: Service,
    /// Model files (registration).
    pub model_files: Arc<dyn ModelFiles>,
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

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/health", get(routes::health))
        .route("/v1/service", get(routes::service_info))
        .route("/v1/responses", post(routes::create_response))
        .route("/v1/responses/{id}", get(routes::get_response))
        .route("/v1/tasks", get(routes::list_tasks))
        .route("/v1/tasks/{id}", get(routes::get_task))
        .route("/v1/tasks/{id}/cancel", post(routes::cancel_task))
        .route("/v1/tasks/{id}/events", get(routes::task_events))
        .route(
            "/v1/models",
            get(routes::list_models).post(routes::create_model),
        )
        .route(
            "/v1/models/{id}",
            get(routes::get_model).delete(routes::delete_model),
        )
        .route("/v1/pairings", post(routes::create_pairing))
        .route("/v1/pair", post(routes::pair))
        .route("/v1/clients", get(routes::list_clients))
        .route(
            "/v1/clients/{id}",
            axum::routing::delete(routes::delete_client),
        )
        .fallback(routes::unknown_route)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .with_state(state)
}
