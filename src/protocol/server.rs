//! What the server is and what its settings mean for the locks: the server's flavour and
//! version (from `HELLO`, which every user may run) and what follows from them, and the one
//! judgement of a `maxmemory-policy`, shared by the warning `connect` logs and the operator's
//! `doctor`.

use std::fmt;

use redis::aio::ConnectionLike;
use redis::Value;

use crate::base::error::Error;

/// The servers fencelock's test suite runs on, each with every topology it supports: the
/// lowest of a flavour is the oldest release a user can run with tested guarantees.
pub(crate) const TESTED: &[(ServerFlavour, (u32, u32, u32))] = &[
    (ServerFlavour::Redis, (6, 2, 14)),
    (ServerFlavour::Redis, (7, 0, 15)),
    (ServerFlavour::Redis, (8, 2, 3)),
    (ServerFlavour::Valkey, (9, 1, 2)),
];

/// Which server implementation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerFlavour {
    /// Redis (redis.io).
    Redis,
    /// Valkey (the Linux Foundation's fork of Redis 7.2).
    Valkey,
    /// A server that speaks the protocol under another name (its `HELLO` says which); treated
    /// as the Redis release its version names.
    Other,
}

/// The server a client talks to, as its `HELLO` reply describes it: read once at connect
/// ([`LockClient::server`](crate::LockClient::server)); on a cluster, the node that answered.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) {
/// let server = client.server();
/// println!("{server}"); // "Redis 7.0.15", "Valkey 9.1.2"
/// if server.version() < (7, 0, 0) {
///     eprintln!("no sharded pub/sub here: this server cannot serve a cluster client");
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    flavour: ServerFlavour,
    name: String,
    version: (u32, u32, u32),
}

impl ServerInfo {
    /// Reads a `HELLO` reply: a map with `server` and `version` (RESP3), or the same pairs
    /// as a flat array (RESP2).
    pub(crate) fn from_hello(reply: &Value) -> ServerInfo {
        ServerInfo::named(
            hello_field(reply, "server").as_deref().unwrap_or("redis"),
            hello_field(reply, "version").as_deref().unwrap_or("0"),
        )
    }

    /// A server called `name` (as `HELLO` spells it) at release `version`.
    pub(crate) fn named(name: &str, version: &str) -> ServerInfo {
        let version = parse_version(version);
        let name = name.to_owned();
        let flavour = match name.to_ascii_lowercase().as_str() {
            "redis" => ServerFlavour::Redis,
            "valkey" => ServerFlavour::Valkey,
            _ => ServerFlavour::Other,
        };
        ServerInfo {
            flavour,
            name,
            version,
        }
    }

    /// Redis, Valkey or another implementation.
    pub fn flavour(&self) -> ServerFlavour {
        self.flavour
    }

    /// The version the server reports, as `(major, minor, patch)`.
    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    /// Sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`): Redis 7.0+, every Valkey. A cluster client
    /// needs it to wake its waiters.
    pub(crate) fn has_sharded_pubsub(&self) -> bool {
        self.flavour == ServerFlavour::Valkey || self.version >= (7, 0, 0)
    }

    /// Expiry per hash field (`HPEXPIRE`): Redis 7.4+, Valkey 9.0+.
    pub fn has_hash_field_expiry(&self) -> bool {
        match self.flavour {
            ServerFlavour::Valkey => self.version >= (9, 0, 0),
            ServerFlavour::Redis | ServerFlavour::Other => self.version >= (7, 4, 0),
        }
    }

    /// Whether this release is at least the oldest tested one of its flavour (`false` for a
    /// flavour nobody tested).
    pub(crate) fn is_at_least_tested(&self) -> bool {
        TESTED
            .iter()
            .filter(|(flavour, _)| *flavour == self.flavour)
            .map(|(_, version)| (version.0, version.1, 0))
            .min()
            .is_some_and(|lowest| self.version >= lowest)
    }

    /// The tested servers, in words: "Redis 6.2, 7.0, 8.2; Valkey 9.1".
    pub(crate) fn tested_matrix() -> String {
        let tested = |flavour: ServerFlavour| {
            let versions: Vec<String> = TESTED
                .iter()
                .filter(|(f, _)| *f == flavour)
                .map(|(_, (major, minor, _))| format!("{major}.{minor}"))
                .collect();
            format!("{flavour:?} {}", versions.join(", "))
        };
        [ServerFlavour::Redis, ServerFlavour::Valkey]
            .map(tested)
            .join("; ")
    }
}

impl fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor, patch) = self.version;
        let name = match self.flavour {
            ServerFlavour::Redis => "Redis",
            ServerFlavour::Valkey => "Valkey",
            ServerFlavour::Other => &self.name,
        };
        write!(f, "{name} {major}.{minor}.{patch}")
    }
}

/// The text of the field `wanted` of a `HELLO` reply (a map in RESP3, the same pairs as a flat
/// array in RESP2), if it has one.
pub(crate) fn hello_field(reply: &Value, wanted: &str) -> Option<String> {
    reply.as_map_iter()?.find_map(|(key, value)| {
        let key = redis::from_redis_value_ref::<String>(key).ok()?;
        (key == wanted)
            .then(|| redis::from_redis_value_ref::<String>(value).ok())
            .flatten()
    })
}

/// `7.0.15` -> `(7, 0, 15)`; missing or unreadable parts are 0.
fn parse_version(text: &str) -> (u32, u32, u32) {
    let mut parts = text
        .split(['.', '-'])
        .map(|part| part.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// Asks the server what it is (`HELLO 3`, allowed to every user; the connection already speaks
/// RESP3, so nothing changes on it).
pub(crate) async fn hello<C: ConnectionLike>(conn: &mut C) -> Result<ServerInfo, Error> {
    let reply: Value = redis::cmd("HELLO").arg(3).query_async(conn).await?;
    Ok(ServerInfo::from_hello(&reply))
}

/// A `maxmemory-policy` that can evict fencelock's keys, and what it can evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EvictionRisk {
    /// The policy as the server reported it.
    pub(crate) policy: String,
    /// Whether the policy can also evict keys without a TTL (fence counters, high-water
    /// marks): then tokens can repeat, not only a second holder get in.
    pub(crate) evicts_counters: bool,
}

impl EvictionRisk {
    /// The risk of `policy`, or `None` for `noeviction` (the only safe policy). Every other
    /// policy can evict: the `volatile-*` policies pick exactly the keys with a TTL (held
    /// locks), the `allkeys-*` policies any key.
    pub(crate) fn of(policy: &str) -> Option<EvictionRisk> {
        (policy != "noeviction").then(|| EvictionRisk {
            policy: policy.to_owned(),
            evicts_counters: !policy.starts_with("volatile"),
        })
    }

    /// What the policy does to fencelock's keys, in words that follow the policy's name.
    pub(crate) fn evicts(&self) -> &'static str {
        if self.evicts_counters {
            "can evict any key under memory pressure: held locks, fence counters and fenced \
             resources' marks, so tokens can repeat"
        } else {
            "evicts keys with a TTL under memory pressure, which is exactly the held locks: a \
             second holder can get in"
        }
    }

    /// The remedy.
    pub(crate) const FIX: &'static str = "CONFIG SET maxmemory-policy noeviction (and in \
         redis.conf), or keep locks on a redis of their own without maxmemory";
}

impl fmt::Display for EvictionRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redis maxmemory-policy {} {}; fix: {}",
            self.policy,
            self.evicts(),
            EvictionRisk::FIX
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(server: &str, version: &str) -> ServerInfo {
        ServerInfo::from_hello(&Value::Map(vec![
            (
                Value::SimpleString("server".into()),
                Value::BulkString(server.into()),
            ),
            (
                Value::SimpleString("version".into()),
                Value::BulkString(version.into()),
            ),
            (Value::SimpleString("proto".into()), Value::Int(3)),
        ]))
    }

    #[test]
    fn hello_names_the_flavour_the_version_and_what_follows_from_them() {
        let old = hello("redis", "6.2.14");
        assert_eq!(
            (old.flavour(), old.version()),
            (ServerFlavour::Redis, (6, 2, 14))
        );
        assert_eq!(old.to_string(), "Redis 6.2.14");
        assert!(!old.has_sharded_pubsub() && !old.has_hash_field_expiry());
        assert!(old.is_at_least_tested());
        let seven = hello("redis", "7.0.15");
        assert!(seven.has_sharded_pubsub() && !seven.has_hash_field_expiry());
        assert!(hello("redis", "7.4.0").has_hash_field_expiry());
        let valkey = hello("valkey", "9.1.2");
        assert_eq!(valkey.to_string(), "Valkey 9.1.2");
        assert!(valkey.has_sharded_pubsub() && valkey.has_hash_field_expiry());
        assert!(!hello("valkey", "8.1.0").has_hash_field_expiry());
        assert!(!hello("valkey", "8.1.0").is_at_least_tested());
        assert!(!hello("redis", "6.0.20").is_at_least_tested());
        assert!(hello("redis", "6.2.0").is_at_least_tested());
        let other = hello("dragonfly", "1.2.3-rc1");
        assert_eq!(
            (other.flavour(), other.version()),
            (ServerFlavour::Other, (1, 2, 3))
        );
        assert_eq!(other.to_string(), "dragonfly 1.2.3");
        assert!(!other.is_at_least_tested());
        assert_eq!(
            ServerInfo::tested_matrix(),
            "Redis 6.2, 7.0, 8.2; Valkey 9.1"
        );
        // A reply without the fields: an unknown Redis, never a panic.
        let bare = ServerInfo::from_hello(&Value::Nil);
        assert_eq!(
            (bare.flavour(), bare.version()),
            (ServerFlavour::Redis, (0, 0, 0))
        );
    }

    #[test]
    fn only_noeviction_is_safe_and_volatile_policies_spare_the_counters() {
        assert_eq!(EvictionRisk::of("noeviction"), None);
        let volatile = EvictionRisk::of("volatile-lru").unwrap();
        assert!(!volatile.evicts_counters);
        let allkeys = EvictionRisk::of("allkeys-lfu").unwrap();
        assert!(allkeys.evicts_counters);
        let text = allkeys.to_string();
        assert!(
            text.contains("allkeys-lfu") && text.contains("noeviction"),
            "{text}"
        );
        assert!(text.contains("tokens can repeat"), "{text}");
    }
}
