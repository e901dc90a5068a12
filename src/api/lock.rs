//! A handle to one named lock.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::client::LockClient;
use super::guard::LockGuard;
use crate::base::config::checked_label;
use crate::base::durations::validate_lease;
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::replica_ack::{Acks, OnShortfall, ReplicaAck};
use crate::base::token::FencingToken;
use crate::engine::acquisition::{self, Acquisition, Attempt};
use crate::engine::handoff::{self, Grant, HandoffTerms};
use crate::engine::holder::Holder;
use crate::engine::pending::PendingOp;
use crate::engine::wait::FairExit;
use crate::engine::Engine;
use crate::protocol::keys::validate_name;
use crate::protocol::{self, AcquireReply, CancelKind, LockKeys};

/// A handle to one named lock, made by [`LockClient::lock`].
///
/// Cheap to clone and to keep around; it holds nothing by itself. Every acquisition through it
/// is a new holder: two tasks (or two branches of one `join!`) that acquire the same lock
/// exclude each other even on the same client. To enter a lock you already hold, use
/// [`LockGuard::reenter`].
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// use std::time::Duration;
///
/// let lock = client.lock("sku:1234")?;
/// match lock.try_acquire().await? {
///     Some(guard) => guard.release().await?,
///     None => println!("busy, try later"),
/// }
/// let guard = lock.acquire_timeout(Duration::from_secs(2)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    client: LockClient,
    name: Arc<[u8]>,
    keys: Arc<LockKeys>,
    lease: Option<Duration>,
    replica_ack: Option<ReplicaAck>,
    /// Stored with each hold this handle takes (`~label` in the lock hash).
    label: Option<Arc<str>>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("lease", &self.lease())
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl Lock {
    pub(crate) fn new(client: LockClient, name: Arc<[u8]>, keys: LockKeys) -> Lock {
        Lock {
            name,
            keys: Arc::new(keys),
            lease: None,
            replica_ack: client.engine.config.replica_ack,
            label: None,
            client,
        }
    }

    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        &self.keys
    }

    pub(crate) fn name_arc(&self) -> &Arc<[u8]> {
        &self.name
    }

    /// The lock's name, as given to [`LockClient::lock`].
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The lease acquisitions through this handle get: its own, or the client's default.
    pub fn lease(&self) -> Duration {
        self.lease
            .unwrap_or(self.client.engine.config.default_lease)
    }

    /// A handle to the same lock whose acquisitions get `lease` instead of the client's
    /// default. Use it per lock (keep the returned handle) or per acquisition
    /// (`lock.with_lease(d)?.acquire()`).
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not a whole number of
    /// milliseconds.
    ///
    /// ```
    /// # async fn demo(lock: fencelock::Lock) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// let short = lock.with_lease(Duration::from_millis(500))?;
    /// assert!(lock.with_lease(Duration::ZERO).unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<Lock, Error> {
        let mut lock = self.clone();
        lock.lease = Some(validate_lease(lease)?);
        Ok(lock)
    }

    /// A handle to the same lock whose acquisitions carry `label`: a request or trace id that
    /// operators see next to the hold (`fencelock list`, `show`, the admin API's
    /// [`LockInfo::label`](crate::admin::LockInfo::label)) and that the `fencelock.acquire`
    /// tracing span records. Stored in the lock's hash by the acquisition's own script call,
    /// only when given, and gone with the hold. Use it per request
    /// (`lock.with_label(request_id)?.acquire()`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a label that is empty, over 256 bytes, or has control
    /// characters.
    ///
    /// ```
    /// # async fn demo(lock: fencelock::Lock) -> Result<(), fencelock::Error> {
    /// let guard = lock.with_label("order-8812")?.acquire().await?;
    /// assert!(lock.with_label("").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Lock, Error> {
        let mut lock = self.clone();
        lock.label = Some(checked_label(label.as_ref())?);
        Ok(lock)
    }

    /// The label acquisitions through this handle carry ([`Lock::with_label`]).
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// A handle to the same lock whose acquisitions return only after `replicas` replicas
    /// confirmed them (`WAIT replicas timeout` on a connection of its own, right after the
    /// acquire script), overriding the client's
    /// [`replica_ack`](crate::LockClientBuilder::replica_ack). When fewer confirm in time, the
    /// acquisition is rolled back and fails with [`Error::ReplicationTimeout`] (or, after
    /// [`Lock::on_replica_shortfall`], the guard is returned marked unreplicated).
    ///
    /// Re-entries and extensions of the guard do not wait for replicas: they change neither
    /// the holder nor the token. (`WAITAOF`, which also waits for the AOF fsync, needs Redis
    /// 7.2 and is not used yet.)
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for zero replicas or a timeout outside 1 ms..=60 s (whole
    /// milliseconds).
    ///
    /// ```
    /// # async fn demo(lock: fencelock::Lock) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// let replicated = lock.with_replica_ack(1, Duration::from_millis(100))?;
    /// let guard = replicated.acquire().await?;
    /// assert!(guard.replicated());
    /// # Ok(()) }
    /// ```
    pub fn with_replica_ack(&self, replicas: u32, timeout: Duration) -> Result<Lock, Error> {
        let on_shortfall = self
            .replica_ack
            .map(|ack| ack.on_shortfall)
            .unwrap_or_default();
        let mut lock = self.clone();
        lock.replica_ack = Some(ReplicaAck::new(replicas, timeout, on_shortfall)?);
        Ok(lock)
    }

    /// A handle to the same lock whose acquisitions do not wait for replicas, whatever the
    /// client's default.
    pub fn without_replica_ack(&self) -> Lock {
        let mut lock = self.clone();
        lock.replica_ack = None;
        lock
    }

    /// A handle to the same lock with another [`OnShortfall`] policy for its replica
    /// acknowledgement; no effect on a lock that requires none.
    pub fn on_replica_shortfall(&self, policy: OnShortfall) -> Lock {
        let mut lock = self.clone();
        if let Some(ack) = &mut lock.replica_ack {
            ack.on_shortfall = policy;
        }
        lock
    }

    /// The replica acknowledgement this handle's acquisitions require:
    /// `Some((replicas, timeout))`, or `None`.
    pub fn replica_ack(&self) -> Option<(u32, Duration)> {
        self.replica_ack.map(|ack| (ack.replicas, ack.timeout))
    }

    /// Takes the lock if it is free, and returns at once either way: `Ok(None)` when another
    /// holder has it (or, with [`fair_handoff`](crate::LockClientBuilder::fair_handoff), when
    /// it is reserved for another client). It never joins the fair-handoff queue.
    ///
    /// # Errors
    /// [`Error::WrongType`] when the lock's key holds foreign data, [`Error::Redis`] when Redis
    /// could not be reached within the retry window.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the request was sent, the acquisition is
    /// undone in the background whether it already ran or not, so the lock is never left held.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        let contended = AtomicBool::new(false);
        self.traced("try_acquire", &contended, || async {
            let request = LockRequest {
                lock: self,
                contended: &contended,
            };
            acquisition::try_once(&request).await
        })
        .await
    }

    /// Takes the lock, waiting as long as it takes.
    ///
    /// Waiting does not poll: the waiter subscribes to the lock's release channel and goes back
    /// to Redis when the holder releases, or when the holder's lease runs out (a lost message
    /// costs at most that). Waiters of one client queue in FIFO order and only the first goes
    /// to Redis on each release.
    ///
    /// A waiter waits for the lock, not for one request: once it is waiting, a lost connection
    /// (a server restart, a network outage) is retried for as long as it lasts, not only for
    /// the retry window, and the waiter goes on once Redis answers again.
    ///
    /// # Errors
    /// As [`Lock::try_acquire`], except that [`Error::Redis`] for an unreachable Redis comes
    /// only from the first try, before the call starts waiting; never [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the queue and undoes an acquisition that may be
    /// in flight, and a grant a release of this client may have made to it that it has not
    /// claimed (DESIGN.md §7.2); the lock is never left held by an acquire nobody waits for.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        let contended = AtomicBool::new(false);
        self.traced("acquire", &contended, || {
            self.acquire_until(None, &contended)
        })
        .await
    }

    /// Takes the lock, waiting at most `timeout`; [`Error::Timeout`] when the lock was still
    /// held then, or Redis did not answer in time (an attempt still in flight at the deadline
    /// is undone in the background). The call returns at the deadline at the latest. Once
    /// waiting, a lost connection is retried until the deadline, as in [`Lock::acquire`].
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`Lock::acquire`]: [`Error::Redis`] for an unreachable Redis
    /// only from the first try, before the call starts waiting.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::acquire`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard, Error> {
        let deadline = Instant::now() + timeout;
        let contended = AtomicBool::new(false);
        self.traced("acquire_timeout", &contended, || {
            self.acquire_until(Some(deadline), &contended)
        })
        .await
    }

    /// Runs one acquisition inside a `fencelock.acquire` span (a child of the caller's span, so
    /// a request's trace follows it into the lock) and reports its outcome as one
    /// `fencelock.acquire` event and the acquisition metrics.
    ///
    /// The acquisition is passed as a closure and its future made here: a future passed as an
    /// argument would be kept in this one's state next to the copy being awaited, doubling the
    /// size of every acquire future.
    async fn traced<T: Acquired, F>(
        &self,
        method: &'static str,
        contended: &AtomicBool,
        acquisition: impl FnOnce() -> F,
    ) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, Error>>,
    {
        let span = tracing::debug_span!("fencelock.acquire", lock = %String::from_utf8_lossy(&self.name), method, label = self.label.as_deref());
        let started = Instant::now();
        let acquisition = acquisition();
        // Without a subscriber for the span, the acquisition runs as it is: no instrumented
        // wrapper around the (large) acquisition future on the uncontended path.
        let outcome = if span.is_disabled() {
            acquisition.await
        } else {
            acquisition.instrument(span.clone()).await
        };
        // Evaluated by the event macros only when a subscriber wants the event.
        let waited_us = || u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let contended = contended.load(Ordering::Relaxed);
        let _entered = span.enter();
        let label = match outcome.as_ref().map(Acquired::guard) {
            Ok(Some(guard)) => {
                tracing::debug!(
                    name: "fencelock.acquire",
                    outcome = metrics::ACQUIRED,
                    token = guard.token().get(),
                    holder = guard.holder_id(),
                    waited_us = waited_us(),
                    contended,
                    "lock acquired"
                );
                metrics::ACQUIRED
            }
            Ok(None) => {
                tracing::debug!(name: "fencelock.acquire", outcome = metrics::BUSY, waited_us = waited_us(), contended, "lock busy");
                metrics::BUSY
            }
            Err(err) if err.is_timeout() => {
                tracing::debug!(name: "fencelock.acquire", outcome = metrics::TIMEOUT, waited_us = waited_us(), contended, "lock acquire timed out");
                metrics::TIMEOUT
            }
            Err(err) => {
                tracing::warn!(name: "fencelock.acquire", outcome = metrics::ERROR, waited_us = waited_us(), contended, error = %err, "lock acquire failed");
                metrics::ERROR
            }
        };
        metrics::acquisition(label, started);
        outcome
    }

    /// The acquire loop (`engine::acquisition`) with this lock's attempt: a fast attempt, then
    /// waiting in this client's queue until an attempt wins or `deadline` passes.
    async fn acquire_until(
        &self,
        deadline: Option<Instant>,
        contended: &AtomicBool,
    ) -> Result<LockGuard, Error> {
        let request = LockRequest {
            lock: self,
            contended,
        };
        acquisition::acquire_hold(&request, deadline).await
    }

    /// What a fair-mode client must undo in Redis when an acquisition leaves without the lock.
    fn fair_exit(&self) -> Option<FairExit> {
        self.client.fair_handoff().map(|grace| FairExit {
            keys: self.keys.clone(),
            client: self.client.engine.id.clone(),
            grace,
        })
    }

    fn pending(&self, holder: &str) -> PendingOp {
        // An acquisition's operation id is its holder id: holder ids are never reused, so the
        // holder's presence in the hash is what makes a re-sent acquire a replay.
        PendingOp::new(
            &self.client.engine,
            &self.keys,
            holder,
            holder,
            CancelKind::Acquire,
        )
    }

    /// One acquire round trip (re-sent while its outcome is unknown and `window` is open).
    /// `waiting`: the attempt of an acquirer that will wait, which a fair-mode client queues
    /// when the lock is held.
    async fn attempt(
        &self,
        holder: &str,
        pending: &mut PendingOp,
        waiting: bool,
        window: Duration,
    ) -> Result<Attempt<LockGuard>, Error> {
        let fair = self.client.engine.fair_attempt(waiting);
        let lease = self.lease();
        let op_ttl = self.client.engine.config.op_record_ttl;
        let sent_at = Instant::now();
        pending.arm();
        let sends = pending.sends();
        let (reply, acks) = match self.replica_ack {
            None => {
                let engine = &self.client.engine;
                let reply = engine
                    .retrying_within(window, |mut conn| {
                        let (keys, label) = (&self.keys, self.label.as_deref());
                        let recorded = sends.send(&conn);
                        async move {
                            match fair {
                                // The default mode's acquisitions ride the group commit.
                                None => {
                                    engine
                                        .acquire_grouped(
                                            &mut conn, keys, holder, lease, op_ttl, label, recorded,
                                        )
                                        .await
                                }
                                Some(_) => {
                                    protocol::acquire_attempt(
                                        &mut conn, keys, holder, lease, op_ttl, fair, label,
                                        recorded,
                                    )
                                    .await
                                }
                            }
                        }
                    })
                    .await?;
                (reply, None)
            }
            // Boxed, so that the replicated path's state does not enlarge every acquire future.
            Some(ack) => {
                Box::pin(self.client.engine.acquire_acknowledged(
                    ack,
                    &self.keys,
                    window,
                    |mut conn| {
                        let (keys, label) = (&self.keys, self.label.as_deref());
                        let recorded = sends.send(&conn);
                        async move {
                            protocol::acquire_attempt(
                                &mut conn, keys, holder, lease, op_ttl, fair, label, recorded,
                            )
                            .await
                        }
                    },
                    |reply| matches!(reply, AcquireReply::Acquired { .. }),
                ))
                .await?
            }
        };
        if let (Some(acks), Some(ack)) = (acks, self.replica_ack) {
            if !acks.enough() && ack.on_shortfall == OnShortfall::Fail {
                // Still armed: if this rollback fails or is cancelled, the pending op's drop
                // undoes the acquisition in the background instead.
                self.roll_back(holder).await?;
                pending.disarm();
                return Err(Error::ReplicationTimeout {
                    acked: acks.acked,
                    required: acks.required,
                });
            }
        }
        match reply {
            AcquireReply::Acquired { token, .. } => {
                pending.disarm();
                Ok(Attempt::Won {
                    held: self.guard(holder, token, sent_at, acks),
                    hand_on: false,
                })
            }
            AcquireReply::Held { pttl } => {
                pending.busy();
                Ok(Attempt::Busy(pttl))
            }
            AcquireReply::Cancelled => {
                pending.disarm();
                Err(Error::Cancelled)
            }
        }
    }
}

impl Lock {
    /// The guard of `holder`'s hold with `token`, whose lease started no earlier than
    /// `sent_at`; watched when the lock has no lease of its own.
    fn guard(
        &self,
        holder: &str,
        token: FencingToken,
        sent_at: Instant,
        acks: Option<Acks>,
    ) -> LockGuard {
        let holder = Holder::new(
            self.client.engine.clone(),
            self.keys.clone(),
            self.name.clone(),
            holder.to_owned(),
            token,
            sent_at,
            self.lease(),
            self.lease.is_none(),
            acks,
            self.label.clone(),
        );
        self.client.engine.watchdog.watch(&holder);
        LockGuard::new(holder)
    }

    /// Undoes this lock's acquisition by `holder` (an acquisition whose replicas fell short):
    /// `cancel.lua` for the acquire op, which frees the lock and wakes waiters.
    pub(crate) async fn roll_back(&self, holder: &str) -> Result<(), Error> {
        let ttl = self.client.engine.config.op_record_ttl;
        let reply = self
            .client
            .engine
            .retrying(|mut conn| {
                let keys = &self.keys;
                async move {
                    let pubsub = conn.pubsub();
                    let kind = CancelKind::Acquire;
                    protocol::cancel(&mut conn, keys, holder, holder, kind, ttl, pubsub).await
                }
            })
            .await?;
        tracing::debug!(
            ?reply,
            holder,
            "rolled back an acquisition replicas did not confirm"
        );
        Ok(())
    }
}

/// One acquisition of `lock`, on the acquire loop of every kind (`engine::acquisition`).
struct LockRequest<'a> {
    lock: &'a Lock,
    /// Set when the acquisition starts waiting (the `fencelock.acquire` event reports it).
    contended: &'a AtomicBool,
}

impl Acquisition for LockRequest<'_> {
    type Held = LockGuard;

    fn engine(&self) -> &Engine {
        &self.lock.client.engine
    }

    fn channel(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.lock.keys.lock)
    }

    fn label(&self) -> Option<&str> {
        self.lock.label()
    }

    fn pending(&self, holder: &str) -> PendingOp {
        self.lock.pending(holder)
    }

    async fn attempt(
        &self,
        holder: &str,
        pending: &mut PendingOp,
        wait: bool,
        window: Duration,
    ) -> Result<Attempt<LockGuard>, Error> {
        self.lock.attempt(holder, pending, wait, window).await
    }

    fn fair_exit(&self) -> Option<FairExit> {
        self.lock.fair_exit()
    }

    /// Nobody shares a lock: a won attempt holds the next local waiter for its lease.
    fn winner_lease(&self) -> Option<Duration> {
        Some(self.lock.lease())
    }

    fn contended(&self) -> Option<&AtomicBool> {
        Some(self.contended)
    }

    /// A plain lock's waiter takes the lock from a release of its client, except in fair
    /// handoff (the Redis queue decides the order) and with replica acknowledgement (the
    /// acquisition waits for replicas, which a grant in a release does not).
    fn handoff_terms(&self, holder: &str) -> Option<HandoffTerms> {
        let lock = self.lock;
        if lock.client.fair_handoff().is_some() || lock.replica_ack.is_some() {
            return None;
        }
        Some(HandoffTerms {
            holder: holder.to_owned(),
            lease: lock.lease(),
            label: lock.label.clone(),
            permits: 1,
            undo: handoff::undo_by(lock.pending(holder)),
        })
    }

    fn handed_off(&self, holder: &str, pending: &mut PendingOp, grant: Grant) -> Option<LockGuard> {
        pending.disarm();
        Some(self.lock.guard(holder, grant.token, grant.sent_at, None))
    }
}

/// What an acquire method returns: a guard, or (try_acquire) maybe one.
trait Acquired {
    fn guard(&self) -> Option<&LockGuard>;
}

impl Acquired for LockGuard {
    fn guard(&self) -> Option<&LockGuard> {
        Some(self)
    }
}

impl Acquired for Option<LockGuard> {
    fn guard(&self) -> Option<&LockGuard> {
        self.as_ref()
    }
}

impl LockClient {
    /// A handle to the lock called `name`. Names are arbitrary bytes (UTF-8, binary, braces
    /// included) of 1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes; two different names never
    /// share a key. Nothing is sent to Redis until the lock is acquired.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        let keys = LockKeys::new(&self.engine.config.prefix, name);
        Ok(Lock::new(self.clone(), name.into(), keys))
    }
}
