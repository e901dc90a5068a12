//! What a call for a tick learns: the tick record, and the outcome (ran here, or why not).

use std::time::SystemTime;

use super::run::from_millis;
#[cfg(doc)]
use super::{Job, OnRunnerDeath};
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::protocol;

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
    failed: Option<SystemTime>,
}

impl From<protocol::TickRecord> for TickRecord {
    fn from(record: protocol::TickRecord) -> TickRecord {
        TickRecord {
            tick: from_millis(record.own.tick_ms),
            runner: record.runner,
            token: record.token,
            started: from_millis(record.started_ms),
            finished: record.finished_ms.map(from_millis),
            failed: record.failed_ms.map(from_millis),
        }
    }
}

impl TickRecord {
    /// The tick as its first runner saw it (to the millisecond). Other instances' views of the
    /// same tick differ by less than half a period.
    pub fn tick(&self) -> SystemTime {
        self.tick
    }

    super::run::record_accessors!();
}

/// What [`Job::run_exclusive`] did for a tick: ran the job here, or skipped it and why.
///
/// ```no_run
/// # async fn demo(job: fencelock::Job) -> Result<(), fencelock::Error> {
/// use fencelock::JobOutcome;
/// let tick = job.ticks().next().await; // the scheduled instant, the same on every instance
/// match job.run_exclusive(tick, |_run| async { 42 }).await? {
///     JobOutcome::Ran { token, output } => println!("ran with token {token}: {output}"),
///     JobOutcome::SkippedRunning { record } => println!("another instance runs it: {record:?}"),
///     JobOutcome::SkippedDone { record } => println!("already done by {}", record.runner()),
///     JobOutcome::SkippedAbandoned { record } => println!("{} died running it", record.runner()),
///     JobOutcome::SkippedLate { record } => println!("a newer tick began: {:?}", record.tick()),
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
        record: Option<TickRecord>,
    },
    /// The tick was run already, by the instance the record names.
    SkippedDone {
        /// The finished tick's record.
        record: TickRecord,
    },
    /// The tick's runner lost its hold before finishing and the job's policy is
    /// [`OnRunnerDeath::GiveUp`].
    SkippedAbandoned {
        /// The abandoned tick's record.
        record: TickRecord,
    },
    /// A newer tick has begun (this call is at least half a period behind it), so this tick
    /// is over: run or missed, it is not run now.
    SkippedLate {
        /// The newest tick's record.
        record: TickRecord,
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
            JobOutcome::SkippedRunning { record } => record.as_ref(),
            JobOutcome::SkippedDone { record }
            | JobOutcome::SkippedAbandoned { record }
            | JobOutcome::SkippedLate { record } => Some(record),
        }
    }

    /// The `outcome` label of the metric and the event (a run's, when recorded done).
    pub(super) fn label(&self) -> &'static str {
        match self {
            JobOutcome::Ran { .. } => metrics::JOB_RAN,
            JobOutcome::SkippedRunning { .. } => metrics::JOB_RUNNING,
            JobOutcome::SkippedDone { .. } => metrics::JOB_DONE,
            JobOutcome::SkippedAbandoned { .. } => metrics::JOB_ABANDONED,
            JobOutcome::SkippedLate { .. } => metrics::JOB_LATE,
        }
    }
}
