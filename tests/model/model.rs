//! Random programs of lock operations and faults (acquire, try-acquire, nested re-entry,
//! out-of-order release, extend, fenced writes, forced expiry, holder crash, `CLIENT KILL`,
//! server restart with and without data, re-sent operations, abandoned acquires, slow replies)
//! by four holders in two clients, checked step by step against a reference model of one lock
//! and one fenced resource, with the Redis state compared after every step. A failure prints
//! the violated property and the shrunk program. The harness is in `tests/model/harness/model.rs`.
//!
//! `FENCELOCK_PROPTEST_CASES` sets the number of programs (default 64).

use crate::harness::model::{env_cases, run_cases, Weights, World};

/// Failing seeds are kept here (committed) and replayed first on every run.
const REGRESSIONS: &str = "tests/proptest-regressions/model.txt";

#[test]
fn random_programs_match_the_model() {
    let cases = env_cases("FENCELOCK_PROPTEST_CASES", 64);
    let mut world = World::new(None);
    let started = std::time::Instant::now();
    if let Err(failure) = run_cases(
        &mut world,
        Weights::default(),
        1..40,
        cases,
        Some(REGRESSIONS),
    ) {
        panic!("{failure}");
    }
    eprintln!("{cases} model programs passed in {:?}", started.elapsed());
}

/// The takeover step is slow (it waits for a watchdog tick), so it has its own few programs.
#[test]
fn a_taken_over_holder_is_told_by_its_watchdog() {
    let cases = env_cases("FENCELOCK_PROPTEST_CASES", 64).div_ceil(16);
    let mut world = World::new(None);
    let weights = Weights {
        takeover: 4,
        ..Weights::default()
    };
    if let Err(failure) = run_cases(&mut world, weights, 1..12, cases, Some(REGRESSIONS)) {
        panic!("{failure}");
    }
}
