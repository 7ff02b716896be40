//! The deterministic reference engine (seeded n-gram sampler).
