//! Shared by the criterion microbenchmarks (`micro.rs`) and the workload harness
//! (`workloads.rs`): the runtime, the physical-limit baseline, the raw scripts, and the peers
//! behind one small interface, so every contender runs the same loop against the same server.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distkit::lock::{LockOptions, Mutex as DistkitMutex, MutexGuard as DistkitGuard};
use distkit::DistkitRedisKey;
use fencelock::{LockClient, LockGuard};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, Script};

/// The reservation grace of "fencelock (fair)": far above a scheduling delay on a loaded
/// 2-core machine, so a live process never loses its turn; only a crashed one would cost it.
pub const FAIR_GRACE: Duration = Duration::from_secs(1);

/// The lease every contender asks for (fencelock's default).
pub const LEASE: Duration = Duration::from_secs(30);

/// Every contender runs on the same runtime shape: tokio's multi-threaded scheduler with one
/// worker per core of the benchmark machine (2), as `#[tokio::main]` would give a service there.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A throwaway redis-server on a free loopback port (never 6379), killed on drop.
pub fn start_server() -> fencelock_testing::RedisServer {
    fencelock_testing::RedisServer::start().expect("start redis-server (is it installed?)")
}

/// A connection like fencelock's own: a `ConnectionManager` over one multiplexed connection
/// speaking RESP3 (fencelock's `ReconnectingConn` wraps the same), with the same timeouts and
/// connect tries.
pub async fn resp3_manager(url: &str) -> ConnectionManager {
    let info = url.into_connection_info().expect("url");
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let info = info.set_redis_settings(settings);
    let client = redis::Client::open(info).expect("client");
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(1)))
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_millis(500));
    ConnectionManager::new_with_config(client, config)
        .await
        .expect("connection manager")
}

/// `acquire.lua` as written: its header is its contract.
const OUR_ACQUIRE_SOURCE: &str = include_str!("../../lua/acquire.lua");
/// `acquire.lua` as the loader builds it: its libraries (lua/lib) prepended.
pub const OUR_ACQUIRE: &str = concat!(
    include_str!("../../lua/lib/next_token.lua"),
    include_str!("../../lua/lib/acquire.lua"),
    include_str!("../../lua/acquire.lua")
);
/// `release.lua` as written: its header is its contract.
const OUR_RELEASE_SOURCE: &str = include_str!("../../lua/release.lua");
/// `release.lua` as the loader builds it: its libraries prepended.
pub const OUR_RELEASE: &str = concat!(
    include_str!("../../lua/lib/release.lua"),
    include_str!("../../lua/release.lua")
);

/// Our scripts with one server call taken out each, to price every call (`--callgrind`). The
/// lock is always free when acquired in that loop, so "the lock key's type" can be assumed.
/// `None` where the script no longer contains the line (it changed since this was written).
pub fn script_variants() -> Vec<(&'static str, Option<(String, String)>)> {
    let edit = |script: &str, edits: &[(&str, &str)]| -> Option<String> {
        let mut out = script.to_owned();
        for (from, to) in edits {
            if !out.contains(from) {
                return None;
            }
            out = out.replacen(from, to, 1);
        }
        Some(out)
    };
    let acquire =
        |edits: &[(&str, &str)]| edit(OUR_ACQUIRE, edits).map(|a| (a, OUR_RELEASE.to_owned()));
    let release =
        |edits: &[(&str, &str)]| edit(OUR_RELEASE, edits).map(|r| (OUR_ACQUIRE.to_owned(), r));
    vec![
        (
            "acquire: EXISTS of the lock key and the op record",
            acquire(&[(
                "local found = redis.call('EXISTS', lock, op)",
                "local found = 0",
            )]),
        ),
        (
            "acquire: SET … GET of the fence counter (its read and write)",
            acquire(&[(
                "local counter = redis.pcall('SET', fence_key, text, 'KEEPTTL', 'GET')",
                "local counter = false",
            )]),
        ),
        (
            // A constant below 2^53 and above every real clock stands for the clock; the
            // counter then equals it, which is let through as below (no second SET).
            "acquire: TIME",
            acquire(&[
                (
                    "local now = redis.call('TIME')",
                    "local now = {'9000000000', '0'}",
                ),
                ("counter < text", "counter <= text"),
            ]),
        ),
        (
            "release: HGET holder (type and owner check)",
            release(&[(
                "count = redis.pcall('HGET', keys[1], argv[1])",
                "count = '1'",
            )]),
        ),
        (
            "release: mark the acquire record (SET PX)",
            release(&[(
                "redis.call('SET', keys[3], 'r:' .. argv[4], 'PX', argv[2])",
                "",
            )]),
        ),
        (
            "release: PUBLISH",
            release(&[(
                "redis.call(argv[3] == 'sharded' and 'SPUBLISH' or 'PUBLISH', keys[1], 'released')",
                "",
            )]),
        ),
        (
            "every check, record and the clock (the bare fenced pair left: INCR, HSET, PEXPIRE; \
             HGET, DEL, PUBLISH)",
            Some((
                BARE_FENCED_ACQUIRE.to_owned(),
                BARE_FENCED_RELEASE.to_owned(),
            )),
        ),
    ]
}

/// The least a fenced lock does in Lua, with none of our guarantees beyond the token: no
/// check that the lock is free, no replay, no clock floor, no wrong-type refusal. Called with
/// our scripts' KEYS and ARGV. It prices what any fenced lock built on scripts pays.
const BARE_FENCED_ACQUIRE: &str = "local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, token, 1}";
const BARE_FENCED_RELEASE: &str = "if redis.call('HGET', KEYS[1], ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1], 'released')
  return {1, 0}
end
return {-1}";

/// The shape of Redisson's fenced lock (`RFencedLock`), the peer with fencelock's data model
/// (a hash of holder -> re-entry count, a token from `INCR`): written here from the command
/// sequence of RedissonFencedLock's lock script and RedissonLock's unlock script, not copied.
/// Its headers name KEYS and ARGV as our scripts' do, so [`contract`] reads them the same way.
const REDISSON_ACQUIRE: &str =
    "-- KEYS[1]  lock hash        fields: <holder name> -> re-entry count
-- KEYS[2]  fence counter    string: the last token handed out
-- ARGV[1]  lease in ms
-- ARGV[2]  holder id        Redisson's holder name, <client id>:<thread id>
-- Free or already ours: a token, one more entry, the lease renewed. Held by another: its PTTL.
local lock, holder = KEYS[1], ARGV[2]
if redis.call('EXISTS', lock) == 0 or redis.call('HEXISTS', lock, holder) == 1 then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HINCRBY', lock, holder, 1)
  redis.call('PEXPIRE', lock, ARGV[1])
  return {-1, token}
end
return {redis.call('PTTL', lock), -1}";
const REDISSON_RELEASE: &str = "-- KEYS[1]  lock hash
-- KEYS[2]  channel          where the freeing release is announced
-- KEYS[3]  unlock latch     string, one per release request id: that request's answer
-- ARGV[1]  message          what the channel is sent
-- ARGV[2]  lease in ms
-- ARGV[3]  holder id
-- ARGV[4]  publish command  \"publish\" (\"spublish\" on a sharded cluster)
-- ARGV[5]  latch lifetime in ms
-- Answers 1 when the lock is freed, 0 when entries remain, nil when not held by this holder;
-- a request answered before gets the same answer from its latch.
local lock, latch, holder = KEYS[1], KEYS[3], ARGV[3]
local answered = redis.call('GET', latch)
if answered then
  return tonumber(answered)
end
if redis.call('HEXISTS', lock, holder) == 0 then
  return nil
end
if redis.call('HINCRBY', lock, holder, -1) > 0 then
  redis.call('PEXPIRE', lock, ARGV[2])
  redis.call('SET', latch, 0, 'PX', ARGV[5])
  return 0
end
redis.call('DEL', lock)
redis.call(ARGV[4], KEYS[2], ARGV[1])
redis.call('SET', latch, 1, 'PX', ARGV[5])
return 1";

/// The physical limit's scripts: called with the same KEYS and ARGV as `acquire.lua` and
/// `release.lua` (as their headers give them), doing the least work a lock can do (one write
/// with expiry, one delete), padded with a comment to the byte size of ours.
fn limit_script(body: &str, same_size_as: &str) -> Script {
    let mut code = String::from(body);
    code.push_str("\n--");
    while code.len() < same_size_as.len() {
        code.push('-');
    }
    Script::new(&code)
}

/// Which scripts a [`Raw`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawKind {
    /// Minimal scripts of our scripts' shape: the physical limit.
    Limit,
    /// Our exact `lua/acquire.lua` and `lua/release.lua`, called directly through redis-rs
    /// (no guard, holder, watchdog, retry or waiting): separates server-side script cost from
    /// client-side library cost.
    OurScripts,
    /// The shape of Redisson's fenced lock ([`REDISSON_ACQUIRE`], [`REDISSON_RELEASE`]).
    Redisson,
}

/// What one `KEYS[i]` or `ARGV[i]` of a script is, read from the script's header comment
/// (`-- KEYS[1]  lock hash ...`), so the raw calls follow the scripts' contract as it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    LockKey,
    FenceKey,
    OpKey,
    /// The holder's own op record (`prefix{tag}op:<holder id>`), which the freeing release
    /// marks.
    AcquireOpKey,
    /// The operation id (the id in the op record key).
    OpId,
    Holder,
    LeaseMs,
    OpTtlMs,
    PubSubMode,
    /// Whether this send of an acquisition leaves an op record: "0", as fencelock's first
    /// send of every acquisition (only a send after one whose outcome was unknown records).
    RecordFlag,
    /// The channel a freeing release publishes to (the Redisson shape's own key).
    Channel,
    /// What the Redisson shape publishes (Redisson's unlock message, "0").
    Message,
    /// The Redisson shape's publish command: "publish" on one server.
    PublishCommand,
    /// An optional trailing argument (an acquisition's label) that an unlabelled call, like
    /// fencelock's default, leaves out.
    Omitted,
}

/// The KEYS and ARGV of a script, in order, from its header.
fn contract(script: &str, name: &str) -> (Vec<Slot>, Vec<Slot>) {
    let (mut keys, mut args) = (Vec::new(), Vec::new());
    for line in script.lines().take_while(|l| l.starts_with("--")) {
        let line = line.trim_start_matches('-').trim_start();
        let (list, rest) = if let Some(rest) = line.strip_prefix("KEYS[") {
            (&mut keys, rest)
        } else if let Some(rest) = line.strip_prefix("ARGV[") {
            (&mut args, rest)
        } else {
            continue;
        };
        let role = rest.split_once(']').map_or("", |(_, r)| r.trim());
        let slot = [
            ("lock hash", Slot::LockKey),
            ("fence counter", Slot::FenceKey),
            ("op record lifetime in ms", Slot::OpTtlMs),
            ("op record", Slot::OpKey),
            // The Redisson shape's per-request answer is our op record in all but name.
            ("unlock latch", Slot::OpKey),
            ("latch lifetime in ms", Slot::OpTtlMs),
            ("channel", Slot::Channel),
            ("message", Slot::Message),
            ("publish command", Slot::PublishCommand),
            ("acquire record", Slot::AcquireOpKey),
            ("op id", Slot::OpId),
            ("holder id", Slot::Holder),
            ("lease in ms", Slot::LeaseMs),
            ("pub/sub mode", Slot::PubSubMode),
            ("\"1\": record this send", Slot::RecordFlag),
            // release.lua's flag: the raw cycle's release is the first send of a release of
            // a hold never re-entered, which skips its op record as fencelock's does.
            ("\"0\": KEYS[2] is not read", Slot::RecordFlag),
            ("label", Slot::Omitted),
        ]
        .into_iter()
        .find(|(prefix, _)| role.starts_with(prefix))
        .map(|(_, slot)| slot)
        .unwrap_or_else(|| {
            panic!(
                "{name}: unknown KEYS/ARGV entry {role:?}; teach benches/common/mod.rs \
                 (fn contract) what to pass for it"
            )
        });
        list.push(slot);
    }
    assert!(!keys.is_empty(), "{name}: no KEYS in the header");
    (keys, args)
}

/// Raw redis-rs `EVALSHA` calls on a fencelock-like connection; one call is one round trip.
pub struct Raw {
    kind: RawKind,
    conn: ConnectionManager,
    acquire: Script,
    release: Script,
    acquire_contract: (Vec<Slot>, Vec<Slot>),
    release_contract: (Vec<Slot>, Vec<Slot>),
    prefix: &'static str,
    id: String,
    seq: AtomicU64,
}

/// The keys of one lock name for a [`Raw`]: same shape and length as fencelock's.
#[derive(Clone, Debug)]
pub struct RawKeys {
    lock: String,
    fence: String,
    op_prefix: String,
    /// The Redisson shape's channel, as long as the lock key.
    channel: String,
}

/// The op-record lifetime fencelock uses by default.
const OP_TTL_MS: u64 = 10_000;

impl Raw {
    pub async fn connect(url: &str, kind: RawKind) -> Raw {
        let (acquire, release, prefix) = match kind {
            RawKind::Limit => (
                limit_script(
                    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\nreturn {1, 1, 1}",
                    OUR_ACQUIRE,
                ),
                limit_script("redis.call('DEL', KEYS[1])\nreturn {1, 0}", OUR_RELEASE),
                // As long as "fencelock:" so every key has the same length as ours.
                "limitlock:",
            ),
            RawKind::OurScripts => (
                Script::new(OUR_ACQUIRE),
                Script::new(OUR_RELEASE),
                "rawscript:",
            ),
            // As long as "fencelock:" too.
            RawKind::Redisson => (
                Script::new(REDISSON_ACQUIRE),
                Script::new(REDISSON_RELEASE),
                "redissonf:",
            ),
        };
        let (acquire_contract, release_contract) = if kind == RawKind::Redisson {
            (
                contract(REDISSON_ACQUIRE, "the Redisson-shaped acquire"),
                contract(REDISSON_RELEASE, "the Redisson-shaped release"),
            )
        } else {
            // The limit sends exactly the KEYS and ARGV our scripts take.
            let contracts = (
                contract(OUR_ACQUIRE_SOURCE, "lua/acquire.lua"),
                contract(OUR_RELEASE_SOURCE, "lua/release.lua"),
            );
            assert_eq!(contracts.0 .1.first(), Some(&Slot::Holder));
            assert_eq!(contracts.0 .1.get(1), Some(&Slot::LeaseMs));
            contracts
        };
        Raw {
            kind,
            conn: resp3_manager(url).await,
            acquire,
            release,
            acquire_contract,
            release_contract,
            prefix,
            id: uuid::Uuid::new_v4().simple().to_string(),
            seq: AtomicU64::new(1),
        }
    }

    /// Raw calls of arbitrary scripts with our scripts' KEYS and ARGV (for the per-call cost
    /// breakdown in `workloads -- --callgrind`).
    pub async fn with_scripts(url: &str, acquire: &str, release: &str) -> Raw {
        let mut raw = Raw::connect(url, RawKind::OurScripts).await;
        raw.acquire = Script::new(acquire);
        raw.release = Script::new(release);
        raw
    }

    /// Keys shaped like fencelock's (`prefix{tag}lock:name`, `prefix{tag}fence`,
    /// `prefix{tag}op:<id>`); the two-character tag is about as long as fencelock's. The
    /// Redisson shape's channel (`prefix{tag}chan:name`) is as long as the lock key, and its
    /// unlock latches are op records.
    pub fn keys(&self, name: &str) -> RawKeys {
        let base = format!("{}{{b7}}", self.prefix);
        RawKeys {
            lock: format!("{base}lock:{name}"),
            fence: format!("{base}fence"),
            op_prefix: format!("{base}op:"),
            channel: format!("{base}chan:{name}"),
        }
    }

    fn next_id(&self) -> String {
        format!("{}:{}", self.id, self.seq.fetch_add(1, Ordering::Relaxed))
    }

    /// One `EVALSHA` of `script` with the KEYS and ARGV its contract names.
    async fn call<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        (keys, args): &(Vec<Slot>, Vec<Slot>),
        lock: &RawKeys,
        holder: &str,
        op: &str,
    ) -> T {
        let mut call = script.prepare_invoke();
        for slot in keys {
            match slot {
                Slot::LockKey => call.key(&lock.lock),
                Slot::FenceKey => call.key(&lock.fence),
                Slot::OpKey => call.key(format!("{}{op}", lock.op_prefix)),
                Slot::AcquireOpKey => call.key(format!("{}{holder}", lock.op_prefix)),
                Slot::Channel => call.key(&lock.channel),
                other => panic!("{other:?} is not a key"),
            };
        }
        for slot in args {
            match slot {
                Slot::Holder => call.arg(holder),
                Slot::LeaseMs => call.arg(LEASE.as_millis() as u64),
                Slot::OpTtlMs => call.arg(OP_TTL_MS),
                // One server: classic PUBLISH, as fencelock sends it there.
                Slot::PubSubMode => call.arg("classic"),
                Slot::OpId => call.arg(op),
                Slot::RecordFlag => call.arg("0"),
                // Redisson's unlock message, on one server's PUBLISH.
                Slot::Message => call.arg("0"),
                Slot::PublishCommand => call.arg("publish"),
                Slot::Omitted => continue,
                other => panic!("{other:?} is not an argument"),
            };
        }
        call.invoke_async(&mut self.conn.clone())
            .await
            .expect("raw EVALSHA")
    }

    /// One acquire-shaped `EVALSHA`; returns the holder id for the release.
    pub async fn acquire(&self, keys: &RawKeys) -> String {
        let holder = self.next_id();
        let reply: Vec<i64> = self
            .call(
                &self.acquire,
                &self.acquire_contract,
                keys,
                &holder,
                &holder,
            )
            .await;
        // The Redisson shape answers -1 (no PTTL to wait for) when it grants.
        let granted = if self.kind == RawKind::Redisson {
            -1
        } else {
            1
        };
        assert_eq!(
            reply.first(),
            Some(&granted),
            "raw acquire found the key held"
        );
        holder
    }

    /// One release-shaped `EVALSHA`.
    pub async fn release(&self, keys: &RawKeys, holder: &str) {
        // A fresh request id: the Redisson shape's unlock latch, our op record.
        let op = self.next_id();
        if self.kind == RawKind::Redisson {
            // 1: the lock was freed (0 would be entries left, nil not held).
            let reply: Option<i64> = self
                .call(&self.release, &self.release_contract, keys, holder, &op)
                .await;
            assert_eq!(reply, Some(1), "raw release did not free the lock");
            return;
        }
        let reply: Vec<i64> = self
            .call(&self.release, &self.release_contract, keys, holder, &op)
            .await;
        assert_eq!(reply.first(), Some(&1), "raw release was refused");
    }
}

/// The contenders, in the order the tables list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Ours,
    /// fencelock with `fair_handoff` (W3, W4 only).
    OursFair,
    Limit,
    OurScripts,
    /// The shape of Redisson's fenced lock, its two scripts called raw (W1, W2, callgrind).
    Redisson,
    Rslock,
    Distkit,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Ours => "fencelock",
            Kind::OursFair => "fencelock (fair)",
            Kind::Limit => "limit (raw EVALSHA)",
            Kind::OurScripts => "our scripts, raw",
            Kind::Redisson => "Redisson fenced lock (scripts) †",
            Kind::Rslock => "rslock 0.10 *",
            Kind::Distkit => "distkit 0.7 mutex *",
        }
    }

    pub fn slug(self) -> &'static str {
        match self {
            Kind::Ours => "ours",
            Kind::OursFair => "ours_fair",
            Kind::Limit => "limit",
            Kind::OurScripts => "our_scripts",
            Kind::Redisson => "redisson",
            Kind::Rslock => "rslock",
            Kind::Distkit => "distkit",
        }
    }

    pub fn from_slug(slug: &str) -> Option<Kind> {
        [
            Kind::Ours,
            Kind::OursFair,
            Kind::Limit,
            Kind::OurScripts,
            Kind::Redisson,
            Kind::Rslock,
            Kind::Distkit,
        ]
        .into_iter()
        .find(|k| k.slug() == slug)
    }

    /// fencelock in either mode (it has fencing tokens to check).
    pub fn is_ours(self) -> bool {
        matches!(self, Kind::Ours | Kind::OursFair)
    }

    /// Whether the contender can wait for a held lock (the raw scripts cannot).
    pub fn can_wait(self) -> bool {
        !matches!(self, Kind::Limit | Kind::OurScripts | Kind::Redisson)
    }
}

/// One connection (or client) per contender, as each library is meant to be used: one
/// `LockClient`, one `rslock::LockManager`, one `ConnectionManager` shared by distkit mutexes.
#[derive(Clone)]
pub struct Contenders {
    pub ours: LockClient,
    /// fencelock with [`FAIR_GRACE`] fair handoff.
    pub ours_fair: LockClient,
    pub limit: Arc<Raw>,
    pub scripts: Arc<Raw>,
    pub redisson: Arc<Raw>,
    pub rslock: rslock::LockManager,
    pub distkit: ConnectionManager,
}

impl Contenders {
    pub async fn connect(url: &str) -> Contenders {
        Contenders {
            ours: LockClient::connect(url).await.expect("fencelock connect"),
            ours_fair: LockClient::builder(url)
                .fair_handoff(FAIR_GRACE)
                .connect()
                .await
                .expect("fencelock connect (fair)"),
            limit: Arc::new(Raw::connect(url, RawKind::Limit).await),
            scripts: Arc::new(Raw::connect(url, RawKind::OurScripts).await),
            redisson: Arc::new(Raw::connect(url, RawKind::Redisson).await),
            // rslock with one Redis server, its defaults otherwise (RESP2 multiplexed
            // connection, 3 tries per `lock`, retry delay random in 0..200 ms).
            rslock: rslock::LockManager::new(vec![url.to_owned()]),
            // distkit's documented setup: a ConnectionManager from `Client::open` (RESP2).
            distkit: redis::Client::open(url)
                .expect("client")
                .get_connection_manager()
                .await
                .expect("distkit connection"),
        }
    }

    /// A handle to the lock `name` for one task. Names must not contain ':' (distkit).
    pub fn locker(&self, kind: Kind, name: &str) -> Locker {
        match kind {
            Kind::Ours => Locker::Ours(self.ours.lock(name).expect("lock name")),
            Kind::OursFair => Locker::Ours(self.ours_fair.lock(name).expect("lock name")),
            Kind::Limit => Locker::Raw(self.limit.clone(), self.limit.keys(name)),
            Kind::OurScripts => Locker::Raw(self.scripts.clone(), self.scripts.keys(name)),
            Kind::Redisson => Locker::Raw(self.redisson.clone(), self.redisson.keys(name)),
            Kind::Rslock => Locker::Rslock(self.rslock.clone(), name.as_bytes().to_vec()),
            Kind::Distkit => {
                let key = DistkitRedisKey::try_from(name.to_owned()).expect("distkit key");
                let options = LockOptions::builder(key, self.distkit.clone())
                    .ttl(LEASE)
                    .build();
                Locker::Distkit(DistkitMutex::new(options))
            }
        }
    }
}

/// A contender's handle to one lock.
pub enum Locker {
    Ours(fencelock::Lock),
    Raw(Arc<Raw>, RawKeys),
    Rslock(rslock::LockManager, Vec<u8>),
    Distkit(Arc<DistkitMutex>),
}

/// What a contender holds between acquire and release.
pub enum Held {
    Ours(LockGuard),
    Raw(String),
    Rslock(rslock::LockGuard),
    Distkit(DistkitGuard),
}

impl Held {
    /// The fencing token, for the contenders that have one.
    pub fn token(&self) -> Option<u64> {
        match self {
            Held::Ours(guard) => Some(guard.token().get()),
            _ => None,
        }
    }
}

impl Locker {
    /// Takes the lock, waiting as long as it takes (each library's own waiting strategy).
    pub async fn acquire(&self) -> Held {
        match self {
            Locker::Ours(lock) => Held::Ours(lock.acquire().await.expect("fencelock acquire")),
            Locker::Raw(raw, keys) => Held::Raw(raw.acquire(keys).await),
            Locker::Rslock(manager, name) => Held::Rslock(
                manager
                    .acquire(name.as_slice(), LEASE)
                    .await
                    .expect("rslock acquire"),
            ),
            Locker::Distkit(mutex) => Held::Distkit(mutex.lock().await.expect("distkit lock")),
        }
    }

    pub async fn release(&self, held: Held) {
        match (self, held) {
            (_, Held::Ours(guard)) => guard.release().await.expect("fencelock release"),
            (Locker::Raw(raw, keys), Held::Raw(holder)) => raw.release(keys, &holder).await,
            (_, Held::Rslock(guard)) => guard.release().await,
            (_, Held::Distkit(guard)) => {
                guard.release().await.expect("distkit release");
            }
            (_, Held::Raw(_)) => unreachable!("raw hold released through another locker"),
        }
    }

    /// One uncontended acquire + release.
    pub async fn cycle(&self) {
        let held = self.acquire().await;
        self.release(held).await;
    }
}

/// Acquires, re-enters `depth` times, then releases every guard, innermost first: a
/// fencelock cycle of `2 * (depth + 1)` round trips.
pub async fn reentry_cycle(lock: &fencelock::Lock, depth: usize) {
    let outer = lock.acquire().await.expect("acquire");
    let mut guards = Vec::with_capacity(depth);
    for _ in 0..depth {
        let inner = match guards.last() {
            Some(g) => LockGuard::reenter(g).await,
            None => outer.reenter().await,
        };
        guards.push(inner.expect("reenter"));
    }
    while let Some(guard) = guards.pop() {
        guard.release().await.expect("release inner");
    }
    outer.release().await.expect("release outer");
}

/// The limit for [`reentry_cycle`]: `depth + 1` acquire-shaped and as many release-shaped
/// `EVALSHA`s, one after another.
pub async fn limit_reentry_cycle(raw: &Raw, keys: &RawKeys, depth: usize) {
    let mut holders = Vec::with_capacity(depth + 1);
    for _ in 0..=depth {
        holders.push(raw.acquire(keys).await);
    }
    while let Some(holder) = holders.pop() {
        raw.release(keys, &holder).await;
    }
}
