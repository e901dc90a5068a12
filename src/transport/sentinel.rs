//! The primary of a Sentinel-monitored group, followed across failovers.

use std::sync::{Arc, Weak};

use redis::aio::ConnectionLike;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    Cmd, ConnectionAddr, Pipeline, ProtocolVersion, RedisConnectionInfo, RedisFuture, Value,
};

use super::addresses;
use super::push::PushListener;
use super::reconnecting::ReconnectingConn;
use super::standalone::connect_reconnecting;
use crate::base::config::{ClientConfig, NodeAuth};
use crate::base::error::{Error, ErrorClass};

/// The primary of a Sentinel-monitored group, followed across failovers.
///
/// redis-rs asks the Sentinels for the primary only when it connects, and a
/// [`ReconnectingConn`] reconnects to the address it was given: after a failover it would
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
    listener: Weak<dyn PushListener>,
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
    conn: ReconnectingConn,
}

impl SentinelConn {
    pub(crate) async fn connect(
        sentinels: &[String],
        master_name: &str,
        node_auth: Option<NodeAuth>,
        config: &ClientConfig,
        listener: Weak<dyn PushListener>,
    ) -> Result<SentinelConn, Error> {
        if sentinels.is_empty() {
            return Err(Error::InvalidConfig {
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
            .await
            .map_err(|err| Error::connecting(format!("Sentinels {}", addresses(sentinels)), err))?;
        let addr = client.get_connection_info().addr().clone();
        let conn = connect_reconnecting(client.clone(), config, listener.clone()).await?;
        Ok(SentinelConn {
            shared: Arc::new(SentinelShared {
                sentinel: tokio::sync::Mutex::new(sentinel),
                master_name: master_name.to_owned(),
                node_info,
                config: config.clone(),
                listener,
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

    pub(crate) fn current(&self) -> ReconnectingConn {
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
        let Some(listener) = self.shared.listener.upgrade() else {
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
        let conn = match connect_reconnecting(
            client.clone(),
            &self.shared.config,
            Arc::downgrade(&listener),
        )
        .await
        {
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
        // The listener subscribes its channels on the new connection in a task of its own:
        // the request that noticed the failover may be dropped by its caller.
        listener.on_new_primary();
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
                Err(err) => ErrorClass::of(err).primary_may_have_moved(),
                // A script's error reply (READONLY from inside EVALSHA) arrives as a value.
                Ok(Value::ServerError(err)) => {
                    ErrorClass::of_code(err.code()).primary_may_have_moved()
                }
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
                Err(err) => ErrorClass::of(err).primary_may_have_moved(),
                Ok(values) => values.iter().any(|v| {
                    matches!(v, Value::ServerError(err)
                        if ErrorClass::of_code(err.code()).primary_may_have_moved())
                }),
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use fencelock_testing::RedisSentinels;

    use super::*;

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
        let conn = SentinelConn::connect(
            &set.sentinel_urls(),
            set.master_name(),
            None,
            &ClientConfig::default(),
            Arc::downgrade(&listener),
        )
        .await
        .expect("connect through the Sentinels");
        let port = |conn: &SentinelConn| conn.primary().1.rsplit(':').next().map(str::to_owned);
        let old = set.primary().expect("primary").port();
        assert_eq!(conn.primary().0, 0);
        assert_eq!(port(&conn), Some(old.to_string()));
        // Its database, as for any connection under Sentinel (which selects none).
        assert_eq!(conn.get_db(), 0);

        // Nothing moved: the Sentinels name the same primary, which is kept.
        conn.follow_failover(0).await;
        assert_eq!(conn.primary().0, 0);
        assert_eq!(switches.0.load(Ordering::SeqCst), 0);

        set.failover().expect("SENTINEL FAILOVER");
        let new = set
            .wait_for_failover(old, Duration::from_secs(60))
            .expect("failover");
        // A request stamped with a generation that is not the current one leaves it alone.
        conn.follow_failover(7).await;
        assert_eq!(conn.primary().0, 0);
        assert_eq!(port(&conn), Some(old.to_string()));

        // The current generation asks; a Sentinel that has not caught up yet names the old
        // primary, which fails the role check, so the test asks until the switch (as the next
        // failed request would).
        let until = Instant::now() + Duration::from_secs(30);
        while conn.primary().0 == 0 {
            assert!(
                Instant::now() < until,
                "the client never followed the failover"
            );
            conn.follow_failover(0).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(conn.primary().0, 1);
        assert_eq!(port(&conn), Some(new.to_string()));
        assert_eq!(switches.0.load(Ordering::SeqCst), 1);
        // A request that failed on the old connection after the switch changes nothing.
        conn.follow_failover(0).await;
        assert_eq!(conn.primary().0, 1);
        assert_eq!(switches.0.load(Ordering::SeqCst), 1);
    }
}
