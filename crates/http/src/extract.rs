//! Request extractors: the bearer token, and JSON bodies with the checks of API.md §2.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::StatusCode;
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

/// A JSON body: `application/json` (else 415), at most 2 MiB (else 413), well-formed (else 400).
#[derive(Debug, Clone)]
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be application/json",
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(ErrorCode::PayloadTooLarge, "the body is over 2 MiB")
                } else {
                    ApiError::new(ErrorCode::InvalidRequest, "the body could not be read")
                }
            })?;
        let value = serde_json::from_slice(&bytes).map_err(|error| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("the body is not valid JSON: {error}"),
            )
        })?;
        Ok(JsonBody(value))
    }
}
