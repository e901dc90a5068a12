//! Replica acknowledgement: acquisitions that return only once `WAIT` confirmed that N replicas
//! have them.
//!
//! `WAIT` blocks the connection it runs on until enough replicas acknowledged or its timeout
//! passed, and it counts the writes *of that connection*. The client's shared connection
//! multiplexes every lock, waiter and watchdog renewal, so a `WAIT` there would stall all of
//! them for the timeout whenever a replica is slow; and a `WAIT` on any other connection would
//! not cover the acquisition. So a replicated acquisition runs its script and its `WAIT`
//! back-to-back on a connection of its own, taken exclusively from a small pool that is only
//! used for this (see [`AckConnections`]).

use std::future::Future;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::sync::Semaphore;

use crate::{protocol, Error, LockClient};

/// Most connections one client keeps for replicated acquisitions; more concurrent replicated
/// acquisitions queue for one (each holds its connection for at most one `WAIT`).
const MAX_ACK_CONNECTIONS: usize = 8;

/// Longest accepted `WAIT` timeout: a guard that waits longer for replicas than this has
/// probably lost most of its lease already.
const MAX_ACK_TIMEOUT: Duration = Duration::from_secs(60);

/// What an acquisition that required replica acknowledgement does when fewer replicas than
/// required confirmed it within the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnShortfall {
    /// Roll the acquisition back (the lock is free again) and return
    /// [`Error::ReplicationTimeout`]. The default.
    #[default]
    Fail,
    /// Return the guard anyway, marked: [`LockGuard::replicated`](crate::LockGuard::replicated)
    /// is `false` and [`LockGuard::replica_acks`](crate::LockGuard::replica_acks) tells how
    /// many replicas confirmed it. A failover may lose such a lock.
    ReturnUnreplicated,
}

/// Replica acknowledgement required of an acquisition: `replicas` replicas within `timeout`,
/// and what to do when fewer confirm. Set per client with
/// [`LockClientBuilder::replica_ack`](crate::LockClientBuilder::replica_ack), per lock with
/// [`Lock::with_replica_ack`](crate::Lock::with_replica_ack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
    pub(crate) on_shortfall: OnShortfall,
}

impl ReplicaAck {
    /// Checks the numbers: at least one replica (zero would make `WAIT` a no-op that still
    /// costs a round trip), and a timeout of 1 ms..=60 s in whole milliseconds (`WAIT 0`
    /// blocks forever).
    pub(crate) fn new(
        replicas: u32,
        timeout: Duration,
        on_shortfall: OnShortfall,
    ) -> Result<ReplicaAck, Error> {
        if replicas == 0 {
            return Err(Error::InvalidConfig {
                reason: "replica acknowledgement needs at least one replica".into(),
            });
        }
        if timeout < Duration::from_millis(1)
            || timeout > MAX_ACK_TIMEOUT
            || !timeout.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the replica acknowledgement timeout must be 1 ms..={MAX_ACK_TIMEOUT:?} in \
                     whole milliseconds, not {timeout:?}"
                ),
            });
        }
        Ok(ReplicaAck {
            replicas,
            timeout,
            on_shortfall,
        })
    }
}

/// How many replicas confirmed an acquisition, against how many it required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acks {
    pub(crate) acked: u32,
    pub(crate) required: u32,
}

impl Acks {
    pub(crate) fn enough(&self) -> bool {
        self.acked >= self.required
    }
}

/// The pool of connections reserved for replicated acquisitions. Each use takes a connection
/// exclusively (a semaphore permit), so a `WAIT` never blocks anyone else's request.
pub(crate) struct AckConnections {
    client: redis::Client,
    connection_timeout: Duration,
    idle: Mutex<Vec<MultiplexedConnection>>,
    permits: Semaphore,
}

impl AckConnections {
    pub(crate) fn new(client: redis::Client, connection_timeout: Duration) -> AckConnections {
        AckConnections {
            client,
            connection_timeout,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(MAX_ACK_CONNECTIONS),
        }
    }

    /// How many connections of the pool are open and idle (for tests and diagnostics).
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().len()
    }

    async fn take(&self) -> Result<AckConnection<'_>, Error> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| Error::Protocol("replica acknowledgement pool closed".into()))?;
        let idle = self.idle.lock().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => {
                // No response timeout of redis-rs' own: a WAIT legitimately takes as long as
                // its timeout, so every request here is bounded by the caller instead.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.connection_timeout))
                    .set_response_timeout(None);
                self.client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?
            }
        };
        Ok(AckConnection {
            pool: self,
            conn: Some(conn),
            _permit: permit,
        })
    }
}

/// One pooled connection in exclusive use. Dropped without [`AckConnection::give_back`] (an
/// error, a timeout, a cancelled future that may have left a `WAIT` running on the server) it
/// is closed instead of reused.
struct AckConnection<'a> {
    pool: &'a AckConnections,
    conn: Option<MultiplexedConnection>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl AckConnection<'_> {
    fn conn(&self) -> MultiplexedConnection {
        self.conn.clone().expect("present until given back")
    }

    fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.idle.lock().push(conn);
        }
    }
}

/// Runs one acquisition script on a pooled connection and, if it acquired (`acquired(reply)`),
/// `WAIT`s on the same connection for `ack.replicas` replicas.
///
/// A transient failure re-sends the script (same ids, so a replay) on a fresh connection
/// within the retry window, like [`LockClient::retrying`]. After such a re-send the script's
/// write may have been made on the lost connection, and `WAIT` on the new one would not cover
/// it; the acquisition then counts as acknowledged by no replica (the shortfall policy
/// decides), never as acknowledged by a `WAIT` that did not see it.
pub(crate) async fn acquire_acknowledged<R, F, Fut>(
    client: &LockClient,
    ack: ReplicaAck,
    mut attempt: F,
    acquired: impl Fn(&R) -> bool,
) -> Result<(R, Option<Acks>), Error>
where
    F: FnMut(MultiplexedConnection) -> Fut,
    Fut: Future<Output = Result<R, Error>>,
{
    let config = &client.inner.config;
    let Some(pool) = &client.inner.acks else {
        return Err(Error::InvalidConfig {
            reason: "replica acknowledgement is available for standalone URLs only, not for \
                     cluster or Sentinel clients"
                .into(),
        });
    };
    let started = Instant::now();
    let mut backoff = Duration::from_millis(5);
    let mut resent = false;
    loop {
        let outcome = async {
            let conn = pool.take().await?;
            let reply = bounded(config.response_timeout, attempt(conn.conn())).await?;
            Ok::<_, Error>((conn, reply))
        }
        .await;
        let (conn, reply) = match outcome {
            Ok(done) => done,
            Err(err)
                if crate::client::is_transient(&err)
                    && started.elapsed() + backoff < config.retry_window =>
            {
                tracing::debug!(error = %err, "re-sending a replicated acquisition on a new connection");
                resent = true;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(250));
                continue;
            }
            Err(err) => return Err(err),
        };
        if !acquired(&reply) {
            conn.give_back();
            return Ok((reply, None));
        }
        let acked = if resent {
            0
        } else {
            let mut waiting = conn.conn();
            let wait = protocol::wait_replicas(&mut waiting, ack.replicas, ack.timeout);
            match bounded(config.response_timeout + ack.timeout, wait).await {
                Ok(acked) => {
                    conn.give_back();
                    acked
                }
                Err(err) => {
                    // The connection is dropped (closed), not reused: its WAIT may still run.
                    tracing::warn!(error = %err, "WAIT for replicas failed; counting no acknowledgement");
                    0
                }
            }
        };
        return Ok((
            reply,
            Some(Acks {
                acked,
                required: ack.replicas,
            }),
        ));
    }
}

/// `fut`, or a timeout error (transient, like redis-rs' own response timeout) after `limit`.
async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no reply within the response timeout",
        )))),
    }
}
