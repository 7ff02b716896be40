//! Model files on disk: path checks and streaming SHA-256.
