//! Which server the harness runs: the binary [`crate::REDIS_SERVER_ENV`] names (or
//! `redis-server` on `PATH`), what it reports about itself, and what follows for a test.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::process::find_redis_server;
use crate::REDIS_SERVER_ENV;

/// The server binary the harness starts, as its `--version` describes it.
///
/// Tests that depend on what a server can do ask it, and skip (saying why) where a server
/// cannot: see [`ServerBinary::lacks`].
///
/// ```no_run
/// let server = fencelock_testing::ServerBinary::current()?;
/// println!("testing against {server}"); // "Redis 7.0.15", "Valkey 9.1.2"
/// if let Some(missing) = server.lacks(fencelock_testing::Feature::ShardedPubSub) {
///     eprintln!("no cluster tests here: {missing}");
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBinary {
    path: PathBuf,
    valkey: bool,
    version: (u32, u32, u32),
}

/// Something a test needs of the server binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Feature {
    /// Sharded pub/sub: Redis 7.0+, every Valkey. A fencelock cluster client needs it.
    ShardedPubSub,
    /// `redis.acl_check_cmd` in scripts: Redis 7.0+, every Valkey.
    AclCheckCmd,
    /// 7.0's command and config names (`PEXPIRETIME`, `busy-reply-threshold`,
    /// `cluster-port`): Redis 7.0+, every Valkey.
    Redis7Commands,
    /// Expiry per hash field (`HPEXPIRE`): Redis 7.4+, Valkey 9.0+.
    HashFieldExpiry,
    /// TLS: only builds compiled with it (Debian's redis-server is; the PyPI wheels are not).
    Tls,
}

impl ServerBinary {
    /// The binary the harness would start now ([`crate::REDIS_SERVER_ENV`], else `PATH`),
    /// read once per path.
    ///
    /// # Errors
    /// When no binary is found or it does not run.
    pub fn current() -> io::Result<ServerBinary> {
        let path = find_redis_server(std::env::var_os(REDIS_SERVER_ENV).as_deref())?;
        ServerBinary::at(&path)
    }

    /// The binary at `path`.
    ///
    /// # Errors
    /// When it does not run or does not say which server it is.
    pub fn at(path: &Path) -> io::Result<ServerBinary> {
        static SEEN: OnceLock<Mutex<HashMap<PathBuf, ServerBinary>>> = OnceLock::new();
        let mut seen = SEEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = seen.get(path) {
            return Ok(known.clone());
        }
        let output = Command::new(path).arg("--version").output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let binary = ServerBinary::parse(path, &text).ok_or_else(|| {
            io::Error::other(format!(
                "{} --version said {text:?}, not a Redis or Valkey server",
                path.display()
            ))
        })?;
        seen.insert(path.to_owned(), binary.clone());
        Ok(binary)
    }

    /// Reads `Redis server v=7.0.15 sha=...` or `Valkey server v=9.1.2 ...`.
    fn parse(path: &Path, text: &str) -> Option<ServerBinary> {
        let valkey = text.starts_with("Valkey server");
        if !valkey && !text.starts_with("Redis server") {
            return None;
        }
        let version = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        Some(ServerBinary {
            path: path.to_owned(),
            valkey,
            version: (
                parts.next()?,
                parts.next().unwrap_or(0),
                parts.next().unwrap_or(0),
            ),
        })
    }

    /// Where the binary is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it is Valkey (else Redis).
    pub fn is_valkey(&self) -> bool {
        self.valkey
    }

    /// The version it reports, as `(major, minor, patch)`.
    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    /// Whether it is at least Redis 7.0 (every Valkey is: Valkey forked Redis 7.2).
    fn redis7(&self) -> bool {
        self.valkey || self.version >= (7, 0, 0)
    }

    /// Whether the binary has `feature`: `None` when it does, else a sentence saying what it
    /// lacks, for a test's skip message.
    pub fn lacks(&self, feature: Feature) -> Option<String> {
        let has = match feature {
            Feature::ShardedPubSub | Feature::AclCheckCmd | Feature::Redis7Commands => {
                self.redis7()
            }
            Feature::HashFieldExpiry => {
                if self.valkey {
                    self.version >= (9, 0, 0)
                } else {
                    self.version >= (7, 4, 0)
                }
            }
            Feature::Tls => self.has_tls(),
        };
        let needs = match feature {
            Feature::ShardedPubSub => "sharded pub/sub (Redis 7.0+)",
            Feature::AclCheckCmd => "redis.acl_check_cmd (Redis 7.0+)",
            Feature::Redis7Commands => "Redis 7.0's commands and settings",
            Feature::HashFieldExpiry => "hash-field expiry (Redis 7.4+, Valkey 9.0+)",
            Feature::Tls => "TLS support (this build was compiled without it)",
        };
        (!has).then(|| format!("{self} has no {needs}"))
    }

    /// Whether the binary was built with TLS: a throwaway server with a TLS port starts
    /// (checked once per binary).
    fn has_tls(&self) -> bool {
        static TLS: OnceLock<Mutex<HashMap<PathBuf, bool>>> = OnceLock::new();
        let mut known = TLS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *known.entry(self.path.clone()).or_insert_with(|| {
            // A build without TLS refuses the directive ("Bad directive") or the connection
            // type ("Missing implement of connection type tls") before it listens anywhere.
            crate::RedisServer::builder()
                .binary(&self.path)
                .tls(true)
                .start()
                .is_ok()
        })
    }
}

/// Environment variable naming a file to which every skipped test appends one line (see
/// [`requires`]): how the server-matrix runner (`scripts/test-servers`) lists what did not run
/// on which server, and why.
pub const SKIP_LOG_ENV: &str = "FENCELOCK_SKIP_LOG";

/// Whether the server binary under test has `feature`. When it does not, `test` is skipped and
/// says why: `SKIPPED <test>: <reason>` on stderr, and the same line appended to the file named
/// by [`SKIP_LOG_ENV`] when it is set. The caller returns early on `false`; a skip is never a
/// silent pass.
///
/// ```no_run
/// use fencelock_testing::{requires, Feature};
///
/// #[test]
/// fn locks_work_over_tls() {
///     if !requires(Feature::Tls, "locks_work_over_tls") {
///         return;
///     }
///     // ...
/// }
/// ```
///
/// # Panics
/// When no server binary can be found or run: a test that cannot tell must not pass.
pub fn requires(feature: Feature, test: &str) -> bool {
    let binary = ServerBinary::current().expect("the server binary under test");
    match binary.lacks(feature) {
        None => true,
        Some(reason) => {
            let line = format!("SKIPPED {test}: {reason}");
            eprintln!("{line}");
            if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
                use std::io::Write as _;
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut file| writeln!(file, "{line}"));
                if let Err(err) = written {
                    panic!("{test}: could not record its skip in {path:?}: {err}");
                }
            }
            false
        }
    }
}

impl std::fmt::Display for ServerBinary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor, patch) = self.version;
        let name = if self.valkey { "Valkey" } else { "Redis" };
        write!(f, "{name} {major}.{minor}.{patch}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_lines_of_both_servers_are_read() {
        let path = Path::new("/x");
        let redis = ServerBinary::parse(
            path,
            "Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64 build=dff95a8e7a99d269",
        )
        .unwrap();
        assert_eq!((redis.is_valkey(), redis.version()), (false, (6, 2, 14)));
        assert!(redis
            .lacks(Feature::ShardedPubSub)
            .unwrap()
            .contains("Redis 6.2.14"));
        assert!(redis.lacks(Feature::HashFieldExpiry).is_some());
        let valkey = ServerBinary::parse(path, "Valkey server v=9.1.2 sha=00000000:1").unwrap();
        assert_eq!(valkey.to_string(), "Valkey 9.1.2");
        assert_eq!(valkey.lacks(Feature::ShardedPubSub), None);
        assert_eq!(valkey.lacks(Feature::HashFieldExpiry), None);
        let eight = ServerBinary::parse(path, "Redis server v=8.2.3 sha=b5d43ceb:0").unwrap();
        assert_eq!(eight.lacks(Feature::Redis7Commands), None);
        assert_eq!(eight.lacks(Feature::HashFieldExpiry), None);
        assert!(ServerBinary::parse(path, "KeyDB server v=6.3.4").is_none());
    }

    #[test]
    fn the_current_binary_runs_and_says_what_it_is() {
        let server = ServerBinary::current().unwrap();
        assert!(server.version() >= (6, 0, 0), "{server}");
    }
}
