//! A test's own redis-server, and a look at what fencelock left in it. Shared with the CLI's
//! tests (`fencelock-cli/tests/cli.rs` includes this file).
// Shared by several test binaries: `pub` means "for the files that include this module", and
// each binary uses only a part of it.
#![allow(dead_code, unreachable_pub)]

use fencelock::LockClient;
use fencelock_testing::RedisServer;
use redis::Commands;

/// A test's own server plus helpers to look at what fencelock left in it.
pub struct Fixture {
    pub server: RedisServer,
}

impl Fixture {
    pub fn start() -> Fixture {
        Fixture {
            server: RedisServer::start().expect("start redis-server"),
        }
    }

    pub fn with_persistence() -> Fixture {
        Fixture {
            server: RedisServer::builder()
                .persistence(true)
                .start()
                .expect("start redis-server with persistence"),
        }
    }

    pub fn builder(&self) -> fencelock::LockClientBuilder {
        LockClient::builder(self.server.url())
    }

    pub async fn client(&self) -> LockClient {
        LockClient::connect(&self.server.url())
            .await
            .expect("connect")
    }

    /// A plain synchronous connection for inspecting and tampering with the server.
    pub fn raw(&self) -> redis::Connection {
        self.server
            .client()
            .get_connection()
            .expect("raw connection")
    }

    /// Every key whose name matches `pattern` (tests only: KEYS on a throwaway server), but
    /// the clients' name registrations (`prefix{tag}client:<id>`, written once at connect):
    /// what the locks, resources and records of a test wrote.
    pub fn keys(&self, pattern: &str) -> Vec<Vec<u8>> {
        let keys: Vec<Vec<u8>> = self.raw().keys(pattern).expect("KEYS");
        keys.into_iter()
            .filter(|key| !is_name_registration(key))
            .collect()
    }

    /// The clients' name registrations (`prefix{tag}client:<id>`).
    pub fn name_registrations(&self) -> Vec<Vec<u8>> {
        let keys: Vec<Vec<u8>> = self.raw().keys("*").expect("KEYS");
        keys.into_iter()
            .filter(|key| is_name_registration(key))
            .collect()
    }

    /// The one lock hash of `name` under the default prefix, if it exists.
    pub fn lock_key(&self, name: &str) -> Option<Vec<u8>> {
        let mut found = self.keys(&format!("fencelock:{{*}}lock:{name}"));
        assert!(found.len() <= 1, "several keys for one lock: {found:?}");
        found.pop()
    }

    /// The lock hash of `name` as (holder id, count) pairs plus the stored token.
    pub fn lock_state(&self, name: &str) -> Option<(Vec<(String, u64)>, u64)> {
        let key = self.lock_key(name)?;
        let fields: Vec<(String, String)> = self.raw().hgetall(&key).expect("HGETALL");
        let mut holders = Vec::new();
        let mut token = 0;
        for (field, value) in fields {
            if field == "~token" {
                token = value.parse().expect("token");
            } else if field.starts_with('~') {
                // Another protocol field (an acquisition's "~label"): not a holder.
            } else {
                holders.push((field, value.parse().expect("count")));
            }
        }
        Some((holders, token))
    }
}

impl Fixture {
    /// Subscribers of `channel` on the server (`PUBSUB NUMSUB`).
    pub fn subscribers(&self, channel: &[u8]) -> u64 {
        let reply: Vec<(Vec<u8>, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query(&mut self.raw())
            .expect("PUBSUB NUMSUB");
        reply.first().map_or(0, |(_, n)| *n)
    }

    /// Successful calls of `command` so far (`INFO commandstats`), e.g. "evalsha".
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.raw())
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map(|n| n.parse().expect("calls"))
            .unwrap_or(0)
    }

    /// Runs one acquire / re-enter / release cycle on a throwaway lock so every script is
    /// loaded and later `EVALSHA` counts are exact.
    pub async fn warm_up(&self, client: &LockClient) {
        let guard = client.lock("warm-up").unwrap().acquire().await.unwrap();
        guard.reenter().await.unwrap().release().await.unwrap();
        guard
            .extend(std::time::Duration::from_secs(1))
            .await
            .unwrap();
        guard.release().await.unwrap();
        load_contended_scripts(&self.server.client());
    }
}

/// Loads the scripts only contention runs, which a warm-up cycle does not reach: the releases
/// that hand a lock or a semaphore's permits to a waiting task of their client, loaded as the
/// client loads them (the shared code, then the script), so that they have the client's SHAs.
pub fn load_contended_scripts(server: &redis::Client) {
    let handoff = [
        include_str!("../../lua/lib/next_token.lua"),
        include_str!("../../lua/lib/acquire.lua"),
        include_str!("../../lua/lib/release.lua"),
        include_str!("../../lua/handoff.lua"),
    ]
    .concat();
    let sem_handoff = [
        include_str!("../../lua/lib/clock.lua"),
        include_str!("../../lua/lib/sem_holds.lua"),
        include_str!("../../lua/lib/next_token.lua"),
        include_str!("../../lua/lib/sem_take.lua"),
        include_str!("../../lua/lib/sem_give.lua"),
        include_str!("../../lua/sem_handoff.lua"),
    ]
    .concat();
    let mut conn = server.get_connection().unwrap();
    for script in [handoff, sem_handoff] {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&script)
            .query(&mut conn)
            .unwrap();
    }
}

/// Whether `key` is a client's name registration (`prefix{tag}client:<client id>`).
pub fn is_name_registration(key: &[u8]) -> bool {
    key.windows(b"}client:".len()).any(|w| w == b"}client:")
}
