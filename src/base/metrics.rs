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

#[cfg(feature = "metrics")]
mod imp {
    use std::time::Duration;

    pub(super) fn acquisition(outcome: &'static str) {
        ::metrics::counter!("fencelock_acquisitions_total", "outcome" => outcome).increment(1);
    }
    pub(super) fn contended() {
        ::metrics::counter!("fencelock_contended_total").increment(1);
    }
    pub(super) fn wait(waited: Duration) {
        ::metrics::histogram!("fencelock_wait_seconds").record(waited.as_secs_f64());
    }
    pub(super) fn hold(held: Duration) {
        ::metrics::histogram!("fencelock_hold_seconds").record(held.as_secs_f64());
    }
    pub(super) fn renewals(locks: u64) {
        ::metrics::counter!("fencelock_renewals_total").increment(locks);
    }
    pub(super) fn renewal_call() {
        ::metrics::counter!("fencelock_renewal_calls_total").increment(1);
    }
    pub(super) fn lost_lease() {
        ::metrics::counter!("fencelock_lost_leases_total").increment(1);
    }
    pub(super) fn stale_write_rejected() {
        ::metrics::counter!("fencelock_stale_writes_rejected_total").increment(1);
    }
    pub(super) fn release(outcome: &'static str) {
        ::metrics::counter!("fencelock_releases_total", "outcome" => outcome).increment(1);
    }
    pub(super) fn job(outcome: &'static str) {
        ::metrics::counter!("fencelock_job_ticks_total", "outcome" => outcome).increment(1);
    }
    pub(super) fn idempotent(outcome: &'static str) {
        ::metrics::counter!("fencelock_idempotent_runs_total", "outcome" => outcome).increment(1);
    }
    pub(super) fn leadership(change: &'static str) {
        ::metrics::counter!("fencelock_leadership_changes_total", "change" => change).increment(1);
    }

    pub(super) fn semaphore(outcome: &'static str) {
        ::metrics::counter!("fencelock_semaphore_acquisitions_total", "outcome" => outcome)
            .increment(1);
    }

    pub(super) fn rwlock(mode: &'static str, outcome: &'static str) {
        ::metrics::counter!("fencelock_rwlock_acquisitions_total", "mode" => mode, "outcome" => outcome)
            .increment(1);
    }
    pub(super) fn holds_changed(by: f64) {
        ::metrics::gauge!("fencelock_holds").increment(by);
    }
    pub(super) fn long_hold() {
        ::metrics::counter!("fencelock_long_holds_total").increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::missing_const_for_fn)]
mod imp {
    pub(super) fn acquisition(_outcome: &'static str) {}
    pub(super) fn contended() {}
    pub(super) fn renewals(_locks: u64) {}
    pub(super) fn renewal_call() {}
    pub(super) fn lost_lease() {}
    pub(super) fn stale_write_rejected() {}
    pub(super) fn release(_outcome: &'static str) {}
    pub(super) fn job(_outcome: &'static str) {}
    pub(super) fn idempotent(_outcome: &'static str) {}
    pub(super) fn leadership(_change: &'static str) {}
    pub(super) fn semaphore(_outcome: &'static str) {}
    pub(super) fn rwlock(_mode: &'static str, _outcome: &'static str) {}
    pub(super) fn holds_changed(_by: f64) {}
    pub(super) fn long_hold() {}
}

/// One acquire call that started at `started` ended with `outcome`. The clock is read only
/// when metrics are recorded.
pub(crate) fn acquisition(outcome: &'static str, started: std::time::Instant) {
    imp::acquisition(outcome);
    #[cfg(feature = "metrics")]
    imp::wait(started.elapsed());
    #[cfg(not(feature = "metrics"))]
    let _ = started;
}

/// An acquire call found the lock held and queued to wait for it.
pub(crate) fn contended() {
    imp::contended();
}

/// A holder that acquired the lock at `acquired_at` left it (its last entry). The clock is
/// read only when metrics are recorded.
pub(crate) fn hold(acquired_at: std::time::Instant) {
    #[cfg(feature = "metrics")]
    imp::hold(acquired_at.elapsed());
    #[cfg(not(feature = "metrics"))]
    let _ = acquired_at;
}

/// One renewal script call was sent.
pub(crate) fn renewal_call() {
    imp::renewal_call();
}

/// A renewal call renewed `locks` leases.
pub(crate) fn renewals(locks: u64) {
    imp::renewals(locks);
}

/// A holder learnt it lost its lock.
pub(crate) fn lost_lease() {
    imp::lost_lease();
}

/// A fenced write or claiming read was refused for a stale token.
pub(crate) fn stale_write_rejected() {
    imp::stale_write_rejected();
}

/// A release call ended with `outcome`.
pub(crate) fn release(outcome: &'static str) {
    imp::release(outcome);
}

/// A job's `run_exclusive` for one tick ended with `outcome`.
pub(crate) fn job(outcome: &'static str) {
    imp::job(outcome);
}

/// An idempotency key's `run` ended with `outcome`.
pub(crate) fn idempotent(outcome: &'static str) {
    imp::idempotent(outcome);
}

/// A leader was elected or resigned (`change`).
pub(crate) fn leadership(change: &'static str) {
    imp::leadership(change);
}

/// A semaphore acquire call ended with `outcome` (the labels of [`acquisition`]).
pub(crate) fn semaphore(outcome: &'static str) {
    imp::semaphore(outcome);
}

/// A read-write lock acquire call for `mode` (`read` or `write`) ended with `outcome` (the
/// labels of [`acquisition`]).
pub(crate) fn rwlock(mode: &'static str, outcome: &'static str) {
    imp::rwlock(mode, outcome);
}

/// Holds of this client came to life (`+1`: a first guard) or ended (`-1`: the last guard was
/// released or dropped): the `fencelock_holds` gauge.
pub(crate) fn holds_changed(by: f64) {
    imp::holds_changed(by);
}

/// A hold was found held past the client's `max_hold`.
pub(crate) fn long_hold() {
    imp::long_hold();
}
