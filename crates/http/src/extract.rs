//! Request extractors: the bearer token, the `Idempotency-Key` header, and typed JSON bodies
//! with the checks of the contract: `application/json` (else 415), at most 2 MiB (else 413),
//! well-formed, without a duplicate key, of the wire struct's shape (else 400 naming the field).

use std::collections::HashSet;
use std::fmt;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use bytes::BytesMut;
use futures::StreamExt;
use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;

use lmsp_app::Caller;
use lmsp_domain::idempotency::{IdempotencyKey, RequestDigest};

use crate::error::{ApiError, ErrorCode};
use crate::AppState;

/// The body limit.
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

/// Reads and checks an `Idempotency-Key` header.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::new(
            ErrorCode::InvalidIdempotencyKey,
            "an idempotency key is 1–255 visible ASCII characters",
        )
        .with_param("Idempotency-Key")
    };
    let text = value.to_str().map_err(|_| invalid())?;
    IdempotencyKey::parse(text).map(Some).map_err(|_| invalid())
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
        let chunk = chunk.map_err(|error| {
            if crate::server::is_body_timeout(&error) {
                request_timed_out()
            } else {
                unreadable()
            }
        })?;
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

/// The 408 a body that stalled gets (the connection is closed after it).
fn request_timed_out() -> ApiError {
    let mut error = ApiError::new(ErrorCode::InvalidRequest, "the request body stalled");
    error.status = axum::http::StatusCode::REQUEST_TIMEOUT;
    error
}

async fn drain_stream(mut stream: BodyDataStream, mut drained: usize) {
    while drained <= DRAIN_BYTES {
        match stream.next().await {
            Some(Ok(chunk)) => drained += chunk.len(),
            _ => return,
        }
    }
}

/// Whether the request's `Content-Type` says its body is JSON.
pub fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// A JSON body parsed into the wire struct `T`, with its canonical digest for idempotency.
#[derive(Debug, Clone)]
pub struct JsonBody<T> {
    /// The parsed body.
    pub value: T,
    bytes: Bytes,
}

impl<T> JsonBody<T> {
    /// The SHA-256 of the body's canonical JSON (keys sorted, no insignificant whitespace).
    pub fn digest(&self) -> RequestDigest {
        BodyDigest(self.bytes.clone()).compute()
    }

    /// The parsed body, and its digest to compute if it is needed.
    pub fn into_parts(self) -> (T, BodyDigest) {
        (self.value, BodyDigest(self.bytes))
    }
}

/// A body whose digest is computed only when asked: only a request with an idempotency key
/// needs it (a second parse, the canonical form and a SHA-256 that the others skip).
#[derive(Debug, Clone)]
pub struct BodyDigest(Bytes);

impl BodyDigest {
    /// The SHA-256 of the body's canonical JSON (keys sorted, no insignificant whitespace).
    pub fn compute(&self) -> RequestDigest {
        let canonical = serde_json::from_slice::<serde_json::Value>(&self.0)
            .map(|value| canonical_json(&value))
            .unwrap_or_default();
        RequestDigest::of_canonical(canonical.as_bytes())
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let json = is_json(request.headers());
        let body = request.into_body();
        if !json {
            drain_stream(body.into_data_stream(), 0).await;
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be application/json",
            ));
        }
        let bytes = read_limited(body).await?;
        let value = parse_json(&bytes)?;
        Ok(JsonBody { value, bytes })
    }
}

/// Parses a JSON body into `T`: a syntax error, a duplicate key or a wrong shape is a 400 naming
/// the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Err(error) = check_duplicate_keys(bytes) {
        return Err(match error {
            JsonProblem::Duplicate { path, key } => ApiError::invalid(
                &join_param(&path, &key),
                format!("the body has the key `{key}` twice"),
            ),
            JsonProblem::Syntax(message) => ApiError::new(
                ErrorCode::InvalidRequest,
                format!("the body is not valid JSON: {message}"),
            ),
        });
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().to_string();
        let message = error.inner().to_string();
        let param = param_of(&path, &message);
        let mut api = ApiError::new(ErrorCode::InvalidRequest, tidy(&message));
        api.param = param;
        api
    })
}

fn join_param(path: &str, key: &str) -> String {
    if path.is_empty() || path == "." {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// The field an error names: its path, completed by the field an unknown/missing-field error
/// names in its message.
fn param_of(path: &str, message: &str) -> Option<String> {
    let named = ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next());
    match named {
        // An unknown field is already the last segment of the path serde_path_to_error reports.
        Some(field) if path == field || path.ends_with(&format!(".{field}")) => {
            Some(path.to_owned())
        }
        Some(field) => Some(join_param(path, field)),
        None if path.is_empty() || path == "." => None,
        None => Some(path.to_owned()),
    }
}

/// serde's message without its position suffix (` at line 1 column 42`).
fn tidy(message: &str) -> String {
    match message.find(" at line ") {
        Some(index) => message[..index].to_owned(),
        None => message.to_owned(),
    }
}

/// What a body's JSON is wrong with, found before it is parsed into its struct.
#[derive(Debug)]
enum JsonProblem {
    Syntax(String),
    Duplicate { path: String, key: String },
}

/// Walks the JSON once, refusing an object with a key twice (serde would keep the last).
fn check_duplicate_keys(bytes: &[u8]) -> Result<(), JsonProblem> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let mut found = None;
    let walked = Walk {
        path: String::new(),
        found: &mut found,
    }
    .deserialize(&mut deserializer)
    .and_then(|()| deserializer.end());
    match (found, walked) {
        (Some(duplicate), _) => Err(duplicate),
        (None, Err(error)) => Err(JsonProblem::Syntax(tidy(&error.to_string()))),
        (None, Ok(())) => Ok(()),
    }
}

struct Walk<'a> {
    path: String,
    found: &'a mut Option<JsonProblem>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        loop {
            let path = format!("{}[{index}]", self.path);
            let seed = Walk {
                path,
                found: &mut *self.found,
            };
            if seq.next_element_seed(seed)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key.clone()) && self.found.is_none() {
                *self.found = Some(JsonProblem::Duplicate {
                    path: self.path.clone(),
                    key: key.clone(),
                });
            }
            let seed = Walk {
                path: join_param(&self.path, &key),
                found: &mut *self.found,
            };
            map.next_value_seed(seed)?;
        }
        Ok(())
    }
}

/// The canonical JSON of a value: object keys sorted by their bytes, no insignificant
/// whitespace, strings and numbers as `serde_json` writes them. Written out here rather than
/// left to `Value::to_string`, whose key order depends on whether any crate in the build turns on
/// `serde_json`'s `preserve_order` feature.
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn write(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(fields) => {
                let mut keys: Vec<&String> = fields.keys().collect();
                keys.sort();
                out.push('{');
                for (index, key) in keys.into_iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(key.clone()).to_string());
                    out.push(':');
                    if let Some(field) = fields.get(key) {
                        write(field, out);
                    }
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            leaf => out.push_str(&leaf.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        model: String,
        items: Option<Vec<Item>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        role: String,
    }

    fn param(body: &str) -> Option<String> {
        parse_json::<Sample>(body.as_bytes()).unwrap_err().param
    }

    /// I-9: each way a body can be wrong names the field at fault.
    #[test]
    fn a_bad_body_names_its_field_i9() {
        assert_eq!(param(r#"{"items": []}"#).as_deref(), Some("model"));
        assert_eq!(param(r#"{"model": 7}"#).as_deref(), Some("model"));
        assert_eq!(param(r#"{"model": "m", "x": 1}"#).as_deref(), Some("x"));
        assert_eq!(
            param(r#"{"model": "m", "items": [{"role": "u"}, {"role": 1}]}"#).as_deref(),
            Some("items[1].role")
        );
        assert_eq!(
            param(r#"{"model": "m", "items": [{"role": "u", "name": 1}]}"#).as_deref(),
            Some("items[0].name")
        );
        assert_eq!(
            param(r#"{"model": "a", "model": "b"}"#).as_deref(),
            Some("model")
        );
        assert_eq!(
            param(r#"{"model": "m", "items": [{"role": "a", "role": "b"}]}"#).as_deref(),
            Some("items[0].role")
        );
        assert_eq!(param("{\"model\": "), None);
        assert_eq!(param("[]"), None);
    }

    #[test]
    fn a_good_body_parses() {
        let sample: Sample = parse_json(br#"{"model": "m", "items": [{"role": "u"}]}"#).unwrap();
        assert_eq!(sample.model, "m");
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_whitespace() {
        let value: serde_json::Value = serde_json::from_str(
            r#" {"z": {"y": "\u00e9\"", "x": null}, "a": [ {"d": 1.5, "c": true} ]} "#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&value),
            r#"{"a":[{"c":true,"d":1.5}],"z":{"x":null,"y":"é\""}}"#
        );
    }

    #[test]
    fn the_digest_ignores_key_order_and_whitespace() {
        let body = |text: &'static str| JsonBody {
            value: (),
            bytes: Bytes::from_static(text.as_bytes()),
        };
        assert_eq!(
            body(r#"{"b": 1, "a": [1, 2]}"#).digest(),
            body(r#"{"a":[1,2],"b":1}"#).digest()
        );
        assert_ne!(
            body(r#"{"a":[1,2],"b":1}"#).digest(),
            body(r#"{"a":[2,1],"b":1}"#).digest()
        );
    }
}
