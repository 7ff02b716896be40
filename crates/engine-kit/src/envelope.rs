//! The snapshot envelope: every engine's resume state is wrapped in it, so the count of output
//! tokens produced so far is read the same way for every engine and checked against the budget
//! in one place ([`ResumeState::remaining`]), and one engine never reads another's state as its
//! own (the envelope names the engine that wrote it).
//!
//! Version 1, integers little-endian:
//!
//! | bytes | what |
//! | --- | --- |
//! | 4 | the magic `LMSP` |
//! | 1 | the version: 1 |
//! | 1 | `n`, the length of the engine's tag |
//! | `n` | the engine's tag, e.g. `llama` |
//! | 8 | the output tokens produced so far (u64) |
//! | 4 | `m`, the length of the engine's own bytes (u32) |
//! | `m` | the engine's own bytes |
//!
//! Nothing follows. States written before the envelope carry no magic: each engine still reads
//! the formats it wrote then, through [`ResumeState::decode_or_legacy`]. None of them starts with
//! the magic (the reference engine's start with a version byte 1 or 2, the llama engine's with
//! `LLS1`/`LLS2`, and the openai engine's are a token count of 8 bytes whose low four would have
//! to spell `LMSP`, over a billion tokens).

use std::fmt;

use lmsp_domain::ports::EngineError;

use crate::output_budget;

/// The first bytes of every enveloped state.
pub const MAGIC: &[u8; 4] = b"LMSP";

/// The version of the envelope this release writes (and the only one it reads).
pub const VERSION: u8 = 1;

/// The name an engine writes into its states and expects to find in the states it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EngineTag(&'static str);

impl EngineTag {
    /// The tag `name` (e.g. `"llama"`). The envelope gives the tag one length byte, so a name
    /// must be 1 to 255 bytes long; every engine declares its tag as a `const`, which makes a
    /// name outside those bounds a build error rather than a state that cannot be read back.
    pub const fn new(name: &'static str) -> Self {
        assert!(
            !name.is_empty() && name.len() <= u8::MAX as usize,
            "an engine tag is 1 to 255 bytes long"
        );
        Self(name)
    }

    /// The engine's name, as written into its states.
    pub const fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for EngineTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// What a snapshot's engine state holds: how many output tokens were produced before it (the
/// part every engine has, which the budget is checked against) and the engine's own bytes
/// (whatever else it needs to continue exactly there).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResumeState {
    /// Output tokens produced before the snapshot, counted as the engine counts its `usage`.
    pub produced: u64,
    /// The engine's own bytes, read only by the engine that wrote them.
    pub engine: Vec<u8>,
}

impl ResumeState {
    /// A state after `produced` output tokens, with the engine's own `engine` bytes.
    pub fn new(produced: u64, engine: Vec<u8>) -> Self {
        Self { produced, engine }
    }

    /// The state in the envelope, as the engine tagged `tag` stores it in a snapshot.
    pub fn encode(&self, tag: EngineTag) -> Vec<u8> {
        let name = tag.name().as_bytes();
        // `EngineTag::new` keeps a name within one length byte.
        let name_len = u8::try_from(name.len()).unwrap_or(u8::MAX);
        let name = &name[..usize::from(name_len)];
        // A state over 4 GiB is not one a snapshot row can hold; the count never lies about the
        // bytes that follow it, so a state that long would be cut (and refused when read).
        let own_len = u32::try_from(self.engine.len()).unwrap_or(u32::MAX);
        let own = &self.engine[..self.engine.len().min(own_len as usize)];
        let mut bytes =
            Vec::with_capacity(MAGIC.len() + 1 + 1 + name.len() + 8 + 4 + self.engine.len());
        bytes.extend_from_slice(MAGIC);
        bytes.push(VERSION);
        bytes.push(name_len);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(&self.produced.to_le_bytes());
        bytes.extend_from_slice(&own_len.to_le_bytes());
        bytes.extend_from_slice(own);
        bytes
    }

    /// Reads an enveloped state that the engine tagged `tag` wrote: anything else (bytes without
    /// the envelope, another engine's state, a newer version, bytes cut short or followed by
    /// more) is an error, never a state.
    pub fn decode(bytes: &[u8], tag: EngineTag) -> Result<Self, StateError> {
        let Some(rest) = bytes.strip_prefix(MAGIC) else {
            return Err(StateError::Unrecognized { engine: tag });
        };
        let mut reader = Reader::new(rest);
        let [version] = reader.array::<1>()?;
        if version != VERSION {
            return Err(StateError::UnknownVersion(version));
        }
        let [name_len] = reader.array::<1>()?;
        let name = reader.bytes(usize::from(name_len))?;
        if name != tag.name().as_bytes() {
            return Err(StateError::Foreign {
                engine: tag,
                found: String::from_utf8_lossy(name).into_owned(),
            });
        }
        let produced = u64::from_le_bytes(reader.array::<8>()?);
        let own_len = u32::from_le_bytes(reader.array::<4>()?);
        let own_len = usize::try_from(own_len).map_err(|_| StateError::Truncated)?;
        let engine = reader.bytes(own_len)?.to_vec();
        reader.finish()?;
        Ok(Self { produced, engine })
    }

    /// Reads an enveloped state as [`ResumeState::decode`] does, or, when the bytes do not start
    /// with the envelope's magic, hands them to `legacy`: the engine's reader of the formats it
    /// wrote before the envelope (snapshots of earlier releases stay in users' databases and
    /// must still resume).
    pub fn decode_or_legacy<F>(bytes: &[u8], tag: EngineTag, legacy: F) -> Result<Self, StateError>
    where
        F: FnOnce(&[u8]) -> Result<Self, StateError>,
    {
        if bytes.starts_with(MAGIC) {
            Self::decode(bytes, tag)
        } else {
            legacy(bytes)
        }
    }

    /// How many tokens a generation resumed from this state may still produce of the task's
    /// `max_output_tokens` ([`output_budget`]): a state past the end of the budget is an error,
    /// the same one for every engine.
    pub fn remaining(&self, max_output_tokens: u32) -> Result<u64, EngineError> {
        output_budget(max_output_tokens, self.produced)
    }
}

/// Why a resume state cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not an envelope, nor a format the engine wrote before the envelope.
    #[error("it is not a {engine} engine state")]
    Unrecognized {
        /// The engine that tried to read it.
        engine: EngineTag,
    },
    /// Another engine's state (a task resumed on another engine than the one it ran on).
    #[error("it is a {found:?} engine state, not a {engine} engine state")]
    Foreign {
        /// The engine that tried to read it.
        engine: EngineTag,
        /// The tag in the envelope.
        found: String,
    },
    /// An envelope of a version this release does not read (written by a newer release).
    #[error("its envelope is of version {0}, which this release does not read")]
    UnknownVersion(u8),
    /// Cut short.
    #[error("it is cut short")]
    Truncated,
    /// This many bytes after the end of the state.
    #[error("{0} bytes follow its end")]
    TrailingBytes(usize),
    /// The engine's own bytes are not what the engine writes, and why.
    #[error("it is malformed: {0}")]
    Malformed(&'static str),
}

/// A state that cannot be read fails the generation: resuming from garbage would write an
/// output the task never had.
impl From<StateError> for EngineError {
    fn from(error: StateError) -> Self {
        EngineError::Failed(format!("the resume state is unreadable: {error}"))
    }
}

/// Reads a state front to back; running out of bytes is [`StateError::Truncated`]. Public so
/// that every engine reads its own bytes by the same rules.
#[derive(Debug)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A reader of `bytes`, from the first.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self(bytes)
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.0
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], StateError> {
        if self.0.len() < n {
            return Err(StateError::Truncated);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    /// The next `N` bytes, as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], StateError> {
        let mut array = [0_u8; N];
        array.copy_from_slice(self.bytes(N)?);
        Ok(array)
    }

    /// Whether every byte was read; bytes left over are [`StateError::TrailingBytes`].
    pub fn finish(self) -> Result<(), StateError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(StateError::TrailingBytes(self.0.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const ENGINE: EngineTag = EngineTag::new("test");
    const OTHER: EngineTag = EngineTag::new("other");

    #[test]
    fn the_envelope_is_laid_out_as_documented() {
        let bytes = ResumeState::new(7, vec![0xAA, 0xBB]).encode(ENGINE);
        let mut expected = b"LMSP".to_vec();
        expected.push(1);
        expected.push(4);
        expected.extend_from_slice(b"test");
        expected.extend_from_slice(&7u64.to_le_bytes());
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(&[0xAA, 0xBB]);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_state_round_trips() {
        for state in [
            ResumeState::default(),
            ResumeState::new(1, Vec::new()),
            ResumeState::new(42, vec![1, 2, 3]),
            ResumeState::new(u64::MAX, vec![0; 300]),
        ] {
            assert_eq!(
                ResumeState::decode(&state.encode(ENGINE), ENGINE),
                Ok(state)
            );
        }
    }

    /// A round trip of many states (proptest is not a dependency of this crate: a seeded
    /// generator covers the same ground, with the edges of each field).
    #[test]
    fn many_states_round_trip_and_every_cut_is_refused() {
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let tags = [ENGINE, EngineTag::new("x"), EngineTag::new(LONGEST)];
        for round in 0..500 {
            let produced = match round % 4 {
                0 => 0,
                1 => u64::MAX,
                _ => next(),
            };
            let len = usize::try_from(next() % 64).unwrap();
            let own: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[0]).collect();
            let tag = tags[round % tags.len()];
            let state = ResumeState::new(produced, own);
            let bytes = state.encode(tag);
            assert_eq!(ResumeState::decode(&bytes, tag), Ok(state.clone()));
            for cut in 0..bytes.len() {
                assert!(ResumeState::decode(&bytes[..cut], tag).is_err(), "{cut}");
            }
        }
    }

    const LONGEST: &str = concat!(
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde"
    );

    #[test]
    fn a_cut_state_is_truncated() {
        let bytes = ResumeState::new(3, vec![9; 10]).encode(ENGINE);
        for cut in MAGIC.len()..bytes.len() {
            assert_eq!(
                ResumeState::decode(&bytes[..cut], ENGINE),
                Err(StateError::Truncated),
                "{cut}"
            );
        }
    }

    #[test]
    fn bytes_after_the_end_are_refused() {
        let mut bytes = ResumeState::new(3, vec![9; 10]).encode(ENGINE);
        bytes.extend_from_slice(&[0, 0]);
        assert_eq!(
            ResumeState::decode(&bytes, ENGINE),
            Err(StateError::TrailingBytes(2))
        );
    }

    #[test]
    fn another_engines_state_is_foreign() {
        let bytes = ResumeState::new(3, vec![1]).encode(OTHER);
        let error = ResumeState::decode(&bytes, ENGINE).unwrap_err();
        assert_eq!(
            error,
            StateError::Foreign {
                engine: ENGINE,
                found: String::from("other"),
            }
        );
        let EngineError::Failed(message) = EngineError::from(error) else {
            panic!("a foreign state fails the generation");
        };
        assert!(message.contains("\"other\" engine state, not a test engine state"));
    }

    #[test]
    fn bytes_without_the_envelope_are_unrecognized_unless_the_legacy_reader_knows_them() {
        for bytes in [
            &b""[..],
            b"LMS",
            b"{\"next\":3}",
            &[1, 0, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert_eq!(
                ResumeState::decode(bytes, ENGINE),
                Err(StateError::Unrecognized { engine: ENGINE })
            );
        }
        let legacy = |bytes: &[u8]| match bytes {
            [7, n] => Ok(ResumeState::new(u64::from(*n), Vec::new())),
            _ => Err(StateError::Unrecognized { engine: ENGINE }),
        };
        assert_eq!(
            ResumeState::decode_or_legacy(&[7, 5], ENGINE, legacy),
            Ok(ResumeState::new(5, Vec::new()))
        );
        assert_eq!(
            ResumeState::decode_or_legacy(&[8, 5], ENGINE, legacy),
            Err(StateError::Unrecognized { engine: ENGINE })
        );
        // An envelope is never handed to the legacy reader, even a broken one.
        let envelope = ResumeState::new(5, Vec::new()).encode(ENGINE);
        assert_eq!(
            ResumeState::decode_or_legacy(&envelope, ENGINE, legacy),
            Ok(ResumeState::new(5, Vec::new()))
        );
        assert_eq!(
            ResumeState::decode_or_legacy(&envelope[..envelope.len() - 1], ENGINE, legacy),
            Err(StateError::Truncated)
        );
    }

    #[test]
    fn a_newer_version_is_refused() {
        let mut bytes = ResumeState::new(3, Vec::new()).encode(ENGINE);
        bytes[MAGIC.len()] = 2;
        assert_eq!(
            ResumeState::decode(&bytes, ENGINE),
            Err(StateError::UnknownVersion(2))
        );
    }

    #[test]
    fn a_state_past_the_end_of_the_budget_is_an_error() {
        assert_eq!(ResumeState::new(0, Vec::new()).remaining(10).unwrap(), 10);
        assert_eq!(ResumeState::new(4, Vec::new()).remaining(10).unwrap(), 6);
        assert_eq!(ResumeState::new(10, Vec::new()).remaining(10).unwrap(), 0);
        assert!(matches!(
            ResumeState::new(11, Vec::new()).remaining(10),
            Err(EngineError::Failed(message)) if message.contains("past the end")
        ));
        assert!(ResumeState::new(u64::MAX, Vec::new())
            .remaining(u32::MAX)
            .is_err());
    }
}
