//! The blocking scheduled job.

use std::sync::Arc;
use std::time::SystemTime;

use crate::api::job::Begun;
use crate::protocol::RunOutcome;
use crate::{Error, JobOptions, JobOutcome, JobRun, TickRecord};

/// A blocking [`crate::Job`]: call [`Job::run_exclusive`] from every instance's scheduler;
/// each tick runs on one instance, once, with the job on the calling thread.
#[derive(Clone, Debug)]
pub struct Job {
    pub(super) inner: crate::Job,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

impl Job {
    /// The job's name.
    pub fn name(&self) -> &[u8] {
        self.inner.name()
    }

    /// The job's options.
    pub fn options(&self) -> &JobOptions {
        self.inner.options()
    }

    /// A handle whose runs' holds carry `label`; see [`crate::Job::with_label`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    /// use fencelock::JobOptions;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let options = JobOptions::new(Duration::from_secs(60), Duration::from_secs(30));
    /// let job = client.job("cleanup", options)?.with_label("nightly-cron")?;
    /// assert_eq!(job.label(), Some("nightly-cron"));
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty, over-long or multi-line label.
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Job, Error> {
        Ok(Job {
            inner: self.inner.with_label(label)?,
            runtime: self.runtime.clone(),
        })
    }

    /// The label this handle's runs carry.
    pub fn label(&self) -> Option<&str> {
        self.inner.label()
    }

    /// The instants of the job's period, aligned to the Unix epoch (see [`crate::Ticks`]);
    /// wait for each with [`Ticks::next_blocking`](crate::Ticks::next_blocking).
    pub fn ticks(&self) -> crate::Ticks {
        self.inner.ticks()
    }

    /// Runs `job` on the calling thread for `tick` if no instance has run or is running it,
    /// and returns at once otherwise; see [`crate::Job::run_exclusive`] for what counts as the
    /// same tick and what each outcome means. The run's hold is taken and its tick recorded
    /// before `job` is called, and the tick recorded done after it returns; a `job` that
    /// panics leaves the tick as one whose runner died (the lock is released as the panic
    /// unwinds, and the policy decides).
    ///
    /// # Errors
    /// As [`crate::Job::run_exclusive`].
    pub fn run_exclusive<T>(
        &self,
        tick: SystemTime,
        job: impl FnOnce(JobRun) -> T,
    ) -> Result<JobOutcome<T>, Error> {
        match self.runtime.block_on(self.inner.begin(tick))? {
            Begun::Skipped(skip) => Ok(skip.outcome()),
            Begun::Run(run) => {
                let output = job(run.view());
                let token = self.runtime.block_on(run.finish(RunOutcome::Done))?;
                Ok(JobOutcome::Ran { token, output })
            }
        }
    }

    /// [`Job::run_exclusive`] for a job that can fail: an error is recorded by the job's
    /// [`OnFailure`](crate::OnFailure) policy; see [`crate::Job::run_fallible`].
    ///
    /// # Errors
    /// As [`crate::Job::run_exclusive`].
    pub fn run_fallible<T, E>(
        &self,
        tick: SystemTime,
        job: impl FnOnce(JobRun) -> Result<T, E>,
    ) -> Result<JobOutcome<Result<T, E>>, Error> {
        match self.runtime.block_on(self.inner.begin(tick))? {
            Begun::Skipped(skip) => Ok(skip.outcome()),
            Begun::Run(run) => {
                let output = job(run.view());
                let ended = self.inner.ended_as(output.is_ok());
                let token = self.runtime.block_on(run.finish(ended))?;
                Ok(JobOutcome::Ran { token, output })
            }
        }
    }

    /// The newest tick begun; see [`crate::Job::last_tick`].
    ///
    /// # Errors
    /// As [`crate::Job::last_tick`].
    pub fn last_tick(&self) -> Result<Option<TickRecord>, Error> {
        self.runtime.block_on(self.inner.last_tick())
    }
}
