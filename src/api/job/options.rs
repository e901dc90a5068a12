//! How a job runs: its period, how long a run may hold it, how long its record is kept, and
//! what happens to a tick whose runner died.

use std::time::Duration;

use super::run::{check_span, MAX_SPAN};
#[cfg(doc)]
use super::{Job, JobOutcome, JobRun};
use crate::base::durations::validate_lease;
use crate::base::error::Error;

/// What happens to a run whose runner lost its hold before finishing: it crashed, froze past
/// `at_most_for`, or its call was cancelled mid-run. Jobs ([`JobOptions::on_runner_death`])
/// and idempotency keys ([`IdempotencyOptions::on_runner_death`]) both take it.
///
/// Either way the record still names that runner as running once its lease is over, and the
/// next call for the same tick or key decides by this policy. The runner's own late finish is
/// refused once another runner took over ([`Error::StaleToken`]).
///
/// **The default differs, on purpose.** A job gives up ([`OnRunnerDeath::GiveUp`], which
/// [`OnRunnerDeath::default`] is): nobody is waiting for a tick's answer, the next tick
/// usually catches up, and a half-done scheduled run (a batch, a report) is safer left than
/// repeated. An idempotency key runs again ([`OnRunnerDeath::RunAgain`], set by
/// [`IdempotencyOptions::new`]): a client is waiting to retry its request, and giving up would
/// answer it [`Processed::Abandoned`] until the record expires, although a run fenced by its
/// token is safe to repeat. Choose the other where those reasons do not hold.
///
/// ```
/// use std::time::Duration;
/// use fencelock::{IdempotencyOptions, JobOptions, OnRunnerDeath};
/// assert_eq!(OnRunnerDeath::default(), OnRunnerDeath::GiveUp);
/// let job = JobOptions::new(Duration::from_secs(3600), Duration::from_secs(600));
/// assert_eq!(job.runner_death_policy(), OnRunnerDeath::GiveUp);
/// let key = IdempotencyOptions::new(Duration::from_secs(30));
/// assert_eq!(key.runner_death_policy(), OnRunnerDeath::RunAgain);
/// ```
///
/// [`IdempotencyOptions::on_runner_death`]: crate::IdempotencyOptions::on_runner_death
/// [`IdempotencyOptions::new`]: crate::IdempotencyOptions::new
/// [`Processed::Abandoned`]: crate::Processed::Abandoned
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnRunnerDeath {
    /// The tick is not run again ([`JobOutcome::SkippedAbandoned`]): at most once per tick,
    /// as a plain lock-based scheduler (ShedLock) gives. For jobs whose half-done run must not
    /// be repeated, or that the next tick catches up on anyway.
    #[default]
    GiveUp,
    /// The next instance that calls for the same tick runs it again, with a newer token
    /// ([`JobRun::took_over`] says so). For jobs that are idempotent or fence their writes:
    /// the dead runner's writes with the older token are refused by fenced storage once the
    /// new runner wrote.
    RunAgain,
}

/// What [`Job::run_fallible`] does with a tick whose job returned an error.
///
/// ```
/// use fencelock::OnFailure;
/// assert_eq!(OnFailure::default(), OnFailure::Retry);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// The tick is recorded as failed and the job released at once: the next call for the same
    /// tick, from any instance (the caller retrying, a late instance), runs it again with a
    /// newer token ([`JobRun::took_over`] names the failed run's). A later tick replaces it as
    /// usual. For jobs that fence their writes or are idempotent.
    #[default]
    Retry,
    /// The tick is recorded done, as a run that succeeded: no instance runs it again. For jobs
    /// whose failure the next tick makes up for, or that must never run twice.
    RecordDone,
}

/// How a scheduled job runs: the schedule's period, how long a run may hold the job, how long
/// it keeps others off after a fast run, and what becomes of a dead runner's tick.
///
/// ```
/// use std::time::Duration;
/// use fencelock::{JobOptions, OnRunnerDeath};
/// let options = JobOptions::new(Duration::from_secs(60), Duration::from_secs(50))
///     .at_least_for(Duration::from_secs(10))
///     .on_runner_death(OnRunnerDeath::RunAgain);
/// assert_eq!(options.retention(), Duration::from_secs(120));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOptions {
    pub(super) period: Duration,
    pub(super) at_most_for: Duration,
    pub(super) at_least_for: Duration,
    pub(super) retention: Option<Duration>,
    pub(super) on_runner_death: OnRunnerDeath,
    pub(super) on_failure: OnFailure,
}

impl JobOptions {
    /// A job whose ticks are at least `period` apart, a run of which holds the job for at most
    /// `at_most_for`.
    ///
    /// `period` is the shortest interval between two ticks of the schedule (for a cron
    /// schedule, the smallest gap). Two calls whose ticks are less than half a period apart
    /// are the same tick: instance clocks (and late wake-ups) may differ by up to that.
    ///
    /// `at_most_for` is the hold's hard cap: the job's lock is taken with this lease and
    /// nobody renews it, so a crashed runner frees the job when it ends. Choose it longer than
    /// the longest run: once it ends, another instance may take the tick over
    /// ([`OnRunnerDeath::RunAgain`]) while the first is still running (its writes are then
    /// refused by fenced storage). [`JobRun::lost`] tells the job when that moment comes.
    pub fn new(period: Duration, at_most_for: Duration) -> JobOptions {
        JobOptions {
            period,
            at_most_for,
            at_least_for: Duration::ZERO,
            retention: None,
            on_runner_death: OnRunnerDeath::GiveUp,
            on_failure: OnFailure::Retry,
        }
    }

    setters! {
        /// Keeps the job held after a run until `at_least_for` after it began, so no instance can
        /// start a run (of any tick) in that time. The tick record already keeps a finished tick
        /// from running again; this adds a minimum spacing between runs, for schedules whose
        /// ticks may come closer than the clock skew. At most `at_most_for`, and shorter than the
        /// period (a longer hold would skip the next tick). Default zero.
        #[must_use]
        fn at_least_for(at_least_for: Duration) -> JobOptions => at_least_for;

        /// How long the tick record is kept after its last write. It must outlive the latest an
        /// instance may call for a tick: a call for a tick whose record has expired is not
        /// recognised as a repeat. At least the period and `at_most_for`; default twice the
        /// larger of the two (at most ten years).
        #[must_use]
        fn with_retention(retention: Duration) -> JobOptions => retention = Some(retention);

        /// What happens to a tick whose runner died mid-job; default [`OnRunnerDeath::GiveUp`]
        /// for jobs (idempotency keys default to `RunAgain`: [`OnRunnerDeath`] says why).
        #[must_use]
        fn on_runner_death(policy: OnRunnerDeath) -> JobOptions => on_runner_death;

        /// What [`Job::run_fallible`] does with a tick whose job returned an error; default
        /// [`OnFailure::Retry`].
        #[must_use]
        fn on_failure(policy: OnFailure) -> JobOptions => on_failure;
    }

    getters! {
        /// The period given to [`JobOptions::new`].
        fn period(&self) -> Duration => period;

        /// The hold's cap given to [`JobOptions::new`].
        fn at_most_for(&self) -> Duration => at_most_for;

        /// The minimum hold after a run's start ([`JobOptions::at_least_for`]).
        fn minimum_hold(&self) -> Duration => at_least_for;

        /// The policy for a tick whose job returned an error ([`Job::run_fallible`]).
        fn failure_policy(&self) -> OnFailure => on_failure;

        /// The policy for a dead runner's tick.
        fn runner_death_policy(&self) -> OnRunnerDeath => on_runner_death;
    }

    /// How long the tick record is kept after its last write.
    pub fn retention(&self) -> Duration {
        // The default never exceeds the longest span accepted, so a period of up to ten
        // years is usable without a retention of its own.
        self.retention.unwrap_or_else(|| {
            let longer = self.period.max(self.at_most_for);
            longer.saturating_mul(2).min(MAX_SPAN)
        })
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| Err(Error::InvalidJob { reason });
        let span = |what, d, min| {
            let limits = (MAX_SPAN, "ten years");
            check_span(what, d, min, limits).map_err(|reason| Error::InvalidJob { reason })
        };
        span("period", self.period, Duration::from_millis(2))?;
        validate_lease(self.at_most_for)?;
        span("at_least_for", self.at_least_for, Duration::ZERO)?;
        if self.at_least_for >= self.period {
            return invalid(format!(
                "at_least_for {:?} is not shorter than the period {:?}: the hold would outlast \
                 the next tick and skip it",
                self.at_least_for, self.period
            ));
        }
        if self.at_least_for > self.at_most_for {
            return invalid(format!(
                "at_least_for {:?} is longer than at_most_for {:?}",
                self.at_least_for, self.at_most_for
            ));
        }
        let retention = self.retention();
        span("retention", retention, Duration::from_millis(1))?;
        if retention < self.period.max(self.at_most_for) {
            return invalid(format!(
                "the retention {retention:?} is shorter than the period or at_most_for; the \
                 record would be gone before a repeat of its tick"
            ));
        }
        Ok(())
    }
}
