//! What is held: every lock under the prefix, and one lock in detail.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::{clock, display_bytes, format_duration, held_for, item, pttl_left, Admin};
use crate::protocol::keys::{Listing, LockKeys};
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
}

impl fmt::Display for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.display_name())?;
        if let (Some(client), false) = (&self.reserved_for, self.is_held()) {
            write!(f, "  reserved for client {client}")?;
            return item(f, "grace", self.ttl.map(format_duration), "");
        }
        if !self.is_held() {
            return write!(f, "  free");
        }
        item(f, "token", self.token, "no token")?;
        item(f, "held", self.held_for.map(format_duration), "")?;
        item(f, "lease", self.ttl.map(format_duration), "no expiry")?;
        for holder in &self.holders {
            write!(f, "  holder {} x{}", holder.id, holder.count)?;
            item(f, "client", holder.client_name.as_ref(), "")?;
        }
        item(f, "label", self.label.as_ref(), "")
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
        // One line a fact: what it is, then its value in one column.
        let mut lines = vec![
            ("lock", lock.display_name()),
            ("key", display_bytes(&lock.key)),
        ];
        if lock.is_held() {
            lines.push(("state", "held".into()));
            for holder in &lock.holders {
                let entered = format!("{} (entry count {})", holder.id, holder.count);
                lines.push(("holder", entered));
                lines.extend(holder.client_name.clone().map(|name| ("client", name)));
            }
            lines.extend(lock.label.clone().map(|label| ("label", label)));
            let token = lock.token.map(|token| token.to_string());
            let token = token.unwrap_or_else(|| "none (the hash has no ~token field)".into());
            lines.push(("token", token));
            let held = lock.held_for.map(format_duration);
            lines.extend(
                held.map(|held| ("held for", format!("{held} (since its token was issued)"))),
            );
            let left = lock.ttl.map(format_duration);
            let left =
                left.unwrap_or_else(|| "no expiry (set by hand? it never frees itself)".into());
            lines.push(("lease left", left));
        } else if let Some(client) = &lock.reserved_for {
            lines.push((
                "state",
                format!("reserved (fair handoff) for client {client}"),
            ));
            lines.extend(lock.ttl.map(|ttl| ("grace left", format_duration(ttl))));
        } else {
            lines.push(("state", "free".into()));
        }
        let (at, slot) = (display_bytes(&self.fence_key), self.slot);
        let fence = match self.fence {
            Some(fence) => format!(
                "{fence} at {at} (the highest token issued in bucket {slot}; shared by every lock \
                 name in that bucket, so it also counts other locks' tokens)"
            ),
            None => format!(
                "none at {at} (no token issued in bucket {slot} since the counter was lost; the \
                 next token comes from the server clock)"
            ),
        };
        lines.push(("fence", fence));
        let waiters = format!(
            "{} subscribed connection(s) on the release channel (each is a client with waiting \
             acquirers, or a watch)",
            self.subscribers
        );
        lines.push(("waiters", waiters));
        let lines: Vec<String> = lines
            .into_iter()
            .map(|(word, value)| format!("{word:<12}{value}"))
            .collect();
        f.write_str(&lines.join("\n"))
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
    let (fields, pttl, time) = match read {
        Ok(read) => read,
        Err(err) => {
            // A failed command inside MULTI comes back as a pipeline failure without the
            // server's code; ask for the type to tell foreign data from anything else.
            let kind: String = redis::cmd("TYPE").arg(&key).query_async(conn).await?;
            if kind != "hash" && kind != "none" {
                return Err(Error::WrongType {
                    name: display_bytes(&name),
                    detail: format!("lock key holds a {kind}, not a fencelock hash"),
                });
            }
            return Err(Error::from_reply(err).named(&name));
        }
    };
    let mut lock = LockInfo {
        name,
        key,
        holders: Vec::new(),
        token: None,
        ttl: None,
        reserved_for: None,
        held_for: None,
        label: None,
    };
    for (field, value) in fields {
        let value = String::from_utf8_lossy(&value).into_owned();
        let wrong = |what: &str| Error::WrongType {
            name: display_bytes(&lock.name),
            detail: format!("lock hash {what} is {value:?}, not a {what}"),
        };
        match &field[..] {
            b"~reserved" => lock.reserved_for = Some(value),
            b"~label" => lock.label = Some(value),
            b"~token" => {
                let token = value.parse().ok().and_then(FencingToken::new);
                lock.token = Some(token.ok_or_else(|| wrong("token"))?);
            }
            _ => lock.holders.push(HolderEntry {
                id: String::from_utf8_lossy(&field).into_owned(),
                count: value.parse().map_err(|_| wrong("count"))?,
                client_name: None,
            }),
        }
    }
    lock.holders.sort_by(|a, b| a.id.cmp(&b.id));
    if lock.is_held() || lock.reserved_for.is_some() {
        lock.ttl = pttl_left(pttl);
    }
    if !lock.holders.is_empty() {
        lock.held_for = lock.token.and_then(|token| held_for(clock(time), token));
    }
    Ok(lock)
}

impl Admin {
    /// Fills in the registered client name of every holder of `locks` (one round trip).
    pub(super) async fn name_holders(&self, locks: &mut [LockInfo]) -> Result<(), Error> {
        let mut holders: Vec<_> = locks.iter_mut().flat_map(|l| &mut l.holders).collect();
        self.name_rows(&mut holders, |h| (Some(h.id.as_str()), &mut h.client_name))
            .await
    }

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
        let mut locks = self
            .rows(Listing::LOCKS, b"", async |name, key| {
                let lock = read_lock(&mut self.conn.clone(), name, key).await?;
                Ok((lock.is_held() || lock.reserved_for.is_some()).then_some(lock))
            })
            .await?;
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
        Ok(!self.scan(b"", None, 1).await?.is_empty())
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
        let keys = self.keys_of(name, LockKeys::new)?;
        let mut lock = read_lock(&mut self.conn.clone(), name.to_vec(), keys.lock.clone()).await?;
        self.name_holders(std::slice::from_mut(&mut lock)).await?;
        let fence: Option<String> = self.query(redis::cmd("GET").arg(&keys.fence)).await?;
        let fence = fence
            .map(|raw| {
                raw.parse::<u64>().map_err(|_| Error::WrongType {
                    name: display_bytes(name),
                    detail: format!("fence counter holds {raw:?}, not an integer"),
                })
            })
            .transpose()?;
        Ok(LockDetail {
            subscribers: self.subscribers(&keys.lock).await?,
            slot: keys.slot,
            fence_key: keys.fence,
            fence,
            lock,
        })
    }
}
