//! A named read-write lock: many readers or one writer, every hold with its own lease, writers
//! fenced, readers placed between writers.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::LockClient;
use super::guard::LockGuard;
use crate::base::config::checked_label;
use crate::base::durations::validate_lease;
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::engine::acquisition::{self, Acquisition, Attempt};
use crate::engine::hold::RW_LOCK;
use crate::engine::holder::{Holder, LostReason};
use crate::engine::pending::PendingOp;
use crate::engine::{Engine, PermissionScope};
use crate::protocol::keys::validate_name;
use crate::protocol::rwlock::{rw_acquire, rw_downgrade, RwAcquireReply, RwMode};
use crate::protocol::{CancelKind, LockKeys, OwnerReply};

/// A handle to one named read-write lock, made by [`LockClient::rwlock`]: any number of
/// readers at once, or one writer.
///
/// Every acquisition is a hold with its own lease, renewed by the client's watchdog while its
/// guard lives (or fixed, after [`RwLock::with_lease`]): a crashed reader frees its share
/// within its lease and never blocks writers for longer. Every hold gets a token from the
/// strictly increasing sequence of its slot (the locks' fencing tokens): a writer's token
/// fences its writes like a lock's; a reader's token is greater than every writer's before the
/// read and less than every writer's after it, so it is the read's *write epoch*: data written
/// with a token below it was written before the read. Readers read fenced data with
/// [`FencedResource::get_shared`](crate::FencedResource::get_shared) and their own token:
/// the read refuses every earlier writer's late write, as a claim does, and is refused only when
/// a newer writer has written since (the reader's hold was broken), never by another reader.
///
/// **Writer preference.** A writer that waits stops new readers from entering; readers
/// already inside keep their holds until they release (or their leases end, if they crash),
/// which bounds how long they keep the writer out. Waiting readers are woken together when the
/// writer leaves. Upgrading a read to a write is not offered: two readers upgrading at once
/// would wait for each other forever. A writer can [`downgrade`](WriteGuard::downgrade) to a
/// reader with no gap in between; a reader or writer re-enters through its guard
/// ([`ReadGuard::reenter`], [`WriteGuard::reenter`]). A task that holds a read and asks
/// [`RwLock::read`] again (instead of re-entering) waits behind any waiting writer, which waits
/// for that very read: a deadlock, as with any lock that prefers writers. Nest reads with
/// `reenter`.
///
/// Cheap to clone; it holds nothing by itself.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let catalogue = client.rwlock("catalogue")?;
/// let prices = client.resource("prices")?;
/// let read = catalogue.read().await?;
/// let current = prices.get_shared(read.token()).await?; // other readers never refuse it
/// println!("reading at epoch {}: {current:?}", read.token());
/// read.release().await?;
/// let write = catalogue.write().await?;
/// prices.set(write.token(), "rebuilt").await?;
/// write.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    client: LockClient,
    name: Arc<[u8]>,
    keys: Arc<LockKeys>,
    lease: Option<Duration>,
    /// Stored with each hold this handle takes (in the hold's field of the lock hash).
    label: Option<Arc<str>>,
}

impl std::fmt::Debug for RwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("lease", &self.lease())
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// A handle to the read-write lock called `name`. Read-write lock names are their own
    /// namespace: unrelated to a lock or a semaphore of the same name. Nothing is sent to Redis
    /// until an acquisition.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn rwlock(&self, name: impl AsRef<[u8]>) -> Result<RwLock, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        Ok(RwLock {
            client: self.clone(),
            keys: Arc::new(LockKeys::rwlock(&self.engine.config.prefix, name)),
            name: name.into(),
            lease: None,
            label: None,
        })
    }
}

impl RwLock {
    /// The lock's name, as given to [`LockClient::rwlock`].
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The lease each hold gets: this handle's own, or the client's default (renewed by the
    /// watchdog).
    pub fn lease(&self) -> Duration {
        self.lease
            .unwrap_or(self.client.engine.config.default_lease)
    }

    /// A handle to the same lock whose holds get a fixed `lease` that the watchdog does not
    /// renew.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not a whole number of
    /// milliseconds.
    pub fn with_lease(&self, lease: Duration) -> Result<RwLock, Error> {
        let mut lock = self.clone();
        lock.lease = Some(validate_lease(lease)?);
        Ok(lock)
    }

    /// A handle to the same lock whose holds, read or write, carry `label`: a request or trace
    /// id that operators see next to the hold (`fencelock rwlocks`, `show`, the admin API's
    /// [`HoldEntry::label`](crate::admin::HoldEntry::label)) and that the `fencelock.rwlock`
    /// event and the `fencelock.long_hold` warning record. Stored in the hold's own field by
    /// the acquisition's script call, only when given, and gone with the hold; a writer that
    /// downgrades keeps it. Use it per request (`catalogue.with_label(request_id)?.read()`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a label that is empty, over 256 bytes, or has control
    /// characters.
    ///
    /// ```
    /// # async fn demo(catalogue: fencelock::RwLock) -> Result<(), fencelock::Error> {
    /// let read = catalogue.with_label("report-118")?.read().await?;
    /// assert!(catalogue.with_label("").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<RwLock, Error> {
        let label = Some(checked_label(label.as_ref())?);
        Ok(RwLock {
            label,
            ..self.clone()
        })
    }

    /// The label holds taken through this handle carry ([`RwLock::with_label`]).
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Takes a read hold if no writer holds the lock or waits for it; `Ok(None)` otherwise.
    ///
    /// # Errors
    /// [`Error::WrongType`] when the lock's keys hold foreign data; [`Error::Redis`] when Redis
    /// could not be reached within the retry window; [`Error::PermissionDenied`] when the Redis
    /// user lacks a command the hold scripts need (checked before the client's first semaphore
    /// or read-write lock acquisition; nothing is written).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call's acquisition is undone in the background whether it ran or
    /// not.
    pub async fn try_read(&self) -> Result<Option<ReadGuard>, Error> {
        let outcome = self.try_hold(RwMode::Read).await;
        self.report(
            RwMode::Read,
            "try_read",
            outcome.as_ref().map(Option::is_some),
        );
        Ok(outcome?.map(|guard| ReadGuard { guard }))
    }

    /// Takes the write hold if nobody holds the lock; `Ok(None)` otherwise. A try never marks
    /// itself waiting, so it does not hold readers back.
    ///
    /// # Errors
    /// As [`RwLock::try_read`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::try_read`].
    pub async fn try_write(&self) -> Result<Option<WriteGuard>, Error> {
        let outcome = self.try_hold(RwMode::Write).await;
        self.report(
            RwMode::Write,
            "try_write",
            outcome.as_ref().map(Option::is_some),
        );
        Ok(outcome?.map(|guard| WriteGuard { guard }))
    }

    /// Takes a read hold, waiting (pub/sub, no polling) while a writer holds the lock or waits
    /// for it.
    ///
    /// # Errors
    /// As [`RwLock::try_read`], except that [`Error::Redis`] for an unreachable Redis comes only
    /// from the first try; once waiting, a lost connection is retried for as long as it lasts.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the queue and undoes an acquisition in flight.
    pub async fn read(&self) -> Result<ReadGuard, Error> {
        let outcome = self.hold_until(RwMode::Read, None).await;
        self.report(RwMode::Read, "read", outcome.as_ref().map(|_| true));
        Ok(ReadGuard { guard: outcome? })
    }

    /// Takes the write hold, waiting while anyone holds the lock. While it waits, new readers
    /// wait behind it.
    ///
    /// # Errors
    /// As [`RwLock::read`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the queue, undoes an acquisition in flight and
    /// takes back the mark that holds new readers back, so readers go on at once.
    pub async fn write(&self) -> Result<WriteGuard, Error> {
        let outcome = self.hold_until(RwMode::Write, None).await;
        self.report(RwMode::Write, "write", outcome.as_ref().map(|_| true));
        Ok(WriteGuard { guard: outcome? })
    }

    /// [`RwLock::read`], waiting at most `timeout` ([`Error::Timeout`] then).
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`RwLock::read`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::read`].
    pub async fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard, Error> {
        let deadline = Instant::now() + timeout;
        let outcome = self.hold_until(RwMode::Read, Some(deadline)).await;
        self.report(RwMode::Read, "read_timeout", outcome.as_ref().map(|_| true));
        Ok(ReadGuard { guard: outcome? })
    }

    /// [`RwLock::write`], waiting at most `timeout` ([`Error::Timeout`] then; the mark that
    /// held new readers back is taken back).
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`RwLock::write`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::write`].
    pub async fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard, Error> {
        let deadline = Instant::now() + timeout;
        let outcome = self.hold_until(RwMode::Write, Some(deadline)).await;
        self.report(
            RwMode::Write,
            "write_timeout",
            outcome.as_ref().map(|_| true),
        );
        Ok(WriteGuard { guard: outcome? })
    }

    /// One `fencelock.rwlock` event and the acquisition metric for an acquire call.
    fn report(&self, mode: RwMode, method: &'static str, outcome: Result<bool, &Error>) {
        let lock = || String::from_utf8_lossy(&self.name);
        let mode = match mode {
            RwMode::Read => "read",
            RwMode::Write => "write",
        };
        let ended = match outcome {
            Ok(true) => metrics::ACQUIRED,
            Ok(false) => metrics::BUSY,
            Err(err) if err.is_timeout() => metrics::TIMEOUT,
            Err(err) => {
                tracing::warn!(name: "fencelock.rwlock", lock = %lock(), mode, method,
                    outcome = metrics::ERROR, label = self.label.as_deref(), error = %err,
                    "read-write lock acquire failed");
                metrics::rwlock(mode, metrics::ERROR);
                return;
            }
        };
        tracing::debug!(name: "fencelock.rwlock", lock = %lock(), mode, method, outcome = ended,
            label = self.label.as_deref(), "read-write lock acquire ended");
        metrics::rwlock(mode, ended);
    }

    fn channel(&self, mode: RwMode) -> Cow<'_, [u8]> {
        match mode {
            RwMode::Read => Cow::Borrowed(&self.keys.lock),
            // Laid out for this kind: never `None`.
            RwMode::Write => Cow::Owned(self.keys.rw_writers().unwrap_or_default()),
        }
    }

    async fn try_hold(&self, mode: RwMode) -> Result<Option<LockGuard>, Error> {
        acquisition::try_once(&HoldRequest { lock: self, mode }).await
    }

    async fn hold_until(
        &self,
        mode: RwMode,
        deadline: Option<Instant>,
    ) -> Result<LockGuard, Error> {
        acquisition::acquire_hold(&HoldRequest { lock: self, mode }, deadline).await
    }
}

/// One acquisition of `lock` for reading or writing, on the holds' acquire loop.
struct HoldRequest<'a> {
    lock: &'a RwLock,
    mode: RwMode,
}

impl Acquisition for HoldRequest<'_> {
    type Held = LockGuard;

    fn engine(&self) -> &Engine {
        &self.lock.client.engine
    }

    /// Readers and writers wait on channels of their own, so neither blocks the other's local
    /// queue.
    fn channel(&self) -> Cow<'_, [u8]> {
        self.lock.channel(self.mode)
    }

    fn label(&self) -> Option<&str> {
        self.lock.label()
    }

    fn pending(&self, holder: &str) -> PendingOp {
        PendingOp::of_kind(
            &RW_LOCK,
            &self.lock.client.engine,
            &self.lock.keys,
            holder,
            holder,
            CancelKind::Acquire,
        )
    }

    /// One acquire round trip. `wait`: the attempt of a caller that will wait, which for a
    /// writer marks it waiting; that mark stays until the writer wins or gives up, so the
    /// pending op stays armed after a busy reply, and dropping it takes the mark back.
    async fn attempt(
        &self,
        holder: &str,
        pending: &mut PendingOp,
        wait: bool,
        window: Duration,
    ) -> Result<Attempt<LockGuard>, Error> {
        let (lock, mode) = (self.lock, self.mode);
        let engine = &lock.client.engine;
        let lease = lock.lease();
        let op_ttl = engine.config.op_record_ttl;
        let field_expiry = engine.field_expiry;
        let label = lock.label.as_deref();
        // Once per client, before anything is written (a drop here leaves nothing).
        engine.check_permissions(PermissionScope::Holds).await?;
        let sent_at = Instant::now();
        pending.arm();
        let sends = pending.sends();
        let reply = engine
            .retrying_within(window, |mut conn| {
                let keys = &lock.keys;
                let pubsub = conn.pubsub();
                let recorded = sends.send(&conn);
                async move {
                    if mode == RwMode::Read {
                        // Reads of one lock that meet in this client may share a call.
                        return engine
                            .read_grouped(
                                &mut conn, keys, holder, lease, op_ttl, pubsub, label, recorded,
                            )
                            .await;
                    }
                    rw_acquire(
                        &mut conn,
                        keys,
                        holder,
                        mode,
                        lease,
                        wait,
                        op_ttl,
                        pubsub,
                        field_expiry,
                        label,
                        recorded,
                    )
                    .await
                }
            })
            .await?;
        match reply {
            RwAcquireReply::Acquired { token } => {
                pending.disarm();
                let holder = Holder::of_kind(
                    &RW_LOCK,
                    engine.clone(),
                    lock.keys.clone(),
                    lock.name.clone(),
                    holder.to_owned(),
                    token,
                    sent_at,
                    lease,
                    lock.lease.is_none(),
                    None,
                    lock.label.clone(),
                );
                engine.watchdog.watch(&holder);
                // Readers do not exclude each other: the next waiting reader of this client
                // tries at once.
                Ok(Attempt::Won {
                    held: LockGuard::new(holder),
                    hand_on: mode == RwMode::Read,
                })
            }
            RwAcquireReply::Busy { wait: until } => {
                // A waiting writer's mark stays until it wins or gives up: still armed.
                if !(wait && mode == RwMode::Write) {
                    pending.busy();
                } else {
                    pending.answered();
                }
                Ok(Attempt::Busy(until))
            }
            RwAcquireReply::Cancelled => {
                pending.disarm();
                Err(Error::Cancelled)
            }
        }
    }
}

/// Proof of a read hold on an [`RwLock`]. Dropping it releases in the background;
/// [`ReadGuard::release`] releases and reports.
///
/// A read hold is a [`LockGuard`] of its kind of hold, which it dereferences to: its holder
/// id, lock name, validity (`valid_until`, `is_valid`, `lost`) and the rest are the guard's.
#[must_use = "a read guard releases when dropped; bind it for as long as the read lasts"]
pub struct ReadGuard {
    guard: LockGuard,
}

/// Proof of the write hold on an [`RwLock`]. Dropping it releases in the background;
/// [`WriteGuard::release`] releases and reports.
///
/// A write hold is a [`LockGuard`] of its kind of hold, which it dereferences to, as a
/// [`ReadGuard`] does.
#[must_use = "a write guard releases when dropped; bind it for as long as the write lasts"]
pub struct WriteGuard {
    guard: LockGuard,
}

impl std::ops::Deref for ReadGuard {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl std::ops::Deref for WriteGuard {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

/// A read or write guard as its `Debug` shows it, under the type's `name`.
fn debug_hold(name: &str, guard: &LockGuard, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    f.debug_struct(name)
        .field("lock", &String::from_utf8_lossy(guard.lock_name()))
        .field("holder", &guard.holder_id())
        .field("token", &guard.token())
        .field("valid", &guard.is_valid())
        .finish()
}

impl std::fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_hold("ReadGuard", &self.guard, f)
    }
}

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_hold("WriteGuard", &self.guard, f)
    }
}

// `token` stays a method of each guard type (not only the guard's, through `Deref`): it says
// what the token is for this side, and callers name it as a path (`ReadGuard::token`).
impl ReadGuard {
    /// The read's write epoch: greater than the token of every writer before this read (and
    /// every token issued before it in the slot), less than the token of every writer after it.
    /// For a read that began as a write ([`WriteGuard::downgrade`]), that writer's token.
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// Enters the read hold once more (a nested read): the same hold, token and lease; each
    /// entry is released on its own, and the hold ends with its last entry. Never waits, not
    /// even behind a waiting writer: the hold is already this reader's.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the hold has ended (its lease ran out, an operator released
    /// it); [`Error::Redis`] when Redis could not be reached within the retry window.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call's entry is undone in the background whether it ran or not.
    pub async fn reenter(&self) -> Result<ReadGuard, Error> {
        Ok(ReadGuard {
            guard: self.guard.reenter().await?,
        })
    }

    /// Releases the read hold; a waiting writer goes to Redis when the last reader left.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the hold had already ended; [`Error::Redis`] when Redis could
    /// not be reached within the retry window (the lease then frees it).
    ///
    /// # Cancel safety
    /// Safe in effect: if dropped, the release may or may not have run, and the lease frees the
    /// hold at the latest (the watchdog has stopped renewing it).
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await
    }
}

impl WriteGuard {
    /// The writer's fencing token: greater than every token issued before it in the slot (so
    /// greater than every earlier writer's and reader's of this lock). Pass it to every write.
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// Enters the write hold once more (a nested write): the same hold, token and lease; each
    /// entry is released on its own, and the hold ends with its last entry.
    ///
    /// # Errors
    /// As [`ReadGuard::reenter`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`ReadGuard::reenter`].
    pub async fn reenter(&self) -> Result<WriteGuard, Error> {
        Ok(WriteGuard {
            guard: self.guard.reenter().await?,
        })
    }

    /// Turns the write hold into a read hold in one step: no other writer can get in between,
    /// and waiting readers may enter at once. The read keeps the writer's token and lease.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the write hold had already ended (the guard is gone then, and
    /// nothing is held); [`Error::Redis`] when Redis could not be reached within the retry
    /// window (the hold is released in the background).
    ///
    /// # Cancel safety
    /// Safe in effect: a dropped call releases the hold in the background, downgraded or not.
    pub async fn downgrade(self) -> Result<ReadGuard, Error> {
        let holder = self.guard.holder().clone();
        let reply = holder
            .engine
            .retrying(|mut conn| {
                let (keys, id) = (&holder.keys, &holder.id);
                let pubsub = conn.pubsub();
                async move { rw_downgrade(&mut conn, keys, id, pubsub).await }
            })
            .await?;
        match reply {
            OwnerReply::Done { .. } => Ok(ReadGuard { guard: self.guard }),
            OwnerReply::NotHeld => {
                holder.mark_lost(LostReason::NotHeld);
                Err(Error::NotHeld)
            }
        }
    }

    /// Releases the write hold and wakes waiting readers and writers.
    ///
    /// # Errors
    /// As [`ReadGuard::release`].
    ///
    /// # Cancel safety
    /// As [`ReadGuard::release`].
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await
    }
}
