//! The one connection type the rest of the crate talks through, whatever the deployment.
//!
//! A standalone server is reached through a [`ConnectionManager`] (one multiplexed RESP3
//! connection that reconnects by itself); a Redis Cluster through redis-rs' cluster client,
//! which routes every script call by its first key (all keys of one call share a slot, see
//! `protocol::keys`), follows `MOVED`/`ASK`, and re-sends requests by itself. Both carry the
//! release messages as RESP3 push messages to the client's [`Waiters`](crate::wait::Waiters).
//! A primary under Sentinel is reached through a [`SentinelConn`], which follows failovers.

use std::sync::{Arc, Weak};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    Cmd, ConnectionAddr, Pipeline, ProtocolVersion, RedisConnectionInfo, RedisError, RedisFuture,
    RedisResult, Value,
};

use crate::builder::NodeAuth;
use crate::client::{connect_manager, ClientConfig};
use crate::wait::Waiters;

/// How release messages travel: classic pub/sub on one server, sharded pub/sub on a cluster
/// (`SPUBLISH` reaches only the nodes of the channel's slot, and the channel is the lock key, so
/// it lives in the lock's slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PubSub {
    Classic,
    Sharded,
}

impl PubSub {
    /// The scripts' argument that picks `PUBLISH` or `SPUBLISH`.
    pub(crate) fn script_arg(self) -> &'static str {
        match self {
            PubSub::Classic => "classic",
            PubSub::Sharded => "sharded",
        }
    }
}

/// A connection to a standalone server or to a cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
}

impl Conn {
    pub(crate) fn pubsub(&self) -> PubSub {
        match self {
            Conn::Standalone(_) | Conn::Sentinel(_) => PubSub::Classic,
            Conn::Cluster(_) => PubSub::Sharded,
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// Subscribes to a lock's release channel: `SUBSCRIBE` on one server, `SSUBSCRIBE` (routed
    /// to the node owning the channel's slot, and re-sent by redis-rs after a topology change
    /// or reconnect) on a cluster.
    pub(crate) async fn subscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match self {
            Conn::Standalone(c) => c.subscribe(channel).await,
            Conn::Cluster(c) => c.ssubscribe(channel).await,
            Conn::Sentinel(c) => c.current().subscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match self {
            Conn::Standalone(c) => c.unsubscribe(channel).await,
            Conn::Cluster(c) => c.sunsubscribe(channel).await,
            Conn::Sentinel(c) => c.current().unsubscribe(channel).await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.current().get_db(),
        }
    }
}

/// The primary of a Sentinel-monitored group, followed across failovers.
///
/// redis-rs asks the Sentinels for the primary only when it connects, and a
/// [`ConnectionManager`] reconnects to the address it was given: after a failover it would
/// keep knocking on a dead server, or write to a demoted one and get `READONLY`. So every
/// request that fails with a connection error or `READONLY` makes this ask the Sentinels
/// again; when they name another (verified) primary, a new connection replaces the old one,
/// the waiters' channels are subscribed on it and every waiting head goes back to Redis (a
/// release may have been published while we were away). The failed request is returned as
/// failed: the caller re-sends it with its operation id, now to the new primary.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    shared: Arc<SentinelShared>,
}

struct SentinelShared {
    sentinel: tokio::sync::Mutex<Sentinel>,
    master_name: String,
    node_info: SentinelNodeConnectionInfo,
    config: ClientConfig,
    waiters: Weak<Waiters>,
    current: parking_lot::Mutex<Primary>,
    /// Re-resolutions run one at a time; the others wait and see its result.
    switching: tokio::sync::Mutex<()>,
}

struct Primary {
    generation: u64,
    addr: ConnectionAddr,
    /// What the Sentinels handed out for this primary (address, credentials), for the
    /// dedicated connections of replica acknowledgement.
    client: redis::Client,
    conn: ConnectionManager,
}

impl SentinelConn {
    pub(crate) async fn connect(
        sentinels: &[String],
        master_name: &str,
        node_auth: Option<NodeAuth>,
        config: &ClientConfig,
        waiters: &Arc<Waiters>,
    ) -> Result<SentinelConn, crate::Error> {
        if sentinels.is_empty() {
            return Err(crate::Error::InvalidConfig {
                reason: "a Sentinel client needs at least one Sentinel URL".into(),
            });
        }
        let mut sentinel = Sentinel::build(sentinels.to_vec())?;
        let mut redis_info = RedisConnectionInfo::default().set_protocol(ProtocolVersion::RESP3);
        if let Some(auth) = node_auth {
            if let Some(username) = &auth.username {
                redis_info = redis_info.set_username(username);
            }
            redis_info = redis_info.set_password(&auth.password);
        }
        let node_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(redis_info);
        let client = sentinel
            .async_master_for(master_name, Some(&node_info))
            .await?;
        let addr = client.get_connection_info().addr().clone();
        let conn = connect_manager(client.clone(), config, waiters).await?;
        Ok(SentinelConn {
            shared: Arc::new(SentinelShared {
                sentinel: tokio::sync::Mutex::new(sentinel),
                master_name: master_name.to_owned(),
                node_info,
                config: config.clone(),
                waiters: Arc::downgrade(waiters),
                current: parking_lot::Mutex::new(Primary {
                    generation: 0,
                    addr,
                    client,
                    conn,
                }),
                switching: tokio::sync::Mutex::new(()),
            }),
        })
    }

    fn current(&self) -> ConnectionManager {
        self.shared.current.lock().conn.clone()
    }

    /// The primary of the moment: its generation (bumped by every switch), its address and a
    /// client to open more connections to it.
    pub(crate) fn primary(&self) -> (u64, String, redis::Client) {
        let current = self.shared.current.lock();
        (
            current.generation,
            current.addr.to_string(),
            current.client.clone(),
        )
    }

    /// After a request on the connection of `generation` failed in a way that says the
    /// primary may have moved, asks the Sentinels and switches to the primary they name, if it
    /// is another one.
    pub(crate) async fn follow_failover(&self, generation: u64) {
        let _switching = self.shared.switching.lock().await;
        if self.shared.current.lock().generation != generation {
            return; // someone else switched meanwhile
        }
        let Some(waiters) = self.shared.waiters.upgrade() else {
            return;
        };
        let client = {
            let mut sentinel = self.shared.sentinel.lock().await;
            match sentinel
                .async_master_for(&self.shared.master_name, Some(&self.shared.node_info))
                .await
            {
                Ok(client) => client,
                Err(err) => {
                    // Mid-failover the Sentinels may still name the dead primary, which fails
                    // the role check: the next failed request asks again.
                    tracing::debug!(error = %err, "no verified primary from the Sentinels yet");
                    return;
                }
            }
        };
        let addr = client.get_connection_info().addr().clone();
        if addr == self.shared.current.lock().addr {
            return;
        }
        let conn = match connect_manager(client.clone(), &self.shared.config, &waiters).await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::debug!(error = %err, "connecting to the new primary failed");
                return;
            }
        };
        tracing::info!(primary = %addr, "following the Sentinels to a new primary");
        {
            let mut current = self.shared.current.lock();
            current.generation += 1;
            current.addr = addr;
            current.client = client;
            current.conn = conn;
        }
        // Spawned: the request that noticed the failover may be dropped by its caller, but the
        // waiters of every lock still need their channels on the new connection.
        tokio::spawn(async move {
            waiters.resubscribe_all().await;
            waiters.on_reconnect();
        });
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = {
                let current = self.shared.current.lock();
                (current.generation, current.conn.clone())
            };
            let outcome = conn.req_packed_command(cmd).await;
            let moved = match &outcome {
                Err(err) => primary_may_have_moved(err),
                // A script's error reply (READONLY from inside EVALSHA) arrives as a value.
                Ok(Value::ServerError(err)) => server_error_says_moved(err.code()),
                Ok(_) => false,
            };
            if moved {
                self.follow_failover(generation).await;
            }
            outcome
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = {
                let current = self.shared.current.lock();
                (current.generation, current.conn.clone())
            };
            let outcome = conn.req_packed_commands(pipeline, offset, count).await;
            let moved = match &outcome {
                Err(err) => primary_may_have_moved(err),
                Ok(values) => values.iter().any(
                    |v| matches!(v, Value::ServerError(err) if server_error_says_moved(err.code())),
                ),
            };
            if moved {
                self.follow_failover(generation).await;
            }
            outcome
        })
    }

    fn get_db(&self) -> i64 {
        self.current().get_db()
    }
}

/// Errors after which the primary may be another server now: it cannot be reached, or it
/// answers as a replica.
fn primary_may_have_moved(err: &RedisError) -> bool {
    crate::error::connection_lost(err) || err.code().is_some_and(server_error_says_moved)
}

fn server_error_says_moved(code: &str) -> bool {
    matches!(code, "READONLY" | "MASTERDOWN")
}
