//! Proof of holding a lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rwlock::{ReadGuard, WriteGuard};
use crate::base::durations::validate_lease;
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::engine::handoff::{Grant, Settled};
use crate::engine::holder::{Holder, LostReason};
use crate::engine::pending::{PendingOp, Sends};
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::Control;
use crate::protocol::{CancelKind, Candidate, EnterReply, HandoffReply, OwnerReply, PubSub};

/// Proof that this holder holds a lock, with the fencing token to present to storage.
///
/// A guard is created by [`Lock::acquire`](crate::Lock::acquire) (and its siblings) or by
/// [`LockGuard::reenter`]. Each guard accounts for one entry of its holder: the lock is free
/// again when every guard of the holder is released.
///
/// Release it explicitly with [`LockGuard::release`] to learn whether you still held the lock
/// up to that point. A guard that is dropped instead releases in the background on the runtime
/// it was acquired on; if that runtime is gone, the lease frees the lock. Guards are `Send` and
/// `Sync`: move one to another task and release it there.
///
/// ```no_run
/// # async fn demo(lock: fencelock::Lock) -> Result<(), fencelock::Error> {
/// let guard = lock.acquire().await?;
/// let token = guard.token();          // write it with every change to the resource
/// let inner = guard.reenter().await?; // a nested critical section of the same holder
/// assert_eq!(inner.token(), token);
/// inner.release().await?;
/// guard.release().await?;             // the lock is free now
/// # Ok(()) }
/// ```
#[must_use = "a guard releases the lock when dropped; bind it for as long as the critical section lasts"]
pub struct LockGuard {
    holder: Arc<Holder>,
    /// The release's operation id, fixed on first use so that a release finished in the
    /// background after a failed or cancelled `release()` is the same operation, not a second
    /// decrement; and when it was first sent, which is when a lock it handed on began its
    /// lease at the earliest (a background re-send replays that grant).
    release_op: Option<(String, Instant)>,
    released: bool,
}

impl LockGuard {
    /// The shared holder state: for the holder's own unit tests, and for a job run's view of
    /// its hold (`JobRun`), which outlives no guard but must not borrow one.
    pub(crate) fn holder(&self) -> &Arc<Holder> {
        &self.holder
    }

    /// Lets go of the guard without releasing the lock: it stays held until its lease ends on
    /// the server, which is how a job keeps its tick from a late instance for `at_least_for`.
    /// The holder leaves the watch list, so nobody renews the lease.
    pub(crate) fn keep_until_lease_ends(mut self) {
        if self.release_op.is_none() {
            self.holder.exit();
        }
        self.released = true;
    }
}

/// `Deref` to the [`LockGuard`] that a kind's own guard type (`SemaphorePermit`, `ReadGuard`,
/// `WriteGuard`) keeps in its `guard` field: the guard's methods are the wrapper's too.
macro_rules! deref_to_guard {
    ($($wrapper:ty),*) => {$(
        impl std::ops::Deref for $wrapper {
            type Target = LockGuard;

            fn deref(&self) -> &LockGuard {
                &self.guard
            }
        }
    )*};
}
pub(crate) use deref_to_guard;

// A read or write guard shows what it is: the lock guard of its hold, under its own name.
debug_struct!(LockGuard, ReadGuard, WriteGuard (self) {
    lock: String::from_utf8_lossy(self.lock_name()),
    holder: self.holder_id(),
    token: self.token(),
    valid: self.is_valid(),
});

impl LockGuard {
    pub(crate) fn new(holder: Arc<Holder>) -> LockGuard {
        holder.enter();
        LockGuard {
            holder,
            release_op: None,
            released: false,
        }
    }

    getters! {
        /// The fencing token of this holder. The same for every re-entry; strictly greater than
        /// every token issued for this lock before this holder's acquisition.
        fn token(&self) -> FencingToken => self.holder.token;

        /// Whether the acquisition reached the replicas it required: `true` when it required none
        /// or enough confirmed it, `false` for a guard returned under
        /// [`OnShortfall::ReturnUnreplicated`](crate::OnShortfall::ReturnUnreplicated) after too
        /// few did. Re-entries share their holder's answer.
        fn replicated(&self) -> bool => self.holder.replication.is_none_or(|acks| acks.enough());

        /// How many replicas confirmed the acquisition (`WAIT`'s answer), or `None` when the lock
        /// did not require replica acknowledgement.
        fn replica_acks(&self) -> Option<u32> => self.holder.replication.map(|acks| acks.acked);

        /// The name of the lock this guard holds.
        fn lock_name(&self) -> &[u8] => &self.holder.name;

        /// The holder id Redis knows this holder by (client id, then a sequence number).
        fn holder_id(&self) -> &str => &self.holder.id;

        /// When the lease ends by this process' monotonic clock. Measured from when the acquiring
        /// (or extending) request was sent, so it never ends later than the server's lease.
        fn valid_until(&self) -> Instant => self.holder.deadline();

        /// Whether this holder still holds the lock as far as this process knows: the lease has
        /// not run out and no operation found the lock gone. A `true` is a belief, not a proof
        /// (the process may pause right after asking); fence your writes with [`Self::token`].
        fn is_valid(&self) -> bool => self.holder.is_valid();
    }

    /// Resolves when this holder has lost the lock: a renewal found it gone or taken over, an
    /// operation was refused as not held, renewals kept failing until the lease ran out, an
    /// explicit lease reached its end, or the acquire's reply arrived after the lease was
    /// already over. Never resolves while the lock is held and renewed.
    ///
    /// `select!` on it around a critical section to stop working the moment the lock is gone:
    ///
    /// ```no_run
    /// # async fn demo(lock: fencelock::Lock) -> Result<(), fencelock::Error> {
    /// # async fn critical_section(_t: fencelock::FencingToken) {}
    /// let guard = lock.acquire().await?;
    /// tokio::select! {
    ///     () = critical_section(guard.token()) => guard.release().await?,
    ///     () = guard.lost() => eprintln!("lock lost; the work was abandoned"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits (for a lost signal or the lease's end by this process'
    /// clock) and changes nothing; drop it and call it again at will.
    pub async fn lost(&self) {
        self.holder.lost().await;
    }

    /// Enters the lock once more as the same holder, for a nested critical section; the
    /// returned guard carries the same token. The lease is unchanged. Release both guards (in
    /// any order) to free the lock.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when this holder lost the lock (nothing changed on the server);
    /// [`Error::Redis`] when Redis could not be reached within the retry window (the re-entry
    /// is then undone in the background if it ran); [`Error::Protocol`] when the server answered
    /// with another token than this holder's (a broken or mismatched script: the entry it
    /// counted is undone in the background, and no guard with a foreign token is handed out).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped `reenter` whose request may have run is undone with exactly one
    /// decrement, and a request still in flight is made a no-op.
    pub async fn reenter(&self) -> Result<LockGuard, Error> {
        let engine = &self.holder.engine;
        let op = engine.next_id();
        let (kind, keys, holder) = (self.holder.kind, &self.holder.keys, &self.holder.id);
        let mut pending = PendingOp::of_kind(kind, engine, keys, holder, &op, CancelKind::Reenter);
        let ttl = engine.config.op_record_ttl;
        // Before the first send: from here on the server's count may exceed 1, and every
        // release of this hold reads its op record (a copy of it may have decremented).
        self.holder.reentered.store(true, Ordering::Release);
        pending.arm();
        let reply = engine
            .retrying(|conn| kind.reenter(conn, keys, holder, &op, ttl))
            .await
            .map_err(|err| err.named(&self.holder.name))?;
        match reply {
            EnterReply::Entered { token, .. } if token == self.holder.token => {
                pending.disarm();
                Ok(LockGuard::new(self.holder.clone()))
            }
            // A script that changed the token (a broken or mismatched `reenter.lua`) counted an
            // entry that no guard will ever release: `pending` stays armed, so dropping it
            // undoes that entry on the server.
            EnterReply::Entered { token, .. } => Err(Error::Protocol(format!(
                "re-entry returned token {token}, the holder has {}",
                self.holder.token
            ))),
            EnterReply::NotHeld => {
                pending.disarm();
                self.holder.mark_lost(LostReason::NotHeld);
                Err(Error::not_held(&self.holder.name))
            }
            EnterReply::Cancelled => {
                pending.disarm();
                Err(Error::Cancelled)
            }
        }
    }

    /// Sets the lease to `lease` from now (this can also shorten it). On a lock kept alive by
    /// the client's watchdog (acquired without a lease of its own), the next renewal sets the
    /// lease back to the client's default.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for an unusable lease (nothing sent); [`Error::NotHeld`] when
    /// this holder lost the lock (nothing changed); [`Error::Redis`] when Redis could not be
    /// reached within the retry window.
    ///
    /// # Cancel safety
    /// Cancel safe: an extension is an absolute re-set of the lease, which may run after its
    /// caller stopped waiting (or after an error whose outcome is unknown). The guard then
    /// counts the lease as ending at the earlier of its previous end and the extension's, so
    /// that [`LockGuard::valid_until`] never passes the server's lease, which a shortening
    /// extension that ran may have brought closer.
    pub async fn extend(&self, lease: Duration) -> Result<(), Error> {
        let lease = validate_lease(lease)?;
        // Dropped unanswered (an error, or this future dropped), it may have run.
        let setting = self.holder.lease_setting(lease);
        let reply = self
            .holder
            .engine
            .retrying(|conn| {
                let (keys, holder) = (&self.holder.keys, &self.holder.id);
                self.holder.kind.extend(conn, keys, holder, lease)
            })
            .await
            .map_err(|err| err.named(&self.holder.name))?;
        let extended = owned(&self.holder, reply);
        match extended {
            Ok(()) => setting.ran(),
            Err(_) => setting.refused(),
        }
        extended
    }

    /// Leaves the lock once; the last guard of a holder frees it and wakes waiters.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock was no longer this holder's (its lease ran out, it was
    /// deleted or taken over): whatever you did under it may have overlapped another holder.
    /// Nothing of the other holder's is touched. [`Error::Redis`] when Redis could not be
    /// reached within the retry window; the release then goes on in the background with the
    /// same operation id.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped `release` is finished in the background as the same operation,
    /// so it decrements exactly once. When it was handing the lock to a waiting task of this
    /// client, that task learns of the grant from its own next attempt, or undoes it if it
    /// leaves first.
    pub async fn release(mut self) -> Result<(), Error> {
        let (holder, op, started) = self.begin_release();
        let reply = release(&holder, &op, started).await;
        self.finish_release("release", reply)
    }
}

/// The `fencelock.release` event and the release metrics, for explicit and background
/// releases alike.
fn report_release(holder: &Holder, method: &'static str, reply: &Result<OwnerReply, Error>) {
    // Every release passes here: the lossy name and the hold time are computed inside the
    // event macros, which evaluate their fields only when a subscriber wants the event.
    let held_us = || u64::try_from(holder.acquired_at.elapsed().as_micros()).unwrap_or(u64::MAX);
    let lock = || String::from_utf8_lossy(&holder.name);
    let (holder_id, token) = (holder.id.as_str(), holder.token.get());
    // The event at the level of its outcome, with the fields every outcome has.
    macro_rules! event {
        ($level:ident, $($fields:tt)*) => {
            tracing::$level!(name: "fencelock.release", lock = %lock(), holder = holder_id, token,
                method, $($fields)*)
        };
    }
    match reply {
        Ok(OwnerReply::Done { remaining }) => {
            let outcome = if *remaining == 0 {
                metrics::hold(holder.acquired_at);
                metrics::RELEASED
            } else {
                metrics::EXITED
            };
            metrics::release(outcome);
            event!(
                debug,
                outcome,
                remaining,
                held_us = held_us(),
                "lock released"
            );
        }
        Ok(OwnerReply::NotHeld) => {
            metrics::release(metrics::NOT_HELD);
            event!(
                warn,
                outcome = metrics::NOT_HELD,
                held_us = held_us(),
                "released a lock that was no longer held"
            );
        }
        // A failed explicit release (`release`, or `set`: a multi-lock's) goes on in the
        // background as the same operation, from the guard's drop, which counts its outcome:
        // counted here too, one release would count twice.
        Err(err) if method != "drop" => {
            event!(warn, outcome = metrics::ERROR, held_us = held_us(), error = %err,
                "lock release failed; it goes on in the background");
        }
        Err(err) => {
            metrics::release(metrics::ERROR);
            event!(warn, outcome = metrics::ERROR, held_us = held_us(), error = %err,
                "lock release failed; the lease will free the lock");
        }
    }
}

impl LockGuard {
    /// Starts this guard's release (its own, or as part of a set released in one script, a
    /// multi-lock's): the holder leaves the watch list and the release gets its op id, the
    /// same one a background release of this guard would re-send, and when it was first sent.
    pub(crate) fn begin_release(&mut self) -> (Arc<Holder>, String, Instant) {
        if self.release_op.is_none() {
            // The watchdog stops renewing as soon as the last entry starts leaving, so a
            // release that fails or hangs cannot leave a lease renewed forever.
            self.holder.exit();
        }
        let engine = self.holder.engine.clone();
        let (op, started) = self
            .release_op
            .get_or_insert_with(|| (engine.next_id(), Instant::now()));
        (self.holder.clone(), op.clone(), *started)
    }

    /// Ends this guard's release with `reply`, reported as the release `method` (`release`,
    /// or `set`: released with its multi-lock set). On an error the guard is dropped
    /// unreleased, and its release goes on in the background with the same op id.
    pub(crate) fn finish_release(
        mut self,
        method: &'static str,
        reply: Result<OwnerReply, Error>,
    ) -> Result<(), Error> {
        report_release(&self.holder, method, &reply);
        let reply = reply?;
        self.released = true;
        owned(&self.holder, reply)
    }
}

/// What an owner-checked reply means for `holder`: [`Error::NotHeld`] when the hold was no
/// longer its own, which marks it lost.
pub(crate) fn owned(holder: &Holder, reply: OwnerReply) -> Result<(), Error> {
    match reply {
        OwnerReply::Done { .. } => Ok(()),
        OwnerReply::NotHeld => {
            holder.mark_lost(LostReason::NotHeld);
            Err(Error::not_held(&holder.name))
        }
    }
}

/// One release of `holder`'s hold by its kind's script, with the handoff offer when the kind
/// hands off (`engine::handoff`): the freed hold goes, in the same call, to this client's first
/// waiter if it sits in its wait. `started`: when the operation `op` was first sent (by an
/// earlier call, for a release finished in the background), which is when a grant it made, or
/// replays, began its lease at the earliest.
async fn release(holder: &Holder, op: &str, started: Instant) -> Result<OwnerReply, Error> {
    let kind = holder.kind;
    let offer = if kind.hands_off(&holder.engine) {
        holder.engine.waiters.offer_to_head(&holder.keys.lock)
    } else {
        None
    };
    let sent_at = started;
    let sends = Sends::default();
    let reply = holder
        .engine
        .retrying(|conn| {
            let pubsub = conn.pubsub();
            // A release's op record is written only when it leaves entries, so a hold never
            // re-entered has none to find, and any copy of its release, earlier or later, finds
            // the holder (and frees it) or the mark its freeing left: the first send of such a
            // release skips the read. Every other send reads it: after a send of unknown
            // outcome a copy may have run, and of a re-entered hold, a copy may have
            // decremented (even a straggling first send, arriving after a re-send ran).
            let read_record = sends.send(&conn) || holder.reentered.load(Ordering::Acquire);
            #[cfg(fencelock_negative_controls)]
            let read_record = read_record && !holder.engine.broken(Control::ReleaseResentAsFirst);
            // The script counts the channel's listeners on the lock's own node: in a cluster
            // that is all of them only with sharded pub/sub.
            let candidate = offer
                .as_ref()
                .filter(|_| !conn.is_cluster() || pubsub == PubSub::Sharded)
                .map(|offer| Candidate {
                    holder: &offer.holder,
                    lease: offer.lease,
                    label: offer.label.as_deref(),
                    permits: offer.permits,
                });
            kind.release(holder, conn, op, pubsub, candidate, read_record)
        })
        .await
        .map_err(|err| err.named(&holder.name));
    // Dropped unsettled on an error: the waiter then asks Redis, which replays a grant.
    if let (Some(offer), Ok(reply)) = (offer, &reply) {
        if let HandoffReply::HandedOff { token, .. } = *reply {
            tracing::debug!(
                name: "fencelock.handoff",
                lock = %String::from_utf8_lossy(&holder.name),
                from = %holder.id,
                to = %offer.holder,
                token = token.get(),
                permits = offer.permits,
                "lock handed to a waiting task of this client"
            );
        }
        offer.settle(match *reply {
            HandoffReply::HandedOff { token, room } => Settled::Granted(Grant {
                token,
                sent_at,
                room,
            }),
            HandoffReply::Released { .. } | HandoffReply::NotHeld => Settled::Declined,
        });
    }
    reply.map(|reply| match reply {
        HandoffReply::Released { remaining } => OwnerReply::Done { remaining },
        HandoffReply::HandedOff { .. } => OwnerReply::Done { remaining: 0 },
        HandoffReply::NotHeld => OwnerReply::NotHeld,
    })
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (holder, op, started) = self.begin_release();
        // Spawning on a runtime that has shut down drops the task without panicking; the
        // lease then frees the lock.
        self.holder.runtime.spawn(async move {
            let reply = release(&holder, &op, started).await;
            report_release(&holder, "drop", &reply);
            if let Ok(OwnerReply::NotHeld) = reply {
                holder.mark_lost(LostReason::NotHeld);
            }
        });
    }
}
