//! Run-once scheduled jobs: every instance's scheduler fires, one instance runs the tick.
//!
//! A job is a lock under keys of its own (`prefix{tag}job:NAME`, see `protocol::keys`) held
//! for at most `at_most_for` (a fixed lease nobody renews, so a crashed runner frees it), plus
//! a tick record (`prefix{tag}job-tick:NAME`) naming the newest tick begun, its runner and the
//! runner's fencing token. The lock makes runs exclusive; the record makes each tick run at
//! most once, across instances whose clocks or wake-ups differ (`job_begin.lua`). Instances
//! that lose never wait: they skip, and the outcome says why.

mod options;
mod outcome;
pub(crate) mod run;
mod ticks;

pub use options::{JobOptions, OnFailure, OnRunnerDeath};
pub use outcome::{JobOutcome, TickRecord};
pub use ticks::Ticks;

use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::client::LockClient;
use super::handle::Handle;
use super::lock::Lock;
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::protocol::{self, millis, LockKeys, RunEnd, Tick};
use run::{Began, Begun, RunHold, Started};

/// The latest tick accepted: 2^53 ms after the Unix epoch, the last millisecond a Lua number
/// holds exactly (about the year 287 396).
const MAX_TICK_MS: u64 = 1 << 53;

/// A scheduled job under one name, made by [`LockClient::job`]: call
/// [`run_exclusive`](Job::run_exclusive) from every instance's scheduler, and each tick runs
/// on one instance, once.
///
/// Keys are the job's own (`job:` and `job-tick:` after the slot tag), so no lock or election
/// name collides with a job name.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// use std::time::Duration;
/// use fencelock::JobOptions;
/// let report = client.job(
///     "nightly-report",
///     JobOptions::new(Duration::from_secs(24 * 3600), Duration::from_secs(600)),
/// )?;
/// // Midnight UTC, named alike on every instance: never `SystemTime::now()` at wake-up.
/// let mut ticks = report.ticks();
/// loop {
///     let tick = ticks.next().await; // the instant this tick was scheduled for
///     let outcome = report.run_exclusive(tick, |run| async move {
///         println!("running with token {}", run.token()); // fence the job's writes with it
///     }).await?;
///     println!("ran here: {}", outcome.ran());
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct Job {
    lock: Lock,
    options: JobOptions,
}

debug_struct!(Job(self) {
    name: String::from_utf8_lossy(self.name()),
    options: self.options,
} ..);

impl LockClient {
    /// A handle to the scheduled job called `name`, run as `options` say. Names follow the
    /// lock-name rules (1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) arbitrary bytes). Nothing
    /// is sent to Redis until a run or read. Every instance should use the same options for a
    /// name (the period decides which calls are the same tick).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name; [`Error::InvalidLease`] for an
    /// unusable `at_most_for` (as a lock lease: 1 ms to 7 days, whole milliseconds);
    /// [`Error::InvalidJob`] for a period under 2 ms or over ten years, an `at_least_for`
    /// longer than `at_most_for` or not shorter than the period, a retention shorter than the period or `at_most_for`, or a
    /// duration that is not a whole number of milliseconds.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// use fencelock::JobOptions;
    /// let job = client.job("cleanup", JobOptions::new(Duration::from_secs(60), Duration::from_secs(30)))?;
    /// let bad = JobOptions::new(Duration::from_secs(60), Duration::from_secs(30))
    ///     .at_least_for(Duration::from_secs(40));
    /// assert!(client.job("cleanup", bad).unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn job(&self, name: impl AsRef<[u8]>, options: JobOptions) -> Result<Job, Error> {
        let handle = Handle::named(self, name.as_ref(), LockKeys::job)?;
        options.validate()?;
        let lock = Lock::of(handle).with_lease(options.at_most_for)?;
        Ok(Job { lock, options })
    }
}

/// What the job itself gets to know about its run: the token to fence its writes with, the
/// tick, and whether its hold still stands.
///
/// ```no_run
/// # async fn demo(job: fencelock::Job, client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let ledger = client.resource("ledger")?;
/// let tick = job.ticks().next().await; // the scheduled instant, the same on every instance
/// job.run_exclusive(tick, |run| async move {
///     // Refused with StaleToken once a newer run wrote: a frozen runner cannot write late.
///     ledger.incr_by(run.token(), 1).await
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JobRun {
    tick: SystemTime,
    run: RunHold,
}

debug_struct!(JobRun(self) {
    job: String::from_utf8_lossy(&self.run.holder.name),
    token: self.token(),
    tick: self.tick,
    took_over: self.run.took_over,
});

impl JobRun {
    run::run_view_accessors!();

    /// The tick this run is for, as this instance's scheduler gave it.
    pub fn tick(&self) -> SystemTime {
        self.tick
    }
}

/// A tick this instance has begun: the job's lock, the run as the job sees it, and what its
/// finish needs.
pub(crate) struct ActiveRun {
    job: Job,
    run: Started,
    pub(crate) view: JobRun,
    tick_ms: u64,
    started_at: Instant,
}

impl Job {
    /// The job's name, as given to [`LockClient::job`].
    pub fn name(&self) -> &[u8] {
        self.lock.name()
    }

    /// A handle to the same job whose runs' holds carry `label`: what operators see next to
    /// a running tick (`fencelock jobs`, the admin API's
    /// [`JobInfo::runner_label`](crate::admin::JobInfo::runner_label)), such as the deployment
    /// or the trigger of this instance's scheduler. Stored with the run's hold of the job's
    /// lock by its own acquisition ([`Lock::with_label`]), and gone when the hold ends.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a label that is empty, over 256 bytes, or has control
    /// characters.
    ///
    /// ```no_run
    /// # async fn demo(job: fencelock::Job, tick: std::time::SystemTime) -> Result<(), fencelock::Error> {
    /// let outcome = job.with_label("nightly-cron")?.run_exclusive(tick, |_run| async {}).await?;
    /// assert!(job.with_label("").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Job, Error> {
        let lock = self.lock.with_label(label)?;
        Ok(Job {
            lock,
            ..self.clone()
        })
    }

    /// The label this handle's runs carry ([`Job::with_label`]).
    pub fn label(&self) -> Option<&str> {
        self.lock.label()
    }

    /// The job's options, as given to [`LockClient::job`].
    pub fn options(&self) -> &JobOptions {
        &self.options
    }

    /// The instants of the job's period, aligned to the Unix epoch, to pass to
    /// [`Job::run_exclusive`]: the same on every instance, whenever it started (see
    /// [`Ticks`]).
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// use fencelock::JobOptions;
    /// let cleanup = client.job("cleanup", JobOptions::new(Duration::from_secs(60), Duration::from_secs(30)))?;
    /// let mut ticks = cleanup.ticks();
    /// loop {
    ///     let tick = ticks.next().await; // :00 of every minute, on every instance alike
    ///     cleanup.run_exclusive(tick, |_run| async {}).await?;
    /// }
    /// # }
    /// ```
    pub fn ticks(&self) -> Ticks {
        Ticks::new(self.options.period())
    }

    /// Runs `job` for `tick` if no instance has run or is running it, and returns at once
    /// otherwise: never waits for another instance.
    ///
    /// `tick` is the scheduled instant the caller's scheduler fired for ([`Job::ticks`], a cron
    /// library, a queue message), never the moment it woke: every instance passes its own
    /// view of the same instant, and views less than half the period apart are the same tick.
    /// That rule holds when every instance's view of one tick is within half a period of
    /// every other's; [`Ticks`] gives all of them the same instant, so only their clocks'
    /// skew counts. (`SystemTime::now()` at each wake-up of a `tokio::time::interval` does
    /// not: instances started more than half a period apart fire at different moments, and
    /// each would run the period's tick.) A run takes the job's lock for at most `at_most_for`,
    /// records the tick as running with its fencing token, runs `job` with a [`JobRun`], then
    /// records the tick done (fenced by the token) and keeps the lock until `at_least_for`
    /// after the start or releases it.
    ///
    /// At most once per tick: a tick recorded done is never run again, nor is any tick half a
    /// period or more older than the newest one begun; a tick whose runner died is run again
    /// only under [`OnRunnerDeath::RunAgain`]. Within the record's retention.
    ///
    /// # Errors
    /// [`Error::InvalidJob`] for a tick before the Unix epoch or after the year 287 396
    /// (nothing sent). [`Error::StaleToken`] when the job ran but another instance took the
    /// tick over before it was recorded done (this run's hold had ended: `at_most_for` is
    /// shorter than the run, or the process froze); the record stays the newer runner's.
    /// [`Error::NotHeld`] when the job's lock was lost between winning it and recording the
    /// tick (deleted by an operator; nothing ran). [`Error::WrongType`] when a key of the job
    /// holds foreign data; [`Error::Redis`] when Redis could not be reached within the retry
    /// window: before the job ran, it did not run; after it ran, the tick may stay recorded
    /// as running, the lock is kept until `at_most_for` ends, and the policy then decides.
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense of "no effect": dropping the call stops the job where it
    /// is. Dropped while taking the lock: the acquisition is undone, nothing is recorded.
    /// Dropped after the tick was recorded as running (while recording, during `job` or while
    /// recording it done): the lock is released in the background; if the done record had
    /// not landed, the tick counts as one whose runner died, and the policy decides.
    pub async fn run_exclusive<F, Fut, T>(
        &self,
        tick: SystemTime,
        job: F,
    ) -> Result<JobOutcome<T>, Error>
    where
        F: FnOnce(JobRun) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_ending(tick, job, |_| RunEnd::Done).await
    }

    /// [`Job::run_exclusive`] for a job that can fail: when it returns an error, the job's
    /// [`OnFailure`] policy decides. Under [`OnFailure::Retry`] (the default) the tick is
    /// recorded as failed and the job released at once, so the next call for the same tick
    /// (this instance retrying, or any other) runs it again with a newer token; under
    /// [`OnFailure::RecordDone`] the tick is recorded done, as after a success. Either way the
    /// error comes back as the output of [`JobOutcome::Ran`]. A job that returns `Ok` is
    /// recorded done, as by `run_exclusive`.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// use fencelock::{JobOptions, JobOutcome};
    /// let export = client.job("export", JobOptions::new(Duration::from_secs(3600), Duration::from_secs(600)))?;
    /// let mut ticks = export.ticks();
    /// let tick = ticks.next().await;
    /// for _attempt in 0..3 {
    ///     let outcome = export.run_fallible(tick, |_run| async {
    ///         Err::<(), &str>("the warehouse did not answer")
    ///     }).await?;
    ///     match outcome {
    ///         JobOutcome::Ran { output: Err(_), .. } => continue, // left to a retry: try again
    ///         _ => break, // ran, or another instance has it
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Job::run_exclusive`].
    ///
    /// # Cancel safety
    /// As [`Job::run_exclusive`].
    pub async fn run_fallible<F, Fut, T, E>(
        &self,
        tick: SystemTime,
        job: F,
    ) -> Result<JobOutcome<Result<T, E>>, Error>
    where
        F: FnOnce(JobRun) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_ending(tick, job, |output| self.ended_as(output.is_ok()))
            .await
    }

    /// Runs `job` for `tick` as [`Job::run_exclusive`] says, recording its end as `end` says
    /// of its output.
    async fn run_ending<F, Fut, T>(
        &self,
        tick: SystemTime,
        job: F,
        end: impl FnOnce(&T) -> RunEnd,
    ) -> Result<JobOutcome<T>, Error>
    where
        F: FnOnce(JobRun) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.begin(tick).await? {
            Begun::Answered(skip) => Ok(skip),
            Begun::Run(run) => {
                let output = job(run.view.clone()).await;
                let end = end(&output);
                run.finish(output, end).await
            }
        }
    }

    /// How a run that succeeded (or not) is recorded, by the failure policy.
    pub(crate) fn ended_as(&self, succeeded: bool) -> RunEnd {
        match (succeeded, self.options.on_failure) {
            (false, OnFailure::Retry) => RunEnd::Failed,
            _ => RunEnd::Done,
        }
    }

    /// The newest tick begun within the record's retention, read once: who runs or ran it,
    /// with which token, and whether it finished.
    ///
    /// # Errors
    /// [`Error::WrongType`] when a key of the job holds foreign data; [`Error::Redis`] when
    /// Redis could not be reached within the retry window.
    ///
    /// # Cancel safety
    /// Cancel safe: one read-only script.
    pub async fn last_tick(&self) -> Result<Option<TickRecord>, Error> {
        Ok(self.read().await?.record.map(TickRecord::from))
    }

    async fn read(&self) -> Result<protocol::JobRead, Error> {
        let keys = self.lock.keys();
        let engine = self.lock.handle.engine();
        engine
            .retrying(|mut conn| async move { protocol::job_read(&mut conn, keys).await })
            .await
            .map_err(|err| err.named(self.lock.name()))
    }

    /// Takes the job's lock and records the tick as this instance's, or finds why not.
    pub(crate) async fn begin<T>(
        &self,
        tick: SystemTime,
    ) -> Result<Begun<ActiveRun, JobOutcome<T>>, Error> {
        let tick_ms = tick_millis(tick)?;
        let started_at = Instant::now();
        let Some(guard) = self.lock.try_acquire().await? else {
            let skip = self.busy(tick_ms).await;
            return self.report_skip(tick_ms, skip);
        };
        let options = &self.options;
        // The tick's own arguments: the tick, and the period that says which views are one.
        let own = (tick_ms, millis(options.period));
        let began = run::begin::<Tick, _>(guard, own, options.retention(), options.on_runner_death);
        let skip = match began.await {
            Ok(Began::Run(run)) => {
                let view = JobRun {
                    tick,
                    run: run.hold.clone(),
                };
                return Ok(Begun::Run(ActiveRun {
                    job: self.clone(),
                    run,
                    view,
                    tick_ms,
                    started_at,
                }));
            }
            Ok(Began::Done(record)) => Ok(JobOutcome::SkippedDone { record }),
            Ok(Began::Abandoned(record)) => Ok(JobOutcome::SkippedAbandoned { record }),
            Ok(Began::Refused(record)) => Ok(JobOutcome::SkippedLate { record }),
            Err(err) => Err(err),
        };
        self.report_skip(tick_ms, skip)
    }

    /// Why a busy job skips this tick, from its record and its lock's holder.
    async fn busy<T>(&self, tick_ms: u64) -> Result<JobOutcome<T>, Error> {
        let read = self.read().await?;
        let Some(record) = read.record else {
            return Ok(JobOutcome::SkippedRunning { record: None });
        };
        let alive = read.lock_token == Some(record.token);
        let distance = 2 * (i128::from(tick_ms) - i128::from(record.own.tick_ms));
        let period = i128::from(millis(self.options.period));
        let done = record.finished_ms.is_some();
        let record = TickRecord::from(record);
        Ok(if distance <= -period {
            JobOutcome::SkippedLate { record }
        } else if distance < period && done {
            JobOutcome::SkippedDone { record }
        } else {
            JobOutcome::SkippedRunning {
                record: alive.then_some(record),
            }
        })
    }

    fn report_skip<T>(
        &self,
        tick_ms: u64,
        skip: Result<JobOutcome<T>, Error>,
    ) -> Result<Begun<ActiveRun, JobOutcome<T>>, Error> {
        let skip = skip.map_err(|err| self.report_error(tick_ms, err))?;
        metrics::job(skip.label());
        tracing::debug!(
            name: "fencelock.job",
            job = %String::from_utf8_lossy(self.name()),
            tick_ms,
            outcome = skip.label(),
            runner = skip.record().map(TickRecord::runner),
            runner_token = skip.record().map(|record| record.token().get()),
            "job tick skipped"
        );
        Ok(Begun::Answered(skip))
    }

    fn report_error(&self, tick_ms: u64, err: Error) -> Error {
        metrics::job(metrics::ERROR);
        tracing::warn!(
            name: "fencelock.job",
            job = %String::from_utf8_lossy(self.name()),
            tick_ms,
            outcome = metrics::ERROR,
            error = %err,
            "job tick failed"
        );
        err
    }
}

impl ActiveRun {
    /// Records the tick done or failed (fenced by the token), and the run with the job's
    /// `output`. Done: keeps the job held until `at_least_for` after the start, or releases
    /// it. Failed: releases it at once, so the tick's retry need not wait.
    pub(crate) async fn finish<T>(self, output: T, end: RunEnd) -> Result<JobOutcome<T>, Error> {
        let report = |err| self.job.report_error(self.tick_ms, err);
        let (guard, run_ms) = self
            .run
            .finish::<Tick>(self.tick_ms, end, None, report)
            .await?;
        // A failed tick is released at once, so that its retry need not wait.
        let (label, at_least_for) = match end {
            RunEnd::Failed => (metrics::JOB_RAN_FAILED, Duration::ZERO),
            RunEnd::Done | RunEnd::Final => (metrics::JOB_RAN, self.job.options.at_least_for),
        };
        metrics::job(label);
        tracing::debug!(
            name: "fencelock.job",
            job = %String::from_utf8_lossy(self.job.name()),
            tick_ms = self.tick_ms,
            outcome = label,
            runner = self.view.run.holder.id.as_str(),
            token = self.view.token().get(),
            took_over = self.view.run.took_over.map(FencingToken::get),
            run_ms,
            "job tick ran"
        );
        let keep = round_up_to_millis(at_least_for.saturating_sub(self.started_at.elapsed()));
        if keep.is_zero() {
            // A failed release (the hold had ended, Redis is away) changes nothing for the
            // caller: the done record is what keeps the tick from running again.
            let _ = guard.release().await;
        } else if guard.extend(keep).await.is_ok() {
            guard.keep_until_lease_ends();
        }
        Ok(JobOutcome::Ran {
            token: self.view.token(),
            output,
        })
    }
}

/// `tick` in whole milliseconds since the Unix epoch (sub-millisecond parts dropped: they are
/// far below any clock skew), if the scripts can hold it exactly.
fn tick_millis(tick: SystemTime) -> Result<u64, Error> {
    let since = tick
        .duration_since(UNIX_EPOCH)
        .map_err(|_| Error::InvalidJob {
            reason: format!("the tick {tick:?} lies before the Unix epoch"),
        })?;
    u64::try_from(since.as_millis())
        .ok()
        .filter(|ms| *ms <= MAX_TICK_MS)
        .ok_or_else(|| Error::InvalidJob {
            reason: format!("the tick {tick:?} lies more than 2^53 ms after the Unix epoch"),
        })
}

/// A lease for the rest of `at_least_for`: whole milliseconds, rounded up so the job is never
/// held shorter than asked.
fn round_up_to_millis(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::run::MAX_SPAN;
    use super::*;

    fn options() -> JobOptions {
        JobOptions::new(Duration::from_secs(10), Duration::from_secs(5))
    }

    #[test]
    fn options_are_checked_before_anything_is_sent() {
        options().validate().unwrap();
        let ms = Duration::from_millis;
        for (bad, why) in [
            (JobOptions::new(ms(1), ms(1)), "under"),
            (
                JobOptions::new(Duration::from_nanos(10_500_000), ms(5)),
                "whole",
            ),
            (JobOptions::new(MAX_SPAN + ms(1), ms(5)), "ten years"),
            (
                options().at_least_for(Duration::from_secs(6)),
                "longer than at_most_for",
            ),
            (
                JobOptions::new(Duration::from_secs(10), Duration::from_secs(20))
                    .at_least_for(Duration::from_secs(10)),
                "not shorter than the period",
            ),
            (options().at_least_for(Duration::from_micros(1500)), "whole"),
            (options().with_retention(Duration::from_secs(9)), "shorter"),
        ] {
            let err = bad.validate().unwrap_err();
            assert!(err.is_invalid_input(), "{bad:?}: {err}");
            assert!(err.to_string().contains(why), "{bad:?}: {err}");
        }
        // The boundaries are accepted: a hold of exactly at_most_for after a run, a
        // retention of exactly the period (or at_most_for).
        options()
            .at_least_for(Duration::from_secs(5))
            .validate()
            .unwrap();
        options()
            .with_retention(Duration::from_secs(10))
            .validate()
            .unwrap();
        // Ten years of 366 days is the longest span; a millisecond more is refused.
        let ten_years = Duration::from_secs(316_224_000);
        JobOptions::new(ten_years, ms(5)).validate().unwrap();
        let err = JobOptions::new(ten_years + ms(1), ms(5))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("ten years"), "{err}");
        let err = JobOptions::new(ms(10), Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidLease { .. }), "{err}");
    }

    #[test]
    fn options_read_back_as_given() {
        let options = JobOptions::new(Duration::from_secs(60), Duration::from_secs(50))
            .at_least_for(Duration::from_secs(7))
            .with_retention(Duration::from_secs(600))
            .on_runner_death(OnRunnerDeath::RunAgain);
        assert_eq!(options.period(), Duration::from_secs(60));
        assert_eq!(options.at_most_for(), Duration::from_secs(50));
        assert_eq!(options.minimum_hold(), Duration::from_secs(7));
        assert_eq!(options.retention(), Duration::from_secs(600));
        assert_eq!(options.runner_death_policy(), OnRunnerDeath::RunAgain);
        let defaults = JobOptions::new(Duration::from_secs(60), Duration::from_secs(50));
        assert_eq!(defaults.minimum_hold(), Duration::ZERO);
        assert_eq!(defaults.runner_death_policy(), OnRunnerDeath::GiveUp);
    }

    fn record(token: u64, finished: Option<u64>) -> TickRecord {
        TickRecord::from(protocol::TickRecord {
            runner: "client:7".into(),
            token: FencingToken::new(token).unwrap(),
            started_ms: 2_000,
            finished_ms: finished,
            failed_ms: None,
            own: Tick { tick_ms: 1_000 },
        })
    }

    #[test]
    fn a_tick_record_reads_back_what_the_scripts_answered() {
        let done = record(42, Some(3_000));
        assert_eq!(done.tick(), UNIX_EPOCH + Duration::from_secs(1));
        assert_eq!(done.runner(), "client:7");
        assert_eq!(done.token().get(), 42);
        assert_eq!(done.started(), UNIX_EPOCH + Duration::from_secs(2));
        assert_eq!(done.finished(), Some(UNIX_EPOCH + Duration::from_secs(3)));
        assert_eq!(record(42, None).finished(), None);
    }

    #[test]
    fn outcomes_say_whether_it_ran_with_which_token_and_why_not() {
        let token = FencingToken::new(9).unwrap();
        let ran = JobOutcome::Ran {
            token,
            output: "out",
        };
        assert!(ran.ran());
        assert_eq!(ran.token(), Some(token));
        assert_eq!(ran.record(), None);
        assert_eq!(ran.into_output(), Some("out"));
        let skips: [(JobOutcome<()>, _, _); 5] = [
            (
                JobOutcome::SkippedRunning {
                    record: Some(record(1, None)),
                },
                metrics::JOB_RUNNING,
                Some(1),
            ),
            (
                JobOutcome::SkippedRunning { record: None },
                metrics::JOB_RUNNING,
                None,
            ),
            (
                JobOutcome::SkippedDone {
                    record: record(2, Some(5)),
                },
                metrics::JOB_DONE,
                Some(2),
            ),
            (
                JobOutcome::SkippedAbandoned {
                    record: record(3, None),
                },
                metrics::JOB_ABANDONED,
                Some(3),
            ),
            (
                JobOutcome::SkippedLate {
                    record: record(4, Some(5)),
                },
                metrics::JOB_LATE,
                Some(4),
            ),
        ];
        for (outcome, label, token) in skips {
            assert_eq!(outcome.label(), label);
            let expected = token.map(|token| FencingToken::new(token).unwrap());
            assert!(!outcome.ran());
            assert_eq!(outcome.token(), None);
            assert_eq!(outcome.record().map(TickRecord::token), expected);
            assert_eq!(outcome.into_output(), None);
        }
        let labels = [
            metrics::JOB_RUNNING,
            metrics::JOB_DONE,
            metrics::JOB_ABANDONED,
            metrics::JOB_LATE,
        ];
        assert_eq!(
            labels,
            [
                "skipped_running",
                "skipped_done",
                "skipped_abandoned",
                "skipped_late"
            ]
        );
    }

    #[test]
    fn the_default_retention_covers_the_next_tick_and_the_longest_hold() {
        assert_eq!(options().retention(), Duration::from_secs(20));
        let long_runs = JobOptions::new(Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(long_runs.retention(), Duration::from_secs(120));
        // Options not validated yet (the getter is public): capped, not an overflow.
        let unbounded = JobOptions::new(Duration::MAX, Duration::from_secs(1));
        assert_eq!(unbounded.retention(), super::run::MAX_SPAN);
    }

    #[test]
    fn ticks_are_whole_milliseconds_since_the_epoch_within_what_lua_holds() {
        let tick = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        assert_eq!(tick_millis(tick).unwrap(), 1_700_000_000_123);
        assert_eq!(tick_millis(UNIX_EPOCH).unwrap(), 0);
        let before = UNIX_EPOCH - Duration::from_millis(1);
        assert!(tick_millis(before).unwrap_err().is_invalid_input());
        let last = UNIX_EPOCH + Duration::from_millis(MAX_TICK_MS);
        assert_eq!(tick_millis(last).unwrap(), MAX_TICK_MS);
        let after = last + Duration::from_millis(1);
        assert!(tick_millis(after).unwrap_err().is_invalid_input());
    }

    #[test]
    fn the_rest_of_at_least_for_is_rounded_up() {
        assert_eq!(round_up_to_millis(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            round_up_to_millis(Duration::from_micros(1)),
            Duration::from_millis(1)
        );
        assert_eq!(
            round_up_to_millis(Duration::from_micros(2001)),
            Duration::from_millis(3)
        );
    }
}
