//! How the llama.cpp engine draws tokens: greedy at temperature 0, else top-p, temperature and a
//! draw seeded from the task's seed and the token's index, so that a resumed run draws exactly
//! what the uninterrupted one drew (I-6).

use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::vocab::LlamaVocab;
use lmsp_domain::task::TaskSpec;
use lmsp_domain::tools::{Logprob, TokenLogprob, TopLogprob};

/// llama.cpp's default temperature, used when a task names none.
const DEFAULT_TEMPERATURE: f32 = 0.8;

/// llama.cpp's default nucleus mass, used when a task names none.
const DEFAULT_TOP_P: f32 = 0.95;

/// How tokens are drawn.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sampling {
    /// The most likely token, always.
    Greedy,
    /// Top-p, then temperature, then a seeded draw.
    Random { temperature: f32, top_p: f32 },
}

impl Sampling {
    /// The sampling a task asks for.
    pub(crate) fn of(spec: &TaskSpec) -> Self {
        // Narrowing to llama.cpp's f32 is intended.
        #[allow(clippy::cast_possible_truncation)]
        let temperature = spec
            .temperature
            .map_or(DEFAULT_TEMPERATURE, |t| t.get() as f32);
        #[allow(clippy::cast_possible_truncation)]
        let top_p = spec.top_p.map_or(DEFAULT_TOP_P, |p| p.get() as f32);
        if temperature <= 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Random {
                temperature,
                top_p: top_p.min(1.0),
            }
        }
    }
}

/// A drawn token's log probability and the likeliest tokens at its place, from the model's
/// logits (before penalties and grammar): a pure function of the logits, so a resumed run
/// reports what the uninterrupted one reported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Probabilities {
    token: (i32, f64),
    top: Vec<(i32, f64)>,
}

impl Probabilities {
    /// The log probabilities of `token` and of the `top` likeliest tokens (ties: the lower id
    /// first) under `logits`.
    pub(crate) fn of(logits: &[f32], token: LlamaToken, top: u8) -> Self {
        let max = logits
            .iter()
            .copied()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let max = f64::from(max);
        let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
        let log_sum = max + sum.ln();
        let logprob = |id: usize| {
            logits
                .get(id)
                .map_or(f64::NEG_INFINITY, |&l| f64::from(l) - log_sum)
        };
        let mut best: Vec<usize> = Vec::with_capacity(usize::from(top) + 1);
        if top > 0 {
            for (id, &logit) in logits.iter().enumerate() {
                if best.len() == usize::from(top)
                    && best.last().is_some_and(|&last| logits[last] >= logit)
                {
                    continue;
                }
                let at = best.partition_point(|&b| logits[b] >= logit);
                best.insert(at, id);
                best.truncate(usize::from(top));
            }
        }
        let id = |index: usize| i32::try_from(index).unwrap_or(i32::MAX);
        Self {
            token: (
                token.0,
                usize::try_from(token.0).map_or(f64::NEG_INFINITY, logprob),
            ),
            top: best.into_iter().map(|b| (id(b), logprob(b))).collect(),
        }
    }

    /// The domain's form, with each token's text and bytes.
    pub(crate) fn of_vocab(&self, vocab: &LlamaVocab<'_>) -> TokenLogprob {
        let bytes = |token: i32| vocab.token_to_piece(LlamaToken(token), false, None);
        let (token, logprob) = self.token;
        let token_bytes = bytes(token);
        TokenLogprob {
            token: String::from_utf8_lossy(&token_bytes).into_owned(),
            bytes: token_bytes,
            logprob: Logprob::clamped(logprob),
            top: self
                .top
                .iter()
                .map(|&(token, logprob)| {
                    let top_bytes = bytes(token);
                    TopLogprob {
                        token: String::from_utf8_lossy(&top_bytes).into_owned(),
                        bytes: top_bytes,
                        logprob: Logprob::clamped(logprob),
                    }
                })
                .collect(),
        }
    }
}

/// The seed of the draw of output token `index`: a pure function of the task's seed and the
/// index, so a resumed run draws what the uninterrupted one drew.
pub(crate) fn draw_seed(seed: u64, index: u64) -> u32 {
    let mixed = splitmix64(seed ^ splitmix64(index));
    // Keep the low 32 bits: the truncation is the point.
    #[allow(clippy::cast_possible_truncation)]
    let low = mixed as u32;
    // llama.cpp reads u32::MAX (LLAMA_DEFAULT_SEED) as "pick a random seed".
    if low == u32::MAX {
        0x9E37_79B9
    } else {
        low
    }
}

fn splitmix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_are_a_log_softmax_and_the_top_ones_come_likeliest_first() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NEG_INFINITY];
        let probabilities = Probabilities::of(&logits, LlamaToken(2), 3);
        let total: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let expected = |l: f32| f64::from(l) - total.ln();
        assert!((probabilities.token.1 - expected(2.0)).abs() < 1e-9);
        let ids: Vec<i32> = probabilities.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!((probabilities.top[0].1 - expected(3.0)).abs() < 1e-9);
        assert!(Probabilities::of(&logits, LlamaToken(0), 0).top.is_empty());
        assert_eq!(
            Probabilities::of(&logits, LlamaToken(4), 1).token.1,
            f64::NEG_INFINITY
        );
    }

    #[test]
    fn draw_seeds_avoid_llamas_random_seed_and_differ_by_index() {
        let seeds: Vec<u32> = (0..1000).map(|i| draw_seed(7, i)).collect();
        assert!(seeds.iter().all(|&s| s != u32::MAX));
        let mut unique = seeds.clone();
        unique.sort_unstable();
        unique.dedup();
        assert!(unique.len() > 990);
        assert_eq!(draw_seed(7, 3), draw_seed(7, 3));
        assert_ne!(draw_seed(7, 3), draw_seed(8, 3));
    }
}
