//! The acquire loop of the holds with leases of their own (semaphore permits, read-write lock
//! holds): one try, or a fast attempt and then waiting in this client's FIFO on the hold's
//! channel, going back to Redis on every wake-up until the hold is won or the deadline passes.
//! The handles in `api` say what one attempt is ([`Acquisition`]); the loop, the deadline and
//! the undo of an attempt nobody waits for are here, once.
//!
//! A lock's acquisition (`api::lock`) is not on this loop: it also serves fair handoff's
//! reservations and replica acknowledgement, which holds do not have.

use std::time::{Duration, Instant};

use super::pending::PendingOp;
use super::wait::Wake;
use super::Engine;
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::retry::waiting_window;

/// The outcome of one attempt.
pub(crate) enum Attempt<W> {
    /// Won. `hand_on`: the next waiter of this client on the same channel may get in too (a
    /// semaphore with permits left, a reader), so it tries at once instead of waiting for the
    /// next release.
    Won { held: W, hand_on: bool },
    /// Busy; until when at the latest a hold could end without a release (the earliest lease
    /// of a holder), the waiter's fallback timer.
    Busy(Option<Duration>),
}

/// What one kind of hold's acquisition does in one round trip.
pub(crate) trait Acquisition {
    /// What a won attempt returns.
    type Held;

    /// The client's engine.
    fn engine(&self) -> &Engine;

    /// The channel this acquisition waits on, and so the local queue it joins.
    fn channel(&self) -> Vec<u8>;

    /// The undo of the acquisition by `holder`, disarmed.
    fn pending(&self, holder: &str) -> PendingOp;

    /// One acquire round trip (re-sent while its outcome is unknown and `window` is open),
    /// with `pending` armed while the outcome is unknown. `wait`: the attempt of a caller that
    /// will wait (one that leaves a mark in Redis while busy keeps `pending` armed).
    async fn attempt(
        &self,
        holder: &str,
        pending: &mut PendingOp,
        wait: bool,
        window: Duration,
    ) -> Result<Attempt<Self::Held>, Error>;
}

/// One try: the hold, or `None` when it is busy.
///
/// Cancel safe: a dropped try's pending operation undoes it in the background.
pub(crate) async fn try_once<A: Acquisition>(acq: &A) -> Result<Option<A::Held>, Error> {
    let engine = acq.engine();
    let holder = engine.next_id();
    let mut pending = acq.pending(&holder);
    match acq
        .attempt(&holder, &mut pending, false, engine.config.retry_window)
        .await?
    {
        Attempt::Won { held, .. } => Ok(Some(held)),
        Attempt::Busy(_) => Ok(None),
    }
}

/// Waits for the hold until `deadline` (`None`: as long as it takes); [`Error::Timeout`] at
/// the deadline, which bounds everything, also an attempt being retried because Redis does not
/// answer: at the deadline the attempt is dropped, and its pending operation undoes it.
///
/// Cancel safe: dropping the future leaves the queue and undoes an attempt in flight.
pub(crate) async fn acquire_until<A: Acquisition>(
    acq: &A,
    deadline: Option<Instant>,
) -> Result<A::Held, Error> {
    let started = Instant::now();
    let Some(deadline) = deadline else {
        return acquire_within(acq, None, started).await;
    };
    match tokio::time::timeout_at(
        deadline.into(),
        acquire_within(acq, Some(deadline), started),
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(_elapsed) => Err(Error::Timeout {
            waited: started.elapsed(),
        }),
    }
}

async fn acquire_within<A: Acquisition>(
    acq: &A,
    deadline: Option<Instant>,
    started: Instant,
) -> Result<A::Held, Error> {
    let engine = acq.engine();
    let holder = engine.next_id();
    let mut pending = acq.pending(&holder);
    let channel = acq.channel();
    // The fast path: one round trip when the hold is free. Skipped when waiters of this client
    // are queued on the same channel, so a newcomer cannot overtake them.
    if !engine.waiters.has_waiters(&channel) {
        let window = engine.config.retry_window;
        if let Attempt::Won { held, .. } = acq.attempt(&holder, &mut pending, true, window).await? {
            return Ok(held);
        }
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Err(Error::Timeout {
            waited: started.elapsed(),
        });
    }
    // Boxed: the waiting state is large, and the uncontended path should not carry it.
    Box::pin(wait_and_acquire(
        acq,
        &holder,
        &mut pending,
        &channel,
        deadline,
        started,
    ))
    .await
}

/// The slow path: queue behind this client's other waiters on the channel and try again on
/// each wake-up until the hold is won or the deadline passes.
async fn wait_and_acquire<A: Acquisition>(
    acq: &A,
    holder: &str,
    pending: &mut PendingOp,
    channel: &[u8],
    deadline: Option<Instant>,
    started: Instant,
) -> Result<A::Held, Error> {
    let engine = acq.engine();
    metrics::contended();
    let entry = engine.waiters.enter(channel, None).await?;
    tracing::debug!(name: "fencelock.wait", holder, ahead = entry.ahead(), "waiting in this client's queue");
    loop {
        if entry.wait(deadline).await == Wake::Deadline {
            return Err(Error::Timeout {
                waited: started.elapsed(),
            });
        }
        let window = waiting_window(engine.config.retry_window, deadline);
        match acq.attempt(holder, pending, true, window).await? {
            Attempt::Won { held, hand_on } => {
                if hand_on {
                    entry.hand_on();
                }
                return Ok(held);
            }
            Attempt::Busy(wait) => entry.observed_lease(wait),
        }
    }
}
