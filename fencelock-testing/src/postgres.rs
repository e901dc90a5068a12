//! A throwaway PostgreSQL server, for tests of fenced SQL writes.

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::ports::PortReservation;
use crate::process::{log_tail, Process, Signal, StartError};

/// Environment variable naming the directory that holds PostgreSQL's `initdb` and `postgres`,
/// overriding the search of `/usr/lib/postgresql/*/bin` and `PATH`.
pub const POSTGRES_BIN_DIR_ENV: &str = "FENCELOCK_POSTGRES_BIN_DIR";

/// PostgreSQL's default port: a developer's real server may be there, so never ours.
const DEFAULT_PORT: u16 = 5432;
/// Fresh ports to try when the first one is taken between our probe and the server's `bind`.
const START_ATTEMPTS: usize = 8;
const INITDB_TIMEOUT: Duration = Duration::from_secs(60);
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a dropped server gets to exit on `SIGQUIT` before it is killed.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Where Debian and Ubuntu install each major version: `<root>/<version>/bin`.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// The database superuser that `initdb` creates; also the database the URL names.
const SUPERUSER: &str = "postgres";
/// Settings for a server whose data is thrown away: no fsync (a crash of the machine, not of
/// the server, would lose data, which a test server does not mind) and little memory, since
/// tests run several servers at once.
const SERVER_SETTINGS: &[&str] = &[
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "shared_buffers=16MB",
    "max_connections=50",
];

/// A PostgreSQL server on a free port of 127.0.0.1 (never 5432), with its own freshly
/// initialised cluster in a temporary directory; for tests of fenced SQL writes.
///
/// Anyone may connect as the superuser `postgres` without a password (trust authentication,
/// loopback only), to the database `postgres`: see [`url`](Self::url). Durability is off
/// (`fsync=off`): the data is thrown away anyway.
///
/// Dropping the value stops the server with `SIGQUIT` (an immediate shutdown, which also
/// removes its shared memory), kills it with `SIGKILL` if it has not exited within 5 seconds,
/// reaps it and deletes the directory; also when a test panics.
///
/// # Finding PostgreSQL
///
/// `initdb` and `postgres` are taken from the directory named by [`POSTGRES_BIN_DIR_ENV`]
/// (`FENCELOCK_POSTGRES_BIN_DIR`) if it is set; otherwise from the newest
/// `/usr/lib/postgresql/<version>/bin` (where Debian and Ubuntu put them, not on `PATH`);
/// otherwise from `PATH`. Install them with `apt-get install -y postgresql` (the repository's
/// `scripts/ensure-postgres` does it). Readiness is asked of PostgreSQL's own `pg_isready`,
/// from the same directory.
///
/// # Running as root
///
/// PostgreSQL refuses to run as root. When the tests run as root (CI, containers), the harness
/// gives the server's directory to the user `postgres` (created by Debian's package), or to
/// `nobody` when there is no such user, and runs `initdb` and `postgres` as that user through
/// `setpriv` (util-linux), which executes the server in place, so the process the harness
/// kills is the server itself. That user must be able to reach the temporary directory: the
/// default `/tmp` is fine; a `TMPDIR` inside `/root` is not.
///
/// # Example
///
/// ```no_run
/// use fencelock_testing::PostgresServer;
///
/// let server = PostgresServer::start()?;
/// // For example with tokio-postgres: tokio_postgres::connect(&server.url(), NoTls).
/// println!("postgres is at {}", server.url());
/// assert!(server.url().starts_with("postgres://postgres@127.0.0.1:"));
/// // The server is stopped and its directory removed here.
/// drop(server);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PostgresServer {
    process: Option<Process>,
    pid: u32,
    port: PortReservation,
    bin_dir: PathBuf,
    log_path: PathBuf,
    dir: TempDir,
}

impl PostgresServer {
    /// Initialises a cluster in a new temporary directory, starts a server on it and waits
    /// until it accepts connections (typically about a second in all).
    ///
    /// # Errors
    ///
    /// Fails if PostgreSQL is not installed (the message says how to install it), if
    /// `initdb` fails, or if the server does not come up within 30 seconds. Errors about the
    /// server end with the tail of its log.
    pub fn start() -> io::Result<Self> {
        let bin_dir = find_bin_dir(
            std::env::var_os(POSTGRES_BIN_DIR_ENV).as_deref(),
            Path::new(DEBIAN_ROOT),
            std::env::var_os("PATH").as_deref(),
        )?;
        let dir = tempfile::Builder::new()
            .prefix("fencelock-postgres-")
            .tempdir()?;
        let log_path = dir.path().join("postgres.log");
        let user = if os::owner(dir.path())? == 0 {
            let user = OsUser::unprivileged()?;
            os::chown(dir.path(), user.uid, user.gid)?;
            Some(user)
        } else {
            None
        };
        let runner = Runner::new(user)?;
        init_cluster(&runner, &bin_dir, dir.path(), &log_path)?;

        let mut server = PostgresServer {
            process: None,
            pid: 0,
            port: free_port()?,
            bin_dir,
            log_path,
            dir,
        };
        let mut attempt = 1;
        loop {
            match server.spawn_and_wait(&runner) {
                Ok(()) => return Ok(server),
                Err(err) if err.port_conflict && attempt < START_ATTEMPTS => {
                    attempt += 1;
                    server.port = free_port()?;
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// A connection URL: `postgres://postgres@127.0.0.1:<port>/postgres`, which
    /// `tokio-postgres`, `postgres`, `sqlx` and `psql` all accept.
    pub fn url(&self) -> String {
        format!(
            "postgres://{SUPERUSER}@127.0.0.1:{}/{SUPERUSER}",
            self.port()
        )
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// The TCP address, `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port()).into()
    }

    /// The server's private directory: the cluster in `data/`, the log, and the unix socket
    /// (`.s.PGSQL.<port>`, so `psql -h <dir> -p <port> -U postgres` works too). Deleted on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log that `initdb` and the server write to.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The pid of the server process (the postmaster).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The directory the `initdb` and `postgres` binaries were taken from.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    fn spawn_and_wait(&mut self, runner: &Runner) -> Result<(), StartError> {
        let start_error = |error| StartError {
            error,
            port_conflict: false,
        };
        let dir = self.dir.path();
        let mut args: Vec<OsString> = vec![
            "-D".into(),
            dir.join("data").into(),
            "-p".into(),
            self.port().to_string().into(),
            "-h".into(),
            "127.0.0.1".into(),
            "-k".into(),
            dir.into(),
        ];
        for setting in SERVER_SETTINGS {
            args.extend(["-c".into(), OsString::from(setting)]);
        }
        let (program, args) = runner.command_line(&self.bin_dir.join("postgres"), args);
        let process = Process::spawn(&program, args, dir, &self.log_path).map_err(start_error)?;
        self.pid = process.pid();
        match wait_ready(
            &process,
            &self.bin_dir,
            self.addr(),
            &self.log_path,
            STARTUP_TIMEOUT,
        ) {
            Ok(()) => {
                self.process = Some(process);
                Ok(())
            }
            Err(err) => {
                shut_down(process);
                Err(err)
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            shut_down(process);
        }
    }
}

/// Stops a server with `SIGQUIT`, PostgreSQL's immediate shutdown: the postmaster ends its
/// children and removes its shared memory segments, which `SIGKILL` would leave behind (a
/// little SysV memory and files in `/dev/shm` per server). Dropping the process then kills
/// it if it is still there, and reaps it.
fn shut_down(process: Process) {
    if process.is_alive() && process.signal(&[Signal::Quit, Signal::Cont]).is_ok() {
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        while process.is_alive() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
    }
    drop(process);
}

/// A reserved loopback port other than PostgreSQL's default.
fn free_port() -> io::Result<PortReservation> {
    // Rejected reservations stay held until we are done, so the OS cannot offer them again.
    let mut rejected = Vec::new();
    loop {
        let port = PortReservation::new()?;
        if port.port() != DEFAULT_PORT {
            return Ok(port);
        }
        rejected.push(port);
    }
}

/// Runs `initdb` for a cluster in `<dir>/data` with trust authentication for the superuser
/// `postgres`, appending its output to the log.
fn init_cluster(runner: &Runner, bin_dir: &Path, dir: &Path, log_path: &Path) -> io::Result<()> {
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)?;
    let args: Vec<OsString> = vec![
        "-D".into(),
        dir.join("data").into(),
        "-U".into(),
        SUPERUSER.into(),
        "--auth=trust".into(),
        "--encoding=UTF8".into(),
        "--locale=C".into(),
        // The cluster is thrown away; syncing it to disk would only cost time.
        "--no-sync".into(),
    ];
    let (program, args) = runner.command_line(&bin_dir.join("initdb"), args);
    writeln!(
        log,
        "=== fencelock_testing: {} {}",
        program.display(),
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    )?;
    let mut child = Command::new(&program)
        .args(&args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("failed to spawn {}: {err}", program.display()),
            )
        })?;
    let deadline = Instant::now() + INITDB_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "initdb did not finish within {INITDB_TIMEOUT:?}; last lines of {}:\n{}",
                    log_path.display(),
                    log_tail(log_path)
                ),
            ));
        }
        thread::sleep(Duration::from_millis(10));
    };
    if status.success() {
        return Ok(());
    }
    let hint = match &runner.user {
        Some(user) => format!(
            " (it ran as user {} because PostgreSQL refuses to run as root; that user must be \
             able to reach {}: point TMPDIR at a directory everyone may enter, such as /tmp)",
            user.name,
            dir.display()
        ),
        None => String::new(),
    };
    Err(io::Error::other(format!(
        "initdb failed ({status}){hint}; last lines of {}:\n{}",
        log_path.display(),
        log_tail(log_path)
    )))
}

/// Waits until the server at `addr` completes a session startup, or fails early when the
/// process exits (reporting whether another process had the port).
fn wait_ready(
    process: &Process,
    bin_dir: &Path,
    addr: SocketAddr,
    log_path: &Path,
    timeout: Duration,
) -> Result<(), StartError> {
    let deadline = Instant::now() + timeout;
    let fail = |port_conflict: bool, kind: io::ErrorKind, what: String| StartError {
        error: io::Error::new(
            kind,
            format!(
                "{what}; last lines of {}:\n{}",
                log_path.display(),
                log_tail(log_path)
            ),
        ),
        port_conflict,
    };
    let mut last_refusal = None;
    loop {
        match process.exit_status() {
            Ok(None) => {}
            Ok(Some(status)) => {
                let port_conflict = log_tail(log_path).contains("Address already in use");
                return Err(fail(
                    port_conflict,
                    io::ErrorKind::Other,
                    format!(
                        "postgres (pid {}) exited during startup ({status})",
                        process.pid()
                    ),
                ));
            }
            Err(error) => {
                return Err(StartError {
                    error,
                    port_conflict: false,
                })
            }
        }
        match probe(bin_dir, addr) {
            // The liveness check guards against having talked to a stranger that holds the
            // port while ours failed to bind it (and is about to exit).
            Ok(Probe::Ready) if process.is_alive() => return Ok(()),
            Ok(Probe::Ready | Probe::Starting) => {}
            Err(err) => last_refusal = Some(err),
        }
        if Instant::now() >= deadline {
            let last = last_refusal.map_or_else(String::new, |err| format!(" (last: {err})"));
            return Err(fail(
                false,
                io::ErrorKind::TimedOut,
                format!(
                    "postgres (pid {}) did not accept connections on {addr} within \
                     {timeout:?}{last}",
                    process.pid()
                ),
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// The server accepts connections.
    Ready,
    /// The server answers but refuses connections while it starts up.
    Starting,
}

/// Asks `pg_isready` (PostgreSQL's own readiness check, next to `postgres`) about `addr`.
fn probe(bin_dir: &Path, addr: SocketAddr) -> io::Result<Probe> {
    let status = Command::new(bin_dir.join("pg_isready"))
        .args([
            "--host",
            &addr.ip().to_string(),
            "--port",
            &addr.port().to_string(),
        ])
        .args([
            "--username",
            SUPERUSER,
            "--dbname",
            SUPERUSER,
            "--timeout",
            "1",
            "--quiet",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    // pg_isready's documented exit codes.
    match status.code() {
        Some(0) => Ok(Probe::Ready),
        Some(1) => Ok(Probe::Starting),
        Some(2) => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("no PostgreSQL answers on {addr}"),
        )),
        _ => Err(io::Error::other(format!(
            "pg_isready could not check {addr} ({status})"
        ))),
    }
}

/// Finds the directory holding both `initdb` and `postgres`: `env_override`, else the newest
/// `<debian_root>/<version>/bin`, else a directory on `path`.
fn find_bin_dir(
    env_override: Option<&OsStr>,
    debian_root: &Path,
    path: Option<&OsStr>,
) -> io::Result<PathBuf> {
    if let Some(dir) = env_override.filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if has_binaries(&dir) {
            Ok(dir)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "PostgreSQL not found: {POSTGRES_BIN_DIR_ENV}={} does not hold executable \
                     initdb, postgres and pg_isready",
                    dir.display()
                ),
            ))
        };
    }
    let newest_debian = fs::read_dir(debian_root)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version: Vec<u64> = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            has_binaries(&bin).then_some((version, bin))
        })
        .max();
    if let Some((_, bin)) = newest_debian {
        return Ok(bin);
    }
    path.into_iter()
        .flat_map(std::env::split_paths)
        .find(|dir| has_binaries(dir))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "PostgreSQL not found (no initdb, postgres and pg_isready in {}/<version>/bin nor \
                     on PATH): install it with `apt-get install -y postgresql` (Debian; \
                     scripts/ensure-postgres does it) or set {POSTGRES_BIN_DIR_ENV} to the \
                     directory holding initdb, postgres and pg_isready",
                    debian_root.display()
                ),
            )
        })
}

fn has_binaries(dir: &Path) -> bool {
    ["initdb", "postgres", "pg_isready"]
        .iter()
        .all(|name| os::is_executable(&dir.join(name)))
}

/// The unprivileged account the server runs as when we are root.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OsUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl OsUser {
    /// `postgres` (Debian's package creates it), else `nobody`.
    fn unprivileged() -> io::Result<OsUser> {
        let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        ["postgres", "nobody"]
            .iter()
            .find_map(|name| find_user(&passwd, name))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "PostgreSQL refuses to run as root, and neither user postgres nor nobody \
                     exists to run it as; run the tests as another user or create one \
                     (apt-get install -y postgresql creates postgres)",
                )
            })
    }
}

/// Looks `name` up in the text of `/etc/passwd` (`name:password:uid:gid:...`).
fn find_user(passwd: &str, name: &str) -> Option<OsUser> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let _password = fields.next()?;
        Some(OsUser {
            name: name.to_owned(),
            uid: fields.next()?.parse().ok()?,
            gid: fields.next()?.parse().ok()?,
        })
    })
}

/// How to start a PostgreSQL binary: directly, or (as root) through `setpriv` as an
/// unprivileged user. `setpriv` changes the ids and then executes the program in its own
/// process, unlike `su` and `runuser`, which stay around as the parent: so the pid we signal
/// and kill is PostgreSQL's own.
#[derive(Debug)]
struct Runner {
    user: Option<OsUser>,
    setpriv: PathBuf,
}

impl Runner {
    fn new(user: Option<OsUser>) -> io::Result<Runner> {
        let setpriv = match &user {
            None => PathBuf::new(),
            Some(user) => std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
                .map(|dir| dir.join("setpriv"))
                .find(|candidate| os::is_executable(candidate))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "PostgreSQL refuses to run as root, and setpriv (util-linux), which \
                             the harness uses to run it as user {}, was not found; install \
                             util-linux or run the tests as another user",
                            user.name
                        ),
                    )
                })?,
        };
        Ok(Runner { user, setpriv })
    }

    fn command_line(&self, program: &Path, args: Vec<OsString>) -> (PathBuf, Vec<OsString>) {
        let Some(user) = &self.user else {
            return (program.to_owned(), args);
        };
        let mut wrapped: Vec<OsString> = vec![
            "--reuid".into(),
            user.uid.to_string().into(),
            "--regid".into(),
            user.gid.to_string().into(),
            "--clear-groups".into(),
            "--".into(),
            program.into(),
        ];
        wrapped.extend(args);
        (self.setpriv.clone(), wrapped)
    }
}

/// The few operating-system calls the harness needs, where std has them only on Unix.
mod os {
    use std::io;
    use std::path::Path;

    #[cfg(unix)]
    pub(super) fn is_executable(path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }

    /// The uid owning `path`; for a directory we just created, our effective uid.
    #[cfg(unix)]
    pub(super) fn owner(path: &Path) -> io::Result<u32> {
        use std::os::unix::fs::MetadataExt;
        Ok(path.metadata()?.uid())
    }

    #[cfg(unix)]
    pub(super) fn chown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
    }

    #[cfg(not(unix))]
    pub(super) fn is_executable(path: &Path) -> bool {
        path.is_file()
    }

    #[cfg(not(unix))]
    pub(super) fn owner(_path: &Path) -> io::Result<u32> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the PostgreSQL harness needs a Unix-like system",
        ))
    }

    #[cfg(not(unix))]
    pub(super) fn chown(_path: &Path, _uid: u32, _gid: u32) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the PostgreSQL harness needs a Unix-like system",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid_exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn starts_accepts_sessions_and_is_gone_after_drop() {
        let server = PostgresServer::start().unwrap();
        assert_ne!(server.port(), DEFAULT_PORT);
        assert_eq!(
            probe(server.bin_dir(), server.addr()).unwrap(),
            Probe::Ready
        );
        assert!(server
            .url()
            .ends_with(&format!(":{}/postgres", server.port())));
        assert!(server.dir().join("data/PG_VERSION").exists());
        assert!(server
            .dir()
            .join(format!(".s.PGSQL.{}", server.port()))
            .exists());
        let other = PostgresServer::start().unwrap();
        assert_ne!(other.port(), server.port());

        let (pid, addr, dir) = (server.pid(), server.addr(), server.dir().to_owned());
        assert!(pid_exists(pid));
        drop(server);
        assert!(!pid_exists(pid), "pid {pid} survived the drop");
        assert!(!dir.exists());
        assert!(probe(other.bin_dir(), addr).is_err());
        assert_eq!(probe(other.bin_dir(), other.addr()).unwrap(), Probe::Ready);
        let log = fs::read_to_string(other.log_path()).unwrap();
        assert!(log.contains("ready to accept connections"), "{log}");
    }

    #[test]
    fn a_panicking_test_still_stops_its_server() {
        let pid = std::sync::Mutex::new(0);
        let result = std::panic::catch_unwind(|| {
            let server = PostgresServer::start().unwrap();
            *pid.lock().unwrap() = server.pid();
            panic!("test failure");
        });
        assert!(result.is_err());
        let pid = *pid.lock().unwrap();
        assert_ne!(pid, 0);
        assert!(!pid_exists(pid));
    }

    #[test]
    fn an_explicit_bin_dir_must_hold_both_binaries() {
        let err = find_bin_dir(Some(OsStr::new("/nonexistent")), Path::new("/"), None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains(POSTGRES_BIN_DIR_ENV), "{err}");
    }

    #[test]
    fn the_newest_debian_version_wins_and_a_missing_install_says_how_to_install() {
        let root = tempfile::tempdir().unwrap();
        for version in ["9.6", "15", "100-broken", "13"] {
            let bin = root.path().join(version).join("bin");
            fs::create_dir_all(&bin).unwrap();
            for name in ["initdb", "postgres", "pg_isready"] {
                fs::copy("/bin/sh", bin.join(name)).unwrap();
            }
        }
        let found = find_bin_dir(None, root.path(), None).unwrap();
        assert_eq!(found, root.path().join("15/bin"));

        let empty = tempfile::tempdir().unwrap();
        let err = find_bin_dir(None, empty.path(), Some(OsStr::new(""))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("apt-get install -y postgresql"),
            "{err}"
        );
    }

    #[test]
    fn passwd_lines_are_parsed() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      postgres:x:101:104:PostgreSQL administrator:/var/lib/postgresql:/bin/bash\n";
        assert_eq!(
            find_user(passwd, "postgres"),
            Some(OsUser {
                name: "postgres".into(),
                uid: 101,
                gid: 104
            })
        );
        assert_eq!(find_user(passwd, "post"), None);
        assert_eq!(find_user("broken:x:y:1\n", "broken"), None);
    }
}
