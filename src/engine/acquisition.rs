//! The acquire loop of every acquisition that waits (a lock's, a semaphore's permits, a
//! read-write lock's holds): a fast attempt, then waiting in this client's FIFO on the
//! channel, going back to Redis on every wake-up until it wins or the deadline passes. The
//! callers say what one attempt is ([`Attempts`]); the loop, the deadline and fair handoff's
//! first-attempt guard are here, once ([`acquire_loop`]). The API's one acquisition request
//! (`api::handle`) is the attempts of every kind of hold, and makes a try of one attempt.
//!
//! A multi-lock (`api::multi`) has a loop of its own: it moves between the queues of its
//! members.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::handoff::{Grant, HandoffTerms};
use super::wait::{self, FairExit, FirstAttempt, Waiters, Wake};
use super::wait_record::{WaitRecord, WaitReport};
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::retry::waiting_window;

/// The outcome of one attempt.
#[derive(Debug)]
pub(crate) enum Attempt<W> {
    /// Won. `hand_on`: the next waiter of this client on the same channel may get in too (a
    /// semaphore with permits left, a reader), so it tries at once instead of waiting for the
    /// next release.
    Won { held: W, hand_on: bool },
    /// Busy; until when at the latest a hold could end without a release (the earliest lease
    /// of a holder), the waiter's fallback timer.
    Busy(Option<Duration>),
}

/// The attempts of one acquisition that waits, as its loop sees them. (A trait rather than an
/// async closure: the future of an async closure that borrows its state cannot be shown to be
/// `Send` by the compiler yet, and acquire futures must be.)
pub(crate) trait Attempts {
    /// What a won attempt returns.
    type Held;

    /// The acquisition's holder id, which its trace events name.
    fn holder(&self) -> &str;

    /// One acquire round trip of a caller that will wait, re-sent within `window` while its
    /// outcome is unknown, with its undo armed while in flight.
    async fn attempt(&mut self, window: Duration) -> Result<Attempt<Self::Held>, Error>;

    /// The terms on which this acquisition takes the lock from a release of this client
    /// (`engine::handoff`), asked once as it starts waiting; `None` (the default): it does not.
    fn handoff_terms(&self) -> Option<HandoffTerms> {
        None
    }

    /// The hold a release of this client granted ([`Wake::HandedOff`]); only acquisitions that
    /// gave [`Attempts::handoff_terms`] are granted one. `None`: the next attempt takes it (a
    /// replay of the grant).
    fn handed_off(&mut self, grant: Grant) -> Option<Self::Held> {
        let _ = grant;
        None
    }
}

/// What waiting needs besides the attempts: where a lock's acquisition and a hold's differ.
pub(crate) struct Waiting<'a> {
    /// What the acquisition is for (its lock's name), as its timeout names it.
    pub(crate) name: &'a [u8],
    /// The client's waiters.
    pub(crate) waiters: &'a Arc<Waiters>,
    /// The channel the acquisition waits on, and so the local queue it joins.
    pub(crate) channel: &'a [u8],
    /// What a fair-handoff client undoes in Redis when the acquisition leaves without the lock
    /// (`None`: not a fair-handoff lock).
    pub(crate) fair: Option<FairExit>,
    /// How long the fast attempt is re-sent while its outcome is unknown.
    pub(crate) retry_window: Duration,
    /// A lock's lease: a won attempt holds the next local waiter for it (nobody gets in before
    /// the release). `None` (holds, which others may share): the next waiter re-arms its timer
    /// from the last lease it saw.
    pub(crate) winner_lease: Option<Duration>,
    /// Set when the acquisition starts waiting (the lock's trace event reports it).
    pub(crate) contended: Option<&'a AtomicBool>,
    /// Where a wait at the head of the queue is recorded for operators (`None`: not recorded).
    pub(crate) report: Option<WaitReport<'a>>,
}

/// Acquires through `attempts`: a fast attempt, then
/// waiting in the local queue until an attempt wins or `deadline` passes. [`Error::Timeout`]
/// at the deadline, which bounds everything, also an attempt being retried because Redis does
/// not answer: at the deadline the attempt is dropped, and its pending operation undoes it in
/// the background if it ran.
///
/// Cancel safe: dropping the future leaves the queue and drops an attempt in flight, whose
/// pending operation undoes it.
pub(crate) async fn acquire_loop<T: Attempts>(
    how: Waiting<'_>,
    deadline: Option<Instant>,
    mut attempts: T,
) -> Result<T::Held, Error> {
    let (started, name) = (Instant::now(), how.name);
    // Dropped before `attempts`, as the deadline ends it.
    let within = async {
        // The fast path: one round trip when the lock is free. Skipped when waiters of this
        // client are queued on the same channel, so a newcomer cannot overtake them.
        let mut first = None;
        if !how.waiters.has_waiters(how.channel) {
            let first_attempt = FirstAttempt::new(how.waiters, how.fair.clone());
            match attempts.attempt(how.retry_window).await? {
                Attempt::Won { held, .. } => {
                    first_attempt.settled();
                    return Ok(held);
                }
                Attempt::Busy(remaining) => first = Some((first_attempt, remaining)),
            }
        }
        if deadline.is_some_and(|d| wait::now() >= d) {
            return Err(Error::timeout(how.name, started));
        }
        // Boxed: the waiting state is large, and inline it would make every acquire future
        // (moved a few times on its way to being polled) that much larger, also uncontended.
        let waiting = wait_and_acquire(how, deadline, started, &mut attempts, first);
        Box::pin(waiting).await
    };
    match deadline {
        Some(deadline) => timed_out(
            tokio::time::timeout_at(deadline.into(), within).await,
            name,
            started,
        ),
        None => within.await,
    }
}

/// The outcome of an acquisition that started at `started` and was bounded by a deadline
/// (`tokio::time::timeout_at`): [`Error::Timeout`] when the deadline came first.
pub(crate) fn timed_out<T>(
    outcome: Result<Result<T, Error>, tokio::time::error::Elapsed>,
    name: &[u8],
    started: Instant,
) -> Result<T, Error> {
    outcome.unwrap_or_else(|_elapsed| Err(Error::timeout(name, started)))
}

/// The slow path: queue behind this client's other waiters on the channel and try again on
/// each wake-up until an attempt wins or the deadline passes.
async fn wait_and_acquire<T: Attempts>(
    how: Waiting<'_>,
    deadline: Option<Instant>,
    started: Instant,
    attempts: &mut T,
    first: Option<(FirstAttempt, Option<Duration>)>,
) -> Result<T::Held, Error> {
    if let Some(contended) = how.contended {
        contended.store(true, Ordering::Relaxed);
    }
    metrics::contended();
    let entry = how.waiters.enter(how.channel, how.fair).await?;
    if let Some(terms) = attempts.handoff_terms() {
        entry.accept_handoffs(terms);
    }
    tracing::debug!(name: "fencelock.wait", holder = attempts.holder(), ahead = entry.ahead(), channel = %String::from_utf8_lossy(how.channel), "waiting in this client's queue");
    // Declared after the entry, so dropped before it: the record goes as the wait ends.
    let mut record = how
        .report
        .and_then(|report| WaitRecord::new(report, attempts.holder(), how.channel));
    // The local queue's last leaver takes the client off the Redis queue from here on.
    if let Some((first, remaining)) = first {
        first.settled();
        // The head of the queue: its busy first attempt is the wait operators see.
        if let (0, Some(record)) = (entry.ahead(), &mut record) {
            record.busy(remaining);
        }
    }
    // What was won, and whether room is left for the next waiter of this client.
    let (held, hand_on) = loop {
        match entry.wait(deadline).await {
            Wake::Deadline => return Err(Error::timeout(how.name, started)),
            Wake::HandedOff(grant) => {
                if let Some(held) = attempts.handed_off(grant) {
                    // Permits are left after the grant: the next waiter of this client may
                    // fit (the release published nothing), as after a won attempt.
                    break (held, grant.room.is_some_and(|room| room.free > 0));
                }
            }
            Wake::Try => {}
        }
        let window = waiting_window(how.retry_window, deadline);
        let outcome = attempts.attempt(window).await?;
        entry.answered();
        match outcome {
            Attempt::Won { held, hand_on } => {
                entry.won();
                break (held, hand_on);
            }
            Attempt::Busy(remaining) => {
                if let Some(record) = &mut record {
                    record.busy(remaining);
                }
                entry.observed_lease(remaining);
            }
        }
    };
    if hand_on {
        entry.hand_on();
    }
    if let Some(lease) = how.winner_lease {
        entry.acquired(lease);
    }
    Ok(held)
}
