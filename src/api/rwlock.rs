//! A named read-write lock: many readers or one writer, every hold with its own lease, writers
//! fenced, readers placed between writers.

use std::time::Duration;

use super::client::LockClient;
use super::guard::{deref_to_guard, owned, LockGuard};
use super::handle::{Ask, Handle, Hold};
use crate::base::error::Error;
use crate::base::token::FencingToken;
use crate::protocol::rwlock::{rw_downgrade, RwMode};
use crate::protocol::LockKeys;

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
    handle: Handle,
}

impl LockClient {
    /// A handle to the read-write lock called `name`. Read-write lock names are their own
    /// namespace: unrelated to a lock or a semaphore of the same name. Nothing is sent to Redis
    /// until an acquisition.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn rwlock(&self, name: impl AsRef<[u8]>) -> Result<RwLock, Error> {
        let handle = Handle::named(self, name.as_ref(), LockKeys::rwlock)?;
        Ok(RwLock { handle })
    }
}

impl RwLock {
    getters! {
        /// The lock's name, as given to [`LockClient::rwlock`].
        fn name(&self) -> &[u8] => &self.handle.name;

        /// The lease each hold gets: this handle's own, or the client's default (renewed by the
        /// watchdog).
        fn lease(&self) -> Duration => self.handle.lease();

        /// The label holds taken through this handle carry ([`RwLock::with_label`]).
        fn label(&self) -> Option<&str> => self.handle.label();
    }

    /// A handle to the same lock whose holds get a fixed `lease` that the watchdog does not
    /// renew.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms, over 7 days, or not a whole number of
    /// milliseconds.
    pub fn with_lease(&self, lease: Duration) -> Result<RwLock, Error> {
        let handle = self.handle.with(self.handle.options.with_lease(lease)?);
        Ok(RwLock { handle })
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
        let options = self.handle.options.with_label(label.as_ref())?;
        let handle = self.handle.with(options);
        Ok(RwLock { handle })
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
        let permit = self.handle.try_acquire(READ, "try_read").await?;
        Ok(permit.map(|p| ReadGuard { guard: p.guard }))
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
        let permit = self.handle.try_acquire(WRITE, "try_write").await?;
        Ok(permit.map(|p| WriteGuard { guard: p.guard }))
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
        let guard = self.handle.acquire(READ, "read", None).await?.guard;
        Ok(ReadGuard { guard })
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
        let guard = self.handle.acquire(WRITE, "write", None).await?.guard;
        Ok(WriteGuard { guard })
    }

    /// [`RwLock::read`], waiting at most `timeout` ([`Error::Timeout`] then).
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`RwLock::read`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::read`].
    pub async fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard, Error> {
        let permit = self.handle.acquire(READ, "read_timeout", Some(timeout));
        let guard = permit.await?.guard;
        Ok(ReadGuard { guard })
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
        let permit = self.handle.acquire(WRITE, "write_timeout", Some(timeout));
        let guard = permit.await?.guard;
        Ok(WriteGuard { guard })
    }
}

const READ: Ask = Ask::Hold(Hold::Side(RwMode::Read));
const WRITE: Ask = Ask::Hold(Hold::Side(RwMode::Write));

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

deref_to_guard!(ReadGuard, WriteGuard);

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
        let guard = self.guard.reenter().await?;
        Ok(ReadGuard { guard })
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
        let guard = self.guard.reenter().await?;
        Ok(WriteGuard { guard })
    }

    /// Turns the write hold into a read hold in one step: no other writer can get in between,
    /// and waiting readers may enter at once. The read keeps the writer's token and lease.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the write hold had already ended (the guard is gone then, and
    /// nothing is held); [`Error::Redis`] when Redis could not be reached within the retry
    /// window (the hold is released in the background); [`Error::InvalidPermits`] when another
    /// guard of this write hold is alive (a [`reenter`](Self::reenter)): it still writes, so
    /// no reader may enter. Nothing is sent then, and this guard is released as if dropped;
    /// the other keeps the write hold.
    ///
    /// # Cancel safety
    /// Safe in effect: a dropped call releases the hold in the background, downgraded or not.
    pub async fn downgrade(self) -> Result<ReadGuard, Error> {
        let holder = self.guard.holder().clone();
        if holder.guards() > 1 {
            return Err(Error::InvalidPermits {
                reason: format!(
                    "{} guards share this write hold; a downgrade would let readers in beside \
                     the others, so it needs this guard to be the only one",
                    holder.guards()
                ),
            });
        }
        let reply = holder
            .engine
            .retrying(|mut conn| {
                let (keys, id) = (&holder.keys, &holder.id);
                let pubsub = conn.pubsub();
                async move { rw_downgrade(&mut conn, keys, id, pubsub).await }
            })
            .await
            .map_err(|err| err.named(&holder.name))?;
        owned(&holder, reply)?;
        Ok(ReadGuard { guard: self.guard })
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
