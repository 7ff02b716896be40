//! The service, health, models, clients and pairing objects.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use lmsp_app::{Caller, LimitsUpdate, NewPairing, Paired};
use lmsp_domain::auth::{Client, Scopes};
use lmsp_domain::ports::EngineHealth;
use lmsp_domain::{ClientLimits, EngineKind, ModelRecord, ModelSource};

use crate::openapi as schema;
use crate::wire::{constant, list_of, time};

constant!(
    /// `"model"`.
    ModelTag = "model"
);
constant!(
    /// `"client"`.
    ClientTag = "client"
);
constant!(
    /// `"service"`.
    ServiceTag = "service"
);
constant!(
    /// `"LMSP 1.0"`.
    SpecTag = "LMSP 1.0"
);
constant!(
    /// `"lmsp"`.
    OwnerTag = "lmsp"
);

fn scope_names(scopes: &Scopes) -> Vec<&'static str> {
    scopes.iter().map(|s| s.as_str()).collect()
}

/// A registered model.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelObject {
    // Always `model`.
    #[schema(inline)]
    pub object: ModelTag,
    /// Its id.
    pub id: String,
    /// The file's path as registered (relative to the models directory when inside it); shown
    /// only to `admin` and `models:write`, and absent for an upstream model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `text`, `gguf`, or `upstream` (a model an upstream server runs).
    pub format: String,
    /// The file's size (absent for an upstream model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// `sha256:` and the file's SHA-256 in hex (absent for an upstream model).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^sha256:[0-9a-f]{64}$")]
    pub digest: Option<String>,
    /// The upstream's name for it (only for an upstream model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_model: Option<String>,
    /// When it was registered.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// When it was registered (Unix seconds), as OpenAI's SDKs read it.
    pub created: i64,
    // Always `lmsp`.
    #[schema(inline)]
    pub owned_by: OwnerTag,
}

/// A model object; `show_path` for callers that may see where files are.
pub fn model(model: &ModelRecord, show_path: bool) -> ModelObject {
    let (path, size_bytes, digest, upstream_model) = match &model.source {
        ModelSource::File { file, .. } => (
            show_path.then(|| file.path.clone()),
            Some(file.size_bytes),
            Some(file.digest.as_str().to_owned()),
            None,
        ),
        ModelSource::Upstream { name } => (None, None, None, Some(name.clone())),
    };
    ModelObject {
        object: ModelTag::Value,
        id: model.id.as_str().to_owned(),
        path,
        format: model.format_name().to_owned(),
        size_bytes,
        digest,
        upstream_model,
        created_at: time(model.created_at),
        created: model.created_at.as_unix_seconds(),
        owned_by: OwnerTag::Value,
    }
}

/// A paired client: never its token or the token's hash.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClientObject {
    // Always `client`.
    #[schema(inline)]
    pub object: ClientTag,
    /// Its id.
    #[schema(schema_with = schema::client_id)]
    pub id: String,
    /// A human name.
    pub name: String,
    /// What it may do.
    #[schema(schema_with = schema::scopes)]
    pub scopes: Vec<&'static str>,
    /// When it was created.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// When it was revoked, or `null`.
    #[schema(schema_with = schema::nullable_timestamp, required = true)]
    pub revoked_at: Option<String>,
    /// The most of its tasks that run at once, or `null` for no limit.
    #[schema(required = true)]
    pub max_running: Option<u32>,
    /// The most of its tasks that may be queued (a submit past it is 429), or `null`.
    #[schema(required = true)]
    pub max_queued: Option<u32>,
}

/// A client object (never its token or hash).
pub fn client(client: &Client, limits: ClientLimits) -> ClientObject {
    ClientObject {
        object: ClientTag::Value,
        id: client.id.to_string(),
        name: client.name.clone(),
        scopes: scope_names(&client.scopes),
        created_at: time(client.created_at),
        revoked_at: client.revoked_at.map(time),
        max_running: limits.max_running,
        max_queued: limits.max_queued,
    }
}

/// The body of `PATCH /v1/clients/{id}`: each field present is set (`null`: no limit), each
/// absent one kept. Unknown fields are refused (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"max_running": 2, "max_queued": 100})))]
pub struct UpdateClientRequest {
    /// The most of its tasks that run at once, from 1; `null` for no limit.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, minimum = 1)]
    pub max_running: Option<Option<u32>>,
    /// The most of its tasks that may be queued; `null` for no limit.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>)]
    pub max_queued: Option<Option<u32>>,
}

/// A field that is present, `null` or not: `Some(value)`; an absent one stays `None`
/// (`#[serde(default)]`).
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl UpdateClientRequest {
    /// The change it asks for.
    pub fn update(&self) -> LimitsUpdate {
        LimitsUpdate {
            max_running: self.max_running,
            max_queued: self.max_queued,
        }
    }
}

list_of!(
    /// Every registered model.
    ModelList of ModelObject
);
list_of!(
    /// Every client.
    ClientList of ClientObject
);

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HealthObject {
    /// `ok` while the store accepts commits, `unavailable` while it does not.
    #[schema(schema_with = schema::health_status)]
    pub status: &'static str,
    /// Why it is unavailable (`storage_unavailable`); absent when ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = schema::health_reason)]
    pub reason: Option<&'static str>,
}

/// The engine a service runs its models on (`--engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EngineName {
    /// The deterministic reference engine.
    Reference,
    /// GGUF models in process on llama.cpp.
    Llama,
    /// An OpenAI-compatible upstream server.
    Openai,
}

impl EngineName {
    fn of(kind: EngineKind) -> Self {
        match kind {
            EngineKind::Reference => Self::Reference,
            EngineKind::Llama => Self::Llama,
            EngineKind::Upstream => Self::Openai,
        }
    }
}

/// Whether an engine can take work now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EngineStatus {
    /// It can.
    Ok,
    /// It cannot now (an upstream that does not answer).
    Unavailable,
}

/// The engine the service runs its models on and its health: an engine in this process is
/// always `ok`; the `openai` engine is `ok` while its upstream answers `GET /models` (asked at
/// most every few seconds).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EngineObject {
    /// Which engine (`--engine`).
    pub kind: EngineName,
    /// `ok` or `unavailable`.
    pub status: EngineStatus,
    /// Why it is unavailable, or `null`.
    #[schema(required = true)]
    pub detail: Option<String>,
}

/// The engine object of a service's primary engine and its health.
pub fn engine(kind: EngineKind, health: &EngineHealth) -> EngineObject {
    let (status, detail) = match health {
        EngineHealth::Ok => (EngineStatus::Ok, None),
        EngineHealth::Unavailable(reason) => (EngineStatus::Unavailable, Some(reason.clone())),
    };
    EngineObject {
        kind: EngineName::of(kind),
        status,
        detail,
    }
}

/// The client whose token read the service object, and what it may do: a client (the web
/// console) learns which calls it may make without trying them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CallerObject {
    /// The client's id.
    #[schema(schema_with = schema::client_id)]
    pub client_id: String,
    /// Its scopes (`admin` implies every other).
    #[schema(schema_with = schema::scopes)]
    pub scopes: Vec<&'static str>,
}

/// The service and its settings.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ServiceObject {
    // Always `service`.
    #[schema(inline)]
    pub object: ServiceTag,
    /// The service's id; it never changes for a store.
    #[schema(schema_with = schema::service_id)]
    pub id: String,
    // Always `LMSP 1.0`.
    #[schema(inline)]
    pub spec: SpecTag,
    /// The implementation's version.
    pub version: String,
    /// When this process started.
    #[schema(schema_with = schema::timestamp)]
    pub started_at: String,
    /// How long finished tasks are kept (`--retention`).
    pub retention_seconds: u64,
    /// The policy of tasks whose request names none (`--default-on-restart`).
    #[schema(schema_with = schema::restart_policy)]
    pub default_on_restart: &'static str,
    /// The engine and its health, or `null` for a service without one.
    #[schema(required = true)]
    pub engine: Option<EngineObject>,
    /// The client whose token asked.
    pub caller: CallerObject,
}

/// The service object as `caller` reads it, with the engine's health as `engine` reports it.
pub fn service(
    service: &lmsp_app::Service,
    caller: &Caller,
    engine_health: Option<(EngineKind, EngineHealth)>,
) -> ServiceObject {
    let settings = service.settings();
    ServiceObject {
        object: ServiceTag::Value,
        id: service.identity().id.to_string(),
        spec: SpecTag::Value,
        version: settings.version.clone(),
        started_at: time(service.started_at()),
        retention_seconds: settings.retention.as_secs(),
        default_on_restart: settings.default_on_restart.as_str(),
        engine: engine_health.map(|(kind, health)| engine(kind, &health)),
        caller: CallerObject {
            client_id: caller.client_id.to_string(),
            scopes: scope_names(&caller.scopes),
        },
    }
}

/// A one-time pairing code (`POST /v1/pairings`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PairingObject {
    /// The code, shown once.
    #[schema(pattern = "^[0-9]{3}-[0-9]{3}$", examples("483-921"))]
    pub code: String,
    /// When it stops working (10 minutes after creation).
    #[schema(schema_with = schema::timestamp)]
    pub expires_at: String,
    /// The scopes a client paired with it may receive.
    #[schema(schema_with = schema::scopes)]
    pub scopes: Vec<&'static str>,
}

/// The reply to `POST /v1/pairings`.
pub fn pairing(pairing: &NewPairing) -> PairingObject {
    PairingObject {
        code: pairing.code.expose().to_owned(),
        expires_at: time(pairing.expires_at),
        scopes: scope_names(&pairing.scopes),
    }
}

/// A new client and its token (`POST /v1/pair`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PairedObject {
    /// The new client's id.
    #[schema(schema_with = schema::client_id)]
    pub client_id: String,
    /// Its bearer token, shown once: `lmsp_` and 43 base64url characters.
    #[schema(pattern = "^lmsp_[A-Za-z0-9_-]{43}$")]
    pub token: String,
    /// What it may do.
    #[schema(schema_with = schema::scopes)]
    pub scopes: Vec<&'static str>,
}

/// The reply to `POST /v1/pair`.
pub fn paired(paired: &Paired) -> PairedObject {
    PairedObject {
        client_id: paired.client.id.to_string(),
        token: paired.token.expose().to_owned(),
        scopes: scope_names(&paired.client.scopes),
    }
}
