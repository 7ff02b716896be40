//! Why a task failed: the stable task error codes (`task.error.code`, `response.failed`).

use strum::{EnumString, IntoStaticStr, VariantArray};

/// Why a task failed. The code names are part of the contract and of the stored log.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, VariantArray, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum TaskErrorCode {
    /// The service restarted (or its instance died) while the task was unfinished and its policy
    /// is `fail` (P-9).
    ServerRestarted,
    /// The task's model is no longer registered.
    ModelNotFound,
    /// The model file is missing or unreadable, or no engine runs its format.
    ModelUnavailable,
    /// The model file no longer matches its stored digest.
    ModelDigestMismatch,
    /// The engine failed.
    EngineError,
    /// The upstream server cannot be reached or broke off.
    UpstreamUnavailable,
    /// The engine sent nothing for too long.
    Timeout,
    /// The run could not be recorded and was given up after bounded retries.
    StorageUnavailable,
}

impl TaskErrorCode {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name; `None` for an unknown one.
    pub fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_error_codes_are_their_snake_case_names() {
        let names = [
            "server_restarted",
            "model_not_found",
            "model_unavailable",
            "model_digest_mismatch",
            "engine_error",
            "upstream_unavailable",
            "timeout",
            "storage_unavailable",
        ];
        assert_eq!(TaskErrorCode::VARIANTS.len(), names.len());
        for (code, name) in TaskErrorCode::VARIANTS.iter().zip(names) {
            assert_eq!(code.as_str(), name);
            assert_eq!(TaskErrorCode::parse(name), Some(*code));
        }
        assert_eq!(TaskErrorCode::parse("ServerRestarted"), None);
    }
}
