//! The benchmark harness's shared parts, used by both of its binaries, `lmsp-bench` (the whole
//! service) and `storage-bench` (the storage adapter alone): the raw ceilings (bare SQL on a
//! connection of its own, what a durable service on this machine cannot beat), and the values
//! the harness writes through the storage port ([`fixtures`]).

pub mod ceilings;
pub mod fixtures;
