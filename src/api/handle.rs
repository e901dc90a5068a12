//! What the handles of every kind of hold share: a lock's, a semaphore's, a read-write lock's
//! (and through a lock, an election's and a multi-lock's members). As `tokio::sync`'s mutex,
//! semaphore and read-write lock over one private semaphore: a public handle is a [`Handle`]
//! (name, keys, [`Options`]) and what it asks for ([`Ask`]), and every hold is won as a
//! [`SemaphorePermit`] (a lock's and a read-write lock's as one permit of one). One
//! [`Request`] is every acquisition's attempts on the acquire loop (`engine::acquisition`),
//! each settled by one round trip whatever the kind (and a multi-lock's members are lock
//! requests), and one entry point ([`Handle::try_acquire`], [`Handle::acquire`]) runs and
//! reports every acquire call. The handles keep their public methods and what their kind
//! alone does: a lock's script call (`lock.rs`: fair handoff, replica acknowledgement) and
//! what their guards add.

use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{Instrument, Span};

use super::client::LockClient;
use super::guard::LockGuard;
use super::lock::Lock;
use super::rwlock::RwLock;
use super::semaphore::SemaphorePermit;
use crate::base::config::checked_label;
use crate::base::durations::validate_lease;
use crate::base::error::{display_bytes, Error};
use crate::base::metrics;
use crate::base::replica_ack::{Acks, OnShortfall, ReplicaAck};
use crate::base::token::FencingToken;
use crate::engine::acquisition::{acquire_loop, timed_out, Attempt, Attempts, Waiting};
use crate::engine::handoff::{self, Grant, HandoffTerms};
use crate::engine::hold::{HoldKind, PLAIN_LOCK, RW_LOCK, SEMAPHORE};
use crate::engine::holder::Holder;
use crate::engine::pending::PendingOp;
use crate::engine::wait::FairExit;
use crate::engine::wait_record::WaitReport;
use crate::engine::{Engine, PermissionScope};
use crate::protocol::keys::validate_name;
use crate::protocol::rwlock::{RwAcquireReply, RwMode};
use crate::protocol::semaphore::{HoldAcquire, SemAcquireReply};
use crate::protocol::{CancelKind, LockKeys};

/// One acquire call's event `$name`: WARN with the error (and `$failure`) when it failed (a
/// timeout is no failure), DEBUG with `$message` otherwise; `$fields` in both.
macro_rules! acquire_event {
    ($failed:expr, $name:literal, $failure:literal, $message:expr, $($fields:tt)*) => {
        match $failed {
            Some(err) => tracing::warn!(name: $name, $($fields)*, error = %err, $failure),
            None => tracing::debug!(name: $name, $($fields)*, "{}", $message),
        }
    };
}

/// What a handle's acquisitions carry besides what they ask for. The handles' `with_*` methods
/// return a handle with other options; nothing changes for the handle they were called on.
#[derive(Clone, Default)]
pub(crate) struct Options {
    /// The lease of each hold; `None`: the client's default, renewed by the watchdog.
    pub(crate) lease: Option<Duration>,
    /// Stored with each hold (`~label` in a lock's hash, in a hold's own field).
    pub(crate) label: Option<Arc<str>>,
    /// The replicas a lock's acquisition waits for (never set for the other kinds).
    pub(crate) replica_ack: Option<ReplicaAck>,
}

impl Options {
    /// These options with `change` made to them.
    fn changed(&self, change: impl FnOnce(&mut Options)) -> Options {
        let mut options = self.clone();
        change(&mut options);
        options
    }

    pub(crate) fn with_lease(&self, lease: Duration) -> Result<Options, Error> {
        let lease = validate_lease(lease)?;
        Ok(self.changed(|options| options.lease = Some(lease)))
    }

    pub(crate) fn with_label(&self, label: &str) -> Result<Options, Error> {
        let label = checked_label(label)?;
        Ok(self.changed(|options| options.label = Some(label)))
    }

    /// Keeps the shortfall policy already chosen.
    pub(crate) fn with_replica_ack(
        &self,
        replicas: u32,
        timeout: Duration,
    ) -> Result<Options, Error> {
        let policy = self.replica_ack.map(|ack| ack.on_shortfall);
        let ack = ReplicaAck::new(replicas, timeout, policy.unwrap_or_default())?;
        Ok(self.changed(|options| options.replica_ack = Some(ack)))
    }

    pub(crate) fn without_replica_ack(&self) -> Options {
        self.changed(|options| options.replica_ack = None)
    }

    pub(crate) fn on_replica_shortfall(&self, policy: OnShortfall) -> Options {
        self.changed(|options| {
            if let Some(ack) = &mut options.replica_ack {
                ack.on_shortfall = policy;
            }
        })
    }

    /// The error of an acquisition of `name` whose replicas (`acks`) fell short under the policy that
    /// fails it (its caller rolls it back); `None`: the acquisition stands.
    pub(crate) fn shortfall(&self, name: &[u8], acks: Option<Acks>) -> Option<Error> {
        let (acks, ack) = (acks?, self.replica_ack?);
        (!acks.enough() && ack.on_shortfall == OnShortfall::Fail).then(|| {
            Error::ReplicationTimeout {
                name: display_bytes(name),
                acked: acks.acked,
                required: acks.required,
            }
        })
    }
}

/// A handle to one named hold: what every kind's handle is, besides what it asks for.
#[derive(Clone)]
pub(crate) struct Handle {
    pub(crate) client: LockClient,
    pub(crate) name: Arc<[u8]>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) options: Options,
}

impl Handle {
    /// A handle to the hold `name` under the keys `layout` gives it after the client's prefix.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub(crate) fn named(
        client: &LockClient,
        name: &[u8],
        layout: fn(&[u8], &[u8]) -> LockKeys,
    ) -> Result<Handle, Error> {
        validate_name(name)?;
        Ok(Handle {
            client: client.clone(),
            name: name.into(),
            keys: Arc::new(layout(&client.engine.config.prefix, name)),
            options: Options::default(),
        })
    }

    /// The same hold with other options.
    pub(crate) fn with(&self, options: Options) -> Handle {
        Handle {
            options,
            ..self.clone()
        }
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.client.engine
    }

    /// The handle's own lease, or the client's default.
    pub(crate) fn lease(&self) -> Duration {
        self.options
            .lease
            .unwrap_or(self.engine().config.default_lease)
    }

    pub(crate) fn label(&self) -> Option<&str> {
        self.options.label.as_deref()
    }

    /// The undo of `holder`'s acquisition of a hold of `kind`, disarmed. An acquisition's
    /// operation id is its holder id: holder ids are never reused, so the holder's presence
    /// in the hash is what makes a re-sent acquire a replay.
    pub(crate) fn pending(&self, kind: &'static HoldKind, holder: &str) -> PendingOp {
        let (engine, keys) = (self.engine(), &self.keys);
        PendingOp::of_kind(kind, engine, keys, holder, holder, CancelKind::Acquire)
    }

    /// Takes what `ask` asks for if it is free, and returns at once either way; reported as
    /// the acquire call `method`.
    ///
    /// Cancel safe: a dropped try's pending operation undoes it in the background.
    pub(crate) async fn try_acquire(
        &self,
        ask: Ask,
        method: &'static str,
    ) -> Result<Option<SemaphorePermit>, Error> {
        let contended = AtomicBool::new(false);
        self.traced(ask, method, &contended, || async {
            ask.check(&self.name)?;
            let window = self.engine().config.retry_window;
            match Request::new(self, ask).round_trip(false, window).await? {
                Attempt::Won { held, .. } => Ok(Some(held)),
                Attempt::Busy(_) => Ok(None),
            }
        })
        .await
    }

    /// Takes what `ask` asks for, waiting at most `timeout` (`None`: as long as it takes);
    /// reported as the acquire call `method`. The deadline bounds everything, also an attempt
    /// being retried because Redis does not answer: at the deadline the attempt is dropped,
    /// and its pending operation undoes it.
    ///
    /// Cancel safe: dropping the future leaves the queue and undoes an attempt in flight.
    pub(crate) async fn acquire(
        &self,
        ask: Ask,
        method: &'static str,
        timeout: Option<Duration>,
    ) -> Result<SemaphorePermit, Error> {
        // A timeout past what `Instant` can hold (`Duration::MAX`: "wait forever") is none.
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        let contended = AtomicBool::new(false);
        self.traced(ask, method, &contended, || {
            self.acquire_until(ask, deadline, &contended)
        })
        .await
    }

    /// The acquire loop with this handle's attempts, after the check of what `ask` asks for: a
    /// fast attempt, then waiting in this client's queue on the channel `ask` waits on until
    /// an attempt wins or `deadline` passes.
    async fn acquire_until(
        &self,
        ask: Ask,
        deadline: Option<Instant>,
        contended: &AtomicBool,
    ) -> Result<SemaphorePermit, Error> {
        ask.check(&self.name)?;
        let engine = self.engine();
        let channel = match ask {
            // Readers and writers of a read-write lock wait on channels of their own, so
            // neither blocks the other's local queue. Laid out for this kind: never `None`.
            Ask::Hold(Hold::Side(RwMode::Write)) => {
                Cow::Owned(self.keys.rw_writers().unwrap_or_default())
            }
            _ => Cow::Borrowed(&self.keys.lock),
        };
        // What a fair-mode client must undo in Redis when a lock's acquisition leaves without
        // the lock.
        let fair = self.client.fair_handoff().filter(|_| ask == Ask::Lock);
        let how = Waiting {
            name: &self.name,
            waiters: &engine.waiters,
            channel: &channel,
            fair: fair.map(|grace| FairExit {
                keys: self.keys.clone(),
                client: engine.id.clone(),
                grace,
            }),
            retry_window: engine.config.retry_window,
            // Nobody shares a lock: a won attempt holds the next local waiter for its lease.
            winner_lease: (ask == Ask::Lock).then(|| self.lease()),
            contended: Some(contended),
            report: engine.config.record_waits.then_some(WaitReport {
                engine,
                label: self.label(),
            }),
        };
        acquire_loop(how, deadline, Request::new(self, ask)).await
    }

    /// Runs one acquire call (`acquisition`) and reports its outcome as its kind reports them: a lock's inside a `fencelock.acquire`
    /// span (a child of the caller's span, so a request's trace follows it into the lock), by
    /// its `fencelock.acquire` event and the acquisition metrics; a semaphore's and a
    /// read-write lock's by their own event and metric.
    ///
    /// The acquisition is passed as a closure and its future made here: a future passed as an
    /// argument would be kept in this one's state next to the copy being awaited, doubling the
    /// size of every acquire future.
    async fn traced<T, F>(
        &self,
        ask: Ask,
        method: &'static str,
        contended: &AtomicBool,
        acquisition: impl FnOnce() -> F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, Error>>,
        // What an acquire call returns: a hold, or (a try) maybe one.
        for<'a> Option<&'a SemaphorePermit>: From<&'a T>,
    {
        let span = match ask {
            Ask::Lock => tracing::debug_span!("fencelock.acquire",
                lock = %String::from_utf8_lossy(&self.name), method, label = self.label()),
            Ask::Hold(_) => Span::none(),
        };
        let started = Instant::now();
        let acquisition = acquisition();
        // Without a subscriber for the span, the acquisition runs as it is: no instrumented
        // wrapper around the (large) acquisition future on the uncontended path.
        let outcome = if span.is_disabled() {
            acquisition.await
        } else {
            acquisition.instrument(span.clone()).await
        };
        let outcome = outcome.map_err(|err| err.named(&self.name));
        let won = outcome.as_ref().map(Option::<&SemaphorePermit>::from);
        let ended = match won {
            Ok(Some(_)) => metrics::ACQUIRED,
            Ok(None) => metrics::BUSY,
            Err(err) if err.is_timeout() => metrics::TIMEOUT,
            Err(_) => metrics::ERROR,
        };
        let said = |acquired, busy, timed_out| match ended {
            metrics::ACQUIRED => acquired,
            metrics::BUSY => busy,
            _ => timed_out,
        };
        let failed = won.err().filter(|err| !err.is_timeout());
        let won = won.ok().flatten();
        let (token, holder) = (won.map(|p| p.token().get()), won.map(|p| p.holder_id()));
        let (name, label) = (|| String::from_utf8_lossy(&self.name), self.label());
        // Fields are evaluated by the event macros only when a subscriber wants the event.
        match ask {
            Ask::Lock => {
                let waited_us = || u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                let contended = contended.load(Ordering::Relaxed);
                let _entered = span.enter();
                acquire_event!(
                    failed,
                    "fencelock.acquire",
                    "lock acquire failed",
                    said("lock acquired", "lock busy", "lock acquire timed out"),
                    outcome = ended,
                    token,
                    holder,
                    waited_us = waited_us(),
                    contended
                );
                metrics::acquisition(ended, started);
            }
            Ask::Hold(Hold::Permits { permits, .. }) => {
                acquire_event!(failed, "fencelock.semaphore", "permit acquire failed",
                    said("permits acquired", "too few permits free", "permit acquire timed out"),
                    semaphore = %name(), method, permits, outcome = ended, token, holder,
                    limit = won.map(SemaphorePermit::limit), label);
                metrics::semaphore(ended);
            }
            Ask::Hold(Hold::Side(side)) => {
                let mode = match side {
                    RwMode::Read => "read",
                    RwMode::Write => "write",
                };
                acquire_event!(failed, "fencelock.rwlock", "read-write lock acquire failed",
                    "read-write lock acquire ended",
                    lock = %name(), mode, method, outcome = ended, label);
                metrics::rwlock(mode, ended);
            }
        }
        outcome
    }
}

// A lock's and a read-write lock's handle show what they are: a handle (a semaphore's also
// shows its limit).
debug_struct!(Lock, RwLock (self) {
    name: String::from_utf8_lossy(self.name()),
    lease: self.lease(),
    label: self.label(),
} ..);

/// What an acquisition asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A plain lock: a lock's or an election's.
    Lock,
    /// A hold with a lease of its own.
    Hold(Hold),
}

/// What a hold with a lease of its own is: they are acquired by different scripts, and
/// released, extended, re-entered and undone by the semaphore's (`engine::hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// `permits` permits of a semaphore whose handle records `limit`.
    Permits { permits: u32, limit: u32 },
    /// One side of a read-write lock.
    Side(RwMode),
}

impl Ask {
    fn kind(self) -> &'static HoldKind {
        match self {
            Ask::Lock => &PLAIN_LOCK,
            Ask::Hold(Hold::Permits { .. }) => &SEMAPHORE,
            Ask::Hold(Hold::Side(_)) => &RW_LOCK,
        }
    }

    /// The permits asked for and the limit this handle knows: a semaphore's, one of one for
    /// the other kinds.
    fn room(self) -> (u32, u32) {
        match self {
            Ask::Hold(Hold::Permits { permits, limit }) => (permits, limit),
            _ => (1, 1),
        }
    }

    /// Refuses a semaphore's permits asked for beyond its limit, or none, before anything is
    /// sent (`name`: the semaphore's).
    fn check(self, name: &[u8]) -> Result<(), Error> {
        match self {
            Ask::Hold(Hold::Permits { permits, limit }) if permits == 0 || permits > limit => {
                Err(Error::InvalidPermits {
                    reason: format!(
                        "asked for {permits} permits of semaphore {:?}, which has {limit} in \
                         all (at least 1 must be asked for)",
                        String::from_utf8_lossy(name),
                    ),
                })
            }
            _ => Ok(()),
        }
    }
}

/// The attempts of one acquisition by `handle` of what `ask` asks for: one holder id, and
/// the undo of its acquisition while its outcome is unknown.
pub(crate) struct Request<'a> {
    pub(super) handle: &'a Handle,
    pub(super) ask: Ask,
    pub(super) holder: String,
    pub(super) pending: PendingOp,
}

impl<'a> Request<'a> {
    pub(super) fn new(handle: &'a Handle, ask: Ask) -> Request<'a> {
        let holder = handle.engine().next_id();
        let pending = handle.pending(ask.kind(), &holder);
        Request {
            handle,
            ask,
            holder,
            pending,
        }
    }

    /// One acquire round trip (re-sent while its outcome is unknown and `window` is open),
    /// with the pending operation armed while the outcome is unknown. `wait`: the attempt of a
    /// caller that will wait, which leaves a mark in Redis while busy for a hold (a
    /// fair-handoff client's semaphore queue entry; a writer's waiting mark, which stops new
    /// readers); that mark stays until the waiter wins or gives up, so the pending op stays
    /// armed after such a busy reply, and dropping it takes the mark back.
    async fn round_trip(
        &mut self,
        wait: bool,
        window: Duration,
    ) -> Result<Attempt<SemaphorePermit>, Error> {
        let (handle, engine) = (self.handle, self.handle.engine());
        let marked = wait
            && match self.ask {
                Ask::Lock => false,
                Ask::Hold(Hold::Permits { .. }) => engine.config.fair_grace.is_some(),
                Ask::Hold(Hold::Side(side)) => side == RwMode::Write,
            };
        if self.ask != Ask::Lock {
            // Once per client, before anything is written (a drop here leaves nothing).
            engine.check_permissions(PermissionScope::Holds).await?;
        }
        let sent_at = Instant::now();
        self.pending.arm();
        let (reply, acks) = match self.ask {
            Ask::Lock => self.lock_call(wait, window).await?,
            Ask::Hold(hold) => (self.hold_call(hold, wait, window).await?, None),
        };
        if let Some(shortfall) = handle.options.shortfall(&handle.name, acks) {
            // Still armed: if this rollback fails or is cancelled, the pending op's drop
            // undoes the acquisition in the background instead.
            roll_back(std::slice::from_mut(self)).await?;
            return Err(shortfall);
        }
        match reply {
            SemAcquireReply::Busy { .. } if marked => self.pending.answered(),
            SemAcquireReply::Busy { .. } => self.pending.busy(),
            _ => self.pending.disarm(),
        }
        match reply {
            SemAcquireReply::Acquired {
                token,
                permits,
                limit,
                free,
                lease_left,
            } => Ok(Attempt::Won {
                held: self.won(token, (sent_at, lease_left), acks, (permits, limit)),
                // Room is left: the next waiter of this client may get in too.
                hand_on: free > 0,
            }),
            SemAcquireReply::Busy { wait, .. } => Ok(Attempt::Busy(wait)),
            SemAcquireReply::Cancelled => Err(Error::Cancelled),
            SemAcquireReply::OverLimit { limit } => Err(Error::InvalidPermits {
                reason: format!(
                    "asked for {} permits of semaphore {:?}, whose limit in force is {limit} \
                     (recorded in Redis while it is in use)",
                    self.ask.room().0,
                    String::from_utf8_lossy(&handle.name)
                ),
            }),
        }
    }

    /// The permit of the hold this acquisition won with `token` (by its attempt, or from a
    /// release's grant), whose lease started no earlier than `sent_at`, or (`lease_left`: a
    /// replay, whose hold began before that send) has that much left at `sent_at` at most;
    /// watched (renewed) when the handle has no lease of its own.
    pub(super) fn won(
        &self,
        token: FencingToken,
        (sent_at, lease_left): (Instant, Option<Duration>),
        acks: Option<Acks>,
        (permits, limit): (u32, u32),
    ) -> SemaphorePermit {
        let (handle, engine) = (self.handle, self.handle.engine());
        let lease = lease_left.map_or(handle.lease(), |left| left.min(handle.lease()));
        let holder = Holder::of_kind(
            self.ask.kind(),
            engine.clone(),
            handle.keys.clone(),
            handle.name.clone(),
            self.holder.clone(),
            token,
            sent_at,
            lease,
            handle.options.lease.is_none(),
            acks,
            handle.options.label.clone(),
        );
        // The guard first: the watchdog drops from its list every holder no guard holds, so a
        // holder listed before its guard exists could be dropped by a renewal pass on another
        // thread in between, and its lease would never be renewed.
        let guard = LockGuard::new(holder.clone());
        engine.watchdog.watch(&holder);
        SemaphorePermit {
            guard,
            permits,
            limit,
        }
    }

    /// The acquire script call of a hold with a lease of its own, re-sent while its outcome
    /// is unknown and `window` is open. `wait`: the attempt of a caller that will wait.
    async fn hold_call(
        &self,
        hold: Hold,
        wait: bool,
        window: Duration,
    ) -> Result<SemAcquireReply, Error> {
        let (handle, holder) = (self.handle, self.holder.as_str());
        let engine = handle.engine();
        let (keys, lease, label) = (&handle.keys, handle.lease(), handle.label());
        let fair = engine.config.fair_grace.map(|_| wait);
        let sends = self.pending.sends();
        engine
            .retrying_within(window, |mut conn| {
                let acquire = HoldAcquire {
                    keys: Cow::Borrowed(keys),
                    holder: Cow::Borrowed(holder),
                    lease,
                    op_ttl: engine.config.op_record_ttl,
                    pubsub: conn.pubsub(),
                    field_expiry: engine.field_expiry,
                    label: label.map(Cow::Borrowed),
                    recorded: sends.send(&conn),
                };
                async move {
                    let (side, reply) = match hold {
                        Hold::Permits { permits, limit } => {
                            return acquire.sem_acquire(&mut conn, permits, limit, fair).await;
                        }
                        // Reads of one lock that meet in this client may share a call.
                        Hold::Side(RwMode::Read) => (
                            RwMode::Read,
                            engine.read_grouped(&mut conn, &acquire).await?,
                        ),
                        Hold::Side(side) => {
                            (side, acquire.rw_acquire(&mut conn, side, wait).await?)
                        }
                    };
                    Ok(in_semaphore_words(reply, side))
                }
            })
            .await
    }
}

/// A read-write lock's acquire reply in the semaphore's words (and so a lock's, a writer's
/// alike): a read leaves room for the next reader (readers do not exclude each other, so the
/// next waiting reader of this client tries at once), a write none.
pub(super) fn in_semaphore_words(reply: RwAcquireReply, side: RwMode) -> SemAcquireReply {
    match reply {
        RwAcquireReply::Acquired { token, lease_left } => SemAcquireReply::Acquired {
            token,
            lease_left,
            permits: 1,
            limit: 1,
            free: u32::from(side == RwMode::Read),
        },
        RwAcquireReply::Busy { wait } => SemAcquireReply::Busy {
            wait,
            free: 0,
            limit: 1,
        },
        RwAcquireReply::Cancelled => SemAcquireReply::Cancelled,
    }
}

/// Undoes the plain locks' acquisitions of `requests` (one whose replicas fell short, a
/// multi-lock's members): `cancel.lua` for each acquire op, which frees the lock and wakes
/// waiters, then disarms their undo. An error leaves them armed: their drops finish the
/// rollback.
pub(super) async fn roll_back(requests: &mut [Request<'_>]) -> Result<(), Error> {
    for request in &*requests {
        let (engine, holder) = (request.handle.engine(), request.holder.as_str());
        let (keys, ttl) = (&request.handle.keys, engine.config.op_record_ttl);
        let reply = engine
            .retrying(|conn| {
                PLAIN_LOCK.cancel(conn, keys, holder, holder, CancelKind::Acquire, ttl)
            })
            .await?;
        tracing::debug!(
            ?reply,
            holder,
            "rolled back an acquisition replicas did not confirm"
        );
    }
    requests
        .iter_mut()
        .for_each(|request| request.pending.disarm());
    Ok(())
}

/// `acquisition` (of `name`, begun at `started`), given up at `deadline` if there is one
/// with [`Error::Timeout`], so that the call returns at the deadline at the latest: a
/// multi-lock's acquisition, an election's campaign (the acquire loop bounds its own). Passed
/// as a closure, as to [`Handle::traced`], so that its future is not kept twice.
pub(crate) async fn until<T, F>(
    deadline: Option<Instant>,
    name: &[u8],
    started: Instant,
    acquisition: impl FnOnce() -> F,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    let Some(deadline) = deadline else {
        return acquisition().await;
    };
    let bounded = tokio::time::timeout_at(deadline.into(), acquisition()).await;
    timed_out(bounded, name, started)
}

impl Attempts for Request<'_> {
    type Held = SemaphorePermit;

    fn holder(&self) -> &str {
        &self.holder
    }

    async fn attempt(&mut self, window: Duration) -> Result<Attempt<SemaphorePermit>, Error> {
        self.round_trip(true, window).await
    }

    /// A waiter takes the lock or the permits from a release of its client, except in fair
    /// handoff (the Redis queue decides the order), with replica acknowledgement (the
    /// acquisition waits for replicas, which a grant in a release does not), and on a
    /// read-write lock (a writer hands over to readers, and readers to a writer, only through
    /// the release's message).
    fn handoff_terms(&self) -> Option<HandoffTerms> {
        let handle = self.handle;
        // A kind whose releases hand off in this client's mode: not a read-write lock's, and
        // none in fair handoff.
        if !self.ask.kind().hands_off(handle.engine()) || handle.options.replica_ack.is_some() {
            return None;
        }
        Some(HandoffTerms {
            holder: self.holder.clone(),
            lease: handle.lease(),
            label: handle.options.label.clone(),
            permits: self.ask.room().0,
            undo: handoff::undo_by(handle.pending(self.ask.kind(), &self.holder)),
        })
    }

    fn handed_off(&mut self, grant: Grant) -> Option<SemaphorePermit> {
        self.pending.disarm();
        let (permits, limit) = self.ask.room();
        let limit = grant.room.map_or(limit, |room| room.limit);
        Some(self.won(grant.token, (grant.sent_at, None), None, (permits, limit)))
    }
}
