//! Registered models: ids, digests and the metadata the database keeps (P-1: files stay outside).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// A model id that breaks the rules of [`ModelId::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a model id is 1–128 characters of letters, digits, `.`, `_`, `-`, `:` and `/`, not starting with `.` or `/`")]
pub struct MalformedModelId;

/// The id of a registered model, e.g. `reference` or `llama-3.1-8b-q4`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ModelId(String);

impl ModelId {
    /// The id of the built-in reference model.
    pub const REFERENCE: &'static str = "reference";

    /// Parses a model id: 1–128 ASCII letters, digits, `.`, `_`, `-`, `:` or `/`, not starting
    /// with `.` or `/`.
    pub fn parse(text: &str) -> Result<Self, MalformedModelId> {
        let allowed =
            |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/');
        let well_formed = !text.is_empty()
            && text.len() <= 128
            && text.chars().all(allowed)
            && !text.starts_with(['.', '/']);
        if well_formed {
            Ok(Self(text.to_owned()))
        } else {
            Err(MalformedModelId)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ModelId {
    type Error = MalformedModelId;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<ModelId> for String {
    fn from(value: ModelId) -> Self {
        value.0
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModelId({})", self.0)
    }
}

/// A content digest: `sha256:` and 64 lower-case hex digits.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

/// Text that is not `sha256:` followed by 64 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a digest is `sha256:` followed by 64 lower-case hex digits")]
pub struct MalformedDigest;

impl Digest {
    /// The digest of a finished SHA-256 hash.
    pub fn from_sha256(bytes: [u8; 32]) -> Self {
        Self(format!("sha256:{}", hex::encode(bytes)))
    }

    /// Parses `sha256:<64 hex>`.
    pub fn parse(text: &str) -> Result<Self, MalformedDigest> {
        let hex_part = text.strip_prefix("sha256:").ok_or(MalformedDigest)?;
        if hex_part.len() == 64
            && hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Self(text.to_owned()))
        } else {
            Err(MalformedDigest)
        }
    }

    /// The digest as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Digest {
    type Error = MalformedDigest;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<Digest> for String {
    fn from(value: Digest) -> Self {
        value.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the service knows about a model file at the moment it was hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileFingerprint {
    /// The canonical absolute path.
    pub path: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Its modification time, in milliseconds since the epoch.
    pub modified_millis: i64,
    /// The SHA-256 of its contents.
    pub digest: Digest,
}

/// A registered model: metadata only; the file stays where the user keeps it (P-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// Its id.
    pub id: ModelId,
    /// Its file's format, e.g. `text` for the reference engine's corpus or `gguf`.
    pub format: String,
    /// The file as hashed.
    pub file: FileFingerprint,
    /// When it was registered.
    pub created_at: Timestamp,
}

/// The format name of a model file, from its extension (`reference.txt` → `text`).
pub fn format_of_path(path: &str) -> String {
    let extension = path
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase());
    match extension.as_deref() {
        Some("txt") | Some("text") => String::from("text"),
        Some(ext) if !ext.is_empty() && !ext.contains('/') => ext.to_owned(),
        _ => String::from("unknown"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_reject_path_tricks_and_empty_text() {
        assert!(ModelId::parse("reference").is_ok());
        assert!(ModelId::parse("org/llama-3.1:8b").is_ok());
        for bad in ["", "../etc", "/abs", "a b", "ü", &"x".repeat(129)] {
            assert!(ModelId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn digests_are_sha256_prefixed_lower_hex() {
        let digest = Digest::from_sha256([0xab; 32]);
        assert_eq!(Digest::parse(digest.as_str()), Ok(digest.clone()));
        assert!(Digest::parse("sha256:ABC").is_err());
        assert!(Digest::parse(&digest.as_str().replace("sha256:", "md5:")).is_err());
    }

    #[test]
    fn a_format_is_named_by_the_file_extension() {
        assert_eq!(format_of_path("/m/reference.txt"), "text");
        assert_eq!(format_of_path("/m/llama.GGUF"), "gguf");
        assert_eq!(format_of_path("/m/blob"), "unknown");
    }
}
