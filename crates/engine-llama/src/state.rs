//! What a resume needs: the generated token ids, the bytes of an unfinished character, and the
//! name of the run's KV checkpoints.
//!
//! Encoded as `LLS2`, the run's checkpoint name (16 bytes), the token count (u32, little-endian),
//! each token id (i32, little-endian), the count of pending bytes (u8) and those bytes. `LLS1`
//! (the first release's, without the name) is still read: such a run has no checkpoints and
//! resumes by replaying from the prompt. The sampler's position is the token count (each token's
//! draw is seeded from the task's seed and its index).

/// Why a state cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not a state this engine wrote.
    #[error("not a llama engine state")]
    Foreign,
    /// Cut short or with bytes left over.
    #[error("a malformed llama engine state")]
    Malformed,
}

const MAGIC_V1: &[u8; 4] = b"LLS1";
const MAGIC: &[u8; 4] = b"LLS2";

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

    /// The state as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes =
            Vec::with_capacity(4 + 16 + 4 + 4 * self.tokens.len() + 1 + self.pending.len());
        match self.run {
            Some(run) => {
                bytes.extend_from_slice(MAGIC);
                bytes.extend_from_slice(&run.0);
            }
            None => bytes.extend_from_slice(MAGIC_V1),
        }
        let count = u32::try_from(self.tokens.len()).unwrap_or(u32::MAX);
        bytes.extend_from_slice(&count.to_le_bytes());
        for token in self.tokens.iter().take(count as usize) {
            bytes.extend_from_slice(&token.to_le_bytes());
        }
        // At most 3 bytes of a character are ever pending.
        let pending = &self.pending[..self.pending.len().min(u8::MAX as usize)];
        bytes.push(u8::try_from(pending.len()).unwrap_or(u8::MAX));
        bytes.extend_from_slice(pending);
        bytes
    }

    /// Reads a state written by [`GenerationState::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        let (run, rest) = if let Some(rest) = bytes.strip_prefix(MAGIC) {
            let (run, rest) = split_array::<16>(rest)?;
            (Some(RunName(run)), rest)
        } else {
            (
                None,
                bytes.strip_prefix(MAGIC_V1).ok_or(StateError::Foreign)?,
            )
        };
        let (count, mut rest) = split_array::<4>(rest)?;
        let count =
            usize::try_from(u32::from_le_bytes(count)).map_err(|_| StateError::Malformed)?;
        if rest.len() < count.saturating_mul(4) {
            return Err(StateError::Malformed);
        }
        let mut tokens = Vec::with_capacity(count);
        for _ in 0..count {
            let (token, tail) = split_array::<4>(rest)?;
            tokens.push(i32::from_le_bytes(token));
            rest = tail;
        }
        let ([pending_len], rest) = split_array::<1>(rest)?;
        if rest.len() != usize::from(pending_len) {
            return Err(StateError::Malformed);
        }
        Ok(Self {
            run,
            tokens,
            pending: rest.to_vec(),
        })
    }
}

fn split_array<const N: usize>(bytes: &[u8]) -> Result<([u8; N], &[u8]), StateError> {
    if bytes.len() < N {
        return Err(StateError::Malformed);
    }
    let (head, tail) = bytes.split_at(N);
    let head: [u8; N] = head.try_into().map_err(|_| StateError::Malformed)?;
    Ok((head, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips() {
        let state = GenerationState::new(vec![1, -2, 300_000], vec![0xE2, 0x82]);
        assert_eq!(GenerationState::decode(&state.encode()), Ok(state));
        let empty = GenerationState::default();
        assert_eq!(GenerationState::decode(&empty.encode()), Ok(empty));
        let named = GenerationState::new(vec![5, 6], vec![]).with_run(RunName([7; 16]));
        assert_eq!(named.encode().len(), 4 + 16 + 4 + 8 + 1);
        assert_eq!(GenerationState::decode(&named.encode()), Ok(named));
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
        assert_eq!(GenerationState::decode(b""), Err(StateError::Foreign));
        assert_eq!(
            GenerationState::decode(b"{\"next\":3}"),
            Err(StateError::Foreign)
        );
        let bytes = GenerationState::new(vec![1, 2], vec![])
            .with_run(RunName([1; 16]))
            .encode();
        for cut in 4..bytes.len() {
            assert_eq!(
                GenerationState::decode(&bytes[..cut]),
                Err(StateError::Malformed),
                "{cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(GenerationState::decode(&long), Err(StateError::Malformed));
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
