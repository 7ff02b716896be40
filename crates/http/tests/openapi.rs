//! `GET /v1/openapi.json` against the router that serves the API: the document is OpenAPI 3.1,
//! every route the router serves is documented and every documented operation is served, every
//! `$ref` resolves, and real replies have exactly the documented shapes.
//!
//! Streams too: every `data:` of a Responses stream and of a chat completion stream has exactly
//! the shape the `text/event-stream` schema documents, and every shape it documents is sent.
//!
//! The router is driven with `oneshot` over a real service (SQLite in a temp dir, the reference
//! engine), without binding a port.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use lmsp_domain::ports::{Engine, EngineError, EngineHealth, Generation, GenerationJob};
use lmsp_domain::ModelToLoad;

mod support;
use support::{request, send, test_app, test_app_with, Reply, TestApp};

/// A future as `async_trait` boxes it.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An upstream engine whose server does not answer: it reports so as its health.
struct UnreachableUpstream;

const UNREACHABLE: &str = "the upstream does not answer";

impl Engine for UnreachableUpstream {
    fn health<'life0, 'async_trait>(&'life0 self) -> Boxed<'async_trait, EngineHealth>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async { EngineHealth::Unavailable(UNREACHABLE.to_owned()) })
    }

    fn load<'life0, 'life1, 'async_trait>(
        &'life0 self,
        _model: &'life1 ModelToLoad,
    ) -> Boxed<'async_trait, Result<(), EngineError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async { Err(EngineError::UpstreamUnavailable(UNREACHABLE.to_owned())) })
    }

    fn generate<'life0, 'async_trait>(
        &'life0 self,
        _job: GenerationJob,
    ) -> Boxed<'async_trait, Result<Box<dyn Generation>, EngineError>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async { Err(EngineError::UpstreamUnavailable(UNREACHABLE.to_owned())) })
    }
}

async fn document(app: &TestApp) -> Value {
    let reply = send(
        &app.router,
        request(Method::GET, "/v1/openapi.json", None, None),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    reply.body
}

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Every (method, path) of the document.
fn documented_operations(document: &Value) -> BTreeSet<(String, String)> {
    let paths = document["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            METHODS
                .iter()
                .filter(|method| item.get(**method).is_some())
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

/// A concrete URI for a templated path (any id will do: the route must answer, not the id).
fn concrete(path: &str) -> String {
    path.replace("{id}", "x")
}

/// Whether the router serves (method, uri): anything but its 404 fallback and its 405.
async fn served(router: &Router, method: &str, uri: &str) -> bool {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let reply = send(router, request(method, uri, None, None)).await;
    let fallback =
        reply.status == StatusCode::NOT_FOUND && reply.body["error"]["message"] == "no such route";
    !fallback && reply.status != StatusCode::METHOD_NOT_ALLOWED
}

/// Every path of docs/api.md, whether documented yet or not: the reverse check probes these.
const API_PATHS: [&str; 18] = [
    "/v1/health",
    "/v1/openapi.json",
    "/v1/service",
    "/v1/responses",
    "/v1/responses/{id}",
    "/v1/responses/{id}/cancel",
    "/v1/chat/completions",
    "/v1/tasks",
    "/v1/tasks/{id}",
    "/v1/tasks/{id}/cancel",
    "/v1/tasks/{id}/events",
    "/v1/models",
    "/v1/models/{id}",
    "/v1/pairings",
    "/v1/pair",
    "/v1/clients",
    "/v1/clients/{id}",
    "/metrics",
];

#[tokio::test]
async fn the_document_is_openapi_3_1_and_needs_no_token() {
    let app = test_app().await;
    let reply = send(
        &app.router,
        request(Method::GET, "/v1/openapi.json", None, None),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.content_type.starts_with("application/json"));
    let version = reply.body["openapi"].as_str().expect("openapi field");
    assert!(version.starts_with("3.1."), "openapi is {version}");
    assert!(reply.body["info"]["title"].is_string());
    assert!(reply.body["components"]["securitySchemes"]["bearer"].is_object());
}

#[tokio::test]
async fn every_documented_operation_is_served() {
    let app = test_app().await;
    let document = document(&app).await;
    let operations = documented_operations(&document);
    assert!(operations.len() >= 17, "{operations:?}");
    for (method, path) in &operations {
        assert!(
            served(&app.router, method, &concrete(path)).await,
            "{method} {path} is documented but not served"
        );
    }
}

#[tokio::test]
async fn every_served_route_is_documented() {
    let app = test_app().await;
    let document = document(&app).await;
    let operations = documented_operations(&document);
    let mut paths: BTreeSet<String> = API_PATHS.iter().map(|p| (*p).to_owned()).collect();
    paths.extend(operations.iter().map(|(_, path)| path.clone()));
    for path in &paths {
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            let is_served = served(&app.router, method, &concrete(path)).await;
            let is_documented = operations.contains(&(method.to_owned(), path.clone()));
            assert_eq!(
                is_served, is_documented,
                "{method} {path}: served {is_served}, documented {is_documented}"
            );
        }
    }
    for path in API_PATHS {
        assert!(
            operations.iter().any(|(_, documented)| documented == path),
            "{path} of docs/api.md is not documented"
        );
    }
}

#[tokio::test]
async fn every_operation_documents_its_security_and_errors() {
    let app = test_app().await;
    let document = document(&app).await;
    let public: BTreeSet<(String, String)> = [
        ("GET", "/v1/health"),
        ("GET", "/v1/openapi.json"),
        ("POST", "/v1/pair"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    for (method, path) in documented_operations(&document) {
        let operation = &document["paths"][&path][method.to_lowercase()];
        let responses = operation["responses"].as_object().expect("responses");
        if public.contains(&(method.clone(), path.clone())) {
            assert!(
                operation.get("security").is_none(),
                "{method} {path} is public"
            );
        } else {
            let security = operation["security"].as_array().expect("security");
            assert!(
                security.iter().any(|s| s.get("bearer").is_some()),
                "{method} {path} needs a bearer token"
            );
            assert!(responses.contains_key("401"), "{method} {path}: 401");
        }
        assert!(
            responses.keys().any(|status| status.starts_with('2')),
            "{method} {path}: no success status"
        );
        if path != "/v1/health" {
            assert!(responses.contains_key("500"), "{method} {path}: 500");
        }
        if operation.get("requestBody").is_some() {
            for status in ["400", "413", "415"] {
                assert!(responses.contains_key(status), "{method} {path}: {status}");
            }
        }
    }
    let submit = &document["paths"]["/v1/responses"]["post"];
    for status in [
        "200", "202", "400", "401", "403", "404", "409", "413", "415", "422", "500", "503",
    ] {
        assert!(
            submit["responses"].get(status).is_some(),
            "submit: {status}"
        );
    }
    let accepted = &submit["responses"]["202"]["headers"];
    assert!(accepted.get("Location").is_some() && accepted.get("Lmsp-Task-Id").is_some());
    assert!(submit["responses"]["200"]["content"]
        .get("text/event-stream")
        .is_some());
}

/// Every `$ref` in `value`.
fn refs(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                found.push(target.clone());
            }
            map.values().for_each(|v| refs(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
        _ => {}
    }
}

fn resolve<'a>(document: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    document.pointer(pointer)
}

#[tokio::test]
async fn every_reference_in_the_document_resolves() {
    let app = test_app().await;
    let document = document(&app).await;
    let mut found = Vec::new();
    refs(&document, &mut found);
    assert!(!found.is_empty());
    for reference in found {
        assert!(
            resolve(&document, &reference).is_some(),
            "{reference} does not resolve"
        );
    }
}

/// Whether `value` has exactly the shape of `schema`: every key an object sends is one of its
/// documented properties, every required property is sent (`null` only where nullable), and a
/// property that is not required is one the API leaves out when it does not apply.
fn conforms(document: &Value, schema: &Value, value: &Value) -> Result<(), String> {
    if let Some(Value::String(reference)) = schema.get("$ref") {
        let target = resolve(document, reference).ok_or(format!("{reference} unresolved"))?;
        return conforms(document, target, value);
    }
    if !type_fits(schema, value) {
        return Err(format!("{value} is not of type {}", schema["type"]));
    }
    if let Some(Value::Array(variants)) = schema.get("oneOf") {
        let fits = variants
            .iter()
            .filter(|variant| conforms(document, variant, value).is_ok())
            .count();
        return if fits == 1 {
            Ok(())
        } else {
            Err(format!("{value} fits {fits} variants of a oneOf"))
        };
    }
    if let Some(Value::Array(parts)) = schema.get("allOf") {
        // Merge the parts' properties (a struct with a flattened tagged enum).
        let object = value
            .as_object()
            .ok_or(format!("{value} is not an object"))?;
        let mut rest = object.clone();
        for part in parts {
            let part = match part.get("$ref").and_then(Value::as_str) {
                Some(reference) => resolve(document, reference).ok_or("unresolved")?,
                None => part,
            };
            let keys = property_keys(document, part, value)?;
            let own: serde_json::Map<String, Value> = object
                .iter()
                .filter(|(k, _)| keys.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            conforms(document, part, &Value::Object(own))?;
            rest.retain(|k, _| !keys.contains(k));
        }
        return if rest.is_empty() {
            Ok(())
        } else {
            Err(format!("undocumented fields {:?}", rest.keys()))
        };
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        return if allowed.contains(value) {
            Ok(())
        } else {
            Err(format!("{value} is not one of {allowed:?}"))
        };
    }
    if let Some(Value::Object(properties)) = schema.get("properties") {
        let object = value
            .as_object()
            .ok_or(format!("{value} is not an object"))?;
        let documented: BTreeSet<&str> = properties.keys().map(String::as_str).collect();
        let sent: BTreeSet<&str> = object.keys().map(String::as_str).collect();
        let required: BTreeSet<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let undocumented: Vec<&&str> = sent.difference(&documented).collect();
        if !undocumented.is_empty() {
            return Err(format!(
                "sent undocumented {undocumented:?}; documented {documented:?}"
            ));
        }
        let missing: Vec<&&str> = required.difference(&sent).collect();
        if !missing.is_empty() {
            return Err(format!("required {missing:?} not sent; sent {sent:?}"));
        }
        if !required.is_subset(&documented) {
            return Err(format!(
                "required {required:?} names properties not documented: {documented:?}"
            ));
        }
        for (key, property) in properties {
            // A property that is not required may be absent (sent only when it applies).
            let Some(field) = object.get(key) else {
                continue;
            };
            if !(field.is_null() && nullable(property)) {
                conforms(document, property, field).map_err(|e| format!("{key}: {e}"))?;
            }
        }
        return Ok(());
    }
    if let Some(items) = schema.get("items") {
        let array = value.as_array().ok_or(format!("{value} is not an array"))?;
        for item in array {
            conforms(document, items, item)?;
        }
        return Ok(());
    }
    if value.is_null() && !nullable(schema) {
        return Err(String::from("null where the schema allows none"));
    }
    Ok(())
}

/// The property names an object schema (or a oneOf of them, by the variant `value` fits) has.
fn property_keys(document: &Value, schema: &Value, value: &Value) -> Result<Vec<String>, String> {
    if let Some(Value::Object(properties)) = schema.get("properties") {
        return Ok(properties.keys().cloned().collect());
    }
    if let Some(Value::Array(variants)) = schema.get("oneOf") {
        for variant in variants {
            let variant = match variant.get("$ref").and_then(Value::as_str) {
                Some(reference) => resolve(document, reference).ok_or("unresolved")?,
                None => variant,
            };
            let keys = property_keys(document, variant, value)?;
            let own: serde_json::Map<String, Value> = value
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| keys.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if conforms(document, variant, &Value::Object(own)).is_ok() {
                return Ok(keys);
            }
        }
        return Err(format!("{value} fits no variant"));
    }
    Err(String::from("not an object schema"))
}

/// Whether `value`'s JSON type is one the schema's `type` allows (any, when it names none).
fn type_fits(schema: &Value, value: &Value) -> bool {
    let fits = |name: &Value| match name.as_str() {
        Some("null") => value.is_null(),
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    };
    match &schema["type"] {
        Value::Array(types) => types.iter().any(fits),
        Value::Null => true,
        single => fits(single),
    }
}

fn nullable(schema: &Value) -> bool {
    match &schema["type"] {
        Value::Array(types) => types.iter().any(|t| t == "null"),
        Value::String(t) => t == "null",
        _ => schema["oneOf"]
            .as_array()
            .is_some_and(|v| v.iter().any(|s| s["type"] == "null")),
    }
}

/// The JSON schema an operation documents for `status`.
fn documented_schema<'a>(document: &'a Value, method: &str, path: &str, status: &str) -> &'a Value {
    let mut response = &document["paths"][path][method]["responses"][status];
    if let Some(reference) = response.get("$ref").and_then(Value::as_str) {
        response = resolve(document, reference).expect("response ref");
    }
    &response["content"]["application/json"]["schema"]
}

fn assert_conforms(document: &Value, method: &str, path: &str, reply: &Reply) {
    let status = reply.status.as_str();
    let schema = documented_schema(document, method, path, status);
    assert!(
        !schema.is_null(),
        "{method} {path}: status {status} is not documented with a JSON body"
    );
    if let Err(error) = conforms(document, schema, &reply.body) {
        panic!("{method} {path} {status}: {error}\n{}", reply.body);
    }
}

#[tokio::test]
async fn replies_have_exactly_the_documented_shapes() {
    let app = test_app().await;
    let document = document(&app).await;
    let token = Some(app.admin_token.as_str());
    let router = &app.router;

    let reply = send(router, request(Method::GET, "/v1/health", None, None)).await;
    assert_conforms(&document, "get", "/v1/health", &reply);
    let reply = send(router, request(Method::GET, "/v1/service", token, None)).await;
    assert_conforms(&document, "get", "/v1/service", &reply);
    let reply = send(router, request(Method::GET, "/v1/models", token, None)).await;
    assert_conforms(&document, "get", "/v1/models", &reply);
    let reply = send(
        router,
        request(Method::GET, "/v1/models/reference", token, None),
    )
    .await;
    assert_conforms(&document, "get", "/v1/models/{id}", &reply);
    let reply = send(router, request(Method::GET, "/v1/clients", token, None)).await;
    assert_conforms(&document, "get", "/v1/clients", &reply);

    // Synchronous: the response object.
    let body = json!({"model": "reference", "input": "Once upon a time", "max_output_tokens": 8,
        "seed": 7, "metadata": {"k": "v"}});
    let reply = send(
        router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_conforms(&document, "post", "/v1/responses", &reply);
    let response_id = reply.body["id"].as_str().unwrap().to_owned();
    let task_id = reply.body["task_id"].as_str().unwrap().to_owned();
    let reply = send(
        router,
        request(
            Method::GET,
            &format!("/v1/responses/{response_id}"),
            token,
            None,
        ),
    )
    .await;
    assert_conforms(&document, "get", "/v1/responses/{id}", &reply);

    // A finished task and its whole log: created, loading, in_progress, deltas, completed.
    let reply = send(
        router,
        request(Method::GET, &format!("/v1/tasks/{task_id}"), token, None),
    )
    .await;
    assert_conforms(&document, "get", "/v1/tasks/{id}", &reply);
    let reply = send(
        router,
        request(
            Method::GET,
            &format!("/v1/tasks/{task_id}/events"),
            token,
            None,
        ),
    )
    .await;
    assert_conforms(&document, "get", "/v1/tasks/{id}/events", &reply);
    let types: BTreeSet<&str> = reply.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert!(types.contains("response.created") && types.contains("response.completed"));
    let reply = send(router, request(Method::GET, "/v1/tasks", token, None)).await;
    assert_conforms(&document, "get", "/v1/tasks", &reply);

    // Background: 202 with the task; cancel; a finished task's cancel is a 409 envelope.
    let body = json!({"model": "reference", "input": [{"role": "user", "content": "hi"}],
        "background": true, "on_restart": "resume"});
    let reply = send(
        router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    assert_conforms(&document, "post", "/v1/responses", &reply);
    let reply = send(
        router,
        request(
            Method::POST,
            &format!("/v1/tasks/{task_id}/cancel"),
            token,
            None,
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_conforms(&document, "post", "/v1/tasks/{id}/cancel", &reply);

    // Pairing, and the error envelopes of 400, 401, 404.
    let body = json!({"scopes": ["responses:read"]});
    let reply = send(
        router,
        request(Method::POST, "/v1/pairings", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_conforms(&document, "post", "/v1/pairings", &reply);
    let code = reply.body["code"].as_str().unwrap().to_owned();
    let body = json!({"code": code, "name": "laptop", "scopes": ["responses:read"]});
    let reply = send(router, request(Method::POST, "/v1/pair", None, Some(body))).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_conforms(&document, "post", "/v1/pair", &reply);
    let body = json!({"model": "reference", "input": "x", "colour": "blue"});
    let reply = send(
        router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_conforms(&document, "post", "/v1/responses", &reply);
    let reply = send(router, request(Method::GET, "/v1/tasks", None, None)).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_conforms(&document, "get", "/v1/tasks", &reply);
    let reply = send(
        router,
        request(Method::GET, "/v1/tasks/task_nope", token, None),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_conforms(&document, "get", "/v1/tasks/{id}", &reply);
}

#[tokio::test]
async fn openai_and_model_replies_have_exactly_the_documented_shapes() {
    let app = test_app().await;
    let document = document(&app).await;
    let token = Some(app.admin_token.as_str());
    let router = &app.router;

    // Chat completions, not streamed.
    let body = json!({"model": "reference", "max_tokens": 6, "seed": 3,
        "messages": [{"role": "user", "content": "Once upon a time"}]});
    let reply = send(
        router,
        request(Method::POST, "/v1/chat/completions", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_conforms(&document, "post", "/v1/chat/completions", &reply);
    let reply = send(
        router,
        request(Method::POST, "/v1/chat/completions", token, Some(json!({}))),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_conforms(&document, "post", "/v1/chat/completions", &reply);

    // A finished response: its cancel is a 409 envelope; it can be deleted, then it is gone.
    let body = json!({"model": "reference", "input": "hello", "max_output_tokens": 4});
    let reply = send(
        router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let response = format!("/v1/responses/{}", reply.body["id"].as_str().unwrap());
    let reply = send(
        router,
        request(Method::POST, &format!("{response}/cancel"), token, None),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.body);
    assert_conforms(&document, "post", "/v1/responses/{id}/cancel", &reply);
    let reply = send(router, request(Method::DELETE, &response, token, None)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_conforms(&document, "delete", "/v1/responses/{id}", &reply);
    let reply = send(router, request(Method::GET, &response, token, None)).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert_conforms(&document, "get", "/v1/responses/{id}", &reply);

    // Registering a model file of the models directory; an id taken is a 409 envelope.
    std::fs::write(app.models_dir.join("extra.txt"), "a few words of text").unwrap();
    let body = json!({"id": "extra", "path": "extra.txt"});
    let reply = send(
        router,
        request(Method::POST, "/v1/models", token, Some(body.clone())),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_conforms(&document, "post", "/v1/models", &reply);
    let reply = send(
        router,
        request(Method::POST, "/v1/models", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.body);
    assert_conforms(&document, "post", "/v1/models", &reply);
    let reply = send(router, request(Method::GET, "/v1/models/nope", token, None)).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_conforms(&document, "get", "/v1/models/{id}", &reply);
}

/// `GET /v1/service` names the caller's client and scopes, and the engine and its health:
/// `reference`, `ok`, no detail; a service
/// with an upstream engine shows that one (`openai`), `unavailable` with why while its server
/// does not answer. Both replies have exactly the documented shape.
#[tokio::test]
async fn the_service_object_shows_the_engine_and_its_health() {
    let app = test_app().await;
    let document = document(&app).await;
    let token = Some(app.admin_token.as_str());
    let reply = send(
        &app.router,
        request(Method::GET, "/v1/service", token, None),
    )
    .await;
    assert_conforms(&document, "get", "/v1/service", &reply);
    assert_eq!(
        reply.body["engine"],
        json!({"kind": "reference", "status": "ok", "detail": null})
    );
    assert_eq!(reply.body["caller"]["scopes"], json!(["admin"]));
    assert!(reply.body["caller"]["client_id"]
        .as_str()
        .unwrap()
        .starts_with("cli_"));

    let upstream = test_app_with(Some(Arc::new(UnreachableUpstream))).await;
    let token = Some(upstream.admin_token.as_str());
    let reply = send(
        &upstream.router,
        request(Method::GET, "/v1/service", token, None),
    )
    .await;
    assert_conforms(&document, "get", "/v1/service", &reply);
    assert_eq!(
        reply.body["engine"],
        json!({"kind": "openai", "status": "unavailable", "detail": UNREACHABLE})
    );
}

/// The JSON `data:` of every frame of a Server-Sent Events body (`[DONE]` left out).
async fn sse_data(router: &Router, request: Request<Body>) -> Vec<Value> {
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let bytes = tokio::time::timeout(Duration::from_secs(60), response.into_body().collect())
        .await
        .expect("the stream ends after its terminal event")
        .unwrap()
        .to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.split("\n\n")
        .flat_map(|frame| frame.lines().filter_map(|l| l.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

/// The schema an operation documents for its `text/event-stream` reply, which must be a named
/// component whose `oneOf` lists the shapes of one frame's `data`; returns it and their names.
fn stream_schema<'a>(document: &'a Value, method: &str, path: &str) -> (&'a Value, Vec<String>) {
    let schema = &document["paths"][path][method]["responses"]["200"]["content"]
        ["text/event-stream"]["schema"];
    let reference = schema["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("{method} {path}: the stream is not a named schema: {schema}"));
    let component = resolve(document, reference).expect("the stream schema resolves");
    let variants = component["oneOf"]
        .as_array()
        .unwrap_or_else(|| panic!("{reference} is not a oneOf: {component}"))
        .iter()
        .map(|v| v["$ref"].as_str().expect("each shape is named").to_owned())
        .collect();
    (schema, variants)
}

/// Checks every frame against the stream's schema and notes which documented shape it has.
fn assert_frames_conform(
    document: &Value,
    schema: &Value,
    variants: &[String],
    frames: &[Value],
    seen: &mut BTreeSet<String>,
) {
    assert!(!frames.is_empty());
    for frame in frames {
        if let Err(error) = conforms(document, schema, frame) {
            panic!("a stream frame: {error}\n{frame}");
        }
        for variant in variants {
            if conforms(document, &json!({"$ref": variant}), frame).is_ok() {
                seen.insert(variant.clone());
            }
        }
    }
}

/// Registers a model whose file is removed at once: its tasks fail (`model_unavailable`).
async fn vanishing_model(app: &TestApp) -> &'static str {
    std::fs::write(app.models_dir.join("gone.txt"), "words that will be gone").unwrap();
    let body = json!({"id": "gone", "path": "gone.txt"});
    let token = Some(app.admin_token.as_str());
    let reply = send(
        &app.router,
        request(Method::POST, "/v1/models", token, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    std::fs::remove_file(app.models_dir.join("gone.txt")).unwrap();
    "gone"
}

/// Every event of a Responses stream — completed, replayed by `GET /v1/responses/{id}`, and
/// failed (`error`, `response.failed`) — has exactly a documented shape, and every documented
/// shape is sent.
#[tokio::test]
async fn responses_stream_events_have_exactly_the_documented_shapes() {
    let app = test_app().await;
    let document = document(&app).await;
    let token = Some(app.admin_token.as_str());
    let (schema, variants) = stream_schema(&document, "post", "/v1/responses");
    let (replayed_schema, _) = stream_schema(&document, "get", "/v1/responses/{id}");
    assert_eq!(schema, replayed_schema, "one shape for both streams");
    let mut seen = BTreeSet::new();

    let body = json!({"model": "reference", "input": "Once upon a time", "stream": true,
        "max_output_tokens": 6});
    let frames = sse_data(
        &app.router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_frames_conform(&document, schema, &variants, &frames, &mut seen);
    assert_eq!(frames.last().unwrap()["type"], "response.completed");
    let response_id = frames[0]["response"]["id"].as_str().unwrap();
    let replayed = sse_data(
        &app.router,
        request(
            Method::GET,
            &format!("/v1/responses/{response_id}?stream=true"),
            token,
            None,
        ),
    )
    .await;
    assert_eq!(replayed, frames, "the replay is the same stream");

    // A function call: its item and argument events.
    let body = json!({"model": "reference", "input": "Weather in Paris?", "stream": true,
        "tool_choice": "required",
        "tools": [{"type": "function", "name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"]}}]});
    let frames = sse_data(
        &app.router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_frames_conform(&document, schema, &variants, &frames, &mut seen);
    assert_eq!(frames.last().unwrap()["type"], "response.completed");

    let model = vanishing_model(&app).await;
    let body = json!({"model": model, "input": "hello", "stream": true});
    let frames = sse_data(
        &app.router,
        request(Method::POST, "/v1/responses", token, Some(body)),
    )
    .await;
    assert_frames_conform(&document, schema, &variants, &frames, &mut seen);
    let kinds: Vec<&str> = frames.iter().filter_map(|f| f["type"].as_str()).collect();
    assert_eq!(&kinds[kinds.len() - 2..], ["error", "response.failed"]);

    let documented: BTreeSet<String> = variants.into_iter().collect();
    assert_eq!(seen, documented, "every documented shape is sent");
}

/// Every `data:` of a chat completion stream — chunks, the usage chunk, and a failed task's
/// error chunk — has exactly a documented shape, and every documented shape is sent.
#[tokio::test]
async fn chat_stream_chunks_have_exactly_the_documented_shapes() {
    let app = test_app().await;
    let document = document(&app).await;
    let token = Some(app.admin_token.as_str());
    let (schema, variants) = stream_schema(&document, "post", "/v1/chat/completions");
    let mut seen = BTreeSet::new();
    let messages = json!([{"role": "user", "content": "Once upon a time"}]);

    let body = json!({"model": "reference", "messages": messages, "stream": true,
        "max_completion_tokens": 5, "stream_options": {"include_usage": true}});
    let frames = sse_data(
        &app.router,
        request(Method::POST, "/v1/chat/completions", token, Some(body)),
    )
    .await;
    assert_frames_conform(&document, schema, &variants, &frames, &mut seen);
    assert_eq!(frames[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(frames.last().unwrap()["usage"].is_object());

    let model = vanishing_model(&app).await;
    let body = json!({"model": model, "messages": messages, "stream": true});
    let frames = sse_data(
        &app.router,
        request(Method::POST, "/v1/chat/completions", token, Some(body)),
    )
    .await;
    assert_frames_conform(&document, schema, &variants, &frames, &mut seen);
    assert_eq!(frames.last().unwrap()["error"]["code"], "model_unavailable");

    let documented: BTreeSet<String> = variants.into_iter().collect();
    assert_eq!(seen, documented, "every documented shape is sent");
}
