//! The property-test harness shared by `tests/model/model.rs`, `tests/model/interleaving.rs` and
//! `tests/model/controls.rs`.
// Shared by several test binaries: `pub` means "for the files that include this module".
#![allow(dead_code, unreachable_pub)]

pub mod interleaving;
pub mod model;

/// The proptest configuration of a harness run: `cases` inputs, at most `max_shrink_iters`
/// shrinking steps, failing seeds kept in the `regressions` file when given.
pub fn runner_config(
    cases: u32,
    max_shrink_iters: u32,
    regressions: Option<&'static str>,
) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        max_shrink_iters,
        failure_persistence: regressions.map(|path| {
            Box::new(proptest::test_runner::FileFailurePersistence::Direct(path))
                as Box<dyn proptest::test_runner::FailurePersistence>
        }),
        ..proptest::test_runner::Config::default()
    }
}
