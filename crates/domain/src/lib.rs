//! The pure core of the LMSP service.
//!
//! Everything here is decided without I/O: task statuses and the transition function
//! ([`transition`]), the cancel decision ([`cancel`]), the recovery table ([`recovery`]), events
//! ([`event`]), error codes, ids, request validation, and the ports ([`ports`]) that adapters
//! implement. Nothing in this crate reads the clock, touches a file or spawns a task.

pub mod auth;
pub mod cancel;
pub mod error_code;
pub mod event;
pub mod idempotency;
pub mod ids;
pub mod model;
pub mod ports;
pub mod recovery;
pub mod status;
pub mod task;
pub mod time;
pub mod transition;
pub mod validation;

pub use cancel::{decide_cancel, CancelDecision, CancelReply};
pub use error_code::{ErrorCode, TaskErrorCode};
pub use event::{Event, EventKind, EventPayload, QueueReason};
pub use ids::{ClientId, MalformedId, ResponseId, ServiceId, TaskId};
pub use model::{Digest, FileFingerprint, ModelId, ModelRecord};
pub use recovery::{plan, recover, Move, RestartPolicy, StartEpoch};
pub use status::TaskStatus;
pub use task::{
    Input, Message, Metadata, Response, Role, SubmitRequest, Task, TaskError, TaskSpec, Usage,
};
pub use time::Timestamp;
pub use transition::{advance, transition, Advanced, Refusal, Step, StepKind, Transition};
