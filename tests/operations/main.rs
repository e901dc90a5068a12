//! The operator's view: the admin API, stuck-lock monitoring, metrics and trace events.
//!
//! One test binary, one module per part; `tests/common` is shared by every binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod admin;
mod metrics;
mod monitoring;
mod observability;
