//! The crate's metrics, one function per measurement (see the `observability` module for the
//! table). With the `metrics` feature they go to the `metrics` facade, and so to whatever
//! recorder the application installed; without it they compile to nothing, so call sites need
//! no `cfg`.
//!
//! No metric is labelled by lock name: names are user data of unbounded variety (one lock per
//! account, per order...), and one time series per name would grow the recorder's memory and
//! the monitoring system's index without bound. Per-lock detail is in the tracing events.

/// How an acquire call ended, as the `outcome` label and the tracing field.
pub(crate) const ACQUIRED: &str = "acquired";
pub(crate) const BUSY: &str = "busy";
pub(crate) const TIMEOUT: &str = "timeout";
pub(crate) const ERROR: &str = "error";
/// How a release ended: the last entry left and the lock is free, an inner entry left and the
/// holder still holds it, or the lock was no longer this holder's.
pub(crate) const RELEASED: &str = "released";
pub(crate) const EXITED: &str = "exited";
pub(crate) const NOT_HELD: &str = "not_held";
/// How a job's `run_exclusive` ended: ran here (`ran_failed`: its job returned an error that
/// leaves the tick to a retry), or skipped (another instance runs it, the tick is done, its
/// runner died and the policy gives it up, a newer tick has begun); or `error`.
pub(crate) const JOB_RAN: &str = "ran";
pub(crate) const JOB_RAN_FAILED: &str = "ran_failed";
/// A change of leader: one elected (its metadata recorded), one resigned.
pub(crate) const ELECTED: &str = "elected";
pub(crate) const RESIGNED: &str = "resigned";
pub(crate) const JOB_RUNNING: &str = "skipped_running";
pub(crate) const JOB_DONE: &str = "skipped_done";
pub(crate) const JOB_ABANDONED: &str = "skipped_abandoned";
pub(crate) const JOB_LATE: &str = "skipped_late";
/// How an idempotency key's `run` ended: ran here and stored its result (`ran_final`: a
/// failure made final; `ran_failed`: a failure left to a retry), or answered without running
/// (the stored result, a run in progress elsewhere, a run given up, another request's key);
/// or `error`.
pub(crate) const KEY_RAN: &str = "ran";
pub(crate) const KEY_RAN_FINAL: &str = "ran_final";
pub(crate) const KEY_RAN_FAILED: &str = "ran_failed";
pub(crate) const KEY_COMPLETED: &str = "completed";
pub(crate) const KEY_IN_PROGRESS: &str = "in_progress";
pub(crate) const KEY_ABANDONED: &str = "abandoned";
pub(crate) const KEY_REUSED: &str = "key_reused";

/// Declares each measurement once, as a function that records it with the `metrics` feature
/// and is empty without it (its arguments unused, so no call site needs a `cfg`). Written as a
/// macro rather than two `cfg`'d modules so that a measurement's name, signature and recording
/// stand in one place.
macro_rules! measurements {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $record:block)*) => {$(
        $(#[$doc])*
        #[cfg_attr(not(feature = "metrics"), allow(clippy::missing_const_for_fn))]
        pub(crate) fn $name($($arg: $ty),*) {
            #[cfg(feature = "metrics")]
            $record
            #[cfg(not(feature = "metrics"))]
            let _ = ($($arg,)*);
        }
    )*};
}

measurements! {
    /// One acquire call that started at `started` ended with `outcome`. The clock is read only
    /// when metrics are recorded.
    fn acquisition(outcome: &'static str, started: std::time::Instant) {
        ::metrics::counter!("fencelock_acquisitions_total", "outcome" => outcome).increment(1);
        ::metrics::histogram!("fencelock_wait_seconds").record(started.elapsed().as_secs_f64());
    }

    /// An acquire call found the lock held and queued to wait for it.
    fn contended() {
        ::metrics::counter!("fencelock_contended_total").increment(1);
    }

    /// A holder that acquired the lock at `acquired_at` left it (its last entry). The clock is
    /// read only when metrics are recorded.
    fn hold(acquired_at: std::time::Instant) {
        ::metrics::histogram!("fencelock_hold_seconds").record(acquired_at.elapsed().as_secs_f64());
    }

    /// One renewal script call was sent.
    fn renewal_call() {
        ::metrics::counter!("fencelock_renewal_calls_total").increment(1);
    }

    /// A renewal call renewed `locks` leases.
    fn renewals(locks: u64) {
        ::metrics::counter!("fencelock_renewals_total").increment(locks);
    }

    /// A holder learnt it lost its lock.
    fn lost_lease() {
        ::metrics::counter!("fencelock_lost_leases_total").increment(1);
    }

    /// A fenced write or claiming read was refused for a stale token.
    fn stale_write_rejected() {
        ::metrics::counter!("fencelock_stale_writes_rejected_total").increment(1);
    }

    /// A release call ended with `outcome`.
    fn release(outcome: &'static str) {
        ::metrics::counter!("fencelock_releases_total", "outcome" => outcome).increment(1);
    }

    /// A job's `run_exclusive` for one tick ended with `outcome`.
    fn job(outcome: &'static str) {
        ::metrics::counter!("fencelock_job_ticks_total", "outcome" => outcome).increment(1);
    }

    /// An idempotency key's `run` ended with `outcome`.
    fn idempotent(outcome: &'static str) {
        ::metrics::counter!("fencelock_idempotent_runs_total", "outcome" => outcome).increment(1);
    }

    /// A leader was elected or resigned (`change`).
    fn leadership(change: &'static str) {
        ::metrics::counter!("fencelock_leadership_changes_total", "change" => change).increment(1);
    }

    /// A semaphore acquire call ended with `outcome` (the labels of [`acquisition`]).
    fn semaphore(outcome: &'static str) {
        ::metrics::counter!("fencelock_semaphore_acquisitions_total", "outcome" => outcome)
            .increment(1);
    }

    /// A read-write lock acquire call for `mode` (`read` or `write`) ended with `outcome` (the
    /// labels of [`acquisition`]).
    fn rwlock(mode: &'static str, outcome: &'static str) {
        let labels = [("mode", mode), ("outcome", outcome)];
        ::metrics::counter!("fencelock_rwlock_acquisitions_total", &labels).increment(1);
    }

    /// Holds of this client came to life (`+1`: a first guard) or ended (`-1`: the last guard
    /// was released or dropped): the `fencelock_holds` gauge.
    fn holds_changed(by: f64) {
        ::metrics::gauge!("fencelock_holds").increment(by);
    }

    /// A hold was found held past the client's `max_hold`.
    fn long_hold() {
        ::metrics::counter!("fencelock_long_holds_total").increment(1);
    }
}
