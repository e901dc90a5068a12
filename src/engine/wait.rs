//! Waiting for a lock without polling: per-lock FIFO queues of local waiters, woken by the
//! release messages that `release.lua` publishes.
//!
//! Only the head of a lock's queue ever goes to Redis. A release message wakes the head alone;
//! when it wins, the next waiter becomes head and waits for the next release (it does not go to
//! Redis just to learn the lock is taken). When a message is lost, the head's timer, set to the
//! holder's remaining lease, wakes it anyway: a lost message costs at most one lease, never a
//! hang.
//!
//! An election's followers ([`ObserveEntry`]) share the subscriptions: they are woken by every
//! message on the channel (`elected` included, which wakes no waiter: the lock was just taken),
//! by a reconnect and by a moved subscription, and they never compete for the lock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::handoff::{Grant, HandoffTerms, Look, Offer, Settled};
use crate::base::error::{Error, ErrorClass};
use crate::base::retry;
use crate::protocol::{self, LockKeys, ReleaseMessage};
use crate::transport::{Conn, Connections, PushListener};

/// How long a head waits when the holder's lease is unknown (a key without expiry, which only
/// an operator can create) before it asks Redis again.
const UNKNOWN_LEASE_RECHECK: Duration = Duration::from_secs(1);

/// Upper bound of the random delay before a waiter retries after its lease timer fired or the
/// connection was re-established. Those wake-ups hit every process at once (the lease ends for
/// all of them at the same moment; a restarted server drops every client together), so they
/// are spread out. A release message is not delayed: it wakes one waiter per process, which is
/// a handful of script calls, and every microsecond of delay is handoff latency.
pub(super) const HERD_JITTER: Duration = Duration::from_millis(20);

const SIGNAL_NONE: u8 = 0;
/// The lock may be free: go to Redis.
const SIGNAL_RELEASED: u8 = 1;
/// The connection was re-established and messages may have been lost: go to Redis, jittered.
const SIGNAL_RECONNECTED: u8 = 2;

/// The local waiters of one client, by lock channel.
#[derive(Default)]
pub(crate) struct Waiters {
    /// Who of this client needs the messages of each channel: a channel is listed while it has
    /// waiters or followers, and its subscription stays while it is listed.
    channels: Mutex<HashMap<Vec<u8>, Channel>>,
    /// Channels this client is subscribed to. The async lock also serialises SUBSCRIBE and
    /// UNSUBSCRIBE, so the last decision sent to the server is the one made last.
    subscribed: tokio::sync::Mutex<HashSet<Vec<u8>>>,
    /// The client's connections, set right after they are made (a connection's push handler
    /// needs the `Waiters` first, so this cannot be a constructor argument).
    conn: OnceLock<Connections>,
    /// Unit tests only: where the waiters' own requests go instead of `conn`.
    #[cfg(test)]
    test_link: OnceLock<Arc<dyn TestLink>>,
    /// Unit tests only: a lost wake-up planted on purpose.
    #[cfg(test)]
    planted: OnceLock<PlantedBug>,
}

/// What the waiters send by themselves (subscriptions, leaving the fair queue) and where their
/// randomness comes from, in unit tests that run them against a simulated server
/// (`engine::wait::tests::exploration`) instead of a connection. Production has no such seam.
#[cfg(test)]
pub(crate) trait TestLink: Send + Sync {
    /// `SUBSCRIBE channel`, one round trip.
    fn subscribe(&self, channel: &[u8]) -> TestFuture<Result<(), Error>>;
    /// `UNSUBSCRIBE channel`, one round trip.
    fn unsubscribe(&self, channel: &[u8]) -> TestFuture<Result<(), Error>>;
    /// `leave_fair.lua` for `fair`, one round trip.
    fn leave_fair(&self, fair: &FairExit) -> TestFuture<()>;
    /// A random number from the test's seeded generator (the herd jitter's).
    fn random(&self) -> u64;
}

/// A future a [`TestLink`] returns.
#[cfg(test)]
pub(crate) type TestFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// A lost wake-up planted on purpose, so that the exploration (`engine::wait::tests::exploration`)
/// shows it can catch one. Exists only in the crate's unit tests.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlantedBug {
    /// A head that leaves with a wake-up it did not use keeps it instead of handing it on.
    KeepsUnusedWake,
    /// `enter` does not send the first waiter to Redis once it is subscribed, so a release
    /// between the busy first attempt and the subscription is missed.
    NoLookAfterSubscribe,
    /// A waiter that leaves with a grant it has not claimed (or one that may exist) does not
    /// undo it (`engine::handoff`): the lock stays held for nobody.
    GrantNotUndone,
}

/// This client's waiters and followers of one channel.
#[derive(Default)]
struct Channel {
    /// The waiters, in order of arrival; the first is the head.
    queue: VecDeque<Arc<Slot>>,
    /// When the current holder's lease ends, as last observed; the head's fallback timer.
    lease_end: Option<Instant>,
    /// The followers of an election on this channel: each is woken by every message on it.
    followers: Vec<Arc<Slot>>,
}

/// One waiter's or follower's place, known by its address (`Arc::ptr_eq`).
#[derive(Default)]
pub(super) struct Slot {
    /// A wake-up not taken yet.
    signal: AtomicU8,
    /// The wake-up `wait` took, until an attempt it led to is answered
    /// ([`WaitEntry::answered`]): a waiter that leaves before that hands it on.
    in_hand: AtomicU8,
    notify: Notify,
    /// A waiter's offer to take the lock from a release of this client (`engine::handoff`).
    offer: Offer,
}

impl Slot {
    fn wake(&self, signal: u8) {
        self.signal.store(signal, Ordering::Release);
        self.notify.notify_one();
    }

    /// Sleeps until this slot is notified or `until` passes (`None`: until notified); whether
    /// `until` passed.
    async fn sleep(&self, until: Option<Instant>) -> bool {
        let notified = self.notify.notified();
        let Some(until) = until else {
            notified.await;
            return false;
        };
        // Biased, timer first: when a wake-up and the timer are ready together, a passed
        // deadline ends the wait (the wake-up is handed on as the entry leaves). Fixed rather
        // than random, so that a run replays exactly under a paused test clock.
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(until.into()) => true,
            () = notified => false,
        }
    }
}

/// The time on tokio's clock, the one the waiters' timers run on. In a running program it is
/// `Instant::now()`; under a paused test clock it is the virtual time, so that deadlines and
/// lease estimates agree with the timers that wait for them.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// What a fair-handoff waiter's client must undo in Redis when its last waiter for a lock
/// leaves without the lock: its queue entry, and a reservation made for it
/// (`leave_fair.lua`).
#[derive(Clone)]
pub(crate) struct FairExit {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) client: String,
    pub(crate) grace: Duration,
}

/// Takes a fair-handoff client off a lock's Redis queue if dropped before [`settled`]: held
/// over an acquisition's first attempt, which queues the client in Redis when the lock is
/// held, before the acquirer has a place in the local queue (whose last leaver normally does
/// it). Without it, a deadline that passes at the first attempt, or a future dropped during
/// it, left an entry that cost the next handoff one grace. `None` inside for default clients.
///
/// [`settled`]: FirstAttempt::settled
pub(crate) struct FirstAttempt(Option<Box<(Arc<Waiters>, FairExit)>>);

impl FirstAttempt {
    pub(crate) fn new(waiters: &Arc<Waiters>, fair: Option<FairExit>) -> Self {
        FirstAttempt(fair.map(|fair| Box::new((waiters.clone(), fair))))
    }

    /// The acquisition won (its script left the queue) or has its place in the local queue.
    pub(crate) fn settled(mut self) {
        self.0 = None;
    }
}

impl Drop for FirstAttempt {
    fn drop(&mut self) {
        if let Some(armed) = self.0.take() {
            let (waiters, fair) = *armed;
            // Checks for other waiters of this client itself, right before it sends.
            waiters.leave_fair_queue(fair);
        }
    }
}

/// What ended a wait.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The lock may be free (release message, lease ran out, reconnect): try to acquire.
    Try,
    /// A release of this client granted the lock to this waiter (`engine::handoff`): it holds
    /// it now.
    HandedOff(Grant),
    /// The caller's deadline passed.
    Deadline,
}

impl Waiters {
    /// Is anyone of this client already waiting for `channel`? A newcomer then queues behind
    /// them instead of barging to Redis.
    pub(crate) fn has_waiters(&self, channel: &[u8]) -> bool {
        self.channels
            .lock()
            .get(channel)
            .is_some_and(|c| !c.queue.is_empty())
    }

    /// Does anyone of this client (a waiter or a follower) still need the messages of
    /// `channel`? The subscription stays while someone does.
    fn wants_messages(&self, channel: &[u8]) -> bool {
        self.channels.lock().contains_key(channel)
    }

    /// Hands the waiters the client's connections, once, right after they are made.
    pub(crate) fn set_connection(&self, connections: Connections) {
        let _ = self.conn.set(connections);
    }

    /// The connection that carries the subscriptions.
    fn subscriptions(&self) -> Result<Conn, Error> {
        let subscriptions = self.conn.get().map(|c| c.subscriptions.clone());
        subscriptions
            .ok_or_else(|| Error::Protocol("waiters used before the client connected".into()))
    }

    /// Joins the queue of `channel`, subscribing to its release messages first if this client
    /// is not yet. The returned entry leaves the queue when dropped.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        channel: &[u8],
        fair: Option<FairExit>,
    ) -> Result<WaitEntry, Error> {
        let slot = Arc::<Slot>::default();
        #[cfg(test)]
        let looks = !self.planted(PlantedBug::NoLookAfterSubscribe);
        #[cfg(not(test))]
        let looks = true;
        let ahead = {
            let mut channels = self.channels.lock();
            let queue = &mut channels.entry(channel.to_vec()).or_default().queue;
            queue.push_back(slot.clone());
            if queue.len() == 1 && looks {
                // The first waiter asks Redis once more when it is subscribed (its first
                // `wait` returns at once): a release before the subscription was not seen.
                // Given now, under the queue lock, rather than once subscribed: a first waiter
                // that leaves while subscribing (cancelled, its deadline) hands it on to the
                // next, which would otherwise become head with no look at all.
                slot.signal.store(SIGNAL_RELEASED, Ordering::Release);
            }
            queue.len() - 1
        };
        // From here on the entry owns the slot, so an error or a cancellation below still
        // removes it from the queue.
        let entry = WaitEntry {
            waiters: self.clone(),
            channel: channel.to_vec(),
            slot,
            ahead,
            acquired_lease: None,
            fair,
        };
        if let Err(err) = self.subscribe(channel, false).await {
            // A connection lost while subscribing does not end the wait, nor does a slot move
            // (any other failure does), but it leaves no subscription: the old connection's is
            // gone with it, and the transport restores only those whose confirmation it read.
            // So it is made again in the background, which then sends the head to Redis.
            if !subscribing_again_may_succeed(&err) {
                return Err(err);
            }
            tracing::debug!(error = %err, "subscribing failed for a passing reason; again");
            self.subscribe_again(channel.to_vec());
        }
        Ok(entry)
    }

    /// Subscribes to `channel` while someone of this client needs its messages (whether someone
    /// does): unless this client already is or, `again`, whatever the record says.
    async fn subscribe(&self, channel: &[u8], again: bool) -> Result<bool, Error> {
        let mut subscribed = self.subscribed.lock().await;
        if !self.wants_messages(channel) {
            return Ok(false);
        }
        if again || !subscribed.contains(channel) {
            let sent = self.send_subscribe(channel).await;
            match sent {
                Ok(()) => subscribed.insert(channel.to_vec()),
                Err(_) => subscribed.remove(channel),
            };
            sent?;
        }
        Ok(true)
    }

    /// Sends `SUBSCRIBE channel` (no bookkeeping).
    async fn send_subscribe(&self, channel: &[u8]) -> Result<(), Error> {
        #[cfg(test)]
        if let Some(link) = self.test_link.get() {
            return link.subscribe(channel).await;
        }
        Ok(self.subscriptions()?.subscribe(channel).await?)
    }

    /// A random number (from the test's generator in unit tests that set one).
    fn random(&self) -> u64 {
        #[cfg(test)]
        if let Some(link) = self.test_link.get() {
            return link.random();
        }
        uuid::Uuid::new_v4().as_u64_pair().1
    }

    /// A random delay in `[0, HERD_JITTER)`, uniform for a uniformly random number.
    fn jitter(&self) -> Duration {
        Duration::from_micros(self.random() % HERD_JITTER.as_micros() as u64)
    }

    /// Runs `task` on these waiters in the background, on the current runtime (outside one:
    /// not at all).
    fn spawn<F>(self: &Arc<Self>, task: impl FnOnce(Arc<Self>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(task(self.clone()));
        }
    }

    /// Sends this client's own requests through `link` instead of a connection (unit tests).
    #[cfg(test)]
    pub(crate) fn set_test_link(&self, link: Arc<dyn TestLink>) {
        assert!(
            self.test_link.set(link).is_ok(),
            "the test link is set once"
        );
    }

    /// Plants `bug` in these waiters (unit tests).
    #[cfg(test)]
    pub(crate) fn plant(&self, bug: PlantedBug) {
        assert!(self.planted.set(bug).is_ok(), "one planted bug at a time");
    }

    /// Whether `bug` is planted in these waiters (unit tests only).
    #[cfg(test)]
    fn planted(&self, bug: PlantedBug) -> bool {
        self.planted.get() == Some(&bug)
    }

    /// Follows every message on `channel` (an election's), subscribing first if this client
    /// is not yet. Registered before the subscription, so no message after it is missed. The
    /// returned entry stops following when dropped.
    pub(crate) async fn observe(self: &Arc<Self>, channel: &[u8]) -> Result<ObserveEntry, Error> {
        let slot = Arc::<Slot>::default();
        self.channels
            .lock()
            .entry(channel.to_vec())
            .or_default()
            .followers
            .push(slot.clone());
        // From here on the entry owns the registration, so an error or a cancellation below
        // still removes it.
        let entry = ObserveEntry {
            waiters: self.clone(),
            channel: channel.to_vec(),
            slot,
        };
        self.subscribe(channel, false).await?;
        Ok(entry)
    }

    /// Wakes with `signal` the followers of `channel` (of every channel for `None`) and, with
    /// `heads`, the head of its queue.
    fn wake(&self, channel: Option<&[u8]>, signal: u8, heads: bool) {
        let channels = self.channels.lock();
        let wake = |c: &Channel| {
            let head = c.queue.front().filter(|_| heads);
            c.followers.iter().chain(head).for_each(|s| s.wake(signal));
        };
        match channel {
            Some(channel) => channels.get(channel).into_iter().for_each(wake),
            None => channels.values().for_each(wake),
        }
    }

    /// Subscribes to `channel` again in the background, whatever the record says, and then
    /// sends the head to Redis and wakes the followers (a release may have been missed
    /// meanwhile). A SUBSCRIBE that fails on a lost connection is sent again (at once, then
    /// with the crate's re-send backoff) for as long as someone of this client needs the
    /// channel: given up, it would leave the waiters to their lease timers for every release
    /// until a newcomer subscribed.
    fn subscribe_again(self: &Arc<Self>, channel: Vec<u8>) {
        self.spawn(|waiters| async move {
            let (waiters, channel) = (&waiters, &channel);
            let attempt = || waiters.subscribe(channel, true);
            let pauses = retry::resend_pauses(waiters.random());
            let again = |err: &Error| {
                let transient = subscribing_again_may_succeed(err);
                tracing::debug!(error = %err, transient, "subscribing again failed");
                transient
            };
            // Given up on a failure that is not transient, the next waiter to enter subscribes
            // again; until then the head's lease timer stands in for the lost messages.
            if let Ok(false) = retry::retry(pauses, attempt, again).await {
                return;
            }
            waiters.wake(Some(channel), SIGNAL_RECONNECTED, true);
        });
    }

    /// A release of `channel`'s lock is about to be sent: takes the offer of this client's first
    /// waiter, if it sits in its wait and accepts handoffs (`engine::handoff`).
    pub(crate) fn offer_to_head(&self, channel: &[u8]) -> Option<HandoffOffer> {
        let head = self.channels.lock().get(channel)?.queue.front()?.clone();
        let (holder, lease, label, permits) = head.offer.take()?;
        Some(HandoffOffer {
            slot: head,
            holder,
            lease,
            label,
            permits,
            outcome: Settled::Unknown,
        })
    }

    /// The client's last waiter for a fair lock gave up: take the client off the lock's
    /// queue and pass on a reservation made for it, in the background. Best effort: if it
    /// fails, the entry or reservation costs the others one grace.
    fn leave_fair_queue(self: &Arc<Self>, fair: FairExit) {
        self.spawn(|waiters| async move {
            // A waiter that joined since then keeps the entry (and would claim a reservation).
            // Checked right before the send: its own attempts go out on the same connection
            // after this script, so they queue the client again after the removal.
            if waiters.has_waiters(&fair.keys.lock) {
                return;
            }
            #[cfg(test)]
            if let Some(link) = waiters.test_link.get() {
                return link.leave_fair(&fair).await;
            }
            let Some(connections) = waiters.conn.get() else {
                return;
            };
            let mut conn = connections.commands.clone();
            let pubsub = conn.pubsub();
            let (keys, client) = (&fair.keys, &fair.client);
            let reply = protocol::leave_fair(&mut conn, keys, client, fair.grace, pubsub).await;
            tracing::debug!(?reply, "left the fair-handoff queue");
        });
    }

    fn unsubscribe_later(self: &Arc<Self>, channel: Vec<u8>) {
        self.spawn(|waiters| async move {
            let mut subscribed = waiters.subscribed.lock().await;
            // Decided under the subscription lock, so a waiter or follower that arrived
            // meanwhile (and saw the channel still subscribed) keeps its subscription; a channel
            // no longer subscribed is left alone.
            if waiters.wants_messages(&channel) || !subscribed.remove(&channel) {
                return;
            }
            // Still under the subscription lock: a SUBSCRIBE for the same channel cannot
            // overtake this UNSUBSCRIBE on the wire. A failure only leaves an idle
            // subscription behind, whose messages find no queue.
            #[cfg(test)]
            if let Some(link) = waiters.test_link.get() {
                if let Err(err) = link.unsubscribe(&channel).await {
                    tracing::debug!(error = %err, "unsubscribe failed");
                }
                return;
            }
            let Ok(mut conn) = waiters.subscriptions() else {
                return;
            };
            if let Err(err) = conn.unsubscribe(&channel).await {
                tracing::debug!(error = %err, "unsubscribe failed");
            }
        });
    }
}

/// What the client's connection is told without asking, routed to the queues.
impl PushListener for Waiters {
    /// A message on `channel`: followers look again; unless it only says a leader was elected
    /// (the lock is taken), the head of the queue goes to Redis.
    fn on_message(&self, channel: &[u8], payload: &[u8]) {
        let heads = ReleaseMessage::parse(payload) != ReleaseMessage::Elected;
        self.wake(Some(channel), SIGNAL_RELEASED, heads);
    }

    /// The connection dropped: messages may have been lost, so every head asks Redis again,
    /// and every follower looks again.
    fn on_disconnect(&self) {
        self.wake(None, SIGNAL_RECONNECTED, true);
    }

    /// The server dropped our subscription to `channel` by itself: on a cluster, the channel's
    /// slot moved to another node (resharding, failover). If anyone still waits there, subscribe
    /// again (redis-rs routes it to the slot's new owner) and only then send the head to Redis,
    /// so a release between the move and the new subscription is not missed. The confirmation
    /// of our own unsubscribe arrives here too; it finds no waiters and does nothing.
    fn on_subscription_lost(self: Arc<Self>, channel: &[u8]) {
        if self.wants_messages(channel) {
            self.subscribe_again(channel.to_vec());
        }
    }

    /// Subscribes again to every channel with waiters, on a connection that replaced the old
    /// one (a Sentinel failover) and so has no subscriptions yet; then every head asks Redis.
    fn on_new_primary(self: Arc<Self>) {
        // Spawned: the request that noticed the failover may be dropped by its caller, but the
        // waiters of every lock still need their channels on the new connection.
        self.spawn(|waiters| async move {
            let subscribed = waiters.subscribed.lock().await;
            for channel in subscribed.iter() {
                if let Err(err) = waiters.send_subscribe(channel).await {
                    // The head's lease timer stands in for the messages of this channel.
                    tracing::debug!(error = %err, "re-subscribing after a failover failed");
                }
            }
            drop(subscribed);
            waiters.on_disconnect();
        });
    }
}

/// Whether a SUBSCRIBE that failed with `err` is sent again (in the background, with the
/// crate's re-send backoff) rather than left to the head's lease timer: it may not have run for
/// a reason that passes. A lost connection, as for every request; and a redirect (`MOVED` or
/// `ASK` after the cluster client's own re-sends), which ends an operation's retries but not a
/// subscription's: while a slot move completes, its two nodes can each name the other as the
/// owner (a node that has handed the slot over drops its shard subscribers, and the waiters
/// subscribe again at once), and the cluster client rebuilds its slot map after each `MOVED`.
fn subscribing_again_may_succeed(err: &Error) -> bool {
    err.class()
        .is_some_and(|failure| failure.is_transient() || failure == ErrorClass::Redirected)
}

/// One follower of an election's channel. Dropping it stops following (and unsubscribes when
/// nobody of this client needs the channel any more).
pub(crate) struct ObserveEntry {
    waiters: Arc<Waiters>,
    channel: Vec<u8>,
    slot: Arc<Slot>,
}

impl ObserveEntry {
    /// Waits for the next message on the channel, a reconnect or a moved subscription (any of
    /// which since the last call), or until `until`.
    ///
    /// # Cancel safety
    /// Cancel safe: a wake-up that arrives while the future is dropped stays in the slot for
    /// the next call.
    pub(crate) async fn next_event(&self, until: Instant) {
        while self.slot.signal.swap(SIGNAL_NONE, Ordering::AcqRel) == SIGNAL_NONE {
            if self.slot.sleep(Some(until)).await {
                return;
            }
        }
    }
}

impl Drop for ObserveEntry {
    fn drop(&mut self) {
        let mut channels = self.waiters.channels.lock();
        let Some(following) = channels.get_mut(&self.channel) else {
            return;
        };
        following.followers.retain(|s| !Arc::ptr_eq(s, &self.slot));
        // A channel with waiters stays (its last waiter unsubscribes).
        if following.followers.is_empty() && following.queue.is_empty() {
            channels.remove(&self.channel);
            drop(channels);
            self.waiters.unsubscribe_later(self.channel.clone());
        }
    }
}

mod entry;

pub(crate) use entry::{HandoffOffer, WaitEntry};

#[cfg(test)]
mod tests;
