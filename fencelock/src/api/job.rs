//! Run-once scheduled jobs: every instance's scheduler fires, one instance runs the tick.
//!
//! A job is a lock under keys of its own (`prefix{tag}job:NAME`, see `protocol::keys`) held
//! for at most `at_most_for` (a fixed lease nobody renews, so a crashed runner frees it), plus
//! a tick record (`prefix{tag}job-tick:NAME`) naming the newest tick begun, its runner and the
//! runner's fencing token. The lock makes runs exclusive; the record makes each tick run at
//! most once, across instances whose clocks or wake-ups differ (`job_begin.lua`). Instances
//! that lose never wait: they skip, and the outcome says why.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::client::LockClient;
use super::guard::LockGuard;
use super::lock::Lock;
use crate::base::durations::{validate_lease, whole_millis_in, OutOfRange};
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::engine::holder::Holder;
use crate::protocol::keys::validate_name;
use crate::protocol::{self, BeginReply, FinishReply, LockKeys, RunnerDeathArg, TickArgs};

/// The latest tick accepted: 2^53 ms after the Unix epoch, the last millisecond a Lua number
/// holds exactly (about the year 287 396).
const MAX_TICK_MS: u64 = 1 << 53;

/// The longest period or retention accepted: ten years. Longer is a unit mistake.
const MAX_SPAN: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// What happens to a tick whose runner lost its hold before finishing: it crashed, froze past
/// `at_most_for`, or its [`Job::run_exclusive`] was cancelled mid-job.
///
/// Either way the tick record still names that runner as running once its lease is over, and
/// an instance that calls [`Job::run_exclusive`] for the same tick after that decides by this
/// policy. The runner's own late finish is refused once another runner took the tick over
/// ([`Error::StaleToken`]).
///
/// ```
/// use fencelock::OnRunnerDeath;
/// assert_eq!(OnRunnerDeath::default(), OnRunnerDeath::GiveUp);
/// ```
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
    period: Duration,
    at_most_for: Duration,
    at_least_for: Duration,
    retention: Option<Duration>,
    on_runner_death: OnRunnerDeath,
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
        }
    }

    /// Keeps the job held after a run until `at_least_for` after it began, so no instance can
    /// start a run (of any tick) in that time. The tick record already keeps a finished tick
    /// from running again; this adds a minimum spacing between runs, for schedules whose
    /// ticks may come closer than the clock skew. At most `at_most_for`, and shorter than the
    /// period (a longer hold would skip the next tick). Default zero.
    #[must_use]
    pub fn at_least_for(mut self, at_least_for: Duration) -> JobOptions {
        self.at_least_for = at_least_for;
        self
    }

    /// How long the tick record is kept after its last write. It must outlive the latest an
    /// instance may call for a tick: a call for a tick whose record has expired is not
    /// recognised as a repeat. At least the period and `at_most_for`; default twice the
    /// larger of the two (at most ten years).
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> JobOptions {
        self.retention = Some(retention);
        self
    }

    /// What happens to a tick whose runner died mid-job; default [`OnRunnerDeath::GiveUp`].
    #[must_use]
    pub fn on_runner_death(mut self, policy: OnRunnerDeath) -> JobOptions {
        self.on_runner_death = policy;
        self
    }

    /// The period given to [`JobOptions::new`].
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The hold's cap given to [`JobOptions::new`].
    pub fn at_most_for(&self) -> Duration {
        self.at_most_for
    }

    /// The minimum hold after a run's start ([`JobOptions::at_least_for`]).
    pub fn minimum_hold(&self) -> Duration {
        self.at_least_for
    }

    /// How long the tick record is kept after its last write.
    pub fn retention(&self) -> Duration {
        // The default never exceeds the longest span accepted, so a period of up to ten
        // years is usable without a retention of its own.
        self.retention
            .unwrap_or_else(|| (2 * self.period.max(self.at_most_for)).min(MAX_SPAN))
    }

    /// The policy for a dead runner's tick.
    pub fn runner_death_policy(&self) -> OnRunnerDeath {
        self.on_runner_death
    }

    fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| Err(Error::InvalidJob { reason });
        let span = |what: &str, d: Duration, min: Duration| match whole_millis_in(d, min, MAX_SPAN)
        {
            Ok(_) => Ok(()),
            Err(OutOfRange::TooShort) => invalid(format!("the {what} {d:?} is under {min:?}")),
            Err(OutOfRange::TooLong) => invalid(format!("the {what} {d:?} is over ten years")),
            Err(OutOfRange::NotWholeMillis) => invalid(format!(
                "the {what} {d:?} is not a whole number of milliseconds"
            )),
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

/// A scheduled job under one name, made by [`LockClient::job`]: call
/// [`run_exclusive`](Job::run_exclusive) from every instance's scheduler, and each tick runs
/// on one instance, once.
///
/// Keys are the job's own (`job:` and `job-tick:` after the slot tag), so no lock or election
/// name collides with a job name.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// use std::time::{Duration, SystemTime};
/// use fencelock::JobOptions;
/// let report = client.job(
///     "nightly-report",
///     JobOptions::new(Duration::from_secs(24 * 3600), Duration::from_secs(600)),
/// )?;
/// let tick = SystemTime::now(); // the instant the scheduler fired for
/// let outcome = report.run_exclusive(tick, |run| async move {
///     println!("running with token {}", run.token()); // fence the job's writes with it
/// }).await?;
/// println!("ran here: {}", outcome.ran());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Job {
    client: LockClient,
    lock: Lock,
    options: JobOptions,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &String::from_utf8_lossy(self.name()))
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

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
        let name = name.as_ref();
        validate_name(name)?;
        options.validate()?;
        let keys = LockKeys::job(&self.engine.config.prefix, name);
        let lock = Lock::new(self.clone(), name.into(), keys).with_lease(options.at_most_for)?;
        Ok(Job {
            client: self.clone(),
            lock,
            options,
        })
    }
}

/// The tick record of a job: the newest tick begun, who ran it and with which token.
///
/// ```no_run
/// # async fn demo(job: fencelock::Job) -> Result<(), fencelock::Error> {
/// if let Some(last) = job.last_tick().await? {
///     println!("tick {:?} run by {} with token {}, done: {}",
///         last.tick(), last.runner(), last.token(), last.finished().is_some());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TickRecord {
    tick: SystemTime,
    runner: String,
    token: FencingToken,
    started: SystemTime,
    finished: Option<SystemTime>,
}

fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl From<protocol::TickRecord> for TickRecord {
    fn from(record: protocol::TickRecord) -> TickRecord {
        TickRecord {
            tick: from_millis(record.tick_ms),
            runner: record.runner,
            token: record.token,
            started: from_millis(record.started_ms),
            finished: record.finished_ms.map(from_millis),
        }
    }
}

impl TickRecord {
    /// The tick as its first runner saw it (to the millisecond). Other instances' views of the
    /// same tick differ by less than half a period.
    pub fn tick(&self) -> SystemTime {
        self.tick
    }

    /// The holder id of the runner (its client's [`id`](LockClient::id), then a sequence
    /// number).
    pub fn runner(&self) -> &str {
        &self.runner
    }

    /// The runner's fencing token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When the run began, by the Redis server's clock.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// When the run finished, by the Redis server's clock; `None` while it runs, or when its
    /// runner lost its hold before finishing.
    pub fn finished(&self) -> Option<SystemTime> {
        self.finished
    }
}

/// What [`Job::run_exclusive`] did for a tick: ran the job here, or skipped it and why.
///
/// ```no_run
/// # async fn demo(job: fencelock::Job) -> Result<(), fencelock::Error> {
/// use fencelock::JobOutcome;
/// match job.run_exclusive(std::time::SystemTime::now(), |_run| async { 42 }).await? {
///     JobOutcome::Ran { token, output } => println!("ran with token {token}: {output}"),
///     JobOutcome::SkippedRunning { runner } => println!("another instance runs it: {runner:?}"),
///     JobOutcome::SkippedDone { run } => println!("already done by {}", run.runner()),
///     JobOutcome::SkippedAbandoned { run } => println!("{} died running it", run.runner()),
///     JobOutcome::SkippedLate { newest } => println!("a newer tick began: {:?}", newest.tick()),
///     _ => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobOutcome<T> {
    /// This instance ran the job for the tick, with this fencing token, and recorded the tick
    /// done; `output` is what the job returned.
    Ran {
        /// The token the run held (strictly greater than every earlier run's of this job).
        token: FencingToken,
        /// What the job returned.
        output: T,
    },
    /// Another instance holds the job: it runs this tick, or an earlier one that outlasts its
    /// period, or it keeps the job for `at_least_for` after a run (the record's
    /// [`tick`](TickRecord::tick) and [`finished`](TickRecord::finished) say which). `None`
    /// when that holder has not recorded its tick yet (it has just won the job, or it is
    /// deciding about a dead runner's tick).
    SkippedRunning {
        /// The running tick's record.
        runner: Option<TickRecord>,
    },
    /// The tick was run already, by the instance the record names.
    SkippedDone {
        /// The finished tick's record.
        run: TickRecord,
    },
    /// The tick's runner lost its hold before finishing and the job's policy is
    /// [`OnRunnerDeath::GiveUp`].
    SkippedAbandoned {
        /// The abandoned tick's record.
        run: TickRecord,
    },
    /// A newer tick has begun (this call is at least half a period behind it), so this tick
    /// is over: run or missed, it is not run now.
    SkippedLate {
        /// The newest tick's record.
        newest: TickRecord,
    },
}

impl<T> JobOutcome<T> {
    /// Whether this instance ran the job.
    pub fn ran(&self) -> bool {
        matches!(self, JobOutcome::Ran { .. })
    }

    /// The token of this instance's run, when it ran.
    pub fn token(&self) -> Option<FencingToken> {
        match self {
            JobOutcome::Ran { token, .. } => Some(*token),
            _ => None,
        }
    }

    /// What the job returned, when it ran here.
    pub fn into_output(self) -> Option<T> {
        match self {
            JobOutcome::Ran { output, .. } => Some(output),
            _ => None,
        }
    }

    /// The record of the run that made this one skip (none for [`JobOutcome::Ran`], nor for a
    /// holder that has not recorded its tick yet).
    pub fn record(&self) -> Option<&TickRecord> {
        match self {
            JobOutcome::Ran { .. } => None,
            JobOutcome::SkippedRunning { runner } => runner.as_ref(),
            JobOutcome::SkippedDone { run } | JobOutcome::SkippedAbandoned { run } => Some(run),
            JobOutcome::SkippedLate { newest } => Some(newest),
        }
    }
}

/// Why a tick is skipped, before any output exists.
#[derive(Debug)]
pub(crate) enum Skip {
    Running(Option<TickRecord>),
    Done(TickRecord),
    Abandoned(TickRecord),
    Late(TickRecord),
}

impl Skip {
    /// The `outcome` label of the metric and the event.
    fn label(&self) -> &'static str {
        match self {
            Skip::Running(_) => metrics::JOB_RUNNING,
            Skip::Done(_) => metrics::JOB_DONE,
            Skip::Abandoned(_) => metrics::JOB_ABANDONED,
            Skip::Late(_) => metrics::JOB_LATE,
        }
    }

    fn record(&self) -> Option<&TickRecord> {
        match self {
            Skip::Running(runner) => runner.as_ref(),
            Skip::Done(run) | Skip::Abandoned(run) | Skip::Late(run) => Some(run),
        }
    }

    pub(crate) fn outcome<T>(self) -> JobOutcome<T> {
        match self {
            Skip::Running(runner) => JobOutcome::SkippedRunning { runner },
            Skip::Done(run) => JobOutcome::SkippedDone { run },
            Skip::Abandoned(run) => JobOutcome::SkippedAbandoned { run },
            Skip::Late(newest) => JobOutcome::SkippedLate { newest },
        }
    }
}

/// What the job itself gets to know about its run: the token to fence its writes with, the
/// tick, and whether its hold still stands.
///
/// ```no_run
/// # async fn demo(job: fencelock::Job, client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let ledger = client.resource("ledger")?;
/// job.run_exclusive(std::time::SystemTime::now(), |run| async move {
///     // Refused with StaleToken once a newer run wrote: a frozen runner cannot write late.
///     ledger.incr_by(run.token(), 1).await
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JobRun {
    token: FencingToken,
    tick: SystemTime,
    took_over: Option<FencingToken>,
    holder: Arc<Holder>,
}

impl std::fmt::Debug for JobRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobRun")
            .field("job", &String::from_utf8_lossy(&self.holder.name))
            .field("token", &self.token)
            .field("tick", &self.tick)
            .field("took_over", &self.took_over)
            .finish()
    }
}

impl JobRun {
    /// This run's fencing token: strictly greater than every earlier run's of this job. Pass
    /// it to every write the job makes.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The tick this run is for, as this instance's scheduler gave it.
    pub fn tick(&self) -> SystemTime {
        self.tick
    }

    /// `Some(token)` when this run takes the tick over from a runner (with that token) that
    /// lost its hold before finishing ([`OnRunnerDeath::RunAgain`]): its writes may be half
    /// done.
    pub fn took_over(&self) -> Option<FencingToken> {
        self.took_over
    }

    /// Whether the run still holds the job as far as this process knows: `at_most_for` has
    /// not passed since it began. A belief, not a proof; fence the writes with
    /// [`Self::token`].
    pub fn is_valid(&self) -> bool {
        self.holder.is_valid()
    }

    /// When the hold ends by this process' monotonic clock (`at_most_for` after the acquiring
    /// request was sent).
    pub fn valid_until(&self) -> Instant {
        self.holder.deadline()
    }

    /// Resolves when the hold has ended (`at_most_for` passed): from then on another instance
    /// may take the tick over, so a long job should stop here.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits and changes nothing.
    pub async fn lost(&self) {
        self.holder.lost().await;
    }
}

/// A tick this instance has begun: the job's lock and what its finish needs.
pub(crate) struct ActiveRun {
    job: Job,
    guard: LockGuard,
    view: JobRun,
    tick_ms: u64,
    started_ms: u64,
    started_at: Instant,
}

/// What [`Job::begin`] found: a run to do, or a skip.
pub(crate) enum Begun {
    Run(ActiveRun),
    Skipped(Skip),
}

impl Job {
    /// The job's name, as given to [`LockClient::job`].
    pub fn name(&self) -> &[u8] {
        self.lock.name()
    }

    /// The job's options, as given to [`LockClient::job`].
    pub fn options(&self) -> &JobOptions {
        &self.options
    }

    /// Runs `job` for `tick` if no instance has run or is running it, and returns at once
    /// otherwise: never waits for another instance.
    ///
    /// `tick` is the scheduled instant the caller's scheduler fired for (from
    /// `tokio::time::interval` with `SystemTime::now()`, a cron library, a queue message):
    /// every instance passes its own view of the same instant, and views less than half the
    /// period apart are the same tick. A run takes the job's lock for at most `at_most_for`,
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
        match self.begin(tick).await? {
            Begun::Skipped(skip) => Ok(skip.outcome()),
            Begun::Run(run) => {
                let output = job(run.view()).await;
                let token = run.finish().await?;
                Ok(JobOutcome::Ran { token, output })
            }
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
        self.client
            .engine
            .retrying(|mut conn| async move { protocol::job_read(&mut conn, keys).await })
            .await
    }

    /// Takes the job's lock and records the tick as this instance's, or finds why not.
    pub(crate) async fn begin(&self, tick: SystemTime) -> Result<Begun, Error> {
        let tick_ms = tick_millis(tick)?;
        let started_at = Instant::now();
        let Some(guard) = self.lock.try_acquire().await? else {
            let skip = self.busy(tick_ms).await;
            return self.report_skip(tick_ms, skip);
        };
        let args = self.args(&guard, tick_ms);
        let (keys, period) = (self.lock.keys(), self.options.period);
        let on_death = match self.options.on_runner_death {
            OnRunnerDeath::GiveUp => RunnerDeathArg::GiveUp,
            OnRunnerDeath::RunAgain => RunnerDeathArg::RunAgain,
        };
        let reply = self
            .client
            .engine
            .retrying(|mut conn| async move {
                protocol::job_begin(&mut conn, keys, args, period, on_death).await
            })
            .await;
        let skip = match reply {
            Ok(BeginReply::Begun {
                took_over,
                started_ms,
            }) => {
                let view = JobRun {
                    token: guard.token(),
                    tick,
                    took_over,
                    holder: guard.holder().clone(),
                };
                return Ok(Begun::Run(ActiveRun {
                    job: self.clone(),
                    guard,
                    view,
                    tick_ms,
                    started_ms,
                    started_at,
                }));
            }
            Ok(BeginReply::Done(record)) => Ok(Skip::Done(record.into())),
            Ok(BeginReply::Abandoned(record)) => Ok(Skip::Abandoned(record.into())),
            Ok(BeginReply::Late(record)) => Ok(Skip::Late(record.into())),
            Ok(BeginReply::NotHeld) => Err(Error::NotHeld),
            Ok(BeginReply::Newer(record)) => Err(Error::StaleToken {
                presented: guard.token(),
                latest: record.token,
            }),
            Err(err) => Err(err),
        };
        // Nothing to run: let go of the job at once (a failed release is finished in the
        // background, and the lease bounds it anyway).
        let _ = guard.release().await;
        self.report_skip(tick_ms, skip)
    }

    /// Why a busy job skips this tick, from its record and its lock's holder.
    async fn busy(&self, tick_ms: u64) -> Result<Skip, Error> {
        let read = self.read().await?;
        let Some(record) = read.record else {
            return Ok(Skip::Running(None));
        };
        let alive = read.lock_token == Some(record.token);
        let record = TickRecord::from(record);
        let distance = 2 * (i128::from(tick_ms) - millis_of(record.tick));
        let period = i128::from(millis(self.options.period));
        Ok(if distance <= -period {
            Skip::Late(record)
        } else if distance < period && record.finished.is_some() {
            Skip::Done(record)
        } else {
            Skip::Running(alive.then_some(record))
        })
    }

    fn args<'a>(&self, guard: &'a LockGuard, tick_ms: u64) -> TickArgs<'a> {
        TickArgs {
            holder: guard.holder_id(),
            token: guard.token(),
            tick_ms,
            retention: self.options.retention(),
        }
    }

    fn report_skip(&self, tick_ms: u64, skip: Result<Skip, Error>) -> Result<Begun, Error> {
        match skip {
            Ok(skip) => {
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
                Ok(Begun::Skipped(skip))
            }
            Err(err) => Err(self.report_error(tick_ms, err)),
        }
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
    /// The run as the job sees it.
    pub(crate) fn view(&self) -> JobRun {
        self.view.clone()
    }

    /// Records the tick done (fenced by the token), then keeps the job held until
    /// `at_least_for` after the start or releases it. Returns the run's token.
    pub(crate) async fn finish(self) -> Result<FencingToken, Error> {
        let ActiveRun {
            job,
            guard,
            view,
            tick_ms,
            started_ms,
            started_at,
        } = self;
        let args = job.args(&guard, tick_ms);
        let keys = job.lock.keys();
        let reply = job
            .client
            .engine
            .retrying(|mut conn| async move {
                protocol::job_finish(&mut conn, keys, args, started_ms).await
            })
            .await;
        let finished_ms = match reply {
            Ok(FinishReply::Done { finished_ms }) => finished_ms,
            Ok(FinishReply::TakenOver { token }) => {
                metrics::stale_write_rejected();
                let err = Error::StaleToken {
                    presented: view.token,
                    latest: token,
                };
                return Err(job.report_error(tick_ms, err));
            }
            Err(err) => {
                // Whether the finish landed is unknown: keep the job held until at_most_for
                // ends rather than let another instance run the tick again at once.
                guard.keep_until_lease_ends();
                return Err(job.report_error(tick_ms, err));
            }
        };
        metrics::job(metrics::JOB_RAN);
        tracing::debug!(
            name: "fencelock.job",
            job = %String::from_utf8_lossy(job.name()),
            tick_ms,
            outcome = metrics::JOB_RAN,
            runner = view.holder.id.as_str(),
            token = view.token.get(),
            took_over = view.took_over.map(FencingToken::get),
            run_ms = finished_ms.saturating_sub(started_ms),
            "job tick ran"
        );
        let keep = round_up_to_millis(
            job.options
                .at_least_for
                .saturating_sub(started_at.elapsed()),
        );
        if keep.is_zero() {
            // A failed release (the hold had ended, Redis is away) changes nothing for the
            // caller: the done record is what keeps the tick from running again.
            let _ = guard.release().await;
        } else if guard.extend(keep).await.is_ok() {
            guard.keep_until_lease_ends();
        }
        Ok(view.token)
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

fn millis_of(time: SystemTime) -> i128 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i128::try_from(since.as_millis()).unwrap_or(i128::MAX)
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lease for the rest of `at_least_for`: whole milliseconds, rounded up so the job is never
/// held shorter than asked.
fn round_up_to_millis(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
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
            tick_ms: 1_000,
            runner: "client:7".into(),
            token: FencingToken::new(token).unwrap(),
            started_ms: 2_000,
            finished_ms: finished,
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
        let skips = [
            (Skip::Running(Some(record(1, None))), metrics::JOB_RUNNING),
            (Skip::Running(None), metrics::JOB_RUNNING),
            (Skip::Done(record(2, Some(5))), metrics::JOB_DONE),
            (Skip::Abandoned(record(3, None)), metrics::JOB_ABANDONED),
            (Skip::Late(record(4, Some(5))), metrics::JOB_LATE),
        ];
        for (skip, label) in skips {
            assert_eq!(skip.label(), label);
            let expected = skip.record().map(TickRecord::token);
            let outcome: JobOutcome<()> = skip.outcome();
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
