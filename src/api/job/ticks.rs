//! The instants a job is scheduled for, the same on every instance.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::base::error::Error;

/// The scheduled instants of a fixed period, aligned to the Unix epoch (plus an offset): each
/// is `offset + k × period` after 00:00:00 UTC on 1 January 1970. Made by [`Job::ticks`]
/// (the job's own period), for the scheduler loop of every instance.
///
/// [`Ticks::next`] waits for the next instant and returns *that instant*, not the moment this
/// instance woke for it, so every instance names a tick alike whenever it started, however late
/// it wakes: what [`Job::run_exclusive`] compares. A scheduler that names the tick by its own
/// clock at wake-up (`tokio::time::interval` and `SystemTime::now()`) gives instances started
/// more than half a period apart different ticks, and the job runs once per instance. With
/// aligned ticks, two instances' views of one tick differ only by their clocks' skew, which
/// must stay under half a period (the rule [`Job::run_exclusive`] states).
///
/// Ticks are not made up for: an instance that wakes after one or more instants passed (a
/// pause, a slow run) gets the latest one due at once and skips the older ones, whose runs
/// other instances will have made or which are over. An instance added in the middle of a
/// period starts with the next instant: it never runs the current period's tick again.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// use std::time::Duration;
/// use fencelock::JobOptions;
/// let report = client.job("hourly-report", JobOptions::new(Duration::from_secs(3600), Duration::from_secs(600)))?;
/// // Every hour at five past: 00:05, 01:05, ... (UTC), on every instance alike.
/// let mut ticks = report.ticks().with_offset(Duration::from_secs(300))?;
/// loop {
///     let tick = ticks.next().await; // the instant this tick was scheduled for
///     report.run_exclusive(tick, |run| async move { let _ = run.token(); }).await?;
/// }
/// # }
/// ```
///
/// [`Job::ticks`]: crate::Job::ticks
/// [`Job::run_exclusive`]: crate::Job::run_exclusive
#[derive(Debug, Clone)]
pub struct Ticks {
    period: Duration,
    offset: Duration,
    /// The last instant returned.
    last: Option<SystemTime>,
}

impl Ticks {
    /// Instants `period` apart from the Unix epoch on; the period is the job's, already
    /// checked (at least 2 ms, whole milliseconds).
    pub(crate) fn new(period: Duration) -> Ticks {
        Ticks {
            period,
            offset: Duration::ZERO,
            last: None,
        }
    }

    /// The same schedule moved `offset` later: every instant is `offset` after a multiple of
    /// the period (an hourly job at five past the hour: an offset of 5 minutes).
    ///
    /// # Errors
    /// [`Error::InvalidJob`] when `offset` is not shorter than the period, or not a whole
    /// number of milliseconds (ticks are compared in milliseconds).
    ///
    /// ```
    /// # fn demo(job: fencelock::Job) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// let hourly = job.ticks(); // say, a job with a one-hour period
    /// assert!(hourly.clone().with_offset(Duration::from_secs(7200)).is_err());
    /// # Ok(()) }
    /// ```
    pub fn with_offset(mut self, offset: Duration) -> Result<Ticks, Error> {
        if offset >= self.period || !offset.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::InvalidJob {
                reason: format!(
                    "the tick offset {offset:?} is not a whole number of milliseconds shorter \
                     than the period {:?}",
                    self.period
                ),
            });
        }
        self.offset = offset;
        Ok(self)
    }

    /// The period between two instants.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The first scheduled instant at or after `time`.
    ///
    /// ```
    /// # fn demo(job: fencelock::Job) -> Result<(), fencelock::Error> {
    /// use std::time::{Duration, UNIX_EPOCH};
    /// let ticks = job.ticks(); // say, a job with a one-minute period
    /// let at = UNIX_EPOCH + Duration::from_secs(90);
    /// assert_eq!(ticks.at_or_after(at), UNIX_EPOCH + Duration::from_secs(120));
    /// # Ok(()) }
    /// ```
    pub fn at_or_after(&self, time: SystemTime) -> SystemTime {
        let latest = self.at_or_before(time);
        if latest == time {
            latest
        } else {
            latest + self.period
        }
    }

    /// The last scheduled instant at or before `time` (the epoch's offset, for a `time` before
    /// the first instant).
    pub fn at_or_before(&self, time: SystemTime) -> SystemTime {
        let start = UNIX_EPOCH + self.offset;
        let since = time.duration_since(start).unwrap_or(Duration::ZERO);
        let periods = since.as_nanos() / self.period.as_nanos();
        // At most ten years' period and no more periods than nanoseconds since the epoch:
        // the product stays far inside u64 nanoseconds of the span a SystemTime holds.
        let elapsed = self.period.as_nanos() * periods;
        start + Duration::from_nanos(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }

    /// The instant to return next, seen at `now`: the one after the last returned, or the latest
    /// due when that one has passed already (missed ones are skipped); the first call's, the
    /// first at or after `now`.
    fn upcoming(&self, now: SystemTime) -> SystemTime {
        match self.last {
            None => self.at_or_after(now),
            Some(last) => (last + self.period).max(self.at_or_before(now)),
        }
    }

    /// [`Ticks::next`] for a thread of the blocking API: sleeps the calling thread.
    pub fn next_blocking(&mut self) -> SystemTime {
        let due = self.upcoming(SystemTime::now());
        loop {
            match self.arrived(due, SystemTime::now()) {
                Ok(due) => return due,
                Err(wait) => std::thread::sleep(wait),
            }
        }
    }

    /// Whether `due`, the instant being waited for, has come at `now`: then the latest
    /// instant due (`due` itself, unless the clock jumped past the next one), which counts as
    /// returned; else how long to wait still. The target is fixed before the wait: computed
    /// again from a `now` just past it, it would be the next one, and the wait would chase it.
    fn arrived(&mut self, due: SystemTime, now: SystemTime) -> Result<SystemTime, Duration> {
        match due.duration_since(now) {
            Ok(wait) if !wait.is_zero() => Err(wait),
            _ => {
                let due = self.at_or_before(now).max(due);
                self.last = Some(due);
                Ok(due)
            }
        }
    }

    /// Waits until the next scheduled instant and returns it.
    ///
    /// The wait follows the system clock (re-checked after every sleep, so a clock that was
    /// set back makes it wait longer, and one set forward returns the latest instant due).
    ///
    /// # Cancel safety
    /// Cancel safe: it only sleeps, and a dropped call does not count the instant it was
    /// waiting for as returned: the next call returns it (or a later one, if it passed).
    pub async fn next(&mut self) -> SystemTime {
        let due = self.upcoming(SystemTime::now());
        loop {
            match self.arrived(due, SystemTime::now()) {
                Ok(due) => return due,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn instants_are_aligned_to_the_epoch_and_the_offset() {
        let ticks = Ticks::new(Duration::from_millis(1000));
        assert_eq!(ticks.at_or_after(at(1500)), at(2000));
        assert_eq!(ticks.at_or_after(at(2000)), at(2000));
        assert_eq!(ticks.at_or_before(at(2999)), at(2000));
        let ticks = ticks.with_offset(Duration::from_millis(250)).unwrap();
        assert_eq!(ticks.at_or_after(at(1500)), at(2250));
        assert_eq!(ticks.at_or_before(at(1500)), at(1250));
        assert_eq!(ticks.at_or_before(at(100)), at(250));
    }

    #[test]
    fn instances_started_apart_name_the_same_ticks() {
        // Started 0, 0.7 and 1.4 periods apart: the same instants from the first one on.
        let period = Duration::from_millis(2000);
        let firsts: Vec<SystemTime> = [10_100, 11_500, 12_900]
            .into_iter()
            .map(|started| Ticks::new(period).upcoming(at(started)))
            .collect();
        assert_eq!(firsts, vec![at(12_000), at(12_000), at(14_000)]);
    }

    #[test]
    fn missed_instants_are_skipped_for_the_latest_due() {
        let mut ticks = Ticks::new(Duration::from_millis(1000));
        ticks.last = Some(at(2000));
        assert_eq!(
            ticks.upcoming(at(2500)),
            at(3000),
            "the next one, not yet due"
        );
        assert_eq!(
            ticks.upcoming(at(5700)),
            at(5000),
            "three passed: the latest"
        );
    }

    #[test]
    fn an_instant_waited_for_is_returned_when_it_comes_not_chased() {
        let mut ticks = Ticks::new(Duration::from_millis(1000));
        let due = ticks.upcoming(at(1500));
        assert_eq!(
            ticks.arrived(due, at(1800)),
            Err(Duration::from_millis(200))
        );
        assert_eq!(
            ticks.arrived(due, at(2001)),
            Ok(at(2000)),
            "woken just after it"
        );
        assert_eq!(ticks.upcoming(at(2001)), at(3000));
        // A clock that jumped past the next instant while waiting: the latest one due.
        let due = ticks.upcoming(at(2500));
        assert_eq!(ticks.arrived(due, at(4200)), Ok(at(4000)));
    }

    /// Each call returns a later instant of the schedule, once it has come (the next one, or
    /// the latest due when this thread was held up past it).
    #[tokio::test]
    async fn next_returns_later_instants_once_they_have_come() {
        let period = Duration::from_millis(20);
        let mut ticks = Ticks::new(period);
        let mut last = ticks.next().await;
        for _ in 0..3 {
            let next = ticks.next().await;
            assert!(SystemTime::now() >= next);
            let gap = next.duration_since(last).unwrap();
            assert!(
                !gap.is_zero() && gap.as_nanos() % period.as_nanos() == 0,
                "{gap:?}"
            );
            last = next;
        }
    }

    #[test]
    fn an_offset_must_be_whole_milliseconds_shorter_than_the_period() {
        let ticks = Ticks::new(Duration::from_secs(60));
        assert!(ticks.clone().with_offset(Duration::from_secs(60)).is_err());
        assert!(ticks
            .clone()
            .with_offset(Duration::from_micros(1500))
            .is_err());
        assert!(ticks.with_offset(Duration::from_secs(59)).is_ok());
    }
}
