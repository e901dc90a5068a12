//! The per-process handle to one Redis deployment.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};

use crate::builder::{LockClientBuilder, NodeAuth, Target};
use crate::connection::{Conn, SentinelConn};
use crate::protocol::keys::{validate_name, LockKeys};
use crate::protocol::{self, PermissionsReply};
use crate::replication::{AckConnections, AckRoute, ClusterRoute, ReplicaAck};
use crate::wait::Waiters;
use crate::watchdog::{self, Watchdog};
use crate::{Error, FencedResource, Lock};

/// Default prefix of every key and channel.
pub(crate) const DEFAULT_PREFIX: &str = "fencelock:";

/// How long a fair-handoff queue outlives, beyond the holder's lease and twice the grace, the
/// last failed attempt that refreshed it: waiting heads try again at least once per lease (their
/// fallback timer) and on every release, so a live client's entry is refreshed well within it.
const FAIR_QUEUE_SLACK: Duration = Duration::from_secs(1);

/// The lock name whose keys `permissions.lua` checks at connect. Nothing is written under it;
/// any name would do, as an ACL grants by key pattern.
const PERMISSIONS_PROBE: &[u8] = b"permissions-probe";

/// How long a fair-handoff queue lives after a release that queued its client again: the
/// grace plus the slack of a failed attempt (the waiters' next attempts refresh it).
pub(crate) fn fair_queue_life(grace: Duration) -> Duration {
    grace * 3 + FAIR_QUEUE_SLACK
}

/// Everything a client needs to know after it connected.
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    pub(crate) prefix: Vec<u8>,
    pub(crate) default_lease: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) connection_timeout: Duration,
    pub(crate) retry_window: Duration,
    pub(crate) op_record_ttl: Duration,
    pub(crate) renew_batch: usize,
    /// PEM certificates of the CAs a `rediss://` server's certificate must chain to, instead
    /// of the system's roots.
    #[cfg(feature = "tls")]
    pub(crate) tls_root_ca: Option<Vec<u8>>,
    /// Replica acknowledgement every lock of the client requires unless it sets its own.
    pub(crate) replica_ack: Option<ReplicaAck>,
    /// Fair handoff across clients (`acquire_fair.lua`, `release_fair.lua`) and the grace a
    /// reservation waits for its client; `None`: the default mode.
    pub(crate) fair_grace: Option<Duration>,
    /// A deliberately broken protocol variant (tests only; `None` is the real protocol).
    #[cfg(feature = "negative-controls")]
    pub(crate) control: Option<crate::testing::controls::Control>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            prefix: DEFAULT_PREFIX.as_bytes().to_vec(),
            default_lease: Duration::from_secs(30),
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            retry_window: Duration::from_secs(3),
            op_record_ttl: Duration::from_secs(10),
            renew_batch: 100,
            #[cfg(feature = "tls")]
            tls_root_ca: None,
            replica_ack: None,
            fair_grace: None,
            #[cfg(feature = "negative-controls")]
            control: None,
        }
    }
}

/// A connection to one Redis deployment, shared by every lock of a process.
///
/// Create one per process (or per Redis deployment) and clone it freely: clones share the
/// connection, the client id and the background work. The client multiplexes every lock
/// operation over one RESP3 connection that reconnects by itself; release notifications for
/// waiting acquirers arrive on the same connection as push messages.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use fencelock::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:7000/").await?;
/// let lock = client.lock("account:42")?;
/// let guard = lock.acquire().await?;
/// println!("holding {} with token {}", String::from_utf8_lossy(lock.name()), guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) config: ClientConfig,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) watchdog: Watchdog,
    /// Connections reserved for replicated acquisitions (script + `WAIT`), per node, opened on
    /// first use.
    pub(crate) acks: AckConnections,
    id: String,
    next_seq: AtomicU64,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.id)
            .field(
                "prefix",
                &String::from_utf8_lossy(&self.inner.config.prefix),
            )
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects with default options (prefix `fencelock:`, 30 s lease, 1 s response timeout).
    ///
    /// `url` is a redis-rs connection URL: `redis://[user:password@]host:port/[db]`,
    /// `redis+unix:///path/to/socket`, and with the feature `tls` `rediss://...` (see
    /// `LockClientBuilder::tls_root_ca` for a private CA).
    ///
    /// # Errors
    /// [`Error::Redis`] when the server cannot be reached or refuses the connection;
    /// [`Error::PermissionDenied`] when the Redis user may not run every command the lock
    /// scripts send on this client's keys (checked at connect on Redis 7.0+; the error names
    /// the missing commands, README "Security" lists them).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect(url: &str) -> Result<LockClient, Error> {
        LockClient::builder(url).connect().await
    }

    /// Starts configuring a client; see [`LockClientBuilder`].
    pub fn builder(url: impl Into<String>) -> LockClientBuilder {
        LockClientBuilder::new(url)
    }

    /// Connects to a Redis Cluster with default options; see [`LockClient::cluster_builder`].
    ///
    /// # Errors
    /// [`Error::Redis`] when no node can be reached or the cluster refuses the connection;
    /// [`Error::PermissionDenied`] when the Redis user lacks a command the scripts send (as
    /// for [`LockClient::connect`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<LockClient, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockClient::cluster_builder(nodes).connect().await
    }

    /// Starts configuring a client of a Redis Cluster (7.0 or later) reached through any of
    /// `nodes` (`redis://host:port` URLs; one reachable node is enough, the others are found
    /// with `CLUSTER SLOTS`). Every lock lives in one hash slot; waiters are woken by sharded
    /// pub/sub, so release messages only travel to the nodes of the lock's slot.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fencelock::Error> {
    /// use fencelock::LockClient;
    ///
    /// let client = LockClient::cluster_builder(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
    ///     .connect()
    ///     .await?;
    /// let guard = client.lock("account:42")?.acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn cluster_builder<I, S>(nodes: I) -> LockClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockClientBuilder::with_target(Target::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    /// Connects through Sentinel with default options; see [`LockClient::sentinel_builder`].
    ///
    /// # Errors
    /// [`Error::Redis`] when no Sentinel answers or the primary they name cannot be reached;
    /// [`Error::PermissionDenied`] when the Redis user lacks a command the scripts send (as
    /// for [`LockClient::connect`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect_sentinel<I, S>(
        sentinels: I,
        master_name: &str,
    ) -> Result<LockClient, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockClient::sentinel_builder(sentinels, master_name)
            .connect()
            .await
    }

    /// Starts configuring a client of the primary that the Sentinels at `sentinels`
    /// (`redis://host:port` URLs) monitor as `master_name`. The client asks the Sentinels
    /// again whenever a request fails with a connection error or `READONLY`, and moves to the
    /// new primary after a failover; waiters and the watchdog carry on there.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fencelock::Error> {
    /// use fencelock::LockClient;
    ///
    /// let client = LockClient::sentinel_builder(["redis://127.0.0.1:26380"], "mymaster")
    ///     .connect()
    ///     .await?;
    /// let guard = client.lock("account:42")?.acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel_builder<I, S>(sentinels: I, master_name: &str) -> LockClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockClientBuilder::with_target(Target::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master: master_name.to_owned(),
        })
    }

    pub(crate) async fn connect_with(
        target: &Target,
        config: ClientConfig,
        node_auth: Option<NodeAuth>,
    ) -> Result<LockClient, Error> {
        let waiters = Arc::new(Waiters::default());
        if !matches!(target, Target::Standalone(_)) {
            // The cluster and Sentinel clients take TLS settings from their URLs only; redis-rs
            // has no per-client root certificates for them.
            #[cfg(feature = "tls")]
            if config.tls_root_ca.is_some() {
                return Err(Error::InvalidConfig {
                    reason: "tls_root_ca is available for standalone URLs only".into(),
                });
            }
        }
        let (conn, acks) = match target {
            Target::Standalone(url) => {
                let (manager, client) = connect_standalone(url, &config, &waiters).await?;
                (Conn::Standalone(manager), AckRoute::Standalone(client))
            }
            Target::Cluster(nodes) => {
                let conn = connect_cluster(nodes, &config, &waiters).await?;
                // connect_cluster refused an empty list.
                let route = ClusterRoute::new(conn.clone(), &nodes[0], &config)?;
                (Conn::Cluster(conn), AckRoute::Cluster(route))
            }
            Target::Sentinel { sentinels, master } => {
                let conn =
                    SentinelConn::connect(sentinels, master, node_auth, &config, &waiters).await?;
                (Conn::Sentinel(conn.clone()), AckRoute::Sentinel(conn))
            }
        };
        let acks = AckConnections::new(acks, &config);
        waiters.set_connection(conn.clone());
        let inner = Arc::new(Inner {
            conn,
            config,
            waiters,
            watchdog: Watchdog::default(),
            acks,
            id: uuid::Uuid::new_v4().simple().to_string(),
            next_seq: AtomicU64::new(1),
        });
        tokio::spawn(watchdog::run(Arc::downgrade(&inner)));
        let client = LockClient { inner };
        client.check_permissions().await?;
        match client.eviction_risk().await {
            Ok(Some(risk)) => tracing::warn!(name: "fencelock.eviction_risk", "{risk}"),
            Ok(None) => {}
            // CONFIG may be renamed away or not granted to this user (the least-privilege ACL
            // of the README leaves it out); the check is advice, so it never fails a connect.
            Err(err) => tracing::debug!(
                name: "fencelock.eviction_check_failed",
                error = %err,
                "could not read maxmemory-policy"
            ),
        }
        Ok(client)
    }

    /// Refuses, at connect, a Redis user that may not run every command the scripts send on
    /// this client's keys: a script refused midway keeps what it wrote before the refused
    /// command (Redis does not roll scripts back), so without this a missing `+pexpire` would
    /// leave a lock hash that never expires. One `permissions.lua` call on a probe lock's keys
    /// (on a cluster, at the probe's slot). A server that cannot tell (Redis < 7.0), or a failed
    /// call for any reason other than a refusal, leaves the check to the first real operation.
    async fn check_permissions(&self) -> Result<(), Error> {
        let keys = LockKeys::new(&self.inner.config.prefix, PERMISSIONS_PROBE);
        let mut conn = self.conn();
        let pubsub = conn.pubsub();
        let fair = self.inner.config.fair_grace.is_some();
        let reply = self
            .controlled(protocol::permissions(&mut conn, &keys, pubsub, fair))
            .await;
        match reply {
            Ok(PermissionsReply::Granted) => Ok(()),
            Ok(PermissionsReply::Refused(commands)) => Err(Error::PermissionDenied {
                detail: format!(
                    "the Redis user may not run {} on the keys under prefix {:?} (and their \
                     channels); grant every command the README's Security section lists",
                    commands.join(", "),
                    String::from_utf8_lossy(&self.inner.config.prefix),
                ),
            }),
            Ok(PermissionsReply::Unknown) => {
                tracing::debug!(
                    name: "fencelock.permission_check_skipped",
                    "the server has no redis.acl_check_cmd (Redis < 7.0)"
                );
                Ok(())
            }
            Err(err) if err.is_permission_denied() => Err(err),
            Err(err) => {
                tracing::debug!(
                    name: "fencelock.permission_check_failed",
                    error = %err,
                    "could not check the user's permissions"
                );
                Ok(())
            }
        }
    }

    /// A handle to the lock called `name`. Names are arbitrary bytes (UTF-8, binary, braces
    /// included) of 1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes; two different names never
    /// share a key. Nothing is sent to Redis until the lock is acquired.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        let keys = LockKeys::new(&self.inner.config.prefix, name);
        Ok(Lock::new(self.clone(), name.into(), keys))
    }

    /// Several locks to be taken as one, all or nothing: see [`MultiLock`](crate::MultiLock).
    /// The members are put in one global order (their keys' byte order), whatever order the
    /// names come in, so sets acquired by different tasks in different orders cannot deadlock.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name; [`Error::InvalidLockSet`] for no
    /// names, more than [`MAX_MULTI_LOCKS`](crate::MAX_MULTI_LOCKS), or one name given twice,
    /// and on a client with [`fair_handoff`](LockClientBuilder::fair_handoff) (single-lock
    /// only). Nothing is sent to Redis.
    pub fn multi_lock<I, N>(&self, names: I) -> Result<crate::MultiLock, Error>
    where
        I: IntoIterator<Item = N>,
        N: AsRef<[u8]>,
    {
        crate::MultiLock::new(self, names)
    }

    /// A fenced resource called `name`: a value, number, hash or list in Redis whose writes
    /// are refused when they carry a token older than one it has already accepted. Names
    /// follow the rules of [`LockClient::lock`]; a resource and a lock may share a name.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long name.
    pub fn resource(&self, name: impl AsRef<[u8]>) -> Result<FencedResource, Error> {
        let name = name.as_ref();
        validate_name(name)?;
        Ok(FencedResource::new(self.clone(), name))
    }

    /// Whether the server's `maxmemory-policy` may evict lock hashes or fence counters, and if
    /// so, what to change. Every policy but `noeviction` can: the `volatile-*` policies pick
    /// exactly the keys with a TTL (held locks), the `allkeys-*` policies can also evict fence
    /// counters and high-water marks, and then tokens may repeat. `connect` runs this check
    /// once and logs the answer as a warning.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// if let Some(risk) = client.eviction_risk().await? {
    ///     eprintln!("{risk}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] when the user may not run `CONFIG GET`, [`Error::Redis`]
    /// when the command is refused otherwise (renamed away).
    pub async fn eviction_risk(&self) -> Result<Option<String>, Error> {
        let reply: std::collections::HashMap<String, String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut self.conn())
            .await?;
        let policy = reply
            .get("maxmemory-policy")
            .map(String::as_str)
            .unwrap_or("noeviction");
        let evicts = match policy {
            "noeviction" => return Ok(None),
            p if p.starts_with("volatile") => "held locks (they have a TTL)",
            _ => "held locks, fence counters and fenced resources' high-water marks",
        };
        Ok(Some(format!(
            "redis maxmemory-policy is {policy}: under memory pressure it can evict {evicts}, \
             which breaks mutual exclusion or token monotonicity; set maxmemory-policy \
             noeviction (or keep locks on a Redis without maxmemory)"
        )))
    }

    /// This client's random id (a UUID v4): the first part of every holder and operation id it
    /// issues, so operators can tell which process holds a lock.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The reservation grace of fair handoff
    /// ([`LockClientBuilder::fair_handoff`]), or `None` when the client is in the default mode.
    pub fn fair_handoff(&self) -> Option<Duration> {
        self.inner.config.fair_grace
    }

    /// The fair-mode part of an acquire attempt, `None` in the default mode.
    pub(crate) fn fair_attempt(&self, enqueue: bool) -> Option<crate::protocol::FairAttempt<'_>> {
        self.inner
            .config
            .fair_grace
            .map(|grace| crate::protocol::FairAttempt {
                client: &self.inner.id,
                enqueue,
                queue_slack: grace * 2 + FAIR_QUEUE_SLACK,
            })
    }

    /// The key prefix this client works under.
    pub fn prefix(&self) -> &[u8] {
        &self.inner.config.prefix
    }

    /// The lease used by locks that have none of their own.
    pub fn default_lease(&self) -> Duration {
        self.inner.config.default_lease
    }

    /// How many held locks this client's watchdog keeps alive right now.
    pub fn watched_locks(&self) -> usize {
        self.inner.watchdog.len()
    }

    /// How many renewal script calls the watchdog has sent since the client connected; each
    /// renews up to [`LockClientBuilder::renew_batch`] locks.
    pub fn renewal_calls(&self) -> u64 {
        self.inner.watchdog.calls()
    }

    /// How many connections reserved for replicated acquisitions are open and idle. They are
    /// opened on first use and never carry anything but an acquisition script and its `WAIT`.
    pub fn replica_ack_connections(&self) -> usize {
        self.inner.acks.idle()
    }

    /// A fresh id for a holder or an operation: unique across clients (random client id) and
    /// within this one (sequence number).
    pub(crate) fn next_id(&self) -> String {
        let seq = self.inner.next_seq.fetch_add(1, Ordering::Relaxed);
        format!("{}:{seq}", self.inner.id)
    }

    pub(crate) fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    /// Runs one protocol call with this client's negative control in scope (test-only
    /// feature); without the feature, or without a control, this is the call itself.
    pub(crate) async fn controlled<T>(&self, call: impl Future<Output = T>) -> T {
        #[cfg(feature = "negative-controls")]
        if let Some(control) = self.inner.config.control {
            return crate::testing::controls::scoped(control, call).await;
        }
        call.await
    }

    /// Whether this client runs `control` (test-only feature).
    #[cfg(feature = "negative-controls")]
    pub(crate) fn broken(&self, control: crate::testing::controls::Control) -> bool {
        self.inner.config.control == Some(control)
    }

    /// Runs one idempotent operation, re-sending it while its outcome is unknown (timeout,
    /// dropped connection, server loading) and the retry window is open. Every caller passes
    /// the same operation id on each attempt, so the server applies it at most once.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(5);
        loop {
            // Not through `controlled`: an async fn keeps its argument and the future it
            // awaits side by side, which would double this (hot, large) future.
            let call = attempt(self.conn());
            #[cfg(feature = "negative-controls")]
            let outcome = match self.inner.config.control {
                Some(control) => crate::testing::controls::scoped(control, call).await,
                None => call.await,
            };
            #[cfg(not(feature = "negative-controls"))]
            let outcome = call.await;
            match outcome {
                Err(err)
                    if is_transient(&err)
                        && started.elapsed() + backoff < self.inner.config.retry_window =>
                {
                    tracing::debug!(error = %err, "retrying lock operation with the same id");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                }
                outcome => return outcome,
            }
        }
    }
}

#[cfg(not(feature = "tls"))]
pub(crate) fn open_client(
    info: redis::ConnectionInfo,
    _config: &ClientConfig,
) -> Result<redis::Client, Error> {
    Ok(redis::Client::open(info)?)
}

#[cfg(feature = "tls")]
pub(crate) fn open_client(
    info: redis::ConnectionInfo,
    config: &ClientConfig,
) -> Result<redis::Client, Error> {
    let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    if tls && rustls::crypto::CryptoProvider::get_default().is_none() {
        // rustls needs a process-wide provider when the dependency graph enables more than
        // one; ours is ring. An application that installed its own keeps it.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let Some(root_ca) = &config.tls_root_ca else {
        return Ok(redis::Client::open(info)?);
    };
    if !tls {
        return Err(Error::InvalidConfig {
            reason: "a TLS root CA needs a rediss:// URL".into(),
        });
    }
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_ca.clone()),
    };
    redis::Client::build_with_tls(info, certificates).map_err(|err| Error::InvalidConfig {
        reason: format!("unusable TLS root CA: {err}"),
    })
}

/// Routes the push messages of a connection to the client's waiters. Holds the waiters weakly:
/// the connection must not keep a dropped client's queues alive.
fn push_handler(waiters: &Arc<Waiters>) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync {
    let dispatch = Arc::downgrade(waiters);
    move |push: PushInfo| {
        let Some(waiters) = dispatch.upgrade() else {
            return Err(());
        };
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    waiters.on_release(channel);
                }
            }
            // A release published while we were disconnected is lost for good: every
            // waiting head goes back to Redis instead of waiting out the lease.
            PushKind::Disconnection => waiters.on_reconnect(),
            // The server drops a sharded subscription by itself when the channel's slot moves
            // to another node (resharding, failover): subscribe again, now at the new owner.
            PushKind::SUnsubscribe => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    waiters.on_lost_subscription(channel);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

async fn connect_standalone(
    url: &str,
    config: &ClientConfig,
    waiters: &Arc<Waiters>,
) -> Result<(ConnectionManager, redis::Client), Error> {
    let info = url.into_connection_info()?;
    // RESP3 lets release notifications arrive as push messages on the same multiplexed
    // connection as the commands, so there is no second connection to lose.
    let redis_settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let info = info.set_redis_settings(redis_settings);
    let client = open_client(info, config)?;
    let manager = connect_manager(client.clone(), config, waiters).await?;
    Ok((manager, client))
}

/// A self-reconnecting RESP3 connection to one server whose push messages go to `waiters`.
pub(crate) async fn connect_manager(
    client: redis::Client,
    config: &ClientConfig,
    waiters: &Arc<Waiters>,
) -> Result<ConnectionManager, Error> {
    let manager_config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.response_timeout))
        .set_connection_timeout(Some(config.connection_timeout))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_millis(500))
        .set_automatic_resubscription()
        .set_push_sender(push_handler(waiters));
    Ok(ConnectionManager::new_with_config(client, manager_config).await?)
}

async fn connect_cluster(
    nodes: &[String],
    config: &ClientConfig,
    waiters: &Arc<Waiters>,
) -> Result<redis::cluster_async::ClusterConnection, Error> {
    if nodes.is_empty() {
        return Err(Error::InvalidConfig {
            reason: "a cluster client needs at least one node URL".into(),
        });
    }
    let client = ClusterClientBuilder::new(nodes.to_vec())
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(push_handler(waiters))
        .response_timeout(config.response_timeout)
        .connection_timeout(config.connection_timeout)
        // The cluster client re-sends a request after MOVED, ASK, TRYAGAIN and connection
        // errors by itself; every mutating script carries its operation id, so a re-send that
        // follows an applied request replays its reply instead of applying twice.
        .retries(5)
        .max_retry_wait(500)
        .build()?;
    Ok(client.get_async_connection().await?)
}

/// Errors after which the request may or may not have run, and a re-send with the same
/// operation id is safe and may succeed.
///
/// Every I/O failure counts, whatever its kind: a response timeout, a dropped or refused
/// connection are all I/O errors in redis-rs (`is_timeout`, `is_connection_dropped` and
/// `is_connection_refusal` only narrow `is_io_error` down; the unit test below pins that), and
/// after any of them the request's fate is unknown.
pub(crate) fn is_transient(err: &Error) -> bool {
    match err {
        Error::Redis(e) => {
            e.is_io_error()
                || matches!(
                    e.code(),
                    Some("LOADING" | "TRYAGAIN" | "READONLY" | "MASTERDOWN" | "CLUSTERDOWN")
                )
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_io_failure_is_transient_and_nothing_else_is() {
        use std::io::ErrorKind as Io;
        for kind in [
            Io::TimedOut,
            Io::WouldBlock,
            Io::ConnectionReset,
            Io::ConnectionRefused,
            Io::ConnectionAborted,
            Io::BrokenPipe,
            Io::UnexpectedEof,
            Io::NotConnected,
            Io::Other,
        ] {
            let err = redis::RedisError::from(std::io::Error::from(kind));
            // What the narrower checks of redis-rs see is an I/O error too.
            assert!(err.is_io_error(), "{kind:?}");
            assert!(is_transient(&Error::Redis(err)), "{kind:?}");
        }
        let dropped = redis::RedisError::from((redis::ErrorKind::Io, "driver terminated"));
        assert!(dropped.is_connection_dropped() && dropped.is_io_error());
        assert!(is_transient(&Error::Redis(dropped)));

        let not_io = redis::RedisError::from((redis::ErrorKind::Client, "bad reply"));
        assert!(!is_transient(&Error::Redis(not_io)));
        assert!(!is_transient(&Error::Protocol("unexpected".into())));
        assert!(!is_transient(&Error::NotHeld));
    }
}
