//! The blocking scheduled job.

use std::time::SystemTime;

use crate::api::job::run::Begun;
use crate::protocol::RunEnd;
use crate::{Error, JobOptions, JobOutcome, JobRun, TickRecord};

blocking! {
    /// A blocking [`crate::Job`]: call [`Job::run_exclusive`] from every instance's scheduler;
    /// each tick runs on one instance, once, with the job on the calling thread.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::{blocking::LockClient, JobOptions};
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let options = JobOptions::new(Duration::from_secs(3600), Duration::from_secs(600));
    /// let report = client.job("hourly-report", options)?;
    /// let tick = report.ticks().next_blocking(); // the instant this tick was scheduled for
    /// let outcome = report.run_exclusive(tick, |run| {
    ///     println!("running with token {}", run.token()); // on this thread
    /// })?;
    /// println!("ran here: {}", outcome.ran());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[derive(Clone)]
    pub struct Job(crate::Job) {
        fn name(&self) -> &[u8];
        fn options(&self) -> &JobOptions;
        fn with_label(&self, label: impl AsRef<str>) -> Result<Job, Error> = wrap;
        fn label(&self) -> Option<&str>;
        /// Wait for each tick on a thread with
        /// [`Ticks::next_blocking`](crate::Ticks::next_blocking).
        fn ticks(&self) -> crate::Ticks;
        fn last_tick(&self) -> Result<Option<TickRecord>, Error> = block;
    }
}

impl Job {
    /// See [`crate::Job::run_exclusive`]; `job` runs on the calling thread, between the
    /// blocking calls that take the run's hold and record its tick and the one that records
    /// the tick done. A `job` that panics leaves the tick as one whose runner died (the lock is
    /// released as the panic unwinds, and the policy decides).
    ///
    /// # Errors
    /// As [`crate::Job::run_exclusive`].
    pub fn run_exclusive<T>(
        &self,
        tick: SystemTime,
        job: impl FnOnce(JobRun) -> T,
    ) -> Result<JobOutcome<T>, Error> {
        self.run_ending(tick, job, |_| RunEnd::Done)
    }

    /// See [`crate::Job::run_fallible`]; `job` runs on the calling thread, as in
    /// [`Job::run_exclusive`], and an error it returns is recorded by the job's
    /// [`OnFailure`](crate::OnFailure) policy.
    ///
    /// # Errors
    /// As [`crate::Job::run_exclusive`].
    pub fn run_fallible<T, E>(
        &self,
        tick: SystemTime,
        job: impl FnOnce(JobRun) -> Result<T, E>,
    ) -> Result<JobOutcome<Result<T, E>>, Error> {
        self.run_ending(tick, job, |output| self.inner.ended_as(output.is_ok()))
    }

    /// Runs `job` for `tick` on the calling thread, recording its end as `end` says of its
    /// output.
    fn run_ending<T>(
        &self,
        tick: SystemTime,
        job: impl FnOnce(JobRun) -> T,
        end: impl FnOnce(&T) -> RunEnd,
    ) -> Result<JobOutcome<T>, Error> {
        match self.runtime.block_on(self.inner.begin(tick))? {
            Begun::Answered(skip) => Ok(skip),
            Begun::Run(run) => {
                let output = job(run.view.clone());
                let end = end(&output);
                self.runtime.block_on(run.finish(output, end))
            }
        }
    }
}
