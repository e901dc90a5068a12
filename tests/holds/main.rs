//! Shared holds: the expiring semaphore, the fenced read-write lock, and their grouped reads
//! and releases.
//!
//! One test binary, one module per part; `tests/common` is shared by every binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod grouped_holds;
mod rwlock;
mod semaphore;
