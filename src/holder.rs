//! What one acquisition holds, shared by its guard and every nested re-entry guard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::runtime::Handle;

use crate::protocol::{self, CancelKind, LockKeys};
use crate::{FencingToken, LockClient};

/// One holder: the identity Redis knows (`id`), the token it was issued, and its lease as this
/// process sees it.
pub(crate) struct Holder {
    pub(crate) client: LockClient,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) name: Arc<[u8]>,
    pub(crate) id: String,
    pub(crate) token: FencingToken,
    /// End of the lease by this process' monotonic clock, measured from when the request that
    /// set it was first sent: the server started the lease no earlier than that, so this end is
    /// never later than the server's.
    deadline: Mutex<Instant>,
    lost: AtomicBool,
    /// The runtime the lock was acquired on; a guard dropped anywhere releases through it.
    pub(crate) runtime: Handle,
}

impl Holder {
    pub(crate) fn new(
        client: LockClient,
        keys: Arc<LockKeys>,
        name: Arc<[u8]>,
        id: String,
        token: FencingToken,
        sent_at: Instant,
        lease: Duration,
    ) -> Arc<Holder> {
        Arc::new(Holder {
            client,
            keys,
            name,
            id,
            token,
            deadline: Mutex::new(sent_at + lease),
            lost: AtomicBool::new(false),
            runtime: Handle::current(),
        })
    }

    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock()
    }

    /// A renewal or extension first sent at `sent_at` succeeded.
    pub(crate) fn lease_renewed(&self, sent_at: Instant, lease: Duration) {
        *self.deadline.lock() = sent_at + lease;
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Held as far as this process knows: not reported lost, and the lease has not run out.
    pub(crate) fn is_valid(&self) -> bool {
        !self.is_lost() && Instant::now() < self.deadline()
    }
}

/// An acquire or re-entry that is on its way to Redis. If the caller stops waiting for it
/// (cancelled future, error after the retry window), dropping this undoes exactly that
/// operation on the server, whether it already ran or is still in flight.
pub(crate) struct PendingOp {
    client: LockClient,
    keys: Arc<LockKeys>,
    holder: String,
    op: String,
    kind: CancelKind,
    armed: bool,
}

impl PendingOp {
    pub(crate) fn new(
        client: &LockClient,
        keys: &Arc<LockKeys>,
        holder: &str,
        op: &str,
        kind: CancelKind,
    ) -> Self {
        PendingOp {
            client: client.clone(),
            keys: keys.clone(),
            holder: holder.to_owned(),
            op: op.to_owned(),
            kind,
            armed: false,
        }
    }

    /// The request is about to be sent: from now on its effect is unknown until a reply.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    /// A definite reply arrived; the caller owns the outcome.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for PendingOp {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            // No runtime to run the undo on: the lease is the backstop.
            return;
        };
        let client = self.client.clone();
        let keys = self.keys.clone();
        let holder = std::mem::take(&mut self.holder);
        let op = std::mem::take(&mut self.op);
        let kind = self.kind;
        runtime.spawn(async move {
            let ttl = client.inner.config.op_record_ttl;
            let outcome = client
                .retrying(|mut conn| {
                    let (keys, holder, op) = (&keys, &holder, &op);
                    async move { protocol::cancel(&mut conn, keys, holder, op, kind, ttl).await }
                })
                .await;
            match outcome {
                Ok(reply) => tracing::debug!(?reply, ?kind, "undid an abandoned lock operation"),
                Err(err) => tracing::warn!(
                    error = %err,
                    ?kind,
                    "could not undo an abandoned lock operation; its lease will free it"
                ),
            }
        });
    }
}
