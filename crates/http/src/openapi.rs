//! The OpenAPI 3.1 document of `GET /v1/openapi.json`: its frame (info, bearer scheme, tags,
//! reusable error replies) and the schemas of the domain's enumerations.
//!
//! The operations come from the `#[utoipa::path]` of each handler in `routes/`, gathered by the
//! route table in `lib.rs` that also builds the router, so what is served and what is documented
//! are one list. The body schemas are derived from the structs of `wire/` and `error.rs`;
//! the enumerations below are built from the domain's own lists (`TaskStatus::ALL`, …).

use std::sync::OnceLock;

use serde_json::Value;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, KnownFormat, Object, ObjectBuilder, OneOfBuilder, Schema,
    SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{Modify, OpenApi, ToResponse};

use strum::VariantArray;

use lmsp_domain::auth::Scope;
use lmsp_domain::{
    ClientId, ResponseId, RestartPolicy, ServiceId, ServiceTier, TaskErrorCode, TaskId, TaskStatus,
};

use crate::error::{ErrorCode, ErrorEnvelope};

/// The name of the bearer security scheme in the document.
pub const BEARER: &str = "bearer";

/// The frame of the document; [`crate::openapi`] adds every route's operation to it.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "LMSP 1.0 local model service",
        description = "Paired clients submit inference work; the service runs it asynchronously \
            and keeps every task, event, response, key and client in one embedded database.\n\n\
            Conventions: JSON bodies with `Content-Type: application/json` (else 415), \
            at most 2 MiB (else 413); unknown request fields are 400; every list is \
            `{\"object\": \"list\", \"data\": [...], \"has_more\": bool}`; timestamps are RFC 3339 \
            UTC with milliseconds; a malformed or unknown id is 404 `not_found`; a method a path \
            does not serve is 405 with the error envelope. Every error is \
            `{\"error\": {\"code\", \"message\", \"param\", \"type\"}}`.\n\n\
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
            ServiceUnavailable,
            StorageUnavailable
        )
    ),
    tags(
        (name = "service", description = "Health, the service object and this document."),
        (name = "responses", description = "Submitting work and reading its responses, \
            OpenAI-compatible."),
        (name = "chat", description = "Chat completions, OpenAI-compatible."),
        (name = "tasks", description = "Tasks, their cancel, and their event logs."),
        (name = "models", description = "Registered models."),
        (name = "clients", description = "Pairing and clients."),
        (name = "files", description = "Files: batch input uploads, batch output and error \
            files (OpenAI's Files API)."),
        (name = "batches", description = "Batches of requests run as durable tasks (OpenAI's \
            Batch API)."),
        (name = "webhooks", description = "Webhook endpoints and their deliveries (Standard \
            Webhooks, as OpenAI sends them).")
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

/// 503 `service_unavailable` (the service is shutting down and takes no new work) or
/// `storage_unavailable` (the store cannot commit now); both with `Retry-After`.
#[derive(Debug, ToResponse)]
#[response(headers(("Retry-After" = u64, description = "Seconds to wait before trying again.")))]
pub struct ServiceUnavailable(pub ErrorEnvelope);

/// 503 `storage_unavailable`: the store cannot commit now (disk full, I/O error, database
/// unreachable).
#[derive(Debug, ToResponse)]
#[response(headers(("Retry-After" = u64, description = "Seconds to wait before trying again.")))]
pub struct StorageUnavailable(pub ErrorEnvelope);

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
    one_of_names(TaskStatus::ALL.iter().map(|s| s.as_str()))
}

/// A service tier.
pub fn service_tier() -> Object {
    one_of_names(ServiceTier::ALL.iter().map(|tier| tier.as_str()))
}

/// A restart policy.
pub fn restart_policy() -> Object {
    one_of_names(RestartPolicy::ALL.iter().map(|p| p.as_str()))
}

/// A restart policy or `null` (the service default).
pub fn nullable_restart_policy() -> Object {
    let mut names: Vec<Value> = RestartPolicy::ALL
        .iter()
        .map(|policy| Value::from(policy.as_str()))
        .collect();
    names.push(Value::Null);
    nullable_string().enum_values(Some(names)).build()
}

/// Every scope name, for a list of scopes.
fn scope_names() -> Object {
    one_of_names(Scope::ALL.iter().map(|s| s.as_str()))
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
    let content = OneOfBuilder::new()
        .item(string())
        .item(
            ArrayBuilder::new().items(
                ObjectBuilder::new()
                    .property("type", one_of_names(["input_text", "output_text"]))
                    .property("text", string())
                    .required("type")
                    .required("text"),
            ),
        )
        .build();
    let message = ObjectBuilder::new()
        .property("type", constant("message"))
        .property(
            "role",
            one_of_names(lmsp_domain::Role::VARIANTS.iter().map(|r| r.as_str())),
        )
        .property("content", Schema::OneOf(content))
        .required("role")
        .required("content")
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .build();
    let one_of = OneOfBuilder::new()
        .item(string().min_length(Some(1)).description(Some("A prompt.")))
        .item(
            ArrayBuilder::new()
                .items(message)
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
    one_of_names([lmsp_domain::QueueReason::ServerRestarted.as_str()])
}

/// A task error code.
pub fn task_error_code() -> Object {
    one_of_names(TaskErrorCode::VARIANTS.iter().map(|code| code.as_str()))
}

/// The code of an error envelope: a request error code, or a task error code (a synchronous
/// request whose task failed).
pub fn error_code() -> Object {
    let mut names: Vec<&'static str> = ErrorCode::VARIANTS.iter().map(|c| c.as_str()).collect();
    for name in TaskErrorCode::VARIANTS.iter().map(|code| code.as_str()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    one_of_names(names)
}

/// The class of an error, as OpenAI's SDKs read it.
pub fn error_type() -> Object {
    one_of_names([
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "rate_limit_error",
        "server_error",
    ])
}

/// How an output item was closed.
pub fn item_status() -> Object {
    one_of_names(["completed", "incomplete"])
}

/// Where an output item is.
pub fn item_progress() -> Object {
    one_of_names(["in_progress", "completed", "incomplete"])
}

/// The status of a response object.
pub fn response_status() -> Object {
    one_of_names(["queued", "in_progress", "completed", "failed", "cancelled"])
}

/// The plain-text output format.
pub fn text_format_type() -> Object {
    constant("text")
}

/// `response.deleted`.
pub fn deleted_tag() -> Object {
    constant("response.deleted")
}

/// `assistant`.
pub fn assistant_role() -> Object {
    constant("assistant")
}

/// Why a chat completion's output ended.
pub fn finish_reason() -> Object {
    one_of_names(["stop", "length"])
}

/// The status of `GET /v1/health`.
pub fn health_status() -> Object {
    one_of_names(["ok", "unavailable"])
}

/// Why health is unavailable.
pub fn health_reason() -> Object {
    constant("storage_unavailable")
}

/// Adds what the route table cannot say to the built document: the path of a model id (which
/// may hold `/`, so the router serves it as a wildcard) under its plain name.
pub fn finish(document: &mut utoipa::openapi::OpenApi) {
    let paths = &mut document.paths.paths;
    if let Some(item) = paths.swap_remove("/v1/models/{*id}") {
        paths.insert(String::from("/v1/models/{id}"), item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_code_schema_names_every_request_and_task_code_once() {
        let schema = error_code();
        let names = schema.enum_values.unwrap_or_default();
        let mut unique = names.clone();
        unique.sort_by_key(|v| v.to_string());
        unique.dedup();
        assert_eq!(names.len(), unique.len());
        for code in ErrorCode::VARIANTS {
            assert!(names.contains(&Value::from(code.as_str())), "{code:?}");
        }
        for code in TaskErrorCode::VARIANTS {
            assert!(names.contains(&Value::from(code.as_str())), "{code:?}");
        }
    }
}
