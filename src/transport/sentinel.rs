//! The primary of a Sentinel-monitored group: where a [`ReconnectingConn`] goes, and where it
//! goes after a failover ([`ReconnectingConn::follow_failover`]).

use std::sync::{Arc, Weak};

use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{ProtocolVersion, RedisConnectionInfo, RedisResult};

use super::addresses;
use super::push::PushListener;
use super::reconnecting::ReconnectingConn;
use crate::base::config::{ClientConfig, NodeAuth};
use crate::base::error::Error;

/// The Sentinels of one group, asked for its primary.
pub(crate) struct Sentinels {
    sentinel: tokio::sync::Mutex<Sentinel>,
    master_name: String,
    node_info: SentinelNodeConnectionInfo,
    /// Re-resolutions run one at a time; the others wait and see its result.
    pub(super) switching: Arc<tokio::sync::Mutex<()>>,
}

impl Sentinels {
    /// A client for the primary the Sentinels name now (redis-rs verifies it with `ROLE`), with
    /// the data nodes' credentials.
    pub(super) async fn primary(&self) -> RedisResult<redis::Client> {
        let mut sentinel = self.sentinel.lock().await;
        sentinel
            .async_master_for(&self.master_name, Some(&self.node_info))
            .await
    }
}

/// Connects to the primary of `master_name` as `sentinels` name it, and follows it across
/// failovers.
pub(crate) async fn connect(
    sentinels: &[String],
    master_name: &str,
    node_auth: Option<NodeAuth>,
    config: &ClientConfig,
    listener: Weak<dyn PushListener>,
) -> Result<ReconnectingConn, Error> {
    if sentinels.is_empty() {
        return Err(Error::InvalidConfig {
            reason: "a Sentinel client needs at least one Sentinel URL".into(),
        });
    }
    let mut redis_info = RedisConnectionInfo::default().set_protocol(ProtocolVersion::RESP3);
    if let Some(auth) = node_auth {
        if let Some(username) = &auth.username {
            redis_info = redis_info.set_username(username);
        }
        redis_info = redis_info.set_password(&auth.password);
    }
    let group = Sentinels {
        sentinel: tokio::sync::Mutex::new(Sentinel::build(sentinels.to_vec())?),
        master_name: master_name.to_owned(),
        node_info: SentinelNodeConnectionInfo::default().set_redis_connection_info(redis_info),
        switching: Arc::default(),
    };
    let client = group
        .primary()
        .await
        .map_err(|err| Error::connecting(format!("Sentinels {}", addresses(sentinels)), err))?;
    ReconnectingConn::connect(client, Some(group), config, listener).await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use fencelock_testing::RedisSentinels;
    use redis::aio::ConnectionLike;

    use super::*;

    /// Waits for the lookup a `follow_failover` started, if it started one.
    async fn wait_for(lookup: Option<tokio::task::JoinHandle<()>>) {
        if let Some(lookup) = lookup {
            lookup.await.expect("the lookup ran to its end");
        }
    }

    /// Counts the new primaries the connection announces.
    #[derive(Default)]
    struct Switches(AtomicUsize);

    impl PushListener for Switches {
        fn on_message(&self, _channel: &[u8], _payload: &[u8]) {}
        fn on_disconnect(&self) {}
        fn on_subscription_lost(self: Arc<Self>, _channel: &[u8]) {}
        fn on_new_primary(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A failover is followed once: asking while the primary has not moved keeps it (and its
    /// generation), a request stamped with an older generation does not ask at all, and the
    /// switch to the new primary bumps the generation by one and tells the listener once.
    #[tokio::test]
    async fn a_failover_is_followed_once_and_bumps_the_generation() {
        let set = RedisSentinels::start(1).expect("start sentinels");
        let switches = Arc::new(Switches::default());
        let listener: Arc<dyn PushListener> = switches.clone();
        let conn = connect(
            &set.sentinel_urls(),
            set.master_name(),
            None,
            &ClientConfig::default(),
            Arc::downgrade(&listener),
        )
        .await
        .expect("connect through the Sentinels");
        let port =
            |conn: &ReconnectingConn| conn.primary().key.rsplit(':').next().map(str::to_owned);
        let old = set.primary().expect("primary").port();
        assert_eq!(conn.primary().stamp, 0);
        assert_eq!(port(&conn), Some(old.to_string()));
        // Its database, as for any connection under Sentinel (which selects none).
        assert_eq!(conn.get_db(), 0);

        // Nothing moved: the Sentinels name the same primary, which is kept.
        wait_for(conn.follow_failover(0)).await;
        assert_eq!(conn.primary().stamp, 0);
        assert_eq!(switches.0.load(Ordering::SeqCst), 0);

        set.failover().expect("SENTINEL FAILOVER");
        let new = set
            .wait_for_failover(old, Duration::from_secs(60))
            .expect("failover");
        // A request stamped with a generation that is not the current one leaves it alone.
        wait_for(conn.follow_failover(7)).await;
        assert_eq!(conn.primary().stamp, 0);
        assert_eq!(port(&conn), Some(old.to_string()));

        // The current generation asks; a Sentinel that has not caught up yet names the old
        // primary, which fails the role check, so the test asks until the switch (as the next
        // failed request would).
        let until = Instant::now() + Duration::from_secs(30);
        while conn.primary().stamp == 0 {
            assert!(
                Instant::now() < until,
                "the client never followed the failover"
            );
            wait_for(conn.follow_failover(0)).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(conn.primary().stamp, 1);
        assert_eq!(port(&conn), Some(new.to_string()));
        assert_eq!(switches.0.load(Ordering::SeqCst), 1);
        // A request that failed on the old connection after the switch changes nothing.
        wait_for(conn.follow_failover(0)).await;
        assert_eq!(conn.primary().stamp, 1);
        assert_eq!(switches.0.load(Ordering::SeqCst), 1);
    }
}
