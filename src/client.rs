//! The per-process handle to one Redis deployment.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushKind, Value};

use crate::builder::LockClientBuilder;
use crate::protocol::keys::{validate_name, LockKeys};
use crate::wait::Waiters;
use crate::watchdog::{self, Watchdog};
use crate::{Error, FencedResource, Lock};

/// Default prefix of every key and channel.
pub(crate) const DEFAULT_PREFIX: &str = "fencelock:";

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
    pub(crate) conn: ConnectionManager,
    pub(crate) config: ClientConfig,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) watchdog: Watchdog,
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
    /// `redis+unix:///path/to/socket`.
    ///
    /// # Errors
    /// [`Error::Redis`] when the server cannot be reached or refuses the connection.
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

    pub(crate) async fn connect_with(url: &str, config: ClientConfig) -> Result<LockClient, Error> {
        let info = url.into_connection_info()?;
        // RESP3 lets release notifications arrive as push messages on the same multiplexed
        // connection as the commands, so there is no second connection to lose.
        let redis_settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(redis_settings);
        let client = redis::Client::open(info)?;

        let waiters = Arc::new(Waiters::default());
        let dispatch = Arc::downgrade(&waiters);
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.connection_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_millis(500))
            .set_automatic_resubscription()
            .set_push_sender(move |push: redis::PushInfo| {
                let Some(waiters) = dispatch.upgrade() else {
                    return Err(());
                };
                match push.kind {
                    PushKind::Message => {
                        if let Some(Value::BulkString(channel)) = push.data.first() {
                            waiters.on_release(channel);
                        }
                    }
                    // A release published while we were disconnected is lost for good: every
                    // waiting head goes back to Redis instead of waiting out the lease.
                    PushKind::Disconnection => waiters.on_reconnect(),
                    _ => {}
                }
                Ok(())
            });
        let conn = ConnectionManager::new_with_config(client, manager_config).await?;
        waiters.set_connection(conn.clone());
        let inner = Arc::new(Inner {
            conn,
            config,
            waiters,
            watchdog: Watchdog::default(),
            id: uuid::Uuid::new_v4().simple().to_string(),
            next_seq: AtomicU64::new(1),
        });
        tokio::spawn(watchdog::run(Arc::downgrade(&inner)));
        let client = LockClient { inner };
        match client.eviction_risk().await {
            Ok(Some(risk)) => tracing::warn!("{risk}"),
            Ok(None) => {}
            // CONFIG may be renamed away or not granted to this user; the check is advice.
            Err(err) => tracing::debug!(error = %err, "could not read maxmemory-policy"),
        }
        Ok(client)
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
    /// [`Error::Redis`] when `CONFIG GET` is refused (renamed command, ACL).
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

    /// A fresh id for a holder or an operation: unique across clients (random client id) and
    /// within this one (sequence number).
    pub(crate) fn next_id(&self) -> String {
        let seq = self.inner.next_seq.fetch_add(1, Ordering::Relaxed);
        format!("{}:{seq}", self.inner.id)
    }

    pub(crate) fn conn(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    /// Runs one protocol call with this client's negative control in scope (test-only
    /// feature); without the feature this is the call itself.
    pub(crate) async fn controlled<T>(&self, call: impl Future<Output = T>) -> T {
        #[cfg(feature = "negative-controls")]
        return crate::testing::controls::CURRENT
            .scope(self.inner.config.control, call)
            .await;
        #[cfg(not(feature = "negative-controls"))]
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
        F: FnMut(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(5);
        loop {
            match self.controlled(attempt(self.conn())).await {
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

/// Errors after which the request may or may not have run, and a re-send with the same
/// operation id is safe and may succeed.
fn is_transient(err: &Error) -> bool {
    match err {
        Error::Redis(e) => {
            e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || matches!(
                    e.code(),
                    Some("LOADING" | "TRYAGAIN" | "READONLY" | "MASTERDOWN" | "CLUSTERDOWN")
                )
        }
        _ => false,
    }
}
