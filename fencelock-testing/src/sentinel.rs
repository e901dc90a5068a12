//! A throwaway primary with replicas watched by Sentinels (`redis-server <conf> --sentinel`,
//! so no separate `redis-sentinel` binary is needed).

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::ports::PortReservation;
use crate::process::{find_redis_server, log_tail, Probe, Process};
use crate::{RedisServer, REDIS_SERVER_ENV};

/// The name the Sentinels monitor the primary under.
pub const SENTINEL_MASTER_NAME: &str = "fencelock";

/// How long a Sentinel waits before it calls a node down: short, so a failover completes in a
/// few seconds, but not 1 s. A Sentinel that switches to a promoted replica opens a new link to
/// it and calls it down if no `PONG` comes back within this time; at 1 s on a loaded 2-core
/// machine all three did, about a second after promoting it, and failed over a second time
/// (seen in CI and reproduced here, about 1 run in 20 under load).
const DOWN_AFTER_MS: u64 = 3000;
/// Failover timeout: a stuck failover is retried by another Sentinel after this.
const FAILOVER_TIMEOUT_MS: u64 = 5000;
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One Sentinel process.
struct Sentinel {
    process: Option<Process>,
    port: PortReservation,
    dir: TempDir,
}

/// A primary, its replicas and three Sentinels (quorum 2), each on its own free loopback port
/// and in its own directory, all stopped when dropped.
///
/// ```no_run
/// use fencelock_testing::RedisSentinels;
///
/// let mut set = RedisSentinels::start(2)?; // a primary, 2 replicas, 3 Sentinels
/// let old = set.primary()?.port();
/// set.kill_primary()?;
/// let new = set.wait_for_failover(old, std::time::Duration::from_secs(30))?;
/// assert_ne!(old, new);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct RedisSentinels {
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

impl std::fmt::Debug for RedisSentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSentinels")
            .field(
                "servers",
                &self
                    .servers
                    .iter()
                    .map(RedisServer::port)
                    .collect::<Vec<_>>(),
            )
            .field(
                "sentinels",
                &self
                    .sentinels
                    .iter()
                    .map(|s| s.port.port())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RedisSentinels {
    /// Starts a primary with `replicas` replicas and three Sentinels, and waits until every
    /// replica is in sync and every Sentinel knows the replicas and the other Sentinels.
    ///
    /// # Errors
    ///
    /// Fails if a process does not start or the set does not settle within 30 s.
    pub fn start(replicas: usize) -> io::Result<Self> {
        RedisSentinels::start_with(replicas, None)
    }

    /// As [`RedisSentinels::start`], with every data node requiring `password` (`requirepass`,
    /// and `masterauth` so that replicas, and a demoted primary, can sync). The Sentinels
    /// themselves require none; they authenticate to the data nodes with `auth-pass`.
    ///
    /// # Errors
    ///
    /// See [`RedisSentinels::start`].
    pub fn start_with_password(replicas: usize, password: &str) -> io::Result<Self> {
        RedisSentinels::start_with(replicas, Some(password))
    }

    fn start_with(replicas: usize, password: Option<&str>) -> io::Result<Self> {
        let node = || {
            let builder = RedisServer::builder()
                .config("repl-diskless-sync", "yes")
                .config("repl-diskless-sync-delay", "0");
            match password {
                Some(password) => builder.password(password).config("masterauth", password),
                None => builder,
            }
        };
        let primary = node().start()?;
        let mut servers = vec![];
        for _ in 0..replicas {
            servers.push(node().replica_of(primary.addr()).start()?);
        }
        for replica in &servers {
            replica.wait_for_replication(0, START_TIMEOUT)?;
        }
        servers.insert(0, primary);
        let binary = find_redis_server(std::env::var_os(REDIS_SERVER_ENV).as_deref())?;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(start_sentinel(&binary, servers[0].addr(), password)?);
        }
        let set = RedisSentinels { servers, sentinels };
        set.wait_until_settled(replicas)?;
        Ok(set)
    }

    /// `redis://127.0.0.1:port/` of every Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port.port()))
            .collect()
    }

    /// The name of the monitored primary, [`SENTINEL_MASTER_NAME`].
    pub fn master_name(&self) -> &str {
        SENTINEL_MASTER_NAME
    }

    /// The primary and replicas, in start order (the first was the first primary).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The current primary as the first answering Sentinel reports it.
    ///
    /// # Errors
    ///
    /// Fails if no Sentinel answers or the address is not one of ours.
    pub fn primary(&self) -> io::Result<&RedisServer> {
        let port = self.primary_port()?;
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .ok_or_else(|| io::Error::other(format!("Sentinel names unknown primary :{port}")))
    }

    /// The replicas of the current primary that are running.
    ///
    /// # Errors
    ///
    /// See [`RedisSentinels::primary`].
    pub fn replicas(&self) -> io::Result<Vec<&RedisServer>> {
        let port = self.primary_port()?;
        Ok(self
            .servers
            .iter()
            .filter(|s| s.port() != port && s.is_running())
            .collect())
    }

    /// Kills the current primary with `SIGKILL` and returns its port.
    ///
    /// # Errors
    ///
    /// See [`RedisSentinels::primary`].
    pub fn kill_primary(&mut self) -> io::Result<u16> {
        let port = self.primary_port()?;
        if let Some(server) = self.servers.iter_mut().find(|s| s.port() == port) {
            server.kill();
        }
        Ok(port)
    }

    /// Asks a Sentinel for a graceful failover (`SENTINEL FAILOVER`): a replica is promoted
    /// and the old primary, still running, becomes its replica. Returns the old primary's port;
    /// follow with [`RedisSentinels::wait_for_failover`].
    ///
    /// # Errors
    ///
    /// Fails if no Sentinel accepts the request.
    pub fn failover(&self) -> io::Result<u16> {
        let old = self.primary_port()?;
        let mut last = None;
        for sentinel in &self.sentinels {
            let result = sentinel_connection(sentinel.port.port()).and_then(|mut con| {
                redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(SENTINEL_MASTER_NAME)
                    .query::<()>(&mut con)
                    .map_err(io::Error::other)
            });
            match result {
                Ok(()) => return Ok(old),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no Sentinel")))
    }

    /// Waits until the Sentinels name a primary other than `old_port` and that server
    /// answers as a primary; returns its port.
    ///
    /// # Errors
    ///
    /// Fails with [`io::ErrorKind::TimedOut`] if that does not happen within `timeout`.
    pub fn wait_for_failover(&self, old_port: u16, timeout: Duration) -> io::Result<u16> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(port) = self.primary_port() {
                let is_primary = self
                    .servers
                    .iter()
                    .find(|s| s.port() == port)
                    .and_then(|s| role(s).ok())
                    .is_some_and(|r| r == "master");
                if port != old_port && is_primary {
                    return Ok(port);
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no failover away from :{old_port} within {timeout:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every running server other than the current primary replicates it with its
    /// link up (`master_link_status:up` in `INFO replication`), as the Sentinels reconfigure the
    /// remaining replicas after a failover. `WAIT` at the new primary counts only those.
    ///
    /// # Errors
    ///
    /// Fails if that does not happen within `timeout`; the error carries every server's role
    /// and link and the tail of every Sentinel's log, which is what tells a slow resync from a
    /// replica the Sentinels never reconfigured.
    pub fn wait_for_replicas_to_follow(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(port) = self.primary_port() {
                let following = self
                    .servers
                    .iter()
                    .filter(|s| s.port() != port && s.is_running())
                    .all(|s| {
                        replication_info(s).is_ok_and(|info| {
                            info.contains(&format!("master_port:{port}\r\n"))
                                && info.contains("master_link_status:up")
                        })
                    });
                if following {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the replicas did not follow the new primary within {timeout:?}\n{}",
                        self.diagnostics()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every server's `INFO replication` and the tail of every Sentinel's log, for a failing
    /// test to print: it tells a slow resync from a replica the Sentinels never reconfigured
    /// or a second failover.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for server in &self.servers {
            let info = if server.is_running() {
                replication_info(server).unwrap_or_else(|err| format!("<INFO failed: {err}>"))
            } else {
                "<stopped>".to_owned()
            };
            let _ = writeln!(out, "--- server :{} ---\n{}", server.port(), info.trim());
        }
        for sentinel in &self.sentinels {
            let _ = writeln!(
                out,
                "--- sentinel :{} log ---\n{}",
                sentinel.port.port(),
                log_tail(&sentinel.dir.path().join("sentinel.log"))
            );
        }
        out
    }

    fn primary_port(&self) -> io::Result<u16> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match sentinel_master_addr(sentinel.port.port()) {
                Ok(port) => return Ok(port),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no Sentinel")))
    }

    fn wait_until_settled(&self, replicas: usize) -> io::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut settled = true;
            for sentinel in &self.sentinels {
                let fields = sentinel_master_fields(sentinel.port.port()).unwrap_or_default();
                let number = |name: &str| {
                    fields
                        .iter()
                        .position(|f| f == name)
                        .and_then(|i| fields.get(i + 1))
                        .and_then(|v| v.parse::<usize>().ok())
                };
                if number("num-slaves") != Some(replicas)
                    || number("num-other-sentinels") != Some(self.sentinels.len() - 1)
                {
                    settled = false;
                }
            }
            if settled {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the Sentinels did not discover the replicas and each other in time",
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        // Sentinels first, so they do not start a failover while the servers go away.
        for sentinel in &mut self.sentinels {
            drop(sentinel.process.take());
        }
    }
}

fn start_sentinel(
    binary: &std::path::Path,
    primary: SocketAddr,
    password: Option<&str>,
) -> io::Result<Sentinel> {
    let dir = tempfile::Builder::new()
        .prefix("fencelock-sentinel-")
        .tempdir()?;
    let conf_path: PathBuf = dir.path().join("sentinel.conf");
    let mut conf = String::from("bind 127.0.0.1\nprotected-mode no\ndaemonize no\nlogfile \"\"\n");
    let name = SENTINEL_MASTER_NAME;
    let _ = writeln!(
        conf,
        "dir {}\nsentinel monitor {name} {} {} 2\n\
         sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {name} 2",
        dir.path().display(),
        primary.ip(),
        primary.port()
    );
    if let Some(password) = password {
        let _ = writeln!(conf, "sentinel auth-pass {name} {password}");
    }
    fs::write(&conf_path, conf)?;
    let log_path = dir.path().join("sentinel.log");
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = PortReservation::new()?;
        let process = Process::spawn(
            binary,
            [
                conf_path.as_os_str().to_owned(),
                "--sentinel".into(),
                "--port".into(),
                port.port().to_string().into(),
            ],
            dir.path(),
            &log_path,
        )?;
        let probe = Probe {
            addr: SocketAddrV4::new(Ipv4Addr::LOCALHOST, port.port()).into(),
            username: None,
            password: None,
        };
        match process.wait_ready(&probe, START_TIMEOUT) {
            Ok(()) => {
                return Ok(Sentinel {
                    process: Some(process),
                    port,
                    dir,
                })
            }
            Err(err) if err.port_conflict && attempt < 3 => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

fn sentinel_connection(port: u16) -> io::Result<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
        .map_err(io::Error::other)
}

fn sentinel_master_addr(port: u16) -> io::Result<u16> {
    let (_, primary_port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(SENTINEL_MASTER_NAME)
        .query(&mut sentinel_connection(port)?)
        .map_err(io::Error::other)?;
    Ok(primary_port)
}

fn sentinel_master_fields(port: u16) -> io::Result<Vec<String>> {
    redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(SENTINEL_MASTER_NAME)
        .query(&mut sentinel_connection(port)?)
        .map_err(io::Error::other)
}

fn replication_info(server: &RedisServer) -> io::Result<String> {
    let mut con = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .map_err(io::Error::other)?;
    redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .map_err(io::Error::other)
}

fn role(server: &RedisServer) -> io::Result<String> {
    let mut con = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .map_err(io::Error::other)?;
    let reply: Vec<redis::Value> = redis::cmd("ROLE")
        .query(&mut con)
        .map_err(io::Error::other)?;
    match reply.first() {
        Some(redis::Value::BulkString(role)) => Ok(String::from_utf8_lossy(role).into_owned()),
        other => Err(io::Error::other(format!("unexpected ROLE reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_fail_over_to_a_replica() {
        let started = Instant::now();
        let mut set = RedisSentinels::start(2).unwrap();
        eprintln!(
            "primary, 2 replicas, 3 sentinels up in {:?}",
            started.elapsed()
        );
        assert_eq!(set.replicas().unwrap().len(), 2);
        let old = set.kill_primary().unwrap();
        let started = Instant::now();
        let new = set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
        eprintln!("failover in {:?}", started.elapsed());
        assert_ne!(new, old);
        set.wait_for_replicas_to_follow(Duration::from_secs(60))
            .unwrap();
        let remaining = set.replicas().unwrap();
        assert_eq!(remaining.len(), 1, "the killed primary is not counted");
        let info = replication_info(remaining[0]).unwrap();
        assert!(info.contains(&format!("master_port:{new}\r\n")), "{info}");
        assert!(set.diagnostics().contains("<stopped>"));
    }
}
