//! Work that runs once: scheduled jobs on aligned ticks, idempotency keys, and leader
//! elections.
//!
//! One test binary, one module per part; `tests/common` is shared by every binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod election;
mod idempotency;
mod jobs;
