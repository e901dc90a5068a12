//! The blocking multi-lock: a set of locks taken all or nothing, and its guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::LockGuard;
use crate::{Error, FencingToken, OnShortfall};

/// A blocking [`crate::MultiLock`]: a set of locks taken all or nothing, in a global order, so
/// threads that take overlapping sets in any order never deadlock.
///
/// ```no_run
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let accounts = client.multi_lock(["account:alice", "account:bob"])?;
/// let guard = accounts.acquire()?;
/// // ... move money, writing each account with guard.token(its name) ...
/// guard.release()?;
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    pub(super) inner: crate::MultiLock,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

/// A blocking [`crate::MultiGuard`]: every member of a [`MultiLock`] held, with one fencing
/// token per member; released whole on [`MultiGuard::release`] or, in the background, on drop.
///
/// ```no_run
/// use fencelock::blocking::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
/// let guard = client.multi_lock(["a", "b"])?.acquire()?;
/// let a = guard.token("a").expect("a member");
/// assert!(guard.is_valid());
/// guard.release()?;
/// # Ok::<(), fencelock::Error>(())
/// ```
#[must_use = "a guard releases its locks when dropped; bind it for as long as the critical section lasts"]
#[derive(Debug)]
pub struct MultiGuard {
    pub(super) inner: crate::MultiGuard,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
}

impl MultiLock {
    /// The names of the members, in the order they are acquired (the global order).
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["b", "a"])?;
    /// let names: Vec<&[u8]> = set.names().collect();
    /// assert_eq!(names.len(), 2);
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.inner.names()
    }

    /// The lease every member gets; see [`crate::MultiLock::lease`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["a", "b"])?.with_lease(Duration::from_secs(5))?;
    /// assert_eq!(set.lease(), Duration::from_secs(5));
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// A handle whose acquisitions give every member `lease` (not renewed by the watchdog);
    /// see [`crate::MultiLock::with_lease`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["a", "b"])?.with_lease(Duration::from_secs(5))?;
    /// set.acquire()?.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for an unusable lease.
    pub fn with_lease(&self, lease: Duration) -> Result<MultiLock, Error> {
        Ok(MultiLock {
            inner: self.inner.with_lease(lease)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle whose acquisitions carry `label` on every member's hold; see
    /// [`crate::MultiLock::with_label`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty, over-long or multi-line label.
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<MultiLock, Error> {
        Ok(MultiLock {
            inner: self.inner.with_label(label)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle whose acquisitions return only after `replicas` replicas confirmed every
    /// member; on a shortfall the whole set is rolled back ([`Error::ReplicationTimeout`]) or,
    /// after [`MultiLock::on_replica_shortfall`], returned unreplicated. See
    /// [`crate::MultiLock::with_replica_ack`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client
    ///     .multi_lock(["a", "b"])?
    ///     .with_replica_ack(1, Duration::from_millis(200))?;
    /// let guard = set.acquire()?;
    /// assert!(guard.replicated());
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for zero replicas or a timeout outside 1 ms..=60 s.
    pub fn with_replica_ack(&self, replicas: u32, timeout: Duration) -> Result<MultiLock, Error> {
        Ok(MultiLock {
            inner: self.inner.with_replica_ack(replicas, timeout)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A handle with another [`OnShortfall`] policy; see
    /// [`crate::MultiLock::on_replica_shortfall`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    /// use fencelock::OnShortfall;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client
    ///     .multi_lock(["a", "b"])?
    ///     .with_replica_ack(1, Duration::from_millis(200))?
    ///     .on_replica_shortfall(OnShortfall::ReturnUnreplicated);
    /// set.acquire()?.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn on_replica_shortfall(&self, policy: OnShortfall) -> MultiLock {
        MultiLock {
            inner: self.inner.on_replica_shortfall(policy),
            runtime: self.runtime.clone(),
        }
    }

    /// Takes every member if all are free, and returns at once either way: `Ok(None)` when any
    /// member is held by another holder, and then none is held by this call.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// if let Some(guard) = client.multi_lock(["a", "b"])?.try_acquire()? {
    ///     guard.release()?;
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::MultiLock::try_acquire`].
    pub fn try_acquire(&self) -> Result<Option<MultiGuard>, Error> {
        let guard = self.runtime.block_on(self.inner.try_acquire())?;
        Ok(guard.map(|inner| self.wrap(inner)))
    }

    /// Takes every member, blocking as long as it takes. Nothing is held while the thread
    /// waits (it queues on the first busy member and tries the whole set again when that is
    /// released), so two threads taking overlapping sets cannot deadlock.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::MultiLock::acquire`].
    pub fn acquire(&self) -> Result<MultiGuard, Error> {
        let inner = self.runtime.block_on(self.inner.acquire())?;
        Ok(self.wrap(inner))
    }

    /// Takes every member, blocking at most `timeout`: [`Error::Timeout`] when some member was
    /// still held then (an attempt in flight at the deadline is undone in the background).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// match client.multi_lock(["a", "b"])?.acquire_timeout(Duration::from_secs(2)) {
    ///     Ok(guard) => guard.release()?,
    ///     Err(err) if err.is_timeout() => { /* still busy; nothing held */ }
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`crate::MultiLock::acquire_timeout`].
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard, Error> {
        let inner = self.runtime.block_on(self.inner.acquire_timeout(timeout))?;
        Ok(self.wrap(inner))
    }

    fn wrap(&self, inner: crate::MultiGuard) -> MultiGuard {
        MultiGuard {
            inner,
            runtime: self.runtime.clone(),
        }
    }
}

impl MultiGuard {
    /// The fencing token of the member called `name`, or `None` if the set has no such member.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.token("a").is_some());
    /// assert!(guard.token("c").is_none());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn token(&self, name: impl AsRef<[u8]>) -> Option<FencingToken> {
        self.inner.token(name)
    }

    /// `(name, token)` of every member, in the global order.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// for (name, token) in guard.tokens() {
    ///     println!("{} -> {token}", String::from_utf8_lossy(name));
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn tokens(&self) -> impl Iterator<Item = (&[u8], FencingToken)> {
        self.inner.tokens()
    }

    /// Whether every member is still held as far as this process knows: the cheap check of
    /// the lost signal; see [`crate::MultiGuard::is_valid`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.is_valid());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// When the first member's lease ends by this process' clock.
    ///
    /// ```no_run
    /// use std::time::Instant;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.valid_until() > Instant::now());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn valid_until(&self) -> Instant {
        self.inner.valid_until()
    }

    /// Whether the acquisition reached the replicas it required, for every member; see
    /// [`crate::MultiGuard::replicated`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// assert!(guard.replicated()); // nothing was required
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn replicated(&self) -> bool {
        self.inner.replicated()
    }

    /// Blocks until any member is lost, or `timeout` passed; returns whether one was lost.
    /// See [`crate::MultiGuard::lost`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let set = client.multi_lock(["a", "b"])?.with_lease(Duration::from_millis(100))?;
    /// let guard = set.acquire()?;
    /// assert!(guard.wait_lost(Duration::from_secs(1))); // the fixed lease ran out
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        // The timer must be created inside the runtime, so inside the future.
        self.runtime
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await })
            .is_ok()
    }

    /// Enters the member called `name` again as the same holder, with the same token; `None`
    /// if the set has no such member. See [`crate::LockGuard::reenter`].
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// let inner = guard.reenter("a").expect("a member")?;
    /// assert_eq!(Some(inner.token()), guard.token("a"));
    /// inner.release()?;
    /// guard.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::LockGuard::reenter`].
    pub fn reenter(&self, name: impl AsRef<[u8]>) -> Option<Result<LockGuard, Error>> {
        let member = self.inner.guard(name)?;
        Some(
            self.runtime
                .block_on(member.reenter())
                .map(|inner| LockGuard {
                    inner,
                    runtime: self.runtime.clone(),
                }),
        )
    }

    /// Takes the set apart into its members' guards, in the global order (to release or
    /// extend them one by one).
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let guard = client.multi_lock(["a", "b"])?.acquire()?;
    /// for member in guard.into_guards() {
    ///     member.release()?;
    /// }
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    pub fn into_guards(self) -> Vec<LockGuard> {
        let runtime = self.runtime;
        self.inner
            .into_guards()
            .into_iter()
            .map(|inner| LockGuard {
                inner,
                runtime: runtime.clone(),
            })
            .collect()
    }

    /// Releases every member once; see [`crate::MultiGuard::release`]. Blocks until Redis
    /// answered; when it cannot be reached within the retry window, the error is returned and
    /// every member's release goes on in the background as the same operation.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// client.multi_lock(["a", "b"])?.acquire()?.release()?;
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`crate::MultiGuard::release`].
    pub fn release(self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.release())
    }
}
