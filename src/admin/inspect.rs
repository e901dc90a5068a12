//! What is held: every lock under the prefix, and one lock in detail.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;

use super::{display_bytes, format_duration, glob_escape, held_for, Admin};
use crate::protocol::keys::{crc16, validate_name, LockKeys, SLOTS};
use crate::{Error, FencingToken};

/// One held lock, as read from its hash in one atomic step.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock name (arbitrary bytes).
    pub name: Vec<u8>,
    /// The Redis key of the lock hash, which is also the lock's release channel.
    pub key: Vec<u8>,
    /// The holders and their re-entry counts. fencelock writes exactly one; empty when free.
    pub holders: Vec<HolderEntry>,
    /// The current holder's fencing token; `None` when free.
    pub token: Option<FencingToken>,
    /// The remaining lease (or reservation); `None` when free or when the key has no expiry
    /// (which only an operator's command can cause).
    pub ttl: Option<Duration>,
    /// Fair handoff ([`LockClientBuilder::fair_handoff`](crate::LockClientBuilder::fair_handoff)):
    /// the id of the client the lock is reserved for, between a release and that client's
    /// claim (at most the grace, `ttl`). Nobody holds a reserved lock, and nobody but that
    /// client can take it.
    pub reserved_for: Option<String>,
    /// How long the current holder has held the lock, by the server's clock: from its token,
    /// which is at least its issue time in microseconds (exact unless the lock's slot issued
    /// several tokens in one microsecond or its clock stepped back; never the lease, which the
    /// watchdog keeps renewing). `None` when free.
    pub held_for: Option<Duration>,
    /// The label its acquisition was given ([`Lock::with_label`](crate::Lock::with_label): a
    /// request or trace id); `None` when it was given none.
    pub label: Option<String>,
}

/// A holder of a lock: its id (`<client id>:<sequence>`) and how often it entered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderEntry {
    /// The holder id; the part before `:` is the holding client's [`id`](crate::LockClient::id).
    pub id: String,
    /// The re-entry count: 1 after `acquire`, +1 for every live `reenter`.
    pub count: u64,
    /// The name its client registered
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)); `None`
    /// when that client registered none that is still kept.
    pub client_name: Option<String>,
}

impl LockInfo {
    /// Whether anyone holds the lock.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty() || self.token.is_some()
    }

    /// The lock name for display: UTF-8 as is, other bytes escaped.
    pub fn display_name(&self) -> String {
        display_bytes(&self.name)
    }
}

impl fmt::Display for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.display_name())?;
        if let (Some(client), false) = (&self.reserved_for, self.is_held()) {
            write!(f, "  reserved for client {client}")?;
            if let Some(ttl) = self.ttl {
                write!(f, "  grace {}", format_duration(ttl))?;
            }
            return Ok(());
        }
        if !self.is_held() {
            return write!(f, "  free");
        }
        match self.token {
            Some(token) => write!(f, "  token {token}")?,
            None => write!(f, "  no token")?,
        }
        if let Some(held) = self.held_for {
            write!(f, "  held {}", format_duration(held))?;
        }
        match self.ttl {
            Some(ttl) => write!(f, "  lease {}", format_duration(ttl))?,
            None => write!(f, "  no expiry")?,
        }
        for holder in &self.holders {
            write!(f, "  holder {} x{}", holder.id, holder.count)?;
            if let Some(name) = &holder.client_name {
                write!(f, "  client {name}")?;
            }
        }
        if let Some(label) = &self.label {
            write!(f, "  label {label}")?;
        }
        Ok(())
    }
}

/// One lock in detail: its state, its fence counter and who waits for it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockDetail {
    /// The lock hash as read (holders empty when the lock is free).
    pub lock: LockInfo,
    /// The hash bucket (cluster slot) of the name; every lock name in the same bucket shares
    /// one fence counter.
    pub slot: u16,
    /// The key of the fence counter of the bucket.
    pub fence_key: Vec<u8>,
    /// The fence counter: the highest token issued to any lock in the bucket (`None` when no
    /// lock of the bucket was acquired since the counter was lost or deleted). The next token
    /// of this lock is above it.
    pub fence: Option<u64>,
    /// How many connections are subscribed to the lock's release channel (`PUBSUB NUMSUB`):
    /// each is a client with at least one waiting acquirer (its local queue is not visible), or
    /// a `watch`.
    pub subscribers: u64,
}

impl fmt::Display for LockDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lock = &self.lock;
        writeln!(f, "lock        {}", lock.display_name())?;
        writeln!(f, "key         {}", display_bytes(&lock.key))?;
        if lock.is_held() {
            writeln!(f, "state       held")?;
            for holder in &lock.holders {
                writeln!(
                    f,
                    "holder      {} (entry count {})",
                    holder.id, holder.count
                )?;
                if let Some(name) = &holder.client_name {
                    writeln!(f, "client      {name}")?;
                }
            }
            if let Some(label) = &lock.label {
                writeln!(f, "label       {label}")?;
            }
            match lock.token {
                Some(token) => writeln!(f, "token       {token}")?,
                None => writeln!(f, "token       none (the hash has no ~token field)")?,
            }
            if let Some(held) = lock.held_for {
                writeln!(
                    f,
                    "held for    {} (since its token was issued)",
                    format_duration(held)
                )?;
            }
            match lock.ttl {
                Some(ttl) => writeln!(f, "lease left  {}", format_duration(ttl))?,
                None => writeln!(
                    f,
                    "lease left  no expiry (set by hand? it never frees itself)"
                )?,
            }
        } else if let Some(client) = &lock.reserved_for {
            writeln!(f, "state       reserved (fair handoff) for client {client}")?;
            if let Some(ttl) = lock.ttl {
                writeln!(f, "grace left  {}", format_duration(ttl))?;
            }
        } else {
            writeln!(f, "state       free")?;
        }
        match self.fence {
            Some(fence) => writeln!(
                f,
                "fence       {fence} at {} (the highest token issued in bucket {}; shared by \
                 every lock name in that bucket, so it also counts other locks' tokens)",
                display_bytes(&self.fence_key),
                self.slot
            )?,
            None => writeln!(
                f,
                "fence       none at {} (no token issued in bucket {} since the counter was \
                 lost; the next token comes from the server clock)",
                display_bytes(&self.fence_key),
                self.slot
            )?,
        }
        write!(
            f,
            "waiters     {} subscribed connection(s) on the release channel (each is a client \
             with waiting acquirers, or a watch)",
            self.subscribers
        )
    }
}

/// Reads one lock hash and its lease in one atomic step.
pub(super) async fn read_lock(
    conn: &mut MultiplexedConnection,
    name: Vec<u8>,
    key: Vec<u8>,
) -> Result<LockInfo, Error> {
    type Fields = HashMap<Vec<u8>, Vec<u8>>;
    let read: Result<(Fields, i64, (u64, u64)), _> = redis::pipe()
        .atomic()
        .cmd("HGETALL")
        .arg(&key)
        .cmd("PTTL")
        .arg(&key)
        .cmd("TIME")
        .query_async(conn)
        .await;
    let (fields, pttl, (secs, micros)) = match read {
        Ok(read) => read,
        Err(err) => {
            // A failed command inside MULTI comes back as a pipeline failure without the
            // server's code; ask for the type to tell foreign data from anything else.
            let kind: String = redis::cmd("TYPE").arg(&key).query_async(conn).await?;
            if kind != "hash" && kind != "none" {
                return Err(Error::WrongType {
                    detail: format!("lock key holds a {kind}, not a fencelock hash"),
                });
            }
            return Err(Error::from_reply(err));
        }
    };
    let mut holders = Vec::new();
    let mut token = None;
    let mut reserved_for = None;
    let mut label = None;
    for (field, value) in fields {
        let value = String::from_utf8_lossy(&value).into_owned();
        if field == b"~reserved" {
            reserved_for = Some(value);
        } else if field == b"~label" {
            label = Some(value);
        } else if field == b"~token" {
            token = Some(
                value
                    .parse()
                    .ok()
                    .and_then(FencingToken::new)
                    .ok_or_else(|| Error::WrongType {
                        detail: format!("lock hash token is {value:?}, not a token"),
                    })?,
            );
        } else {
            let count = value.parse().map_err(|_| Error::WrongType {
                detail: format!("lock hash count is {value:?}, not a count"),
            })?;
            holders.push(HolderEntry {
                id: String::from_utf8_lossy(&field).into_owned(),
                count,
                client_name: None,
            });
        }
    }
    holders.sort_by(|a, b| a.id.cmp(&b.id));
    let held = !holders.is_empty() || token.is_some() || reserved_for.is_some();
    let now = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros);
    Ok(LockInfo {
        held_for: token
            .filter(|_| !holders.is_empty())
            .and_then(|token| held_for(now, token)),
        name,
        key,
        holders,
        token,
        ttl: held
            .then(|| u64::try_from(pttl).ok().map(Duration::from_millis))
            .flatten(),
        reserved_for,
        label,
    })
}

impl Admin {
    /// Fills in the registered client name of every holder of `locks` (one round trip).
    pub(super) async fn name_holders(&self, locks: &mut [LockInfo]) -> Result<(), Error> {
        let holders = locks.iter().flat_map(|lock| &lock.holders);
        let names = self.client_names(holders.map(|h| h.id.as_str())).await?;
        for holder in locks.iter_mut().flat_map(|lock| &mut lock.holders) {
            holder.client_name = names.of(&holder.id);
        }
        Ok(())
    }
}

/// The name of the lock whose hash is `key`, if `key` is one fencelock would use under
/// `prefix` (checking the tag too, so that a foreign key that merely matches the pattern is
/// not taken for a lock).
pub(super) fn name_from_key(prefix: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    name_laid_out(prefix, key, b"lock:", |prefix, name| {
        LockKeys::new(prefix, name).lock
    })
}

/// The name whose key `layout` puts at `key` (after the slot tag, `marker` then the name), if
/// it does: recomputing the key from the name must give `key` back.
pub(super) fn name_laid_out(
    prefix: &[u8],
    key: &[u8],
    marker: &[u8],
    layout: fn(&[u8], &[u8]) -> Vec<u8>,
) -> Option<Vec<u8>> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(b"{")?;
    let close = rest.iter().position(|b| *b == b'}')?;
    let name = rest[close + 1..].strip_prefix(marker)?;
    (validate_name(name).is_ok() && layout(prefix, name) == key).then(|| name.to_vec())
}

impl Admin {
    /// Every held lock under the prefix (and every lock reserved by fair handoff,
    /// [`LockInfo::reserved_for`]), sorted by name. Uses `SCAN` (never `KEYS`), so it
    /// does not block the server, and reads each lock atomically; a lock released between the
    /// scan and the read is left out.
    ///
    /// # Errors
    /// [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only (`SCAN`, then one `MULTI HGETALL PTTL TIME EXEC` per lock); a
    /// dropped call changes nothing.
    pub async fn locks(&self) -> Result<Vec<LockInfo>, Error> {
        let pattern = [glob_escape(&self.prefix), b"{*}lock:*".to_vec()].concat();
        let keys = self.scan(&pattern, Some("hash"), usize::MAX).await?;
        let mut locks = Vec::new();
        for key in keys {
            let Some(name) = name_from_key(&self.prefix, &key) else {
                continue;
            };
            let lock = read_lock(&mut self.conn.clone(), name, key).await?;
            if lock.is_held() || lock.reserved_for.is_some() {
                locks.push(lock);
            }
        }
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        self.name_holders(&mut locks).await?;
        Ok(locks)
    }

    /// Whether any key exists under the prefix (held locks, fence counters, op records, fenced
    /// resources): tells "nothing is held right now" from "wrong prefix".
    ///
    /// # Errors
    /// [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only (`SCAN`).
    pub async fn prefix_in_use(&self) -> Result<bool, Error> {
        let pattern = [glob_escape(&self.prefix), b"{*}*".to_vec()].concat();
        Ok(!self.scan(&pattern, None, 1).await?.is_empty())
    }

    /// One lock in detail, held or not.
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// let detail = admin.lock("account:42").await?;
    /// if detail.lock.is_held() {
    ///     println!("{detail}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name; [`Error::WrongType`] when the
    /// lock key holds foreign data; [`Error::PermissionDenied`] when the Redis user may not read
    /// it; [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only; a dropped call changes nothing.
    pub async fn lock(&self, name: impl AsRef<[u8]>) -> Result<LockDetail, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        let keys = LockKeys::new(&self.prefix, name);
        let mut conn = self.conn.clone();
        let mut lock = read_lock(&mut conn, name.to_vec(), keys.lock.clone()).await?;
        self.name_holders(std::slice::from_mut(&mut lock)).await?;
        let fence: Option<String> = redis::cmd("GET")
            .arg(&keys.fence)
            .query_async(&mut conn)
            .await
            .map_err(Error::from_reply)?;
        let fence = fence
            .map(|raw| {
                raw.parse::<u64>().map_err(|_| Error::WrongType {
                    detail: format!("fence counter holds {raw:?}, not an integer"),
                })
            })
            .transpose()?;
        let subscribers: HashMap<Vec<u8>, u64> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&keys.lock)
            .query_async(&mut conn)
            .await?;
        Ok(LockDetail {
            subscribers: subscribers.get(&keys.lock).copied().unwrap_or(0),
            slot: crc16(name) % SLOTS as u16,
            fence_key: keys.fence,
            fence,
            lock,
        })
    }
}
