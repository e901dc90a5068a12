//! An operation on its way to Redis that nobody may wait for: the undo that makes every
//! acquire and re-entry cancel safe.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::runtime::Handle;

use super::hold::HoldKind;
use super::Engine;
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::Control;
use crate::protocol::{CancelKind, LockKeys};
use crate::transport::ResendsByItself;

/// An acquire or re-entry that is on its way to Redis. If the caller stops waiting for it
/// (cancelled future, error after the retry window), dropping this undoes exactly that
/// operation on the server, whether it already ran or is still in flight.
pub(crate) struct PendingOp {
    /// The kind of hold the operation takes, whose script undoes it.
    hold: &'static HoldKind,
    pub(super) engine: Arc<Engine>,
    keys: Arc<LockKeys>,
    holder: String,
    op: String,
    kind: CancelKind,
    armed: bool,
    sends: Sends,
}

/// The sends of one acquisition, which decide whether a send leaves an op record
/// (`acquire.lua` ARGV[4]).
///
/// A copy of an acquire request can arrive after the hold it asked for ended only if the
/// request went out more than once: a send whose outcome was never known (its reply was lost,
/// its connection reset) may still reach the server after a later send was answered. So the
/// first send records nothing (the uncontended acquisition saves a record write), and once a
/// send's outcome was unknown every later send of the acquisition leaves an op record, which
/// such a straggler finds. Atomics rather than cells: a send is counted from inside the re-send
/// closure, which only borrows, and acquire futures must be `Send`.
#[derive(Debug, Default)]
pub(crate) struct Sends {
    /// A send went out and no definite reply has come back for it yet.
    unanswered: AtomicBool,
    /// Some send's outcome was unknown: a copy of it may still arrive.
    uncertain: AtomicBool,
}

impl Sends {
    /// A send is going out on `conn`: whether it must leave an op record (always on a
    /// connection whose client library may re-send by itself).
    pub(crate) fn send(&self, conn: &impl ResendsByItself) -> bool {
        if self.unanswered.swap(true, Ordering::Relaxed) {
            self.uncertain.store(true, Ordering::Relaxed);
        }
        self.uncertain.load(Ordering::Relaxed) || conn.resends_by_itself()
    }
}

impl PendingOp {
    /// An operation on a hold of kind `hold` (`PLAIN_LOCK` for a lock's, a multi-lock
    /// member's).
    pub(crate) fn of_kind(
        hold: &'static HoldKind,
        engine: &Arc<Engine>,
        keys: &Arc<LockKeys>,
        holder: &str,
        op: &str,
        kind: CancelKind,
    ) -> Self {
        PendingOp {
            hold,
            engine: engine.clone(),
            keys: keys.clone(),
            holder: holder.to_owned(),
            op: op.to_owned(),
            kind,
            armed: false,
            sends: Sends::default(),
        }
    }

    /// The acquisition's sends, which each ask whether to leave an op record.
    pub(crate) fn sends(&self) -> &Sends {
        &self.sends
    }

    /// The request is about to be sent: from now on its effect is unknown until a reply.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    /// A definite reply arrived, and the operation stays armed (a waiter that left a mark in
    /// Redis while busy: the undo on drop takes it out).
    pub(crate) fn answered(&self) {
        self.sends.unanswered.store(false, Ordering::Relaxed);
    }

    /// A definite reply arrived; the caller owns the outcome.
    pub(crate) fn disarm(&mut self) {
        self.answered();
        self.armed = false;
    }

    /// A definite "busy" reply arrived: nothing was taken by this send. Stays armed when an
    /// earlier send's outcome was unknown: that copy may still take the lock after the caller
    /// gave up, and only the undo on drop (which marks the op record cancelled) stops it.
    pub(crate) fn busy(&mut self) {
        self.answered();
        let uncertain = self.sends.uncertain.load(Ordering::Relaxed);
        #[cfg(fencelock_negative_controls)]
        let uncertain = uncertain && !self.engine.broken(Control::StragglerNotUndone);
        self.armed &= uncertain;
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
        let (engine, keys) = (self.engine.clone(), self.keys.clone());
        let holder = std::mem::take(&mut self.holder);
        let op = std::mem::take(&mut self.op);
        let (hold, kind) = (self.hold, self.kind);
        runtime.spawn(async move {
            let ttl = engine.config.op_record_ttl;
            let outcome = engine
                .retrying(|conn| hold.cancel(conn, &keys, &holder, &op, kind, ttl))
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
