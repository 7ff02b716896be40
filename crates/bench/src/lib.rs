//! The benchmark harness's shared parts: the raw ceilings (bare SQL on a connection of its own,
//! what a durable service on this machine cannot beat), used by both of its binaries,
//! `lmsp-bench` (the whole service) and `storage-bench` (the storage adapter alone).

pub mod ceilings;
