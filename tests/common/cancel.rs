//! Dropping an operation's future at a random point of its run, for the cancellation tests.
//!
//! A drop point is a number of yields of the task that runs the operation: fine enough to land
//! before the request is sent, while it is on the wire and after its reply came back. How many
//! yields a round trip lasts depends on the machine and its load at that moment (a few dozen on
//! a quiet laptop, hundreds on a busy two-core runner), so a fixed range can miss the round
//! trip altogether: every operation then finishes first, or none does, and the test checks one
//! side only. The range here follows what the operations took in this run: the drop point is
//! drawn from 0 to twice the yields a finished operation typically took, and that estimate
//! grows whenever operations outlast it. Half the drop points land before an operation would
//! finish and half after, whatever the machine.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use super::Rng;

/// Where to drop the next operation: a deterministic draw (replayable from the seed) over an
/// adaptive span of yields, plus, for some cases, a sleep after the yields so an operation that
/// waits for another holder can be dropped near the moment it is woken, or finish.
pub struct CancelPoints {
    rng: Rng,
    /// Yields a finished operation took, smoothed over the run.
    typical: f64,
    /// The longest sleep after the yields (zero: yields only).
    sleep_up_to: Duration,
    finished: u64,
    dropped: u64,
}

impl CancelPoints {
    pub fn new(seed: u64) -> CancelPoints {
        CancelPoints {
            rng: Rng(seed),
            typical: 40.0,
            sleep_up_to: Duration::ZERO,
            finished: 0,
            dropped: 0,
        }
    }

    /// In a quarter of the cases, also sleeps up to `limit` after the yields.
    pub fn with_sleeps_up_to(mut self, limit: Duration) -> CancelPoints {
        self.sleep_up_to = limit;
        self
    }

    /// The generator the drop points come from, for the test's own draws (so one seed replays
    /// the whole run).
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// Runs `operation` until the drop point: its output if it finished first, `None` if it was
    /// dropped.
    pub async fn run<T>(&mut self, operation: impl Future<Output = T>) -> Option<T> {
        // Truncation is fine: the span only needs to be about right.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let limit = self.rng.below(2 * self.typical as u64 + 2);
        let sleep = if self.sleep_up_to.is_zero() || self.rng.below(4) != 0 {
            Duration::ZERO
        } else {
            let micros = u64::try_from(self.sleep_up_to.as_micros()).unwrap_or(u64::MAX);
            Duration::from_micros(self.rng.below(micros.max(1)))
        };
        let passed = Cell::new(0_u64);
        let outcome = tokio::select! {
            out = operation => Some(out),
            () = async {
                while passed.get() < limit {
                    passed.set(passed.get() + 1);
                    tokio::task::yield_now().await;
                }
                tokio::time::sleep(sleep).await;
            } => None,
        };
        #[allow(clippy::cast_precision_loss)]
        if outcome.is_some() && passed.get() < limit {
            // Finished within the yields: a sample of how long an operation takes now.
            self.typical = (0.9 * self.typical + 0.1 * passed.get() as f64).max(1.0);
        } else if limit as f64 >= self.typical {
            // Outlasted a drop point beyond the estimate: operations take longer now.
            self.typical *= 1.1;
        }
        if outcome.is_some() {
            self.finished += 1;
        } else {
            self.dropped += 1;
        }
        outcome
    }

    /// Operations that finished before their drop point.
    pub fn finished(&self) -> u64 {
        self.finished
    }

    /// Checks that both sides were exercised: some operations finished, some were dropped.
    pub fn assert_both_outcomes(&self) {
        assert!(
            self.finished > 0 && self.dropped > 0,
            "{} operations finished and {} were dropped (about {:.0} yields each)",
            self.finished,
            self.dropped,
            self.typical
        );
    }
}
