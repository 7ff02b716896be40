//! How the llama.cpp engine draws tokens: greedy at temperature 0, else top-p, temperature and a
//! draw seeded from the task's seed and the token's index, so that a resumed run draws exactly
//! what the uninterrupted one drew (I-6).

use lmsp_domain::task::TaskSpec;

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
