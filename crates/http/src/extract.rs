//! Request extractors: the bearer token, and JSON bodies with the checks of API.md §2.

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use bytes::BytesMut;
use futures::StreamExt;
use serde_json::Value;

use lmsp_app::Caller;
use lmsp_domain::ErrorCode;

use crate::error::ApiError;
use crate::AppState;

/// The body limit of API.md §2.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Authed(pub Caller);

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let unauthorized =
            || ApiError::new(ErrorCode::Unauthorized, "a valid bearer token is required");
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(unauthorized)?;
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        let token = header
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
            .ok_or_else(unauthorized)?;
        let caller = state
            .service
            .authenticate(token.trim())
            .await
            .map_err(ApiError::from)?;
        Ok(Authed(caller))
    }
}

/// How much of a refused body is read and thrown away before the reply, so that the client, still
/// sending, reads the 413/415 instead of a connection reset (closing a socket with unread data
/// resets it). Past this the connection is simply closed.
const DRAIN_BYTES: usize = 64 * 1024 * 1024;

/// Reads a body of at most [`MAX_BODY_BYTES`]; a larger one is drained and refused with 413.
async fn read_limited(body: Body) -> Result<Bytes, ApiError> {
    let unreadable = || ApiError::new(ErrorCode::InvalidRequest, "the body could not be read");
    let mut stream = body.into_data_stream();
    let mut bytes = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| unreadable())?;
        if bytes.len() + chunk.len() > MAX_BODY_BYTES {
            drain_stream(stream, chunk.len()).await;
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                "the body is over 2 MiB",
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.freeze())
}

/// Reads and discards a body, up to [`DRAIN_BYTES`].
async fn drain(body: Body) {
    drain_stream(body.into_data_stream(), 0).await;
}

async fn drain_stream(mut stream: BodyDataStream, mut drained: usize) {
    while drained <= DRAIN_BYTES {
        match stream.next().await {
            Some(Ok(chunk)) => drained += chunk.len(),
            _ => return,
        }
    }
}

/// A JSON body: `application/json` (else 415), at most 2 MiB (else 413), well-formed (else 400).
#[derive(Debug, Clone)]
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
        let body = request.into_body();
        if !is_json {
            drain(body).await;
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be application/json",
            ));
        }
        let bytes = read_limited(body).await?;
        let value = serde_json::from_slice(&bytes).map_err(|error| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("the body is not valid JSON: {error}"),
            )
        })?;
        Ok(JsonBody(value))
    }
}
