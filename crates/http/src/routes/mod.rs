//! The handlers: parse, call a use case, render. One function per route, by resource.
//!
//! Each handler's `#[utoipa::path]` is its OpenAPI operation: method, path, security, parameters,
//! bodies, every status and header. The route table in `lib.rs` registers a handler through it,
//! so a route cannot be served without being documented, nor documented without being served.

pub mod batches;
pub mod chat;
pub mod clients;
pub mod models;
pub mod responses;
pub mod service;
pub mod submit;
pub mod tasks;
pub mod webhooks;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use lmsp_domain::{ResponseId, TaskId};

use crate::error::ApiError;

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

/// A task id from a path: a malformed one is a 404, like an unknown one.
pub fn parse_task_id(text: &str) -> ApiResult<TaskId> {
    TaskId::parse(text).map_err(|_| ApiError::not_found())
}

/// A response id from a path.
pub fn parse_response_id(text: &str) -> ApiResult<ResponseId> {
    ResponseId::parse(text).map_err(|_| ApiError::not_found())
}

/// A JSON reply with a status.
pub fn json_reply(status: StatusCode, body: impl Serialize) -> Response {
    (status, Json(body)).into_response()
}

/// A sequence number from a query or header.
pub fn parse_sequence(text: &str, param: &str) -> ApiResult<u64> {
    text.trim()
        .parse::<u64>()
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be a sequence number")))
}

/// A boolean query flag (`true`/`false`, `1`/`0`).
pub fn parse_flag(text: &str, param: &str) -> ApiResult<bool> {
    match text {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::invalid(
            param,
            format!("`{param}` must be true or false"),
        )),
    }
}
