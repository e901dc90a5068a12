//! A fault-injecting TCP proxy to put a misbehaving network between a Redis
//! client and a throwaway server.
//!
//! The proxy runs on its own thread with its own single-threaded tokio
//! runtime. That keeps it independent of the caller: it works the same from
//! a plain `#[test]`, a current-thread `#[tokio::test]` (whose only thread
//! may be blocked in a synchronous Redis call that the proxy must still
//! serve) and a multi-threaded runtime, and dropping it never runs into
//! tokio's "cannot drop a runtime in an async context" panic.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::ports::is_acceptable;

/// Index of the client-to-server direction in per-direction arrays.
const UP: usize = 0;
/// Index of the server-to-client direction in per-direction arrays.
const DOWN: usize = 1;
const READ_BUFFER: usize = 16 * 1024;
/// Chunks read but not yet written, per connection and direction. Bounded
/// so that a peer that stops reading pushes back on the sender, as TCP
/// would, instead of growing the proxy's memory without limit.
const QUEUE_CHUNKS: usize = 64;
const BIND_ATTEMPTS: usize = 64;

/// Which way through a [`FaultProxy`] a fault applies to.
///
/// ```
/// use fencelock_testing::Direction;
///
/// // A reply travels downstream, from Redis to the client.
/// let reply_path = Direction::Downstream;
/// assert_ne!(reply_path, Direction::Upstream);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client to the server: requests.
    Upstream,
    /// From the server to the client: replies and pushed messages.
    Downstream,
    /// Both ways at once, for example for a full partition.
    Both,
}

impl Direction {
    fn indices(self) -> &'static [usize] {
        match self {
            Direction::Upstream => &[UP],
            Direction::Downstream => &[DOWN],
            Direction::Both => &[UP, DOWN],
        }
    }
}

/// What a [`FaultProxy`] does to the bytes it reads in one direction.
///
/// A fault applies to every connection through the proxy, and to data the
/// proxy reads after it is set; [`Fault::Drop`] also discards chunks that
/// are still waiting out an earlier [`Fault::Delay`].
///
/// ```
/// use std::time::Duration;
/// use fencelock_testing::Fault;
///
/// let slow_network = Fault::Delay(Duration::from_millis(200));
/// assert_ne!(slow_network, Fault::default());
/// assert_eq!(Fault::default(), Fault::None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Forward everything promptly.
    #[default]
    None,
    /// Hold every chunk this long after reading it before forwarding it.
    /// Order is kept: a chunk never overtakes an earlier one, even when the
    /// delay is shortened in between.
    Delay(Duration),
    /// Discard the next `n` complete RESP messages, then forward normally
    /// again (the fault reverts to [`Fault::None`] by itself).
    ///
    /// Counting messages rather than TCP reads makes this exact: a large
    /// reply that arrives in many reads is dropped whole, and of two
    /// replies that arrive in one read only the first is dropped. The count
    /// is shared by all connections, so with several busy connections the
    /// first messages to arrive on any of them are dropped; pub/sub pushes
    /// count as messages too. The parser assumes the fault is set while
    /// the stream is between messages (for example with no request in
    /// flight); bytes that are not RESP, such as inline commands, are
    /// dropped up to the end of the read as if they were one message.
    DropNext(u64),
    /// Discard everything while keeping the connections open: one half of
    /// a network partition. Data discarded now is never delivered later.
    Drop,
}

/// Counters for one [`Direction`] of a [`FaultProxy`], part of [`Stats`].
///
/// ```no_run
/// use fencelock_testing::{FaultProxy, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.addr())?;
/// let mut con = redis::Client::open(proxy.url())?.get_connection()?;
/// let _: String = redis::cmd("PING").query(&mut con)?;
/// assert!(proxy.stats().upstream.bytes_forwarded > 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DirectionStats {
    /// Bytes read from the sending side, counted once the faults in force at that moment
    /// (delay, drop) have been applied to them.
    pub bytes_received: u64,
    /// Bytes written to the receiving side.
    pub bytes_forwarded: u64,
    /// Bytes discarded by [`Fault::Drop`] and [`Fault::DropNext`].
    pub bytes_dropped: u64,
    /// RESP messages discarded by [`Fault::DropNext`].
    pub messages_dropped: u64,
}

/// Totals since a [`FaultProxy`] started; see [`FaultProxy::stats`].
///
/// ```
/// use fencelock_testing::Stats;
///
/// let stats = Stats::default();
/// assert_eq!(stats.connections_accepted, 0);
/// assert_eq!(stats.downstream.bytes_forwarded, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Client-to-server traffic.
    pub upstream: DirectionStats,
    /// Server-to-client traffic.
    pub downstream: DirectionStats,
    /// Connections accepted and forwarded to the target.
    pub connections_accepted: u64,
    /// Connections closed right after accepting them because of
    /// [`FaultProxy::refuse_new`]; not included in `connections_accepted`.
    pub connections_refused: u64,
}

#[derive(Default)]
struct Counters {
    bytes_received: AtomicU64,
    bytes_forwarded: AtomicU64,
    bytes_dropped: AtomicU64,
    messages_dropped: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> DirectionStats {
        DirectionStats {
            bytes_received: self.bytes_received.load(Ordering::SeqCst),
            bytes_forwarded: self.bytes_forwarded.load(Ordering::SeqCst),
            bytes_dropped: self.bytes_dropped.load(Ordering::SeqCst),
            messages_dropped: self.messages_dropped.load(Ordering::SeqCst),
        }
    }
}

/// State shared between the handle and the proxy thread.
struct Shared {
    /// Read when a connection is opened; changed by [`FaultProxy::retarget`].
    target: Mutex<SocketAddr>,
    faults: Mutex<[Fault; 2]>,
    refuse_new: AtomicBool,
    counters: [Counters; 2],
    accepted: AtomicU64,
    refused: AtomicU64,
}

impl Shared {
    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::SeqCst);
    }
}

enum Command {
    /// Abort every connection, then acknowledge, so that the caller can
    /// rely on the resets having happened when `reset_all` returns.
    ResetAll(std_mpsc::Sender<()>),
    Stop,
}

/// A TCP proxy on a free `127.0.0.1` port that forwards every connection
/// to a target, usually a [`RedisServer`](super::RedisServer), and injects
/// network faults that a test switches on and off while it runs.
///
/// Faults are set per [`Direction`]: upstream carries requests to the
/// server, downstream carries replies back. They apply to all connections
/// through the proxy, existing and new. Connect clients to [`url`](Self::url)
/// (or [`addr`](Self::addr)) instead of the server's own address.
///
/// The proxy runs on a dedicated thread with its own tokio runtime, so it
/// can be created, used and dropped from synchronous tests and from any
/// tokio runtime alike. Dropping it stops listening, frees the port and
/// resets every connection through it.
///
/// # Example
///
/// Losing a reply: the command runs on Redis but the client never learns.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock_testing::{FaultProxy, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.addr())?;
/// let mut con = redis::Client::open(proxy.url())?.get_connection()?;
/// con.set_read_timeout(Some(Duration::from_millis(500)))?;
///
/// proxy.lose_next_reply();
/// let result: redis::RedisResult<()> = redis::cmd("SET").arg("k").arg("v").query(&mut con);
/// assert!(result.unwrap_err().is_timeout());
///
/// let mut direct = server.client().get_connection()?;
/// let value: String = redis::cmd("GET").arg("k").query(&mut direct)?;
/// assert_eq!(value, "v");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("target", &*self.shared.target.lock())
            .field("faults", &*self.shared.faults.lock())
            .finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// Starts a proxy to `target` on a free loopback port and returns once
    /// it is accepting connections.
    ///
    /// Nothing connects to `target` until a client connects to the proxy;
    /// a client whose connection to `target` fails is reset. Callable with
    /// or without a tokio runtime.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// let client = redis::Client::open(proxy.url())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Fails if no loopback port can be bound or the proxy thread cannot
    /// be started.
    pub fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = bind_loopback()?;
        // Required before a std listener may be handed to tokio.
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            faults: Mutex::new([Fault::None; 2]),
            refuse_new: AtomicBool::new(false),
            counters: Default::default(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std_mpsc::channel();

        let thread_shared = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                // Built here rather than by the caller: a runtime must not
                // be dropped inside another runtime's context, which would
                // happen on the caller's error paths in async tests.
                let started = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .and_then(|runtime| {
                        let listener = {
                            let _context = runtime.enter();
                            TcpListener::from_std(listener)?
                        };
                        Ok((runtime, listener))
                    });
                match started {
                    Ok((runtime, listener)) => {
                        let _ = ready_tx.send(Ok(()));
                        runtime.block_on(serve(listener, thread_shared, commands_rx));
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                    }
                }
            })?;
        let proxy = Self {
            addr,
            shared,
            commands,
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(proxy),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(io::Error::other("fault proxy thread exited during startup")),
        }
    }

    /// The address clients connect to, `127.0.0.1:port`.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// assert!(proxy.addr().ip().is_loopback());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port of [`addr`](Self::addr).
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// assert_ne!(proxy.port(), server.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A URL for the `redis` crate, `redis://127.0.0.1:port/`.
    ///
    /// It carries no credentials: for a server with a password, build the
    /// URL from [`port`](Self::port) instead.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// The address connections are forwarded to.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.target(), server.addr());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn target(&self) -> SocketAddr {
        *self.shared.target.lock()
    }

    /// Points the proxy at `new_target`: connections opened from now on go
    /// there, and every existing connection is reset (as
    /// [`reset_all`](Self::reset_all) does), so a client that reconnects
    /// reaches the new target. Faults stay as they are.
    ///
    /// This is how a test moves clients to a promoted replica after a
    /// failover without them knowing: they keep the proxy's address, as
    /// they would keep a virtual IP or a DNS name. A connection that is
    /// being opened while `retarget` runs may be reset too; clients
    /// reconnect as they would after any reset.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let old = RedisServer::start()?;
    /// let new = RedisServer::start()?;
    /// let proxy = FaultProxy::start(old.addr())?;
    /// proxy.retarget(new.addr());
    /// assert_eq!(proxy.target(), new.addr());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn retarget(&self, new_target: SocketAddr) {
        *self.shared.target.lock() = new_target;
        self.reset_all();
    }

    /// Switches `direction` to `fault`, replacing the fault it had.
    ///
    /// Takes effect for the next read on every connection. With
    /// [`Direction::Both`], each direction gets its own copy of the fault,
    /// so `DropNext(1)` drops one message each way.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock_testing::{Direction, Fault, FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// proxy.set(Direction::Both, Fault::Delay(Duration::from_millis(50)));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set(&self, direction: Direction, fault: Fault) {
        let fault = match fault {
            Fault::DropNext(0) => Fault::None,
            fault => fault,
        };
        let mut faults = self.shared.faults.lock();
        for &index in direction.indices() {
            faults[index] = fault;
        }
    }

    /// Holds everything in `direction` for `delay` before forwarding it;
    /// short for `set(direction, Fault::Delay(delay))`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock_testing::{Direction, FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// // Replies now arrive at least 200ms after Redis sends them.
    /// proxy.delay(Direction::Downstream, Duration::from_millis(200));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn delay(&self, direction: Direction, delay: Duration) {
        self.set(direction, Fault::Delay(delay));
    }

    /// Discards the next `n` RESP messages in `direction`; short for
    /// `set(direction, Fault::DropNext(n))`. See [`Fault::DropNext`].
    ///
    /// ```no_run
    /// use fencelock_testing::{Direction, FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// // The next command never reaches Redis.
    /// proxy.drop_next(Direction::Upstream, 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn drop_next(&self, direction: Direction, n: u64) {
        self.set(direction, Fault::DropNext(n));
    }

    /// Discards the next reply from the server, so that a command runs on
    /// Redis but its client never hears back; short for
    /// `drop_next(Direction::Downstream, 1)`.
    ///
    /// Exact when one request is in flight on one connection; see
    /// [`Fault::DropNext`] for the fine print. The connection stays in
    /// sync: the reply after the lost one reaches the client intact.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// let mut con = redis::Client::open(proxy.url())?.get_connection()?;
    /// con.set_read_timeout(Some(Duration::from_millis(500)))?;
    /// proxy.lose_next_reply();
    /// let lost: redis::RedisResult<i64> = redis::cmd("INCR").arg("n").query(&mut con);
    /// assert!(lost.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lose_next_reply(&self) {
        self.drop_next(Direction::Downstream, 1);
    }

    /// Silently discards everything in `direction` while keeping the
    /// connections open, as a network partition would; short for
    /// `set(direction, Fault::Drop)`. Undo with [`heal`](Self::heal).
    ///
    /// ```no_run
    /// use fencelock_testing::{Direction, FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// proxy.blackhole(Direction::Both);
    /// // ... the client's commands now time out ...
    /// proxy.heal();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn blackhole(&self, direction: Direction) {
        self.set(direction, Fault::Drop);
    }

    /// Clears every fault: both directions forward normally again and new
    /// connections are accepted (see [`refuse_new`](Self::refuse_new)).
    ///
    /// Data discarded while a fault was active stays lost. A message that
    /// [`Fault::DropNext`] has started to discard is still discarded to
    /// its end, so that the stream stays well-formed.
    ///
    /// ```no_run
    /// use fencelock_testing::{Direction, FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// proxy.blackhole(Direction::Upstream);
    /// proxy.refuse_new(true);
    /// proxy.heal();
    /// let mut con = redis::Client::open(proxy.url())?.get_connection()?;
    /// let _: String = redis::cmd("PING").query(&mut con)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn heal(&self) {
        self.set(Direction::Both, Fault::None);
        self.refuse_new(false);
    }

    /// Aborts every current connection with a TCP reset, on both the client
    /// and the server side; returns once all of them are gone.
    ///
    /// The proxy keeps listening, and new connections are forwarded as
    /// usual. Blocks the calling thread briefly, which is harmless in async
    /// code: the work happens on the proxy's own thread.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// let client = redis::Client::open(proxy.url())?;
    /// let mut con = client.get_connection()?;
    /// proxy.reset_all();
    /// assert!(redis::cmd("PING").query::<String>(&mut con).is_err());
    /// let mut fresh = client.get_connection()?;
    /// let _: String = redis::cmd("PING").query(&mut fresh)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset_all(&self) {
        let (ack_tx, ack_rx) = std_mpsc::channel();
        if self.commands.send(Command::ResetAll(ack_tx)).is_ok() {
            // An error means the proxy thread is gone, and its connections
            // with it.
            let _ = ack_rx.recv();
        }
    }

    /// While `refuse` is true, new connections are accepted and at once
    /// reset, so clients fail to connect as if the server were down.
    /// Existing connections are not affected.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// proxy.refuse_new(true);
    /// let client = redis::Client::open(proxy.url())?;
    /// let ping = client
    ///     .get_connection()
    ///     .and_then(|mut con| redis::cmd("PING").query::<String>(&mut con));
    /// assert!(ping.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refuse_new(&self, refuse: bool) {
        self.shared.refuse_new.store(refuse, Ordering::SeqCst);
    }

    /// Traffic and connection counts since the proxy started.
    ///
    /// Bytes are counted as they are handed to the receiving socket, so
    /// once a client has read a reply, the reply is in the counts.
    ///
    /// ```no_run
    /// use fencelock_testing::{FaultProxy, RedisServer};
    ///
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// let mut con = redis::Client::open(proxy.url())?.get_connection()?;
    /// let _: String = redis::cmd("PING").query(&mut con)?;
    /// let stats = proxy.stats();
    /// assert_eq!(stats.connections_accepted, 1);
    /// assert!(stats.downstream.bytes_forwarded >= "+PONG\r\n".len() as u64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let shared = &self.shared;
        Stats {
            upstream: shared.counters[UP].snapshot(),
            downstream: shared.counters[DOWN].snapshot(),
            connections_accepted: shared.accepted.load(Ordering::SeqCst),
            connections_refused: shared.refused.load(Ordering::SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop);
        if let Some(thread) = self.thread.take() {
            // Joining makes "the port is free" true when drop returns. A
            // panic on the proxy thread must not become a double panic here.
            let _ = thread.join();
        }
    }
}

fn bind_loopback() -> io::Result<StdTcpListener> {
    for _ in 0..BIND_ATTEMPTS {
        let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        // A client pointed at a default Redis port by mistake must not end
        // up talking to the proxy, nor the other way round.
        if is_acceptable(listener.local_addr()?.port()) {
            return Ok(listener);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!("could not find a free port on 127.0.0.1 in {BIND_ATTEMPTS} attempts"),
    ))
}

/// Makes closing `stream` send a reset instead of a FIN.
fn arm_reset(stream: &TcpStream) {
    // `set_linger` is deprecated because a non-zero linger blocks on close;
    // zero never blocks, and unlike `set_zero_linger` this exists in every
    // tokio 1.x the manifest admits.
    #[allow(deprecated)]
    let armed = stream.set_linger(Some(Duration::ZERO));
    if let Err(err) = armed {
        tracing::debug!(%err, "fault proxy: cannot set SO_LINGER, closing without a reset");
    }
}

async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    // The generation changes on every reset; each connection watches it.
    let (reset, _) = watch::channel(0u64);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    if shared.refuse_new.load(Ordering::SeqCst) {
                        Shared::add(&shared.refused, 1);
                        arm_reset(&client);
                        continue;
                    }
                    Shared::add(&shared.accepted, 1);
                    connections.spawn(connection(client, Arc::clone(&shared), reset.subscribe()));
                }
                Err(err) => {
                    // Typically out of file descriptors; retrying at once
                    // would spin.
                    tracing::debug!(%err, "fault proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            command = commands.recv() => match command {
                Some(Command::ResetAll(ack)) => {
                    reset_connections(&reset, &mut connections).await;
                    let _ = ack.send(());
                }
                Some(Command::Stop) | None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    reset_connections(&reset, &mut connections).await;
}

async fn reset_connections(reset: &watch::Sender<u64>, connections: &mut JoinSet<()>) {
    reset.send_modify(|generation| *generation = generation.wrapping_add(1));
    while connections.join_next().await.is_some() {}
}

async fn connection(mut client: TcpStream, shared: Arc<Shared>, mut reset: watch::Receiver<u64>) {
    // Without it, small requests could wait for Nagle's algorithm and make
    // the proxy add latency no test asked for.
    let _ = client.set_nodelay(true);
    let target = *shared.target.lock();
    let server = tokio::select! {
        server = TcpStream::connect(target) => server,
        _ = reset.changed() => {
            arm_reset(&client);
            return;
        }
    };
    let mut server = match server {
        Ok(server) => server,
        Err(err) => {
            tracing::debug!(%err, %target, "fault proxy: cannot reach target");
            arm_reset(&client);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let clean = tokio::select! {
        result = forward_both(&mut client, &mut server, &shared) => match result {
            Ok(()) => true,
            Err(err) => {
                tracing::debug!(%err, "fault proxy: connection failed");
                false
            }
        },
        _ = reset.changed() => false,
    };
    if !clean {
        // Pass a failure on as a failure: a reset on one side becomes a
        // reset on the other, not an orderly end of stream.
        arm_reset(&client);
        arm_reset(&server);
    }
}

async fn forward_both(
    client: &mut TcpStream,
    server: &mut TcpStream,
    shared: &Shared,
) -> io::Result<()> {
    let (client_read, client_write) = client.split();
    let (server_read, server_write) = server.split();
    tokio::try_join!(
        forward(client_read, server_write, UP, shared),
        forward(server_read, client_write, DOWN, shared),
    )?;
    Ok(())
}

/// Copies one direction until end of stream, applying its fault.
///
/// Reading and writing are decoupled by a queue so that a delay holds
/// chunks back without stopping the reads that timestamp later chunks.
async fn forward(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    dir: usize,
    shared: &Shared,
) -> io::Result<()> {
    let (queue, mut queued) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let read = async move {
        let mut filter = DropFilter::default();
        let mut buf = vec![0; READ_BUFFER];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), io::Error>(());
            }
            let admitted = filter.admit(&buf[..n], dir, shared);
            Shared::add(&shared.counters[dir].bytes_received, n);
            if let Some(chunk) = admitted {
                if queue.send(chunk).await.is_err() {
                    // The writer failed; try_join reports its error.
                    return Ok(());
                }
            }
        }
    };
    let write = async {
        while let Some((due, data)) = queued.recv().await {
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            let counters = &shared.counters[dir];
            if shared.faults.lock()[dir] == Fault::Drop {
                Shared::add(&counters.bytes_dropped, data.len());
                continue;
            }
            Shared::add(&counters.bytes_forwarded, data.len());
            to.write_all(&data).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write)?;
    Ok(())
}

/// Applies the read-time part of the faults to one direction of one
/// connection, and remembers a RESP message that `DropNext` is halfway
/// through discarding.
#[derive(Default)]
struct DropFilter {
    /// Buffered bytes, starting at a message boundary, while a message is
    /// being discarded.
    partial: Vec<u8>,
    /// Whether the message at the start of `partial` has been taken from
    /// the `DropNext` count.
    claimed: bool,
}

impl DropFilter {
    /// What to forward of a chunk just read, and when.
    fn admit(&mut self, chunk: &[u8], dir: usize, shared: &Shared) -> Option<(Instant, Vec<u8>)> {
        let now = Instant::now();
        let counters = &shared.counters[dir];
        let mut faults = shared.faults.lock();
        let data = if self.claimed || matches!(faults[dir], Fault::DropNext(_)) {
            self.partial.extend_from_slice(chunk);
            while !self.partial.is_empty() {
                if !self.claimed {
                    match faults[dir] {
                        Fault::DropNext(n) => {
                            faults[dir] = if n <= 1 {
                                Fault::None
                            } else {
                                Fault::DropNext(n - 1)
                            };
                            self.claimed = true;
                        }
                        _ => break,
                    }
                }
                let len = match resp_message_len(&self.partial) {
                    RespFrame::Complete(len) => len,
                    RespFrame::Incomplete => return None,
                    RespFrame::Invalid => {
                        tracing::debug!("fault proxy: not RESP, dropping the rest of the read");
                        self.partial.len()
                    }
                };
                self.partial.drain(..len);
                self.claimed = false;
                Shared::add(&counters.bytes_dropped, len);
                Shared::add(&counters.messages_dropped, 1);
            }
            std::mem::take(&mut self.partial)
        } else {
            chunk.to_vec()
        };
        if data.is_empty() {
            return None;
        }
        match faults[dir] {
            Fault::None | Fault::DropNext(_) => Some((now, data)),
            Fault::Delay(delay) => Some((now + delay, data)),
            Fault::Drop => {
                Shared::add(&counters.bytes_dropped, data.len());
                None
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum RespFrame {
    /// A whole message of this many bytes starts the buffer.
    Complete(usize),
    Incomplete,
    Invalid,
}

/// Finds where the RESP2/RESP3 message at the start of `buf` ends, without
/// decoding it.
fn resp_message_len(buf: &[u8]) -> RespFrame {
    let mut pos = 0usize;
    // Elements still to skip; aggregates add their children.
    let mut pending: u64 = 1;
    while pending > 0 {
        pending -= 1;
        let rest = &buf[pos..];
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return RespFrame::Incomplete;
        };
        if eol == 0 {
            return RespFrame::Invalid;
        }
        let header = &rest[1..eol];
        pos += eol + 2;
        match rest[0] {
            b'+' | b'-' | b':' | b',' | b'(' | b'_' | b'#' => {}
            b'$' | b'!' | b'=' => {
                let Some(len) = parse_len(header) else {
                    return RespFrame::Invalid;
                };
                // A null bulk string (`$-1`) has no payload.
                let Some(len) = len else { continue };
                let Some(end) = pos.checked_add(len).and_then(|e| e.checked_add(2)) else {
                    return RespFrame::Invalid;
                };
                if buf.len() < end {
                    return RespFrame::Incomplete;
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return RespFrame::Invalid;
                }
                pos = end;
            }
            kind @ (b'*' | b'~' | b'>' | b'%' | b'|') => {
                let Some(count) = parse_len(header) else {
                    return RespFrame::Invalid;
                };
                let count = count.unwrap_or(0) as u64;
                pending = pending.saturating_add(match kind {
                    b'%' => count.saturating_mul(2),
                    // Attributes precede the reply they annotate.
                    b'|' => count.saturating_mul(2).saturating_add(1),
                    _ => count,
                });
            }
            _ => return RespFrame::Invalid,
        }
    }
    RespFrame::Complete(pos)
}

/// Parses a RESP length: `Some(None)` for the null length `-1`.
fn parse_len(header: &[u8]) -> Option<Option<usize>> {
    let n: i64 = std::str::from_utf8(header).ok()?.parse().ok()?;
    match n {
        -1 => Some(None),
        n => usize::try_from(n).ok().map(Some),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream as StdTcpStream};
    use std::time::Instant as StdInstant;

    use super::*;
    use crate::RedisServer;

    const TIMEOUT: Duration = Duration::from_secs(10);
    /// Long enough that a reply which was going to arrive has arrived.
    const QUIET: Duration = Duration::from_millis(300);

    fn setup() -> (RedisServer, FaultProxy) {
        let server = RedisServer::start().expect("start redis-server");
        let proxy = FaultProxy::start(server.addr()).expect("start proxy");
        (server, proxy)
    }

    fn connect(proxy: &FaultProxy, read_timeout: Duration) -> redis::Connection {
        let con = redis::Client::open(proxy.url())
            .unwrap()
            .get_connection_with_timeout(TIMEOUT)
            .unwrap();
        con.set_read_timeout(Some(read_timeout)).unwrap();
        con
    }

    fn raw(proxy: &FaultProxy) -> StdTcpStream {
        let stream = StdTcpStream::connect(proxy.addr()).unwrap();
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream
    }

    fn command(args: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        out
    }

    fn read_exact(stream: &mut StdTcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        stream.read_exact(&mut buf).unwrap();
        buf
    }

    /// Asserts nothing more arrives within [`QUIET`].
    fn assert_silent(stream: &mut StdTcpStream) {
        let quiet_until = StdInstant::now() + QUIET;
        let mut buf = [0; 64];
        loop {
            let left = quiet_until.saturating_duration_since(StdInstant::now());
            if left.is_zero() {
                break;
            }
            stream.set_read_timeout(Some(left)).unwrap();
            match stream.read(&mut buf) {
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                // A signal for another test's child process (SIGCHLD) cut the wait short:
                // that is not data, keep listening for the rest of the quiet period.
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                other => panic!("expected silence, got {other:?} {:?}", &buf[..]),
            }
        }
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    }

    fn get(server: &RedisServer, key: &str) -> Option<String> {
        let mut con = server.client().get_connection().unwrap();
        redis::cmd("GET").arg(key).query(&mut con).unwrap()
    }

    #[test]
    fn proxy_forwards_commands_and_replies() {
        let (server, proxy) = setup();
        let mut con = connect(&proxy, TIMEOUT);
        let () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
        let value: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(value, "v");
        assert_eq!(get(&server, "k").as_deref(), Some("v"));
        assert_eq!(proxy.target(), server.addr());
        assert!(proxy.url().starts_with("redis://127.0.0.1:"));
    }

    #[test]
    fn proxy_lost_reply_runs_the_command_but_times_out() {
        let (server, proxy) = setup();
        let mut con = connect(&proxy, Duration::from_millis(500));
        proxy.lose_next_reply();
        let err = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query::<()>(&mut con)
            .unwrap_err();
        assert!(err.is_timeout(), "expected a timeout, got {err:?}");
        assert_eq!(get(&server, "k").as_deref(), Some("v"));
        let stats = proxy.stats();
        assert_eq!(stats.downstream.messages_dropped, 1);
        assert_eq!(stats.downstream.bytes_dropped, "+OK\r\n".len() as u64);

        // The fault was used up: a new connection works normally.
        let mut con = connect(&proxy, TIMEOUT);
        let value: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(value, "v");
    }

    #[test]
    fn proxy_drop_next_drops_exactly_one_message_of_a_pipeline() {
        let (_server, proxy) = setup();
        let mut stream = raw(&proxy);
        proxy.lose_next_reply();
        let mut pipeline = command(&["SET", "k", "v"]);
        pipeline.extend(command(&["GET", "k"]));
        stream.write_all(&pipeline).unwrap();
        assert_eq!(read_exact(&mut stream, 7), b"$1\r\nv\r\n");
        assert_silent(&mut stream);
    }

    #[test]
    fn proxy_drop_next_drops_a_reply_spanning_many_reads() {
        let (server, proxy) = setup();
        let big = "x".repeat(1 << 20);
        let mut direct = server.client().get_connection().unwrap();
        let () = redis::cmd("SET")
            .arg("big")
            .arg(&big)
            .query(&mut direct)
            .unwrap();

        let mut stream = raw(&proxy);
        proxy.lose_next_reply();
        let mut pipeline = command(&["GET", "big"]);
        pipeline.extend(command(&["PING"]));
        stream.write_all(&pipeline).unwrap();
        assert_eq!(read_exact(&mut stream, 7), b"+PONG\r\n");
        assert_silent(&mut stream);
        let stats = proxy.stats();
        assert_eq!(stats.downstream.messages_dropped, 1);
        assert!(stats.downstream.bytes_dropped > big.len() as u64);
    }

    #[test]
    fn proxy_drop_next_upstream_loses_the_command() {
        let (server, proxy) = setup();
        let mut stream = raw(&proxy);
        proxy.drop_next(Direction::Upstream, 1);
        stream.write_all(&command(&["SET", "lost", "1"])).unwrap();
        stream.write_all(&command(&["SET", "kept", "1"])).unwrap();
        assert_eq!(read_exact(&mut stream, 5), b"+OK\r\n");
        assert_eq!(get(&server, "lost"), None);
        assert_eq!(get(&server, "kept").as_deref(), Some("1"));
        assert_eq!(proxy.stats().upstream.messages_dropped, 1);
    }

    #[test]
    fn proxy_delay_holds_replies_back_and_keeps_order() {
        let (_server, proxy) = setup();
        let delay = Duration::from_millis(300);

        let mut con = connect(&proxy, TIMEOUT);
        proxy.delay(Direction::Downstream, delay);
        let started = StdInstant::now();
        let pong: String = redis::cmd("PING").query(&mut con).unwrap();
        assert_eq!(pong, "PONG");
        assert!(started.elapsed() >= delay, "took {:?}", started.elapsed());

        // A later chunk with a shorter delay must not overtake an earlier
        // one.
        proxy.heal();
        let mut stream = raw(&proxy);
        proxy.delay(Direction::Upstream, delay);
        let started = StdInstant::now();
        let first = command(&["SET", "order", "first"]);
        let before = proxy.stats().upstream.bytes_received;
        stream.write_all(&first).unwrap();
        // The first command must be read (and given its delay) on its own, before the heal.
        let read_alone = StdInstant::now();
        while proxy.stats().upstream.bytes_received < before + first.len() as u64 {
            assert!(
                read_alone.elapsed() < TIMEOUT,
                "the proxy never read the first command"
            );
            thread::sleep(Duration::from_millis(1));
        }
        proxy.heal();
        stream
            .write_all(&command(&["SET", "order", "second"]))
            .unwrap();
        stream.write_all(&command(&["GET", "order"])).unwrap();
        let replies = read_exact(&mut stream, 5 + 5 + 12);
        assert!(started.elapsed() >= delay, "took {:?}", started.elapsed());
        assert_eq!(replies, b"+OK\r\n+OK\r\n$6\r\nsecond\r\n");
    }

    #[test]
    fn proxy_blackhole_then_heal() {
        let (server, proxy) = setup();
        let mut con = connect(&proxy, Duration::from_millis(300));
        proxy.blackhole(Direction::Upstream);
        let err = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query::<()>(&mut con)
            .unwrap_err();
        assert!(err.is_timeout(), "expected a timeout, got {err:?}");
        assert_eq!(get(&server, "k"), None);
        assert!(proxy.stats().upstream.bytes_dropped > 0);

        // Downstream: the command runs, and its reply is not delivered
        // late after healing on the same, still open, connection.
        let mut stream = raw(&proxy);
        proxy.heal();
        proxy.blackhole(Direction::Downstream);
        stream.write_all(&command(&["SET", "k", "v"])).unwrap();
        assert_silent(&mut stream);
        assert_eq!(get(&server, "k").as_deref(), Some("v"));
        proxy.heal();
        stream.write_all(&command(&["PING"])).unwrap();
        assert_eq!(read_exact(&mut stream, 7), b"+PONG\r\n");
        assert_silent(&mut stream);

        let mut con = connect(&proxy, TIMEOUT);
        let value: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(value, "v");
    }

    #[test]
    fn proxy_reset_all_aborts_connections_and_accepts_new_ones() {
        let (_server, proxy) = setup();
        let mut con = connect(&proxy, TIMEOUT);
        let _: String = redis::cmd("PING").query(&mut con).unwrap();
        let mut stream = raw(&proxy);
        stream.write_all(&command(&["PING"])).unwrap();
        assert_eq!(read_exact(&mut stream, 7), b"+PONG\r\n");

        proxy.reset_all();
        let mut buf = [0; 16];
        let err = stream.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        let err = redis::cmd("PING").query::<String>(&mut con).unwrap_err();
        assert!(
            err.is_io_error() || err.is_connection_dropped(),
            "expected an IO error, got {err:?}"
        );

        let mut con = connect(&proxy, TIMEOUT);
        let _: String = redis::cmd("PING").query(&mut con).unwrap();
        assert_eq!(proxy.stats().connections_accepted, 3);
    }

    #[test]
    fn proxy_refuse_new_rejects_only_new_connections() {
        let (_server, proxy) = setup();
        let mut existing = connect(&proxy, TIMEOUT);
        let _: String = redis::cmd("PING").query(&mut existing).unwrap();

        proxy.refuse_new(true);
        let mut refused = raw(&proxy);
        let mut buf = [0; 16];
        match refused.read(&mut buf) {
            Ok(0) => {}
            Err(err) => assert_eq!(err.kind(), io::ErrorKind::ConnectionReset),
            Ok(n) => panic!("a refused connection delivered {:?}", &buf[..n]),
        }
        let ping = redis::Client::open(proxy.url())
            .unwrap()
            .get_connection_with_timeout(TIMEOUT)
            .and_then(|mut con| redis::cmd("PING").query::<String>(&mut con));
        assert!(ping.is_err(), "connected while refusing: {ping:?}");
        let _: String = redis::cmd("PING").query(&mut existing).unwrap();

        proxy.refuse_new(false);
        let mut con = connect(&proxy, TIMEOUT);
        let _: String = redis::cmd("PING").query(&mut con).unwrap();
        let stats = proxy.stats();
        assert_eq!(stats.connections_refused, 2);
        assert_eq!(stats.connections_accepted, 2);
    }

    #[test]
    fn proxy_drop_frees_the_port_and_closes_connections() {
        let (_server, proxy) = setup();
        let port = proxy.port();
        let mut stream = raw(&proxy);
        stream.write_all(&command(&["PING"])).unwrap();
        assert_eq!(read_exact(&mut stream, 7), b"+PONG\r\n");

        drop(proxy);
        let mut buf = [0; 16];
        assert!(!matches!(stream.read(&mut buf), Ok(n) if n > 0));
        StdTcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("port still taken");
    }

    #[test]
    fn proxy_stats_count_bytes_per_direction() {
        let (_server, proxy) = setup();
        assert_eq!(proxy.stats(), Stats::default());
        let mut stream = raw(&proxy);
        let ping = command(&["PING"]);
        stream.write_all(&ping).unwrap();
        assert_eq!(read_exact(&mut stream, 7), b"+PONG\r\n");
        let stats = proxy.stats();
        assert_eq!(stats.upstream.bytes_forwarded, ping.len() as u64);
        assert_eq!(stats.downstream.bytes_forwarded, 7);
        assert_eq!(stats.upstream.bytes_dropped, 0);
        assert_eq!(stats.connections_accepted, 1);
    }

    #[test]
    fn proxy_passes_end_of_stream_on() {
        let (_server, proxy) = setup();
        let mut stream = raw(&proxy);
        stream.write_all(&command(&["PING"])).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"+PONG\r\n");
    }

    #[test]
    fn proxy_retarget_moves_new_connections_and_resets_old_ones() {
        let (first, proxy) = setup();
        let second = RedisServer::start().expect("start redis-server");
        let mut old = connect(&proxy, TIMEOUT);
        let () = redis::cmd("SET")
            .arg("where")
            .arg("first")
            .query(&mut old)
            .unwrap();
        let mut raw_old = raw(&proxy);
        raw_old.write_all(&command(&["PING"])).unwrap();
        assert_eq!(read_exact(&mut raw_old, 7), b"+PONG\r\n");

        proxy.retarget(second.addr());
        assert_eq!(proxy.target(), second.addr());
        // Existing connections are gone, with a reset rather than an orderly close.
        let mut buf = [0; 16];
        let err = raw_old.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        let err = redis::cmd("PING").query::<String>(&mut old).unwrap_err();
        assert!(
            err.is_io_error() || err.is_connection_dropped(),
            "expected an IO error, got {err:?}"
        );
        // New ones reach the new target, not the old one.
        let mut new = connect(&proxy, TIMEOUT);
        let value: Option<String> = redis::cmd("GET").arg("where").query(&mut new).unwrap();
        assert_eq!(value, None);
        let () = redis::cmd("SET")
            .arg("where")
            .arg("second")
            .query(&mut new)
            .unwrap();
        assert_eq!(get(&second, "where").as_deref(), Some("second"));
        assert_eq!(get(&first, "where").as_deref(), Some("first"));

        // Faults survive a retarget, and pointing back works the same way.
        proxy.blackhole(Direction::Upstream);
        proxy.retarget(first.addr());
        let mut blocked = raw(&proxy);
        blocked.write_all(&command(&["PING"])).unwrap();
        assert_silent(&mut blocked);
        proxy.heal();
        let mut back = connect(&proxy, TIMEOUT);
        let value: String = redis::cmd("GET").arg("where").query(&mut back).unwrap();
        assert_eq!(value, "first");
        assert_eq!(proxy.stats().connections_accepted, 5);
    }

    #[test]
    fn proxy_resets_clients_when_the_target_is_down() {
        let (mut server, proxy) = setup();
        server.kill();
        let mut stream = raw(&proxy);
        let mut buf = [0; 16];
        assert!(!matches!(stream.read(&mut buf), Ok(n) if n > 0));
    }

    /// An async connection through `proxy` that waits as long as the blocking ones: redis-rs'
    /// default response timeout (500 ms) is less than a delayed round trip can take on a
    /// loaded machine.
    async fn connect_async(proxy: &FaultProxy) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT));
        let client = redis::Client::open(proxy.url()).unwrap();
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn proxy_works_inside_a_current_thread_runtime() {
        let (server, proxy) = setup();
        let mut con = connect_async(&proxy).await;
        let () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query_async(&mut con)
            .await
            .unwrap();
        proxy.delay(Direction::Both, Duration::from_millis(100));
        let started = StdInstant::now();
        let value: String = redis::cmd("GET")
            .arg("k")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(value, "v");
        assert!(started.elapsed() >= Duration::from_millis(200));
        proxy.reset_all();
        drop(proxy);
        assert_eq!(get(&server, "k").as_deref(), Some("v"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proxy_works_inside_a_multi_thread_runtime() {
        let (_server, proxy) = setup();
        let mut con = connect_async(&proxy).await;
        let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
        assert_eq!(pong, "PONG");
        drop(proxy);
        assert!(redis::cmd("PING")
            .query_async::<String>(&mut con)
            .await
            .is_err());
    }

    #[test]
    fn proxy_resp_framing() {
        use RespFrame::*;
        assert_eq!(resp_message_len(b"+OK\r\n+OK\r\n"), Complete(5));
        assert_eq!(resp_message_len(b"$1\r\nv\r\n:1\r\n"), Complete(7));
        assert_eq!(resp_message_len(b"$-1\r\n"), Complete(5));
        assert_eq!(resp_message_len(b"*-1\r\n"), Complete(5));
        assert_eq!(resp_message_len(b"*0\r\n"), Complete(4));
        assert_eq!(
            resp_message_len(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n+x"),
            Complete(19)
        );
        assert_eq!(resp_message_len(b"%1\r\n+k\r\n+v\r\n"), Complete(12));
        assert_eq!(resp_message_len(b"|1\r\n+a\r\n+b\r\n:1\r\n"), Complete(16));
        assert_eq!(resp_message_len(b">2\r\n+m\r\n_\r\n"), Complete(11));
        assert_eq!(resp_message_len(b""), Incomplete);
        assert_eq!(resp_message_len(b"+OK\r"), Incomplete);
        assert_eq!(resp_message_len(b"$5\r\nab"), Incomplete);
        assert_eq!(resp_message_len(b"$5\r\nabcde\r"), Incomplete);
        assert_eq!(resp_message_len(b"*2\r\n:1\r\n"), Incomplete);
        assert_eq!(resp_message_len(b"PING\r\n"), Invalid);
        assert_eq!(resp_message_len(b"$1\r\nab\r\n"), Invalid);
        assert_eq!(resp_message_len(b"$x\r\n"), Invalid);
        assert_eq!(resp_message_len(b"*-2\r\n"), Invalid);
        assert_eq!(resp_message_len(b"\r\n"), Invalid);
    }
}
