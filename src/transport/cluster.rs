//! A Redis Cluster: redis-rs' cluster client, which routes every script call by its first key
//! (all keys of one call share a slot, see `protocol::keys`), follows `MOVED`/`ASK`, and
//! re-sends requests by itself.

use std::sync::Weak;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::ProtocolVersion;

use super::addresses;
use super::push::{push_handler, PushListener};
use crate::base::config::ClientConfig;
use crate::base::error::Error;

/// Connects through any of `nodes` (one reachable node is enough). With a `listener`, what
/// the nodes push (release messages, dropped subscriptions) goes to it; without one, pushes
/// are dropped (a connection that never subscribes is pushed nothing it needs).
pub(crate) async fn connect(
    nodes: &[String],
    config: &ClientConfig,
    listener: Option<Weak<dyn PushListener>>,
) -> Result<ClusterConnection, Error> {
    if nodes.is_empty() {
        return Err(Error::InvalidConfig {
            reason: "a cluster client needs at least one node URL".into(),
        });
    }
    let mut builder =
        ClusterClientBuilder::new(nodes.to_vec()).use_protocol(ProtocolVersion::RESP3);
    if let Some(listener) = listener {
        builder = builder.push_sender(push_handler(listener));
    }
    let client = builder
        .response_timeout(config.response_timeout)
        .connection_timeout(config.connection_timeout)
        // The cluster client re-sends a request after MOVED, ASK, TRYAGAIN and connection
        // errors by itself; every mutating script carries its operation id, so a re-send that
        // follows an applied request replays its reply instead of applying twice.
        .retries(5)
        .max_retry_wait(500)
        .build()?;
    client
        .get_async_connection()
        .await
        .map_err(|err| Error::connecting(format!("cluster seed nodes {}", addresses(nodes)), err))
}
