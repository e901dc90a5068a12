//! The transport layer: how requests reach the server that must run them, whatever the
//! deployment, and how what the server pushes reaches the engine.
//!
//! [`Conn`] is the one connection type the layers above talk through. One server is reached
//! through a [`ReconnectingConn`] (one multiplexed RESP3 connection that reconnects by itself,
//! once per lost connection: [`reconnecting`]), at a fixed address ([`standalone`]) or at the
//! primary the Sentinels name, followed across failovers ([`sentinel`]); a Redis Cluster through
//! redis-rs' cluster client ([`cluster`]: two of them, one for subscriptions alone, see
//! [`Connections`]).
//! All of them carry release messages as RESP3 push messages to a [`PushListener`]
//! ([`push`]). Replicated acquisitions run on connections of their own ([`ack_pool`]), routed
//! to the lock's primary (on a cluster by [`slot_map`]).

pub(crate) mod ack_pool;
pub(crate) mod cluster;
pub(crate) mod push;
pub(crate) mod reconnecting;
pub(crate) mod sentinel;
pub(crate) mod slot_map;
pub(crate) mod standalone;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult, Value};

use crate::protocol::PubSub;
pub(crate) use push::PushListener;
pub(crate) use reconnecting::ReconnectingConn;

/// A connection to one server (at a fixed address, or the primary of a Sentinel group) or to a
/// cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Server(ReconnectingConn),
    Cluster(ClusterConnection),
}

/// Whether the client library under a connection may send one request more than once by
/// itself. Then any send may have a copy on its way, so every send of an acquisition leaves
/// an op record (`engine::pending::Sends`).
pub(crate) trait ResendsByItself {
    fn resends_by_itself(&self) -> bool;
}

impl ResendsByItself for Conn {
    /// redis-rs' cluster client re-sends after `MOVED`, `ASK`, `TRYAGAIN` and connection
    /// errors; the one-server connection (also under Sentinel) sends each request once.
    fn resends_by_itself(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ResendsByItself for redis::aio::MultiplexedConnection {
    /// A plain connection to one node (a replica-acknowledged session's) sends each request
    /// once.
    fn resends_by_itself(&self) -> bool {
        false
    }
}

impl Conn {
    pub(crate) fn pubsub(&self) -> PubSub {
        match self {
            Conn::Server(_) => PubSub::Classic,
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
            Conn::Server(c) => c.subscribe(channel).await,
            Conn::Cluster(c) => c.ssubscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match self {
            Conn::Server(c) => c.unsubscribe(channel).await,
            Conn::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }
}

/// The connections a client's waiters talk through.
pub(crate) struct Connections {
    /// Where the waiters' scripts go (`leave_fair.lua`): the client's connection.
    pub(crate) commands: Conn,
    /// Where SUBSCRIBE and UNSUBSCRIBE go. On one server and under Sentinel, the client's
    /// connection too. On a cluster, a cluster connection of its own: a node drops a sharded
    /// subscription by itself when its slot moves (failover, resharding), and redis-rs takes
    /// that unasked `sunsubscribe` push as the reply of whatever request is in flight on that
    /// node's connection (DESIGN.md §15). On a connection that carries only subscriptions,
    /// the request it displaces is a subscription, whose re-send is harmless; a script's reply
    /// is never read as another request's.
    pub(crate) subscriptions: Conn,
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
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
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The addresses (`host:port`) of `urls`, for an error message: never their credentials.
/// A URL that does not parse is left out (connecting to it fails first, saying so).
pub(crate) fn addresses(urls: &[String]) -> String {
    let addrs: Vec<String> = urls
        .iter()
        .filter_map(|url| url.as_str().into_connection_info().ok())
        .map(|info| info.addr().to_string())
        .collect();
    addrs.join(", ")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fencelock_testing::RedisServer;
    use redis::aio::ConnectionLike;

    use super::*;
    use crate::base::config::ClientConfig;

    /// A listener for connections whose pushes a test does not look at.
    struct Unheard;

    impl PushListener for Unheard {
        fn on_message(&self, _channel: &[u8], _payload: &[u8]) {}
        fn on_disconnect(&self) {}
        fn on_subscription_lost(self: Arc<Self>, _channel: &[u8]) {}
        fn on_new_primary(self: Arc<Self>) {}
    }

    /// One server is neither a cluster (renewals of locks in different slots share a script
    /// call, a multi-lock is taken by one script) nor reached by sharded pub/sub, and the
    /// connection reports the database its URL selects, as every redis-rs connection does.
    #[tokio::test]
    async fn one_server_is_not_a_cluster_and_keeps_the_database_of_its_url() {
        let server = RedisServer::start().expect("start redis-server");
        let listener: Arc<dyn PushListener> = Arc::new(Unheard);
        let url = format!("redis://127.0.0.1:{}/3", server.port());
        let manager =
            standalone::connect(&url, &ClientConfig::default(), Arc::downgrade(&listener))
                .await
                .expect("connect");
        let conn = Conn::Server(manager);
        assert!(!conn.is_cluster());
        assert_eq!(conn.pubsub(), PubSub::Classic);
        assert_eq!(conn.get_db(), 3);
    }
}
