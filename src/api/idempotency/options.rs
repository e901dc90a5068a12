//! How an idempotency namespace runs its keys: how long a run may hold a key, how long a
//! result is kept, whether a duplicate waits for a run in progress, and what becomes of a
//! run whose runner died.

use std::time::Duration;

#[cfg(doc)]
use super::{Idempotency, Processed};
use crate::api::job::run::{check_span, MAX_SPAN};
use crate::api::job::OnRunnerDeath;
use crate::base::durations::validate_lease;
use crate::base::error::Error;

/// The longest a duplicate may wait for a run in progress: one day.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// The default retention of a key's record: one day, as payment APIs keep their keys.
const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How the keys of one idempotency namespace run.
///
/// ```
/// use std::time::Duration;
/// use fencelock::{IdempotencyOptions, OnRunnerDeath};
/// let options = IdempotencyOptions::new(Duration::from_secs(30))
///     .with_retention(Duration::from_secs(7 * 24 * 3600))
///     .wait_for_outcome(Duration::from_secs(5));
/// assert_eq!(options.runner_death_policy(), OnRunnerDeath::RunAgain);
/// assert_eq!(options.outcome_wait(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyOptions {
    pub(super) at_most_for: Duration,
    pub(super) retention: Duration,
    pub(super) wait: Duration,
    pub(super) on_runner_death: OnRunnerDeath,
}

impl IdempotencyOptions {
    /// Keys whose run holds the key for at most `at_most_for`: the key's lock is taken with
    /// this lease and nobody renews it, so a crashed runner frees the key when it ends. Choose
    /// it longer than the longest run: once it ends, a duplicate may run the request again
    /// ([`OnRunnerDeath::RunAgain`], the default here) while the first runner still runs (its
    /// fenced writes and its result are then refused).
    pub fn new(at_most_for: Duration) -> IdempotencyOptions {
        IdempotencyOptions {
            at_most_for,
            retention: DEFAULT_RETENTION,
            wait: Duration::ZERO,
            on_runner_death: OnRunnerDeath::RunAgain,
        }
    }

    setters! {
        /// How long a key's record (and so its stored result) is kept after its last write: a
        /// duplicate that comes later runs the request again. At least `at_most_for`, at most ten
        /// years; default one day.
        #[must_use]
        fn with_retention(retention: Duration) -> IdempotencyOptions => retention;

        /// A duplicate that finds its key's run in progress waits up to `wait` for that run's
        /// outcome (woken by its release, not by polling) and answers with the stored result, or
        /// runs the request itself if that run failed or died. Default zero: answer
        /// [`Processed::InProgress`] at once. At most one day.
        #[must_use]
        fn wait_for_outcome(wait: Duration) -> IdempotencyOptions => wait;

        /// What happens to a key whose runner lost its hold before finishing: it crashed, froze
        /// past `at_most_for`, or its [`Idempotency::run`] was dropped mid-run. Default
        /// [`OnRunnerDeath::RunAgain`]: the next duplicate runs the request with a newer token
        /// (fence its writes). [`OnRunnerDeath::GiveUp`] answers [`Processed::Abandoned`] instead,
        /// for requests whose half-done run must be looked at by hand. (Jobs default to
        /// `GiveUp`: [`OnRunnerDeath`] says why the two differ.)
        #[must_use]
        fn on_runner_death(policy: OnRunnerDeath) -> IdempotencyOptions => on_runner_death;
    }

    getters! {
        /// The hold's cap given to [`IdempotencyOptions::new`].
        fn at_most_for(&self) -> Duration => at_most_for;

        /// How long a record is kept after its last write.
        fn retention(&self) -> Duration => retention;

        /// How long a duplicate waits for a run in progress.
        fn outcome_wait(&self) -> Duration => wait;

        /// The policy for a dead runner's key.
        fn runner_death_policy(&self) -> OnRunnerDeath => on_runner_death;
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| Err(Error::InvalidIdempotency { reason });
        validate_lease(self.at_most_for)?;
        let span = |what, d, max: Duration| {
            check_span(what, d, Duration::ZERO, (max, &format!("{max:?}")))
                .map_err(|reason| Error::InvalidIdempotency { reason })
        };
        span("retention", self.retention, MAX_SPAN)?;
        span("outcome wait", self.wait, MAX_WAIT)?;
        if self.retention < self.at_most_for {
            return invalid(format!(
                "the retention {:?} is shorter than at_most_for {:?}; a running key's record \
                 would be gone before its run",
                self.retention, self.at_most_for
            ));
        }
        Ok(())
    }
}
