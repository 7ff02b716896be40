//! End-to-end tests that drive the real lmsp binary.
