//! An operation on its way to Redis that nobody may wait for: the undo that makes every
//! acquire and re-entry cancel safe.

use std::sync::Arc;

use tokio::runtime::Handle;

use super::Engine;
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::Control;
use crate::protocol::{self, CancelKind, LockKeys};

/// An acquire or re-entry that is on its way to Redis. If the caller stops waiting for it
/// (cancelled future, error after the retry window), dropping this undoes exactly that
/// operation on the server, whether it already ran or is still in flight.
pub(crate) struct PendingOp {
    engine: Arc<Engine>,
    keys: Arc<LockKeys>,
    holder: String,
    op: String,
    kind: CancelKind,
    armed: bool,
}

impl PendingOp {
    pub(crate) fn new(
        engine: &Arc<Engine>,
        keys: &Arc<LockKeys>,
        holder: &str,
        op: &str,
        kind: CancelKind,
    ) -> Self {
        PendingOp {
            engine: engine.clone(),
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
        #[cfg(fencelock_negative_controls)]
        if self.engine.broken(Control::CancelMissingOnDrop) {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            // No runtime to run the undo on: the lease is the backstop.
            return;
        };
        let engine = self.engine.clone();
        let keys = self.keys.clone();
        let holder = std::mem::take(&mut self.holder);
        let op = std::mem::take(&mut self.op);
        let kind = self.kind;
        runtime.spawn(async move {
            let ttl = engine.config.op_record_ttl;
            let outcome =
                engine
                    .retrying(|mut conn| {
                        let (keys, holder, op) = (&keys, &holder, &op);
                        let pubsub = conn.pubsub();
                        async move {
                            protocol::cancel(&mut conn, keys, holder, op, kind, ttl, pubsub).await
                        }
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
