//! The benchmark harness's shared parts, used by its binaries, `lmsp-bench` (the whole service),
//! `storage-bench` (the storage adapter alone) and `engine-bench` (the service's overhead over
//! its engines): the raw ceilings (bare SQL on a connection of its own, what a durable service on
//! this machine cannot beat), the values the harness writes through the storage port
//! ([`fixtures`]), the service under test ([`server`]) and small statistics ([`stats`]).

pub mod ceilings;
pub mod fixtures;
pub mod server;
pub mod stats;
