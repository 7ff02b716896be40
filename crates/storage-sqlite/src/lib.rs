//! The SQLite storage adapter of the LMSP service.
