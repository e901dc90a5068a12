//! The engine: the per-client machinery under the public API. One [`Engine`] per connected
//! client holds its connection, its ids, its waiters ([`wait`]), its watchdog ([`watchdog`])
//! and its pool for replicated acquisitions; a [`holder::Holder`] is what one acquisition
//! holds, and a [`pending::PendingOp`] undoes an operation nobody waits for any more. Requests
//! whose outcome is unknown are re-sent by [`Engine::retrying`], with the one retry policy
//! (`base::retry`).
//!
//! Nothing here is public, and nothing here knows the public types: `LockClient`, `Lock`
//! and the guards wrap these.

pub(crate) mod acquisition;
pub(crate) mod batch;
pub(crate) mod handoff;
pub(crate) mod hold;
pub(crate) mod holder;
pub(crate) mod pending;
pub(crate) mod wait;
pub(crate) mod wait_record;
pub(crate) mod watchdog;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::base::config::{ClientConfig, HoldExpiry, NodeAuth, Target};
use crate::base::error::Error;
use crate::base::replica_ack::{Acks, ReplicaAck};
use crate::base::retry::{resend_after, retry, Resends};
use crate::protocol::batch::{HoldRelease, ReadOperation};
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::{self, Control};
use crate::protocol::keys::{client_key, LockKeys};
use crate::protocol::server::{self, ServerInfo};
use crate::protocol::{self, FairAttempt, PermissionsReply};
use crate::transport::ack_pool::{AckConnections, AckRoute};
use crate::transport::slot_map::ClusterRoute;
use crate::transport::{
    cluster, sentinel, standalone, Conn, Connections, PushListener, ReconnectingConn,
};
use batch::{Batcher, Route};
use wait::Waiters;
use watchdog::Watchdog;

/// Everything one client shares between its clones, its locks and its holders.
pub(crate) struct Engine {
    pub(crate) conn: Conn,
    /// The group commit of reads of read-write locks ([`batch`]).
    reads: Arc<Batcher<ReadOperation>>,
    /// The group commit of releases of semaphores' and read-write locks' holds ([`batch`]).
    hold_releases: Arc<Batcher<HoldRelease>>,
    pub(crate) config: ClientConfig,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) watchdog: Watchdog,
    /// Connections reserved for replicated acquisitions (script + `WAIT`), per node, opened on
    /// first use; a set of acquisitions acknowledged at once (a multi-lock's members) takes a
    /// session of its own.
    pub(crate) acks: AckConnections,
    /// A random UUID v4: the first part of every holder and operation id of this client.
    pub(crate) id: String,
    /// What the server is (`HELLO` at connect).
    pub(crate) server: ServerInfo,
    /// Whether the semaphores and read-write locks this client creates keep their deadlines
    /// as hash-field expiry ([`HoldExpiry`] resolved against the server at connect).
    pub(crate) field_expiry: bool,
    next_seq: AtomicU64,
    /// Whether the user's permissions for semaphores and read-write locks were checked and
    /// granted ([`Engine::check_permissions`]).
    holds_permitted: AtomicBool,
    /// A deliberately broken protocol variant (test builds only; `None` is the real protocol).
    #[cfg(fencelock_negative_controls)]
    pub(crate) control: Option<Control>,
}

/// How long a client's registered name is kept after its last refresh: a client gone for a day
/// leaves nothing behind.
pub(crate) const NAME_KEPT: Duration = Duration::from_secs(24 * 3600);
/// How often a live client registers its name again, well inside [`NAME_KEPT`].
const NAME_REFRESH: Duration = Duration::from_secs(12 * 3600);
/// How soon a registration that failed is tried again.
const NAME_RETRY: Duration = Duration::from_secs(10);

/// Registers the client's name again while its engine lives: every [`NAME_REFRESH`] once
/// registered, every [`NAME_RETRY`] until then (`registered`: the connect's own registration
/// succeeded). The name is advice for operators, never needed by a lock, so a failure is only
/// a DEBUG event.
pub(crate) async fn keep_name_registered(engine: Weak<Engine>, mut registered: bool) {
    loop {
        tokio::time::sleep(if registered { NAME_REFRESH } else { NAME_RETRY }).await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        registered = engine.try_register_name().await;
    }
}

/// The name whose keys `permissions.lua` checks (a lock's at connect, a semaphore's before the
/// first hold). Nothing stays under it; any name would do, as an ACL grants by key pattern.
const PERMISSIONS_PROBE: &[u8] = b"permissions-probe";

/// Which scripts' commands a permission check covers ([`Engine::check_permissions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermissionScope {
    /// The locks' (and elections', jobs', fair handoff's): at connect.
    Locks,
    /// The semaphores' and read-write locks': before a client's first such acquisition.
    Holds,
}

impl Engine {
    /// Connects to `target` and starts the client's watchdog.
    pub(crate) async fn connect(
        target: &Target,
        config: ClientConfig,
        node_auth: Option<NodeAuth>,
        #[cfg(fencelock_negative_controls)] control: Option<Control>,
    ) -> Result<Arc<Engine>, Error> {
        let waiters = Arc::new(Waiters::default());
        let listener: Weak<dyn PushListener> = Arc::downgrade(&waiters) as Weak<dyn PushListener>;
        // The cluster and Sentinel clients take TLS settings from their URLs only; redis-rs has
        // no per-client root certificates for them.
        #[cfg(feature = "tls")]
        if config.tls_root_ca.is_some() && !matches!(target, Target::Standalone(_)) {
            return Err(Error::InvalidConfig {
                reason: "tls_root_ca is available for standalone URLs only".into(),
            });
        }
        // A standalone or Sentinel client: one server connection for everything.
        let single =
            |conn: ReconnectingConn| (Conn::Server(conn.clone()), None, AckRoute::Server(conn));
        let (conn, subscriptions, route) = match target {
            Target::Standalone(url) => single(standalone::connect(url, &config, listener).await?),
            Target::Cluster(nodes) => {
                // Scripts and subscriptions on cluster connections of their own: see
                // `transport::Connections`. Only the subscriptions' connection hears pushes.
                let conn = cluster::connect(nodes, &config, None).await?;
                let subscriptions = cluster::connect(nodes, &config, Some(listener)).await?;
                // cluster::connect refused an empty list.
                let route = ClusterRoute::new(conn.clone(), &nodes[0], &config)?;
                (
                    Conn::Cluster(conn),
                    Some(Conn::Cluster(subscriptions)),
                    AckRoute::Cluster(route),
                )
            }
            Target::Sentinel { sentinels, master } => {
                single(sentinel::connect(sentinels, master, node_auth, &config, listener).await?)
            }
        };
        let server = server::hello(&mut conn.clone()).await?;
        let lacks = |lacks: &str| Error::UnsupportedServer {
            server: server.to_string(),
            lacks: lacks.into(),
        };
        if matches!(target, Target::Cluster(_)) && !server.has_sharded_pubsub() {
            return Err(lacks(
                "sharded pub/sub (SPUBLISH, SSUBSCRIBE: Redis 7.0+, every Valkey), which a \
                 cluster client needs to wake waiters on the node of a lock's slot",
            ));
        }
        let field_expiry = match config.hold_expiry {
            HoldExpiry::LeaseZset => false,
            HoldExpiry::Auto => server.has_hash_field_expiry(),
            HoldExpiry::FieldExpiry if server.has_hash_field_expiry() => true,
            HoldExpiry::FieldExpiry => {
                return Err(lacks(
                    "hash-field expiry (HPEXPIREAT: Redis 7.4+, Valkey 9.0+), which \
                     HoldExpiry::FieldExpiry asks for",
                ))
            }
        };
        let acks = AckConnections::new(route, &config);
        // One connection for both, but on a cluster.
        waiters.set_connection(Connections {
            commands: conn.clone(),
            subscriptions: subscriptions.unwrap_or_else(|| conn.clone()),
        });
        let id = uuid::Uuid::new_v4().simple().to_string();
        let engine = Arc::new(Engine {
            reads: Batcher::new(&id, &conn, config.hold_batch),
            hold_releases: Batcher::new(&id, &conn, config.hold_batch),
            conn,
            config,
            waiters,
            watchdog: Watchdog::default(),
            acks,
            id,
            server,
            field_expiry,
            holds_permitted: AtomicBool::new(false),
            next_seq: AtomicU64::new(1),
            #[cfg(fencelock_negative_controls)]
            control,
        });
        tokio::spawn(watchdog::run(Arc::downgrade(&engine)));
        Ok(engine)
    }

    /// Registers this client's name for operators (`prefix{tag}client:<id>`, kept for
    /// [`NAME_KEPT`]); one `SET` at connect and one per [`NAME_REFRESH`] after. A failure is
    /// only logged (the name is advice for operators, never needed by a lock): whether it was
    /// registered.
    pub(crate) async fn try_register_name(&self) -> bool {
        let key = client_key(&self.config.prefix, &self.id);
        let name = self.config.client_name.as_str();
        let set = self.retrying(|mut conn| {
            let key = &key;
            async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(name)
                    .arg("PX")
                    .arg(u64::try_from(NAME_KEPT.as_millis()).unwrap_or(u64::MAX))
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(Error::from_reply)
            }
        });
        let Err(err) = set.await else {
            return true;
        };
        tracing::debug!(
            name: "fencelock.name_registration_failed",
            error = %err,
            "could not register the client's name; retrying in the background"
        );
        false
    }

    /// A fresh id for a holder or an operation: unique across clients (random client id) and
    /// within this one (sequence number).
    pub(crate) fn next_id(&self) -> String {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        format!("{}:{seq}", self.id)
    }

    /// Where a call on `keys` goes, for the group commit: on a cluster its hash slot, else the
    /// one server.
    pub(crate) fn route(&self, keys: &LockKeys) -> Route {
        if self.conn.is_cluster() {
            keys.slot
        } else {
            0
        }
    }

    /// The client's connection (a cheap clone of a multiplexed handle).
    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// The fair-mode part of an acquire attempt, `None` in the default mode.
    pub(crate) fn fair_attempt(&self, enqueue: bool) -> Option<FairAttempt<'_>> {
        self.config.fair_grace.map(|grace| FairAttempt {
            client: &self.id,
            enqueue,
            queue_slack: grace * 2 + crate::base::config::FAIR_QUEUE_SLACK,
        })
    }

    /// Runs one protocol call with this client's negative control in scope (test builds);
    /// otherwise this is the call itself.
    pub(crate) async fn controlled<T>(&self, call: impl Future<Output = T>) -> T {
        #[cfg(fencelock_negative_controls)]
        if let Some(control) = self.control {
            return controls::scoped(control, call).await;
        }
        call.await
    }

    /// Refuses a Redis user that may not run every command the scripts of `scope` send on
    /// this client's keys: a script refused midway keeps what it wrote before the refused
    /// command (Redis does not roll scripts back), so without this a missing `+pexpire` would
    /// leave a lock hash that never expires. One `permissions.lua` call on a probe's keys (on a
    /// cluster, at the probe's slot): `redis.acl_check_cmd` where the server has it, probes
    /// that are undone in the same script on Redis 6.2 (DESIGN.md §12). The locks' commands
    /// are checked at connect; the holds' (semaphores, read-write locks) before the client's
    /// first such acquisition, once, so that a user of locks alone needs none of them. A
    /// failed call for any reason other than a refusal leaves the check to the operation
    /// itself (and, for holds, to the next acquisition).
    pub(crate) async fn check_permissions(&self, scope: PermissionScope) -> Result<(), Error> {
        if scope == PermissionScope::Holds && self.holds_permitted.load(Ordering::Relaxed) {
            return Ok(());
        }
        let prefix = &self.config.prefix;
        // With what a refusal's message says needs the commands.
        let (keys, holds, needed_by) = match scope {
            PermissionScope::Locks => (LockKeys::new(prefix, PERMISSIONS_PROBE), None, ""),
            // Field-expiry commands wherever the server has them: any client may create a
            // semaphore that uses them, and every client of it then runs them.
            PermissionScope::Holds => (
                LockKeys::semaphore(prefix, PERMISSIONS_PROBE),
                Some(self.server.has_hash_field_expiry()),
                ", which semaphores and read-write locks need",
            ),
        };
        let mut conn = self.conn();
        let pubsub = conn.pubsub();
        let fair = self.config.fair_grace.is_some();
        let reply = self
            .controlled(protocol::permissions(&mut conn, &keys, pubsub, fair, holds))
            .await;
        match reply {
            Ok(PermissionsReply::Granted) => {
                if scope == PermissionScope::Holds {
                    self.holds_permitted.store(true, Ordering::Relaxed);
                }
                Ok(())
            }
            Ok(PermissionsReply::Refused(commands)) => Err(Error::PermissionDenied {
                detail: format!(
                    "the Redis user may not run {} on the keys under prefix {:?} (and their \
                     channels){}; grant every command the README's Security section lists",
                    commands.join(", "),
                    String::from_utf8_lossy(prefix),
                    needed_by,
                ),
            }),
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

    /// Whether this client runs `control` (test builds).
    #[cfg(fencelock_negative_controls)]
    pub(crate) fn broken(&self, control: Control) -> bool {
        self.control == Some(control)
    }

    /// Runs one idempotent operation, re-sending it while its outcome is unknown (timeout,
    /// dropped connection, server loading, a primary that moved) and the retry window is open.
    /// Every caller passes the same operation id on each attempt, so the server applies it at
    /// most once.
    ///
    /// Not an async fn: that would wrap the (hot, large) future of [`Engine::retrying_within`]
    /// in one more state machine.
    pub(crate) fn retrying<'a, T, F, Fut>(
        &'a self,
        attempt: F,
    ) -> impl Future<Output = Result<T, Error>> + 'a
    where
        F: FnMut(Conn) -> Fut + 'a,
        Fut: Future<Output = Result<T, Error>> + 'a,
        T: 'a,
    {
        self.retrying_within(self.config.retry_window, attempt)
    }

    /// One acquisition that returns only once `ack.replicas` replicas confirmed it (`WAIT`):
    /// `attempt` runs on the acknowledgement pool's connection to the primary of `keys`,
    /// re-sent within `window`; when `acquired` says it took the lock, the acknowledgement
    /// follows on the same connection. The API's one way to the replica acknowledgement of
    /// the transport (DESIGN.md section 13). See [`AckSession::run`] for redirections and
    /// re-sends and [`AckSession::wait`] for how a re-sent acquisition is still covered; an
    /// acquisition is never reported as acknowledged by a `WAIT` that did not see it.
    pub(crate) async fn acquire_acknowledged<R, F, Fut>(
        &self,
        ack: ReplicaAck,
        keys: &LockKeys,
        window: Duration,
        attempt: F,
        acquired: impl Fn(&R) -> bool,
    ) -> Result<(R, Option<Acks>), Error>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<R, Error>>,
    {
        let mut session = self.acks.session().await?;
        let reply = session.run(keys, window, attempt, &acquired).await?;
        let acks = if acquired(&reply) {
            Some(session.wait(ack).await?.unwrap_or(Acks {
                acked: 0,
                required: ack.replicas,
            }))
        } else {
            None
        };
        session.finish();
        Ok((reply, acks))
    }

    /// [`Engine::retrying`] with another window: a waiting acquirer's
    /// ([`crate::base::retry::waiting_window`]).
    pub(crate) async fn retrying_within<T, F, Fut>(
        &self,
        window: Duration,
        mut attempt: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let resends = retry(
            Resends::new(window),
            || attempt(self.conn()),
            |err: &Error| resend_after(err, "retrying lock operation with the same id"),
        );
        // Not through `controlled`: an async fn keeps its argument and the future it awaits
        // side by side, which would double this (hot, large) future.
        #[cfg(fencelock_negative_controls)]
        if let Some(control) = self.control {
            return controls::scoped(control, resends).await;
        }
        resends.await
    }
}
