//! A named semaphore: a number of permits shared by every process, each hold with its own
//! lease.

use std::time::Duration;

use super::client::LockClient;
use super::guard::{deref_to_guard, LockGuard};
use super::handle::{Ask, Handle, Hold};
use crate::base::error::Error;
use crate::base::token::FencingToken;
use crate::protocol::LockKeys;

/// A handle to one named semaphore, made by [`LockClient::semaphore`]: `limit` permits shared
/// by every client of the same Redis.
///
/// Each acquisition is one **hold** of one or more permits, with a lease of its own that the
/// client's watchdog renews while the [`SemaphorePermit`] lives (or a fixed lease, after
/// [`Semaphore::with_lease`]). A holder that crashes or hangs gives its permits back when its
/// lease ends, without a sweeper and without anyone's help: every semaphore script first drops
/// the holds whose lease has passed. Each hold gets a fencing token from the same strictly
/// increasing sequence as the locks of its slot, for audit and for storage that refuses a
/// late holder's writes ([`FencedResource`](crate::FencedResource)).
///
/// **The limit.** The first acquisition of an idle semaphore records its handle's limit in
/// Redis; while any hold is live, that recorded limit is the one every acquisition is judged
/// by, whatever its handle says (so that all holders agree on it), and each permit reports it
/// ([`SemaphorePermit::limit`]). When the last hold ends the record goes with it, and the
/// next acquisition records its own handle's limit: a change of configuration takes effect
/// once the semaphore has been idle, or at once through
/// [`Admin::set_semaphore_limit`](crate::admin::Admin::set_semaphore_limit).
///
/// Cheap to clone; it holds nothing by itself.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// // At most 4 exports run at once, across every instance.
/// let exports = client.semaphore("exports", 4)?;
/// let permit = exports.acquire(1).await?;
/// println!("export with token {}", permit.token());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    handle: Handle,
    limit: u32,
}

debug_struct!(Semaphore(self) {
    name: String::from_utf8_lossy(&self.handle.name),
    limit: self.limit,
    lease: self.handle.lease(),
    label: self.handle.options.label,
} ..);

impl LockClient {
    /// A handle to the semaphore called `name` with `limit` permits in all (the limit an idle
    /// semaphore takes on its first acquisition: see [`Semaphore`]). Semaphore names are their
    /// own namespace: a semaphore and a lock of the same name are unrelated. Nothing is sent to
    /// Redis until a permit is acquired.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name; [`Error::InvalidPermits`] for a
    /// limit of zero.
    ///
    /// ```
    /// # fn demo(client: fencelock::LockClient) {
    /// assert!(client.semaphore("pool", 0).unwrap_err().is_invalid_input());
    /// # }
    /// ```
    pub fn semaphore(&self, name: impl AsRef<[u8]>, limit: u32) -> Result<Semaphore, Error> {
        let handle = Handle::named(self, name.as_ref(), LockKeys::semaphore)?;
        if limit == 0 {
            return Err(Error::InvalidPermits {
                reason: "a semaphore needs at least one permit".into(),
            });
        }
        Ok(Semaphore { handle, limit })
    }
}

impl Semaphore {
    getters! {
        /// The semaphore's name, as given to [`LockClient::semaphore`].
        fn name(&self) -> &[u8] => &self.handle.name;

        /// The limit this handle records when the semaphore is idle (see [`Semaphore`] for the
        /// limit in force while it is in use).
        fn limit(&self) -> u32 => self.limit;

        /// The lease each hold gets: this handle's own, or the client's default (renewed by the
        /// watchdog).
        fn lease(&self) -> Duration => self.handle.lease();

        /// The label holds taken through this handle carry ([`Semaphore::with_label`]).
        fn label(&self) -> Option<&str> => self.handle.label();
    }

    /// A handle to the same semaphore whose holds get a fixed `lease` that the watchdog does
    /// not renew: a hold ends at the latest when it runs out, released or not.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not a whole number of
    /// milliseconds.
    ///
    /// ```
    /// # fn demo(pool: fencelock::Semaphore) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// let short = pool.with_lease(Duration::from_secs(5))?;
    /// assert!(pool.with_lease(Duration::ZERO).unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<Semaphore, Error> {
        let handle = self.handle.with(self.handle.options.with_lease(lease)?);
        Ok(Semaphore { handle, ..*self })
    }

    /// A handle to the same semaphore whose holds carry `label`: a request or trace id that
    /// operators see next to the hold (`fencelock semaphores`, `show`, the admin API's
    /// [`HoldEntry::label`](crate::admin::HoldEntry::label)) and that the
    /// `fencelock.semaphore` event and the `fencelock.long_hold` warning record. Stored in
    /// the hold's own field by the acquisition's script call, only when given, and gone with
    /// the hold. Use it per request (`pool.with_label(request_id)?.acquire(1)`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a label that is empty, over 256 bytes, or has control
    /// characters.
    ///
    /// ```
    /// # async fn demo(pool: fencelock::Semaphore) -> Result<(), fencelock::Error> {
    /// let permit = pool.with_label("export-7731")?.acquire(1).await?;
    /// assert!(pool.with_label("two\nlines").unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl AsRef<str>) -> Result<Semaphore, Error> {
        let options = self.handle.options.with_label(label.as_ref())?;
        let handle = self.handle.with(options);
        Ok(Semaphore { handle, ..*self })
    }

    /// Takes `permits` permits if that many are free, and returns at once either way
    /// (`Ok(None)` when they are not).
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] for zero permits or more than the limit; [`Error::WrongType`]
    /// when the semaphore's keys hold foreign data; [`Error::Redis`] when Redis could not be
    /// reached within the retry window; [`Error::PermissionDenied`] when the Redis user lacks
    /// a command the semaphore scripts need (checked before the client's first semaphore or
    /// read-write lock acquisition; nothing is written).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the request was sent, the acquisition is
    /// undone in the background whether it already ran or not, so no permit is left held.
    pub async fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>, Error> {
        self.handle
            .try_acquire(self.ask(permits), "try_acquire")
            .await
    }

    /// Takes `permits` permits, waiting as long as it takes.
    ///
    /// Waiting does not poll: the waiter subscribes to the semaphore's channel and goes back
    /// to Redis when a holder releases, or when the earliest lease among the holders ends
    /// (a crashed holder's permits come back then). Waiters of one client queue in FIFO order,
    /// so a request for many permits is not overtaken by later requests for few from the same
    /// client. Across clients, a client built with
    /// [`fair_handoff`](crate::LockClientBuilder::fair_handoff) queues its waiting acquisitions
    /// in Redis, and the oldest one is protected: no other acquisition (a try included) is
    /// granted unless it leaves that one's permits free, so a stream of small requests cannot
    /// starve a big one. Once waiting, a lost connection is retried for as long as it lasts.
    /// In the default mode, a release by a task of the same client hands its permits to the
    /// first waiter in the release's own script call when they are enough for it and no other
    /// client waits: the waiter returns without a round trip of its own.
    ///
    /// # Errors
    /// As [`Semaphore::try_acquire`], except that [`Error::Redis`] for an unreachable Redis
    /// comes only from the first try, before the call starts waiting.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the queue and undoes an acquisition that may be
    /// in flight, or permits a release of this client may have handed it; no permit is left
    /// held by an acquire nobody waits for.
    pub async fn acquire(&self, permits: u32) -> Result<SemaphorePermit, Error> {
        self.handle
            .acquire(self.ask(permits), "acquire", None)
            .await
    }

    /// Takes `permits` permits, waiting at most `timeout`; [`Error::Timeout`] when too few
    /// were free until then. The call returns at the deadline at the latest.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`Semaphore::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn acquire_timeout(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<SemaphorePermit, Error> {
        let ask = self.ask(permits);
        self.handle
            .acquire(ask, "acquire_timeout", Some(timeout))
            .await
    }

    fn ask(&self, permits: u32) -> Ask {
        let limit = self.limit;
        Ask::Hold(Hold::Permits { permits, limit })
    }
}

/// Proof of holding permits of a [`Semaphore`]: one hold, with its fencing token and lease.
///
/// Dropping it gives the permits back in the background (as dropping a
/// [`LockGuard`] releases a lock); [`SemaphorePermit::release`] does it and reports the
/// outcome. While it lives, the watchdog renews its lease (unless the semaphore handle has a
/// fixed lease); if renewal fails until the lease ends, or Redis no longer has the hold,
/// [`lost`](LockGuard::lost) resolves and [`is_valid`](LockGuard::is_valid) turns false: the
/// permits may be someone else's by then.
///
/// ```no_run
/// # async fn demo(pool: fencelock::Semaphore) -> Result<(), fencelock::Error> {
/// let permit = pool.acquire(2).await?;
/// tokio::select! {
///     () = permit.lost() => eprintln!("lease lost; stop working"),
///     () = async { /* the work the permits allow */ } => permit.release().await?,
/// }
/// # Ok(()) }
/// ```
///
/// A permit is a [`LockGuard`] of its kind of hold, which it dereferences to: its holder id,
/// validity (`valid_until`, `is_valid`, `lost`) and the rest are the guard's.
#[must_use = "a permit is given back when dropped; bind it for as long as the work lasts"]
pub struct SemaphorePermit {
    pub(super) guard: LockGuard,
    pub(super) permits: u32,
    pub(super) limit: u32,
}

debug_struct!(SemaphorePermit(self) {
    semaphore: String::from_utf8_lossy(self.semaphore_name()),
    holder: self.holder_id(),
    permits: self.permits,
    limit: self.limit,
    token: self.token(),
    valid: self.is_valid(),
});

deref_to_guard!(SemaphorePermit);

// `token` stays a method of the permit (not only the guard's, through `Deref`): callers name
// it as a path (`SemaphorePermit::token`). `semaphore_name` is the guard's `lock_name` under
// the semaphore's word.
impl SemaphorePermit {
    getters! {
        /// The hold's fencing token: greater than every token issued before it to any hold of this
        /// semaphore (and any lock of its slot).
        fn token(&self) -> FencingToken => self.guard.token();

        /// How many permits this hold has.
        fn permits(&self) -> u32 => self.permits;

        /// The limit in force when the permits were acquired (see [`Semaphore`]).
        fn limit(&self) -> u32 => self.limit;

        /// The semaphore's name.
        fn semaphore_name(&self) -> &[u8] => self.guard.lock_name();
    }

    /// Gives the permits back and wakes waiters (or, in the same call, hands them to this
    /// client's first waiter when they are enough for it and no other client waits).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the hold had already ended (its lease ran out, or an operator
    /// released it): the permits were not this holder's any more, and nothing else changed.
    /// [`Error::Redis`] when Redis could not be reached within the retry window; the lease
    /// then frees the permits.
    ///
    /// # Cancel safety
    /// Not cancel safe in outcome, safe in effect: if the future is dropped, the release may
    /// or may not have run, and the watchdog has already stopped renewing, so the lease frees
    /// the permits at the latest.
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await
    }
}
