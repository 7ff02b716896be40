//! The OpenAPI 3.1 document of `GET /v1/openapi.json`: its frame (info, bearer scheme, tags,
//! reusable error replies) and the schemas of the domain's enumerations.
//!
//! The operations come from the `#[utoipa::path]` of each handler in `routes.rs`, gathered by the
//! route table in `lib.rs` that also builds the router, so what is served and what is documented
//! are one list. The body schemas are derived from the reply structs of `wire.rs` and `error.rs`;
//! the enumerations below are built from the domain's own lists (`TaskStatus::ALL`, …).

use std::sync::OnceLock;

use serde_json::Value;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, KnownFormat, Object, ObjectBuilder, OneOfBuilder, Schema,
    SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{Modify, OpenApi, PartialSchema, ToResponse};

use lmsp_domain::auth::Scope;
use lmsp_domain::{
    ClientId, ErrorCode, QueueReason, ResponseId, RestartPolicy, ServiceId, TaskErrorCode, TaskId,
    TaskStatus,
};

use crate::error::ErrorEnvelope;
use crate::wire::InputMessage;

/// The name of the bearer security scheme in the document.
pub const BEARER: &str = "bearer";

/// The frame of the document; [`crate::openapi`] adds every route's operation to it.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "LMSP 1.0 local model service",
        description = "Paired clients submit inference work; the service runs it asynchronously \
            and keeps every task, event, response, key and client in one embedded database.\n\n\
            Conventions (API.md §2): JSON bodies with `Content-Type: application/json` (else 415), \
            at most 2 MiB (else 413); unknown request fields are 400; every list is \
            `{\"object\": \"list\", \"data\": [...], \"has_more\": bool}`; timestamps are RFC 3339 \
            UTC with milliseconds; a malformed or unknown id is 404 `not_found`; a method a path \
            does not serve is 405 with the error envelope. Every error is \
            `{\"error\": {\"code\", \"message\", \"param\"}}`.\n\n\
            Every operation but `GET /v1/health`, `GET /v1/openapi.json` and `POST /v1/pair` needs \
            `Authorization: Bearer lmsp_…`; the scopes an operation needs are listed in its \
            security requirement (`admin` implies every scope)."
    ),
    modifiers(&BearerScheme),
    components(
        schemas(ErrorEnvelope),
        responses(
            Unauthorized,
            Forbidden,
            PayloadTooLarge,
            UnsupportedMediaType,
            RateLimited,
            InternalError,
            ServiceUnavailable
        )
    ),
    tags(
        (name = "service", description = "Health, the service object and this document."),
        (name = "responses", description = "Submitting work and reading its responses (API.md §4)."),
        (name = "tasks", description = "Tasks, their cancel, and their event logs (API.md §4, §5)."),
        (name = "models", description = "Registered model files (API.md §8)."),
        (name = "clients", description = "Pairing and clients (API.md §3).")
    )
)]
pub struct ApiDoc;

/// Adds the bearer scheme every authenticated operation refers to.
#[derive(Debug)]
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("lmsp_ and 43 base64url characters")
                    .description(Some(
                        "A client token, shown once when created (`lmsp clients add`, \
                         `POST /v1/pair`). The requirement's list names the scopes the \
                         operation needs; `admin` implies all.",
                    ))
                    .build(),
            ),
        );
    }
}

/// 401 `unauthorized`: the bearer token is missing, malformed, unknown or revoked.
#[derive(Debug, ToResponse)]
#[response(headers(("WWW-Authenticate" = String, description = "Always `Bearer`.")))]
pub struct Unauthorized(pub ErrorEnvelope);

/// 403 `forbidden`: the token is valid but lacks the scope.
#[derive(Debug, ToResponse)]
pub struct Forbidden(pub ErrorEnvelope);

/// 413 `payload_too_large`: the body is over 2 MiB.
#[derive(Debug, ToResponse)]
pub struct PayloadTooLarge(pub ErrorEnvelope);

/// 415 `unsupported_media_type`: the body is not `application/json`.
#[derive(Debug, ToResponse)]
pub struct UnsupportedMediaType(pub ErrorEnvelope);

/// 429 `rate_limited`: too many wrong pairing codes; every outstanding code is burnt.
#[derive(Debug, ToResponse)]
#[response(headers(("Retry-After" = u64, description = "Seconds until the window has passed.")))]
pub struct RateLimited(pub ErrorEnvelope);

/// 500 `internal_error`: the service failed to answer; details are logged, never sent.
#[derive(Debug, ToResponse)]
pub struct InternalError(pub ErrorEnvelope);

/// 503 `service_unavailable`: the service is shutting down and takes no new work.
#[derive(Debug, ToResponse)]
pub struct ServiceUnavailable(pub ErrorEnvelope);

/// The document as JSON, built once.
pub fn document_json() -> Option<&'static str> {
    static DOCUMENT: OnceLock<Option<String>> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| match crate::openapi().to_pretty_json() {
            Ok(text) => Some(text),
            Err(error) => {
                tracing::error!(%error, "the OpenAPI document could not be rendered");
                None
            }
        })
        .as_deref()
}

// ---- schemas of domain enumerations and formats, used with `#[schema(schema_with = …)]` ----

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn nullable_string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Null]))
}

fn one_of_names(names: impl IntoIterator<Item = &'static str>) -> Object {
    string().enum_values(Some(names)).build()
}

/// The one string `value`.
pub fn constant(value: &'static str) -> Object {
    one_of_names([value])
}

/// An RFC 3339 UTC timestamp with milliseconds.
pub fn timestamp() -> Object {
    string()
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .examples([Value::from("2026-01-02T03:04:05.678Z")])
        .build()
}

/// A timestamp or `null`.
pub fn nullable_timestamp() -> Object {
    nullable_string()
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .build()
}

fn id_pattern(prefix: &str) -> String {
    format!("^{prefix}[0-9A-HJKMNP-TV-Z]{{26}}$")
}

/// A task id (`task_…`).
pub fn task_id() -> Object {
    string().pattern(Some(id_pattern(TaskId::PREFIX))).build()
}

/// A response id (`resp_…`).
pub fn response_id() -> Object {
    string()
        .pattern(Some(id_pattern(ResponseId::PREFIX)))
        .build()
}

/// A response id or `null`.
pub fn nullable_response_id() -> Object {
    nullable_string()
        .pattern(Some(id_pattern(ResponseId::PREFIX)))
        .build()
}

/// A client id (`cli_…`).
pub fn client_id() -> Object {
    string().pattern(Some(id_pattern(ClientId::PREFIX))).build()
}

/// The service id (`svc_…`).
pub fn service_id() -> Object {
    string()
        .pattern(Some(id_pattern(ServiceId::PREFIX)))
        .build()
}

/// A task status.
pub fn task_status() -> Object {
    one_of_names(TaskStatus::ALL.map(TaskStatus::as_str))
}

/// A restart policy.
pub fn restart_policy() -> Object {
    one_of_names(RestartPolicy::ALL.map(RestartPolicy::as_str))
}

/// A restart policy or `null` (the service default).
pub fn nullable_restart_policy() -> Object {
    let mut names: Vec<Value> = RestartPolicy::ALL
        .map(|policy| Value::from(policy.as_str()))
        .to_vec();
    names.push(Value::Null);
    nullable_string().enum_values(Some(names)).build()
}

/// Every scope name, for a list of scopes.
fn scope_names() -> Object {
    one_of_names(Scope::ALL.map(Scope::as_str))
}

/// A list of scope names.
pub fn scopes() -> ArrayBuilder {
    ArrayBuilder::new().items(scope_names()).unique_items(true)
}

/// A non-empty list of scope names (request bodies).
pub fn scopes_request() -> ArrayBuilder {
    scopes().min_items(Some(1))
}

/// `input` of `POST /v1/responses`: a non-empty prompt, or a non-empty list of messages.
pub fn response_input() -> Schema {
    let one_of = OneOfBuilder::new()
        .item(string().min_length(Some(1)).description(Some("A prompt.")))
        .item(
            ArrayBuilder::new()
                .items(InputMessage::schema())
                .min_items(Some(1))
                .description(Some("A conversation.")),
        )
        .build();
    Schema::OneOf(one_of)
}

/// `metadata` of `POST /v1/responses`: at most 16 string pairs, or `null`.
pub fn metadata_request() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .max_properties(Some(lmsp_domain::validation::MAX_METADATA_PAIRS))
        .property_names(Some(
            string()
                .min_length(Some(1))
                .max_length(Some(lmsp_domain::validation::MAX_METADATA_KEY_CHARS)),
        ))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
            string()
                .max_length(Some(lmsp_domain::validation::MAX_METADATA_VALUE_CHARS))
                .build(),
        )))))
        .build()
}

/// Why a task went back to the queue.
pub fn queue_reason() -> Object {
    one_of_names(
        every(QueueReason::ServerRestarted, next_queue_reason)
            .into_iter()
            .map(|reason| match reason {
                QueueReason::ServerRestarted => "server_restarted",
            }),
    )
}

/// A task error code.
pub fn task_error_code() -> Object {
    one_of_names(
        every_task_error_code()
            .into_iter()
            .map(TaskErrorCode::as_str),
    )
}

/// The code of an error envelope: a request error code, or a task error code (synchronous
/// `POST /v1/responses` whose task failed).
pub fn error_code() -> Object {
    let mut names: Vec<&'static str> = every(ErrorCode::InvalidRequest, next_error_code)
        .into_iter()
        .map(ErrorCode::as_str)
        .collect();
    for name in every_task_error_code()
        .into_iter()
        .map(TaskErrorCode::as_str)
    {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    one_of_names(names)
}

fn every_task_error_code() -> Vec<TaskErrorCode> {
    every(TaskErrorCode::ServerRestarted, next_task_error_code)
}

/// `first` and its successors, in order (a successor seen already ends the chain).
fn every<T: Copy + PartialEq>(first: T, next: fn(T) -> Option<T>) -> Vec<T> {
    let mut all = vec![first];
    let mut current = first;
    while let Some(following) = next(current).filter(|n| !all.contains(n)) {
        all.push(following);
        current = following;
    }
    all
}

// The domain has no list of these enums' variants; these chains are exhaustive matches, so a
// variant added to the domain does not compile until it is chained in (and so documented).

const fn next_queue_reason(reason: QueueReason) -> Option<QueueReason> {
    match reason {
        QueueReason::ServerRestarted => None,
    }
}

const fn next_task_error_code(code: TaskErrorCode) -> Option<TaskErrorCode> {
    match code {
        TaskErrorCode::ServerRestarted => Some(TaskErrorCode::ModelNotFound),
        TaskErrorCode::ModelNotFound => Some(TaskErrorCode::ModelUnavailable),
        TaskErrorCode::ModelUnavailable => Some(TaskErrorCode::ModelDigestMismatch),
        TaskErrorCode::ModelDigestMismatch => Some(TaskErrorCode::EngineError),
        TaskErrorCode::EngineError => Some(TaskErrorCode::Timeout),
        TaskErrorCode::Timeout => None,
    }
}

const fn next_error_code(code: ErrorCode) -> Option<ErrorCode> {
    match code {
        ErrorCode::InvalidRequest => Some(ErrorCode::InvalidIdempotencyKey),
        ErrorCode::InvalidIdempotencyKey => Some(ErrorCode::Unauthorized),
        ErrorCode::Unauthorized => Some(ErrorCode::Forbidden),
        ErrorCode::Forbidden => Some(ErrorCode::NotFound),
        ErrorCode::NotFound => Some(ErrorCode::ModelNotFound),
        ErrorCode::ModelNotFound => Some(ErrorCode::TaskNotCancellable),
        ErrorCode::TaskNotCancellable => Some(ErrorCode::TaskCancelled),
        ErrorCode::TaskCancelled => Some(ErrorCode::IdempotencyKeyInUse),
        ErrorCode::IdempotencyKeyInUse => Some(ErrorCode::AlreadyExists),
        ErrorCode::AlreadyExists => Some(ErrorCode::PayloadTooLarge),
        ErrorCode::PayloadTooLarge => Some(ErrorCode::UnsupportedMediaType),
        ErrorCode::UnsupportedMediaType => Some(ErrorCode::IdempotencyKeyReused),
        ErrorCode::IdempotencyKeyReused => Some(ErrorCode::RateLimited),
        ErrorCode::RateLimited => Some(ErrorCode::ServiceUnavailable),
        ErrorCode::ServiceUnavailable => Some(ErrorCode::InternalError),
        ErrorCode::InternalError => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_chains_reach_every_code_once() {
        let codes = every(ErrorCode::InvalidRequest, next_error_code);
        let mut names: Vec<_> = codes.iter().map(|code| code.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 16);
        assert_eq!(every_task_error_code().len(), 6);
    }

    #[test]
    fn queue_reasons_are_named_as_they_serialise() {
        for reason in every(QueueReason::ServerRestarted, next_queue_reason) {
            let named = queue_reason();
            let value = serde_json::to_value(reason).ok();
            assert!(named
                .enum_values
                .as_ref()
                .is_some_and(|names| value.is_some_and(|v| names.contains(&v))));
        }
    }
}
