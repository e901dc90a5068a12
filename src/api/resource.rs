//! A value in Redis that only accepts writes carrying a current fencing token.

use std::sync::Arc;
use std::time::Duration;

use redis::{AsyncCommands, FromRedisValue};

use super::client::LockClient;
use crate::base::durations::{whole_millis_in, OutOfRange};
use crate::base::error::Error;
use crate::base::metrics;
use crate::base::token::FencingToken;
use crate::protocol::keys::validate_name;
use crate::protocol::{self, Read, ReadMode, ReadReply, ResourceKeys, Write, WriteReply};

/// A resource stored in Redis whose writes are fenced: a write carrying a token older than the
/// newest token the resource has accepted is refused with [`Error::StaleToken`] and writes
/// nothing. Made by [`LockClient::resource`].
///
/// This is the storage side of the lock: a holder that paused past its lease (GC, `SIGSTOP`)
/// and wakes up after another holder took over still has its old token, so its late writes
/// are rejected even though it believes it holds the lock. Each write checks and records the
/// token atomically, in one script, next to the data (same cluster slot); the high-water mark
/// survives deletion of the data and never expires, unless the resource is kept for a
/// retention ([`FencedResource::with_retention`], for a resource per request).
///
/// Guard one resource with one lock (tokens of different locks are not ordered against each
/// other), and send every read and write of a critical section with the guard's token: a read
/// with a token *claims* the resource (raises its mark), which is what stops an older holder
/// from writing between this holder's read and its write. A value, a number, a hash or a list
/// are supported; each write is applied at most once even when the request is re-sent.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let lock = client.lock("account:42")?;
/// let balance = client.resource("balance:42")?;
///
/// let guard = lock.acquire().await?;
/// // Reading with the token claims the resource: no older holder can write after this.
/// let cents = balance.get_i64(guard.token()).await?.unwrap_or(0);
/// if cents >= 500 {
///     // Refused with Error::StaleToken if a newer holder has claimed it meanwhile.
///     balance.incr_by(guard.token(), -500).await?;
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FencedResource {
    client: LockClient,
    name: Arc<[u8]>,
    keys: Arc<ResourceKeys>,
    /// How long the resource's keys are kept after its last fenced call; zero: forever.
    retention: Duration,
}

/// The longest retention accepted: ten years. Longer is a unit mistake.
const MAX_RETENTION: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

debug_struct!(FencedResource(self) {
    name: String::from_utf8_lossy(&self.name),
    retention: self.retention(),
} ..);

/// The reads of a fenced resource with a token, each written once for both of its modes: as
/// the holder of a hold nobody shares, which claims the resource (`$claim`), and as one of
/// several holders that share a hold (`$shared`). Each entry gives the two methods' docs and
/// names, their arguments after the token, what they return and the read.
macro_rules! fenced_reads {
    ($(
        $(#[$claim_doc:meta])* fn $claim:ident;
        $(#[$shared_doc:meta])* fn $shared:ident;
        ($($arg:ident: $ty:ty),*) -> $out:ty = $read:expr;
    )*) => {
        $(
            $(#[$claim_doc])*
            pub async fn $claim(&self, token: FencingToken $(, $arg: $ty)*) -> Result<$out, Error> {
                self.read_as(token, $read, ReadMode::Claim).await
            }

            $(#[$shared_doc])*
            pub async fn $shared(&self, token: FencingToken $(, $arg: $ty)*) -> Result<$out, Error> {
                self.read_as(token, $read, ReadMode::Shared).await
            }
        )*
    };
}

impl FencedResource {
    pub(crate) fn new(client: LockClient, name: &[u8]) -> FencedResource {
        let keys = ResourceKeys::new(client.prefix(), name);
        FencedResource {
            client,
            name: name.into(),
            keys: Arc::new(keys),
            retention: Duration::ZERO,
        }
    }

    /// This resource, kept for `retention` after its last fenced call: its data and its marks
    /// expire together that long after the last write, claim or fenced read, so a resource per
    /// request (a payment's status, an order's record) does not stay in Redis forever. Every
    /// fenced call on it sets the expiry again; [`peek`](Self::peek) does not.
    ///
    /// What expiry means for fencing: while the marks live, fencing is as without a
    /// retention. Once they have expired, the resource no longer knows which tokens wrote it,
    /// so it refuses every token issued more than `retention` ago (tokens carry their issue
    /// time as a floor: the server's clock in microseconds), with [`Error::StaleToken`] and
    /// [`Superseded::Expired`](crate::Superseded::Expired). A holder whose token predates the
    /// expiry is therefore refused, since the marks expired at least `retention` after the
    /// last token that wrote was issued. The limits: a holder still inside its hold more than
    /// `retention` after it began is refused too (choose a retention longer than any hold);
    /// the refusal relies on the server clock not stepping back (as the clock floor of tokens
    /// does) and on the fence counter of the slot not running ahead of that clock by more than
    /// the retention (more than a million tokens a second in one slot bucket, sustained).
    /// Use the same retention on every handle of one resource: a write without one makes the
    /// data permanent again while its marks still expire.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a retention of zero, over ten years, or not a whole number
    /// of milliseconds.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// let status = client
    ///     .resource("payment:5f2c:status")?
    ///     .with_retention(Duration::from_secs(7 * 24 * 3600))?;
    /// assert_eq!(status.retention(), Some(Duration::from_secs(7 * 24 * 3600)));
    /// # Ok(()) }
    /// ```
    pub fn with_retention(&self, retention: Duration) -> Result<FencedResource, Error> {
        let why = match whole_millis_in(retention, Duration::from_millis(1), MAX_RETENTION) {
            Ok(_) => {
                return Ok(FencedResource {
                    retention,
                    ..self.clone()
                })
            }
            Err(OutOfRange::TooShort) => "is zero",
            Err(OutOfRange::TooLong) => "is over ten years",
            Err(OutOfRange::NotWholeMillis) => "is not a whole number of milliseconds",
        };
        let reason = format!("a resource's retention of {retention:?} {why}");
        Err(Error::InvalidConfig { reason })
    }

    /// The retention given to [`with_retention`](Self::with_retention); `None`: the resource
    /// is kept until deleted.
    pub fn retention(&self) -> Option<Duration> {
        (!self.retention.is_zero()).then_some(self.retention)
    }

    /// The resource's name, as given to [`LockClient::resource`].
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Sets the resource to `value` (a string value).
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a newer token has written (nothing written);
    /// [`Error::WrongType`] when the resource holds a hash or list.
    ///
    /// # Cancel safety
    /// Dropping the future at its one await (the script call, re-sent with the same operation
    /// id while its outcome is unknown) leaves the write applied or not, never twice: the
    /// write's operation record makes every copy of it one write. Whether it was applied is
    /// then unknown to the caller; a later claiming read with the same token tells.
    pub async fn set(&self, token: FencingToken, value: impl AsRef<[u8]>) -> Result<(), Error> {
        self.write(token, Write::Set(value.as_ref()))
            .await
            .map(drop)
    }

    /// Adds `delta` (negative to subtract) to the resource's integer value (absent counts as
    /// 0) and returns the new value. A re-sent request is applied once, not twice.
    ///
    /// # Errors
    /// As [`FencedResource::set`]; [`Error::Redis`] if the result would overflow `i64`.
    ///
    /// # Cancel safety
    /// As [`FencedResource::set`].
    pub async fn incr_by(&self, token: FencingToken, delta: i64) -> Result<i64, Error> {
        self.write(token, Write::IncrBy(delta)).await
    }

    /// Sets fields of the resource's hash.
    ///
    /// # Errors
    /// As [`FencedResource::set`]; [`Error::InvalidConfig`] for an empty field list (nothing
    /// sent).
    ///
    /// # Cancel safety
    /// As [`FencedResource::set`].
    pub async fn set_fields(
        &self,
        token: FencingToken,
        fields: &[(&[u8], &[u8])],
    ) -> Result<(), Error> {
        if fields.is_empty() {
            return Err(Error::InvalidConfig {
                reason: "set_fields needs at least one field".into(),
            });
        }
        self.write(token, Write::SetFields(fields)).await.map(drop)
    }

    /// Appends items to the resource's list (a ledger) and returns its new length.
    ///
    /// # Errors
    /// As [`FencedResource::set_fields`].
    ///
    /// # Cancel safety
    /// As [`FencedResource::set`].
    pub async fn push(&self, token: FencingToken, items: &[&[u8]]) -> Result<u64, Error> {
        if items.is_empty() {
            return Err(Error::InvalidConfig {
                reason: "push needs at least one item".into(),
            });
        }
        let len = self.write(token, Write::Push(items)).await?;
        u64::try_from(len).map_err(|_| Error::Protocol(format!("list length {len}")))
    }

    /// Deletes the resource's data; the high-water mark stays, so older tokens remain refused.
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a newer token has written (nothing deleted).
    ///
    /// # Cancel safety
    /// As [`FencedResource::set`].
    pub async fn delete(&self, token: FencingToken) -> Result<(), Error> {
        self.write(token, Write::Delete).await.map(drop)
    }

    /// Claims the resource for `token` without reading it: from now on no older token can
    /// write to it. Use it as the first step of a critical section that will write.
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a newer token has claimed or written the resource.
    ///
    /// # Cancel safety
    /// Dropping the future at its one await (the script call, re-sent while its outcome is
    /// unknown) may leave the resource claimed for `token` or not. Claiming is idempotent and
    /// only ever raises the mark to a token its holder presented, so a dropped claim changes
    /// nothing a later call with the same token would not.
    pub async fn claim(&self, token: FencingToken) -> Result<(), Error> {
        let claimed = self.read_as::<redis::Value>(token, Read::Claim, ReadMode::Claim);
        claimed.await.map(drop)
    }

    fenced_reads! {
        /// Reads the string value as the holder of `token`, and claims the resource for it.
        ///
        /// Read-modify-write under a lock must read this way: a read without the token does not
        /// tell the resource that a newer holder exists, so a paused older holder could still
        /// write between your read and your write, and your write (computed from the old read)
        /// would then silently overwrite its update.
        ///
        /// # Errors
        /// [`Error::StaleToken`] when a newer token has claimed or written the resource (nothing
        /// read); [`Error::WrongType`] when the resource holds a hash or list.
        ///
        /// # Cancel safety
        /// Dropping the future at its one await (the script call, re-sent while its outcome is
        /// unknown) may leave the resource claimed (the read itself is discarded) for `token` or not. Claiming is idempotent and
        /// only ever raises the mark to a token its holder presented, so a dropped claim changes
        /// nothing a later call with the same token would not.
        fn get;
        /// Reads the string value as one of several holders that share a hold (the readers of a
        /// [`RwLock`](crate::RwLock)), with the token of this reader's hold.
        ///
        /// Refused only when a holder with a newer token has written the resource or claimed it
        /// since (then this reader's hold was broken and the value is not its view); never because
        /// another reader, older or newer, has read it. Like a claim it fences every older writer:
        /// from now on a write with a token below this one is refused, so a writer that paused
        /// past its lease cannot write under the readers. A holder alone in its critical section
        /// reads with [`FencedResource::get`] instead, whose claim also refuses older readers.
        ///
        /// ```no_run
        /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
        /// let catalog = client.rwlock("catalog")?;
        /// let prices = client.resource("prices")?;
        ///
        /// let reader = catalog.read().await?;
        /// // Other readers' shared reads never refuse this one; a newer writer's write does.
        /// let current = prices.get_shared(reader.token()).await?;
        /// reader.release().await?;
        /// # let _ = current;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        /// [`Error::StaleToken`] when a newer token has written or claimed the resource (nothing
        /// read); [`Error::WrongType`] when the resource holds a hash or list.
        ///
        /// # Cancel safety
        /// Dropping the future at its one await (the script call, re-sent while its outcome is
        /// unknown) may leave the shared mark raised to `token` or not (the read itself is
        /// discarded). Raising it is idempotent, so a dropped read changes nothing a later call
        /// with the same token would not.
        fn get_shared;
        () -> Option<Vec<u8>> = Read::Get;

        /// Reads the integer value as the holder of `token` (see [`FencedResource::get`]).
        ///
        /// # Errors
        /// As [`FencedResource::get`]; [`Error::Redis`] when the value is not an integer.
        ///
        /// # Cancel safety
        /// As [`FencedResource::get`].
        fn get_i64;
        /// Reads the integer value as a holder that shares its hold (see
        /// [`FencedResource::get_shared`]).
        ///
        /// # Errors
        /// As [`FencedResource::get_shared`]; [`Error::Redis`] when the value is not an integer.
        ///
        /// # Cancel safety
        /// As [`FencedResource::get_shared`].
        fn get_i64_shared;
        () -> Option<i64> = Read::Get;

        /// Reads one hash field as the holder of `token` (see [`FencedResource::get`]).
        ///
        /// # Errors
        /// As [`FencedResource::get`].
        ///
        /// # Cancel safety
        /// As [`FencedResource::get`].
        fn get_field;
        /// Reads one hash field as a holder that shares its hold (see
        /// [`FencedResource::get_shared`]).
        ///
        /// # Errors
        /// As [`FencedResource::get_shared`].
        ///
        /// # Cancel safety
        /// As [`FencedResource::get_shared`].
        fn get_field_shared;
        (field: impl AsRef<[u8]>) -> Option<Vec<u8>> = Read::Field(field.as_ref());

        /// Reads the list as the holder of `token` (see [`FencedResource::get`]).
        ///
        /// # Errors
        /// As [`FencedResource::get`].
        ///
        /// # Cancel safety
        /// As [`FencedResource::get`].
        fn items;
        /// Reads the list as a holder that shares its hold (see [`FencedResource::get_shared`]).
        ///
        /// # Errors
        /// As [`FencedResource::get_shared`].
        ///
        /// # Cancel safety
        /// As [`FencedResource::get_shared`].
        fn items_shared;
        () -> Vec<Vec<u8>> = Read::Items;
    }

    /// The string value, read without a token: for observers (reports, dashboards), never for
    /// a read-modify-write (use [`FencedResource::get`]).
    ///
    /// # Cancel safety
    /// Cancel safe: one read, no write; a dropped call leaves the server as it was.
    pub async fn peek(&self) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.conn().get(&self.keys.data).await?)
    }

    /// The integer value, read without a token (see [`FencedResource::peek`]).
    ///
    /// # Cancel safety
    /// Cancel safe: one read, no write; a dropped call leaves the server as it was.
    pub async fn peek_i64(&self) -> Result<Option<i64>, Error> {
        Ok(self.conn().get(&self.keys.data).await?)
    }

    /// One hash field, read without a token (see [`FencedResource::peek`]).
    ///
    /// # Cancel safety
    /// Cancel safe: one read, no write; a dropped call leaves the server as it was.
    pub async fn peek_field(&self, field: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.conn().hget(&self.keys.data, field.as_ref()).await?)
    }

    /// The list, read without a token (see [`FencedResource::peek`]).
    ///
    /// # Cancel safety
    /// Cancel safe: one read, no write; a dropped call leaves the server as it was.
    pub async fn peek_items(&self) -> Result<Vec<Vec<u8>>, Error> {
        Ok(self.conn().lrange(&self.keys.data, 0, -1).await?)
    }

    /// The highest token the resource has accepted (by a write, a claim or a shared read), if
    /// it has accepted any: a write with an older token is refused.
    ///
    /// # Cancel safety
    /// Cancel safe: one read, no write; a dropped call leaves the server as it was.
    pub async fn high_water_mark(&self) -> Result<Option<FencingToken>, Error> {
        let keys = [&self.keys.mark, &self.keys.shared];
        let marks: Vec<Option<u64>> = self.conn().mget(&keys).await?;
        Ok(marks
            .into_iter()
            .flatten()
            .max()
            .and_then(FencingToken::new))
    }

    /// The shared connection, for the unfenced reads (`peek*`, the high-water mark).
    fn conn(&self) -> impl AsyncCommands {
        self.client.engine.conn()
    }

    /// A fenced read (`mode`) of the resource with `token`, its value as a `T`.
    async fn read_as<T: FromRedisValue>(
        &self,
        token: FencingToken,
        read: Read<'_>,
        mode: ReadMode,
    ) -> Result<T, Error> {
        let (keys, retention) = (&self.keys, self.retention);
        let reply = self
            .client
            .engine
            .retrying(|mut conn| async move {
                protocol::fenced_read(&mut conn, keys, token, read, mode, retention).await
            })
            .await
            .map_err(|err| err.named(&self.name))?;
        match reply {
            ReadReply::Read(value) => {
                redis::from_redis_value(value).map_err(|e| Error::Redis(e.into()))
            }
            ReadReply::Stale { latest, by } => Err(Error::stale(&self.name, token, latest, by)),
        }
    }

    async fn write(&self, token: FencingToken, write: Write<'_>) -> Result<i64, Error> {
        let engine = &self.client.engine;
        let (op, ttl) = (engine.next_id(), engine.config.op_record_ttl);
        let (keys, op, retention) = (&self.keys, &op, self.retention);
        let reply = engine
            .retrying(|mut conn| async move {
                protocol::fenced_write(&mut conn, keys, token, op, ttl, write, retention).await
            })
            .await
            .map_err(|err| err.named(&self.name))?;
        match reply {
            WriteReply::Accepted(result) => Ok(result),
            WriteReply::Stale { latest, by } => {
                metrics::stale_write_rejected();
                tracing::warn!(
                    name: "fencelock.stale_write",
                    resource = %String::from_utf8_lossy(&self.name),
                    presented = token.get(),
                    latest = latest.get(),
                    by = %by,
                    "fenced write refused: a newer token got there first"
                );
                Err(Error::stale(&self.name, token, latest, by))
            }
        }
    }
}

impl LockClient {
    /// A fenced resource called `name`: a value, number, hash or list in Redis whose writes
    /// are refused when they carry a token older than one it has already accepted. Names
    /// follow the rules of [`LockClient::lock`]; a resource and a lock may share a name.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn resource(&self, name: impl AsRef<[u8]>) -> Result<FencedResource, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        Ok(FencedResource::new(self.clone(), name))
    }
}
