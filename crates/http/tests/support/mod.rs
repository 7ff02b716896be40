//! The service the HTTP tests drive: a real service over a fresh data directory (SQLite, the
//! reference engine) behind the router, driven with `oneshot` without binding a port.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use lmsp_app::{Adapters, Engines, Listener, Service, Settings, SystemClock};
use lmsp_domain::ports::{Clock, Engine, ModelFiles, Store, StoreListener};
use lmsp_domain::EngineKind;
use lmsp_engine_reference::{ReferenceEngine, ReferenceSettings};
use lmsp_http::wire::batches::HttpBatchWire;
use lmsp_http::{router, AppState};
use lmsp_models_fs::FsModelFiles;
use lmsp_storage_sqlite::{FileDir, SqliteOptions, SqliteStore};
use lmsp_webhook_sender::HttpWebhookSender;

/// A service over a fresh data directory, its router, and an admin token.
pub struct TestApp {
    pub router: Router,
    pub admin_token: String,
    pub service: Service,
    pub models_dir: std::path::PathBuf,
    pub data_dir: tempfile::TempDir,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Workers and jobs stop taking work; what they run is left (the data directory goes).
        self.service.begin_shutdown();
    }
}

pub async fn test_app() -> TestApp {
    test_app_with(None).await
}

/// A test app; with `upstream`, that engine runs upstream models beside the reference engine.
pub async fn test_app_with(upstream: Option<Arc<dyn Engine>>) -> TestApp {
    test_app_configured(upstream, |_| {}).await
}

/// A test app whose settings `configure` changes from the tests' defaults.
pub async fn test_app_configured(
    upstream: Option<Arc<dyn Engine>>,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    let data_dir = tempfile::tempdir().unwrap();
    let models_dir = data_dir.path().join("models");
    std::fs::create_dir_all(&models_dir).unwrap();
    let listener = Listener::new();
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            &data_dir.path().join("lmsp.db"),
            SqliteOptions::default(),
            listener.clone() as Arc<dyn StoreListener>,
        )
        .unwrap(),
    );
    let model_files: Arc<dyn ModelFiles> = Arc::new(FsModelFiles::new(models_dir.clone()));
    let engine: Arc<dyn Engine> = Arc::new(ReferenceEngine::new(ReferenceSettings {
        load_delay: Duration::ZERO,
        token_delay: Duration::ZERO,
        cancel_delay: Duration::ZERO,
    }));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut settings = Settings::with_defaults("test");
    settings.workers = 2;
    settings.retention = Duration::from_secs(3600);
    settings.purge_interval = Duration::from_secs(3600);
    settings.idempotency_ttl = Duration::from_secs(3600);
    configure(&mut settings);
    let mut engines = Engines::new().with(EngineKind::Reference, engine);
    if let Some(upstream) = upstream {
        engines = engines.with(EngineKind::Upstream, upstream);
    }
    let adapters = Adapters {
        store,
        engines,
        model_files,
        file_contents: Arc::new(FileDir::open(&data_dir.path().join("files")).unwrap()),
        batch_wire: Arc::new(HttpBatchWire),
        webhook_sender: Arc::new(HttpWebhookSender::new(Duration::from_secs(2)).unwrap()),
        clock,
    };
    // Starting on an empty store creates the `admin` client (its token shown once) and
    // registers the built-in `reference` model.
    let started = Service::start(adapters, listener, settings).await.unwrap();
    let admin_token = started
        .admin_token
        .as_ref()
        .expect("a first start creates the admin client")
        .expose()
        .to_owned();
    let service = started.service;
    service.spawn_background();
    let state = AppState {
        service: service.clone(),
    };
    TestApp {
        router: router(state),
        admin_token,
        service,
        models_dir,
        data_dir,
    }
}

/// A reply: status, headers, body as JSON (`Null` when empty or not JSON).
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Value,
}

pub async fn send(router: &Router, request: Request<Body>) -> Reply {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        content_type,
        body,
    }
}

pub fn request(
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    match body {
        Some(body) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    }
}

pub async fn sse_data(router: &Router, request: Request<Body>) -> Vec<Value> {
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

/// Registers a model whose file is removed at once: its tasks fail (`model_unavailable`).
pub async fn vanishing_model(app: &TestApp) -> &'static str {
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

/// A new client with `scopes`, paired through a code the admin makes: its id and token.
pub async fn paired_client(app: &TestApp, scopes: &[&str]) -> (String, String) {
    let admin = Some(app.admin_token.as_str());
    let body = json!({"scopes": scopes});
    let reply = send(
        &app.router,
        request(Method::POST, "/v1/pairings", admin, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let body = json!({"code": reply.body["code"], "name": "client", "scopes": scopes});
    let reply = send(
        &app.router,
        request(Method::POST, "/v1/pair", None, Some(body)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let id = reply.body["client_id"].as_str().unwrap().to_owned();
    let token = reply.body["token"].as_str().unwrap().to_owned();
    (id, token)
}
