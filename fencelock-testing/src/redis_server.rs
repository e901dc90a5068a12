//! A standalone throwaway Redis server.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use tempfile::TempDir;

use crate::ports::PortReservation;
use crate::process::{find_redis_server, log_tail, Probe, Process, Signal, StartError};
use crate::REDIS_SERVER_ENV;

/// Fresh ports to try when the first one is taken between our probe and
/// the server's `bind`.
const START_ATTEMPTS: usize = 8;
/// Tries to get the server's own port back on restart; the port may be
/// held briefly by an outgoing connection that happened to pick it.
const RESTART_ATTEMPTS: usize = 3;
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Linux's `sun_path` holds 108 bytes including the terminating NUL.
const MAX_UNIX_SOCKET_PATH: usize = 107;

#[derive(Debug, Clone)]
enum Acl {
    File(PathBuf),
    Lines(Vec<String>),
}

#[derive(Debug, Clone)]
struct Credentials {
    username: Option<String>,
    password: String,
}

/// Configures a [`RedisServer`] before starting it; created by
/// [`RedisServer::builder`].
///
/// A builder can start any number of identically configured servers, for
/// example the independent nodes of a multi-node lock.
///
/// # Example
///
/// ```no_run
/// use fencelock_testing::RedisServer;
///
/// let server = RedisServer::builder()
///     .persistence(true)
///     .password("hunter2")
///     .config("maxmemory", "64mb")
///     .start()?;
/// assert!(server.url().starts_with("redis://:hunter2@127.0.0.1:"));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisServerBuilder {
    persistence: bool,
    requirepass: Option<String>,
    credentials: Option<Credentials>,
    acl: Option<Acl>,
    unix_socket: bool,
    replica_of: Option<SocketAddr>,
    config: Vec<(String, String)>,
    binary: Option<PathBuf>,
    startup_timeout: Duration,
    tls: bool,
    cluster_bus: bool,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        Self {
            persistence: false,
            requirepass: None,
            credentials: None,
            acl: None,
            unix_socket: false,
            replica_of: None,
            config: Vec::new(),
            binary: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            tls: false,
            cluster_bus: false,
        }
    }
}

impl RedisServerBuilder {
    /// Whether acknowledged writes survive [`RedisServer::restart`] and
    /// [`RedisServer::kill`]. Off by default.
    ///
    /// On means an append-only file fsynced on every write
    /// (`appendonly yes`, `appendfsync always`), so even `SIGKILL` loses
    /// nothing that was acknowledged. Off means no RDB snapshots and no AOF,
    /// so every restart comes back empty — the case that fencing tokens
    /// must survive.
    pub fn persistence(mut self, enabled: bool) -> Self {
        self.persistence = enabled;
        self
    }

    /// Requires `password` from clients (`requirepass`), and makes
    /// [`RedisServer::url`] and the readiness check use it.
    ///
    /// Replaces earlier [`credentials`](Self::credentials). With an ACL
    /// file the file decides, so define the `default` user's password there
    /// instead.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        let password = password.into();
        self.requirepass = Some(password.clone());
        self.credentials = Some(Credentials {
            username: None,
            password,
        });
        self
    }

    /// The user the harness itself authenticates as, in
    /// [`RedisServer::url`] and while waiting for the server to come up.
    ///
    /// Configures nothing on the server; pair it with
    /// [`acl_lines`](Self::acl_lines) or [`acl_file`](Self::acl_file)
    /// that define the user.
    ///
    /// Without credentials that may run `PING`, startup cannot tell a
    /// server that is still loading its data from a ready one.
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            username: Some(username.into()),
            password: password.into(),
        });
        self
    }

    /// Also serves TLS on a second loopback port ([`RedisServer::tls_url`]), with a
    /// certificate for `127.0.0.1` and `localhost` signed by a throwaway CA made for this server
    /// ([`RedisServer::tls_ca_cert_pem`]). Clients need not present certificates. Off by
    /// default.
    ///
    /// The certificates are made with the `openssl` command-line tool, which must be on `PATH`
    /// (Debian's `openssl` package; `ca-certificates` depends on it). The plain port stays
    /// open as well, for the harness' own readiness probe and admin commands
    /// ([`RedisServer::url`]); point the clients under test at [`RedisServer::tls_url`].
    ///
    /// ```no_run
    /// use fencelock_testing::RedisServer;
    ///
    /// let server = RedisServer::builder().tls(true).start()?;
    /// assert!(server.tls_url().unwrap().starts_with("rediss://127.0.0.1:"));
    /// let ca_pem: Vec<u8> = server.tls_ca_cert_pem()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self, enabled: bool) -> Self {
        self.tls = enabled;
        self
    }

    /// The harness chooses the cluster bus port (`--cluster-port`, Redis 7.0+ and every
    /// Valkey) as it chooses the client port, and a start that finds a port taken tries again
    /// with every port new. A bus port fixed in the configuration stayed the same on each try,
    /// so a node whose bus port another process took failed every try.
    pub(crate) fn cluster_bus(mut self) -> Self {
        self.cluster_bus = true;
        self
    }

    /// Loads users from a copy of the ACL file at `path` (`aclfile`).
    ///
    /// The copy lives in the server's directory, so `ACL SAVE` cannot
    /// modify the original. Replaces earlier [`acl_lines`](Self::acl_lines).
    pub fn acl_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.acl = Some(Acl::File(path.into()));
        self
    }

    /// Loads users from these ACL file lines (`aclfile`), such as
    /// `"user app on >secret ~lock:* +@all"`.
    ///
    /// Replaces an earlier [`acl_file`](Self::acl_file).
    ///
    /// ```no_run
    /// use fencelock_testing::RedisServer;
    ///
    /// let server = RedisServer::builder()
    ///     .acl_lines(["user default off", "user app on >secret ~* +@all"])
    ///     .credentials("app", "secret")
    ///     .start()?;
    /// assert!(server.url().starts_with("redis://app:secret@"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn acl_lines<I, S>(mut self, lines: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.acl = Some(Acl::Lines(lines.into_iter().map(Into::into).collect()));
        self
    }

    /// Adds the line `key value` to the generated `redis.conf`.
    ///
    /// `value` is written verbatim, exactly as in a `redis.conf` file, so
    /// `config("client-output-buffer-limit", "pubsub 0 0 0")` passes three
    /// arguments; an empty value is written as `""`. These lines come after
    /// the ones the builder generates and so override them. The port and
    /// bind address cannot be overridden.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Starts the server as a replica of the server at `primary`
    /// (`replicaof <ip> <port>` in the generated `redis.conf`).
    ///
    /// The replica is ready when it answers `PING`, which it does before
    /// its first sync has finished; use
    /// [`RedisServer::wait_for_replication`] with the primary's
    /// [`replication_offset`](RedisServer::replication_offset) to wait for
    /// the data. Give the primary `.config("repl-diskless-sync-delay", "0")`,
    /// or Redis waits 5 seconds before every full sync. A primary with a
    /// password needs `.config("masterauth", ...)` here as well.
    ///
    /// `primary` may be a [`FaultProxy`](super::FaultProxy) in front of the
    /// primary, to cut or delay the replication link. That is also the way
    /// to make a replica miss a write: [`RedisServer::pause`] on the replica
    /// is not enough, because what the primary sent meanwhile waits in the
    /// replica's socket buffer and is applied when it resumes, even after
    /// the primary was killed.
    ///
    /// ```no_run
    /// use fencelock_testing::RedisServer;
    ///
    /// let primary = RedisServer::builder()
    ///     .config("repl-diskless-sync-delay", "0")
    ///     .start()?;
    /// let replica = RedisServer::builder().replica_of(primary.addr()).start()?;
    /// let mut con = primary.client().get_connection()?;
    /// redis::cmd("SET").arg("k").arg("v").query::<()>(&mut con)?;
    /// replica.wait_for_replication(primary.replication_offset()?, std::time::Duration::from_secs(10))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replica_of(mut self, primary: SocketAddr) -> Self {
        self.replica_of = Some(primary);
        self
    }

    /// Same as [`config`](Self::config); named after the command-line form
    /// `redis-server --key value`.
    pub fn arg(self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config(key, value)
    }

    /// Whether to listen on a unix socket in the server's directory as
    /// well; see [`RedisServer::unix_socket_path`]. Off by default.
    pub fn unix_socket(mut self, enabled: bool) -> Self {
        self.unix_socket = enabled;
        self
    }

    /// Runs this binary instead of looking up `redis-server` through
    /// [`REDIS_SERVER_ENV`] and `PATH`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// How long [`start`](Self::start) and [`RedisServer::restart`] wait
    /// for the server to answer and finish loading; 15 seconds by default.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// Fails if `redis-server` cannot be found, the configuration is
    /// invalid, or the server does not come up within the startup timeout.
    /// Errors about the server itself end with the tail of its log.
    pub fn start(&self) -> io::Result<RedisServer> {
        self.validate()?;
        let binary = match &self.binary {
            Some(binary) => binary.clone(),
            None => find_redis_server(std::env::var_os(REDIS_SERVER_ENV).as_deref())?,
        };
        let dir = tempfile::Builder::new()
            .prefix("fencelock-redis-")
            .tempdir()?;

        let unix_socket = self.unix_socket.then(|| dir.path().join("redis.sock"));
        if let Some(socket) = &unix_socket {
            if socket.as_os_str().len() > MAX_UNIX_SOCKET_PATH {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "unix socket path {} is longer than {MAX_UNIX_SOCKET_PATH} bytes; \
                         point TMPDIR at a shorter directory",
                        socket.display()
                    ),
                ));
            }
        }

        let acl_path = dir.path().join("users.acl");
        let acl_path = match &self.acl {
            None => None,
            Some(Acl::File(source)) => {
                fs::copy(source, &acl_path).map_err(|err| {
                    io::Error::new(
                        err.kind(),
                        format!("cannot copy ACL file {}: {err}", source.display()),
                    )
                })?;
                Some(acl_path)
            }
            Some(Acl::Lines(lines)) => {
                let mut text = lines.join("\n");
                text.push('\n');
                fs::write(&acl_path, text)?;
                Some(acl_path)
            }
        };

        let tls = if self.tls {
            make_tls_files(dir.path())?;
            Some(PortReservation::new()?)
        } else {
            None
        };
        let cluster_bus = self.cluster_bus.then(PortReservation::new).transpose()?;

        let conf_path = dir.path().join("redis.conf");
        fs::write(
            &conf_path,
            self.render_config(dir.path(), unix_socket.as_deref(), acl_path.as_deref())?,
        )?;

        let mut server = RedisServer {
            process: None,
            paused: false,
            last_pid: 0,
            port: PortReservation::new()?,
            binary,
            conf_path,
            log_path: dir.path().join("redis.log"),
            unix_socket,
            credentials: self.credentials.clone(),
            startup_timeout: self.startup_timeout,
            tls_port: tls,
            cluster_bus,
            dir,
        };
        let mut attempt = 1;
        loop {
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(err) if err.port_conflict && attempt < START_ATTEMPTS => {
                    attempt += 1;
                    // Each of its ports afresh: the log does not always say which one was taken.
                    server.port = PortReservation::new()?;
                    if server.tls_port.is_some() {
                        server.tls_port = Some(PortReservation::new()?);
                    }
                    if server.cluster_bus.is_some() {
                        server.cluster_bus = Some(PortReservation::new()?);
                    }
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    fn validate(&self) -> io::Result<()> {
        let invalid = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        let has_newline = |s: &str| s.contains(['\n', '\r']);
        for (key, value) in &self.config {
            if key.is_empty() || key.contains(char::is_whitespace) || key.contains('"') {
                return invalid(format!("invalid redis config key {key:?}"));
            }
            if has_newline(value) {
                return invalid(format!("redis config value for {key:?} contains a newline"));
            }
            if ["port", "bind"].contains(&key.to_ascii_lowercase().as_str()) {
                return invalid(format!(
                    "redis config {key:?} is chosen by the harness and cannot be set"
                ));
            }
        }
        if let Some(Acl::Lines(lines)) = &self.acl {
            if let Some(line) = lines.iter().find(|l| has_newline(l)) {
                return invalid(format!("ACL line {line:?} contains a newline"));
            }
        }
        Ok(())
    }

    fn render_config(
        &self,
        dir: &Path,
        unix_socket: Option<&Path>,
        acl_path: Option<&Path>,
    ) -> io::Result<String> {
        let mut conf = String::from(
            "# Generated by fencelock_testing. The port is passed on the command line.\n\
             bind 127.0.0.1\n\
             protected-mode yes\n\
             daemonize no\n\
             logfile \"\"\n\
             save \"\"\n",
        );
        let mut line = |key: &str, value: &str| {
            let _ = writeln!(conf, "{key} {value}");
        };
        line("dir", &quote(path_str(dir)?));
        if self.persistence {
            line("appendonly", "yes");
            line("appendfsync", "always");
        } else {
            line("appendonly", "no");
        }
        if let Some(password) = &self.requirepass {
            line("requirepass", &quote(password));
        }
        if let Some(acl_path) = acl_path {
            line("aclfile", &quote(path_str(acl_path)?));
        }
        if let Some(socket) = unix_socket {
            line("unixsocket", &quote(path_str(socket)?));
            line("unixsocketperm", "700");
        }
        if self.tls {
            line("tls-cert-file", &quote(path_str(&dir.join(TLS_CERT))?));
            line("tls-key-file", &quote(path_str(&dir.join(TLS_KEY))?));
            line("tls-ca-cert-file", &quote(path_str(&dir.join(TLS_CA))?));
            line("tls-auth-clients", "no");
        }
        if let Some(primary) = self.replica_of {
            // Two arguments, so not quoted: `quote` would make them one.
            line("replicaof", &format!("{} {}", primary.ip(), primary.port()));
        }
        for (key, value) in &self.config {
            if value.is_empty() {
                line(key, "\"\"");
            } else {
                line(key, value);
            }
        }
        Ok(conf)
    }
}

/// The value of `field` in an `INFO` reply (`field:value` lines).
/// The files of a TLS server, in its directory.
const TLS_CA: &str = "tls-ca.crt";
const TLS_CERT: &str = "tls-server.crt";
const TLS_KEY: &str = "tls-server.key";

/// Makes a throwaway CA and a server certificate for `127.0.0.1` / `localhost` signed by it,
/// with the `openssl` tool, into `dir`.
fn make_tls_files(dir: &Path) -> io::Result<()> {
    let openssl = |args: &[&str]| -> io::Result<()> {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .map_err(|err| {
                io::Error::new(
                    err.kind(),
                    format!("cannot run openssl to make TLS certificates (install it): {err}"),
                )
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "openssl {} failed with {}: {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    };
    fs::write(
        dir.join("tls-server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
         basicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\n",
    )?;
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=fencelock test CA",
        "-keyout",
        "tls-ca.key",
        "-out",
        TLS_CA,
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        TLS_KEY,
        "-out",
        "tls-server.csr",
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "tls-server.csr",
        "-CA",
        TLS_CA,
        "-CAkey",
        "tls-ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "tls-server.ext",
        "-out",
        TLS_CERT,
    ])
}

fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

fn path_str(path: &Path) -> io::Result<&str> {
    path.to_str().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not valid UTF-8", path.display()),
        )
    })
}

/// Quotes a value for `redis.conf`, whose parser (`sdssplitargs`) would
/// otherwise split it at spaces and choke on quotes and control bytes.
fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters, which is
/// safe in every part of a URL.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A `redis-server` process on a free port of 127.0.0.1, in its own
/// temporary directory.
///
/// Dropping the value kills the process with `SIGKILL`, reaps it, and
/// deletes the directory, also when a test panics.
///
/// # Example
///
/// ```no_run
/// use fencelock_testing::RedisServer;
///
/// let mut server = RedisServer::builder().persistence(true).start()?;
/// let mut con = server.client().get_connection()?;
/// redis::cmd("SET").arg("fence").arg(7).query::<()>(&mut con)?;
///
/// // Crash and come back on the same port, with the append-only file replayed.
/// server.restart()?;
/// let mut con = server.client().get_connection()?;
/// let fence: i64 = redis::cmd("GET").arg("fence").query(&mut con)?;
/// assert_eq!(fence, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RedisServer {
    process: Option<Process>,
    paused: bool,
    last_pid: u32,
    port: PortReservation,
    binary: PathBuf,
    conf_path: PathBuf,
    log_path: PathBuf,
    unix_socket: Option<PathBuf>,
    credentials: Option<Credentials>,
    startup_timeout: Duration,
    /// The TLS port, when the server serves TLS.
    tls_port: Option<PortReservation>,
    /// The cluster bus port, when the harness chose it (`RedisServerBuilder::cluster_bus`).
    cluster_bus: Option<PortReservation>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server with the default configuration: no password and no
    /// persistence.
    ///
    /// ```no_run
    /// use fencelock_testing::RedisServer;
    ///
    /// let server = RedisServer::start()?;
    /// println!("redis is at {}", server.url());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// See [`RedisServerBuilder::start`].
    pub fn start() -> io::Result<Self> {
        Self::builder().start()
    }

    /// A builder for a server with non-default configuration.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port, which stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// The TCP address, `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port()).into()
    }

    /// A URL for the `redis` crate, such as `redis://127.0.0.1:41234/`, or
    /// `redis://:password@127.0.0.1:41234/` with a password and
    /// `redis://user:password@127.0.0.1:41234/` with credentials.
    pub fn url(&self) -> String {
        let userinfo = match &self.credentials {
            None => String::new(),
            Some(Credentials { username, password }) => format!(
                "{}:{}@",
                percent_encode(username.as_deref().unwrap_or_default()),
                percent_encode(password)
            ),
        };
        format!("redis://{userinfo}127.0.0.1:{}/", self.port())
    }

    /// The server's TLS port, when it was built with [`RedisServerBuilder::tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port.as_ref().map(PortReservation::port)
    }

    /// The cluster bus port the harness chose (`RedisServerBuilder::cluster_bus`), if it did.
    pub(crate) fn cluster_bus_port(&self) -> Option<u16> {
        self.cluster_bus.as_ref().map(PortReservation::port)
    }

    /// The server's `rediss://` URL (TLS, with the credentials of [`RedisServer::url`]), when
    /// it was built with [`RedisServerBuilder::tls`]. Clients must trust
    /// [`RedisServer::tls_ca_cert_pem`].
    pub fn tls_url(&self) -> Option<String> {
        let port = self.tls_port()?;
        let plain = self.url();
        let rest = plain.strip_prefix("redis://")?;
        let userinfo = &rest[..rest.rfind("127.0.0.1:")?];
        Some(format!("rediss://{userinfo}127.0.0.1:{port}/"))
    }

    /// Path of the PEM certificate of the CA that signed the server's TLS certificate.
    pub fn tls_ca_cert_path(&self) -> Option<PathBuf> {
        self.tls_port.as_ref().map(|_| self.dir.path().join(TLS_CA))
    }

    /// The PEM certificate of the CA that signed the server's TLS certificate.
    ///
    /// # Errors
    /// [`io::ErrorKind::NotFound`] when the server does not serve TLS.
    pub fn tls_ca_cert_pem(&self) -> io::Result<Vec<u8>> {
        match self.tls_ca_cert_path() {
            Some(path) => fs::read(path),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "this server was not built with tls(true)",
            )),
        }
    }

    /// A `redis+unix://` URL for the unix socket, if it is enabled with
    /// [`RedisServerBuilder::unix_socket`].
    pub fn unix_url(&self) -> Option<String> {
        let socket = self.unix_socket.as_deref()?;
        let path: String = socket
            .to_string_lossy()
            .split('/')
            .map(percent_encode)
            .collect::<Vec<_>>()
            .join("/");
        let mut url = format!("redis+unix://{path}");
        if let Some(Credentials { username, password }) = &self.credentials {
            url.push_str("?pass=");
            url.push_str(&percent_encode(password));
            if let Some(username) = username {
                url.push_str("&user=");
                url.push_str(&percent_encode(username));
            }
        }
        Some(url)
    }

    /// The unix socket the server also listens on, if enabled with
    /// [`RedisServerBuilder::unix_socket`].
    pub fn unix_socket_path(&self) -> Option<&Path> {
        self.unix_socket.as_deref()
    }

    /// The server's private directory, holding `redis.conf`, `redis.log`
    /// and any persistence files. Deleted on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log, where its stdout and stderr go across restarts.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The pid of the current process, or of the last one if the server
    /// is stopped.
    pub fn pid(&self) -> u32 {
        self.last_pid
    }

    /// A client for [`url`](Self::url).
    ///
    /// # Panics
    ///
    /// Never in practice: the harness builds the URL, so it is valid.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("the harness builds valid redis URLs")
    }

    /// Whether the process exists, including while it is
    /// [paused](Self::pause).
    pub fn is_running(&self) -> bool {
        self.process.as_ref().is_some_and(Process::is_alive)
    }

    /// Whether the process is stopped with [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused && self.is_running()
    }

    /// Kills the process with `SIGKILL`, as a crash or power loss would,
    /// and leaves the server stopped. Does nothing if it is stopped.
    ///
    /// Without [persistence](RedisServerBuilder::persistence), all data is
    /// lost.
    pub fn kill(&mut self) {
        // Dropping the process kills and reaps it.
        self.process = None;
        self.paused = false;
    }

    /// Shuts the server down cleanly with `SIGTERM`, as an administrator
    /// would, and leaves it stopped. Does nothing if it is stopped.
    ///
    /// # Errors
    ///
    /// Fails if the server does not exit within 10 seconds (it is then
    /// killed) or exits unsuccessfully.
    pub fn stop(&mut self) -> io::Result<()> {
        self.paused = false;
        let Some(process) = self.process.take() else {
            return Ok(());
        };
        if !process.is_alive() {
            return Ok(());
        }
        let status = process.terminate(STOP_TIMEOUT)?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "redis-server exited with {status} on SIGTERM; last lines of {}:\n{}",
                self.log_path.display(),
                log_tail(&self.log_path)
            )))
        }
    }

    /// Starts a stopped server again on the same port, with the same
    /// directory and configuration, and waits until it has loaded its data.
    ///
    /// # Errors
    ///
    /// Fails if the server is running, if its port has been taken by
    /// another process meanwhile, or if it does not come up in time.
    pub fn start_again(&mut self) -> io::Result<()> {
        if self.is_running() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("redis-server on port {} is already running", self.port()),
            ));
        }
        self.kill();
        let mut attempt = 1;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return Ok(()),
                Err(err) if err.port_conflict && attempt < RESTART_ATTEMPTS => {
                    thread::sleep(Duration::from_millis(100) * attempt as u32);
                    attempt += 1;
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Kills the process with `SIGKILL` (like `SHUTDOWN NOSAVE`, but
    /// abrupt) and starts it again; see [`kill`](Self::kill) and
    /// [`start_again`](Self::start_again).
    ///
    /// With [persistence](RedisServerBuilder::persistence) the data
    /// survives; without it the server comes back empty.
    ///
    /// # Errors
    ///
    /// See [`start_again`](Self::start_again).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.start_again()
    }

    /// Freezes the process with `SIGSTOP`: connections stay open but
    /// nothing is answered, like during a long GC pause or a network
    /// partition that drops no packets.
    ///
    /// # Errors
    ///
    /// Fails if the server is not running or the signal cannot be sent.
    pub fn pause(&mut self) -> io::Result<()> {
        self.running_process()?.signal(&[Signal::Stop])?;
        self.paused = true;
        Ok(())
    }

    /// Lets a [paused](Self::pause) process continue with `SIGCONT`.
    ///
    /// # Errors
    ///
    /// Fails if the server is not running or the signal cannot be sent.
    pub fn resume(&mut self) -> io::Result<()> {
        self.running_process()?.signal(&[Signal::Cont])?;
        self.paused = false;
        Ok(())
    }

    /// Makes this replica a primary (`REPLICAOF NO ONE`), as a failover
    /// does: it keeps the data it has replicated so far and accepts
    /// writes. A primary stays a primary.
    ///
    /// # Errors
    ///
    /// Fails if the server cannot be reached or refuses the command.
    pub fn promote(&self) -> io::Result<()> {
        let mut con = self.admin_connection()?;
        redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query::<()>(&mut con)
            .map_err(io::Error::other)
    }

    /// Makes this running server a replica of the server at `primary`
    /// (`REPLICAOF <ip> <port>` at run time), for example an old primary
    /// that comes back after a failover. It drops its own data and syncs;
    /// see [`wait_for_replication`](Self::wait_for_replication).
    ///
    /// # Errors
    ///
    /// Fails if the server cannot be reached or refuses the command.
    pub fn replicate(&self, primary: SocketAddr) -> io::Result<()> {
        let mut con = self.admin_connection()?;
        redis::cmd("REPLICAOF")
            .arg(primary.ip().to_string())
            .arg(primary.port())
            .query::<()>(&mut con)
            .map_err(io::Error::other)
    }

    /// The offset up to which this server has written (a primary) or
    /// applied (a replica) the replication stream: `master_repl_offset` of
    /// `INFO replication`. Read it on the primary after the writes a
    /// replica must have, and pass it to
    /// [`wait_for_replication`](Self::wait_for_replication).
    ///
    /// # Errors
    ///
    /// Fails if the server cannot be reached or the field is missing.
    pub fn replication_offset(&self) -> io::Result<u64> {
        let info = self.replication_info()?;
        info_field(&info, "master_repl_offset")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no master_repl_offset in:\n{info}")))
    }

    /// Waits until this replica is connected to its primary and has applied
    /// the replication stream up to `offset` (see
    /// [`replication_offset`](Self::replication_offset)), polling
    /// `INFO replication`.
    ///
    /// # Errors
    ///
    /// Fails with [`io::ErrorKind::TimedOut`] if that does not happen
    /// within `timeout`, with the last `INFO replication` in the message,
    /// or if the server cannot be reached.
    pub fn wait_for_replication(&self, offset: u64, timeout: Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let info = self.replication_info()?;
            let link_up = info_field(&info, "master_link_status") == Some("up");
            let applied =
                info_field(&info, "slave_repl_offset").and_then(|v| v.parse::<u64>().ok());
            if link_up && applied.is_some_and(|applied| applied >= offset) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server on port {} did not replicate up to offset {offset} \
                         within {timeout:?}; INFO replication:\n{info}",
                        self.port()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn replication_info(&self) -> io::Result<String> {
        let mut con = self.admin_connection()?;
        redis::cmd("INFO")
            .arg("replication")
            .query(&mut con)
            .map_err(io::Error::other)
    }

    /// A synchronous connection for the harness' own commands, with
    /// timeouts so that a paused server cannot hang the caller.
    fn admin_connection(&self) -> io::Result<redis::Connection> {
        let timeout = Duration::from_secs(5);
        let con = self
            .client()
            .get_connection_with_timeout(timeout)
            .map_err(io::Error::other)?;
        con.set_read_timeout(Some(timeout))
            .map_err(io::Error::other)?;
        con.set_write_timeout(Some(timeout))
            .map_err(io::Error::other)?;
        Ok(con)
    }

    fn running_process(&self) -> io::Result<&Process> {
        self.process
            .as_ref()
            .filter(|process| process.is_alive())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("redis-server on port {} is not running", self.port()),
                )
            })
    }

    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let mut args: Vec<OsString> = vec![
            self.conf_path.clone().into(),
            "--port".into(),
            self.port().to_string().into(),
        ];
        if let Some(tls_port) = self.tls_port() {
            args.extend(["--tls-port".into(), tls_port.to_string().into()]);
        }
        if let Some(bus) = self.cluster_bus_port() {
            args.extend(["--cluster-port".into(), bus.to_string().into()]);
        }
        let process = Process::spawn(&self.binary, args, self.dir.path(), &self.log_path).map_err(
            |error| StartError {
                error,
                port_conflict: false,
            },
        )?;
        self.last_pid = process.pid();
        let probe = Probe {
            addr: self.addr(),
            username: self.credentials.as_ref().and_then(|c| c.username.clone()),
            password: self.credentials.as_ref().map(|c| c.password.clone()),
        };
        // On failure `process` is dropped here, which kills it.
        process.wait_ready(&probe, self.startup_timeout)?;
        self.process = Some(process);
        self.paused = false;
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Explicit, so the process is gone before `dir` is deleted whatever
        // the field order.
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn connection(server: &RedisServer) -> redis::Connection {
        server.client().get_connection().expect("connect")
    }

    fn set(con: &mut redis::Connection, key: &str, value: &str) {
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query::<()>(con)
            .expect("SET");
    }

    fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
        redis::cmd("GET").arg(key).query(con).expect("GET")
    }

    fn pid_exists(pid: u32) -> bool {
        crate::process_exists(pid)
    }

    #[test]
    fn starts_and_answers_ping_over_raw_resp() {
        let server = RedisServer::start().unwrap();
        assert!(server.is_running());
        assert_ne!(server.port(), 6379);
        assert_eq!(
            server.url(),
            format!("redis://127.0.0.1:{}/", server.port())
        );
        let mut stream = TcpStream::connect(server.addr()).unwrap();
        stream.write_all(b"PING\r\n").unwrap();
        let mut reply = [0; 7];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+PONG\r\n");
    }

    #[test]
    fn answers_the_redis_crate() {
        let server = RedisServer::start().unwrap();
        let mut con = connection(&server);
        set(&mut con, "k", "v");
        assert_eq!(get(&mut con, "k").as_deref(), Some("v"));
    }

    #[test]
    fn servers_get_distinct_ports_dirs_and_processes() {
        let servers: Vec<_> = (0..4)
            .map(|_| thread::spawn(RedisServer::start))
            .map(|handle| handle.join().unwrap().unwrap())
            .collect();
        for (i, a) in servers.iter().enumerate() {
            for b in &servers[i + 1..] {
                assert_ne!(a.port(), b.port());
                assert_ne!(a.dir(), b.dir());
                assert_ne!(a.pid(), b.pid());
            }
        }
        // Data is not shared between them.
        set(&mut connection(&servers[0]), "only-here", "1");
        assert_eq!(get(&mut connection(&servers[1]), "only-here"), None);
    }

    #[test]
    fn restart_with_persistence_keeps_acknowledged_writes() {
        let mut server = RedisServer::builder().persistence(true).start().unwrap();
        let (port, pid) = (server.port(), server.pid());
        set(&mut connection(&server), "fence", "41");
        server.restart().unwrap();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), pid);
        assert!(!pid_exists(pid));
        assert_eq!(
            get(&mut connection(&server), "fence").as_deref(),
            Some("41")
        );
    }

    #[test]
    fn restart_without_persistence_loses_data() {
        let mut server = RedisServer::start().unwrap();
        let port = server.port();
        set(&mut connection(&server), "fence", "41");
        server.restart().unwrap();
        assert_eq!(server.port(), port);
        assert_eq!(get(&mut connection(&server), "fence"), None);
    }

    #[test]
    fn graceful_stop_and_start_again_keep_data_with_persistence() {
        let mut server = RedisServer::builder().persistence(true).start().unwrap();
        set(&mut connection(&server), "k", "v");
        server.stop().unwrap();
        assert!(!server.is_running());
        server.stop().unwrap();
        server.start_again().unwrap();
        assert_eq!(get(&mut connection(&server), "k").as_deref(), Some("v"));
        let err = server.start_again().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn kill_leaves_the_server_stopped() {
        let mut server = RedisServer::start().unwrap();
        let pid = server.pid();
        server.kill();
        assert!(!server.is_running());
        assert!(!pid_exists(pid));
        assert!(TcpStream::connect(server.addr()).is_err());
        assert_eq!(server.pid(), pid);
        assert!(server.pause().is_err());
        server.start_again().unwrap();
        assert!(server.is_running());
        redis::cmd("PING")
            .query::<String>(&mut connection(&server))
            .unwrap();
    }

    #[test]
    fn drop_kills_the_process_and_removes_the_dir() {
        let server = RedisServer::builder().unix_socket(true).start().unwrap();
        let (pid, addr, dir) = (server.pid(), server.addr(), server.dir().to_owned());
        assert!(pid_exists(pid));
        drop(server);
        assert!(!pid_exists(pid));
        assert!(TcpStream::connect(addr).is_err());
        assert!(!dir.exists());
    }

    #[test]
    fn drop_kills_the_process_when_a_test_panics() {
        let pid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = pid.clone();
        let result = thread::spawn(move || {
            let server = RedisServer::start().unwrap();
            seen.store(server.pid(), std::sync::atomic::Ordering::SeqCst);
            panic!("test failure with a live server");
        })
        .join();
        assert!(result.is_err());
        let pid = pid.load(std::sync::atomic::Ordering::SeqCst);
        assert_ne!(pid, 0);
        assert!(!pid_exists(pid));
    }

    #[test]
    fn password_is_required_and_used_by_url() {
        // Characters that need quoting in redis.conf and escaping in URLs.
        let password = "s3cret \"pass\"/@:%#";
        let server = RedisServer::builder().password(password).start().unwrap();
        assert!(server.url().starts_with("redis://:"));

        let anonymous =
            redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())).unwrap();
        let mut con = anonymous.get_connection().unwrap();
        let err = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query::<()>(&mut con)
            .unwrap_err();
        assert_eq!(err.code(), Some("NOAUTH"), "{err}");

        let mut con = connection(&server);
        set(&mut con, "k", "v");
        assert_eq!(get(&mut con, "k").as_deref(), Some("v"));
    }

    #[test]
    fn acl_users_and_credentials() {
        let server = RedisServer::builder()
            .acl_lines(["user default off", "user app on >app-pw ~app:* +@all"])
            .credentials("app", "app-pw")
            .start()
            .unwrap();
        assert_eq!(
            server.url(),
            format!("redis://app:app-pw@127.0.0.1:{}/", server.port())
        );
        let mut con = connection(&server);
        set(&mut con, "app:k", "v");
        let err = redis::cmd("SET")
            .arg("other")
            .arg("v")
            .query::<()>(&mut con)
            .unwrap_err();
        assert_eq!(err.code(), Some("NOPERM"), "{err}");
        assert!(server.dir().join("users.acl").exists());
    }

    #[test]
    fn acl_file_is_copied_into_the_server_dir() {
        let source = tempfile::NamedTempFile::new().unwrap();
        fs::write(source.path(), "user default on nopass ~* +@all -flushall\n").unwrap();
        let server = RedisServer::builder()
            .acl_file(source.path())
            .start()
            .unwrap();
        let err = redis::cmd("FLUSHALL")
            .query::<()>(&mut connection(&server))
            .unwrap_err();
        assert_eq!(err.code(), Some("NOPERM"), "{err}");
    }

    #[test]
    fn unix_socket_works() {
        let server = RedisServer::builder()
            .unix_socket(true)
            .password("pw")
            .start()
            .unwrap();
        let path = server.unix_socket_path().unwrap();
        assert!(path.starts_with(server.dir()));
        assert!(path.exists());
        let client = redis::Client::open(server.unix_url().unwrap()).unwrap();
        let mut con = client.get_connection().unwrap();
        let pong: String = redis::cmd("PING").query(&mut con).unwrap();
        assert_eq!(pong, "PONG");
        assert_eq!(RedisServer::start().unwrap().unix_socket_path(), None);
    }

    #[test]
    fn extra_config_lines_are_applied() {
        let server = RedisServer::builder()
            .config("maxmemory", "12mb")
            .arg("notify-keyspace-events", "")
            .config("client-output-buffer-limit", "pubsub 0 0 0")
            .start()
            .unwrap();
        let values: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory")
            .query(&mut connection(&server))
            .unwrap();
        assert_eq!(values, ["maxmemory", "12582912"]);
    }

    #[test]
    fn pause_freezes_and_resume_thaws() {
        let mut server = RedisServer::start().unwrap();
        let con = connection(&server);
        con.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut con = con;
        server.pause().unwrap();
        assert!(server.is_paused());
        assert!(server.is_running());
        let err = redis::cmd("PING").query::<String>(&mut con).unwrap_err();
        assert!(err.is_timeout(), "{err}");
        server.resume().unwrap();
        assert!(!server.is_paused());
        let pong: String = redis::cmd("PING").query(&mut connection(&server)).unwrap();
        assert_eq!(pong, "PONG");
    }

    #[test]
    fn a_paused_server_can_be_stopped_and_dropped() {
        let mut server = RedisServer::start().unwrap();
        server.pause().unwrap();
        server.stop().unwrap();
        assert!(!server.is_running());
        server.start_again().unwrap();
        server.pause().unwrap();
        let pid = server.pid();
        drop(server);
        assert!(!pid_exists(pid));
    }

    #[test]
    fn startup_failure_reports_the_log_tail() {
        let err = RedisServer::builder()
            .config("no-such-directive", "1")
            .start()
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("exited during startup"), "{message}");
        assert!(message.contains("no-such-directive"), "{message}");
        // Up to 7.x and in Valkey the refusal is a FATAL CONFIG FILE ERROR; Redis 8 lists it as
        // an unresolved configuration (it could belong to a module).
        assert!(
            message.contains("FATAL CONFIG FILE ERROR")
                || message.contains("Unresolved Configuration"),
            "{message}"
        );
    }

    #[test]
    fn harness_owned_settings_are_rejected() {
        for key in ["port", "bind", "bad key", ""] {
            let err = RedisServer::builder().config(key, "1").start().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{key:?}");
        }
        let err = RedisServer::builder()
            .config("maxmemory", "1mb\nport 6379")
            .start()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn missing_binary_is_reported() {
        let err = RedisServer::builder()
            .binary("/nonexistent/redis-server")
            .start()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("/nonexistent/redis-server"),
            "{err}"
        );
    }

    #[test]
    fn start_again_fails_when_the_port_was_taken() {
        let mut server = RedisServer::start().unwrap();
        server.kill();
        let _thief = std::net::TcpListener::bind(server.addr()).unwrap();
        let err = server.start_again().unwrap_err();
        assert!(err.to_string().contains("Address already in use"), "{err}");
        assert!(!server.is_running());
    }

    #[test]
    fn replica_follows_its_primary_is_promoted_and_roles_swap() {
        let fast_sync = |b: RedisServerBuilder| b.config("repl-diskless-sync-delay", "0");
        let primary = fast_sync(RedisServer::builder()).start().unwrap();
        let replica = fast_sync(RedisServer::builder())
            .replica_of(primary.addr())
            .start()
            .unwrap();
        let conf = fs::read_to_string(replica.dir().join("redis.conf")).unwrap();
        assert!(
            conf.contains(&format!("\nreplicaof 127.0.0.1 {}\n", primary.port())),
            "{conf}"
        );
        let timeout = Duration::from_secs(10);

        set(&mut connection(&primary), "k", "1");
        replica
            .wait_for_replication(primary.replication_offset().unwrap(), timeout)
            .unwrap();
        assert_eq!(get(&mut connection(&replica), "k").as_deref(), Some("1"));
        let err = redis::cmd("SET")
            .arg("k")
            .arg("2")
            .query::<()>(&mut connection(&replica))
            .unwrap_err();
        assert_eq!(err.code(), Some("READONLY"), "{err}");

        // Failover: the replica becomes a primary with the data it had.
        replica.promote().unwrap();
        set(&mut connection(&replica), "k", "2");
        assert!(replica.replication_info().unwrap().contains("role:master"));
        // A primary has no link to a primary, so waiting on it times out.
        let err = primary
            .wait_for_replication(0, Duration::from_millis(50))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("role:master"), "{err}");

        // The old primary comes back as a replica of the new one.
        primary.replicate(replica.addr()).unwrap();
        primary
            .wait_for_replication(replica.replication_offset().unwrap(), timeout)
            .unwrap();
        assert_eq!(get(&mut connection(&primary), "k").as_deref(), Some("2"));
        assert!(primary.replication_info().unwrap().contains("role:slave"));
    }

    #[test]
    fn info_fields_are_matched_whole() {
        let info = "# Replication\r\nrole:slave\r\nmaster_repl_offset:42\r\n\
                    slave_repl_offset:40\r\nmaster_link_status:up\r\n";
        assert_eq!(info_field(info, "master_repl_offset"), Some("42"));
        assert_eq!(info_field(info, "slave_repl_offset"), Some("40"));
        assert_eq!(info_field(info, "master_link_status"), Some("up"));
        assert_eq!(info_field(info, "role"), Some("slave"));
        assert_eq!(info_field(info, "repl_offset"), None);
        assert_eq!(info_field(info, "master"), None);
    }

    #[test]
    fn plain_servers_have_no_tls() {
        let server = RedisServer::start().unwrap();
        assert_eq!(server.tls_port(), None);
        assert_eq!(server.tls_url(), None);
        assert_eq!(
            server.tls_ca_cert_pem().unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn tls_servers_answer_rediss_with_their_own_ca() {
        if !crate::requires(
            crate::Feature::Tls,
            "tls_servers_answer_rediss_with_their_own_ca",
        ) {
            return;
        }
        let server = RedisServer::builder()
            .tls(true)
            .password("pw")
            .start()
            .unwrap();
        let tls_port = server.tls_port().unwrap();
        assert_ne!(tls_port, server.port());
        assert_eq!(
            server.tls_url().unwrap(),
            format!("rediss://:pw@127.0.0.1:{tls_port}/")
        );
        let ca = server.tls_ca_cert_pem().unwrap();
        assert!(String::from_utf8_lossy(&ca).contains("BEGIN CERTIFICATE"));
        let client = redis::Client::build_with_tls(
            server.tls_url().unwrap(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca),
            },
        )
        .unwrap();
        let mut con = client.get_connection().unwrap();
        set(&mut con, "over-tls", "1");
        // The plain port (the harness' own) sees the same data.
        assert_eq!(
            get(&mut connection(&server), "over-tls").as_deref(),
            Some("1")
        );
    }

    #[test]
    fn quoting_and_url_encoding() {
        assert_eq!(quote(r#"a "b"\c"#), r#""a \"b\"\\c""#);
        assert_eq!(quote("x\ty"), r#""x\x09y""#);
        assert_eq!(percent_encode("a b/@:%~"), "a%20b%2F%40%3A%25~");
    }
}
