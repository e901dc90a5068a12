//! How a [`LockClient`](crate::LockClient) is made: its options, and the connect functions
//! that use them.

use std::sync::Arc;
use std::time::Duration;

use super::client::LockClient;
use crate::base::config::{validate_tag, ClientConfig, HoldExpiry, NodeAuth, Target};
use crate::base::durations::{validate_lease, whole_millis_in};
use crate::base::error::Error;
use crate::base::replica_ack::{OnShortfall, ReplicaAck};
use crate::engine::{Engine, PermissionScope};
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::Control;
use crate::protocol::keys::validate_prefix;
use crate::protocol::server::ServerInfo;

#[cfg(feature = "tls")]
const CERT_PEM_HEADER: &[u8] = b"-----BEGIN CERTIFICATE-----";

/// Configures and connects a [`LockClient`].
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use std::time::Duration;
/// use fencelock::LockClient;
///
/// let client = LockClient::builder("redis://127.0.0.1:7000/")
///     .prefix("shop:locks:")
///     .default_lease(Duration::from_secs(10))
///     .response_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct LockClientBuilder {
    target: Target,
    config: ClientConfig,
    on_shortfall: OnShortfall,
    node_auth: Option<NodeAuth>,
    #[cfg(fencelock_negative_controls)]
    control: Option<Control>,
}

impl LockClientBuilder {
    pub(crate) fn with_target(target: Target) -> Self {
        LockClientBuilder {
            target,
            config: ClientConfig::default(),
            on_shortfall: OnShortfall::default(),
            node_auth: None,
            #[cfg(fencelock_negative_controls)]
            control: None,
        }
    }

    setters! {
        /// Prefix of every key and channel this client touches (default `fencelock:`). It must not
        /// contain `{` or `}`: fencelock places its own hash tag after it. Clients that share locks
        /// must use the same prefix.
        fn prefix(prefix: impl AsRef<[u8]>) -> Self => config.prefix = prefix.as_ref().to_vec();

        /// Lease of locks that are acquired without one of their own (default 30 s). Such locks
        /// are kept alive by the client's watchdog, which renews them every third of this lease
        /// for as long as their guards live; a lock with its own lease
        /// ([`Lock::with_lease`](crate::Lock::with_lease)) is not renewed and ends when its
        /// lease does.
        fn default_lease(lease: Duration) -> Self => config.default_lease;

        /// How long one request waits for its reply before it counts as failed (default 1 s;
        /// redis-rs' own default is 500 ms). A timed-out request may still run on the server,
        /// which is why every mutating request is retried with its operation id, never as a new
        /// operation.
        fn response_timeout(timeout: Duration) -> Self => config.response_timeout;

        /// How long one connection attempt may take (default 1 s).
        fn connection_timeout(timeout: Duration) -> Self => config.connection_timeout;

        /// How long an operation whose outcome is unknown (timeout, dropped connection) is retried
        /// with the same operation id before the error is returned (default 3 s). Must be shorter
        /// than half the operation-record lifetime.
        fn retry_window(window: Duration) -> Self => config.retry_window;

        /// How long Redis keeps the record of an applied re-entry or release, so that a re-sent
        /// request replays instead of applying twice (default 10 s). Memory on the server is about
        /// 100 bytes times releases per second times this.
        fn op_record_ttl(ttl: Duration) -> Self => config.op_record_ttl;

        /// How many locks one renewal script call renews at most (default 100, at most 1000). The
        /// watchdog renews every held lock of the client once per third of the default lease,
        /// with `ceil(held / renew_batch)` script calls; on a cluster, where one call cannot span
        /// hash slots, with that many calls per slot that holds locks.
        fn renew_batch(locks: usize) -> Self => config.renew_batch;

        /// How many reads of one read-write lock, or releases of holds of one semaphore or
        /// read-write lock, one script call of this client carries at most (at most 1000; default
        /// 64; 1: each goes alone, pipelined with the others).
        ///
        /// A read or release goes at once when no call of its kind for the same lock is on the
        /// wire; those that arrive while one is ride the next call together
        /// (`rw_read_many.lua`, `sem_release_many.lua`), which does the work they share once: the
        /// clock, the hash of holders, the check for writers, one write of all the grants, one
        /// wake-up. Each keeps its own reply, error, retry and undo. 64 readers of one lock on
        /// four clients reach 0.54 of the raw limit this way against 0.33 one by one
        /// (BENCHMARKS.md, W10). The price: a read that meets a call in flight for its lock
        /// waits for that call to return (at most one round trip) before its own goes.
        /// DESIGN.md §7.3 has the details.
        ///
        /// ```no_run
        /// # async fn demo() -> Result<(), fencelock::Error> {
        /// // Every read and release by its own script call.
        /// let client = fencelock::LockClient::builder("redis://127.0.0.1:7000/")
        ///     .hold_batch(1)
        ///     .connect()
        ///     .await?;
        /// # Ok(()) }
        /// ```
        fn hold_batch(operations: usize) -> Self => config.hold_batch;

        /// Trusts the CA certificates in `pem` (PEM, one or more) for a `rediss://` server, instead
        /// of the system's root certificates: for a Redis whose certificate is signed by a private
        /// CA. Feature `tls`.
        ///
        /// Without it, a `rediss://` server must present a certificate that chains to a root the
        /// system trusts; one that does not is refused during `connect` with [`Error::Redis`]
        /// (`is_connection()`, nothing sent). Connecting with TLS installs rustls' *ring* provider
        /// as the process' default, unless the process installed one before.
        ///
        /// ```no_run
        /// # async fn demo() -> Result<(), fencelock::Error> {
        /// let ca = std::fs::read("/etc/redis/ca.crt").expect("CA file");
        /// let client = fencelock::LockClient::builder("rediss://redis.internal:6380/")
        ///     .tls_root_ca(ca)
        ///     .connect()
        ///     .await?;
        /// # Ok(()) }
        /// ```
        #[cfg(feature = "tls")]
        #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
        fn tls_root_ca(pem: impl Into<Vec<u8>>) -> Self => config.tls_root_ca = Some(pem.into());

        /// Opt-in **fair handoff across clients**: a lock released while other clients wait goes
        /// to the client that has waited longest, instead of to whichever process reaches Redis
        /// first after the release message (usually the releasing one, which is awake).
        ///
        /// Turn it on when the longest wait across processes must stay bounded: in the benchmark
        /// of 4 processes × 4 tasks on one lock (BENCHMARKS.md, W4) the default mode's longest wait
        /// was 12.7× the mean, this mode's 4.3×, at about 17 % fewer acquisitions per second.
        ///
        /// A waiting client whose attempt finds the lock held joins the lock's queue in Redis (one
        /// entry per client: only the head of a client's local FIFO queue ever goes to Redis). The
        /// release that frees the lock leaves it *reserved* for the first queued client for at
        /// most `grace`; that client's first waiter claims it with a fresh token, and everyone
        /// else sees the lock held meanwhile. A client whose last waiter gives up (timeout,
        /// cancellation) leaves the queue and passes such a reservation on; a reserved client that
        /// crashed costs at most `grace` (plus the waiters' random 0–20 ms timer jitter), after
        /// which the lock is free for anyone. Choose `grace` well above the time a live process
        /// needs to answer a release message (tens of ms on a busy host); 100 ms to 1 s is
        /// typical.
        ///
        /// The mode is per client (the queue holds client ids), and **every client of a lock must
        /// use the same mode**: a default-mode client's release ignores the queue (nothing
        /// unsafe happens: holders still exclude each other and tokens still increase, but the
        /// order is a race again). [`try_acquire`](crate::Lock::try_acquire) never queues. The
        /// default mode is untouched by this option: it runs other scripts. See "Fair handoff" in
        /// DESIGN.md.
        ///
        /// `connect` fails with [`Error::InvalidConfig`] for a grace outside 1 ms..=60 s or not a
        /// whole number of milliseconds. Multi-locks are single-lock only in this mode:
        /// [`LockClient::multi_lock`](crate::LockClient::multi_lock) refuses them with
        /// [`Error::InvalidLockSet`].
        ///
        /// ```no_run
        /// # async fn demo() -> Result<(), fencelock::Error> {
        /// use std::time::Duration;
        /// let client = fencelock::LockClient::builder("redis://127.0.0.1:7000/")
        ///     .fair_handoff(Duration::from_millis(250))
        ///     .connect()
        ///     .await?;
        /// # Ok(()) }
        /// ```
        fn fair_handoff(grace: Duration) -> Self => config.fair_grace = Some(grace);

        /// How the semaphores and read-write locks this client creates keep each hold's lease
        /// deadline (default [`HoldExpiry::Auto`]: hash-field expiry where the server has it).
        /// A semaphore keeps the way it was created with while it exists, whichever client
        /// touches it, so clients with different settings share it correctly.
        /// [`LockClient::hold_expiry`](crate::LockClient::hold_expiry) says which way a client
        /// chose.
        ///
        /// `connect` fails with [`Error::UnsupportedServer`] for [`HoldExpiry::FieldExpiry`] on a
        /// server without hash-field expiry (Redis before 7.4, Valkey before 9.0).
        fn hold_expiry(expiry: HoldExpiry) -> Self => config.hold_expiry;

        /// The name operators see for this client's holds (`fencelock list`, `show`, the admin
        /// API): the service and instance, say `checkout-7f9c`. Default: the host name and the
        /// process id (`web-3:41872`). Registered once at connect under
        /// `prefix{tag}client:<client id>` and kept there while the client lives (refreshed
        /// twice a day, expiring a day after its client is gone); no acquisition sends it.
        /// 1 to 256 bytes of UTF-8 without control characters, or `connect` fails with
        /// [`Error::InvalidConfig`].
        ///
        /// ```no_run
        /// # async fn demo() -> Result<(), fencelock::Error> {
        /// let client = fencelock::LockClient::builder("redis://127.0.0.1:7000/")
        ///     .client_name("checkout-7f9c")
        ///     .connect()
        ///     .await?;
        /// assert_eq!(client.name(), "checkout-7f9c");
        /// # Ok(()) }
        /// ```
        fn client_name(name: impl Into<String>) -> Self => config.client_name = name.into();

        /// Report every hold of this client that is held `max_hold` or longer, once per hold: a
        /// WARN event `fencelock.long_hold` (lock, holder, token, the acquisition's
        /// [label](crate::Lock::with_label), time held) and the counter
        /// `fencelock_long_holds_total` (feature `metrics`). For a stuck task or a forgotten guard
        /// that the watchdog would otherwise keep alive forever. Checked on the client, by the
        /// watchdog, every third of the default lease (10 s by default), so a report comes up to
        /// that much after the bound; holds with a lease of their own are checked too, and no
        /// server call is added. Default: no bound.
        ///
        /// ```no_run
        /// # async fn demo() -> Result<(), fencelock::Error> {
        /// use std::time::Duration;
        /// let client = fencelock::LockClient::builder("redis://127.0.0.1:7000/")
        ///     .max_hold(Duration::from_secs(300))
        ///     .connect()
        ///     .await?;
        /// # Ok(()) }
        /// ```
        fn max_hold(max_hold: Duration) -> Self => config.max_hold = Some(max_hold);

        /// Whether this client's waiting acquisitions record their waits for operators (default
        /// `true`): the head of each local queue writes one small record once its wait has lasted
        /// a second (refreshed only when it could expire before the next attempt, deleted when
        /// the wait ends), in the background, so `fencelock waits` and the possible-deadlock
        /// report (`doctor`,
        /// [`Admin::possible_deadlocks`](crate::admin::Admin::possible_deadlocks)) see it. Off, a
        /// contended acquisition sends only its attempts, and this client's waits are invisible to
        /// both. The uncontended path never records.
        fn record_waits(record: bool) -> Self => config.record_waits;

        /// Every acquisition of this client's locks (unless a lock sets its own with
        /// [`Lock::with_replica_ack`](crate::Lock::with_replica_ack)) returns only after
        /// `replicas` replicas confirmed it with `WAIT replicas timeout`. When fewer confirm
        /// within `timeout` the acquisition is rolled back and fails with
        /// [`Error::ReplicationTimeout`](crate::Error::ReplicationTimeout), or returns a guard
        /// marked unreplicated if [`on_replica_shortfall`](Self::on_replica_shortfall) says so.
        ///
        /// The script and its `WAIT` run on a connection reserved for them (a small pool), never
        /// on the shared one, so a slow replica delays only replicated acquisitions. That
        /// connection goes to the primary that holds the lock: the server, the primary the
        /// Sentinels name now, or on a cluster the primary that owns the lock's slot (`replicas`
        /// counts replicas of that shard). Re-entries, extensions and watchdog renewals do not
        /// wait. `WAIT` is not consensus: see "Replica acknowledgement" in DESIGN.md for what
        /// this buys and what it does not.
        ///
        /// `connect` fails with [`Error::InvalidConfig`](crate::Error::InvalidConfig) for zero
        /// replicas or a timeout outside 1 ms..=60 s (whole milliseconds).
        fn replica_ack(replicas: u32, timeout: Duration) -> Self
            => config.replica_ack = Some(ReplicaAck {
                replicas,
                timeout,
                on_shortfall: OnShortfall::Fail,
            });

        /// What acquisitions with [`replica_ack`](Self::replica_ack) do when too few replicas
        /// confirm in time (default [`OnShortfall::Fail`]). Without `replica_ack` it has no
        /// effect.
        fn on_replica_shortfall(policy: OnShortfall) -> Self => on_shortfall;

        /// Sentinel clients only: authenticate to the primary (and, after a failover, to the
        /// replica promoted in its place) as `username` (an ACL user; `None` for the `default`
        /// user of `requirepass`) with `password`. The Sentinels' own credentials, if they need
        /// any, go in their URLs (`redis://:password@host:port`); these are for the data nodes,
        /// whose addresses the Sentinels hand out without credentials. The same credentials
        /// serve the connections of [`replica_ack`](Self::replica_ack).
        ///
        /// ```no_run
        /// # async fn demo() -> Result<(), fencelock::Error> {
        /// let client = fencelock::LockClient::sentinel_builder(["redis://127.0.0.1:26380"], "mymaster")
        ///     .sentinel_node_auth(Some("fencelock"), "s3cret")
        ///     .connect()
        ///     .await?;
        /// # Ok(()) }
        /// ```
        ///
        /// `connect` fails with [`Error::InvalidConfig`] on a client that is not a Sentinel
        /// client (one server or a cluster take their credentials from their URLs).
        fn sentinel_node_auth(username: Option<&str>, password: impl Into<String>) -> Self
            => node_auth = Some(NodeAuth {
                username: username.map(str::to_owned),
                password: password.into(),
            });

        /// TEST BUILDS ONLY (`--cfg fencelock_negative_controls`): makes this client use a
        /// deliberately broken variant of the protocol, to prove that the property tests catch
        /// it.
        #[cfg(fencelock_negative_controls)]
        #[doc(hidden)]
        fn negative_control(control: Control) -> Self => control = Some(control);
    }

    /// Checks the options, connects, and starts the client's background work.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] or [`Error::InvalidLease`] for unusable options (nothing is
    /// sent; with feature `tls`, also a root CA that is not PEM or is given for a URL that is
    /// not `rediss://`, or for a cluster or Sentinel client); [`Error::Redis`] when the server
    /// cannot be reached or refuses the connection; [`Error::PermissionDenied`] when the Redis
    /// user lacks a command the scripts send (checked here; see
    /// [`LockClient::connect`](crate::LockClient::connect)).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped `connect` leaves nothing behind but a closed connection.
    pub async fn connect(mut self) -> Result<LockClient, Error> {
        if let Some(ack) = &mut self.config.replica_ack {
            ack.on_shortfall = self.on_shortfall;
        }
        validate_prefix(&self.config.prefix)?;
        validate_lease(self.config.default_lease)?;
        let c = &self.config;
        let invalid = |reason: &str| {
            Err(Error::InvalidConfig {
                reason: reason.into(),
            })
        };
        if c.response_timeout.is_zero() || c.connection_timeout.is_zero() {
            return invalid("timeouts must be above zero");
        }
        if c.op_record_ttl < Duration::from_millis(1) || c.retry_window * 2 > c.op_record_ttl {
            return invalid(
                "the retry window must be at most half the operation-record lifetime, or a late \
                 retry could apply twice",
            );
        }
        // rustls skips what is not a certificate, so garbage would silently leave an empty
        // trust store and fail later as an unknown issuer.
        #[cfg(feature = "tls")]
        if let Some(pem) = &c.tls_root_ca {
            if !pem
                .windows(CERT_PEM_HEADER.len())
                .any(|w| w == CERT_PEM_HEADER)
            {
                return invalid("the TLS root CA holds no PEM certificate");
            }
        }
        validate_tag("client name", &c.client_name)?;
        if c.max_hold.is_some_and(|max| max.is_zero()) {
            return invalid("max_hold must be above zero");
        }
        for (name, cap) in [("hold_batch", c.hold_batch), ("renew_batch", c.renew_batch)] {
            if !(1..=1000).contains(&cap) {
                return invalid(&format!("{name} must be between 1 and 1000"));
            }
        }
        let grace_ok = |grace| {
            whole_millis_in(grace, Duration::from_millis(1), Duration::from_secs(60)).is_ok()
        };
        if !c.fair_grace.is_none_or(grace_ok) {
            return invalid(
                "the fair-handoff grace must be a whole number of milliseconds between 1 ms and \
                 60 s",
            );
        }
        if let Some(ack) = c.replica_ack {
            ReplicaAck::new(ack.replicas, ack.timeout, ack.on_shortfall)?;
        }
        if self.node_auth.is_some() && !matches!(self.target, Target::Sentinel { .. }) {
            return invalid(
                "sentinel_node_auth is for Sentinel clients; a server or a cluster takes its \
                 credentials from its URL",
            );
        }
        LockClient::connect_with(
            &self.target,
            self.config,
            self.node_auth,
            #[cfg(fencelock_negative_controls)]
            self.control,
        )
        .await
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
    /// scripts send on this client's keys (checked at connect; the error names
    /// the missing commands, README "Security" lists them).
    ///
    /// # Cancel safety
    /// Cancel safe: a `connect` dropped at any await (connecting, the permission check, the
    /// eviction check) leaves nothing behind but a closed connection; nothing is written.
    pub async fn connect(url: &str) -> Result<LockClient, Error> {
        LockClient::builder(url).connect().await
    }

    /// Starts configuring a client; see [`LockClientBuilder`].
    pub fn builder(url: impl Into<String>) -> LockClientBuilder {
        LockClientBuilder::with_target(Target::Standalone(url.into()))
    }

    /// Connects to a Redis Cluster with default options; see [`LockClient::cluster_builder`].
    ///
    /// # Errors
    /// [`Error::Redis`] when no node can be reached or the cluster refuses the connection;
    /// [`Error::PermissionDenied`] when the Redis user lacks a command the scripts send (as
    /// for [`LockClient::connect`]).
    ///
    /// # Cancel safety
    /// As [`LockClient::connect`].
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
    /// As [`LockClient::connect`].
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
        #[cfg(fencelock_negative_controls)] control: Option<Control>,
    ) -> Result<LockClient, Error> {
        let engine = Engine::connect(
            target,
            config,
            node_auth,
            #[cfg(fencelock_negative_controls)]
            control,
        )
        .await?;
        let client = LockClient { engine };
        let server = client.server();
        if !server.is_at_least_tested() {
            tracing::warn!(
                name: "fencelock.untested_server",
                server = %server,
                tested = %ServerInfo::tested_matrix(),
                "this server release is older than every tested one of its kind"
            );
        }
        client
            .engine
            .check_permissions(PermissionScope::Locks)
            .await?;
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
        // The name is advice for operators, never needed by a lock: a server that cannot take it
        // now (busy with a script, say) gets it from the background task shortly.
        let registered = client.engine.try_register_name().await;
        tokio::spawn(crate::engine::keep_name_registered(
            Arc::downgrade(&client.engine),
            registered,
        ));
        Ok(client)
    }
}
