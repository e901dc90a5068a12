//! Throwaway `redis-server` processes for tests, benches and examples.
//!
//! Correctness claims about a distributed lock are only worth something when
//! they are checked against a real server that can be killed, restarted,
//! paused and misconfigured on demand. This module starts such servers:
//! each [`RedisServer`] runs its own `redis-server` process on a free
//! loopback port, in a private temporary directory, and is killed when the
//! value is dropped — also when the test that owns it panics.
//!
//! The module is compiled only with the `testing` feature.
//!
//! [`check`] is the property harness' history checker: record what the holders of a lock saw
//! (grants, critical sections, fenced writes) and check mutual exclusion, fencing, re-entry
//! tokens and cleanup over the whole history, for your own critical sections too
//! (`examples/transfer_check.rs`).
//!
//! # Finding `redis-server`
//!
//! The binary named by the `FENCELOCK_REDIS_SERVER` environment variable is
//! used if it is set; otherwise `redis-server` is looked up on `PATH`. On
//! Debian and Ubuntu it is installed with `apt-get install -y redis-server`.
//!
//! # Example
//!
//! ```no_run
//! use fencelock::testing::RedisServer;
//!
//! let server = RedisServer::start()?;
//! let mut con = server.client().get_connection()?;
//! let pong: String = redis::cmd("PING").query(&mut con)?;
//! assert_eq!(pong, "PONG");
//! // The process is killed and its directory removed here.
//! drop(server);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Limits
//!
//! Cleanup relies on `Drop`. A test binary that aborts (for example with
//! `panic = "abort"`) or is killed with `SIGKILL` leaves its servers
//! running. Interrupting `cargo test` with Ctrl-C is fine: the servers share
//! the terminal's process group and receive the same `SIGINT`.

pub mod check;
mod cluster;
#[cfg(feature = "negative-controls")]
pub mod controls;
mod ports;
mod postgres;
mod process;
mod proxy;
mod redis_server;
mod sentinel;

pub use cluster::{ClusterNode, RedisCluster, RedisClusterBuilder};
pub use postgres::{PostgresServer, POSTGRES_BIN_DIR_ENV};
pub use proxy::{Direction, DirectionStats, Fault, FaultProxy, Stats};
pub use redis_server::{RedisServer, RedisServerBuilder};
pub use sentinel::{RedisSentinels, SENTINEL_MASTER_NAME};

/// Environment variable that names the `redis-server` binary to run,
/// overriding the lookup on `PATH`.
pub const REDIS_SERVER_ENV: &str = "FENCELOCK_REDIS_SERVER";
