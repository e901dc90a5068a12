//! One multiplexed RESP3 connection to one server, replaced once per lost connection: a server
//! at a fixed address, or the primary of a Sentinel group, followed across failovers.
//!
//! Written here rather than taken from redis-rs: its `ConnectionManager` (1.8) reconnects twice
//! for one loss. A request that fails on the lost connection starts a reconnect, and so does
//! the lost connection's `Disconnection` push when the manager reads it; the second replaces
//! whatever connection is current by then, which may be the fresh one the first made. Requests
//! sent meanwhile wait for a third connection's set-up (its tries' connection timeouts, not the
//! response timeout), and when the server became unreachable in between they outlast their
//! retry window. Here every connection has a generation, and a loss is acted on only when the
//! connection that reports it (by a failed request or by its push) is still the current one.
//! And a request waits for a connect in progress no longer than for a reply, so that no
//! attempt of an operation runs past its retry window by a reconnect's whole set-up.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, Pipeline, PushInfo, PushKind, RedisError, RedisFuture, RedisResult,
    Value,
};
use tokio::sync::watch;

use super::ack_pool::Node;
use super::push::{push_handler, PushListener};
use super::sentinel::Sentinels;
use crate::base::config::ClientConfig;
use crate::base::error::{Error, ErrorClass};
use crate::base::retry::{backoff, retry};

/// Tries to connect per reconnect: the first and three more, about 0.7 to 1.6 s of pauses
/// between them, before the requests waiting for it fail (the next request starts over).
const CONNECT_TRIES: usize = 4;
/// The pauses between those tries: from 100 ms, doubling, at most 500 ms (with jitter).
const FIRST_CONNECT_PAUSE: Duration = Duration::from_millis(100);
const MAX_CONNECT_PAUSE: Duration = Duration::from_millis(500);

/// A self-reconnecting connection to one server. Clones share the connection.
///
/// A request waits for the current connection (starting its connect if no one has) at most one
/// response timeout. A request that fails in a way that leaves the connection unusable, a
/// failed connect, or the connection's own `Disconnection` push starts one reconnect, unless
/// another one already replaced that connection. A new connection subscribes to every
/// channel subscribed through this one before any request can use it, so a waiter that the
/// loss sent back to Redis cannot miss a release published after its look.
///
/// Under Sentinel a reconnect still goes back to the address it was given: redis-rs asks the
/// Sentinels for the primary only when it connects, and after a failover the connection would
/// keep knocking on a dead server, or write to a demoted one and get `READONLY`. So every
/// request that fails with a connection error or `READONLY` makes it ask the Sentinels again
/// ([`ReconnectingConn::follow_failover`]); when they name another (verified) primary, a
/// connection to it replaces the current one, and the listener subscribes the waiters' channels
/// on it and sends every waiting head back to Redis (a release may have been published while we
/// were away). The failed request is returned as failed: the caller re-sends it with its
/// operation id, now to the new primary.
#[derive(Clone)]
pub(crate) struct ReconnectingConn {
    shared: Arc<Shared>,
}

struct Shared {
    connection_timeout: Duration,
    response_timeout: Duration,
    listener: Weak<dyn PushListener>,
    /// Where the primary is now, under Sentinel; `None` for a server at a fixed address.
    sentinels: Option<Sentinels>,
    current: parking_lot::Mutex<Arc<Generation>>,
    /// The number of the next generation.
    next: AtomicU64,
    /// The channels to subscribe on every new connection.
    channels: parking_lot::Mutex<HashSet<Vec<u8>>>,
}

/// One connection (or the attempt to make it) and its number; a later one replaces it.
struct Generation {
    number: u64,
    /// The server it goes to: the fixed one, or the primary the Sentinels named.
    client: redis::Client,
    /// How many Sentinel failovers were followed before it (a reconnect keeps the count).
    failovers: u64,
    /// Set once, by the task that connects it ([`Shared::connect_in_background`]), or by the
    /// switch to a new primary ([`ReconnectingConn::follow_failover`]); the requests waiting
    /// for it wake up then.
    conn: watch::Sender<Option<RedisResult<MultiplexedConnection>>>,
    /// Whether a task connecting it was started.
    connecting: AtomicBool,
}

impl Generation {
    fn new(
        number: u64,
        client: redis::Client,
        failovers: u64,
        conn: Option<MultiplexedConnection>,
    ) -> Arc<Generation> {
        Arc::new(Generation {
            number,
            client,
            failovers,
            connecting: AtomicBool::new(conn.is_some()),
            conn: watch::Sender::new(conn.map(Ok)),
        })
    }
}

impl ReconnectingConn {
    /// Connects to the server of `client` (under Sentinel, the primary that `sentinels` named),
    /// whose pushes go to `listener`. A failure to connect names the server's address.
    pub(crate) async fn connect(
        client: redis::Client,
        sentinels: Option<Sentinels>,
        config: &ClientConfig,
        listener: Weak<dyn PushListener>,
    ) -> Result<ReconnectingConn, Error> {
        let addr = client.get_connection_info().addr().to_string();
        let conn = ReconnectingConn {
            shared: Arc::new(Shared {
                connection_timeout: config.connection_timeout,
                response_timeout: config.response_timeout,
                listener,
                sentinels,
                current: parking_lot::Mutex::new(Generation::new(0, client, 0, None)),
                next: AtomicU64::new(1),
                channels: parking_lot::Mutex::new(HashSet::new()),
            }),
        };
        // The first connect takes all its tries: nothing is retried around it.
        let first = conn.current();
        conn.connection(&first, None)
            .await
            .map_err(|err| Error::connecting(addr, err))?;
        Ok(conn)
    }

    fn current(&self) -> Arc<Generation> {
        self.shared.current.lock().clone()
    }

    /// The connection of `generation`, once connected, waiting at most `limit` for a connect in
    /// progress.
    ///
    /// A request waits for a reconnect no longer than for a reply (the response timeout), and
    /// fails as a timed-out request would: a reconnect takes up to its tries' connection
    /// timeouts and pauses (about 5 s by default), and a request blocked for that long inside
    /// one attempt would outlast the retry window of the operation that sent it, which checks
    /// its window only between attempts. The connect goes on in its task; the operation's
    /// next attempt waits for it again, while its window is open.
    async fn connection(
        &self,
        generation: &Arc<Generation>,
        limit: Option<Duration>,
    ) -> RedisResult<MultiplexedConnection> {
        // Connected already (nearly every request): one look, no subscription and no timer.
        let connected = generation.conn.borrow().clone();
        let outcome = match connected {
            Some(outcome) => outcome,
            None => {
                self.shared.connect_in_background(generation);
                let mut conn = generation.conn.subscribe();
                // Looks at the value first: one set since the look above ends it at once.
                let connected = conn.wait_for(Option::is_some);
                // The generation keeps the sender: the wait ends only once the outcome is set.
                let set = match limit {
                    None => Ok(connected.await),
                    Some(limit) => tokio::time::timeout(limit, connected).await,
                }
                .map_err(|_| not_connected_in_time())?;
                set.ok().and_then(|set| set.clone()).expect("set above")
            }
        };
        outcome.inspect_err(|_| {
            // The next request tries again, on a new generation.
            self.shared.lost(generation.number);
        })
    }

    /// Runs `request` on the current connection, waiting for a connect in progress at most one
    /// response timeout, and reconnects when its outcome says the connection is gone, or can
    /// no longer be trusted to answer; then, when `moved` says of the outcome that the primary
    /// may have moved, follows a failover.
    ///
    /// A response timeout counts as such: redis-rs keeps the connection after one (it is not an
    /// "unrecoverable" error there), but a connection that stopped answering without an error
    /// is what a half-open TCP connection looks like (a server host that vanished, a firewall
    /// or NAT that dropped the connection's state): every later request would time out too,
    /// for as long as the operating system takes to notice (many minutes with default TCP
    /// retransmission), while a new connection may reach the server, or its replacement, at
    /// once. Replacing the connection after a timeout costs one connection set-up when the
    /// server was merely slow; the request that timed out is re-sent with its operation id,
    /// so it applies at most once either way.
    async fn request<T, Fut>(
        &self,
        request: impl FnOnce(MultiplexedConnection) -> Fut,
        moved: impl FnOnce(&RedisResult<T>) -> bool,
    ) -> RedisResult<T>
    where
        Fut: Future<Output = RedisResult<T>>,
    {
        let generation = self.current();
        let outcome = async {
            let limit = Some(self.shared.response_timeout);
            let outcome = request(self.connection(&generation, limit).await?).await;
            if let Err(err) = &outcome {
                if err.is_unrecoverable_error() || err.is_timeout() {
                    self.shared.lost(generation.number);
                }
            }
            outcome
        }
        .await;
        if moved(&outcome) {
            self.follow_failover(generation.failovers);
        }
        outcome
    }

    /// Subscribes to `channel`, now and on every later connection.
    pub(crate) async fn subscribe(&self, channel: &[u8]) -> RedisResult<()> {
        // Recorded before it is sent: a reconnect that reads the set after this sends it too.
        self.shared.channels.lock().insert(channel.to_vec());
        let outcome = self
            .request(
                |mut conn| async move { conn.subscribe(channel).await },
                never_moved,
            )
            .await;
        if outcome.as_ref().is_err_and(refused) {
            // Refused by the server (an ACL): later connections do not ask again.
            self.shared.channels.lock().remove(channel);
        }
        outcome
    }

    /// Unsubscribes from `channel`, now and on later connections.
    pub(crate) async fn unsubscribe(&self, channel: &[u8]) -> RedisResult<()> {
        self.shared.channels.lock().remove(channel);
        self.request(
            |mut conn| async move { conn.unsubscribe(channel).await },
            never_moved,
        )
        .await
    }

    /// The server of the moment, for more connections to it (replica acknowledgement's):
    /// stamped with how many failovers were followed to it.
    pub(crate) fn primary(&self) -> Node {
        let current = self.current();
        Node {
            key: current.client.get_connection_info().addr().to_string(),
            client: current.client.clone(),
            stamp: current.failovers,
        }
    }

    /// Under Sentinel, after a request on a connection to the primary reached after `failovers`
    /// failovers failed in a way that says the primary may have moved: asks the Sentinels and
    /// switches to the primary they name, if it is another one, in a task of its own (its
    /// handle, for tests). Re-resolutions run one at a time: while one runs, this does nothing;
    /// one that finds the switch made meanwhile does nothing either.
    ///
    /// Not awaited by the request: a lookup (the Sentinels' answer, the role check of the
    /// primary they name, a connect) takes a second or more while the old primary is frozen or
    /// gone, and requests that waited for it, each queued behind the others' lookups, outlasted
    /// their retry windows by as much. The request goes on with its own re-sends, within its
    /// window, and they reach the new primary once the switch is made.
    pub(crate) fn follow_failover(&self, failovers: u64) -> Option<tokio::task::JoinHandle<()>> {
        let sentinels = self.shared.sentinels.as_ref()?;
        let switching = Arc::clone(&sentinels.switching).try_lock_owned().ok()?;
        tokio::runtime::Handle::try_current().ok()?;
        let conn = self.clone();
        Some(tokio::spawn(async move {
            let _switching = switching;
            conn.switch_primary(failovers).await;
        }))
    }

    /// The lookup of [`ReconnectingConn::follow_failover`], one at a time.
    async fn switch_primary(&self, failovers: u64) {
        let Some(sentinels) = &self.shared.sentinels else {
            return;
        };
        let current = self.current();
        if current.failovers != failovers {
            return; // someone else switched meanwhile
        }
        let Some(listener) = self.shared.listener.upgrade() else {
            return;
        };
        let client = match sentinels.primary().await {
            Ok(client) => client,
            Err(err) => {
                // Mid-failover the Sentinels may still name the dead primary, which fails
                // the role check: the next failed request asks again.
                tracing::debug!(error = %err, "no verified primary from the Sentinels yet");
                return;
            }
        };
        let addr = client.get_connection_info().addr().clone();
        if addr == *current.client.get_connection_info().addr() {
            return;
        }
        // Not subscribed here: the listener subscribes every channel with waiters on it.
        let number = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let conn = match self.shared.connect(&client, number).await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::debug!(error = %err, primary = %addr, "connecting to the new primary failed");
                return;
            }
        };
        tracing::info!(primary = %addr, "following the Sentinels to a new primary");
        *self.shared.current.lock() = Generation::new(number, client, failovers + 1, Some(conn));
        // The listener subscribes its channels on the new connection in a task of its own:
        // the request that noticed the failover may be dropped by its caller.
        listener.on_new_primary();
    }

    /// The generation of the current connection (tests).
    #[cfg(test)]
    pub(crate) fn generation(&self) -> u64 {
        self.current().number
    }

    /// What the connection of `generation` does with a push (tests: a push delivered late).
    #[cfg(test)]
    pub(crate) fn deliver_push(&self, generation: u64, push: PushInfo) {
        let _ = self.shared.push_sender(generation)(push);
    }
}

impl Shared {
    /// The connection of `generation` is gone: start its replacement, to the same server,
    /// unless it was replaced already (a stale report of a loss that was handled).
    fn lost(self: &Arc<Self>, generation: u64) {
        let next = {
            let mut current = self.current.lock();
            if current.number != generation {
                return;
            }
            let number = self.next.fetch_add(1, Ordering::Relaxed);
            *current = Generation::new(number, current.client.clone(), current.failovers, None);
            current.clone()
        };
        tracing::debug!(generation = next.number, "reconnecting");
        // Told here, once per loss, whatever reported it: a release published until the new
        // connection has subscribed is lost for good, so every waiting head goes back to Redis
        // (its attempt runs on the new connection, subscribed first). redis-rs pushes
        // `Disconnection` only for a stream that failed, never for a connection dropped after
        // a request timed out (a half-open connection).
        if let Some(listener) = self.listener.upgrade() {
            listener.on_disconnect();
        }
        // Connected in a task of its own, as the connection manager did: the channels are
        // subscribed again even when no request comes, so waiters keep hearing releases.
        // (Outside a runtime the next request starts it.)
        if tokio::runtime::Handle::try_current().is_ok() {
            self.connect_in_background(&next);
        }
    }

    /// Starts the task that connects `generation`, unless one was started. Only that task
    /// connects: a request waiting for it may give up (its limit, or a drop) without
    /// abandoning a connect halfway.
    fn connect_in_background(self: &Arc<Self>, generation: &Arc<Generation>) {
        if generation.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let (shared, generation) = (Arc::clone(self), Arc::clone(generation));
        tokio::spawn(async move {
            let outcome = shared.establish(&generation).await;
            generation.conn.send_replace(Some(outcome));
        });
    }

    /// Connects the connection of `generation` and subscribes it to every recorded channel
    /// before anyone can send on it.
    async fn establish(
        self: &Arc<Self>,
        generation: &Generation,
    ) -> RedisResult<MultiplexedConnection> {
        let mut conn = self.connect(&generation.client, generation.number).await?;
        let channels: Vec<Vec<u8>> = self.channels.lock().iter().cloned().collect();
        if channels.is_empty() {
            return Ok(conn);
        }
        match conn.subscribe(&channels).await {
            Ok(()) => {}
            Err(err) if !refused(&err) => return Err(err),
            // One refused channel (an ACL changed meanwhile) refuses the whole command: the
            // others are subscribed one by one, and the refused ones left to their waiters'
            // lease timers.
            Err(_) => {
                for channel in channels {
                    match conn.subscribe(&channel).await {
                        Ok(()) => {}
                        Err(err) if refused(&err) => {
                            tracing::warn!(error = %err, "subscribing again after a reconnect was refused");
                            self.channels.lock().remove(&channel);
                        }
                        Err(err) => return Err(err),
                    }
                }
            }
        }
        Ok(conn)
    }

    /// Connects to the server of `client` for the generation `number` (a few tries, with
    /// pauses).
    async fn connect(
        self: &Arc<Self>,
        client: &redis::Client,
        number: u64,
    ) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_push_sender(self.push_sender(number));
        let pauses = backoff(FIRST_CONNECT_PAUSE, MAX_CONNECT_PAUSE).take(CONNECT_TRIES - 1);
        retry(
            pauses,
            || client.get_multiplexed_async_connection_with_config(&config),
            |err| {
                tracing::debug!(error = %err, "connecting failed");
                true
            },
        )
        .await
    }

    /// The push sender of the connection of `generation`: its loss starts a reconnect (if it is
    /// still current), and every other push goes on to the listener.
    fn push_sender(
        self: &Arc<Self>,
        generation: u64,
    ) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync + 'static {
        let forward = push_handler(self.listener.clone());
        let shared = Arc::downgrade(self);
        move |push: PushInfo| {
            if push.kind != PushKind::Disconnection {
                return forward(push);
            }
            // Not forwarded: `lost` tells the listener, unless the loss was handled already.
            let shared = shared.upgrade().ok_or(())?;
            shared.lost(generation);
            Ok(())
        }
    }
}

/// The error of a request that found its connection being made and gave up waiting: a
/// timeout, as for a request whose reply did not come, so the operation re-sends it while its
/// retry window is open.
fn not_connected_in_time() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no connection within the response timeout: the connection is being made again",
    ))
}

/// Whether the server answered `err` itself (an ACL refusal, say), which asking again on
/// another connection would not change.
fn refused(err: &RedisError) -> bool {
    err.code().is_some()
}

/// A subscription that fails does not ask the Sentinels where the primary is: the waiters'
/// next script does.
fn never_moved(_: &RedisResult<()>) -> bool {
    false
}

/// Whether the outcome of a command says that the primary may have moved: its error, or an
/// error among its replies (`READONLY` from inside a script arrives as a value).
fn primary_moved(outcome: Result<&[Value], &RedisError>) -> bool {
    match outcome {
        Err(err) => ErrorClass::of(err).primary_may_have_moved(),
        Ok(replies) => replies.iter().any(|reply| {
            matches!(reply, Value::ServerError(err)
                if ErrorClass::of_code(err.code()).primary_may_have_moved())
        }),
    }
}

impl ConnectionLike for ReconnectingConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.request(
            move |mut conn| async move { conn.req_packed_command(cmd).await },
            |outcome| primary_moved(outcome.as_ref().map(std::slice::from_ref)),
        ))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.request(
            move |mut conn| async move { conn.req_packed_commands(pipeline, offset, count).await },
            |outcome| primary_moved(outcome.as_ref().map(Vec::as_slice)),
        ))
    }

    fn get_db(&self) -> i64 {
        let current = self.current();
        current.client.get_connection_info().redis_settings().db()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fencelock_testing::RedisServer;

    use super::*;

    /// Records what the connection was told without asking.
    #[derive(Default)]
    struct Heard {
        messages: parking_lot::Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
        disconnects: std::sync::atomic::AtomicUsize,
    }

    impl PushListener for Heard {
        fn on_message(&self, channel: &[u8], payload: &[u8]) {
            self.messages
                .lock()
                .push((channel.to_vec(), payload.to_vec()));
        }
        fn on_disconnect(&self) {
            self.disconnects
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn on_subscription_lost(self: Arc<Self>, _channel: &[u8]) {}
        fn on_new_primary(self: Arc<Self>) {}
    }

    /// A server, what its connection hears, the connection, and a plain connection of the
    /// test's own, to look and to kill.
    async fn setup() -> (
        RedisServer,
        Arc<Heard>,
        ReconnectingConn,
        MultiplexedConnection,
    ) {
        let server = RedisServer::start().expect("start redis-server");
        let heard = Arc::new(Heard::default());
        let listener: Arc<dyn PushListener> = heard.clone();
        let conn = super::super::standalone::connect(
            &server.url(),
            &ClientConfig::default(),
            Arc::downgrade(&listener),
        )
        .await
        .expect("connect");
        let raw = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        (server, heard, conn, raw)
    }

    async fn client_id(conn: &mut impl ConnectionLike) -> RedisResult<u64> {
        redis::cmd("CLIENT").arg("ID").query_async(conn).await
    }

    /// Closes the connection `id` from the server's side.
    async fn kill(raw: &mut redis::aio::MultiplexedConnection, id: u64) {
        let _: () = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(raw)
            .await
            .unwrap();
    }

    /// How many connections receive a message published on `channel`, once it is one (or
    /// after 2 s). Every message says "released".
    async fn subscribed_eventually(
        raw: &mut redis::aio::MultiplexedConnection,
        channel: &str,
    ) -> u64 {
        let mut receivers = 0;
        for _ in 0..200 {
            receivers = redis::cmd("PUBLISH")
                .arg(channel)
                .arg("released")
                .query_async(raw)
                .await
                .unwrap();
            if receivers == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        receivers
    }

    /// Connections the server has accepted so far.
    async fn accepted(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
        let info: redis::InfoDict = redis::cmd("INFO")
            .arg("stats")
            .query_async(raw)
            .await
            .unwrap();
        info.get("total_connections_received").unwrap()
    }

    /// The connection's client id, once a request on it succeeds again (at most 100 tries,
    /// `pause` apart).
    async fn client_id_once_back(conn: &mut ReconnectingConn, pause: Duration) -> Option<u64> {
        for _ in 0..100 {
            if let Ok(id) = client_id(conn).await {
                return Some(id);
            }
            tokio::time::sleep(pause).await;
        }
        None
    }

    /// Waits until `done` says so, at most 1 s.
    async fn until(done: impl Fn() -> bool) {
        for _ in 0..100 {
            if done() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A killed connection is replaced once, however its loss is reported: the request that
    /// failed on it and its own `Disconnection` push both say so, and only the first acts.
    #[tokio::test]
    async fn a_killed_connection_is_replaced_once() {
        let (_server, heard, mut conn, mut raw) = setup().await;
        let first = client_id(&mut conn).await.unwrap();
        let before = accepted(&mut raw).await;
        kill(&mut raw, first).await;
        // Requests right after the kill: the first may fail on the dead connection.
        let second = client_id_once_back(&mut conn, Duration::from_millis(10))
            .await
            .expect("the connection came back");
        assert_ne!(second, first);
        // Both reports have arrived by the time the push reached the listener.
        until(|| heard.disconnects.load(std::sync::atomic::Ordering::SeqCst) > 0).await;
        assert_eq!(
            heard.disconnects.load(std::sync::atomic::Ordering::SeqCst),
            1
        );
        assert_eq!(conn.generation(), 1);
        assert_eq!(client_id(&mut conn).await.unwrap(), second);
        // The test's own INFO call is not a connection; the replacement is the only one.
        assert_eq!(accepted(&mut raw).await - before, 1);
    }

    /// A connection that stops answering without an error (here the server pauses every
    /// client for longer than the response timeout; a half-open connection looks the same) is
    /// replaced by the request that timed out, and the next request goes on a new connection.
    #[tokio::test]
    async fn a_connection_that_stops_answering_is_replaced() {
        let (_server, heard, mut conn, mut raw) = setup().await;
        let first = client_id(&mut conn).await.unwrap();
        let timeout = ClientConfig::default().response_timeout;
        let pause = timeout * 2;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(u64::try_from(pause.as_millis()).unwrap())
            .query_async(&mut raw)
            .await
            .unwrap();
        let err = client_id(&mut conn).await.unwrap_err();
        assert!(err.is_timeout(), "{err:?}");
        assert_eq!(
            conn.generation(),
            1,
            "the request that timed out replaced it"
        );
        // Waiters hear of the loss although no `Disconnection` push comes for it: a release
        // published before the new connection subscribes is lost.
        assert_eq!(
            heard.disconnects.load(std::sync::atomic::Ordering::SeqCst),
            1
        );
        // Once the pause is over, requests go on the new connection.
        let second = client_id_once_back(&mut conn, Duration::from_millis(20))
            .await
            .expect("the connection came back");
        assert_ne!(second, first);
    }

    /// The push of a connection that was already replaced (read late, after a failed request
    /// made the replacement) leaves the fresh connection alone; the push of the current one
    /// replaces it.
    #[tokio::test]
    async fn a_late_loss_report_of_a_replaced_connection_keeps_the_fresh_one() {
        let (_server, _, mut conn, _) = setup().await;
        let disconnection = || PushInfo {
            kind: PushKind::Disconnection,
            data: vec![],
        };
        let first = client_id(&mut conn).await.unwrap();
        // As a request that failed on generation 0 would.
        conn.shared.lost(0);
        let fresh = client_id(&mut conn).await.unwrap();
        assert_ne!(fresh, first);
        assert_eq!(conn.generation(), 1);
        // Generation 0's own push, late.
        conn.deliver_push(0, disconnection());
        assert_eq!(conn.generation(), 1);
        assert_eq!(client_id(&mut conn).await.unwrap(), fresh);
        // A loss of the current connection is acted on.
        conn.deliver_push(1, disconnection());
        assert_eq!(conn.generation(), 2);
        assert_ne!(client_id(&mut conn).await.unwrap(), fresh);
    }

    /// A new connection is subscribed to every channel before anyone uses it, and without a
    /// request to bring it: a release published after a reconnect reaches the listener; a
    /// channel unsubscribed is not subscribed again.
    #[tokio::test]
    async fn a_new_connection_carries_the_subscriptions_without_being_asked() {
        let (_server, heard, mut conn, mut raw) = setup().await;
        conn.subscribe(b"kept").await.unwrap();
        conn.subscribe(b"dropped").await.unwrap();
        conn.unsubscribe(b"dropped").await.unwrap();
        let first = client_id(&mut conn).await.unwrap();
        kill(&mut raw, first).await;
        // No request through `conn`: the push alone brings the new connection.
        let receivers = subscribed_eventually(&mut raw, "kept").await;
        assert_eq!(receivers, 1, "the new connection never subscribed");
        let dropped: u64 = redis::cmd("PUBLISH")
            .arg("dropped")
            .arg("released")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(dropped, 0);
        until(|| !heard.messages.lock().is_empty()).await;
        assert_eq!(
            heard.messages.lock().first(),
            Some(&(b"kept".to_vec(), b"released".to_vec()))
        );
        assert_eq!(conn.generation(), 1);
    }

    /// While the server is gone, each request fails after the tries of one reconnect, and the
    /// next request starts another: once the server is back, the connection is too.
    #[tokio::test]
    async fn requests_bring_the_connection_back_after_the_server_was_gone() {
        let (mut server, _, mut conn, _) = setup().await;
        server.stop().expect("stop redis-server");
        assert!(client_id(&mut conn).await.is_err());
        server.restart().expect("restart redis-server");
        let back = client_id_once_back(&mut conn, Duration::from_millis(50)).await;
        assert!(back.is_some(), "the connection did not come back");
    }

    /// A channel the server refuses (an ACL) is not asked for again on a new connection, and
    /// does not keep the others from being subscribed there.
    #[tokio::test]
    async fn a_refused_channel_does_not_keep_the_others_from_a_new_connection() {
        let server = RedisServer::start().expect("start redis-server");
        let client = redis::Client::open(server.url()).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("waiter")
            .arg("on")
            .arg(">secret")
            .arg("~*")
            .arg("resetchannels")
            .arg("&allowed*")
            .arg("+@all")
            .query_async(&mut raw)
            .await
            .unwrap();
        let listener: Arc<dyn PushListener> = Arc::new(Heard::default());
        let url = format!("redis://waiter:secret@127.0.0.1:{}/", server.port());
        let conn = super::super::standalone::connect(
            &url,
            &ClientConfig::default(),
            Arc::downgrade(&listener),
        )
        .await
        .expect("connect");
        let mut conn = conn;
        conn.subscribe(b"allowed").await.unwrap();
        let err = conn.subscribe(b"refused").await.unwrap_err();
        assert_eq!(err.code(), Some("NOPERM"), "{err}");
        assert_eq!(conn.shared.channels.lock().len(), 1);
        // Refused later too: the ACL changes while the channel is recorded.
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("waiter")
            .arg("&later*")
            .query_async(&mut raw)
            .await
            .unwrap();
        conn.subscribe(b"later").await.unwrap();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("waiter")
            .arg("resetchannels")
            .arg("&allowed*")
            .query_async(&mut raw)
            .await
            .unwrap();
        let first = client_id(&mut conn).await.unwrap();
        kill(&mut raw, first).await;
        let receivers = subscribed_eventually(&mut raw, "allowed").await;
        assert_eq!(receivers, 1, "the allowed channel was not subscribed again");
        assert_eq!(conn.shared.channels.lock().len(), 1);
    }
}
