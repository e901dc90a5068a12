//! The raw protocol of each kind of hold ([`HoldKind`]): which scripts release, extend,
//! re-enter and undo a plain lock's hold, a semaphore's permits and a read-write lock's read or
//! write, and what each kind decides that the others do not (fair release, the handoff offer).
//! The guard (`api::guard`) and the pending operations call it and never ask a hold what it is.
//!
//! As `lock_api`'s `RawMutex` under its `Mutex`: the safe layer is written once over the raw
//! operations. The acquisitions differ in what they ask for (a lock, permits, a side): the
//! API's one request (`api::handle`) runs them on one acquire loop and builds holders of their
//! kind.

use std::time::Duration;

use super::holder::Holder;
use super::Engine;
use crate::base::config::fair_queue_life;
use crate::base::error::Error;
use crate::protocol::batch::{self, HoldRelease};
use crate::protocol::{
    self, CancelKind, CancelReply, Candidate, EnterReply, HandoffReply, LockKeys, OwnerReply,
    PubSub,
};
use crate::transport::Conn;

/// What one kind of hold does with its scripts ([`PLAIN_LOCK`], [`SEMAPHORE`], [`RW_LOCK`]),
/// chosen by whoever builds the holder and kept in it.
///
/// A value, one `&'static HoldKind` per holder, rather than a type parameter: every kind is
/// served by the one public guard type, `LockGuard` (which `SemaphorePermit`, `ReadGuard` and
/// `WriteGuard` dereference to, and which multi-locks, elections, jobs and idempotency keys
/// hold), and a generic guard would change that public type. A call through it is one match,
/// next to a round trip to Redis.
#[derive(Debug)]
pub(crate) enum HoldKind {
    /// A plain lock's hold: a lock's, a multi-lock member's, an election's, a job's, an
    /// idempotency key's.
    PlainLock,
    /// A hold with a lease of its own, a semaphore's permits or a read-write lock's read or
    /// write (the two sides differ only in how they are acquired): the semaphore's scripts
    /// release, extend, re-enter and undo it.
    Leased {
        /// Whether a release offers the freed hold to a waiter of the client: a semaphore's
        /// permits, when they are enough for it (`sem_handoff.lua`). A read-write lock's holds
        /// are not handed on: a writer hands over to readers, and readers to a writer, only
        /// through the release's message.
        handed_on: bool,
    },
}

pub(crate) static PLAIN_LOCK: HoldKind = HoldKind::PlainLock;
pub(crate) static SEMAPHORE: HoldKind = HoldKind::Leased { handed_on: true };
pub(crate) static RW_LOCK: HoldKind = HoldKind::Leased { handed_on: false };

impl HoldKind {
    /// Whether a release of this kind, in a client with `engine`'s settings, offers the freed
    /// hold to the client's first waiter (`engine::handoff`). Only in the default mode: in fair
    /// handoff the Redis queue orders clients instead (and holds with leases of their own have
    /// no fair release: they leave by their own script).
    pub(crate) fn hands_off(&self, engine: &Engine) -> bool {
        let kind_hands_off = match self {
            HoldKind::PlainLock => true,
            HoldKind::Leased { handed_on } => *handed_on,
        };
        kind_hands_off && engine.config.fair_grace.is_none()
    }

    /// One send of the release of one entry of `holder`'s hold, as operation `op`, on `conn`
    /// (whose pub/sub flavour is `pubsub`); when `candidate` is given (only to kinds that hand
    /// off, so never in fair mode), the freed hold is granted to it in the same call if it may
    /// be, by the handoff script of the keys' layout. `read_record`: whether the release reads
    /// its op record (the caller decides, `api::guard`: always but on the first
    /// send of a release of a hold never re-entered).
    pub(crate) async fn release(
        &self,
        holder: &Holder,
        mut conn: Conn,
        op: &str,
        pubsub: PubSub,
        candidate: Option<Candidate<'_>>,
        read_record: bool,
    ) -> Result<HandoffReply, Error> {
        let (engine, keys, id) = (&holder.engine, &holder.keys, holder.id.as_str());
        let ttl = engine.config.op_record_ttl;
        if let Some(candidate) = candidate {
            return protocol::release_handing_off(&mut conn, keys, id, op, ttl, pubsub, candidate)
                .await;
        }
        let reply = match (self, engine.config.fair_grace) {
            // In fair mode a client with more waiters for this lock goes back to the end of
            // the queue in the release itself (decided per send: a waiter that arrives later
            // queues the client with its own first attempt).
            (HoldKind::PlainLock, Some(grace)) => {
                let requeue = engine
                    .waiters
                    .has_waiters(&keys.lock)
                    .then(|| (engine.id.as_str(), fair_queue_life(grace)));
                protocol::release_fair(&mut conn, keys, id, op, ttl, pubsub, grace, requeue).await
            }
            (HoldKind::PlainLock, None) => {
                protocol::release(&mut conn, keys, id, op, ttl, pubsub, read_record).await
            }
            // Alone, a hold's release rides the group commit (`engine::batch`) with the releases
            // of holds of the same lock, by `sem_release_many.lua`.
            (HoldKind::Leased { .. }, _) => {
                let release = HoldRelease::new(keys, id, op, ttl, pubsub, read_record);
                let release = engine
                    .hold_releases
                    .run(&mut conn, engine.route(keys), release);
                // Boxed, as a grouped read is.
                Box::pin(release)
                    .await
                    .and_then(batch::hold_release_outcome)
            }
        };
        reply.map(|reply| match reply {
            OwnerReply::Done { remaining } => HandoffReply::Released { remaining },
            OwnerReply::NotHeld => HandoffReply::NotHeld,
        })
    }

    /// Sets the lease of `holder`'s hold to `lease` from now, owner-checked: `extend.lua` for
    /// a plain lock, the watchdog's renewal (`sem_renew.lua`) of this one hold for the others.
    pub(crate) async fn extend(
        &self,
        mut conn: Conn,
        keys: &LockKeys,
        holder: &str,
        lease: Duration,
    ) -> Result<OwnerReply, Error> {
        if let HoldKind::PlainLock = self {
            return protocol::extend(&mut conn, keys, holder, lease).await;
        }
        let renewed = protocol::renew(&mut conn, &[(keys, holder)], lease).await?;
        Ok(if renewed.first() == Some(&true) {
            OwnerReply::Done { remaining: 1 }
        } else {
            OwnerReply::NotHeld
        })
    }

    /// Enters `holder`'s hold once more as operation `op`. The script is the one of the keys'
    /// layout (`reenter.lua` for a lock's hash, `hold_reenter.lua` for a hold's), which
    /// `protocol::reenter` picks for every caller.
    pub(crate) async fn reenter(
        &self,
        mut conn: Conn,
        keys: &LockKeys,
        holder: &str,
        op: &str,
        op_ttl: Duration,
    ) -> Result<EnterReply, Error> {
        protocol::reenter(&mut conn, keys, holder, op, op_ttl).await
    }

    /// Undoes operation `op` of `holder` (an acquisition or a re-entry nobody waits for), or
    /// forestalls it if it has not run. The script is the one of the keys' layout
    /// (`cancel.lua`; `sem_cancel.lua`, which also takes a waiting writer's mark or a fair
    /// queue's entry out), which `protocol::cancel` picks for every caller.
    pub(crate) async fn cancel(
        &self,
        mut conn: Conn,
        keys: &LockKeys,
        holder: &str,
        op: &str,
        kind: CancelKind,
        op_ttl: Duration,
    ) -> Result<CancelReply, Error> {
        let pubsub = conn.pubsub();
        protocol::cancel(&mut conn, keys, holder, op, kind, op_ttl, pubsub).await
    }
}
