//! What each scheduled job did last: every job under the prefix with a tick record.

use std::fmt;
use std::time::Duration;

use super::{format_duration, format_utc, item, run_state, Admin};
use crate::protocol::keys::Listing;
use crate::protocol::{self, LockKeys};
use crate::{Error, TickRecord};

/// One scheduled job's newest tick, as [`Job::last_tick`](crate::Job::last_tick) reads it,
/// and whether its runner still holds the job.
///
/// Displayed as one line, times in UTC (as `fencelock jobs` prints it):
///
/// ```text
/// report  tick 2026-12-07 06:00:00.000 UTC  done  runner 5f0c2e9a:3  token 1796623200004017  client billing-2  ran 1.204s (finished 2026-12-07 06:00:01.412 UTC)  kept 23h59m42s
/// ```
///
/// ```no_run
/// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
/// for job in admin.jobs().await? {
///     println!("{}: last run by {} with token {}, done: {}", job.display_name(),
///         job.last.runner(), job.last.token(), job.last.finished().is_some());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobInfo {
    /// The job name (arbitrary bytes).
    pub name: Vec<u8>,
    /// The Redis key of the job's tick record.
    pub key: Vec<u8>,
    /// The newest tick begun: who ran it, with which token, when, and whether it finished.
    pub last: TickRecord,
    /// Whether that runner holds the job's lock now: running, or keeping the job for
    /// `at_least_for` after a run. A record that is not finished and not held is a tick whose
    /// runner lost its hold before finishing.
    pub runner_holds: bool,
    /// The time the tick record is kept for; `None` when it has no expiry (an operator's
    /// doing).
    pub retained_for: Option<Duration>,
    /// The name the runner's client registered
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)); `None`
    /// when that client registered none that is still kept.
    pub runner_client_name: Option<String>,
    /// The label the runner's job handle gives its runs
    /// ([`Job::with_label`](crate::Job::with_label)), while the runner holds the job; `None`
    /// otherwise or without a label.
    pub runner_label: Option<String>,
}

impl JobInfo {
    /// The state of the newest tick in one word: `running`, `done`, `failed` (its job returned
    /// an error and the tick waits for a retry) or `abandoned` (its runner lost its hold before
    /// finishing).
    pub fn state(&self) -> &'static str {
        run_state(self.last.finished(), self.last.failed(), self.runner_holds)
    }
}

impl fmt::Display for JobInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}  tick {}  {}  runner {}  token {}",
            self.display_name(),
            format_utc(self.last.tick()),
            self.state(),
            self.last.runner(),
            self.last.token()
        )?;
        item(f, "client", self.runner_client_name.as_ref(), "")?;
        item(f, "label", self.runner_label.as_ref(), "")?;
        let finished = self.last.finished();
        let ran = finished.and_then(|end| end.duration_since(self.last.started()).ok());
        if let (Some(finished), Some(ran)) = (finished, ran) {
            let (ran, finished) = (format_duration(ran), format_utc(finished));
            write!(f, "  ran {ran} (finished {finished})")?;
        }
        let kept = self.retained_for.map(format_duration);
        item(f, "kept", kept, "no expiry")
    }
}

impl Admin {
    /// Every scheduled job under the prefix that has a tick record, sorted by name: its newest
    /// tick, runner, token, and whether the runner holds the job now. Uses `SCAN` (never
    /// `KEYS`) for the keys `{*}job-tick:*`, then reads each job the way its instances do
    /// (`job_read.lua`, one `EVALSHA`), so the record and the lock's holder come from one
    /// atomic read. A record that expired between the scan and the read is left out.
    ///
    /// # Errors
    /// [`Error::WrongType`] when a job's key holds foreign data;
    /// [`Error::PermissionDenied`] when the Redis user may not run `EVALSHA` or read the key;
    /// [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only (`SCAN`, then one read-only script per job).
    pub async fn jobs(&self) -> Result<Vec<JobInfo>, Error> {
        let mut jobs = self
            .rows(Listing::JOB_TICKS, b"", async |name, key| {
                let job = LockKeys::job(&self.prefix, &name);
                let read = protocol::job_read(&mut self.conn.clone(), &job).await?;
                let Some(record) = read.record else {
                    return Ok(None); // expired since the scan
                };
                let runner_holds = read.lock_token == Some(record.token);
                let runner = runner_holds.then_some(record.runner.as_str());
                let runner_label = self.hold_label(&job.lock, runner).await;
                Ok(Some(JobInfo {
                    retained_for: self.ttl(&key).await?,
                    name,
                    key,
                    last: record.into(),
                    runner_holds,
                    runner_client_name: None,
                    runner_label,
                }))
            })
            .await?;
        self.name_rows(&mut jobs, |job| {
            (Some(job.last.runner()), &mut job.runner_client_name)
        })
        .await?;
        Ok(jobs)
    }
}
