//! Registered models: ids, digests and the metadata the database keeps (P-1: files stay outside).

use std::fmt;

use crate::time::Timestamp;

/// A model id that breaks the rules of [`ModelId::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a model id is 1–128 characters of letters, digits, `.`, `_`, `-`, `:` and `/`, not starting with `.` or `/`")]
pub struct MalformedModelId;

/// The id of a registered model, e.g. `reference` or `llama-3.1-8b-q4`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
#[derive(Clone, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFingerprint {
    /// The path as stored: relative to the models directory when the file is inside it (so that
    /// instances with their own models directories share one record), else absolute.
    pub path: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Its modification time, in milliseconds since the epoch.
    pub modified_millis: i64,
    /// The SHA-256 of its contents.
    pub digest: Digest,
}

/// The format of a model file, from its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModelFormat {
    /// Plain text: the reference engine's corpus (`.txt`).
    Text,
    /// A GGUF file, run by llama.cpp (`.gguf`).
    Gguf,
    /// A format no engine of this build runs (kept from an older registration).
    Other(String),
}

impl ModelFormat {
    /// The name, e.g. `gguf`.
    pub fn as_str(&self) -> &str {
        match self {
            ModelFormat::Text => "text",
            ModelFormat::Gguf => "gguf",
            ModelFormat::Other(name) => name,
        }
    }

    /// Parses a stored name.
    pub fn parse(text: &str) -> Self {
        match text {
            "text" => ModelFormat::Text,
            "gguf" => ModelFormat::Gguf,
            other => ModelFormat::Other(other.to_owned()),
        }
    }

    /// The format of a model file named `path`, from its extension; `None` when it names no
    /// model format (`notes.md` is not a model).
    pub fn of_path(path: &str) -> Option<Self> {
        let name = path.rsplit(['/', '\\']).next().unwrap_or(path);
        let (_, extension) = name.rsplit_once('.')?;
        match extension.to_ascii_lowercase().as_str() {
            "txt" | "text" => Some(ModelFormat::Text),
            "gguf" => Some(ModelFormat::Gguf),
            _ => None,
        }
    }
}

/// Where a registered model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A file on disk, checked against its digest before each load (P-1: metadata only).
    File {
        /// Its format.
        format: ModelFormat,
        /// The file as hashed.
        file: FileFingerprint,
    },
    /// A model an upstream server runs (`--engine openai`), by its name there.
    Upstream {
        /// The upstream's name for it.
        name: String,
    },
}

/// The engine that runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// The deterministic reference engine: text corpora.
    Reference,
    /// llama.cpp in process: GGUF files.
    Llama,
    /// An OpenAI-compatible upstream server.
    Upstream,
}

/// A registered model: metadata only; a file stays where the user keeps it (P-1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRecord {
    /// Its id.
    pub id: ModelId,
    /// Its file or upstream name.
    pub source: ModelSource,
    /// When it was registered.
    pub created_at: Timestamp,
}

impl ModelRecord {
    /// The engine that runs it, or `None` when no engine runs its format.
    pub fn engine(&self) -> Option<EngineKind> {
        match &self.source {
            ModelSource::File {
                format: ModelFormat::Text,
                ..
            } => Some(EngineKind::Reference),
            ModelSource::File {
                format: ModelFormat::Gguf,
                ..
            } => Some(EngineKind::Llama),
            ModelSource::File {
                format: ModelFormat::Other(_),
                ..
            } => None,
            ModelSource::Upstream { .. } => Some(EngineKind::Upstream),
        }
    }

    /// Its file, when it has one.
    pub fn file(&self) -> Option<&FileFingerprint> {
        match &self.source {
            ModelSource::File { file, .. } => Some(file),
            ModelSource::Upstream { .. } => None,
        }
    }

    /// The format name: the file's, or `upstream`.
    pub fn format_name(&self) -> &str {
        match &self.source {
            ModelSource::File { format, .. } => format.as_str(),
            ModelSource::Upstream { .. } => "upstream",
        }
    }
}

/// A model as an engine is given it: the record, and the file's absolute path on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelToLoad {
    /// The record.
    pub record: ModelRecord,
    /// The absolute path of its file on this instance's disk (`None` for an upstream model).
    pub path: Option<String>,
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
    fn only_model_files_have_a_format() {
        assert_eq!(
            ModelFormat::of_path("/m/reference.txt"),
            Some(ModelFormat::Text)
        );
        assert_eq!(
            ModelFormat::of_path("/m/llama.GGUF"),
            Some(ModelFormat::Gguf)
        );
        for not_a_model in ["/m/blob", "/m/notes.md", "/m.d/readme", "/m/.gguf.bak"] {
            assert_eq!(ModelFormat::of_path(not_a_model), None, "{not_a_model}");
        }
        assert_eq!(ModelFormat::parse("gguf"), ModelFormat::Gguf);
        assert_eq!(ModelFormat::parse("md").as_str(), "md");
    }

    #[test]
    fn each_model_names_its_engine() {
        let file = FileFingerprint {
            path: "m.gguf".into(),
            size_bytes: 1,
            modified_millis: 0,
            digest: Digest::from_sha256([0; 32]),
        };
        let record = |source| ModelRecord {
            id: ModelId::parse("m").unwrap(),
            source,
            created_at: Timestamp::from_millis(0),
        };
        let gguf = record(ModelSource::File {
            format: ModelFormat::Gguf,
            file: file.clone(),
        });
        assert_eq!(gguf.engine(), Some(EngineKind::Llama));
        assert_eq!(gguf.format_name(), "gguf");
        let text = record(ModelSource::File {
            format: ModelFormat::Text,
            file: file.clone(),
        });
        assert_eq!(text.engine(), Some(EngineKind::Reference));
        let other = record(ModelSource::File {
            format: ModelFormat::Other("bin".into()),
            file,
        });
        assert_eq!(other.engine(), None);
        let upstream = record(ModelSource::Upstream {
            name: "llama3:8b".into(),
        });
        assert_eq!(upstream.engine(), Some(EngineKind::Upstream));
        assert_eq!(upstream.file(), None);
        assert_eq!(upstream.format_name(), "upstream");
    }
}
