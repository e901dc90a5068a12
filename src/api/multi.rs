//! Several named locks taken as one (multi-lock): all or nothing, in one global order.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::client::LockClient;
use super::guard::LockGuard;
use super::handle::{roll_back, until, Ask, Options, Request};
use super::lock::{acquire_call, Lock};
use crate::base::error::Error;
use crate::base::replica_ack::{Acks, OnShortfall};
use crate::base::retry::waiting_window;
use crate::base::token::FencingToken;
use crate::engine::pending::Sends;
use crate::engine::wait::Wake;
use crate::protocol::{self, AcquireAllReply, AcquireReply, LockKeys};

/// Most locks one [`MultiLock`] may take at once. A set this large is already one script
/// call with 3 keys per lock; larger sets are more likely a bug than a need.
pub const MAX_MULTI_LOCKS: usize = 64;

/// Several named locks acquired as one, made by [`LockClient::multi_lock`]: the account
/// transfer that needs both accounts.
///
/// The members are kept in one global order, the byte order of their Redis keys, which every
/// client with the same prefix computes the same way. An acquisition takes every member or
/// none: on a standalone server in one script (`acquire_all.lua`), so no partial set ever
/// exists; when the members cannot be reached by one script (a cluster, members on different
/// nodes) one member after the other in that order, rolling the taken ones back as soon as one
/// is busy. Either way nothing is held while waiting, and two transfers in opposite directions
/// cannot deadlock.
///
/// Each member is an ordinary lock with its own holder id and fencing token (write each
/// resource with the token of the lock that guards it), renewed by the watchdog like any
/// other; waiting uses the same release notifications as [`Lock::acquire`].
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let both = client.multi_lock(["account:7", "account:3"])?;
/// let guard = both.acquire_timeout(std::time::Duration::from_secs(2)).await?;
/// let from = client.resource("balance:7")?;
/// let to = client.resource("balance:3")?;
/// from.incr_by(guard.token("account:7").unwrap(), -100).await?;
/// to.incr_by(guard.token("account:3").unwrap(), 100).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    client: LockClient,
    /// Sorted by lock key: the global acquisition order. Every member carries the set's
    /// options (lease, label, replica acknowledgement), so each member's guard is a lock's.
    members: Arc<[Lock]>,
    /// Take members one by one even where one script could take them all (tests of the
    /// cluster path on a standalone server).
    force_ordered: bool,
}

debug_struct!(MultiLock(self) {
    names: self.names().map(String::from_utf8_lossy).collect::<Vec<_>>(),
    lease: self.options().lease,
    label: self.options().label,
} ..);

/// A set's names (its members', in the global order), joined with ", ", as an error about the
/// set names what it was about.
fn joined<'a>(names: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    names.collect::<Vec<_>>().join(&b", "[..])
}

/// Every member's token, and the acknowledgement of their replicas when the set asks for it.
type Taken = (Vec<FencingToken>, Option<Acks>);

/// How a set is acquired and released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// One `acquire_all.lua` / `release_all.lua` call reaches every member's keys: any
    /// standalone server (keys in different hash slots are fine there).
    OneScript,
    /// One `acquire.lua` per member in the global order, rolling back the taken members when
    /// one is busy. Needed where one script cannot reach every key: Redis Cluster, where each
    /// member's keys live in their own slot.
    Ordered,
}

/// One try at the set: won, with the set's guard (or, for one plan's try, every member's token
/// and the acknowledgement of their replicas), or busy with nothing held.
enum Attempt<W = MultiGuard> {
    Won(W),
    /// Member `index` (in the global order) was busy; its lease ends after `pttl`.
    Busy {
        index: usize,
        pttl: Option<Duration>,
    },
}

impl MultiLock {
    getters! {
        /// The names of the members, in the order they are acquired.
        fn names(&self) -> impl Iterator<Item = &[u8]> => self.members.iter().map(Lock::name);

        /// The lease every member gets: its own, or the client's default.
        fn lease(&self) -> Duration => self.members[0].lease();
    }

    /// A handle to the same set whose acquisitions get `lease` instead of the client's default
    /// (and are then not renewed by the watchdog), as [`Lock::with_lease`].
    ///
    /// # Errors
    /// [`Error::InvalidLease`], as [`Lock::with_lease`].
    pub fn with_lease(&self, lease: Duration) -> Result<MultiLock, Error> {
        Ok(self.with(self.options().with_lease(lease)?))
    }

    /// A handle to the same set whose acquisitions carry `label` on every member's hold, as
    /// [`Lock::with_label`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`], as [`Lock::with_label`].
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<MultiLock, Error> {
        Ok(self.with(self.options().with_label(label.as_ref())?))
    }

    /// A handle to the same set whose acquisitions return only after `replicas` replicas
    /// confirmed every member, as [`Lock::with_replica_ack`]. On a shortfall the whole set is
    /// rolled back ([`Error::ReplicationTimeout`]) or, after [`MultiLock::on_replica_shortfall`],
    /// returned unreplicated.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`], as [`Lock::with_replica_ack`].
    pub fn with_replica_ack(&self, replicas: u32, timeout: Duration) -> Result<MultiLock, Error> {
        Ok(self.with(self.options().with_replica_ack(replicas, timeout)?))
    }

    /// A handle to the same set with another [`OnShortfall`] policy; no effect on a set that
    /// requires no replica acknowledgement.
    pub fn on_replica_shortfall(&self, policy: OnShortfall) -> MultiLock {
        self.with(self.options().on_replica_shortfall(policy))
    }

    /// The set's options: every member's.
    fn options(&self) -> &Options {
        &self.members[0].handle.options
    }

    /// The same set with `options` on every member.
    fn with(&self, options: Options) -> MultiLock {
        let members = self.members.iter().map(|m| m.with(options.clone()));
        MultiLock {
            members: members.collect(),
            ..self.clone()
        }
    }

    /// Test aid: acquire member by member in the global order with rollback, as a cluster
    /// must, even where one script could take the whole set.
    #[doc(hidden)]
    pub fn force_ordered_acquisition(&self) -> MultiLock {
        let mut set = self.clone();
        set.force_ordered = true;
        set
    }

    fn plan(&self) -> Plan {
        // Every key of a standalone server (or of Sentinel's primary) is reachable by one
        // script. On a cluster a script may touch one slot only, and the members' slots differ
        // in general, so the set is taken member by member there.
        if self.force_ordered || self.client.engine.conn.is_cluster() {
            Plan::Ordered
        } else {
            Plan::OneScript
        }
    }

    /// Takes every member if all are free, and returns at once either way: `Ok(None)` when any
    /// member is held by another holder, and then none of them is held by this call.
    ///
    /// # Errors
    /// [`Error::WrongType`] when a member's key holds foreign data (nothing taken),
    /// [`Error::ReplicationTimeout`] (see [`MultiLock::with_replica_ack`]), [`Error::Redis`]
    /// when Redis could not be reached within the retry window (whatever may have been taken
    /// is undone in the background).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped, every member whose acquisition may have run is
    /// undone in the background (`cancel.lua` per member), so no member is left held.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>, Error> {
        self.traced("try_acquire", || async {
            match self.attempt(self.client.engine.config.retry_window).await? {
                Attempt::Won(guard) => Ok(Some(guard)),
                Attempt::Busy { .. } => Ok(None),
            }
        })
        .await
    }

    /// Takes every member, waiting as long as it takes. While waiting nothing is held: the
    /// waiter queues on the first busy member (the same FIFO queues and release messages as
    /// [`Lock::acquire`]) and tries the whole set again when it is released. As there, a lost
    /// connection is retried for as long as it lasts once the call is waiting.
    ///
    /// # Errors
    /// As [`MultiLock::try_acquire`], except that [`Error::Redis`] for an unreachable Redis
    /// comes only from the first try, before the call starts waiting; never [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MultiLock::try_acquire`].
    pub async fn acquire(&self) -> Result<MultiGuard, Error> {
        self.acquire_within("acquire", None).await
    }

    /// Takes every member, waiting at most `timeout`: [`Error::Timeout`] when some member was
    /// still held then. Returns at the deadline at the latest; an attempt in flight then is
    /// undone in the background. Once waiting, a lost connection is retried until the deadline.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`MultiLock::acquire`]: [`Error::Redis`] for an unreachable
    /// Redis only from the first try, before the call starts waiting.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MultiLock::try_acquire`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard, Error> {
        self.acquire_within("acquire_timeout", Some(timeout)).await
    }

    /// Takes every member, waiting at most `timeout` (`None`: as long as it takes); reported
    /// as the acquire call `method`.
    async fn acquire_within(
        &self,
        method: &'static str,
        timeout: Option<Duration>,
    ) -> Result<MultiGuard, Error> {
        let started = Instant::now();
        // A timeout past what `Instant` can hold (`Duration::MAX`: "wait forever") is none.
        let deadline = timeout.and_then(|timeout| started.checked_add(timeout));
        let names = joined(self.names());
        let waiting = || self.wait_for_all(deadline, started);
        self.traced(method, || until(deadline, &names, started, waiting))
            .await
    }

    /// Runs one acquire call (`acquisition`, passed as a closure so that its future is not
    /// kept twice) in its `fencelock.multi_acquire` span, reported as the call `method`.
    async fn traced<T, F>(
        &self,
        method: &'static str,
        acquisition: impl FnOnce() -> F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, Error>>,
    {
        let span = tracing::debug_span!(
            "fencelock.multi_acquire",
            locks = self.members.len(),
            method,
            label = self.options().label.as_deref()
        );
        let outcome = acquisition().instrument(span.clone()).await;
        let outcome = outcome.map_err(|err| err.named(&joined(self.names())));
        if let Some(err) = outcome.as_ref().err().filter(|err| !err.is_timeout()) {
            let _entered = span.enter();
            tracing::warn!(error = %err, "multi-lock acquire failed");
        }
        outcome
    }

    /// A fast attempt at the whole set, then waiting in the queue of its first busy member and
    /// trying again on each wake-up until an attempt wins or `deadline` passes.
    async fn wait_for_all(
        &self,
        deadline: Option<Instant>,
        started: Instant,
    ) -> Result<MultiGuard, Error> {
        let waiters = &self.client.engine.waiters;
        let timeout = || Error::timeout(&joined(self.names()), started);
        // Fast path unless local waiters queue for a member: then queue behind them.
        let queued = self
            .members
            .iter()
            .position(|m| waiters.has_waiters(&m.keys().lock));
        let (mut index, mut pttl) = match queued {
            Some(index) => (index, None),
            None => match self.attempt(self.client.engine.config.retry_window).await? {
                Attempt::Won(guard) => return Ok(guard),
                Attempt::Busy { index, pttl } => (index, pttl),
            },
        };
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timeout());
            }
            let entry = waiters
                .enter(&self.members[index].keys().lock, None)
                .await?;
            if pttl.is_some() {
                entry.observed_lease(pttl);
            }
            (index, pttl) = loop {
                if entry.wait(deadline).await == Wake::Deadline {
                    return Err(timeout());
                }
                let window = waiting_window(self.client.engine.config.retry_window, deadline);
                let outcome = self.attempt(window).await?;
                entry.answered();
                let (busy, pttl) = match outcome {
                    Attempt::Won(guard) => {
                        entry.acquired(self.lease());
                        return Ok(guard);
                    }
                    Attempt::Busy { index, pttl } => (index, pttl),
                };
                if busy != index {
                    // This member may be free now: the next local waiter for it should not
                    // sleep until its timer because we move to another queue.
                    entry.hand_on();
                    break (busy, pttl);
                }
                entry.observed_lease(pttl);
            };
        }
    }

    /// One try at the whole set, each request re-sent within `window` while its outcome is
    /// unknown. Every member's acquisition is a lock's request: a fresh holder id (a
    /// rolled-back member's op record is marked cancelled, so its holder id cannot be used
    /// again) and the undo of the acquisition.
    async fn attempt(&self, window: Duration) -> Result<Attempt, Error> {
        let requests = self
            .members
            .iter()
            .map(|m| Request::new(&m.handle, Ask::Lock));
        let mut members: Vec<Request<'_>> = requests.collect();
        let sent_at = Instant::now();
        let won = match self.plan() {
            Plan::OneScript => self.in_one_script(&mut members, window).await?,
            Plan::Ordered => self.in_order(&mut members, window).await?,
        };
        let (tokens, acks) = match won {
            Attempt::Won(won) => won,
            Attempt::Busy { index, pttl } => return Ok(Attempt::Busy { index, pttl }),
        };
        if let Some(shortfall) = self.options().shortfall(&joined(self.names()), acks) {
            // Still armed: a failed or cancelled rollback is finished by the drop guards.
            roll_back(&mut members).await?;
            return Err(shortfall);
        }
        members
            .iter_mut()
            .for_each(|member| member.pending.disarm());
        let guards = members.iter().zip(tokens);
        let guards = guards.map(|(member, token)| member.won(token, (sent_at, None), acks, (1, 1)));
        Ok(Attempt::Won(MultiGuard {
            guards: guards.map(|permit| permit.guard).collect(),
            plan: self.plan(),
        }))
    }

    /// One try at the set in one script (`acquire_all.lua`).
    async fn in_one_script(
        &self,
        members: &mut [Request<'_>],
        window: Duration,
    ) -> Result<Attempt<Taken>, Error> {
        let engine = &self.client.engine;
        let (lease, op_ttl) = (self.lease(), engine.config.op_record_ttl);
        let label = self.options().label.as_deref();
        members.iter_mut().for_each(|member| member.pending.arm());
        let all: Vec<(&LockKeys, &str)> = members
            .iter()
            .map(|m| (&*m.handle.keys, m.holder.as_str()))
            .collect();
        let sends: Vec<&Sends> = members.iter().map(|m| m.pending.sends()).collect();
        // A closure is not generic over the connection type, so one per connection kind.
        macro_rules! call {
            () => {
                |mut conn| {
                    let all = &all;
                    // Counted for each member: once a send's outcome was unknown, a "busy"
                    // answer to a later one leaves them armed (`PendingOp::busy`).
                    sends.iter().for_each(|sends| {
                        sends.send(&conn);
                    });
                    async move { protocol::acquire_all(&mut conn, all, lease, op_ttl, label).await }
                }
            };
        }
        let (reply, acks) = match self.options().replica_ack {
            None => (engine.retrying_within(window, call!()).await?, None),
            Some(ack) => {
                // One script reaches every member here (not a cluster), so any member's keys
                // route it; a set has at least one member.
                let acquired = |reply: &_| matches!(reply, AcquireAllReply::Acquired { .. });
                let first = self.members[0].keys();
                engine
                    .acquire_acknowledged(ack, first, window, call!(), acquired)
                    .await?
            }
        };
        drop(sends);
        match reply {
            AcquireAllReply::Acquired { tokens } => Ok(Attempt::Won((tokens, acks))),
            // Armed still if a send's outcome was unknown: that copy may take every member
            // once the busy one is free, after the caller gave up; the drop's undo marks them
            // cancelled, which the copy finds.
            AcquireAllReply::Held { index, pttl } => {
                members.iter_mut().for_each(|member| member.pending.busy());
                Ok(Attempt::Busy { index, pttl })
            }
            // Armed still: a copy of this attempt may have taken every member before one of
            // them was cancelled or ended (freed by an operator, evicted), and the script
            // answers that without touching the members still held; the pending operations'
            // drop undoes them (`cancel.lua` frees only what this holder id holds).
            AcquireAllReply::Cancelled => Err(Error::Cancelled),
        }
    }

    /// One try at the set member by member in the global order, rolling back the members
    /// taken when one is busy.
    async fn in_order(
        &self,
        members: &mut [Request<'_>],
        window: Duration,
    ) -> Result<Attempt<Taken>, Error> {
        let (engine, ack) = (&self.client.engine, self.options().replica_ack);
        let mut tokens = Vec::with_capacity(members.len());
        // With replica acknowledgement, one session for the whole set: each member's script
        // runs on the session's connection to its slot's primary, and once every member is
        // taken, one WAIT per node covers all the members written there.
        let mut session = match ack {
            Some(_) => Some(engine.acks.session().await?),
            None => None,
        };
        for index in 0..members.len() {
            // Members taken so far stay armed: an error or a drop here undoes them.
            members[index].pending.arm();
            // Every member carries the set's options; no fair handoff on a multi-lock's client.
            let (member, keys) = (&members[index], &members[index].handle.keys);
            let outcome = match &mut session {
                None => {
                    let call = acquire_call!(member, None);
                    engine.retrying_within(window, call).await
                }
                Some(session) => {
                    let acquired = |reply: &_| matches!(reply, AcquireReply::Acquired { .. });
                    let call = acquire_call!(member, None);
                    session.run(keys, window, call, acquired).await
                }
            };
            let reply = match outcome {
                Ok(reply) => reply,
                Err(err) => {
                    // Undo the members taken so far (and this one, should it have run) before
                    // the caller sees the error; if that fails too, the drop guards finish it.
                    roll_back(&mut members[..=index]).await?;
                    return Err(err);
                }
            };
            match reply {
                AcquireReply::Acquired { token, .. } => tokens.push(token),
                AcquireReply::Held { pttl } => {
                    members[index].pending.busy();
                    roll_back(&mut members[..index]).await?;
                    if let Some(session) = session {
                        session.finish();
                    }
                    return Ok(Attempt::Busy { index, pttl });
                }
                AcquireReply::Cancelled => return Err(Error::Cancelled),
            }
        }
        let acks = match (session, ack) {
            (Some(mut session), Some(ack)) => {
                // A refused WAIT leaves every member armed: their drops undo the set.
                let acks = session.wait(ack).await?.unwrap_or(Acks {
                    acked: 0,
                    required: ack.replicas,
                });
                session.finish();
                Some(acks)
            }
            _ => None,
        };
        Ok(Attempt::Won((tokens, acks)))
    }
}

/// Proof of holding every lock of a [`MultiLock`], with one fencing token per lock.
///
/// Holds one [`LockGuard`] per member, in the global order; each is an ordinary guard (its own
/// holder id, token and lease, renewed by the watchdog when the set has no lease of its own).
/// [`MultiGuard::release`] releases the whole set in one script; dropping the guard releases
/// every member in the background.
#[must_use = "a guard releases its locks when dropped; bind it for as long as the critical section lasts"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
    plan: Plan,
}

debug_struct!(MultiGuard(self) { guards: self.guards } ..);

impl MultiGuard {
    /// The fencing token of the member called `name`, or `None` if the set has no such
    /// member.
    pub fn token(&self, name: impl AsRef<[u8]>) -> Option<FencingToken> {
        self.guard(name).map(LockGuard::token)
    }

    getters! {
        /// `(name, token)` of every member, in the global order.
        fn tokens(&self) -> impl Iterator<Item = (&[u8], FencingToken)>
            => self.guards.iter().map(|g| (g.lock_name(), g.token()));

        /// Every member's guard, in the global order.
        fn guards(&self) -> &[LockGuard] => &self.guards;

        /// Whether every member is still held as far as this process knows; see
        /// [`LockGuard::is_valid`].
        fn is_valid(&self) -> bool => self.guards.iter().all(LockGuard::is_valid);

        /// Whether the acquisition reached the replicas it required, for every member; see
        /// [`LockGuard::replicated`].
        fn replicated(&self) -> bool => self.guards.iter().all(LockGuard::replicated);
    }

    /// The guard of the member called `name` (to re-enter or extend that one lock).
    pub fn guard(&self, name: impl AsRef<[u8]>) -> Option<&LockGuard> {
        let name = name.as_ref();
        self.guards.iter().find(|g| g.lock_name() == name)
    }

    /// Takes the set apart into its members' guards (to release them one by one).
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// When the first member's lease ends by this process' clock.
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .expect("a multi-guard has at least one member")
    }

    /// Resolves as soon as any member is lost (see [`LockGuard::lost`]): the set is only worth
    /// holding whole.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits and changes nothing, as [`LockGuard::lost`].
    pub async fn lost(&self) {
        let mut members: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        std::future::poll_fn(|cx| {
            // The first member found lost ends the wait; the rest are not polled again.
            match members.iter_mut().any(|m| m.as_mut().poll(cx).is_ready()) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await;
    }

    /// Releases every member once (one script on a standalone server); the members become
    /// free unless re-entered guards of theirs are still alive.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when some member was no longer held by its holder (the others were
    /// released all the same); [`Error::Redis`] when Redis could not be reached within the
    /// retry window (each member's release then goes on in the background with the same
    /// operation id).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release is finished in the background per member, as the same
    /// operations.
    pub async fn release(self) -> Result<(), Error> {
        let MultiGuard { mut guards, plan } = self;
        if plan == Plan::Ordered {
            // Where one script cannot reach every member: one release per member. A member
            // left unreleased by a cancelled future is released by its guard's drop.
            let mut released = Ok(());
            for guard in guards {
                released = released.and(guard.release().await);
            }
            return released;
        }
        let parts: Vec<_> = guards.iter_mut().map(LockGuard::begin_release).collect();
        let members: Vec<(&LockKeys, &str, &str)> = parts
            .iter()
            .map(|(holder, op, _)| (&*holder.keys, holder.id.as_str(), op.as_str()))
            .collect();
        let engine = &parts[0].0.engine;
        let ttl = engine.config.op_record_ttl;
        // On an error the guards drop here and finish their releases in the background with
        // the same op ids, which the script's op records make replays.
        let replies = engine
            .retrying(|mut conn| {
                let members = &members;
                async move { protocol::release_all(&mut conn, members, ttl).await }
            })
            .await
            .map_err(|err| err.named(&joined(guards.iter().map(LockGuard::lock_name))))?;
        let members = guards.into_iter().zip(replies);
        // Every member's release runs; the first error is the set's.
        let released = members.map(|(guard, reply)| guard.finish_release("set", Ok(reply)));
        released.fold(Ok(()), Result::and)
    }
}

impl LockClient {
    /// Several locks to be taken as one, all or nothing: see [`MultiLock`](crate::MultiLock).
    /// The members are put in one global order (their keys' byte order), whatever order the
    /// names come in, so sets acquired by different tasks in different orders cannot deadlock.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name; [`Error::InvalidLockSet`] for no
    /// names, more than [`MAX_MULTI_LOCKS`](crate::MAX_MULTI_LOCKS), or one name given twice,
    /// and on a client with [`fair_handoff`](crate::LockClientBuilder::fair_handoff) (single-lock
    /// only). Nothing is sent to Redis.
    pub fn multi_lock<I, N>(&self, names: I) -> Result<MultiLock, Error>
    where
        I: IntoIterator<Item = N>,
        N: AsRef<[u8]>,
    {
        let invalid = |reason: String| Err(Error::InvalidLockSet { reason });
        if self.fair_handoff().is_some() {
            // release_all.lua and acquire_all.lua know nothing of the fair queue: a set
            // released there would free its members past the waiting clients.
            return invalid(
                "multi-locks are not available on a client with fair_handoff \
                 (fair handoff is single-lock only)"
                    .into(),
            );
        }
        let mut members = Vec::new();
        for name in names {
            if members.len() == MAX_MULTI_LOCKS {
                return invalid(format!(
                    "a multi-lock takes at most {MAX_MULTI_LOCKS} locks"
                ));
            }
            members.push(self.lock(name)?);
        }
        if members.is_empty() {
            return invalid("a multi-lock needs at least one lock name".into());
        }
        members.sort_by(|a, b| a.keys().lock.cmp(&b.keys().lock));
        let twice = members
            .windows(2)
            .find(|pair| pair[0].keys().lock == pair[1].keys().lock);
        if let Some(pair) = twice {
            let name = String::from_utf8_lossy(pair[0].name());
            return invalid(format!("the lock {name:?} is named twice"));
        }
        Ok(MultiLock {
            client: self.clone(),
            members: members.into(),
            force_ordered: false,
        })
    }
}
