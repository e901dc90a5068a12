//! Semaphores and read-write locks: who holds what, and evicting one stuck hold.

use std::fmt;
use std::time::Duration;

use super::{clock, format_duration, held_for, item, Admin, Layout};
use crate::protocol::keys::{Listing, LockKeys};
use crate::protocol::{self, OwnerReply};
use crate::{Error, FencingToken, HoldExpiry};

/// The permits a writer holds in a read-write lock's layout (DESIGN section 21).
const WRITER_PERMITS: u32 = 1_000_000_000;

/// One hold of a semaphore or a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HoldEntry {
    /// The holder id (`<client id>:<sequence>`).
    pub holder: String,
    /// Its permits (a read-write lock's reader holds 1).
    pub permits: u32,
    /// Its token.
    pub token: Option<FencingToken>,
    /// The time left of its lease by the server clock; `None` when it has passed (the next
    /// script drops the hold).
    pub lease_left: Option<Duration>,
    /// How long it has been held by the server clock, from its token (as
    /// [`LockInfo::held_for`](super::LockInfo::held_for)).
    pub held_for: Option<Duration>,
    /// The name its client registered
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)); `None`
    /// when that client registered none that is still kept.
    pub client_name: Option<String>,
    /// The label its acquisition was given ([`Semaphore::with_label`](crate::Semaphore::with_label),
    /// [`RwLock::with_label`](crate::RwLock::with_label): a request or trace id); `None` when
    /// it was given none.
    pub label: Option<String>,
}

impl fmt::Display for HoldEntry {
    /// `HOLDER  permits N  token T  held D  lease D  client C  label L`, as a semaphore lists
    /// its holds (a read-write lock's lines leave the permits out: see [`RwLockInfo`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}  permits {}", self.holder, self.permits)?;
        self.details(f)
    }
}

impl HoldEntry {
    /// A read-write lock's hold for its line: its `role`, the holder and the rest, no permits (a
    /// reader holds 1 and a writer a billion only by the layout, which an operator need not
    /// know).
    fn share(&self, role: &str) -> String {
        let mut line = format!("{role} {}", self.holder);
        // Writing to a String cannot fail.
        let _ = self.details(&mut line);
        line
    }

    /// What follows the holder and its permits on a hold's line.
    fn details(&self, f: &mut impl fmt::Write) -> fmt::Result {
        item(f, "token", self.token, "")?;
        item(f, "held", self.held_for.map(format_duration), "")?;
        item(f, "lease", self.lease_left.map(format_duration), "expired")?;
        item(f, "client", self.client_name.as_ref(), "")?;
        item(f, "label", self.label.as_ref(), "")
    }
}

/// A semaphore in use, as [`Admin::semaphores`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The semaphore's name (arbitrary bytes).
    pub name: Vec<u8>,
    /// The limit recorded while it is in use.
    pub limit: u32,
    /// The permits its live holds have.
    pub used: u32,
    /// Its holds, oldest lease first.
    pub holds: Vec<HoldEntry>,
    /// How it keeps its holds' deadlines (the way the acquisition that created it chose).
    pub expiry: HoldExpiry,
}

impl fmt::Display for SemaphoreInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, used, limit) = (self.display_name(), self.used, self.limit);
        let head = format!("{name}  {used} of {limit} permits in use");
        listing(
            f,
            head,
            self.expiry,
            self.holds.iter().map(ToString::to_string),
        )
    }
}

/// A read-write lock in use, as [`Admin::rwlocks`] reads it.
///
/// Displayed as `fencelock rwlocks` prints it: a head line, then one line a hold, a reader or
/// writer without a permit count (that is how the layout counts them, not what they are):
///
/// ```text
/// config  2 readers  writer no  1 waiting writers  (deadlines in a lease zset)
///   reader 5f0c2e9a:7  token 1796623200004017  held 2.310s  lease 27.690s  client api-1  label req-17
///   reader 9b1d44c0:3  token 1796623201113022  held 1.201s  lease 28.799s  client api-2
///   waiting writer 77aa01f3:9
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockInfo {
    /// The lock's name (arbitrary bytes).
    pub name: Vec<u8>,
    /// The writer, if one holds it.
    pub writer: Option<HoldEntry>,
    /// The readers, oldest lease first.
    pub readers: Vec<HoldEntry>,
    /// Writers waiting (their holder ids), whose marks keep new readers out.
    pub waiting_writers: Vec<String>,
    /// How it keeps its holds' deadlines (the way the acquisition that created it chose).
    pub expiry: HoldExpiry,
}

impl fmt::Display for RwLockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let writer = if self.writer.is_some() { "yes" } else { "no" };
        let (name, readers) = (self.display_name(), self.readers.len());
        let waiting = self.waiting_writers.len();
        let head = format!("{name}  {readers} readers  writer {writer}  {waiting} waiting writers");
        let writer = self.writer.iter().map(|writer| writer.share("writer"));
        let readers = self.readers.iter().map(|reader| reader.share("reader"));
        let waiting = self.waiting_writers.iter();
        let waiting = waiting.map(|waiting| format!("waiting writer {waiting}"));
        listing(f, head, self.expiry, writer.chain(readers).chain(waiting))
    }
}

/// A semaphore's or read-write lock's lines: `head` with how it keeps deadlines (as an
/// operator reads them), then one indented line a hold.
fn listing(
    f: &mut fmt::Formatter<'_>,
    head: String,
    expiry: HoldExpiry,
    holds: impl IntoIterator<Item = String>,
) -> fmt::Result {
    let expiry = match expiry {
        HoldExpiry::FieldExpiry => "deadlines as hash-field expiry",
        _ => "deadlines in a lease zset",
    };
    write!(f, "{head}  ({expiry})")?;
    holds
        .into_iter()
        .try_for_each(|hold| write!(f, "\n  {hold}"))
}

/// What [`Admin::release_hold`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldRelease {
    /// The hold was released (its permits freed, waiters woken).
    Released,
    /// No such hold: released, expired, or never there.
    NotHeld,
}

/// Which primitive a hold belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldKind {
    /// A [`Semaphore`](crate::Semaphore)'s permits.
    Semaphore,
    /// A reader or writer of an [`RwLock`](crate::RwLock).
    RwLock,
}

impl HoldKind {
    /// How the hashes of this kind are found, and how its keys are laid out.
    fn layout(self) -> (Listing, Layout) {
        match self {
            HoldKind::Semaphore => (Listing::SEMAPHORES, LockKeys::semaphore),
            HoldKind::RwLock => (Listing::RWLOCKS, LockKeys::rwlock),
        }
    }
}

/// `ZRANGE key 0 -1 WITHSCORES`: every member of a zset with its score.
fn scored(key: &[u8]) -> redis::Cmd {
    let mut zrange = redis::cmd("ZRANGE");
    zrange.arg(key).arg(0).arg(-1).arg("WITHSCORES");
    zrange
}

/// The read of a hold hash, as a semaphore's, and the live waiting writers of a read-write
/// lock (none for a semaphore).
pub(super) type HoldsRead = (SemaphoreInfo, Vec<String>);

/// A read-write lock from the read of its hold hash, which is laid out as a semaphore's
/// (DESIGN section 21), and its live waiting writers.
fn rwlock((read, waiting_writers): HoldsRead) -> RwLockInfo {
    let (writers, readers): (Vec<_>, Vec<_>) = read
        .holds
        .into_iter()
        .partition(|hold| hold.permits >= WRITER_PERMITS);
    RwLockInfo {
        name: read.name,
        writer: writers.into_iter().next(),
        readers,
        waiting_writers,
        expiry: read.expiry,
    }
}

impl Admin {
    /// Every semaphore in use under the prefix, sorted by name, with each hold's permits,
    /// token and remaining lease. `SCAN` (never `KEYS`), then one `MULTI ... EXEC` of reads per
    /// semaphore; one that went idle between the two is left out.
    ///
    /// # Errors
    /// [`Error::WrongType`] for a key that holds foreign data; [`Error::Redis`] when the
    /// connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn semaphores(&self) -> Result<Vec<SemaphoreInfo>, Error> {
        let all = self.all_holds(HoldKind::Semaphore).await?;
        Ok(all.into_iter().map(|(read, _)| read).collect())
    }

    /// One semaphore by name, as [`Admin::semaphores`] reads each; `None` when it is not in
    /// use.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an unusable name, or as [`Admin::semaphores`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn semaphore(&self, name: impl AsRef<[u8]>) -> Result<Option<SemaphoreInfo>, Error> {
        let read = self.holds(HoldKind::Semaphore, name.as_ref()).await?;
        Ok(read.map(|(read, _)| read))
    }

    /// One read-write lock by name, as [`Admin::rwlocks`] reads each; `None` when it is not in
    /// use.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an unusable name, or as [`Admin::semaphores`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn rwlock(&self, name: impl AsRef<[u8]>) -> Result<Option<RwLockInfo>, Error> {
        let read = self.holds(HoldKind::RwLock, name.as_ref()).await?;
        Ok(read.map(rwlock))
    }

    /// Every read-write lock in use under the prefix, sorted by name: its writer, readers and
    /// waiting writers. Reads as [`Admin::semaphores`].
    ///
    /// # Errors
    /// As [`Admin::semaphores`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn rwlocks(&self) -> Result<Vec<RwLockInfo>, Error> {
        let all = self.all_holds(HoldKind::RwLock).await?;
        Ok(all.into_iter().map(rwlock).collect())
    }

    /// Releases one hold of a semaphore or read-write lock by its holder id (a stuck reader,
    /// a permit holder that hangs), with the holder's own release script, once per entry of a
    /// re-entered hold: its permits are freed and waiters woken, and every other hold is
    /// untouched. The holder learns at its next renewal (`lost()`); its late release is
    /// refused. An id that no hold can have (one of the hash's own fields, `~...`) is not
    /// held: nothing is sent.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an unusable name; [`Error::WrongType`] when the keys hold
    /// foreign data; [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Not cancel safe in outcome: a dropped call may or may not have released the hold (run
    /// it again: a second run answers `NotHeld`).
    pub async fn release_hold(
        &self,
        kind: HoldKind,
        name: impl AsRef<[u8]>,
        holder: &str,
    ) -> Result<HoldRelease, Error> {
        let keys = self.keys_of(name.as_ref(), kind.layout().1)?;
        // The hash's own fields (`~limit`, `~used`...) start with `~`, holder ids never: no
        // hold has such an id, and the release script must not take a field for one.
        if holder.starts_with('~') {
            return Ok(HoldRelease::NotHeld);
        }
        // An operator's op ids: never a client's (those start with a client's UUID).
        let mut conn = self.conn.clone();
        let ttl = Duration::from_secs(10);
        let mut released = false;
        // One entry per release: a re-entered hold takes one run per entry, each with an op id
        // of its own, until it ends.
        loop {
            let op = format!("operator:{}", uuid::Uuid::new_v4().simple());
            let release = protocol::release(&mut conn, &keys, holder, &op, ttl, self.pubsub, true);
            match release.await? {
                OwnerReply::Done { remaining: 0 } => return Ok(HoldRelease::Released),
                OwnerReply::Done { .. } => released = true,
                // Its last entry left meanwhile (the holder released it, or its lease ended).
                OwnerReply::NotHeld if released => return Ok(HoldRelease::Released),
                OwnerReply::NotHeld => return Ok(HoldRelease::NotHeld),
            }
        }
    }
    /// Changes the limit of a semaphore in use, atomically: every acquisition from now on is
    /// judged by `limit`, whatever its handle says, until the semaphore goes idle (then the
    /// next acquisition records its own handle's limit; make a lasting change in the
    /// services' configuration too). Holds above a lowered limit keep their permits until they
    /// leave; waiters are woken, since a raised limit may let them in. Returns the limit it
    /// had, or `None` when the semaphore is not in use (nothing changed).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an unusable name; [`Error::InvalidPermits`] for a limit of
    /// zero; [`Error::WrongType`] when the keys hold foreign data; [`Error::Redis`] when the
    /// connection fails.
    ///
    /// # Cancel safety
    /// Not cancel safe in outcome: a dropped call may or may not have set the limit (run it
    /// again: setting the same limit twice is the same as once).
    pub async fn set_semaphore_limit(
        &self,
        name: impl AsRef<[u8]>,
        limit: u32,
    ) -> Result<Option<u32>, Error> {
        let keys = self.keys_of(name.as_ref(), LockKeys::semaphore)?;
        if limit == 0 {
            return Err(Error::InvalidPermits {
                reason: "a semaphore needs at least one permit".into(),
            });
        }
        protocol::semaphore::sem_limit(&mut self.conn.clone(), &keys, limit, self.pubsub).await
    }

    /// Every semaphore or every read-write lock in use under the prefix, sorted by name.
    pub(super) async fn all_holds(&self, kind: HoldKind) -> Result<Vec<HoldsRead>, Error> {
        self.rows(kind.layout().0, b"", async |name, _| {
            self.holds(kind, &name).await
        })
        .await
    }

    /// One atomic read of a hold hash, its lease zset, the server clock and (for a read-write
    /// lock) its live waiting writers; `None` when the hash is gone. A hash that keeps its
    /// deadlines as field expiry (`~expiry` is `fields`) has them read by a second call, so a
    /// hold that ends between the two shows no lease left.
    async fn holds(&self, kind: HoldKind, name: &[u8]) -> Result<Option<HoldsRead>, Error> {
        let keys = self.keys_of(name, kind.layout().1)?;
        let writers = keys.rw_writers();
        // A semaphore has no waiting writers: its lease zset stands in (same slot, ignored).
        let marks_key = writers.clone().unwrap_or_else(|| keys.sem_leases());
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("HGETALL").arg(&keys.lock);
        pipe.add_command(scored(&keys.sem_leases())).cmd("TIME");
        pipe.add_command(scored(&marks_key));
        type Scored = Vec<(String, f64)>;
        type Reply = (Vec<(Vec<u8>, Vec<u8>)>, Scored, (u64, u64), Scored);
        let (fields, mut deadlines, time, marks): Reply = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(Error::from_reply)?;
        if fields.is_empty() {
            return Ok(None);
        }
        let now_ms = (time.0 * 1000 + time.1 / 1000) as f64;
        let field = |name: &[u8]| fields.iter().find(|(f, _)| f == name).map(|(_, v)| v);
        let expiry = match field(b"~expiry").map(Vec::as_slice) {
            Some(b"fields") => HoldExpiry::FieldExpiry,
            _ => HoldExpiry::LeaseZset,
        };
        if expiry == HoldExpiry::FieldExpiry {
            deadlines = self.field_deadlines(&keys.lock, &fields).await?;
        }
        // Oldest lease first, and holders with the same deadline (to the millisecond) by
        // name: the zset's own order (score, then member), which the hash's field order read
        // with field expiry is not, so a listing reads the same both ways.
        deadlines.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let mut holds = Vec::new();
        for (holder, deadline) in deadlines {
            let Some(value) = field(holder.as_bytes()) else {
                continue;
            };
            // "<permits>:<token>", then ":<label>" when the acquisition was given one (the
            // label may hold colons of its own).
            let value = String::from_utf8_lossy(value);
            let mut parts = value.splitn(3, ':');
            let permits = parts.next().unwrap_or("").parse().unwrap_or(0);
            let token = parts.next().and_then(|t| t.parse().ok());
            let token = token.and_then(FencingToken::new);
            let left = deadline - now_ms;
            holds.push(HoldEntry {
                holder,
                permits,
                held_for: token.and_then(|token| held_for(clock(time), token)),
                token,
                lease_left: Duration::try_from_secs_f64(left / 1000.0)
                    .ok()
                    .filter(|_| left > 0.0),
                client_name: None,
                label: parts.next().map(str::to_owned),
            });
        }
        self.name_rows(&mut holds, |h| {
            (Some(h.holder.as_str()), &mut h.client_name)
        })
        .await?;
        let used = holds
            .iter()
            .filter(|h| h.lease_left.is_some())
            .map(|h| h.permits)
            .fold(0u32, u32::saturating_add);
        let waiting = marks
            .into_iter()
            .filter(|(_, until)| writers.is_some() && *until > now_ms)
            .map(|(holder, _)| holder)
            .collect();
        let limit = field(b"~limit").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
        let read = SemaphoreInfo {
            name: name.to_vec(),
            limit: limit.unwrap_or(0),
            used,
            holds,
            expiry,
        };
        Ok(Some((read, waiting)))
    }

    /// The deadlines (server ms) of the holds among `fields` of a hash (at `key`) that keeps
    /// them as field expiry; a hold gone since is left out.
    async fn field_deadlines(
        &self,
        key: &[u8],
        fields: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<Vec<(String, f64)>, Error> {
        let holders: Vec<String> = fields
            .iter()
            .filter(|(field, _)| !field.starts_with(b"~"))
            .map(|(field, _)| String::from_utf8_lossy(field).into_owned())
            .collect();
        if holders.is_empty() {
            return Ok(Vec::new());
        }
        let mut expiretime = redis::cmd("HPEXPIRETIME");
        expiretime
            .arg(key)
            .arg("FIELDS")
            .arg(holders.len())
            .arg(&holders);
        let at: Vec<i64> = self.query(&expiretime).await?;
        Ok(holders
            .into_iter()
            .zip(at)
            .filter(|(_, at)| *at > 0)
            .map(|(holder, at)| (holder, at as f64))
            .collect())
    }
}
