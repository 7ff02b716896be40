//! What a resume needs: the generated token ids, the bytes of an unfinished character, and the
//! name of the run's KV checkpoints.
//!
//! Stored in the snapshot envelope of `lmsp-engine-kit` (tag `llama`), whose count of output
//! tokens is the number of token ids. The engine's own bytes: a byte telling whether the run has a
//! checkpoint name (1) or not (0), the name (16 bytes) when it has one, each token id (i32,
//! little-endian), the count of pending bytes (u8) and those bytes.
//!
//! The formats of the releases before the envelope are still read: `LLS2`, the run's checkpoint
//! name (16 bytes), the token count (u32, little-endian), each token id (i32, little-endian), the
//! count of pending bytes (u8) and those bytes; and `LLS1` (the first release's), the same
//! without the name: such a run has no checkpoints and resumes by replaying from the prompt. The
//! sampler's position is the token count (each token's draw is seeded from the task's seed and
//! its index).

use lmsp_engine_kit::envelope::Reader;
use lmsp_engine_kit::{EngineTag, ResumeState, StateError};

/// The tag of this engine's states in the snapshot envelope.
const STATE_TAG: EngineTag = EngineTag::new("llama");

const LEGACY_MAGIC_V1: &[u8; 4] = b"LLS1";
const LEGACY_MAGIC_V2: &[u8; 4] = b"LLS2";

/// The name under which a run keeps its KV checkpoints: random, chosen when the task first starts
/// and carried by every state, so a resume finds the checkpoints of its own task and no other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunName(pub [u8; 16]);

impl RunName {
    /// A fresh random name.
    pub fn random() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // Each RandomState is seeded afresh from the OS (and a per-thread counter): two
        // finishes of differently keyed hashers give 128 unpredictable bits without a
        // dependency.
        let mut bytes = [0u8; 16];
        for (half, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_usize(half);
            hasher.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            chunk.copy_from_slice(&hasher.finish().to_le_bytes());
        }
        Self(bytes)
    }

    /// The name as 32 lowercase hex digits (file names).
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A generation's progress: its tokens and the bytes of a character still incomplete.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GenerationState {
    run: Option<RunName>,
    tokens: Vec<i32>,
    pending: Vec<u8>,
}

impl GenerationState {
    /// A state with these tokens and pending bytes, of a run without checkpoints.
    pub fn new(tokens: Vec<i32>, pending: Vec<u8>) -> Self {
        Self {
            run: None,
            tokens,
            pending,
        }
    }

    /// The same state, of the run named `run`.
    #[must_use]
    pub fn with_run(mut self, run: RunName) -> Self {
        self.run = Some(run);
        self
    }

    /// The run's checkpoint name, when it has one.
    pub fn run(&self) -> Option<RunName> {
        self.run
    }

    /// The token ids generated so far.
    pub fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    /// The bytes of an unfinished character, not yet in any delta.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// How many tokens have been generated.
    pub fn output_tokens(&self) -> u64 {
        u64::try_from(self.tokens.len()).unwrap_or(u64::MAX)
    }

    /// Records a token and its piece; returns the text now complete (whole characters; a byte
    /// sequence that can never be valid UTF-8 becomes U+FFFD).
    pub fn push(&mut self, token: i32, piece: &[u8]) -> String {
        self.tokens.push(token);
        self.pending.extend_from_slice(piece);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(valid) => {
                    text.push_str(valid);
                    self.pending.clear();
                    return text;
                }
                Err(error) => {
                    let (valid, rest) = self.pending.split_at(error.valid_up_to());
                    text.push_str(&String::from_utf8_lossy(valid));
                    match error.error_len() {
                        // An incomplete character at the end: wait for the next piece.
                        None => {
                            self.pending = rest.to_vec();
                            return text;
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending = rest[bad..].to_vec();
                        }
                    }
                }
            }
        }
    }

    /// The pending bytes as text (U+FFFD for an unfinished character), at the end of a run.
    pub fn flush(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }

    /// The state as bytes, in the snapshot envelope.
    pub fn encode(&self) -> Vec<u8> {
        self.envelope().encode(STATE_TAG)
    }

    /// The state as the envelope holds it: the token count and this engine's own bytes.
    pub fn envelope(&self) -> ResumeState {
        let mut own = Vec::with_capacity(1 + 16 + 4 * self.tokens.len() + 1 + self.pending.len());
        match self.run {
            Some(run) => {
                own.push(1);
                own.extend_from_slice(&run.0);
            }
            None => own.push(0),
        }
        for token in &self.tokens {
            own.extend_from_slice(&token.to_le_bytes());
        }
        // At most 3 bytes of a character are ever pending.
        let pending = &self.pending[..self.pending.len().min(u8::MAX as usize)];
        own.push(u8::try_from(pending.len()).unwrap_or(u8::MAX));
        own.extend_from_slice(pending);
        ResumeState::new(self.output_tokens(), own)
    }

    /// Reads a state written by [`GenerationState::encode`], or by a release before the
    /// envelope.
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        Self::from_envelope(&Self::read(bytes)?)
    }

    /// Reads a snapshot's state as far as the envelope: an enveloped state of this engine, or
    /// an `LLS1`/`LLS2` state as the envelope would hold it.
    pub fn read(bytes: &[u8]) -> Result<ResumeState, StateError> {
        ResumeState::decode_or_legacy(bytes, STATE_TAG, |bytes| {
            decode_legacy(bytes).map(|state| state.envelope())
        })
    }

    /// The state in an envelope of this engine.
    pub fn from_envelope(envelope: &ResumeState) -> Result<Self, StateError> {
        let mut reader = Reader::new(&envelope.engine);
        let run = match reader.array::<1>()? {
            [0] => None,
            [1] => Some(RunName(reader.array::<16>()?)),
            _ => return Err(StateError::Malformed("its run flag is not 0 or 1")),
        };
        let count = usize::try_from(envelope.produced).map_err(|_| StateError::Truncated)?;
        let tokens = read_tokens(&mut reader, count)?;
        let [pending_len] = reader.array::<1>()?;
        let pending = reader.bytes(usize::from(pending_len))?.to_vec();
        reader.finish()?;
        Ok(Self {
            run,
            tokens,
            pending,
        })
    }
}

/// Reads a state of the formats before the envelope (`LLS2`, `LLS1`).
fn decode_legacy(bytes: &[u8]) -> Result<GenerationState, StateError> {
    let (run, rest) = if let Some(rest) = bytes.strip_prefix(LEGACY_MAGIC_V2) {
        let mut reader = Reader::new(rest);
        (Some(RunName(reader.array::<16>()?)), reader.rest())
    } else {
        let rest = bytes
            .strip_prefix(LEGACY_MAGIC_V1)
            .ok_or(StateError::Unrecognized { engine: STATE_TAG })?;
        (None, rest)
    };
    let mut reader = Reader::new(rest);
    let count = u32::from_le_bytes(reader.array::<4>()?);
    let count = usize::try_from(count).map_err(|_| StateError::Truncated)?;
    let tokens = read_tokens(&mut reader, count)?;
    let [pending_len] = reader.array::<1>()?;
    let pending = reader.bytes(usize::from(pending_len))?.to_vec();
    reader.finish()?;
    Ok(GenerationState {
        run,
        tokens,
        pending,
    })
}

/// `count` token ids (i32 LE); the bytes are checked to be there before anything is allocated.
fn read_tokens(reader: &mut Reader<'_>, count: usize) -> Result<Vec<i32>, StateError> {
    let len = count.checked_mul(4).ok_or(StateError::Truncated)?;
    Ok(reader
        .bytes(len)?
        .chunks_exact(4)
        .map(|token| i32::from_le_bytes([token[0], token[1], token[2], token[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_state_round_trips() {
        let state = GenerationState::new(vec![1, -2, 300_000], vec![0xE2, 0x82]);
        assert_eq!(GenerationState::decode(&state.encode()), Ok(state));
        let empty = GenerationState::default();
        assert_eq!(GenerationState::decode(&empty.encode()), Ok(empty));
        let named = GenerationState::new(vec![5, 6], vec![]).with_run(RunName([7; 16]));
        let envelope = 4 + 1 + 1 + "llama".len() + 8 + 4;
        assert_eq!(named.encode().len(), envelope + 1 + 16 + 8 + 1);
        assert_eq!(GenerationState::decode(&named.encode()), Ok(named));
    }

    /// Snapshots of the releases before the envelope stay in users' databases.
    #[test]
    fn states_of_earlier_releases_still_decode() {
        let lls2 = [
            b"LLS2".as_slice(),
            &[7; 16],
            &[2, 0, 0, 0],
            &[5, 0, 0, 0],
            &[0xFE, 0xFF, 0xFF, 0xFF],
            &[1, 0xE2],
        ]
        .concat();
        let expected = GenerationState::new(vec![5, -2], vec![0xE2]).with_run(RunName([7; 16]));
        assert_eq!(GenerationState::decode(&lls2), Ok(expected.clone()));
        assert_eq!(GenerationState::read(&lls2), Ok(expected.envelope()));
        assert_eq!(GenerationState::read(&lls2).map(|e| e.produced), Ok(2));
        let lls1 = [b"LLS1".as_slice(), &[1, 0, 0, 0], &[9, 0, 0, 0], &[0]].concat();
        assert_eq!(
            GenerationState::decode(&lls1),
            Ok(GenerationState::new(vec![9], vec![]))
        );
        // A state of the first release names no run: a resume gives it a new one.
        assert_eq!(GenerationState::decode(&lls1).map(|s| s.run()), Ok(None));
    }

    #[test]
    fn random_run_names_differ() {
        let a = RunName::random();
        let b = RunName::random();
        assert_ne!(a, b);
        assert_eq!(a.hex().len(), 32);
    }

    #[test]
    fn foreign_and_cut_states_are_refused() {
        let unrecognized = Err(StateError::Unrecognized { engine: STATE_TAG });
        assert_eq!(GenerationState::decode(b""), unrecognized);
        assert_eq!(GenerationState::decode(b"{\"next\":3}"), unrecognized);
        let reference = ResumeState::new(3, vec![1]).encode(EngineTag::new("reference"));
        assert_eq!(
            GenerationState::decode(&reference),
            Err(StateError::Foreign {
                engine: STATE_TAG,
                found: String::from("reference"),
            })
        );
        let named = GenerationState::new(vec![1, 2], vec![]).with_run(RunName([1; 16]));
        let lls2 = [
            b"LLS2".as_slice(),
            &[1; 16],
            &[2, 0, 0, 0],
            &[1, 0, 0, 0, 2, 0, 0, 0, 0],
        ]
        .concat();
        for bytes in [named.encode(), lls2] {
            for cut in 4..bytes.len() {
                assert_eq!(
                    GenerationState::decode(&bytes[..cut]),
                    Err(StateError::Truncated),
                    "{cut}"
                );
            }
            let mut long = bytes.clone();
            long.push(0);
            assert_eq!(
                GenerationState::decode(&long),
                Err(StateError::TrailingBytes(1))
            );
        }
        // The envelope's count and the token ids disagree.
        let mut envelope = named.envelope();
        envelope.produced = 3;
        assert_eq!(
            GenerationState::from_envelope(&envelope),
            Err(StateError::Truncated)
        );
        envelope.produced = 1;
        assert!(GenerationState::from_envelope(&envelope).is_err());
    }

    proptest! {
        /// Every state reads back as itself, whether written now or in the `LLS2` format.
        #[test]
        fn any_state_round_trips(
            tokens in proptest::collection::vec(any::<i32>(), 0..64),
            pending in proptest::collection::vec(any::<u8>(), 0..4),
            run in proptest::option::of(any::<[u8; 16]>()),
        ) {
            let mut state = GenerationState::new(tokens, pending);
            if let Some(run) = run {
                state = state.with_run(RunName(run));
            }
            prop_assert_eq!(GenerationState::decode(&state.encode()), Ok(state.clone()));
            if let Some(run) = state.run() {
                let count = u32::try_from(state.tokens().len()).unwrap_or(u32::MAX);
                let mut lls2 = b"LLS2".to_vec();
                lls2.extend_from_slice(&run.0);
                lls2.extend_from_slice(&count.to_le_bytes());
                for token in state.tokens() {
                    lls2.extend_from_slice(&token.to_le_bytes());
                }
                lls2.push(u8::try_from(state.pending().len()).unwrap_or(u8::MAX));
                lls2.extend_from_slice(state.pending());
                prop_assert_eq!(GenerationState::decode(&lls2), Ok(state));
            }
        }
    }

    #[test]
    fn pieces_become_whole_characters() {
        let mut state = GenerationState::default();
        assert_eq!(state.push(1, &[0xE2]), "");
        assert_eq!(state.push(2, &[0x82]), "");
        assert_eq!(state.pending(), &[0xE2, 0x82]);
        assert_eq!(state.push(3, &[0xAC, b'!']), "€!");
        assert_eq!(state.push(4, &[0xFF, b'a', 0xC3]), "\u{FFFD}a");
        assert_eq!(state.flush(), "\u{FFFD}");
        assert_eq!(state.output_tokens(), 4);
    }
}
