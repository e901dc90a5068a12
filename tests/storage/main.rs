//! Fencing at the storage boundary: the failure stories, fenced SQL writes (SQLite, PostgreSQL)
//! and payments processed once across processes.
//!
//! One test binary, one module per part; `tests/common` is shared by every binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod payments;
mod sql_fencing;
mod stories;
