//! Group commit of holds: a client's read acquisitions of one read-write lock that meet on the
//! way to the server travel as one script call (`rw_read_many.lua`), and so do its releases of
//! holds of one semaphore or read-write lock (`sem_release_many.lua`); each call does what its
//! operations share once.
//!
//! Per queue at most one call is on the wire. A queue is a route (the server; on a cluster,
//! the hash slot, since one script call cannot span slots) and what the operations must have
//! in common to share a call ([`Grouped::Group`]: the lock, and for reads the lease). An
//! operation whose queue is idle goes at once, alone, by its own script, and waits for
//! nothing. Operations that arrive while a call is on the wire queue, and ride the next call
//! together as soon as it returns, up to `hold_batch` per call (the cap bounds how long one
//! call holds the server). A cap of 1 turns grouping off: each operation goes alone, pipelined
//! with the others. Nothing waits on a timer.
//!
//! Each operation keeps its own semantics: its operation id (and so its replay), its reply,
//! its error (the grouped scripts answer each alone), its retry (a call that fails as a whole
//! fails every operation in it with the same transient error, and each re-sends on its own
//! schedule, through here again), its undo (a read whose caller gave up while it was queued or
//! on the wire is undone by its `PendingOp` like any other in flight). A queued operation
//! always goes out, also when its caller has left: it was sent as far as the caller knows, and
//! its undo is on its way.
//!
//! Written here rather than taken from a crate: what is grouped is a script call whose
//! arguments are the operations, with per-operation replies and errors, per-slot routes and the
//! negative controls' scope; the generic batching crates group requests on a timer or a size.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use redis::Value;
use tokio::sync::oneshot;

use crate::base::error::Error;
use crate::protocol::batch::{self, Grouped, ReadOperation};
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls;
use crate::protocol::rwlock::RwAcquireReply;
use crate::protocol::semaphore::HoldAcquire;
use crate::transport::Conn;

/// Where a call goes: the whole server, or one hash slot of a cluster.
pub(crate) type Route = u16;

/// Which operations may share a call: those of one route and one group.
type Queue<Op> = (Route, <Op as Grouped>::Group);

/// The client's group commit of one kind of operation, shared by its clones.
pub(crate) struct Batcher<Op: Grouped> {
    /// The client's id, which the `fencelock.batch` event names.
    client: String,
    conn: Conn,
    /// Operations per call at most (`hold_batch`).
    cap: usize,
    /// The queues with a call on the wire; absent: idle.
    busy: Mutex<HashMap<Queue<Op>, Vec<Queued<Op>>>>,
}

/// An operation waiting for the next call of its queue.
struct Queued<Op> {
    op: Op,
    reply: oneshot::Sender<Result<Value, Error>>,
}

impl<Op: Grouped> Batcher<Op> {
    pub(crate) fn new(client: &str, conn: &Conn, cap: usize) -> Arc<Self> {
        Arc::new(Batcher {
            client: client.to_owned(),
            conn: conn.clone(),
            cap: cap.max(1),
            busy: Mutex::new(HashMap::new()),
        })
    }

    /// Runs `op` on `conn`, alone at once when its queue is idle, otherwise in the queue's
    /// next call; its raw reply.
    ///
    /// Cancel safe in the sense of a request on the wire: dropped, a queued operation still
    /// goes out with the next call, and an operation sent alone may still run.
    pub(super) async fn run(
        self: &Arc<Self>,
        conn: &mut Conn,
        route: Route,
        op: Op,
    ) -> Result<Value, Error> {
        if self.cap == 1 {
            return op.run_alone(conn).await;
        }
        let queue = (route, op.group());
        let queued = {
            let mut busy = self.busy.lock();
            match busy.get_mut(&queue) {
                Some(waiting) => {
                    let (reply, answer) = oneshot::channel();
                    waiting.push(Queued { op, reply });
                    Err(answer)
                }
                None => {
                    busy.insert(queue.clone(), Vec::new());
                    Ok(op)
                }
            }
        };
        match queued {
            Ok(op) => {
                let _turn = Turn {
                    batcher: self,
                    queue,
                };
                op.run_alone(conn).await
            }
            Err(answer) => answer.await.unwrap_or_else(|_| Err(call_lost())),
        }
    }

    /// The queue's call returned: what waits in it goes out as the next call, or it is idle.
    fn next(&self, queue: &Queue<Op>) -> Option<Vec<Queued<Op>>> {
        let mut busy = self.busy.lock();
        let waiting = busy.get_mut(queue)?;
        if waiting.is_empty() {
            busy.remove(queue);
            return None;
        }
        let take = waiting.len().min(self.cap);
        Some(waiting.drain(..take).collect())
    }

    /// Sends the queue's operations, call after call, until none are left.
    async fn flush(self: Arc<Self>, queue: Queue<Op>, calls: Vec<Queued<Op>>) {
        let mut next = Some(calls);
        while let Some(calls) = next {
            let outcomes = self.call(&calls).await;
            for (queued, outcome) in calls.into_iter().zip(outcomes) {
                // A caller that left needs no reply: its undo is on its way.
                let _ = queued.reply.send(outcome);
            }
            next = self.next(&queue);
        }
    }

    /// One call with `queued`: alone by its own script when it is one operation.
    async fn call(&self, queued: &[Queued<Op>]) -> Vec<Result<Value, Error>> {
        let mut conn = self.conn.clone();
        if let [one] = queued {
            return vec![one.op.run_alone(&mut conn).await];
        }
        tracing::debug!(
            name: "fencelock.batch",
            client = %self.client,
            operations = queued.len(),
            "operations of this client share one script call"
        );
        let ops: Vec<&Op> = queued.iter().map(|q| &q.op).collect();
        match Op::run_together(&mut conn, &ops).await {
            Ok(outcomes) => outcomes,
            Err(err) => queued
                .iter()
                .map(|_| Err(Error::from_reply(err.clone())))
                .collect(),
        }
    }
}

/// The turn of an operation sent alone on an idle queue: when its call ends (or its caller
/// drops it), whatever queued behind it goes out, from a task of its own.
struct Turn<'a, Op: Grouped> {
    batcher: &'a Arc<Batcher<Op>>,
    queue: Queue<Op>,
}

impl<Op: Grouped> Drop for Turn<'_, Op> {
    fn drop(&mut self) {
        let Some(calls) = self.batcher.next(&self.queue) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let flush = self.batcher.clone().flush(self.queue.clone(), calls);
            // In the negative control of the client whose call this was (a turn ends inside
            // the call's scope, also when its caller drops it), as that call ran.
            #[cfg(fencelock_negative_controls)]
            if let Some(control) = controls::current() {
                runtime.spawn(controls::scoped(control, flush));
                return;
            }
            runtime.spawn(flush);
            return;
        }
        // No runtime to send from (a caller dropped outside one): the queued operations fail
        // as if their connection dropped, and re-send themselves.
        for queued in calls {
            let _ = queued.reply.send(Err(call_lost()));
        }
        self.batcher.busy.lock().remove(&self.queue);
    }
}

/// The error of an operation whose call was lost with the task that carried it: its outcome
/// is unknown, so the operation re-sends (with its id) like after a dropped connection.
fn call_lost() -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the script call carrying this operation was dropped",
    )))
}

impl super::Engine {
    /// `rw_acquire.lua` of a read, through the group commit: with the reads of the same lock
    /// and lease that meet it, by `rw_read_many.lua`.
    pub(crate) async fn read_grouped(
        &self,
        conn: &mut Conn,
        read: &HoldAcquire<'_>,
    ) -> Result<RwAcquireReply, Error> {
        let read = self
            .reads
            .run(conn, self.route(&read.keys), ReadOperation::from(read));
        // Boxed: inline, the group commit's state would make every acquire future that much
        // larger (a waiting acquisition carries it).
        batch::read_outcome(Box::pin(read).await?)
    }
}
