//! The property-test harness shared by `tests/model.rs`, `tests/interleaving.rs` and
//! `tests/controls.rs`.
#![allow(dead_code)]

pub mod interleaving;
pub mod model;
