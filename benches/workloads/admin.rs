//! The administrative connection to a benchmark's server: INFO, command stats, SCAN, MEMORY USAGE.

use std::collections::BTreeMap;
use std::time::Duration;

use fencelock_testing::RedisServer;

use crate::common::Kind;

/// An administrative connection to the benchmark's server (never part of a measurement).
pub struct Admin {
    conn: redis::aio::MultiplexedConnection,
}

impl Admin {
    pub async fn new(server: &RedisServer) -> Admin {
        Admin {
            conn: server
                .client()
                .get_multiplexed_async_connection()
                .await
                .expect("admin connection"),
        }
    }

    async fn info(&mut self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.conn)
            .await
            .expect("INFO")
    }

    async fn field(&mut self, section: &str, key: &str) -> String {
        let info = self.info(section).await;
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    pub async fn reset_stats(&mut self) {
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.conn)
            .await
            .expect("CONFIG RESETSTAT");
    }

    /// Calls and server µs per command since the last reset, leaving out our own
    /// administration.
    pub async fn command_stats(&mut self) -> BTreeMap<String, (u64, f64)> {
        let info = self.info("commandstats").await;
        let mut stats = BTreeMap::new();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if [
                "info", "config", "hello", "client", "ping", "select", "scan", "memory",
            ]
            .iter()
            .any(|admin| name.starts_with(admin))
            {
                continue;
            }
            let field = |key: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            stats.insert(name.to_owned(), (field("calls") as u64, field("usec")));
        }
        stats
    }

    /// Round trips since the last reset: calls of the commands `kind` sends itself, by
    /// name. `INFO commandstats` also counts the commands scripts run inside (`SET` in
    /// acquire.lua, say), so only the commands that no contender's script calls are counted,
    /// plus `SET` for the peers, whose scripts never call it. W1 checks this against `MONITOR`.
    pub async fn round_trips(&mut self, kind: Kind) -> BTreeMap<String, u64> {
        let mut top_level = vec!["evalsha", "eval", "script|load", "subscribe", "unsubscribe"];
        if matches!(kind, Kind::Rslock | Kind::Distkit) {
            top_level.push("set");
        }
        self.command_stats()
            .await
            .into_iter()
            .filter(|(name, _)| top_level.contains(&name.as_str()))
            .map(|(name, (calls, _))| (name, calls))
            .collect()
    }

    pub async fn used_memory(&mut self) -> i64 {
        self.field("memory", "used_memory")
            .await
            .parse()
            .expect("used_memory")
    }

    /// Redis' own CPU time (user + system), from `INFO cpu`.
    pub async fn cpu(&mut self) -> Duration {
        let info = self.info("cpu").await;
        let get = |key: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}:")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Duration::from_secs_f64(get("used_cpu_sys") + get("used_cpu_user"))
    }

    pub async fn scan(&mut self, pattern: &str) -> Vec<Vec<u8>> {
        let mut cursor = 0u64;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn)
                .await
                .expect("SCAN");
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    pub async fn memory_usage(&mut self, key: &[u8]) -> i64 {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut self.conn)
            .await
            .expect("MEMORY USAGE")
    }

    pub async fn query<T: redis::FromRedisValue, C: AdminQuery>(&mut self, cmd: &C) -> T {
        cmd.run(&mut self.conn).await
    }
}

/// A command or a pipeline, for [`Admin::query`].
pub trait AdminQuery {
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> T;
}

impl AdminQuery for redis::Cmd {
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> T {
        self.query_async(conn).await.expect("admin command")
    }
}

impl AdminQuery for redis::Pipeline {
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> T {
        self.query_async(conn).await.expect("admin pipeline")
    }
}
