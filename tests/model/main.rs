//! The property harness: random programs against a reference model, concurrent interleavings
//! checked against the properties, the negative controls they must catch, and the models of
//! holds, jobs, idempotency keys and elections.
//!
//! One test binary, one module per part; `tests/common` is shared by every binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
mod harness;

mod controls;
mod election_model;
mod hold_model;
mod interleaving;
mod job_model;
mod key_model;
mod model;
