//! A handle to one named lock, and a lock's acquire script call.

use std::sync::Arc;
use std::time::Duration;

use super::client::LockClient;
use super::guard::LockGuard;
use super::handle::{in_semaphore_words, Ask, Handle, Options, Request};
use crate::base::error::Error;
use crate::base::replica_ack::{Acks, OnShortfall};
use crate::protocol::rwlock::{RwAcquireReply, RwMode};
use crate::protocol::semaphore::SemAcquireReply;
use crate::protocol::{AcquireReply, LockKeys};

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
    pub(crate) handle: Handle,
}

impl Lock {
    /// The lock of `handle`, whose acquisitions wait for the replicas the client's
    /// [`replica_ack`](crate::LockClientBuilder::replica_ack) asks for.
    pub(crate) fn of(mut handle: Handle) -> Lock {
        handle.options.replica_ack = handle.engine().config.replica_ack;
        Lock { handle }
    }

    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        &self.handle.keys
    }

    getters! {
        /// The lock's name, as given to [`LockClient::lock`].
        fn name(&self) -> &[u8] => &self.handle.name;

        /// The lease acquisitions through this handle get: its own, or the client's default.
        fn lease(&self) -> Duration => self.handle.lease();

        /// The label acquisitions through this handle carry ([`Lock::with_label`]).
        fn label(&self) -> Option<&str> => self.handle.label();

        /// The replica acknowledgement this handle's acquisitions require:
        /// `Some((replicas, timeout))`, or `None`.
        fn replica_ack(&self) -> Option<(u32, Duration)>
            => self.handle.options.replica_ack.map(|ack| (ack.replicas, ack.timeout));
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
        Ok(self.with(self.handle.options.with_lease(lease)?))
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
        Ok(self.with(self.handle.options.with_label(label.as_ref())?))
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
        Ok(self.with(self.handle.options.with_replica_ack(replicas, timeout)?))
    }

    /// A handle to the same lock whose acquisitions do not wait for replicas, whatever the
    /// client's default.
    pub fn without_replica_ack(&self) -> Lock {
        self.with(self.handle.options.without_replica_ack())
    }

    /// A handle to the same lock with another [`OnShortfall`] policy for its replica
    /// acknowledgement; no effect on a lock that requires none.
    pub fn on_replica_shortfall(&self, policy: OnShortfall) -> Lock {
        self.with(self.handle.options.on_replica_shortfall(policy))
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
        let permit = self.handle.try_acquire(Ask::Lock, "try_acquire").await?;
        Ok(permit.map(|permit| permit.guard))
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
        Ok(self.handle.acquire(Ask::Lock, "acquire", None).await?.guard)
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
        let permit = self
            .handle
            .acquire(Ask::Lock, "acquire_timeout", Some(timeout));
        Ok(permit.await?.guard)
    }

    /// The same lock with other options.
    pub(crate) fn with(&self, options: Options) -> Lock {
        Lock {
            handle: self.handle.with(options),
        }
    }
}

/// The acquire script call (`acquire.lua`) of `$request`, a lock's [`Request`], as a closure
/// over a connection for the retry loops, each send counted by the request's pending operation;
/// `$fair` as [`acquire_attempt`](crate::protocol::acquire_attempt) takes it. A closure is not
/// generic over the connection type, so a macro, expanded once per connection kind: a lock's
/// call and a multi-lock member's (`multi.rs`).
macro_rules! acquire_call {
    ($request:expr, $fair:expr) => {{
        let request: &$crate::api::handle::Request<'_> = $request;
        let (handle, holder, fair) = (request.handle, request.holder.as_str(), $fair);
        let (lease, label, sends) = (handle.lease(), handle.label(), request.pending.sends());
        let (keys, op_ttl) = (&handle.keys, handle.engine().config.op_record_ttl);
        move |mut conn| {
            let recorded = sends.send(&conn);
            async move {
                $crate::protocol::acquire_attempt(
                    &mut conn, keys, holder, lease, op_ttl, fair, label, recorded,
                )
                .await
            }
        }
    }};
}
pub(super) use acquire_call;

impl Request<'_> {
    /// A plain lock's acquire script call (re-sent while its outcome is unknown and `window`
    /// is open), in the semaphore's words, with the replicas' acknowledgement when the handle
    /// asks for it. `waiting`: the attempt of an acquirer that will wait, which a fair-mode
    /// client queues when the lock is held.
    pub(super) async fn lock_call(
        &self,
        waiting: bool,
        window: Duration,
    ) -> Result<(SemAcquireReply, Option<Acks>), Error> {
        let (engine, keys) = (self.handle.engine(), &self.handle.keys);
        let fair = engine.fair_attempt(waiting);
        let (reply, acks) = match self.handle.options.replica_ack {
            None => {
                let call = acquire_call!(self, fair);
                (engine.retrying_within(window, call).await?, None)
            }
            // Boxed, so that the replicated path's state does not enlarge every acquire future.
            Some(ack) => {
                let acquired = |reply: &_| matches!(reply, AcquireReply::Acquired { .. });
                let call = acquire_call!(self, fair);
                Box::pin(engine.acquire_acknowledged(ack, keys, window, call, acquired)).await?
            }
        };
        // A lock is a semaphore of one permit, which a holder never shares: a read-write
        // lock's write side.
        let reply = match reply {
            AcquireReply::Acquired {
                token, lease_left, ..
            } => RwAcquireReply::Acquired { token, lease_left },
            AcquireReply::Held { pttl } => RwAcquireReply::Busy { wait: pttl },
            AcquireReply::Cancelled => RwAcquireReply::Cancelled,
        };
        Ok((in_semaphore_words(reply, RwMode::Write), acks))
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
        Ok(Lock::of(Handle::named(self, name.as_ref(), LockKeys::new)?))
    }
}
