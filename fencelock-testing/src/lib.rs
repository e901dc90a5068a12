#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod binary;
pub mod check;
mod cluster;
mod ports;
mod postgres;
mod process;
mod proxy;
mod redis_server;
mod sentinel;

pub use binary::{requires, Feature, ServerBinary, SKIP_LOG_ENV};
pub use cluster::{ClusterNode, RedisCluster, RedisClusterBuilder};
pub use postgres::{PostgresServer, POSTGRES_BIN_DIR_ENV};
pub use process::{process_exists, send_signal, Signal};
pub use proxy::{Direction, DirectionStats, Fault, FaultProxy, Stats};
pub use redis_server::{RedisServer, RedisServerBuilder};
pub use sentinel::{RedisSentinels, SENTINEL_MASTER_NAME};

/// Environment variable that names the `redis-server` binary to run,
/// overriding the lookup on `PATH`.
pub const REDIS_SERVER_ENV: &str = "FENCELOCK_REDIS_SERVER";
