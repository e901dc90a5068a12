//! The per-process handle to one Redis deployment.
//!
//! How a client is made (`connect`, the builders) lives in `builder.rs`, and what it makes
//! (`lock`, `multi_lock`, `resource`) next to the type it makes, so this file depends on no other
//! file of the API.

use std::sync::Arc;
use std::time::Duration;

use crate::base::config::HoldExpiry;
use crate::base::error::Error;
use crate::engine::Engine;
use crate::protocol::server::{EvictionRisk, ServerInfo};

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
    pub(crate) engine: Arc<Engine>,
}

debug_struct!(LockClient(self) {
    id: self.engine.id,
    prefix: String::from_utf8_lossy(&self.engine.config.prefix),
} ..);

impl LockClient {
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
    ///
    /// # Cancel safety
    /// Cancel safe: one `CONFIG GET`, no write; a dropped call leaves the server as it was.
    pub async fn eviction_risk(&self) -> Result<Option<String>, Error> {
        let reply: std::collections::HashMap<String, String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut self.engine.conn())
            .await?;
        let policy = reply
            .get("maxmemory-policy")
            .map(String::as_str)
            .unwrap_or("noeviction");
        Ok(EvictionRisk::of(policy).map(|risk| risk.to_string()))
    }

    getters! {
        /// This client's random id (a UUID v4): the first part of every holder and operation id it
        /// issues, so operators can tell which process holds a lock.
        fn id(&self) -> &str => &self.engine.id;

        /// The name operators see for this client's holds
        /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name); default the
        /// host name and process id).
        fn name(&self) -> &str => &self.engine.config.client_name;

        /// The reservation grace of fair handoff
        /// ([`LockClientBuilder::fair_handoff`](crate::LockClientBuilder::fair_handoff)), or `None`
        /// when the client is in the default mode.
        fn fair_handoff(&self) -> Option<Duration> => self.engine.config.fair_grace;

        /// What the server is: its flavour (Redis, Valkey) and version, from the `HELLO` it
        /// answered at connect (on a cluster, the node that answered).
        fn server(&self) -> &ServerInfo => &self.engine.server;

        /// The key prefix this client works under.
        fn prefix(&self) -> &[u8] => &self.engine.config.prefix;

        /// The lease used by locks that have none of their own.
        fn default_lease(&self) -> Duration => self.engine.config.default_lease;

        /// How many held locks this client's watchdog keeps alive right now: a gauge to export
        /// next to the metrics of [`observability`](crate::observability). It counts the live holds
        /// without a lease of their own; one that only grows says guards are kept alive (and so
        /// their locks held) somewhere they should have been released.
        ///
        /// ```no_run
        /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
        /// let guard = client.lock("report")?.acquire().await?;
        /// assert_eq!(client.watched_locks(), 1);
        /// guard.release().await?;
        /// assert_eq!(client.watched_locks(), 0);
        /// # Ok(()) }
        /// ```
        fn watched_locks(&self) -> usize => self.engine.watchdog.len();

        /// How many renewal script calls the watchdog has sent since the client connected; each
        /// renews up to [`LockClientBuilder::renew_batch`](crate::LockClientBuilder::renew_batch)
        /// locks. The load the watchdog puts on Redis, as a counter
        /// (`fencelock_renewal_calls_total` with the `metrics` feature): about `ceil(watched_locks
        /// / renew_batch)` calls per third of the default lease, per slot on a cluster.
        fn renewal_calls(&self) -> u64 => self.engine.watchdog.calls();

        /// How many connections reserved for replicated acquisitions are open and idle, a gauge
        /// for the connection budget of the server: they come on top of the client's one shared
        /// connection, are opened on first use (at most 8 per node) and never carry anything but
        /// an acquisition script and its `WAIT`. Always 0 for a client that never acquires with
        /// [`replica_ack`](crate::LockClientBuilder::replica_ack).
        fn replica_ack_connections(&self) -> usize => self.engine.acks.idle();
    }

    /// How the semaphores and read-write locks this client creates keep each hold's
    /// deadline: [`HoldExpiry::LeaseZset`] or [`HoldExpiry::FieldExpiry`], as its builder's
    /// [`hold_expiry`](crate::LockClientBuilder::hold_expiry) resolved against the server at
    /// connect.
    pub fn hold_expiry(&self) -> HoldExpiry {
        if self.engine.field_expiry {
            HoldExpiry::FieldExpiry
        } else {
            HoldExpiry::LeaseZset
        }
    }
}
