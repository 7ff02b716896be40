//! The pure core of the LMSP service.
//!
//! Everything here is decided without I/O: task statuses and the transition function
//! ([`transition`]), the cancel decision ([`cancel`]), the recovery table ([`recovery`]), events
//! and the structure of a task's log ([`event`]), idempotency decisions, the pairing limit, ids,
//! request validation, and the ports ([`ports`]) that adapters implement. Nothing in this crate
//! reads the clock, touches a file, spawns a task, or knows HTTP, SQL or JSON.

pub mod auth;
pub mod batch;
pub mod cancel;
pub mod error_code;
pub mod event;
pub mod idempotency;
pub mod ids;
pub mod model;
pub mod ports;
pub mod recovery;
pub mod resume;
pub mod schedule;
pub mod status;
pub mod task;
pub mod time;
pub mod tools;
pub mod transition;
pub mod validation;
pub mod webhooks;
pub mod worker;
pub mod writes;

pub use cancel::{decide_cancel, CancelDecision, CancelReply};
pub use error_code::TaskErrorCode;
pub use event::{CallItem, ClosedItem, Event, EventKind, EventPayload, QueueReason};
pub use ids::{
    BatchId, ClientId, FileId, InstanceId, ItemId, MalformedId, ResponseId, ServiceId, TaskId,
    WebhookEndpointId,
};
pub use model::{
    Digest, EngineKind, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource,
    ModelToLoad,
};
pub use recovery::{plan, recover, Move, RestartPolicy};
pub use schedule::{
    claim_window, next_claim, ClaimWindow, ClientLimits, ClientLoad, QueueFull, QueueHead,
    QueueLimits, ServiceTier, TierAging,
};
pub use status::TaskStatus;
pub use task::{
    Fraction, Input, ItemStatus, Message, Metadata, NewTask, OutputItems, Response, Role, Task,
    TaskError, TaskSpec, Usage,
};
pub use time::Timestamp;
pub use tools::{
    Controls, FunctionTool, JsonText, Logprob, OutputFormat, Penalty, TokenLogprob, ToolCall,
    ToolChoice, TopLogprob,
};
pub use transition::{advance, advance_all, transition, Advanced, Refusal, Step, StepKind};
pub use validation::{SubmitDraft, SubmitRequest};
