//! A client's settings once its builder checked them, and what it connects to. Every layer
//! reads them; only `api::builder` writes them.

use std::time::Duration;

use super::error::Error;
use super::replica_ack::ReplicaAck;

/// Default prefix of every key and channel.
pub(crate) const DEFAULT_PREFIX: &str = "fencelock:";

/// How long a fair-handoff queue outlives, beyond the holder's lease and twice the grace, the
/// last failed attempt that refreshed it: waiting heads try again at least once per lease (their
/// fallback timer) and on every release, so a live client's entry is refreshed well within it.
pub(crate) const FAIR_QUEUE_SLACK: Duration = Duration::from_secs(1);

/// How long a fair-handoff queue lives after a release that queued its client again: the
/// grace plus the slack of a failed attempt (the waiters' next attempts refresh it).
pub(crate) fn fair_queue_life(grace: Duration) -> Duration {
    grace * 3 + FAIR_QUEUE_SLACK
}

/// How semaphores and read-write locks keep each hold's lease deadline in Redis (DESIGN.md
/// §20): chosen by the client that creates a semaphore (or read-write lock) and kept in it
/// while it exists, so clients that choose differently share it correctly.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use fencelock::HoldExpiry;
/// let client = fencelock::LockClient::builder("redis://127.0.0.1:7000/")
///     .hold_expiry(HoldExpiry::LeaseZset)
///     .connect()
///     .await?;
/// assert_eq!(client.hold_expiry(), HoldExpiry::LeaseZset);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HoldExpiry {
    /// [`FieldExpiry`](Self::FieldExpiry) where the server has hash-field expiry (Redis
    /// 7.4+, Valkey 9.0+; read from `HELLO` at connect), else [`LeaseZset`](Self::LeaseZset).
    #[default]
    Auto,
    /// A sorted set of deadlines beside the semaphore's hash; the scripts drop the holds
    /// whose deadline passed. Every server.
    LeaseZset,
    /// Each hold's hash field expires at its deadline (`HPEXPIREAT`), so the server drops it;
    /// no second key. `connect` fails with [`Error::UnsupportedServer`](crate::Error) on a
    /// server without hash-field expiry.
    FieldExpiry,
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
    /// How many reads of one read-write lock, or releases of holds of one semaphore or
    /// read-write lock, one script call carries at most (`engine::batch`; 64 by default, 1:
    /// each goes alone).
    pub(crate) hold_batch: usize,
    /// PEM certificates of the CAs a `rediss://` server's certificate must chain to, instead
    /// of the system's roots.
    #[cfg(feature = "tls")]
    pub(crate) tls_root_ca: Option<Vec<u8>>,
    /// Replica acknowledgement every lock of the client requires unless it sets its own.
    pub(crate) replica_ack: Option<ReplicaAck>,
    /// Fair handoff across clients (`acquire_fair.lua`, `release_fair.lua`) and the grace a
    /// reservation waits for its client; `None`: the default mode.
    pub(crate) fair_grace: Option<Duration>,
    /// How the semaphores and read-write locks this client creates keep their deadlines.
    pub(crate) hold_expiry: HoldExpiry,
    /// What operators see for this client's holds (registered at connect, section 11 of
    /// DESIGN.md); the host name and process id unless set.
    pub(crate) client_name: String,
    /// Holds older than this are reported once each (`fencelock.long_hold`); none when unset.
    pub(crate) max_hold: Option<Duration>,
    /// Whether waiting heads record their waits for operators (section 11 of DESIGN.md).
    pub(crate) record_waits: bool,
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
            hold_batch: 64,
            client_name: default_client_name(),
            max_hold: None,
            record_waits: true,
            #[cfg(feature = "tls")]
            tls_root_ca: None,
            replica_ack: None,
            fair_grace: None,
            hold_expiry: HoldExpiry::Auto,
        }
    }
}

/// Credentials for the data nodes of a Sentinel group (the Sentinels' own go in their URLs).
#[derive(Clone)]
pub(crate) struct NodeAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

impl std::fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The deployment a client connects to.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// One server (or a primary reached by a fixed address).
    Standalone(String),
    /// A Redis Cluster, through any of these seed nodes.
    Cluster(Vec<String>),
    /// The primary that these Sentinels monitor under `master`.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

/// The longest client name or acquisition label accepted, in bytes.
pub(crate) const MAX_TAG_LEN: usize = 256;

/// Checks a client name or an acquisition label (`what`): 1 to [`MAX_TAG_LEN`] bytes of UTF-8
/// without control characters, so it prints on one line of `fencelock list`.
pub(crate) fn validate_tag(what: &str, tag: &str) -> Result<(), Error> {
    if tag.is_empty() || tag.len() > MAX_TAG_LEN || tag.chars().any(char::is_control) {
        return Err(Error::InvalidConfig {
            reason: format!(
                "a {what} has 1 to {MAX_TAG_LEN} bytes and no control characters; {tag:?} does not"
            ),
        });
    }
    Ok(())
}

/// An acquisition label, checked as [`validate_tag`] checks it, ready to be kept by a handle.
pub(crate) fn checked_label(label: &str) -> Result<std::sync::Arc<str>, Error> {
    validate_tag("label", label)?;
    Ok(label.into())
}

/// `<host name>:<process id>`. The host name is read by hand (the kernel's file on Linux, the
/// usual environment variables elsewhere): the standard library has no call for it, and a
/// crate for one line of fallback is not worth a dependency.
pub(crate) fn default_client_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}:{}", std::process::id())
}
