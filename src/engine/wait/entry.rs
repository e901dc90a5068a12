//! One waiter's place in its client's queue ([`WaitEntry`]), and a release's hold on the
//! offer of the waiter it hands the lock to ([`HandoffOffer`]).

use super::*;

/// One waiter's place in a lock's queue. Dropping it leaves the queue.
pub(crate) struct WaitEntry {
    pub(super) waiters: Arc<Waiters>,
    pub(super) channel: Vec<u8>,
    pub(super) slot: Arc<Slot>,
    /// How many waiters of this client were ahead of this one when it joined the queue.
    pub(super) ahead: usize,
    pub(super) acquired_lease: Option<Duration>,
    pub(super) fair: Option<FairExit>,
}

impl WaitEntry {
    /// How many waiters of this client were ahead of this one when it joined the queue: the
    /// turns of its client it waits for before its own, in fair handoff.
    pub(crate) fn ahead(&self) -> usize {
        self.ahead
    }

    /// Records what Redis said about the holder's lease, for the head's fallback timer.
    pub(crate) fn observed_lease(&self, remaining: Option<Duration>) {
        if let Some(waiting) = self.waiters.channels.lock().get_mut(&self.channel) {
            waiting.lease_end = Some(now() + remaining.unwrap_or(UNKNOWN_LEASE_RECHECK));
        }
    }

    /// The waiter won the lock; when it leaves, the next waiter waits for this lease.
    pub(crate) fn acquired(mut self, lease: Duration) {
        self.acquired_lease = Some(lease);
    }

    /// This waiter was woken and went to Redis, but leaves without the lock although the lock
    /// may be free (a multi-lock whose other member was busy): the wake-up is handed on to the
    /// next waiter when the entry leaves, as a cancelled head's is, or that waiter would sleep
    /// until its lease timer.
    pub(crate) fn hand_on(&self) {
        self.slot.signal.store(SIGNAL_RELEASED, Ordering::Release);
    }

    /// Redis answered an attempt this waiter made: the wake-up that sent it there is used, and
    /// no longer handed on when the entry leaves. The acquire loops call it after every
    /// attempt that came back.
    pub(crate) fn answered(&self) {
        self.slot.in_hand.store(SIGNAL_NONE, Ordering::Release);
    }

    /// This waiter takes the lock from a release of this client when one offers it
    /// (`engine::handoff`), on these terms. Called once, before the first wait.
    pub(crate) fn accept_handoffs(&self, terms: HandoffTerms) {
        self.slot.offer.accept(terms);
    }

    /// This waiter won the lock with an attempt of its own: no grant of it is left to undo.
    pub(crate) fn won(&self) {
        self.slot.offer.claimed();
    }

    /// Waits until this waiter should try Redis, or a release of this client handed it the
    /// lock, or until `deadline`.
    ///
    /// # Cancel safety
    /// Cancel safe: a wake-up that arrives while the future is dropped stays in the slot and
    /// is handed on when the entry leaves the queue; so is one this call took if no attempt
    /// it led to was answered ([`WaitEntry::answered`]) when the entry leaves. A grant that
    /// arrives while it is dropped waits in the slot for the next call, or is undone when the
    /// entry leaves.
    pub(crate) async fn wait(&self, deadline: Option<Instant>) -> Wake {
        let mut lease_ran_out = false;
        loop {
            let signal = self.slot.signal.swap(SIGNAL_NONE, Ordering::AcqRel);
            // The offer is open while this waiter sleeps and closed whenever it goes to Redis,
            // so that it never sends an attempt while a release hands it the lock.
            let look = self.slot.offer.look(signal != SIGNAL_NONE || lease_ran_out);
            if look != Look::Nothing && signal != SIGNAL_NONE {
                // A grant, or a release's outcome on its way, comes first: the wake-up stays
                // for after it.
                self.slot.signal.store(signal, Ordering::Release);
            }
            match look {
                Look::Granted(grant) => return Wake::HandedOff(grant),
                Look::InFlight => {
                    // The release notifies the slot when it ends.
                    if self.slot.sleep(deadline).await && deadline.is_some_and(|d| now() >= d) {
                        return Wake::Deadline;
                    }
                    continue;
                }
                Look::Nothing => {}
            }
            if signal != SIGNAL_NONE {
                self.slot.in_hand.store(signal, Ordering::Release);
            }
            if signal == SIGNAL_RELEASED {
                return Wake::Try;
            }
            if signal == SIGNAL_RECONNECTED || lease_ran_out {
                return self.jittered(deadline).await;
            }
            self.slot.offer.open();
            let timer = {
                let channels = self.waiters.channels.lock();
                channels.get(&self.channel).and_then(|c| {
                    let is_head = c.queue.front().is_some_and(|s| Arc::ptr_eq(s, &self.slot));
                    is_head.then(|| c.lease_end.unwrap_or_else(|| now() + UNKNOWN_LEASE_RECHECK))
                })
            };
            let wake_at = timer.into_iter().chain(deadline).min();
            if self.slot.sleep(wake_at).await {
                if deadline.is_some_and(|d| now() >= d) {
                    return Wake::Deadline;
                }
                if timer.is_some_and(|t| now() >= t) {
                    // Tried once the offer is closed (a grant may be on its way).
                    lease_ran_out = true;
                }
            }
        }
    }

    /// Waits a random moment before trying, but never past the deadline.
    async fn jittered(&self, deadline: Option<Instant>) -> Wake {
        let at = now() + self.waiters.jitter();
        let deadline_first = deadline.filter(|d| *d <= at);
        tokio::time::sleep_until(deadline_first.unwrap_or(at).into()).await;
        match deadline_first {
            Some(_) => Wake::Deadline,
            None => Wake::Try,
        }
    }
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        // A grant this waiter may have and has not claimed is undone (`cancel.lua` for the
        // acquisition, which frees the lock and publishes).
        let undo = self.slot.offer.leave();
        #[cfg(test)]
        let undo = undo.filter(|_| !self.waiters.planted(PlantedBug::GrantNotUndone));
        if let Some(undo) = undo {
            undo();
        }
        let mut channels = self.waiters.channels.lock();
        let Some(waiting) = channels.get_mut(&self.channel) else {
            return;
        };
        let was_head = waiting
            .queue
            .front()
            .is_some_and(|s| Arc::ptr_eq(s, &self.slot));
        waiting.queue.retain(|s| !Arc::ptr_eq(s, &self.slot));
        if let Some(lease) = self.acquired_lease {
            waiting.lease_end = Some(now() + lease);
        }
        // A wake-up not taken yet, or one taken but not used: `wait` returned for it, but no
        // attempt it led to was answered (dropped in its jitter, its deadline passed there, its
        // attempt dropped before Redis answered, as in an outage).
        let unclaimed_wake = match self.slot.signal.load(Ordering::Acquire) {
            SIGNAL_NONE => self.slot.in_hand.load(Ordering::Acquire),
            signal => signal,
        };
        #[cfg(test)]
        let unclaimed_wake = if self.waiters.planted(PlantedBug::KeepsUnusedWake) {
            SIGNAL_NONE
        } else {
            unclaimed_wake
        };
        match waiting.queue.front() {
            // A head that leaves with a wake it did not use (cancelled, timed out, failed) hands
            // it on, or that release would be lost for everyone behind it.
            Some(next)
                if was_head && unclaimed_wake != SIGNAL_NONE && self.acquired_lease.is_none() =>
            {
                next.wake(unclaimed_wake);
            }
            // A new head re-arms its timer from the queue's lease estimate.
            Some(next) if was_head => next.notify.notify_one(),
            Some(_) => {}
            None => {
                // The lease estimate goes with the queue (a channel followers keep stays).
                waiting.lease_end = None;
                if waiting.followers.is_empty() {
                    channels.remove(&self.channel);
                }
                drop(channels);
                if let (None, Some(fair)) = (self.acquired_lease, self.fair.take()) {
                    // Decided under the queue lock: no other waiter of this client is left.
                    self.waiters.leave_fair_queue(fair);
                }
                self.waiters.unsubscribe_later(self.channel.clone());
            }
        }
    }
}

/// A release's hold on the offer of the waiter it hands the lock to (`engine::handoff`):
/// settled with the script's outcome; dropped unsettled, the outcome is unknown, and the
/// waiter is sent to Redis, where its attempt replays a grant that was made.
pub(crate) struct HandoffOffer {
    pub(super) slot: Arc<Slot>,
    /// The candidate's holder id.
    pub(crate) holder: String,
    /// The candidate's lease.
    pub(crate) lease: Duration,
    /// The candidate's label.
    pub(crate) label: Option<Arc<str>>,
    /// The permits the candidate waits for (1 for a lock).
    pub(crate) permits: u32,
    /// How the release ended, as far as it knows; applied to the offer when this is dropped.
    pub(super) outcome: Settled,
}

impl HandoffOffer {
    /// The release that took this offer ended as `settled`.
    pub(crate) fn settle(mut self, settled: Settled) {
        self.outcome = settled;
    }
}

impl Drop for HandoffOffer {
    fn drop(&mut self) {
        if self.slot.offer.settle(self.outcome) {
            self.slot.wake(SIGNAL_RELEASED);
        } else {
            self.slot.notify.notify_one();
        }
    }
}
