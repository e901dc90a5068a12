//! Spawning, probing and killing server processes.
//!
//! Kept independent of the standalone [`RedisServer`](super::RedisServer)
//! so that replica, Sentinel and Cluster topologies can reuse it.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::REDIS_SERVER_ENV;

/// How many trailing log lines to put into startup errors: enough to show
/// Redis' own explanation, short enough to read in a test failure.
const LOG_TAIL_LINES: usize = 40;

/// A signal for [`send_signal`]: what a test does to a process it wants to freeze, resume,
/// interrupt or crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// `SIGSTOP`: freeze the process (a GC pause, a stalled VM); it keeps its connections.
    Stop,
    /// `SIGCONT`: let a stopped process run on.
    Cont,
    /// `SIGTERM`: ask it to exit.
    Term,
    /// `SIGKILL`: a crash; no cleanup code runs.
    Kill,
    /// `SIGINT`: Ctrl-C.
    Int,
    /// `SIGQUIT`: PostgreSQL's immediate shutdown.
    Quit,
}

impl Signal {
    fn raw(self) -> rustix::process::Signal {
        use rustix::process::Signal as S;
        match self {
            Signal::Stop => S::STOP,
            Signal::Cont => S::CONT,
            Signal::Term => S::TERM,
            Signal::Kill => S::KILL,
            Signal::Int => S::INT,
            Signal::Quit => S::QUIT,
        }
    }
}

/// Sends `signal` to the process `pid` (for example a test's child process, from
/// [`std::process::Child::id`]): freeze a lock holder with [`Signal::Stop`] past its lease,
/// resume it with [`Signal::Cont`], crash it with [`Signal::Kill`].
///
/// ```no_run
/// use fencelock_testing::{send_signal, Signal};
///
/// let child = std::process::Command::new("sleep").arg("60").spawn()?;
/// send_signal(child.id(), Signal::Stop)?;
/// send_signal(child.id(), Signal::Cont)?;
/// send_signal(child.id(), Signal::Kill)?;
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
/// When `pid` is not a process this user may signal (gone, never existed, another user's).
pub fn send_signal(pid: u32, signal: Signal) -> io::Result<()> {
    rustix::process::kill_process(pid_of(pid)?, signal.raw()).map_err(|err| {
        io::Error::new(
            io::Error::from(err).kind(),
            format!("sending {signal:?} to pid {pid} failed: {err}"),
        )
    })
}

/// Whether a process `pid` exists (and this user may signal it): `kill -0`.
pub fn process_exists(pid: u32) -> bool {
    pid_of(pid).is_ok_and(|pid| rustix::process::test_kill_process(pid).is_ok())
}

fn pid_of(pid: u32) -> io::Result<rustix::process::Pid> {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no such pid {pid}")))
}

/// Resolves the `redis-server` binary: `env_override` (the value of
/// [`REDIS_SERVER_ENV`]) wins, then `PATH`.
pub(crate) fn find_redis_server(env_override: Option<&OsStr>) -> io::Result<PathBuf> {
    if let Some(path) = env_override.filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "redis-server not found: {REDIS_SERVER_ENV}={} is not an executable file",
                    path.display()
                ),
            ))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "redis-server not found: install it with `apt-get install -y redis-server` \
                     (Debian) or set {REDIS_SERVER_ENV}"
                ),
            )
        })
}

fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

/// The last [`LOG_TAIL_LINES`] lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Err(err) = File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)) {
        return format!("<could not read {}: {err}>", path.display());
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Why a process did not become ready.
#[derive(Debug)]
pub(crate) struct StartError {
    pub(crate) error: io::Error,
    /// The failure is explained by someone else owning the port, so trying
    /// again on another port (or later) may succeed.
    pub(crate) port_conflict: bool,
}

impl From<StartError> for io::Error {
    fn from(err: StartError) -> Self {
        err.error
    }
}

/// A child server process that is killed with `SIGKILL` and reaped when
/// dropped, so that no test leaves servers or zombies behind.
#[derive(Debug)]
pub(crate) struct Process {
    // Behind a mutex so that liveness can be checked through `&self`:
    // `Child::try_wait` needs `&mut` and a bare `kill -0` would report a
    // crashed, not yet reaped server as alive.
    child: Mutex<Child>,
    pid: u32,
    log_path: PathBuf,
}

impl Process {
    /// Starts `program` in `cwd`, appending its stdout and stderr to
    /// `log_path`.
    pub(crate) fn spawn<I, S>(
        program: &Path,
        args: I,
        cwd: &Path,
        log_path: &Path,
    ) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<S> = args.into_iter().collect();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)?;
        // A restarted server appends to the same log; the marker makes the
        // tail in an error message show where the failing attempt began.
        writeln!(
            log,
            "=== fencelock_testing: {} {}",
            program.display(),
            args.iter()
                .map(|a| a.as_ref().to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        )?;
        let child = Command::new(program)
            .args(&args)
            .current_dir(cwd)
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
        Ok(Self {
            pid: child.id(),
            child: Mutex::new(child),
            log_path: log_path.to_owned(),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The exit status, if the process has exited (reaping it).
    pub(crate) fn exit_status(&self) -> io::Result<Option<ExitStatus>> {
        self.child().try_wait()
    }

    pub(crate) fn is_alive(&self) -> bool {
        matches!(self.exit_status(), Ok(None))
    }

    /// Sends `signals`, in order.
    pub(crate) fn signal(&self, signals: &[Signal]) -> io::Result<()> {
        // Holding the lock keeps anyone from reaping the process meanwhile,
        // so its pid cannot be recycled for an unrelated process before
        // the signals arrive.
        let mut child = self.child();
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!(
                "pid {} has already exited ({status})",
                self.pid
            )));
        }
        for signal in signals {
            send_signal(self.pid, *signal)?;
        }
        Ok(())
    }

    /// Asks the process to exit with `SIGTERM` and waits up to `timeout`;
    /// kills it if it does not comply.
    pub(crate) fn terminate(self, timeout: Duration) -> io::Result<ExitStatus> {
        // A stopped process only acts on SIGTERM once it runs again.
        self.signal(&[Signal::Term, Signal::Cont])?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "pid {} did not exit within {timeout:?} of SIGTERM and was killed; \
                         last lines of {}:\n{}",
                        self.pid,
                        self.log_path.display(),
                        log_tail(&self.log_path)
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the server behind `probe` answers and has finished
    /// loading its data set.
    pub(crate) fn wait_ready(&self, probe: &Probe, timeout: Duration) -> Result<(), StartError> {
        let deadline = Instant::now() + timeout;
        let fail = |port_conflict: bool, kind: io::ErrorKind, what: String| StartError {
            error: io::Error::new(
                kind,
                format!(
                    "{what}; last lines of {}:\n{}",
                    self.log_path.display(),
                    log_tail(&self.log_path)
                ),
            ),
            port_conflict,
        };
        loop {
            match self.exit_status() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    let port_conflict = log_tail(&self.log_path).contains("Address already in use");
                    return Err(fail(
                        port_conflict,
                        io::ErrorKind::Other,
                        format!("server (pid {}) exited during startup ({status})", self.pid),
                    ));
                }
                Err(err) => {
                    return Err(StartError {
                        error: err,
                        port_conflict: false,
                    })
                }
            }
            match probe.probe_once() {
                Ok(ProbeOutcome::Ready {
                    server_pid: Some(pid),
                }) if pid != self.pid => {
                    return Err(fail(
                        true,
                        io::ErrorKind::AddrInUse,
                        format!(
                            "{} is served by another process (pid {pid}), not by pid {}",
                            probe.addr, self.pid
                        ),
                    ));
                }
                // The liveness check guards against having talked to a
                // stranger that grabbed the port while ours failed to bind.
                Ok(ProbeOutcome::Ready { .. } | ProbeOutcome::Unverified) if self.is_alive() => {
                    return Ok(());
                }
                Ok(_) | Err(_) => {}
            }
            if Instant::now() >= deadline {
                return Err(fail(
                    false,
                    io::ErrorKind::TimedOut,
                    format!(
                        "server (pid {}) did not become ready on {} within {timeout:?}",
                        self.pid, probe.addr
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // SIGKILL also ends a SIGSTOPped process. Errors only mean that the
        // process is already gone, which is the goal.
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Checks readiness over plain RESP, independent of any client library.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub(crate) addr: SocketAddr,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeOutcome {
    /// `PING` succeeded, so the data set is loaded. `server_pid` is what
    /// `INFO server` reports, when we are allowed to ask.
    Ready { server_pid: Option<u32> },
    /// Still loading its RDB or AOF.
    Loading,
    /// Up, but authentication or ACLs keep us from seeing whether it still
    /// loads: Redis checks permissions before it reports `LOADING`.
    Unverified,
}

impl Probe {
    pub(crate) fn probe_once(&self) -> io::Result<ProbeOutcome> {
        let stream = TcpStream::connect_timeout(&self.addr, Duration::from_millis(250))?;
        stream.set_read_timeout(Some(Duration::from_secs(1)))?;
        stream.set_write_timeout(Some(Duration::from_secs(1)))?;
        let mut reader = BufReader::new(&stream);
        let mut writer = &stream;

        if let Some(password) = &self.password {
            let mut auth: Vec<&[u8]> = vec![b"AUTH"];
            auth.extend(self.username.as_deref().map(str::as_bytes));
            auth.push(password.as_bytes());
            writer.write_all(&encode_command(&auth))?;
            match read_reply(&mut reader)? {
                Reply::Error(e) if e.starts_with("LOADING") => return Ok(ProbeOutcome::Loading),
                Reply::Error(_) => return Ok(ProbeOutcome::Unverified),
                _ => {}
            }
        }

        writer.write_all(&encode_command(&[b"PING"]))?;
        match read_reply(&mut reader)? {
            Reply::Error(e) if e.starts_with("LOADING") => return Ok(ProbeOutcome::Loading),
            Reply::Error(_) => return Ok(ProbeOutcome::Unverified),
            _ => {}
        }

        writer.write_all(&encode_command(&[b"INFO", b"server"]))?;
        let server_pid = match read_reply(&mut reader)? {
            Reply::Bulk(Some(info)) => parse_process_id(&info),
            _ => None,
        };
        Ok(ProbeOutcome::Ready { server_pid })
    }
}

fn parse_process_id(info: &[u8]) -> Option<u32> {
    String::from_utf8_lossy(info)
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// Encodes a command as a RESP array of bulk strings, which (unlike inline
/// commands) carries passwords with spaces or quotes intact.
fn encode_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Status(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array,
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let invalid = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad RESP reply: {what}"),
        )
    };
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    let line = line.strip_suffix(b"\r\n").ok_or_else(|| {
        io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-reply")
    })?;
    let (&kind, rest) = line.split_first().ok_or_else(|| invalid("empty line"))?;
    let text = String::from_utf8_lossy(rest).into_owned();
    let number = || text.parse::<i64>().map_err(|_| invalid(&text));
    match kind {
        b'+' => Ok(Reply::Status(text)),
        b'-' => Ok(Reply::Error(text)),
        b':' => Ok(Reply::Integer(number()?)),
        b'$' => match usize::try_from(number()?) {
            Err(_) => Ok(Reply::Bulk(None)),
            Ok(len) => {
                let mut data = vec![0; len + 2];
                reader.read_exact(&mut data)?;
                data.truncate(len);
                Ok(Reply::Bulk(Some(data)))
            }
        },
        b'*' => {
            for _ in 0..number()?.max(0) {
                read_reply(reader)?;
            }
            Ok(Reply::Array)
        }
        _ => Err(invalid(&String::from_utf8_lossy(line))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands_as_resp_arrays() {
        assert_eq!(
            encode_command(&[b"AUTH", b"a b"]),
            b"*2\r\n$4\r\nAUTH\r\n$3\r\na b\r\n"
        );
    }

    #[test]
    fn reads_every_reply_kind() {
        let mut input: &[u8] =
            b"+PONG\r\n-LOADING busy\r\n:42\r\n$3\r\na\r\n\r\n$-1\r\n*2\r\n:1\r\n$1\r\nx\r\n";
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Status("PONG".into())
        );
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Error("LOADING busy".into())
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Integer(42));
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Bulk(Some(b"a\r\n".to_vec()))
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Bulk(None));
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Array);
        assert_eq!(
            read_reply(&mut input).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn parses_process_id_from_info() {
        let info = b"# Server\r\nredis_version:7.0.15\r\nprocess_id:1234\r\ntcp_port:1\r\n";
        assert_eq!(parse_process_id(info), Some(1234));
        assert_eq!(parse_process_id(b"# Server\r\n"), None);
    }

    #[test]
    fn explicit_binary_must_exist() {
        let err = find_redis_server(Some(OsStr::new("/nonexistent/redis-server"))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains(REDIS_SERVER_ENV), "{err}");
    }

    #[test]
    fn explicit_binary_wins_over_path() {
        let found = find_redis_server(Some(OsStr::new("/bin/sh"))).unwrap();
        assert_eq!(found, Path::new("/bin/sh"));
    }
}
