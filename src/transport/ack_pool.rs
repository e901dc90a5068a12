//! Replica acknowledgement: acquisitions that return only once `WAIT` confirmed that N replicas
//! have them.
//!
//! `WAIT` blocks the connection it runs on until enough replicas acknowledged or its timeout
//! passed, and it counts the writes *of that connection*. The client's shared connection
//! multiplexes every lock, waiter and watchdog renewal, so a `WAIT` there would stall all of
//! them for the timeout whenever a replica is slow; and a `WAIT` on any other connection would
//! not cover the acquisition. So a replicated acquisition runs its script and its `WAIT`
//! back-to-back on a connection of its own, taken exclusively from a small pool that is only
//! used for this (see [`AckConnections`]), to the primary that holds the lock: the server, the
//! primary the Sentinels name now, or the cluster node that owns the lock's slot ([`AckRoute`]).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, ServerErrorKind};
use tokio::sync::Semaphore;

use super::reconnecting::ReconnectingConn;
use super::slot_map::ClusterRoute;
use crate::base::config::ClientConfig;
use crate::base::error::{Error, ErrorClass};
use crate::base::replica_ack::{Acks, ReplicaAck};
use crate::base::retry::{resend_after, retry, Resends};
use crate::protocol::{self, LockKeys};

/// Most connections one client keeps for replicated acquisitions; more concurrent replicated
/// acquisitions queue for one (each holds its connection for at most one `WAIT`).
const MAX_ACK_CONNECTIONS: usize = 8;

/// Most `MOVED`/`ASK` redirections in a row (without a backed-off re-send in between) one
/// script call follows before its error is returned (a slot map that keeps disagreeing with the
/// nodes is a cluster being reconfigured; the caller may try again later).
const MAX_REDIRECTS: u32 = 16;

/// Where the pool's connections go: the node that must run an acquisition's script and its
/// `WAIT`.
#[allow(clippy::large_enum_variant)] // one per client
pub(crate) enum AckRoute {
    /// The server of the client's own connection: one at a fixed address, or the primary the
    /// Sentinels name now (which that connection re-resolves on our behalf).
    Server(ReconnectingConn),
    /// The primary that owns the lock's slot.
    Cluster(ClusterRoute),
}

impl AckRoute {
    /// The node that must execute a script on `slot` now: its primary, or the node an `ASK`
    /// redirection named (cluster only).
    async fn node(&self, slot: u16, asked: Option<String>) -> Result<Node, Error> {
        match (self, asked) {
            (AckRoute::Server(conn), None) => Ok(conn.primary()),
            (AckRoute::Cluster(cluster), None) => cluster.owner(slot).await,
            (AckRoute::Cluster(cluster), Some(addr)) => cluster.node(addr, 0),
            (AckRoute::Server(_), Some(addr)) => Err(Error::Protocol(format!(
                "an ASK redirection to {addr} outside a cluster"
            ))),
        }
    }

    /// A `MOVED` reply named `addr` as `slot`'s primary.
    fn moved(&self, slot: u16, addr: &str) {
        if let AckRoute::Cluster(cluster) = self {
            cluster.moved(slot, addr);
        }
    }

    /// The view `stamp` is stale (the primary may have moved): ask the Sentinels or the
    /// cluster again. Idle connections to a former primary are closed when the pool next opens
    /// one ([`AckConnections::open`]).
    async fn reroute(&self, stamp: u64) {
        match self {
            AckRoute::Server(conn) => {
                conn.follow_failover(stamp);
            }
            AckRoute::Cluster(cluster) => {
                if let Err(err) = cluster.refresh(stamp).await {
                    tracing::debug!(error = %err, "replica acknowledgement: slot map refresh failed");
                }
            }
        }
    }

    /// Whether the node `key` is a primary now.
    fn is_primary(&self, key: &str) -> bool {
        match self {
            AckRoute::Server(conn) => conn.primary().key == key,
            AckRoute::Cluster(cluster) => cluster.is_primary(key),
        }
    }
}

/// A node the pool can connect to. `key` names it in the pool (its address), `stamp` is the
/// view of the topology it came from (the Sentinel failovers followed, a slot-map epoch),
/// handed back when a request says that view is stale so that only one refresh runs per stale
/// view.
pub(crate) struct Node {
    pub(crate) key: String,
    pub(crate) client: redis::Client,
    pub(crate) stamp: u64,
}

/// The connections reserved for replicated acquisitions, per node. Each acquisition (or
/// multi-lock set) takes a [`AckSession`]: one permit of [`MAX_ACK_CONNECTIONS`] and, per node
/// it writes to, one connection exclusively, so a `WAIT` never blocks anyone else's request.
/// A session holds at most one connection per node, so no node ever has more than
/// [`MAX_ACK_CONNECTIONS`] of them, and a set never waits for a second permit while holding one.
pub(crate) struct AckConnections {
    route: AckRoute,
    config: ClientConfig,
    idle: Mutex<HashMap<String, Vec<MultiplexedConnection>>>,
    permits: Semaphore,
}

impl AckConnections {
    pub(crate) fn new(route: AckRoute, config: &ClientConfig) -> AckConnections {
        AckConnections {
            route,
            config: config.clone(),
            idle: Mutex::new(HashMap::new()),
            permits: Semaphore::new(MAX_ACK_CONNECTIONS),
        }
    }

    /// How many connections of the pool are open and idle, over every node (for tests and
    /// diagnostics).
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().values().map(Vec::len).sum()
    }

    /// Starts one replicated acquisition (waits for a permit when [`MAX_ACK_CONNECTIONS`] are
    /// in flight).
    pub(crate) async fn session(&self) -> Result<AckSession<'_>, Error> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| Error::Protocol("replica acknowledgement pool closed".into()))?;
        Ok(AckSession {
            pool: self,
            _permit: permit,
            held: Vec::new(),
            poisoned: false,
        })
    }

    /// A connection to `node`: an idle one, or a new one. Idle connections to nodes that are
    /// no longer primaries are closed first: they would write to a demoted node (READONLY)
    /// or, worse, WAIT on one that is a replica now.
    async fn open(&self, node: &Node) -> Result<MultiplexedConnection, Error> {
        let idle = {
            let mut idle = self.idle.lock();
            idle.retain(|node, _| self.route.is_primary(node));
            idle.get_mut(&node.key).and_then(Vec::pop)
        };
        if let Some(conn) = idle {
            return Ok(conn);
        }
        // No response timeout of redis-rs' own: a WAIT legitimately takes as long as its
        // timeout, so every request here is bounded by the caller instead.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.connection_timeout))
            .set_response_timeout(None);
        Ok(node
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    fn give_back(&self, key: String, conn: MultiplexedConnection) {
        // A connection to a node that is no longer a primary (a session redirected away from
        // it, or one that outlived a failover) is closed, not kept for later.
        if !self.route.is_primary(&key) {
            return;
        }
        let mut idle = self.idle.lock();
        let list = idle.entry(key).or_default();
        if list.len() < MAX_ACK_CONNECTIONS {
            list.push(conn);
        }
    }
}

/// One replicated acquisition (a lock, or a whole multi-lock set) in flight: its permit and,
/// per node it wrote to, the connection that ran its scripts, on which `WAIT` must run.
///
/// Dropped without [`AckSession::finish`] (an error, a cancelled future that may have left a
/// `WAIT` running on the server) every connection is closed instead of reused.
pub(crate) struct AckSession<'a> {
    pool: &'a AckConnections,
    _permit: tokio::sync::SemaphorePermit<'a>,
    held: Vec<Held>,
    /// A `WAIT` task ended abnormally: no connection of this session is reused.
    poisoned: bool,
}

#[derive(Default)]
struct Held {
    key: String,
    /// Dropped (closed) after any failure on it; a later script to the node opens another.
    conn: Option<MultiplexedConnection>,
    /// A script that acquired ran on this node in this session.
    wrote: bool,
    /// A fence counter on this node, when `conn` may not have made the node's latest write of
    /// this session: the last acquisition here was confirmed by a re-send (a replay writes
    /// nothing), or `conn` replaced a lost connection that made earlier writes. `WAIT` counts
    /// the writes of its own connection, so one write of ours must come first (see
    /// [`AckSession::wait`]). `None` when the last acquisition here wrote on `conn` itself.
    bump: Option<Vec<u8>>,
}

impl AckSession<'_> {
    /// This session's connection to `node`, opened (or taken from the pool) if needed. `fence`
    /// is a key of a slot the node owns, for [`Held::bump`].
    async fn connection(&mut self, node: &Node, fence: &[u8]) -> Result<&mut Held, Error> {
        let index = self.held.iter().position(|h| h.key == node.key);
        let index = index.unwrap_or_else(|| {
            let key = node.key.clone();
            self.held.push(Held {
                key,
                ..Held::default()
            });
            self.held.len() - 1
        });
        let held = &mut self.held[index];
        if held.conn.is_none() {
            held.conn = Some(self.pool.open(node).await?);
            if held.wrote && held.bump.is_none() {
                // The node's earlier writes were made on a connection that is gone; unless a
                // later script writes on this one, a write of ours must precede the WAIT.
                held.bump = Some(fence.to_vec());
            }
        }
        Ok(held)
    }

    /// Runs one acquisition script for the lock of `keys` on this session's connection to the
    /// node that owns its slot, and records the write when `acquired(reply)`.
    ///
    /// Follows `MOVED` (the map learns the new owner) and `ASK` (`ASKING` then the script at the
    /// importing node), at most [`MAX_REDIRECTS`] times. A transient failure re-sends the script
    /// (same ids, so a replay) within `window` (the retry window, or a waiting acquirer's:
    /// [`waiting_window`](crate::base::retry::waiting_window)), after asking the Sentinels or
    /// the cluster where the primary is now when the failure says it may have moved (connection
    /// errors, `READONLY`, `MASTERDOWN`, `CLUSTERDOWN`). After a failure that leaves the
    /// outcome unknown (a timeout or a lost connection after the script was sent), the write
    /// may have been made on the lost connection and the re-send may be a replay that writes
    /// nothing: the node is marked for a write of ours before its `WAIT` ([`Held::bump`]).
    /// Redirections, refusals and a replica's `READONLY` are definite "not run".
    pub(crate) async fn run<R, F, Fut>(
        &mut self,
        keys: &LockKeys,
        window: Duration,
        attempt: F,
        acquired: impl Fn(&R) -> bool,
    ) -> Result<R, Error>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<R, Error>>,
    {
        let again = |err: &Error| resend_after(err, "re-sending a replicated acquisition");
        // The sends share the session (and `attempt`, and whether one was re-sent) through a
        // lock that each holds for its whole run: one send at a time, as the loop runs them.
        let shared = tokio::sync::Mutex::new((self, attempt, false));
        let (shared, acquired) = (&shared, &acquired);
        let send = || async move {
            let (session, attempt, resent) = &mut *shared.lock().await;
            session.send(keys, attempt, acquired, resent).await
        };
        retry(Resends::new(window), send, again).await
    }

    /// One send of [`AckSession::run`]'s script, following its redirections; `resent` is set
    /// when the outcome is unknown, so the next send may be a replay. A failure that says the
    /// primary may have moved makes the pool ask where it is now before it returns.
    async fn send<R, F, Fut>(
        &mut self,
        keys: &LockKeys,
        attempt: &mut F,
        acquired: &impl Fn(&R) -> bool,
        resent: &mut bool,
    ) -> Result<R, Error>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<R, Error>>,
    {
        let pool = self.pool;
        let response_timeout = pool.config.response_timeout;
        let mut redirects = 0;
        let mut ask: Option<String> = None;
        loop {
            let asking = ask.is_some();
            let node = pool.route.node(keys.slot, ask.take()).await?;
            let err = match self.connection(&node, &keys.fence).await {
                Err(err) => err,
                Ok(held) => {
                    let conn = held.conn.clone().expect("opened above");
                    let outcome = async {
                        if asking {
                            let asking = redis::cmd("ASKING");
                            let mut conn = conn.clone();
                            bounded(response_timeout, asking.query_async::<()>(&mut conn))
                                .await
                                .map_err(|err| (err, false))?;
                        }
                        bounded(response_timeout, attempt(conn))
                            .await
                            .map_err(|err| (err, true))
                    }
                    .await;
                    match outcome {
                        Ok(reply) => {
                            if acquired(&reply) {
                                held.wrote = true;
                                // A write on `conn` covers every earlier one of this session on
                                // the node (its offset is higher); a re-send may have written
                                // nothing.
                                held.bump = resent.then(|| keys.fence.clone());
                            }
                            return Ok(reply);
                        }
                        Err((err, sent)) => {
                            if redirect(&err).is_none() {
                                // Closed, not reused: a request may still run on it.
                                held.conn = None;
                                if sent && err.class().is_some_and(ErrorClass::outcome_unknown) {
                                    *resent = true;
                                }
                            }
                            err
                        }
                    }
                }
            };
            // The redirection bound is against a hot loop; a slot migration (ASK, then
            // TRYAGAIN at the importing node) goes on for as long as the retry window allows.
            let Some((is_ask, moved_slot, addr)) = redirect(&err) else {
                if err.class().is_some_and(ErrorClass::primary_may_have_moved) {
                    pool.route.reroute(node.stamp).await;
                }
                return Err(err);
            };
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return Err(err);
            }
            tracing::debug!(%addr, is_ask, "replicated acquisition redirected");
            if is_ask {
                ask = Some(addr);
            } else {
                // A moved slot rarely moves alone (a failover moves a node's every slot):
                // reload the whole map once per stale view, then let the node's own answer
                // win for this slot, in case the node that answered CLUSTER SLOTS lags.
                pool.route.reroute(node.stamp).await;
                pool.route.moved(moved_slot, &addr);
            }
        }
    }

    /// `WAIT`s on every node this session wrote to, concurrently, and returns the fewest
    /// acknowledgements; `None` when nothing was acquired.
    ///
    /// A node whose connection was lost after a write counts 0: no `WAIT` of ours can cover
    /// that write any more. A node marked by a re-send ([`Held::bump`]) first gets
    /// `INCRBY <fence counter> 0`, a write that changes nothing but is replicated: the
    /// re-send's reply showed the lock in the primary's data, so it was written before this
    /// write, and the replication stream is one sequence, so a `WAIT` that covers this write
    /// covers the acquisition too, whichever connection made it.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] when the user may not run `WAIT` (or `INCRBY`): a
    /// configuration problem that must not pass for a slow replica. The acquisition stays
    /// held; the caller's armed pending operation undoes it.
    pub(crate) async fn wait(&mut self, ack: ReplicaAck) -> Result<Option<Acks>, Error> {
        let response_timeout = self.pool.config.response_timeout;
        let limit = response_timeout + ack.timeout;
        let mut fewest: Option<u32> = None;
        let mut waits = tokio::task::JoinSet::new();
        for (index, held) in self.held.iter().enumerate().filter(|(_, h)| h.wrote) {
            let Some(conn) = &held.conn else {
                fewest = Some(0);
                continue;
            };
            let mut conn = conn.clone();
            let bump = held.bump.clone();
            waits.spawn(async move {
                if let Some(fence) = bump {
                    let incr = redis::cmd("INCRBY").arg(fence).arg(0).clone();
                    let write = incr.query_async::<i64>(&mut conn);
                    if let Err(err) = bounded(response_timeout, write).await {
                        return (index, Err(err));
                    }
                }
                let wait = protocol::wait_replicas(&mut conn, ack.replicas, ack.timeout);
                (index, bounded(limit, wait).await)
            });
        }
        let mut refused = None;
        while let Some(done) = waits.join_next().await {
            let acked = match done {
                Ok((_, Ok(acked))) => acked,
                Ok((_, Err(err))) if err.is_permission_denied() => {
                    refused.get_or_insert(err);
                    0
                }
                Ok((index, Err(err))) => {
                    // Closed, not reused: its WAIT may still run.
                    tracing::warn!(error = %err, "WAIT for replicas failed; counting no acknowledgement");
                    self.held[index].conn = None;
                    0
                }
                Err(err) => {
                    tracing::warn!(error = %err, "WAIT task failed; counting no acknowledgement");
                    self.poisoned = true;
                    0
                }
            };
            fewest = Some(fewest.map_or(acked, |f| f.min(acked)));
        }
        if let Some(err) = refused {
            return Err(err);
        }
        Ok(fewest.map(|acked| Acks {
            acked,
            required: ack.replicas,
        }))
    }

    /// Puts the session's healthy connections back in the pool.
    pub(crate) fn finish(mut self) {
        if self.poisoned {
            return;
        }
        for held in self.held.drain(..) {
            if let Some(conn) = held.conn {
                self.pool.give_back(held.key, conn);
            }
        }
    }
}

/// `(ASK?, slot, address)` of a `MOVED` or `ASK` reply.
fn redirect(err: &Error) -> Option<(bool, u16, String)> {
    let Error::Redis(err) = err else {
        return None;
    };
    let is_ask = err.kind() == ErrorKind::Server(ServerErrorKind::Ask);
    let (addr, slot) = err.redirect_node()?;
    Some((is_ask, slot, addr.to_owned()))
}

/// `fut`, or a timeout error (transient, like redis-rs' own response timeout) after `limit`.
async fn bounded<T, E: Into<Error>>(
    limit: Duration,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(outcome) => outcome.map_err(Into::into),
        Err(_) => Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no reply within the response timeout",
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn primary_may_have_moved(err: &Error) -> bool {
        err.class().is_some_and(ErrorClass::primary_may_have_moved)
    }

    fn outcome_unknown(err: &Error) -> bool {
        err.class().is_some_and(ErrorClass::outcome_unknown)
    }

    /// A server's error reply as redis-rs hands it to us.
    fn server_error(reply: &str) -> Error {
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()).unwrap();
        Error::Redis(value.extract_error().unwrap_err())
    }

    fn io_error(kind: std::io::ErrorKind) -> Error {
        Error::Redis(redis::RedisError::from(std::io::Error::new(kind, "cut")))
    }

    #[test]
    fn moved_and_ask_replies_name_the_node_and_slot_to_go_to() {
        assert_eq!(
            redirect(&server_error("MOVED 3999 127.0.0.1:7001")),
            Some((false, 3999, "127.0.0.1:7001".to_owned()))
        );
        assert_eq!(
            redirect(&server_error("ASK 12 127.0.0.1:7002")),
            Some((true, 12, "127.0.0.1:7002".to_owned()))
        );
        assert_eq!(redirect(&server_error("ERR unknown command")), None);
        assert_eq!(redirect(&server_error("READONLY You can't write")), None);
        assert_eq!(redirect(&io_error(std::io::ErrorKind::BrokenPipe)), None);
        assert_eq!(redirect(&Error::not_held(b"x")), None);
    }

    /// Asserts that `says` is `expected` of every one of `errors`.
    fn assert_all(
        says: fn(&Error) -> bool,
        expected: bool,
        errors: impl IntoIterator<Item = Error>,
    ) {
        for err in errors {
            assert_eq!(says(&err), expected, "{err:?}");
        }
    }

    #[test]
    fn lost_connections_and_demoted_or_down_nodes_send_us_looking_for_the_primary() {
        use std::io::ErrorKind::{BrokenPipe, ConnectionRefused, ConnectionReset, Other, TimedOut};
        // `Other` is an I/O error that is neither a timeout, a drop nor a refusal.
        let lost = [
            Other,
            TimedOut,
            BrokenPipe,
            ConnectionReset,
            ConnectionRefused,
        ];
        assert_all(primary_may_have_moved, true, lost.map(io_error));
        let not_primary = [
            "READONLY You can't write against a read only replica.",
            "MASTERDOWN Link with MASTER is down",
            "CLUSTERDOWN The cluster is down",
        ];
        assert_all(primary_may_have_moved, true, not_primary.map(server_error));
        let answered = [
            "ERR unknown command",
            "NOSCRIPT No matching script",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "MOVED 3999 127.0.0.1:7001",
        ];
        let others = [Error::not_held(b"x"), Error::Cancelled];
        assert_all(primary_may_have_moved, false, answered.map(server_error));
        assert_all(primary_may_have_moved, false, others);
    }

    #[test]
    fn only_a_lost_connection_leaves_a_sent_script_s_outcome_unknown() {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset, TimedOut, UnexpectedEof};
        let lost = [TimedOut, BrokenPipe, ConnectionReset, UnexpectedEof];
        assert_all(outcome_unknown, true, lost.map(io_error));
        // A reply, even an error reply, says what happened: the script ran or was refused.
        let answered = [
            "READONLY You can't write against a read only replica.",
            "MOVED 3999 127.0.0.1:7001",
            "NOSCRIPT No matching script",
            "BUSY Redis is busy running a script",
        ];
        assert_all(outcome_unknown, false, answered.map(server_error));
        assert_all(outcome_unknown, false, [Error::not_held(b"x")]);
    }
}
