//! Shared set-up for the integration tests: a throwaway redis-server per test.
// Shared by several test binaries: `pub` means "for the files that include this module", and
// each binary uses only a part of it.
#![allow(dead_code, unreachable_pub)]

pub mod cancel;
pub mod child;
pub mod deadline;
pub mod events;
mod fixture;
pub mod ledger;
pub mod ticks;

use fencelock::LockClient;
use fencelock_testing::RedisServer;
#[allow(unused_imports)]
pub use fixture::is_name_registration as fixture_is_name_registration;
#[allow(unused_imports)] // not every binary that includes this module uses it
pub use fixture::{load_contended_scripts, Fixture};
use redis::Commands;

/// The proptest runner of a model check: `cases` programs, no failure files, shrinking
/// bounded. With `fixed_seed` (a run under a negative control) the programs are the same on
/// every run, so whether the control is caught never depends on the draw; without it, every
/// run draws new programs.
pub fn model_runner(cases: u32, fixed_seed: bool) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    };
    if fixed_seed {
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
    } else {
        TestRunner::new(config)
    }
}

/// A number of random cases from the environment variable `var`, or `default`.
pub fn env_cases(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Polls `check` every 10 ms until it holds or `limit` passes; returns whether it held.
pub async fn eventually(limit: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// `client.renewal_calls()` read between two watchdog ticks. A tick counts its calls all at
/// once (no await between them) and ticks are a third of a lease apart, so a value that did
/// not move for 100 ms was not read while a tick was half counted.
pub async fn quiet_renewal_calls(client: &LockClient) -> u64 {
    loop {
        let calls = client.renewal_calls();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if client.renewal_calls() == calls {
            return calls;
        }
    }
}

/// Where a parametrised test runs: one server, or a Redis Cluster of three primaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    Standalone,
    Cluster,
}

/// The servers of one topology.
#[allow(clippy::large_enum_variant)] // one per test
pub enum Deployment {
    Standalone(RedisServer),
    Cluster(fencelock_testing::RedisCluster),
}

/// The [`Fixture`] of tests that run on every topology: the same inspection helpers, answered
/// by whichever node holds the key.
pub struct Env {
    pub topology: Topology,
    pub deployment: Deployment,
}

impl Env {
    pub fn start(topology: Topology) -> Env {
        let deployment = match topology {
            Topology::Standalone => {
                Deployment::Standalone(RedisServer::start().expect("start redis-server"))
            }
            // No replicas: these tests are about the protocol on a sharded keyspace, and every
            // extra process slows the suite on a 2-core CI machine.
            Topology::Cluster => Deployment::Cluster(
                fencelock_testing::RedisCluster::builder()
                    .replicas_per_primary(0)
                    .start()
                    .expect("start redis cluster"),
            ),
        };
        Env {
            topology,
            deployment,
        }
    }

    pub fn builder(&self) -> fencelock::LockClientBuilder {
        match &self.deployment {
            Deployment::Standalone(server) => LockClient::builder(server.url()),
            Deployment::Cluster(cluster) => LockClient::cluster_builder(cluster.urls()),
        }
    }

    pub async fn client(&self) -> LockClient {
        self.builder().connect().await.expect("connect")
    }

    /// The servers that hold data: the one server, or every primary.
    pub fn data_nodes(&self) -> Vec<&RedisServer> {
        match &self.deployment {
            Deployment::Standalone(server) => vec![server],
            Deployment::Cluster(cluster) => cluster.primaries().expect("cluster primaries"),
        }
    }

    /// A synchronous connection that sends each command to the node of its key.
    pub fn raw(&self) -> Raw {
        match &self.deployment {
            Deployment::Standalone(server) => {
                Raw::One(server.client().get_connection().expect("raw connection"))
            }
            Deployment::Cluster(cluster) => Raw::Cluster(Box::new(
                redis::cluster::ClusterClient::new(cluster.urls())
                    .expect("cluster client")
                    .get_connection()
                    .expect("raw cluster connection"),
            )),
        }
    }

    /// Every key matching `pattern` on every data node.
    pub fn keys(&self, pattern: &str) -> Vec<Vec<u8>> {
        self.data_nodes()
            .into_iter()
            .flat_map(|node| {
                let mut con = node.client().get_connection().expect("raw connection");
                let keys: Vec<Vec<u8>> = con.keys(pattern).expect("KEYS");
                keys
            })
            .collect()
    }

    /// Subscribers of `channel` (a lock's or semaphore's key) on every data node: `PUBSUB
    /// NUMSUB`, or `SHARDNUMSUB` on a cluster, where waiters listen on shard channels.
    pub fn subscribers(&self, channel: &[u8]) -> u64 {
        let count = match self.topology {
            Topology::Standalone => "NUMSUB",
            Topology::Cluster => "SHARDNUMSUB",
        };
        self.data_nodes()
            .into_iter()
            .map(|node| {
                let mut con = node.client().get_connection().expect("raw connection");
                let reply: Vec<(Vec<u8>, u64)> = redis::cmd("PUBSUB")
                    .arg(count)
                    .arg(channel)
                    .query(&mut con)
                    .expect("PUBSUB");
                reply.first().map_or(0, |(_, n)| *n)
            })
            .sum()
    }

    pub fn lock_key(&self, name: &str) -> Option<Vec<u8>> {
        let mut found = self.keys(&format!("fencelock:{{*}}lock:{name}"));
        assert!(found.len() <= 1, "several keys for one lock: {found:?}");
        found.pop()
    }

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

    /// Successful calls of `command` so far, summed over every data node.
    pub fn calls(&self, command: &str) -> u64 {
        self.data_nodes()
            .into_iter()
            .map(|node| {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut node.client().get_connection().expect("raw connection"))
                    .expect("INFO commandstats");
                let prefix = format!("cmdstat_{command}:calls=");
                info.lines()
                    .find_map(|line| line.strip_prefix(&prefix))
                    .and_then(|rest| rest.split(',').next())
                    .map(|n| n.parse::<u64>().expect("calls"))
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Loads every script on every data node (one cycle on locks that land on each), so later
    /// `EVALSHA` counts are exact.
    pub async fn warm_up(&self, client: &LockClient) {
        let nodes = self.data_nodes().len();
        let mut warmed = std::collections::HashSet::new();
        for i in 0.. {
            let name = format!("warm-up-{i}");
            let guard = client.lock(&name).unwrap().acquire().await.unwrap();
            guard.reenter().await.unwrap().release().await.unwrap();
            guard
                .extend(std::time::Duration::from_secs(1))
                .await
                .unwrap();
            guard.release().await.unwrap();
            warmed.insert(self.node_of(&name));
            if warmed.len() == nodes {
                break;
            }
        }
        for node in self.data_nodes() {
            load_contended_scripts(&node.client());
        }
    }

    /// The port of the data node that owns the slot of lock `name`.
    pub fn node_of(&self, name: &str) -> u16 {
        match &self.deployment {
            Deployment::Standalone(server) => server.port(),
            Deployment::Cluster(cluster) => {
                let slot = key_slot_of_lock(name);
                cluster.primary_for_slot(slot).expect("slot owner").port()
            }
        }
    }
}

/// The cluster slot of every key of lock `name` under the default prefix, as Redis computes it.
pub fn key_slot_of_lock(name: &str) -> u16 {
    // The lock hash does not exist when the lock is free, but CLUSTER KEYSLOT needs no key:
    // fencelock's tag is the name's own CRC16 slot, which is what KEYSLOT of the name gives.
    crc16(name.as_bytes()) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A synchronous connection to one server or to a cluster.
pub enum Raw {
    One(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl redis::ConnectionLike for Raw {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        match self {
            Raw::One(c) => c.req_packed_command(cmd),
            Raw::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            Raw::One(c) => c.req_packed_commands(cmd, offset, count),
            Raw::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            Raw::One(c) => c.req_command(cmd),
            Raw::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }

    fn supports_pipelining(&self) -> bool {
        matches!(self, Raw::One(_))
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Raw::One(c) => c.check_connection(),
            Raw::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Raw::One(c) => c.is_open(),
            Raw::Cluster(c) => c.is_open(),
        }
    }
}

/// Runs one async test body on every topology: `name::standalone` and `name::cluster`. The
/// body gets a fresh [`Env`] of its topology as `fx`. The tests run on tokio's default
/// (current-thread) test runtime; [`on_topologies_multi_thread!`] runs them on two workers.
#[macro_export]
macro_rules! on_topologies {
    (@runtime $runtime:tt $( $(#[$meta:meta])* async fn $name:ident($fx:ident) $body:block )*) => { $(
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($fx: $crate::common::Env) $body

            #[tokio::test $runtime]
            async fn standalone() {
                body($crate::common::Env::start($crate::common::Topology::Standalone)).await
            }

            #[tokio::test $runtime]
            async fn cluster() {
                let test = concat!(module_path!(), "::cluster");
                if !fencelock_testing::requires(fencelock_testing::Feature::ShardedPubSub, test) {
                    return;
                }
                body($crate::common::Env::start($crate::common::Topology::Cluster)).await
            }
        }
    )* };
    ($($tests:tt)*) => { $crate::on_topologies!(@runtime () $($tests)*); };
}

/// [`on_topologies!`] on a two-worker runtime, for tests about real parallelism.
#[macro_export]
macro_rules! on_topologies_multi_thread {
    ($($tests:tt)*) => {
        $crate::on_topologies!(@runtime (flavor = "multi_thread", worker_threads = 2) $($tests)*);
    };
}

/// A small deterministic generator (xorshift64) for the cancellation tests, so a failing case
/// replays from its printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The permits a semaphore's (or read-write lock's) hash counts: the sum over its holds'
/// fields, whichever way it keeps their deadlines. A hash on the lease-zset path (no `~expiry`)
/// also keeps `~used`: `Err` when it disagrees. An empty hash (gone since it was listed) holds 0.
pub fn permits_held(hash: &std::collections::HashMap<String, String>) -> Result<u32, String> {
    let sum = hash
        .iter()
        .filter(|(field, _)| !field.starts_with('~'))
        .map(|(_, held)| held.split(':').next().unwrap().parse::<u32>().unwrap())
        .sum::<u32>();
    let zset_path = hash.get("~expiry").map(String::as_str) != Some("fields");
    if !hash.is_empty() && zset_path && hash.get("~used") != Some(&sum.to_string()) {
        return Err(format!("~used disagrees with the holds: {hash:?}"));
    }
    Ok(sum)
}
