//! Inspecting and repairing locks as an operator: what the `fencelock` command-line tool runs.
//!
//! [`Admin`] connects to the Redis deployment your services lock on and answers the questions an
//! operator has during an incident: which locks are held, by whom, for how long, with which
//! token ([`Admin::locks`], [`Admin::lock`]); what happens to one lock right now
//! ([`Admin::watch`]); how to get rid of a holder that is stuck ([`Admin::force_release`]); and
//! whether the server is configured so that locks can be trusted at all ([`Admin::doctor`]).
//!
//! The module is always compiled (it needs nothing beyond the lock itself), so a service can run
//! the same checks at start-up or expose them on a debug endpoint. The `cli` feature adds the
//! binary on top of it:
//!
//! ```text
//! cargo run --features cli --bin fencelock -- doctor --url redis://127.0.0.1:7000/
//! ```
//!
//! # The `fencelock` command
//!
//! `fencelock [--url URL | REDIS_URL=URL] [--prefix P] [--json] <command>` with the commands
//! `list`, `show NAME`, `watch NAME [--count N] [--for DURATION]`,
//! `release NAME --force [--yes] [--token T]` and `doctor [--pings N]`. Its exit codes:
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done; `doctor`: every check OK |
//! | 1 | `doctor`: at least one WARN, no FAIL |
//! | 2 | usage: bad arguments, bad lock name, bad prefix or URL |
//! | 3 | Redis cannot be reached, or refused the credentials (`WRONGPASS`, `NOAUTH`) |
//! | 4 | nothing found: no fencelock key under the prefix (`list`), the lock is not held (`show`, `release`) |
//! | 5 | `doctor`: at least one FAIL |
//! | 6 | `release` refused: not confirmed, or the lock changed hands since it was shown |
//! | 7 | any other error (a Redis error reply, foreign data at a lock key) |
//!
//! # How `watch` sees acquisitions
//!
//! Releases are published on the lock's channel (the lock key's own name) by `release.lua`,
//! `cancel.lua` and `force_release.lua`, but acquisitions are not published. [`Watch`] polls the
//! lock hash (one `MULTI HGETALL PTTL EXEC` per interval, 100 ms in the CLI) and reports the
//! differences, and subscribes to the channel on the same connection so that a release is told
//! apart from an expiry and a hold shorter than one interval is still reported. Keyspace
//! notifications would see every change, but they are off by default and switching them on is
//! a server-wide setting that costs every client; an inspection tool should not need it.
//!
//! # What a force release guarantees
//!
//! [`Admin::force_release`] runs `force_release.lua`, which atomically deletes the lock hash,
//! raises the slot's fence counter to at least the evicted holder's token and publishes
//! `force-released` on the lock's channel. So: the lock is free at once and waiters wake up; the
//! next acquisition's token is greater than the evicted one (also if the counter had been lost
//! and the server clock is behind); the evicted holder's own release, extend, re-entry and
//! renewal answer "not held" and cannot touch the next holder's lock; its watchdog marks it
//! lost at its next renewal. It does **not** fence storage by itself: a
//! [`FencedResource`](crate::FencedResource) refuses the evicted holder's token once the next
//! holder has claimed or written it with its higher token, exactly as after an expiry. Between
//! the force release and that first claim, a write with the old token is still accepted.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, IntoConnectionInfo, ProtocolVersion, PushKind, Value};
use tokio::sync::mpsc;

use crate::base::config::DEFAULT_PREFIX;
use crate::base::error::Failure;
use crate::protocol::keys::{crc16, validate_name, validate_prefix, LockKeys, SLOTS};
use crate::protocol::server::EvictionRisk;
use crate::protocol::{self, ForceReleaseReply, ReleaseMessage};
use crate::{Error, FencingToken};

/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one command may take; generous, since `SCAN` of a large keyspace is paged anyway.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys asked for per `SCAN` page.
const SCAN_PAGE: usize = 1000;

/// An operator's connection to the Redis deployment the locks live on.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use fencelock::admin::Admin;
///
/// let admin = Admin::connect("redis://127.0.0.1:7000/").await?;
/// for lock in admin.locks().await? {
///     println!("{lock}");
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Admin {
    client: redis::Client,
    conn: MultiplexedConnection,
    prefix: Vec<u8>,
    /// Whether the server accepted `HELLO 3`; without it only the doctor is of use.
    resp3: bool,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
}

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
}

/// A holder of a lock: its id (`<client id>:<sequence>`) and how often it entered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderEntry {
    /// The holder id; the part before `:` is the holding client's [`id`](crate::LockClient::id).
    pub id: String,
    /// The re-entry count: 1 after `acquire`, +1 for every live `reenter`.
    pub count: u64,
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
        match self.ttl {
            Some(ttl) => write!(f, "  lease {}", format_duration(ttl))?,
            None => write!(f, "  no expiry")?,
        }
        for holder in &self.holders {
            write!(f, "  holder {} x{}", holder.id, holder.count)?;
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
            }
            match lock.token {
                Some(token) => writeln!(f, "token       {token}")?,
                None => writeln!(f, "token       none (the hash has no ~token field)")?,
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

/// What [`Admin::force_release`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForceRelease {
    /// The holder was evicted: the hash is gone, waiters were woken.
    Evicted {
        /// The evicted holder's id and re-entry count.
        holder: HolderEntry,
        /// The evicted holder's token.
        token: Option<FencingToken>,
        /// The bucket's fence counter afterwards; the next token is greater.
        fence: u64,
    },
    /// Nobody held the lock; nothing changed.
    NotHeld,
    /// The lock is held with another token than the expected one (it changed hands); nothing
    /// changed.
    OtherToken {
        /// The token it is held with now.
        token: Option<FencingToken>,
    },
}

impl Admin {
    /// Connects under the default prefix `fencelock:`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an unusable URL; [`Error::Redis`] when the server cannot be
    /// reached or refuses the credentials.
    pub async fn connect(url: &str) -> Result<Admin, Error> {
        Admin::connect_with_prefix(url, DEFAULT_PREFIX).await
    }

    /// Connects under `prefix`, the key prefix the services were configured with
    /// ([`LockClientBuilder::prefix`](crate::LockClientBuilder::prefix)).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fencelock::Error> {
    /// let admin = fencelock::admin::Admin::connect_with_prefix("redis://127.0.0.1:7000/", "billing:").await?;
    /// assert_eq!(admin.prefix(), b"billing:");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Admin::connect`], and [`Error::InvalidConfig`] for a prefix with braces or longer
    /// than 256 bytes.
    pub async fn connect_with_prefix(url: &str, prefix: impl AsRef<[u8]>) -> Result<Admin, Error> {
        let prefix = prefix.as_ref().to_vec();
        validate_prefix(&prefix)?;
        let info = url
            .into_connection_info()
            .map_err(|err| Error::InvalidConfig {
                reason: format!("bad redis URL: {err}"),
            })?;
        // RESP3 so that a watch can take release messages on the connection it polls with.
        let with = |protocol| {
            let settings = info.redis_settings().clone().set_protocol(protocol);
            redis::Client::open(info.clone().set_redis_settings(settings))
        };
        let client = with(ProtocolVersion::RESP3)?;
        match client
            .get_multiplexed_async_connection_with_config(&connection_config())
            .await
        {
            Ok(conn) => Ok(Admin {
                client,
                conn,
                prefix,
                resp3: true,
            }),
            // A server without HELLO (Redis < 6, or the command renamed away) cannot serve
            // LockClient, but the doctor should still get in and say so.
            Err(err) if refuses_hello(&err) => {
                let client = with(ProtocolVersion::RESP2)?;
                let conn = client
                    .get_multiplexed_async_connection_with_config(&connection_config())
                    .await?;
                Ok(Admin {
                    client,
                    conn,
                    prefix,
                    resp3: false,
                })
            }
            Err(err) => Err(err.into()),
        }
    }

    /// The key prefix this connection inspects.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Every held lock under the prefix (and every lock reserved by fair handoff,
    /// [`LockInfo::reserved_for`]), sorted by name. Uses `SCAN` (never `KEYS`), so it
    /// does not block the server, and reads each lock atomically; a lock released between the
    /// scan and the read is left out.
    ///
    /// # Errors
    /// [`Error::Redis`] when the connection fails.
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
        Ok(locks)
    }

    /// Whether any key exists under the prefix (held locks, fence counters, op records, fenced
    /// resources): tells "nothing is held right now" from "wrong prefix".
    ///
    /// # Errors
    /// [`Error::Redis`] when the connection fails.
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
    pub async fn lock(&self, name: impl AsRef<[u8]>) -> Result<LockDetail, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        let keys = LockKeys::new(&self.prefix, name);
        let mut conn = self.conn.clone();
        let lock = read_lock(&mut conn, name.to_vec(), keys.lock.clone()).await?;
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

    /// Evicts the holder of lock `name`: deletes the lock hash, raises the bucket's fence counter
    /// to at least the evicted token and wakes the waiters, in one script
    /// (`lua/force_release.lua`). With `expected`, only a holder with that token is evicted, so
    /// a lock that changed hands since it was looked at is left alone. See the
    /// [module documentation](self#what-a-force-release-guarantees) for what this guarantees
    /// about fenced writes of the evicted holder.
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// use fencelock::admin::ForceRelease;
    ///
    /// let seen = admin.lock("account:42").await?;
    /// if let Some(token) = seen.lock.token {
    ///     match admin.force_release("account:42", Some(token)).await? {
    ///         ForceRelease::Evicted { fence, .. } => println!("evicted; next token > {fence}"),
    ///         other => println!("nothing done: {other:?}"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::WrongType`] when the lock key or the fence counter holds
    /// foreign data (nothing is changed); [`Error::Redis`] when the connection fails (the script
    /// may or may not have run; look again with [`Admin::lock`]).
    pub async fn force_release(
        &self,
        name: impl AsRef<[u8]>,
        expected: Option<FencingToken>,
    ) -> Result<ForceRelease, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        let keys = LockKeys::new(&self.prefix, name);
        let reply = protocol::force_release(&mut self.conn.clone(), &keys, expected).await?;
        Ok(match reply {
            ForceReleaseReply::Evicted {
                token,
                fence,
                holder,
                count,
            } => ForceRelease::Evicted {
                holder: HolderEntry {
                    id: String::from_utf8_lossy(&holder).into_owned(),
                    count,
                },
                token,
                fence,
            },
            ForceReleaseReply::NotHeld => ForceRelease::NotHeld,
            ForceReleaseReply::OtherToken { token } => ForceRelease::OtherToken { token },
        })
    }

    /// Follows lock `name`: acquisitions, re-entries, releases, expiries. Polls the lock every
    /// `interval` (and at once when a release is published); see the
    /// [module documentation](self#how-watch-sees-acquisitions).
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// let mut watch = admin.watch("account:42", std::time::Duration::from_millis(100)).await?;
    /// println!("now: {}", watch.current());
    /// loop {
    ///     println!("{}", watch.next().await?);
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::InvalidConfig`] for a zero interval; [`Error::Redis`]
    /// when the second connection (the watch's own) cannot be opened.
    pub async fn watch(&self, name: impl AsRef<[u8]>, interval: Duration) -> Result<Watch, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        if !self.resp3 {
            return Err(Error::InvalidConfig {
                reason: "watch needs RESP3 (HELLO 3), which this server refused".into(),
            });
        }
        if interval.is_zero() {
            return Err(Error::InvalidConfig {
                reason: "the watch interval must be above zero".into(),
            });
        }
        let keys = LockKeys::new(&self.prefix, name);
        let (sender, pushes) = mpsc::unbounded_channel();
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(
                &connection_config().set_push_sender(sender),
            )
            .await?;
        // Subscribed before the first read: a release after that read is then always seen.
        conn.subscribe(&keys.lock).await?;
        let current = read_lock(&mut conn, name.to_vec(), keys.lock.clone()).await?;
        Ok(Watch {
            conn,
            name: name.to_vec(),
            key: keys.lock,
            pushes,
            releases: VecDeque::new(),
            current,
            pending: VecDeque::new(),
            interval,
        })
    }

    /// Checks the server for the settings that break locks; `pings` round trips measure the
    /// latency (at least 1). Every check gives OK, WARN or FAIL with what to change; a check
    /// that cannot read its setting (a renamed `CONFIG`, an ACL) is a WARN saying so.
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// use fencelock::admin::Status;
    ///
    /// let checks = admin.doctor(10).await?;
    /// for check in &checks {
    ///     println!("{check}");
    /// }
    /// let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    /// assert!(worst <= Status::Fail);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Redis`] only when the connection fails; refused or unknown commands become
    /// WARN findings.
    pub async fn doctor(&self, pings: usize) -> Result<Vec<Check>, Error> {
        let mut conn = self.conn.clone();
        let mut checks = Vec::new();
        checks.push(settle(check_version(&mut conn).await, "version")?);
        checks.push(if self.resp3 {
            Check::ok(
                "protocol",
                "RESP3 (HELLO 3): waiters get release messages as push messages",
            )
        } else {
            Check::bad(
                "protocol",
                Status::Fail,
                "the server refused HELLO 3: LockClient needs RESP3 and cannot connect",
                "use redis 6.2 or newer and do not rename or deny HELLO",
            )
        });
        checks.push(settle(check_eviction(&mut conn).await, "maxmemory-policy")?);
        checks.push(settle(check_persistence(&mut conn).await, "persistence")?);
        checks.push(settle(check_replication(&mut conn).await, "replication")?);
        checks.push(settle(check_cluster(&mut conn).await, "cluster")?);
        checks.push(settle(
            check_latency(&mut conn, pings.max(1)).await,
            "latency",
        )?);
        checks.push(settle(check_clock(&mut conn).await, "clock")?);
        Ok(checks)
    }

    /// Keys matching `pattern` (deduplicated: SCAN may return a key twice), of `kind` if
    /// given, stopping once `limit` are found.
    async fn scan(
        &self,
        pattern: &[u8],
        kind: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let mut conn = self.conn.clone();
        let mut found = BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_PAGE);
            if let Some(kind) = kind {
                cmd.arg("TYPE").arg(kind);
            }
            let (next, keys): (u64, Vec<Vec<u8>>) = cmd.query_async(&mut conn).await?;
            found.extend(keys);
            cursor = next;
            if cursor == 0 || found.len() >= limit {
                return Ok(found.into_iter().collect());
            }
        }
    }
}

/// The server does not know `HELLO` (`ERR unknown command 'HELLO'`, also when renamed away).
/// Not `NOAUTH` ("HELLO must be called with the client already authenticated"): that is a
/// missing password, and RESP2 would only hide it.
fn refuses_hello(err: &redis::RedisError) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    !err.is_io_error()
        && !err.is_timeout()
        && err.kind() != redis::ErrorKind::AuthenticationFailed
        && text.contains("unknown command")
        && text.contains("hello")
}

fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
}

/// Reads one lock hash and its lease in one atomic step.
async fn read_lock(
    conn: &mut MultiplexedConnection,
    name: Vec<u8>,
    key: Vec<u8>,
) -> Result<LockInfo, Error> {
    type Fields = HashMap<Vec<u8>, Vec<u8>>;
    let read: Result<(Fields, i64), _> = redis::pipe()
        .atomic()
        .cmd("HGETALL")
        .arg(&key)
        .cmd("PTTL")
        .arg(&key)
        .query_async(conn)
        .await;
    let (fields, pttl) = match read {
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
    for (field, value) in fields {
        let value = String::from_utf8_lossy(&value).into_owned();
        if field == b"~reserved" {
            reserved_for = Some(value);
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
            });
        }
    }
    holders.sort_by(|a, b| a.id.cmp(&b.id));
    let held = !holders.is_empty() || token.is_some() || reserved_for.is_some();
    Ok(LockInfo {
        name,
        key,
        holders,
        token,
        ttl: held
            .then(|| u64::try_from(pttl).ok().map(Duration::from_millis))
            .flatten(),
        reserved_for,
    })
}

/// The name of the lock whose hash is `key`, if `key` is one fencelock would use under
/// `prefix` (checking the tag too, so that a foreign key that merely matches the pattern is
/// not taken for a lock).
fn name_from_key(prefix: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(b"{")?;
    let close = rest.iter().position(|b| *b == b'}')?;
    let name = rest[close + 1..].strip_prefix(b"lock:")?;
    (validate_name(name).is_ok() && LockKeys::new(prefix, name).lock == key).then(|| name.to_vec())
}

/// Escapes the glob metacharacters of Redis' MATCH, so a prefix is matched literally.
fn glob_escape(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    for &b in raw {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// Bytes for humans: UTF-8 as is (control characters escaped), anything else as `\xNN`.
pub(crate) fn display_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// `1.234s`, `250ms`, `2m05s`: a lease for humans.
fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}.{:03}s", ms / 1000, ms % 1000)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

// ---------------------------------------------------------------------------------------------
// watch

/// A live view of one lock, from [`Admin::watch`]. Dropping it closes its connection.
#[derive(Debug)]
pub struct Watch {
    conn: MultiplexedConnection,
    name: Vec<u8>,
    key: Vec<u8>,
    pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    /// Release messages not yet matched with a disappearance, in arrival order.
    releases: VecDeque<ReleaseKind>,
    current: LockInfo,
    pending: VecDeque<LockEvent>,
    interval: Duration,
}

/// How a hold ended, as the lock's channel told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReleaseKind {
    Released,
    Forced,
}

/// One change of a watched lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// A new holder took the lock.
    Acquired {
        /// The new holder.
        holder: HolderEntry,
        /// Its token.
        token: Option<FencingToken>,
    },
    /// The holder entered again (`reenter`); `holder.count` is the new count.
    Reentered {
        /// The holder with its new count.
        holder: HolderEntry,
    },
    /// The holder left one level but still holds; `holder.count` is the new count.
    Exited {
        /// The holder with its new count.
        holder: HolderEntry,
    },
    /// The lock was released (a release message was published). `holder` is `None` for a hold
    /// that began and ended between two polls, which only its message revealed.
    Released {
        /// The holder that released, if it was seen.
        holder: Option<HolderEntry>,
        /// Its token, if it was seen.
        token: Option<FencingToken>,
    },
    /// An operator force-released the lock (`force_release.lua`).
    ForceReleased {
        /// The evicted holder, if it was seen.
        holder: Option<HolderEntry>,
        /// Its token, if it was seen.
        token: Option<FencingToken>,
    },
    /// The hold ended without a release message: the lease ran out, or the key was deleted or
    /// evicted behind fencelock's back.
    Expired {
        /// The holder whose hold ended.
        holder: HolderEntry,
        /// Its token.
        token: Option<FencingToken>,
    },
}

impl fmt::Display for LockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn token(t: &Option<FencingToken>) -> String {
            t.map_or_else(|| "?".into(), |t| t.to_string())
        }
        match self {
            LockEvent::Acquired { holder, token: t } => write!(
                f,
                "acquired holder={} token={} count={}",
                holder.id,
                token(t),
                holder.count
            ),
            LockEvent::Reentered { holder } => {
                write!(f, "reentered holder={} count={}", holder.id, holder.count)
            }
            LockEvent::Exited { holder } => {
                write!(f, "exited holder={} count={}", holder.id, holder.count)
            }
            LockEvent::Released {
                holder: Some(holder),
                token: t,
            } => write!(f, "released holder={} token={}", holder.id, token(t)),
            LockEvent::Released { holder: None, .. } => {
                write!(
                    f,
                    "released holder=? (a hold shorter than one poll interval)"
                )
            }
            LockEvent::ForceReleased {
                holder: Some(holder),
                token: t,
            } => write!(f, "force-released holder={} token={}", holder.id, token(t)),
            LockEvent::ForceReleased { holder: None, .. } => {
                write!(
                    f,
                    "force-released holder=? (a hold shorter than one poll interval)"
                )
            }
            LockEvent::Expired { holder, token: t } => write!(
                f,
                "expired holder={} token={} (lease ran out, or the key was deleted)",
                holder.id,
                token(t)
            ),
        }
    }
}

impl Watch {
    /// The lock's state as of the last poll.
    pub fn current(&self) -> &LockInfo {
        &self.current
    }

    /// The watched lock's name.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Waits for the next change.
    ///
    /// # Errors
    /// [`Error::Redis`] when the watch's connection fails (it does not reconnect: a watch that
    /// missed time would report made-up events); [`Error::WrongType`] when the key is replaced
    /// by foreign data.
    ///
    /// # Cancel safety
    /// Cancel safe: an event found by a poll is queued before the next await point.
    pub async fn next(&mut self) -> Result<LockEvent, Error> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            let due = tokio::select! {
                () = tokio::time::sleep(self.interval) => true,
                push = self.pushes.recv() => match push {
                    Some(push) => self.take_push(push)?,
                    None => return Err(disconnected()),
                },
            };
            if due {
                self.poll().await?;
            }
        }
    }

    /// Records a release message; `true` when it was one (a reason to look at the lock now),
    /// `false` for the other pushes (subscription confirmations).
    fn take_push(&mut self, push: redis::PushInfo) -> Result<bool, Error> {
        match push.kind {
            PushKind::Message => {
                let message = match push.data.get(1) {
                    Some(Value::BulkString(payload)) => ReleaseMessage::parse(payload),
                    _ => ReleaseMessage::Released,
                };
                self.releases.push_back(match message {
                    ReleaseMessage::ForceReleased => ReleaseKind::Forced,
                    ReleaseMessage::Released => ReleaseKind::Released,
                });
                Ok(true)
            }
            PushKind::Disconnection => Err(disconnected()),
            _ => Ok(false),
        }
    }

    async fn poll(&mut self) -> Result<(), Error> {
        let next = read_lock(&mut self.conn, self.name.clone(), self.key.clone()).await?;
        // Replies and pushes share the connection in server order, so a release published
        // before this read is in the channel by now.
        while let Ok(push) = self.pushes.try_recv() {
            self.take_push(push)?;
        }
        let before = std::mem::replace(&mut self.current, next);
        let after = &self.current;
        let same_hold = match (before.holders.first(), after.holders.first()) {
            (Some(a), Some(b)) => a.id == b.id && before.token == after.token,
            _ => false,
        };
        if same_hold {
            let (a, b) = (&before.holders[0], &after.holders[0]);
            if b.count > a.count {
                self.pending
                    .push_back(LockEvent::Reentered { holder: b.clone() });
            } else if b.count < a.count {
                self.pending
                    .push_back(LockEvent::Exited { holder: b.clone() });
            }
            return Ok(());
        }
        if let Some(holder) = before.holders.first().cloned() {
            let token = before.token;
            self.pending.push_back(match self.releases.pop_front() {
                Some(ReleaseKind::Released) => LockEvent::Released {
                    holder: Some(holder),
                    token,
                },
                Some(ReleaseKind::Forced) => LockEvent::ForceReleased {
                    holder: Some(holder),
                    token,
                },
                None => LockEvent::Expired { holder, token },
            });
        }
        // While someone holds, a leftover message may be the current holder's release that came
        // in just after the read; only a free lock proves the leftovers were unseen holds.
        if after.holders.is_empty() {
            for kind in self.releases.drain(..) {
                self.pending.push_back(match kind {
                    ReleaseKind::Released => LockEvent::Released {
                        holder: None,
                        token: None,
                    },
                    ReleaseKind::Forced => LockEvent::ForceReleased {
                        holder: None,
                        token: None,
                    },
                });
            }
        }
        if let Some(holder) = after.holders.first() {
            self.pending.push_back(LockEvent::Acquired {
                holder: holder.clone(),
                token: after.token,
            });
        }
        Ok(())
    }
}

fn disconnected() -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the watch's connection to redis was closed",
    )))
}

// ---------------------------------------------------------------------------------------------
// doctor

/// The verdict of one [`Check`], ordered from good to bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// Nothing to change.
    Ok,
    /// A setting that can break a guarantee under some fault; the check says which and what to
    /// change.
    Warn,
    /// A setting under which locks do not work or are not safe at all.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        })
    }
}

/// One finding of [`Admin::doctor`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked: `version`, `protocol`, `maxmemory-policy`, `persistence`,
    /// `replication`, `cluster`, `latency`, `clock`.
    pub name: &'static str,
    /// The verdict.
    pub status: Status,
    /// What was found.
    pub finding: String,
    /// What to change, when the status is not OK.
    pub fix: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4} {:<16} {}", self.status, self.name, self.finding)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n     {:<16} fix: {fix}", "")?;
        }
        Ok(())
    }
}

impl Check {
    fn ok(name: &'static str, finding: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            finding: finding.into(),
            fix: None,
        }
    }

    fn bad(
        name: &'static str,
        status: Status,
        finding: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            name,
            status,
            finding: finding.into(),
            fix: Some(fix.into()),
        }
    }
}

/// A check whose command failed: a broken connection is the caller's error, anything else (a
/// refused or renamed command) is a WARN that says the setting could not be checked.
fn settle(outcome: Result<Check, redis::RedisError>, name: &'static str) -> Result<Check, Error> {
    match outcome {
        Ok(check) => Ok(check),
        Err(err) if Failure::of(&err) == Failure::ConnectionLost => Err(Error::Redis(err)),
        Err(err) => Ok(Check::bad(
            name,
            Status::Warn,
            format!(
                "could not be checked: {}",
                err.to_string().replace('\n', " ")
            ),
            "run the doctor as a user allowed CONFIG GET, INFO, PING and TIME",
        )),
    }
}

async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> Result<HashMap<String, String>, redis::RedisError> {
    let text: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

async fn config(
    conn: &mut MultiplexedConnection,
    key: &str,
) -> Result<Option<String>, redis::RedisError> {
    let reply: HashMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(key)
        .query_async(conn)
        .await?;
    Ok(reply.get(key).cloned())
}

async fn check_version(conn: &mut MultiplexedConnection) -> Result<Check, redis::RedisError> {
    const NAME: &str = "version";
    let server = info(conn, "server").await?;
    let version = server
        .get("redis_version")
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let parts: Vec<u64> = version
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .chain(std::iter::repeat(0))
        .take(2)
        .collect();
    let (major, minor) = (parts[0], parts[1]);
    Ok(if (major, minor) < (6, 2) {
        Check::bad(
            NAME,
            Status::Fail,
            format!("redis {version}: fencelock needs 6.2 or newer (RESP3 push messages for waiting, the script commands it uses)"),
            "upgrade redis to 7.x",
        )
    } else if major < 7 {
        Check::bad(
            NAME,
            Status::Warn,
            format!("redis {version}: works, but fencelock is tested on 7.x, and Redis Cluster support will need 7 (sharded pub/sub)"),
            "upgrade redis to 7.x",
        )
    } else {
        Check::ok(NAME, format!("redis {version}"))
    })
}

async fn check_eviction(conn: &mut MultiplexedConnection) -> Result<Check, redis::RedisError> {
    const NAME: &str = "maxmemory-policy";
    let policy = config(conn, "maxmemory-policy")
        .await?
        .unwrap_or_else(|| "noeviction".into());
    let maxmemory: u64 = config(conn, "maxmemory")
        .await?
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let limit = if maxmemory == 0 {
        "no maxmemory is set now, but the policy applies as soon as one is".to_owned()
    } else {
        format!("maxmemory is {maxmemory} bytes")
    };
    Ok(match EvictionRisk::of(&policy) {
        None => Check::ok(
            NAME,
            "noeviction: locks and fence counters are never evicted",
        ),
        Some(risk) => Check::bad(
            NAME,
            if maxmemory == 0 || !risk.evicts_counters {
                Status::Warn
            } else {
                Status::Fail
            },
            format!("{policy} {} ({limit})", risk.evicts()),
            EvictionRisk::FIX,
        ),
    })
}

async fn check_persistence(conn: &mut MultiplexedConnection) -> Result<Check, redis::RedisError> {
    const NAME: &str = "persistence";
    let aof = config(conn, "appendonly").await?.unwrap_or_default();
    let fsync = config(conn, "appendfsync").await?.unwrap_or_default();
    let save = config(conn, "save").await?.unwrap_or_default();
    let fix = "CONFIG SET appendonly yes and appendfsync everysec or always (and in redis.conf)";
    Ok(if aof == "yes" && fsync != "no" {
        Check::ok(
            NAME,
            format!("append-only file on (appendfsync {fsync}): fence counters survive restarts"),
        )
    } else if aof == "yes" {
        Check::bad(
            NAME,
            Status::Warn,
            "append-only file on but appendfsync no: a crash can lose recent fence counter updates; tokens then stay increasing only through the server clock floor",
            fix,
        )
    } else if !save.trim().is_empty() {
        Check::bad(
            NAME,
            Status::Warn,
            format!("RDB snapshots only (save {save:?}): a restart rolls fence counters back to the last snapshot and tokens stay increasing only through the server clock floor"),
            fix,
        )
    } else {
        Check::bad(
            NAME,
            Status::Warn,
            "no persistence: a restart forgets held locks and fence counters; tokens stay increasing only through the server clock floor",
            fix,
        )
    })
}

async fn check_replication(conn: &mut MultiplexedConnection) -> Result<Check, redis::RedisError> {
    const NAME: &str = "replication";
    let replication = info(conn, "replication").await?;
    let role = replication.get("role").cloned().unwrap_or_default();
    if role == "slave" || role == "replica" {
        let primary = format!(
            "{}:{}",
            replication.get("master_host").map_or("?", String::as_str),
            replication.get("master_port").map_or("?", String::as_str)
        );
        return Ok(Check::bad(
            NAME,
            Status::Fail,
            format!("this server is a replica of {primary}: lock scripts write, so they fail with READONLY here"),
            "point the services and --url at the primary",
        ));
    }
    let replicas: u64 = replication
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let min_replicas: u64 = config(conn, "min-replicas-to-write")
        .await?
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Ok(if replicas == 0 {
        Check::ok(
            NAME,
            "primary without replicas: no failover can lose an acquisition",
        )
    } else if min_replicas == 0 {
        Check::bad(
            NAME,
            Status::Warn,
            format!("primary with {replicas} replica(s), asynchronous: a failover can lose recent acquisitions and let a second holder in (fenced storage still refuses the old one)"),
            "CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 10, so the primary refuses writes no replica follows (narrows the window; it is not consensus)",
        )
    } else {
        Check::ok(
            NAME,
            format!("primary with {replicas} replica(s), min-replicas-to-write {min_replicas}"),
        )
    })
}

async fn check_cluster(conn: &mut MultiplexedConnection) -> Result<Check, redis::RedisError> {
    const NAME: &str = "cluster";
    let cluster = info(conn, "cluster").await?;
    Ok(
        if cluster.get("cluster_enabled").map(String::as_str) == Some("1") {
            Check::bad(
                NAME,
                Status::Warn,
                "cluster mode is enabled: a client built with a plain URL gets MOVED for most locks, and this tool's list/show/watch/release see this node's slots only",
                "connect lock clients with LockClient::cluster_builder(nodes); run this tool against the node that owns a lock's slot",
            )
        } else {
            Check::ok(NAME, "standalone (cluster mode disabled)")
        },
    )
}

async fn check_latency(
    conn: &mut MultiplexedConnection,
    pings: usize,
) -> Result<Check, redis::RedisError> {
    const NAME: &str = "latency";
    // Above this a lock operation eats a tenth of the client's 1 s response timeout.
    const SLOW: Duration = Duration::from_millis(100);
    let mut samples = Vec::with_capacity(pings);
    for _ in 0..pings {
        let start = Instant::now();
        redis::cmd("PING").query_async::<()>(conn).await?;
        samples.push(start.elapsed());
    }
    samples.sort();
    let median = samples[samples.len() / 2];
    let finding = format!(
        "median round trip {:.3} ms over {pings} PINGs (max {:.3} ms)",
        median.as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3
    );
    Ok(if median > SLOW {
        Check::bad(
            NAME,
            Status::Warn,
            finding,
            "every acquire and release is a round trip and the client gives up after 1 s: move the services closer to redis, or raise response_timeout and the lease",
        )
    } else {
        Check::ok(NAME, finding)
    })
}

async fn check_clock(conn: &mut MultiplexedConnection) -> Result<Check, redis::RedisError> {
    const NAME: &str = "clock";
    // More than this apart means one of the two machines is not synchronised.
    const DRIFT: Duration = Duration::from_secs(1);
    const SAMPLES: usize = 5;
    // The sample with the shortest round trip bounds the error best.
    let mut best: Option<(Duration, f64)> = None;
    for _ in 0..SAMPLES {
        let sent = SystemTime::now();
        let start = Instant::now();
        let (secs, micros): (String, String) = redis::cmd("TIME").query_async(conn).await?;
        let rtt = start.elapsed();
        let server =
            secs.parse::<f64>().unwrap_or(0.0) + micros.parse::<f64>().unwrap_or(0.0) / 1e6;
        let local = sent.duration_since(UNIX_EPOCH).unwrap_or_default() + rtt / 2;
        let offset = server - local.as_secs_f64();
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    let (rtt, offset) = best.unwrap_or_default();
    let finding = format!(
        "server clock is {:+.3} ms from this machine's (± {:.3} ms)",
        offset * 1e3,
        rtt.as_secs_f64() * 1e3 / 2.0
    );
    Ok(if offset.abs() > DRIFT.as_secs_f64() {
        Check::bad(
            NAME,
            Status::Warn,
            finding,
            "run NTP (chrony, systemd-timesyncd) on both machines: the token's clock floor assumes server clocks do not step back, and leases run on the server's clock",
        )
    } else {
        Check::ok(NAME, finding)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_back_from_keys_and_foreign_keys_are_skipped() {
        for name in [&b"orders"[..], b"a}lock:b", b"{x}", b"caf\xc3\xa9", b"\xff"] {
            let key = LockKeys::new(b"p:", name).lock;
            assert_eq!(name_from_key(b"p:", &key).as_deref(), Some(name));
        }
        assert_eq!(name_from_key(b"p:", b"p:{zz}lock:orders"), None);
        assert_eq!(name_from_key(b"q:", &LockKeys::new(b"p:", b"x").lock), None);
        assert_eq!(
            name_from_key(b"p:", &LockKeys::new(b"p:", b"x").fence),
            None
        );
    }

    #[test]
    fn prefixes_are_matched_literally() {
        assert_eq!(glob_escape(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\".to_vec());
    }

    #[test]
    fn bytes_are_displayed_readably() {
        assert_eq!(display_bytes(b"caf\xc3\xa9"), "café");
        assert_eq!(display_bytes(b"a\nb\xff"), "a\\nb\\xff");
    }
}
