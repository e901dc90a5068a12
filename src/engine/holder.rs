//! What one acquisition holds, shared by its guard and every nested re-entry guard.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::hold::HoldKind;
use super::Engine;
use crate::base::metrics;
use crate::base::replica_ack::Acks;
use crate::base::token::FencingToken;
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::Control;
use crate::protocol::LockKeys;

/// One holder: the identity Redis knows (`id`), the token it was issued, and its lease as this
/// process sees it.
pub(crate) struct Holder {
    pub(crate) engine: Arc<Engine>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) name: Arc<[u8]>,
    pub(crate) id: String,
    pub(crate) token: FencingToken,
    /// What kind of hold this is, and so which scripts release, extend, re-enter and undo it.
    pub(crate) kind: &'static HoldKind,
    /// Renewed by the client's watchdog (acquired without a lease of its own).
    pub(crate) watched: bool,
    /// Replicas that confirmed the acquisition, when it required any.
    pub(crate) replication: Option<Acks>,
    /// End of the lease by this process' monotonic clock: measured from when the request that
    /// set it was first sent (the server started the lease no earlier), minus a drift margin.
    /// With the number of the lease setting it came from (0: the acquisition), so that a reply
    /// of an older setting never moves it later (`lease_renewed`).
    deadline: Mutex<(Instant, u64)>,
    /// Lease settings sent so far (watchdog renewals and extensions), numbered from 1.
    lease_sends: AtomicU64,
    lost: AtomicBool,
    /// Guards of this holder that are alive and not being released. At zero the watchdog stops
    /// renewing, even while the last release is still in flight or failed.
    entries: AtomicUsize,
    /// Wakes `lost()` waiters when the deadline moves or the holder is marked lost.
    changed: Notify,
    /// The runtime the lock was acquired on; a guard dropped anywhere releases through it.
    pub(crate) runtime: Handle,
    /// When the acquire's reply arrived, for the hold time reported on release.
    pub(crate) acquired_at: Instant,
    /// The acquisition's label (`Lock::with_label`), for the events about this hold.
    pub(crate) label: Option<Arc<str>>,
    /// Whether `fencelock.long_hold` was reported for this hold (once per hold).
    long_hold_reported: AtomicBool,
    /// Whether a re-entry of this hold was ever sent. Until then the server's count for it has
    /// never been above 1, so no copy of a release of it can have left an op record, and a
    /// release's first send may skip reading one (`release.lua` ARGV[5]).
    pub(crate) reentered: AtomicBool,
    /// Who acquired it (a guard may move to another task later; the report says "may").
    pub(crate) owner: Owner,
}

/// The task (or, outside any tokio task, the thread: the blocking facade, a `block_on`) that
/// acquired a hold: what a wait record says its waiter holds (`Watchdog::held_by`), so that a
/// wait-for cycle is drawn between waiting tasks, never between two tasks of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    /// The caller's task, or its thread outside a task.
    pub(crate) fn current() -> Owner {
        match tokio::task::try_id() {
            Some(id) => Owner::Task(id),
            None => Owner::Thread(std::thread::current().id()),
        }
    }
}

/// Why a holder was marked lost: the `reason` field of the `fencelock.lost` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LostReason {
    /// The lease ran out by this process' clock without a successful renewal or extension.
    LeaseExpired,
    /// A watchdog renewal found the lock gone or held by another holder.
    RenewalRefused,
    /// A re-entry, extension or release was refused because the lock is not this holder's.
    NotHeld,
}

impl LostReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LostReason::LeaseExpired => "lease_expired",
            LostReason::RenewalRefused => "renewal_refused",
            LostReason::NotHeld => "not_held",
        }
    }
}

/// A lease setting of one holder, sent and not answered yet. Answered, it is [`ran`] or
/// [`refused`]; dropped unanswered (its call failed, or was dropped after sending), it may have
/// run, so the deadline comes no later than its end ([`Holder::lease_set`]).
///
/// [`ran`]: LeaseSetting::ran
/// [`refused`]: LeaseSetting::refused
pub(crate) struct LeaseSetting<'a> {
    holder: &'a Holder,
    sent: u64,
    sent_at: Instant,
    lease: Duration,
    settled: bool,
}

impl LeaseSetting<'_> {
    /// The server set the lease.
    pub(crate) fn ran(mut self) {
        self.settled = true;
        self.holder
            .lease_set(self.sent_at, self.lease, self.sent, true);
    }

    /// The server answered that it set nothing (the hold is not held).
    pub(crate) fn refused(mut self) {
        self.settled = true;
    }
}

impl Drop for LeaseSetting<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.holder
                .lease_set(self.sent_at, self.lease, self.sent, false);
        }
    }
}

/// How much of a lease the holder may count on: 1 % plus 2 ms less than the lease, for clock
/// rate differences between this process and the server and for timer granularity (the
/// margin Redlock uses).
pub(crate) fn validity(lease: Duration) -> Duration {
    lease.saturating_sub(lease / 100 + Duration::from_millis(2))
}

impl Holder {
    /// A holder of a hold of `kind` (`PLAIN_LOCK` for a lock's, a multi-lock member's, an
    /// election's, a job's), whose lease started no earlier than `sent_at`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn of_kind(
        kind: &'static HoldKind,
        engine: Arc<Engine>,
        keys: Arc<LockKeys>,
        name: Arc<[u8]>,
        id: String,
        token: FencingToken,
        sent_at: Instant,
        lease: Duration,
        watched: bool,
        replication: Option<Acks>,
        label: Option<Arc<str>>,
    ) -> Arc<Holder> {
        #[cfg(fencelock_negative_controls)]
        let sent_at = if engine.broken(Control::LeaseFromReply) {
            Instant::now()
        } else {
            sent_at
        };
        Arc::new(Holder {
            engine,
            keys,
            name,
            id,
            token,
            kind,
            watched,
            replication,
            deadline: Mutex::new((sent_at + validity(lease), 0)),
            lease_sends: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            entries: AtomicUsize::new(0),
            changed: Notify::new(),
            runtime: Handle::current(),
            acquired_at: Instant::now(),
            label,
            long_hold_reported: AtomicBool::new(false),
            reentered: AtomicBool::new(false),
            owner: Owner::current(),
        })
    }

    /// Reports this hold once if it has been held for `max` or longer at `now`: a WARN
    /// `fencelock.long_hold` event with its label, and the `fencelock_long_holds_total` metric.
    pub(crate) fn check_age(&self, max: Duration, now: Instant) {
        let held = now.saturating_duration_since(self.acquired_at);
        if held >= max && !self.long_hold_reported.swap(true, Ordering::AcqRel) {
            metrics::long_hold();
            tracing::warn!(
                name: "fencelock.long_hold",
                lock = %String::from_utf8_lossy(&self.name),
                holder = %self.id,
                token = self.token.get(),
                label = self.label.as_deref().unwrap_or(""),
                held_ms = u64::try_from(held.as_millis()).unwrap_or(u64::MAX),
                max_hold_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX),
                "lock held longer than max_hold"
            );
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.deadline.lock().0
    }

    /// A lease setting (a renewal or an extension) of `lease` is about to be sent: numbered,
    /// for the order of the replies ([`LeaseSetting::ran`]).
    pub(crate) fn lease_setting(&self, lease: Duration) -> LeaseSetting<'_> {
        LeaseSetting {
            holder: self,
            sent: self.lease_sends.fetch_add(1, Ordering::AcqRel) + 1,
            sent_at: Instant::now(),
            lease,
            settled: false,
        }
    }

    /// Moves the deadline for the lease setting number `sent`, first sent at `sent_at`, that
    /// `ran` (else: may have run). A renewal and an extension of one hold can be in flight
    /// together; the server keeps the lease of the one it ran last, which on one connection is
    /// the one sent last, while their replies may be handled in either order. So a reply of a
    /// setting sent before the one applied can only bring the deadline closer, never push it
    /// later; and a setting that may have run (it can shorten the lease) brings the deadline
    /// to its end if that is closer, and counts as applied for the order. Either way the
    /// deadline never ends after the server's lease.
    fn lease_set(&self, sent_at: Instant, lease: Duration, sent: u64, ran: bool) {
        let end = sent_at + validity(lease);
        let mut deadline = self.deadline.lock();
        if ran && sent > deadline.1 {
            deadline.0 = end;
        } else {
            deadline.0 = deadline.0.min(end);
        }
        deadline.1 = deadline.1.max(sent);
        drop(deadline);
        self.changed.notify_waiters();
    }

    pub(crate) fn mark_lost(&self, reason: LostReason) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            metrics::lost_lease();
            tracing::warn!(
                name: "fencelock.lost",
                lock = %String::from_utf8_lossy(&self.name),
                holder = %self.id,
                token = self.token.get(),
                reason = reason.as_str(),
                "lock lost"
            );
        }
        self.changed.notify_waiters();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Held as far as this process knows: not reported lost, and the lease has not run out.
    pub(crate) fn is_valid(&self) -> bool {
        !self.is_lost() && Instant::now() < self.deadline()
    }

    /// Resolves once the holder is known to have lost the lock, or its lease ran out by this
    /// process' clock.
    pub(crate) async fn lost(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the checks, so a change between check and await still wakes us.
            changed.as_mut().enable();
            if self.is_lost() {
                return;
            }
            let deadline = self.deadline();
            if Instant::now() >= deadline {
                self.mark_lost(LostReason::LeaseExpired);
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    /// A guard of this holder came to life.
    pub(crate) fn enter(&self) {
        if self.entries.fetch_add(1, Ordering::AcqRel) == 0 {
            metrics::holds_changed(1.0);
        }
    }

    /// A guard of this holder is being released or dropped. The last one takes the holder off
    /// the watch list before its release is even sent.
    pub(crate) fn exit(&self) {
        #[cfg(fencelock_negative_controls)]
        if self.engine.broken(Control::WatchdogIgnoresDrop) {
            return;
        }
        if self.entries.fetch_sub(1, Ordering::AcqRel) == 1 {
            metrics::holds_changed(-1.0);
            self.engine.watchdog.forget(self);
        }
    }

    /// Guards of this holder alive and not being released.
    pub(crate) fn guards(&self) -> usize {
        self.entries.load(Ordering::Acquire)
    }

    /// Whether the watchdog should keep this holder's lease alive.
    pub(crate) fn wants_renewal(&self) -> bool {
        #[cfg(fencelock_negative_controls)]
        if self.engine.broken(Control::WatchdogIgnoresDrop) {
            return !self.is_lost();
        }
        self.guards() > 0 && !self.is_lost()
    }
}

/// What keeps the watchdog renewing a holder: a live guard, and no lost signal. These rules are
/// the holder's alone (the watchdog only asks), so they are pinned here where the counts are
/// visible, against a real server.
#[cfg(test)]
mod tests {
    use fencelock_testing::RedisServer;

    use super::*;
    use crate::LockClient;

    async fn client(server: &RedisServer) -> LockClient {
        LockClient::connect(&server.url()).await.unwrap()
    }

    #[tokio::test]
    async fn dropping_an_inner_re_entry_keeps_the_outer_hold_watched() {
        let server = RedisServer::start().unwrap();
        let client = client(&server).await;
        let outer = client.lock("nested").unwrap().acquire().await.unwrap();
        let inner = outer.reenter().await.unwrap();
        let holder = Arc::clone(outer.holder());
        assert_eq!(holder.entries.load(Ordering::Acquire), 2);
        assert_eq!(client.engine.watchdog.len(), 1);

        drop(inner);
        // The outer guard still holds the lock: it must stay on the watch list, or its lease
        // would run out under it.
        assert_eq!(holder.entries.load(Ordering::Acquire), 1);
        assert!(holder.wants_renewal());
        assert_eq!(client.engine.watchdog.len(), 1);

        outer.release().await.unwrap();
        assert_eq!(holder.entries.load(Ordering::Acquire), 0);
        assert!(!holder.wants_renewal(), "no guard left, nothing to renew");
        assert_eq!(client.engine.watchdog.len(), 0);
    }

    #[tokio::test]
    async fn a_lost_holder_is_not_renewed_even_while_its_guard_lives() {
        let server = RedisServer::start().unwrap();
        let client = client(&server).await;
        let guard = client.lock("lost").unwrap().acquire().await.unwrap();
        assert!(guard.holder().wants_renewal());
        assert!(guard.holder().is_valid());

        guard.holder().mark_lost(LostReason::NotHeld);
        assert!(guard.holder().is_lost());
        assert!(!guard.holder().is_valid());
        assert!(
            !guard.holder().wants_renewal(),
            "renewing a lock its holder was told it lost keeps a dead lock alive"
        );
        // Losing is sticky: a second report changes nothing.
        guard.holder().mark_lost(LostReason::LeaseExpired);
        assert!(guard.holder().is_lost());
    }

    #[tokio::test]
    async fn an_unwatched_holder_never_joins_the_watch_list() {
        let server = RedisServer::start().unwrap();
        let client = client(&server).await;
        let guard = client
            .lock("fixed")
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        assert!(!guard.holder().watched);
        assert_eq!(client.engine.watchdog.len(), 0);
        let inner = guard.reenter().await.unwrap();
        drop(inner);
        assert_eq!(client.engine.watchdog.len(), 0);
        guard.release().await.unwrap();
    }

    /// A renewal and an extension in flight together: the server keeps the lease of the one
    /// sent last (one connection runs them in order), whichever reply is handled last; the
    /// other's reply may only bring the deadline closer.
    #[tokio::test]
    async fn a_lease_setting_sent_earlier_never_pushes_the_deadline_later() {
        let server = RedisServer::start().unwrap();
        let client = client(&server).await;
        let guard = client.lock("set twice").unwrap().acquire().await.unwrap();
        let holder = guard.holder();
        let now = Instant::now();
        let (long, short) = (Duration::from_secs(30), Duration::from_secs(2));

        let setting = |lease| {
            let mut setting = holder.lease_setting(lease);
            setting.sent_at = now;
            setting
        };

        // A renewal (long) sent, then an extension (short): the extension's reply first.
        let (renewal, extension) = (setting(long), setting(short));
        extension.ran();
        renewal.ran();
        assert_eq!(holder.deadline(), now + validity(short));

        // In the order sent, the later one's lease stands.
        let (extension, renewal) = (setting(short), setting(long));
        extension.ran();
        renewal.ran();
        assert_eq!(holder.deadline(), now + validity(long));

        // The earlier one's reply last, and shorter: the deadline comes closer.
        let (renewal, extension) = (setting(short), setting(long));
        extension.ran();
        renewal.ran();
        assert_eq!(holder.deadline(), now + validity(short));

        // A longer lease set, then a shorter one whose reply was lost: it may have run, so the
        // deadline comes to its end; and a reply of a setting sent before it, handled after,
        // does not push the deadline past it.
        let (earlier, lost) = (setting(long), setting(long));
        lost.ran();
        assert_eq!(holder.deadline(), now + validity(long));
        let (before, unanswered) = (setting(long), setting(short));
        drop(unanswered);
        assert_eq!(holder.deadline(), now + validity(short));
        before.ran();
        earlier.ran();
        assert_eq!(holder.deadline(), now + validity(short));
        // A refused setting moves nothing; a later one that ran sets the lease again.
        setting(long).refused();
        assert_eq!(holder.deadline(), now + validity(short));
        setting(long).ran();
        assert_eq!(holder.deadline(), now + validity(long));
        guard.release().await.unwrap();
    }

    #[test]
    fn lost_reasons_have_stable_names() {
        // These names are the `reason` field of the documented `fencelock.lost` event.
        assert_eq!(LostReason::LeaseExpired.as_str(), "lease_expired");
        assert_eq!(LostReason::RenewalRefused.as_str(), "renewal_refused");
        assert_eq!(LostReason::NotHeld.as_str(), "not_held");
    }
}
