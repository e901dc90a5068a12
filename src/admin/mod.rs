//! Inspecting and repairing locks as an operator: what the `fencelock` command-line tool runs.
//!
//! [`Admin`] connects to the Redis deployment your services lock on and answers the questions an
//! operator has during an incident: which locks are held, by whom, for how long, with which
//! token ([`Admin::locks`], [`Admin::lock`]); who leads each election ([`Admin::elections`]);
//! what each scheduled job did last ([`Admin::jobs`]); what each idempotency key holds
//! ([`Admin::idempotency_keys`], [`Admin::idempotency_key`]) and how to let one run again
//! ([`Admin::forget_idempotency_key`]); who holds the permits of each semaphore
//! and the shares of each read-write lock ([`Admin::semaphores`], [`Admin::rwlocks`]), how to
//! release one stuck hold ([`Admin::release_hold`]) or change a semaphore's limit
//! ([`Admin::set_semaphore_limit`]); what happens to one lock right now
//! ([`Admin::watch`]); how to get rid of a holder that is stuck ([`Admin::force_release`]); and
//! whether the server is configured so that locks can be trusted at all ([`Admin::doctor`]).
//!
//! The module is always compiled (it needs nothing beyond the lock itself), so a service can run
//! the same checks at start-up or expose them on a debug endpoint. The `fencelock` binary of
//! the `fencelock-cli` crate is a thin shell over it:
//!
//! ```text
//! cargo run -p fencelock-cli -- doctor --url redis://127.0.0.1:7000/
//! ```
//!
//! # The `fencelock` command
//!
//! `fencelock [--url URL | REDIS_URL=URL] [--prefix P] [--json] <command>` with the commands
//! `list`, `elections`, `jobs`, `semaphores`, `rwlocks`, `set-limit NAME N`, `show NAME`,
//! `watch NAME [--count N] [--for DURATION]`, `release NAME --force [--yes] [--token T]`,
//! `release NAME --force (--semaphore | --rwlock) --holder ID [--yes]`, `keys [NAMESPACE]`,
//! `key NAMESPACE KEY`, `forget NAMESPACE KEY [--yes]`, `waits [--deadlock-after DURATION]` and
//! `doctor [--pings N] [--strict] [--max-hold DURATION] [--deadlock-after DURATION]`; `list`
//! takes `--held-longer DURATION`. `waits` reports a wait-for cycle, and the doctor fails on
//! one, only once every wait in it has lasted `--deadlock-after` (30 s by default for both).
//! Its exit codes:
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done: an empty `list` and a free lock's `show` are answers too; `doctor`: no FAIL |
//! | 1 | `doctor --strict`: at least one WARN, no FAIL |
//! | 2 | usage: bad arguments, bad lock name, bad prefix or URL (the message says what is wrong) |
//! | 3 | Redis cannot be reached, refused the credentials (`WRONGPASS`, `NOAUTH`), or the user may not read the keys under the prefix (the message names the ACL rule to add) |
//! | 4 | `release`: the lock is not held, nothing to release; `key`, `forget`: the key has no record |
//! | 5 | `doctor`: at least one FAIL: a setting under which locks are not safe; with `--max-hold`, a hold older than that |
//! | 6 | `release` refused: not confirmed, or the lock changed hands since it was shown; `forget` refused: not confirmed, or a run holds the key |
//! | 7 | any other error (a Redis error reply, foreign data at a lock key) |
//!
//! The doctor separates FAIL (locks break: an evicting `maxmemory-policy` with a `maxmemory`
//! set, a replica instead of the primary, a cluster that is not ok, a server too old for the
//! scripts) from WARN (a guarantee is weaker: no persistence, asynchronous replicas, an
//! evicting policy that no `maxmemory` makes effective yet, latency, clock offset, a server
//! older than the tested releases).
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

mod doctor;
mod elections;
mod force;
mod holds;
mod inspect;
mod jobs;
mod keys;
mod names;
mod waits;
mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, IntoConnectionInfo, ProtocolVersion};

pub use doctor::{Check, Status};
pub use elections::ElectionInfo;
pub use force::ForceRelease;
pub use holds::{HoldEntry, HoldKind, HoldRelease, RwLockInfo, SemaphoreInfo};
pub use inspect::{HolderEntry, LockDetail, LockInfo};
pub use jobs::JobInfo;
pub use keys::{Forgotten, KeyInfo};
pub use waits::{PossibleDeadlock, WaitInfo};
pub use watch::{LockEvent, Watch};

use crate::base::config::DEFAULT_PREFIX;
pub(super) use crate::base::error::display_bytes;
use crate::protocol::keys::{validate_name, validate_prefix, Listing, LockKeys};
use crate::protocol::server::{hello_field, ServerInfo};
use crate::protocol::PubSub;
use crate::{Error, FencingToken};

/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one command may take; generous, since `SCAN` of a large keyspace is paged anyway.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys asked for per `SCAN` page.
const SCAN_PAGE: usize = 1000;

/// How the services' waiters listen for releases on the server behind `conn`: on shard channels
/// on a cluster node of Redis 7 or later (`HELLO`'s `mode` and `version`, which every server
/// that speaks RESP3 answers), so that an operator's release wakes them; on classic channels
/// anywhere else (no client of this crate waits on an older cluster: it refuses to connect), or
/// when the server does not say.
async fn pubsub_of(conn: &mut MultiplexedConnection) -> PubSub {
    let Ok(hello) = redis::cmd("HELLO").query_async::<redis::Value>(conn).await else {
        return PubSub::Classic;
    };
    let cluster = hello_field(&hello, "mode").is_some_and(|mode| mode == "cluster");
    if cluster && ServerInfo::from_hello(&hello).version() >= (7, 0, 0) {
        PubSub::Sharded
    } else {
        PubSub::Classic
    }
}

/// How the keys of one kind of name are laid out under a prefix: `LockKeys::new`,
/// `LockKeys::semaphore`...
pub(super) type Layout = fn(&[u8], &[u8]) -> LockKeys;

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
    /// The channels the services' waiters listen on here: shard channels on a cluster node.
    pubsub: PubSub,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// Connects under the default prefix `fencelock:`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an unusable URL; [`Error::Redis`] when the server cannot be
    /// reached (the message names its address) or refuses the credentials.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped `connect` leaves nothing behind but a closed connection.
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
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped `connect` leaves nothing behind but a closed connection.
    pub async fn connect_with_prefix(url: &str, prefix: impl AsRef<[u8]>) -> Result<Admin, Error> {
        let prefix = prefix.as_ref().to_vec();
        validate_prefix(&prefix)?;
        let info = url
            .into_connection_info()
            .map_err(|_| Error::InvalidConfig {
                reason: url_problem(url),
            })?;
        // RESP3 so that a watch can take release messages on the connection it polls with.
        let open = async |protocol| {
            let settings = info.redis_settings().clone().set_protocol(protocol);
            // Cannot fail: the connection info is parsed already.
            let client = redis::Client::open(info.clone().set_redis_settings(settings))?;
            let config = connection_config();
            let conn = client.get_multiplexed_async_connection_with_config(&config);
            Ok::<_, redis::RedisError>((conn.await?, client))
        };
        let connecting = |err: redis::RedisError| Error::connecting(info.addr(), err);
        let ((conn, client), resp3) = match open(ProtocolVersion::RESP3).await {
            Ok(opened) => (opened, true),
            // A server without HELLO (Redis < 6, or the command renamed away) cannot serve
            // LockClient, but the doctor should still get in and say so.
            Err(err) if refuses_hello(&err) => (
                open(ProtocolVersion::RESP2).await.map_err(connecting)?,
                false,
            ),
            Err(err) => return Err(connecting(err)),
        };
        let pubsub = pubsub_of(&mut conn.clone()).await;
        Ok(Admin {
            client,
            conn,
            prefix,
            resp3,
            pubsub,
        })
    }

    /// The key prefix this connection inspects.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The keys `layout` gives `name` under the prefix, once the name is found usable
    /// ([`Error::InvalidName`] otherwise).
    pub(super) fn keys_of(&self, name: &[u8], layout: Layout) -> Result<LockKeys, Error> {
        validate_name(name)?;
        Ok(layout(&self.prefix, name))
    }

    /// The server's clock, so ages do not depend on this machine's.
    pub(super) async fn server_time(&self) -> Result<SystemTime, Error> {
        Ok(clock(self.query(&redis::cmd("TIME")).await?))
    }

    /// Runs one command on the shared connection, its error reply typed by
    /// [`Error::from_reply`] (foreign data at a key is [`Error::WrongType`]).
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        cmd.query_async(&mut self.conn.clone())
            .await
            .map_err(Error::from_reply)
    }

    /// One row for each hash of `listing` under the prefix whose name starts with `start`, in
    /// name order: `read` reads it from its name and key, `None` when it is gone (or idle)
    /// since the scan. The keys are found with `SCAN MATCH prefix{*}MARKER start* TYPE hash`
    /// (never `KEYS`, so the server is not blocked), and a key is only taken when its name,
    /// laid out again, gives it back.
    pub(super) async fn rows<R>(
        &self,
        listing: Listing,
        start: &[u8],
        mut read: impl AsyncFnMut(Vec<u8>, Vec<u8>) -> Result<Option<R>, Error>,
    ) -> Result<Vec<R>, Error> {
        let start = [listing.marker, start].concat();
        let keys = self.scan(&start, Some("hash"), usize::MAX).await?;
        // In name order: a name gives back one key (its slot tag comes from the name).
        let named: BTreeMap<_, _> = keys
            .into_iter()
            .filter_map(|key| Some((listing.name_of(&self.prefix, &key)?, key)))
            .collect();
        let mut rows = Vec::new();
        for (name, key) in named {
            rows.extend(read(name, key).await?);
        }
        Ok(rows)
    }

    /// The keys under the prefix whose slot tag is followed by `start` (`SCAN MATCH
    /// prefix{*}start*`, prefix and `start` matched literally), of `kind` if given, in key
    /// order and deduplicated (SCAN may return a key twice), stopping once `limit` are found.
    pub(super) async fn scan(
        &self,
        start: &[u8],
        kind: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let mut pattern = glob_escape(&self.prefix);
        pattern.extend_from_slice(b"{*}");
        pattern.extend(glob_escape(start));
        pattern.push(b'*');
        let mut found = BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_PAGE);
            if let Some(kind) = kind {
                cmd.arg("TYPE").arg(kind);
            }
            let (next, keys): (u64, Vec<Vec<u8>>) = self.query(&cmd).await?;
            found.extend(keys);
            cursor = next;
            if cursor == 0 || found.len() >= limit {
                return Ok(found.into_iter().collect());
            }
        }
    }

    /// The subscribers of a lock's or election's channel (the key of its hash): `PUBSUB
    /// NUMSUB`, or `SHARDNUMSUB` on a cluster, where waiters listen on shard channels.
    pub(super) async fn subscribers(&self, channel: &[u8]) -> Result<u64, Error> {
        let mut numsub = redis::cmd("PUBSUB");
        let count = match self.pubsub {
            PubSub::Classic => "NUMSUB",
            PubSub::Sharded => "SHARDNUMSUB",
        };
        numsub.arg(count).arg(channel);
        let counts: HashMap<Vec<u8>, u64> = self.query(&numsub).await?;
        Ok(counts.get(channel).copied().unwrap_or(0))
    }

    /// The time left of a key's expiry (`None`: none set, or the key is gone).
    pub(super) async fn ttl(&self, key: &[u8]) -> Result<Option<Duration>, Error> {
        Ok(pttl_left(self.query(redis::cmd("PTTL").arg(key)).await?))
    }
}

/// A `TIME` reply (seconds, microseconds) as a point in time.
pub(super) fn clock((secs, micros): (u64, u64)) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros)
}

/// A `PTTL` reply as the time left; `None` for a key without expiry (-1) or gone (-2).
pub(super) fn pttl_left(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// What is wrong with a Redis URL that does not parse, in words, with the accepted forms.
fn url_problem(url: &str) -> String {
    const FORMS: &str = "expected redis://[user:password@]host[:port][/db], rediss://... (TLS) or \
                         redis+unix:///path/to/socket";
    let shown = redact_password(url);
    let problem = match url.split_once("://") {
        None => "it has no scheme (redis://, rediss:// or redis+unix://)".to_owned(),
        Some((scheme, _)) if !matches!(scheme, "redis" | "rediss" | "redis+unix" | "unix") => {
            format!("unknown scheme {scheme:?}")
        }
        Some((_, rest)) => {
            let authority = rest.split(['/', '?']).next().unwrap_or("");
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = match host_port.rsplit_once(':') {
                // An IPv6 host is bracketed: its own colons are not a port separator.
                Some((host, port)) if !host.starts_with('[') || host.ends_with(']') => {
                    (host, Some(port))
                }
                _ => (host_port, None),
            };
            let db = rest
                .split_once('/')
                .map(|(_, db)| db.split('?').next().unwrap_or(""));
            if host.is_empty() {
                "the host is missing".to_owned()
            } else if let Some(port) = port.filter(|p| p.parse::<u16>().is_err()) {
                format!("the port {port:?} is not a number from 1 to 65535")
            } else if let Some(db) = db.filter(|d| !d.is_empty() && d.parse::<i64>().is_err()) {
                format!("the database {db:?} is not a number")
            } else {
                "it does not parse".to_owned()
            }
        }
    };
    format!("bad redis URL {shown:?}: {problem}; {FORMS}")
}

/// `url` with its password replaced, for messages.
fn redact_password(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(_)) => {
            let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            format!("{scheme}://***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// The server does not know `HELLO` (`ERR unknown command 'HELLO'`, also when renamed away;
/// redis-rs says `RESP3NotSupported` where it recognises the answer). Not `NOAUTH` ("HELLO must
/// be called with the client already authenticated"): that is a missing password, and RESP2
/// would only hide it.
fn refuses_hello(err: &redis::RedisError) -> bool {
    if err.kind() == redis::ErrorKind::RESP3NotSupported {
        return true;
    }
    let text = err.to_string().to_ascii_lowercase();
    !err.is_io_error()
        && !err.is_timeout()
        && err.kind() != redis::ErrorKind::AuthenticationFailed
        && text.contains("unknown command")
        && text.contains("hello")
}

pub(super) fn connection_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
}

/// Escapes the glob metacharacters of Redis' MATCH, so a prefix is matched literally.
pub(super) fn glob_escape(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    for &b in raw {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// The state of a job's tick or an idempotency key's run in one word, from its record and
/// whether its runner holds it now: `done`, `failed` (waits for a retry), `running` or
/// `abandoned` (its runner lost its hold before finishing).
pub(super) fn run_state(
    finished: Option<SystemTime>,
    failed: Option<SystemTime>,
    runner_holds: bool,
) -> &'static str {
    match (finished.is_some(), failed.is_some(), runner_holds) {
        (true, _, _) => "done",
        (false, true, _) => "failed",
        (false, false, true) => "running",
        (false, false, false) => "abandoned",
    }
}

/// One item of a listing's line: `  WORD VALUE` with a value, `  NONE` without one (nothing
/// when `none` is empty).
pub(super) fn item(
    f: &mut impl fmt::Write,
    word: &str,
    value: Option<impl fmt::Display>,
    none: &str,
) -> fmt::Result {
    match value {
        Some(value) => write!(f, "  {word} {value}"),
        None if none.is_empty() => Ok(()),
        None => write!(f, "  {none}"),
    }
}

/// `display_name` for the rows named by arbitrary bytes.
macro_rules! display_name {
    ($($row:ty),*) => {$(
        impl $row {
            /// The name for display: UTF-8 as is, other bytes escaped.
            pub fn display_name(&self) -> String {
                display_bytes(&self.name)
            }
        }
    )*};
}
display_name!(LockInfo, SemaphoreInfo, RwLockInfo, ElectionInfo, JobInfo);

/// How long a hold with `token` has been held at server time `now`: a token is at least its
/// issue time in microseconds since the Unix epoch (the clock floor of `lib/next_token.lua`),
/// so the hold began at that instant or, when its slot's counter ran ahead of the clock,
/// shortly before. `None` for a token from the future (a clock that stepped back).
pub(super) fn held_for(now: SystemTime, token: FencingToken) -> Option<Duration> {
    now.duration_since(UNIX_EPOCH + Duration::from_micros(token.get()))
        .ok()
}

/// A duration for humans, as every admin listing and the `fencelock` command print one: in the
/// largest unit that fits, with the smaller ones after it down to a precision that still
/// matters at that size: `250ms`, `1.500s`, `2m05s`, `1h`, `1h30m`, `23h59m42s`, `2d3h`. Below a
/// minute milliseconds count (a lease, a latency); from a minute on whole seconds, and from a
/// day on whole hours (a hold held for days is stuck, whatever its minutes). A unit that is zero
/// at the end is left out (`5m`, `1h`, `2d`), one in the middle is kept (`1h00m05s`), so a
/// time that is not round never reads as one.
///
/// ```
/// use std::time::Duration;
/// use fencelock::admin::format_duration;
///
/// assert_eq!(format_duration(Duration::from_secs(86_382)), "23h59m42s");
/// assert_eq!(format_duration(Duration::from_millis(1500)), "1.500s");
/// ```
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return format!("{}.{:03}s", ms / 1000, ms % 1000);
    }
    let secs = ms / 1000;
    let (days, hours) = (secs / 86_400, secs % 86_400 / 3600);
    let (minutes, seconds) = (secs % 3600 / 60, secs % 60);
    if days > 0 {
        // Hours after days need no padding: a day has 24 of them, `2d3h` is unambiguous.
        return match hours {
            0 => format!("{days}d"),
            _ => format!("{days}d{hours}h"),
        };
    }
    // The leading unit as is, each smaller one in two digits, the zero ones at the end left out:
    // two digits are `00` only for a zero (the leading unit is below 60, never `00`).
    let full = match hours {
        0 => format!("{minutes}m{seconds:02}s"),
        _ => format!("{hours}h{minutes:02}m{seconds:02}s"),
    };
    let full = full.strip_suffix("00s").unwrap_or(&full);
    full.strip_suffix("00m").unwrap_or(full).to_owned()
}

/// A point in time for humans, in UTC to the millisecond: `2026-12-07 06:00:00.000 UTC`
/// (a time before the Unix epoch shows as the epoch). By hand (days to a civil date, Howard
/// Hinnant's `civil_from_days`): the library has no date-time dependency, and one for a
/// listing's column is not worth it.
pub(super) fn format_utc(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (secs, ms) = (since.as_secs(), since.subsec_millis());
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    // Days since 0000-03-01 in 400-year eras of 146 097 days: March-first years put the leap
    // day at a year's end.
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = era * 400 + yoe + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}.{ms:03} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::keys::LockKeys;

    /// The name of the lock whose hash is `key` under `prefix`, as [`Admin::locks`] finds it.
    fn name_from_key(prefix: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        Listing::LOCKS.name_of(prefix, key)
    }

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
    fn election_names_come_back_from_their_keys_and_never_from_a_locks() {
        let election = |key: &[u8]| Listing::ELECTIONS.name_of(b"p:", key);
        for name in [&b"scheduler"[..], b"a}leader:b", b"\xff"] {
            let key = LockKeys::election(b"p:", name).lock;
            assert_eq!(election(&key).as_deref(), Some(name));
            assert_eq!(
                name_from_key(b"p:", &key),
                None,
                "an election taken for a lock"
            );
            assert_eq!(election(&LockKeys::new(b"p:", name).lock), None);
        }
    }

    #[test]
    fn job_names_come_back_from_their_records_and_never_from_a_locks_key() {
        let job = |key: &[u8]| Listing::JOB_TICKS.name_of(b"p:", key);
        for name in [&b"report"[..], b"a}job-tick:b", b"\xff"] {
            let keys = LockKeys::job(b"p:", name);
            assert_eq!(job(&keys.job_record()).as_deref(), Some(name));
            assert_eq!(job(&keys.lock), None, "the job's lock taken for its record");
            assert_eq!(
                name_from_key(b"p:", &keys.lock),
                None,
                "a job taken for a lock"
            );
            assert_eq!(job(&LockKeys::new(b"p:", name).lock), None);
        }
    }

    #[test]
    fn every_listing_scans_the_marker_its_layout_puts_after_the_tag() {
        use crate::protocol::keys::{after_tag, wait_key, waiter_of, WAIT_MARKER};
        let listings = [
            (Listing::LOCKS, LockKeys::new(b"p:", b"a:b").lock),
            (Listing::ELECTIONS, LockKeys::election(b"p:", b"a:b").lock),
            (
                Listing::JOB_TICKS,
                LockKeys::job(b"p:", b"a:b").job_record(),
            ),
            (
                Listing::IDEMPOTENCY_RECORDS,
                LockKeys::idempotency(b"p:", b"a:b").idem_record(),
            ),
            (Listing::SEMAPHORES, LockKeys::semaphore(b"p:", b"a:b").lock),
            (Listing::RWLOCKS, LockKeys::rwlock(b"p:", b"a:b").lock),
        ];
        for (listing, key) in listings {
            // The marker a listing scans for is the one its layout writes after the tag.
            assert!(key.starts_with(b"p:"));
            let after = after_tag(&key).unwrap();
            assert_eq!(after, [listing.marker, b"a:b"].concat());
            assert_eq!(listing.key(b"p:", b"a:b"), key);
            assert_eq!(listing.name_of(b"p:", &key).as_deref(), Some(&b"a:b"[..]));
        }
        let wait = wait_key(&LockKeys::new(b"p:", b"x").lock, "c:1").unwrap();
        assert!(
            wait.starts_with(b"p:{") && wait.windows(WAIT_MARKER.len()).any(|w| w == WAIT_MARKER)
        );
        assert_eq!(waiter_of(&wait), Some(&b"c:1"[..]));
        assert_eq!(waiter_of(&LockKeys::new(b"p:", b"wait:x").lock), None);
    }

    #[test]
    fn a_bad_url_says_what_is_wrong_and_what_is_accepted() {
        let cases = [
            ("127.0.0.1:7000", "no scheme"),
            ("http://127.0.0.1:7000/", "unknown scheme \"http\""),
            ("redis://:7000/", "host is missing"),
            ("redis://127.0.0.1:70000/", "port \"70000\""),
            ("redis://127.0.0.1:port/", "port \"port\""),
            ("redis://127.0.0.1:7000/abc", "database \"abc\""),
            // An IPv6 host's colons are not a port, with or without one after it.
            ("redis://[::1]:port/", "port \"port\""),
            ("redis://[::1]:7000/abc", "database \"abc\""),
            ("redis://[::1]/abc", "database \"abc\""),
            // Host, port and database are fine: something else is wrong (a wildcard address).
            ("redis://0.0.0.0:7000/", "it does not parse"),
            ("redis://0.0.0.0:7000", "it does not parse"),
        ];
        for (url, problem) in cases {
            let text = url_problem(url);
            assert!(text.contains(problem), "{url}: {text}");
            assert!(text.contains("redis://[user:password@]host"), "{text}");
        }
        let secret = url_problem("redis://u:secret@:1/");
        assert!(!secret.contains("secret"), "{secret}");
        assert!(
            secret.starts_with("bad redis URL \"redis://***@:1/\": "),
            "{secret}"
        );
        assert!(url_problem("nothing").starts_with("bad redis URL \"nothing\": "));
    }

    #[test]
    fn only_a_server_that_does_not_know_hello_is_asked_again_over_resp2() {
        let reply = |text: &str| {
            redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
                .unwrap()
                .extract_error()
                .unwrap_err()
        };
        for unknown in [
            reply("ERR unknown command 'HELLO', with args beginning with: '3' "),
            reply("ERR unknown command `HELLO`, with args beginning with: `3`, "),
            redis::RedisError::from((redis::ErrorKind::RESP3NotSupported, "no RESP3")),
        ] {
            assert!(refuses_hello(&unknown), "{unknown}");
        }
        for other in [
            reply("ERR unknown command 'FOO', with args beginning with: "),
            reply("ERR wrong number of arguments for 'hello' command"),
            reply("NOAUTH HELLO must be called with the client already authenticated"),
            reply("WRONGPASS invalid username-password pair or user is disabled."),
            redis::RedisError::from(std::io::Error::other("unknown command hello")),
            redis::RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "unknown command hello",
            )),
        ] {
            assert!(!refuses_hello(&other), "{other}");
        }
    }

    #[test]
    fn durations_read_in_the_unit_that_fits() {
        for (ms, shown) in [
            (0, "0ms"),
            (250, "250ms"),
            (999, "999ms"),
            (1000, "1.000s"),
            (1234, "1.234s"),
            (1500, "1.500s"),
            (59_999, "59.999s"),
            (60_000, "1m"),
            (60_999, "1m"),
            (125_000, "2m05s"),
            (3_599_000, "59m59s"),
            (3_600_000, "1h"),
            (5_400_000, "1h30m"),
            (3_605_000, "1h00m05s"),
            (86_382_000, "23h59m42s"),
            (86_400_000, "1d"),
            (183_600_000, "2d3h"),
            (183_659_000, "2d3h"),
            (864_000_000, "10d"),
        ] {
            assert_eq!(format_duration(Duration::from_millis(ms)), shown, "{ms} ms");
        }
    }

    #[test]
    fn times_read_as_utc_dates() {
        let at = |secs: u64, ms: u64| {
            format_utc(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(at(1_800_000_000, 0), "2027-01-15 08:00:00.000 UTC");
        assert_eq!(at(1_796_623_200, 5), "2026-12-07 06:00:00.005 UTC");
        // Leap days: a year divisible by 400 has one, by 100 only not.
        assert_eq!(at(951_782_400, 0), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(at(951_868_800, 0), "2000-03-01 00:00:00.000 UTC");
        assert_eq!(at(4_107_456_000, 0), "2100-02-28 00:00:00.000 UTC");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01 00:00:00.000 UTC");
        assert_eq!(at(4_102_444_799, 999), "2099-12-31 23:59:59.999 UTC");
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(format_utc(before), "1970-01-01 00:00:00.000 UTC");
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
