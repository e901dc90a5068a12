//! The plain lock: acquisition, waiting, renewal, cancellation, fairness, the handoff inside a
//! client, reconnects and faults, fencing, several processes, multi-locks and the blocking
//! facade.
//!
//! One test binary, one module per part; `tests/common` is shared by every binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod basics;
mod blocking;
mod cancellation;
mod fairness;
mod faults;
mod fencing;
mod handoff;
mod liveness;
mod multi_lock;
mod processes;
mod reconnect;
