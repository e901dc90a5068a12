//! The raw protocol of each kind of hold ([`HoldKind`]): which scripts release, extend,
//! re-enter and undo a plain lock's hold, a semaphore's permits and a read-write lock's read or
//! write, and what each kind decides that the others do not (fair release, the handoff offer).
//! The guard (`api::guard`) and the pending operations call it and never ask a hold what it is.
//!
//! As `lock_api`'s `RawMutex` under its `Mutex`: the safe layer is written once over the raw
//! operations. The acquisitions differ in what they ask for (a lock, permits, a side): the
//! API's one request (`api::handle`) runs them on one acquire loop and builds holders of their
//! kind.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::holder::Holder;
use super::Engine;
use crate::base::config::fair_queue_life;
use crate::base::error::Error;
use crate::protocol::{
    self, CancelKind, CancelReply, Candidate, EnterReply, HandoffReply, LockKeys, OwnerReply,
    PubSub,
};
use crate::transport::Conn;

/// One script call of a hold's operation, on the connection it was given.
pub(crate) type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// What one kind of hold does with its scripts: one implementation per kind ([`PLAIN_LOCK`],
/// [`SEMAPHORE`], [`RW_LOCK`]), chosen by whoever builds the holder and kept in it.
///
/// Dynamic dispatch, one `&'static dyn HoldKind` per holder, rather than a type parameter:
/// every kind is served by the one public guard type, `LockGuard` (which `SemaphorePermit`,
/// `ReadGuard` and `WriteGuard` dereference to, and which multi-locks, elections, jobs and
/// idempotency keys hold), and a generic guard would change that public type. A call through
/// it is one indirect call and one boxed future per script call, next to a round trip to
/// Redis.
pub(crate) trait HoldKind: Send + Sync {
    /// Whether a release of this kind, in a client with `engine`'s settings, offers the freed
    /// hold to the client's first waiter (`engine::handoff`).
    fn hands_off(&self, engine: &Engine) -> bool;

    /// One send of the release of one entry of `holder`'s hold, as operation `op`, on `conn`
    /// (whose pub/sub flavour is `pubsub`); when `candidate` is given (only to kinds that hand
    /// off, so never in fair mode), the freed hold is granted to it in the same call if it may
    /// be, by the handoff script of the keys' layout.
    fn release<'a>(
        &'a self,
        holder: &'a Holder,
        mut conn: Conn,
        op: &'a str,
        pubsub: PubSub,
        candidate: Option<Candidate<'a>>,
    ) -> Call<'a, HandoffReply> {
        let Some(candidate) = candidate else {
            return self.release_alone(holder, conn, op, pubsub);
        };
        let (keys, id) = (&holder.keys, holder.id.as_str());
        let ttl = holder.engine.config.op_record_ttl;
        Box::pin(async move {
            protocol::release_handing_off(&mut conn, keys, id, op, ttl, pubsub, candidate).await
        })
    }

    /// [`HoldKind::release`] with no candidate: the release script of this kind.
    fn release_alone<'a>(
        &'a self,
        holder: &'a Holder,
        conn: Conn,
        op: &'a str,
        pubsub: PubSub,
    ) -> Call<'a, HandoffReply>;

    /// Sets the lease of `holder`'s hold to `lease` from now, owner-checked.
    fn extend<'a>(
        &'a self,
        conn: Conn,
        keys: &'a LockKeys,
        holder: &'a str,
        lease: Duration,
    ) -> Call<'a, OwnerReply>;

    /// Enters `holder`'s hold once more as operation `op`. The script is the one of the keys'
    /// layout (`reenter.lua` for a lock's hash, `hold_reenter.lua` for a hold's), which
    /// `protocol::reenter` picks for every caller.
    fn reenter<'a>(
        &'a self,
        mut conn: Conn,
        keys: &'a LockKeys,
        holder: &'a str,
        op: &'a str,
        op_ttl: Duration,
    ) -> Call<'a, EnterReply> {
        Box::pin(async move { protocol::reenter(&mut conn, keys, holder, op, op_ttl).await })
    }

    /// Undoes operation `op` of `holder` (an acquisition or a re-entry nobody waits for), or
    /// forestalls it if it has not run. The script is the one of the keys' layout
    /// (`cancel.lua`; `sem_cancel.lua`, which also takes a waiting writer's mark or a fair
    /// queue's entry out), which `protocol::cancel` picks for every caller.
    fn cancel<'a>(
        &'a self,
        mut conn: Conn,
        keys: &'a LockKeys,
        holder: &'a str,
        op: &'a str,
        kind: CancelKind,
        op_ttl: Duration,
    ) -> Call<'a, CancelReply> {
        let pubsub = conn.pubsub();
        Box::pin(async move {
            protocol::cancel(&mut conn, keys, holder, op, kind, op_ttl, pubsub).await
        })
    }
}

/// A plain lock's hold: a lock's, a multi-lock member's, an election's, a job's, an
/// idempotency key's.
pub(crate) struct PlainLock;

/// A hold with a lease of its own, a semaphore's permits or a read-write lock's read or write
/// (the two sides differ only in how they are acquired): the semaphore's scripts release,
/// extend, re-enter and undo it.
pub(crate) struct LeasedHold {
    /// Whether a release offers the freed hold to a waiter of the client: a semaphore's
    /// permits, when they are enough for it (`sem_handoff.lua`). A read-write lock's holds are
    /// not handed on: a writer hands over to readers, and readers to a writer, only through
    /// the release's message.
    handed_on: bool,
}

pub(crate) static PLAIN_LOCK: PlainLock = PlainLock;
pub(crate) static SEMAPHORE: LeasedHold = LeasedHold { handed_on: true };
pub(crate) static RW_LOCK: LeasedHold = LeasedHold { handed_on: false };

impl HoldKind for PlainLock {
    /// In the default mode, a release that frees the lock grants it in the same call to this
    /// client's first waiter; in fair handoff the Redis queue orders clients instead.
    fn hands_off(&self, engine: &Engine) -> bool {
        engine.config.fair_grace.is_none()
    }

    fn release_alone<'a>(
        &'a self,
        holder: &'a Holder,
        mut conn: Conn,
        op: &'a str,
        pubsub: PubSub,
    ) -> Call<'a, HandoffReply> {
        let engine = &holder.engine;
        let (keys, id) = (&holder.keys, holder.id.as_str());
        let ttl = engine.config.op_record_ttl;
        let fair = engine.config.fair_grace;
        // In fair mode a client with more waiters for this lock goes back to the end of the
        // queue in the release itself (decided per send: a waiter that arrives later queues
        // the client with its own first attempt).
        let requeue = fair
            .filter(|_| engine.waiters.has_waiters(&keys.lock))
            .map(|grace| (engine.id.as_str(), fair_queue_life(grace)));
        Box::pin(async move {
            match fair {
                Some(grace) => {
                    protocol::release_fair(&mut conn, keys, id, op, ttl, pubsub, grace, requeue)
                        .await
                }
                None => protocol::release(&mut conn, keys, id, op, ttl, pubsub).await,
            }
            .map(released)
        })
    }

    fn extend<'a>(
        &'a self,
        mut conn: Conn,
        keys: &'a LockKeys,
        holder: &'a str,
        lease: Duration,
    ) -> Call<'a, OwnerReply> {
        Box::pin(async move { protocol::extend(&mut conn, keys, holder, lease).await })
    }
}

impl HoldKind for LeasedHold {
    /// In the default mode; a fair-handoff client's waiters queue in Redis instead. These
    /// holds have no fair release: they leave by their own script.
    fn hands_off(&self, engine: &Engine) -> bool {
        self.handed_on && engine.config.fair_grace.is_none()
    }

    /// Alone, the release rides the group commit with the releases of holds of the same lock.
    fn release_alone<'a>(
        &'a self,
        holder: &'a Holder,
        mut conn: Conn,
        op: &'a str,
        pubsub: PubSub,
    ) -> Call<'a, HandoffReply> {
        let (engine, keys, id) = (&holder.engine, &holder.keys, holder.id.as_str());
        let ttl = engine.config.op_record_ttl;
        Box::pin(async move {
            engine
                .hold_release_grouped(&mut conn, keys, id, op, ttl, pubsub)
                .await
                .map(released)
        })
    }

    /// The watchdog's owner-checked renewal (`sem_renew.lua`), for this one hold.
    fn extend<'a>(
        &'a self,
        mut conn: Conn,
        keys: &'a LockKeys,
        holder: &'a str,
        lease: Duration,
    ) -> Call<'a, OwnerReply> {
        Box::pin(async move {
            let renewed = protocol::renew(&mut conn, &[(keys, holder)], lease).await?;
            Ok(if renewed.first() == Some(&true) {
                OwnerReply::Done { remaining: 1 }
            } else {
                OwnerReply::NotHeld
            })
        })
    }
}

/// A release script's reply as the handoff script words it.
fn released(reply: OwnerReply) -> HandoffReply {
    match reply {
        OwnerReply::Done { remaining } => HandoffReply::Released { remaining },
        OwnerReply::NotHeld => HandoffReply::NotHeld,
    }
}
