//! Concurrent interleaving check: tokio tasks in three `LockClient`s (one behind a fault
//! proxy) run generated programs against one lock and one fenced resource while the lock is
//! expired from outside and connections are cut; the recorded history must satisfy every
//! property of `fencelock::testing::check`. The harness is in `tests/harness/interleaving.rs`.
//!
//! `FENCELOCK_INTERLEAVING_CASES` sets the number of schedules (default 16).

mod common;
mod harness;

use harness::interleaving::{run_cases, World};
use harness::model::env_cases;

const REGRESSIONS: &str = "proptest-regressions/interleaving.txt";

#[test]
fn concurrent_histories_satisfy_every_property() {
    let cases = env_cases("FENCELOCK_INTERLEAVING_CASES", 16);
    let world = World::new(None);
    let started = std::time::Instant::now();
    if let Err(failure) = run_cases(&world, 3..6, cases, Some(REGRESSIONS)) {
        panic!("{failure}");
    }
    eprintln!(
        "{cases} interleaving schedules passed in {:?}",
        started.elapsed()
    );
}
