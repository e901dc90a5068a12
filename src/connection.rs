//! The one connection type the rest of the crate talks through, whatever the deployment.
//!
//! A standalone server is reached through a [`ConnectionManager`] (one multiplexed RESP3
//! connection that reconnects by itself); a Redis Cluster through redis-rs' cluster client,
//! which routes every script call by its first key (all keys of one call share a slot, see
//! `protocol::keys`), follows `MOVED`/`ASK`, and re-sends requests by itself. Both carry the
//! release messages as RESP3 push messages to the client's [`Waiters`](crate::wait::Waiters).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

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
}

impl Conn {
    pub(crate) fn pubsub(&self) -> PubSub {
        match self {
            Conn::Standalone(_) => PubSub::Classic,
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
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match self {
            Conn::Standalone(c) => c.unsubscribe(channel).await,
            Conn::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
