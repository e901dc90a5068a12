//! One-round-trip handoff inside a client: when a holder releases a lock that a task of the
//! same client waits for, the release grants it to that waiter in the same script call
//! (`handoff.lua`), instead of a release, its message and a second acquisition.
//!
//! The grant is a fresh acquisition by the waiter's own holder id, so it is exactly what the
//! waiter's next attempt would have taken: the waiter may learn of it from the release's reply
//! (an [`Offer`] settled [`Settled::Granted`]) or, when that reply is lost, from its own next
//! attempt, which replays it (`acquire.lua`: the holder is already in the hash). Whatever
//! happens to either side, the grant is claimed by the waiter or undone by it (`cancel.lua` for
//! its acquisition): a waiter that leaves while a grant may exist that it has not claimed runs
//! that undo, which frees the lock and publishes its release, so the lock goes on to the next
//! waiter or is free; it is never stranded for a lease.
//!
//! Which waiters take part: the first waiter of this client's queue for a plain lock of a
//! client in the default mode (not fair handoff, whose order is the Redis queue's, and not
//! replica acknowledgement, whose acquisitions wait for replicas), and only while it sits in
//! its wait, not while it is at Redis with an attempt of its own. The script grants it only
//! while no other client is subscribed to the lock's channel, so waiters of other clients are
//! never passed over (`handoff.lua` says why that bound holds).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::pending::PendingOp;
use crate::base::token::FencingToken;
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::Control;
use crate::protocol::Room;

/// What a waiter that accepts handoffs offers a release: its acquisition's terms and the undo
/// of that acquisition.
pub(crate) struct HandoffTerms {
    /// The acquisition's holder id (also its operation id).
    pub(crate) holder: String,
    /// The lease the lock is granted for.
    pub(crate) lease: Duration,
    /// The acquisition's label.
    pub(crate) label: Option<Arc<str>>,
    /// The permits it waits for (a semaphore's; 1 for a lock).
    pub(crate) permits: u32,
    /// Runs when the waiter leaves while a grant may exist that it has not claimed: sends
    /// `cancel.lua` for the acquisition (for a lock, its pending operation armed and dropped).
    /// Dropped without running, it does nothing.
    pub(crate) undo: Undo,
}

/// The undo of a waiter's acquisition ([`HandoffTerms::undo`]). A boxed action rather than the
/// pending operation itself, so that the waiting machinery's exploration
/// (`engine::wait::tests::exploration`) can give its simulated one.
pub(crate) type Undo = Box<dyn FnOnce() + Send + Sync>;

/// The undo of a lock acquisition through its pending operation: armed, then dropped, which
/// spawns `cancel.lua` for exactly that acquisition.
pub(crate) fn undo_by(mut pending: PendingOp) -> Undo {
    Box::new(move || {
        #[cfg(fencelock_negative_controls)]
        if pending.engine.broken(Control::HandoffGrantNotUndone) {
            return;
        }
        pending.arm();
    })
}

/// Where the offer of one waiter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// The waiter has not sat in its wait yet, or is at Redis with an attempt of its own (or a
    /// release declined it): no release may take the offer.
    #[default]
    Closed,
    /// The waiter sits in its wait: a release may take the offer.
    Open,
    /// A release took the offer; its script is on its way.
    Offered,
    /// The release granted the lock; the waiter has not claimed it yet.
    Granted(Grant),
    /// The waiter holds the lock (claimed the grant, or won by its own attempt): nothing to
    /// undo when it leaves.
    Claimed,
}

/// A grant the waiter claims: the token, when the release that granted it was sent (the
/// server started the lease no earlier) and, for a semaphore's permits, what the grant left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) token: FencingToken,
    pub(crate) sent_at: Instant,
    pub(crate) room: Option<Room>,
}

/// The offer of one waiter's slot in its client's queue.
#[derive(Default)]
pub(crate) struct Offer {
    state: Mutex<OfferState>,
}

#[derive(Default)]
struct OfferState {
    terms: Option<HandoffTerms>,
    phase: Phase,
    /// A release that took the offer ended without knowing whether its script ran: a grant may
    /// exist that the waiter has not seen (its next attempt replays it). Stays set until the
    /// waiter holds the lock or leaves.
    exposed: bool,
}

/// What a waiter's look at its offer found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// A grant: the waiter holds the lock now.
    Granted(Grant),
    /// A release's script is on its way with this waiter as candidate: wait for its outcome.
    InFlight,
    /// Nothing for this waiter (the offer is closed until it waits again).
    Nothing,
}

impl Offer {
    /// The waiter accepts handoffs on these terms (once, as it joins the queue).
    pub(crate) fn accept(&self, terms: HandoffTerms) {
        self.state.lock().terms = Some(terms);
    }

    /// The waiter sits in its wait: releases may offer it the lock.
    pub(crate) fn open(&self) {
        let mut state = self.state.lock();
        if state.terms.is_some() && state.phase == Phase::Closed {
            state.phase = Phase::Open;
        }
    }

    /// A look while waiting: claims a grant, or reports one on its way (the waiter then waits
    /// for its outcome). `close`: the waiter is about to go to Redis, so an open offer closes,
    /// and no release hands it the lock while its own attempt is out.
    pub(crate) fn look(&self, close: bool) -> Look {
        let mut state = self.state.lock();
        match state.phase {
            Phase::Granted(grant) => {
                state.phase = Phase::Claimed;
                Look::Granted(grant)
            }
            Phase::Offered => Look::InFlight,
            Phase::Open if close => {
                state.phase = Phase::Closed;
                Look::Nothing
            }
            Phase::Open | Phase::Closed | Phase::Claimed => Look::Nothing,
        }
    }

    /// The waiter won the lock by its own attempt (a replay of a grant, or a fresh
    /// acquisition).
    pub(crate) fn claimed(&self) {
        self.state.lock().phase = Phase::Claimed;
    }

    /// A release takes the offer, if the waiter is in its wait and accepts handoffs: the
    /// candidate's holder id, lease, label and permits.
    pub(crate) fn take(&self) -> Option<(String, Duration, Option<Arc<str>>, u32)> {
        let mut state = self.state.lock();
        // Open without terms: the waiter has left.
        if state.phase != Phase::Open || state.terms.is_none() {
            return None;
        }
        state.phase = Phase::Offered;
        let t = state.terms.as_ref()?;
        Some((t.holder.clone(), t.lease, t.label.clone(), t.permits))
    }

    /// The release that took the offer ended: `settled` says how. Returns whether the waiter
    /// must be woken to go to Redis itself (an unknown outcome).
    pub(crate) fn settle(&self, settled: Settled) -> bool {
        let mut state = self.state.lock();
        if state.phase != Phase::Offered {
            // Only the release that took the offer settles it, once.
            return false;
        }
        let unknown = settled == Settled::Unknown;
        state.phase = match settled {
            Settled::Granted(grant) => Phase::Granted(grant),
            Settled::Declined | Settled::Unknown => Phase::Closed,
        };
        state.exposed |= unknown;
        unknown
    }

    /// The waiter leaves the queue: the undo of its acquisition when a grant may exist that it
    /// has not claimed (to be run), else nothing.
    pub(crate) fn leave(&self) -> Option<Undo> {
        let mut state = self.state.lock();
        let unclaimed = match state.phase {
            Phase::Offered | Phase::Granted(_) => true,
            Phase::Claimed => false,
            Phase::Open | Phase::Closed => state.exposed,
        };
        // Without its terms, the offer is never taken again.
        let undo = state.terms.take()?.undo;
        unclaimed.then_some(undo)
    }
}

/// How a release that took an offer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The script granted the lock to the candidate.
    Granted(Grant),
    /// The script answered and did not grant it (entries remain, another client listens, the
    /// lock was not the releaser's any more).
    Declined,
    /// The release gave up without an answer: the script may have run.
    Unknown,
}
