//! Group commit: the lock acquisitions and releases of one client that meet on the way to one
//! server travel as one script call (`batch.lua`), and so do its read acquisitions of one
//! read-write lock (`rw_read_many.lua`) and its releases of holds of one semaphore or
//! read-write lock (`sem_release_many.lua`), which do their common work once.
//!
//! Per queue at most one call is on the wire. A queue is a route (the server; on a cluster,
//! the hash slot, since one script call cannot span slots) for lock operations; a route, a
//! read-write lock and a lease for reads; a route and a lock for releases of holds. An
//! operation whose queue is idle goes at once, alone, by its own script: the uncontended
//! acquisition sends exactly what it sent before and waits for nothing. Operations that
//! arrive while a call is on the wire queue, and ride the next call together as soon as it
//! returns, up to the queue's cap per call (`op_batch` for lock operations, `hold_batch` for
//! the reads and releases of holds; the cap bounds how long one call holds the server). A cap
//! of 1 turns grouping off for its kind: each operation goes alone, pipelined with the
//! others. Nothing waits on a timer.
//!
//! Each operation keeps its own semantics: its operation id (and so its replay), its reply,
//! its error (`batch.lua` runs each under `pcall`; the grouped hold scripts answer each
//! alone), its retry (a call that fails as a whole
//! fails every operation in it with the same transient error, and each re-sends on its own
//! schedule, through here again), its undo (an acquisition whose caller gave up while it was
//! queued or on the wire is undone by its `PendingOp` like any other in flight). A queued
//! operation always goes out, also when its caller has left: it was sent as far as the caller
//! knows, and its undo is on its way.
//!
//! Written here rather than taken from a crate: what is grouped is a script call whose
//! arguments are the operations, with per-operation replies and errors, per-slot routes and the
//! negative controls' scope; the generic batching crates group requests on a timer or a size.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value;
use tokio::sync::oneshot;

use crate::base::error::Error;
use crate::protocol::batch::{self, HoldRelease, Operation, ReadOperation};
#[cfg(fencelock_negative_controls)]
use crate::protocol::controls::{self, Control};
use crate::protocol::semaphore::RwAcquireReply;
use crate::protocol::{self, AcquireReply, LockKeys, OwnerReply, PubSub};
use crate::transport::Conn;

/// Where a call goes: the whole server, or one hash slot of a cluster.
pub(crate) type Route = u16;

/// Which operations may share a call: a route's lock operations, the reads of one read-write
/// lock (its hash key) with one lease (ms) on a route, or the releases of holds of one lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Queue {
    Locks(Route),
    Reads(Route, Vec<u8>, u64),
    HoldReleases(Route, Vec<u8>),
}

/// An operation of a queue.
enum Work {
    Lock(Operation),
    Read(ReadOperation),
    HoldRelease(HoldRelease),
}

impl Work {
    /// The operation by its own script, on its own: its raw reply.
    async fn run_alone(&self, conn: &mut Conn) -> Result<Value, Error> {
        match self {
            Work::Lock(op) => op.run_alone(conn).await,
            Work::Read(read) => read.run_alone(conn).await,
            Work::HoldRelease(release) => release.run_alone(conn).await,
        }
    }
}

/// The client's group commit of lock operations, reads and releases of holds, shared by its
/// clones.
pub(crate) struct Batcher {
    /// The client's id, which the `fencelock.batch` event names.
    client: String,
    conn: Conn,
    /// Lock operations per call at most (`op_batch`).
    lock_cap: usize,
    /// Reads or releases of holds per call at most (`hold_batch`).
    hold_cap: usize,
    /// The queues with a call on the wire; absent: idle.
    busy: Mutex<HashMap<Queue, Vec<Queued>>>,
    #[cfg(fencelock_negative_controls)]
    control: Option<Control>,
}

/// An operation waiting for the next call of its queue.
struct Queued {
    op: Work,
    reply: oneshot::Sender<Result<Value, Error>>,
}

impl Batcher {
    pub(crate) fn new(
        client: String,
        conn: Conn,
        lock_cap: usize,
        hold_cap: usize,
        #[cfg(fencelock_negative_controls)] control: Option<Control>,
    ) -> Arc<Batcher> {
        Arc::new(Batcher {
            client,
            conn,
            lock_cap: lock_cap.max(1),
            hold_cap: hold_cap.max(1),
            busy: Mutex::new(HashMap::new()),
            #[cfg(fencelock_negative_controls)]
            control,
        })
    }

    /// Whether lock operations go alone, each by its own script (`op_batch` 1).
    pub(crate) fn locks_alone(&self) -> bool {
        self.lock_cap == 1
    }

    /// Whether reads and releases of holds go alone, each by its own script (`hold_batch` 1).
    pub(crate) fn holds_alone(&self) -> bool {
        self.hold_cap == 1
    }

    /// The most operations of `queue` one call carries.
    fn cap_of(&self, queue: &Queue) -> usize {
        match queue {
            Queue::Locks(_) => self.lock_cap,
            Queue::Reads(..) | Queue::HoldReleases(..) => self.hold_cap,
        }
    }

    /// Runs `op` on `conn`, alone at once when its queue is idle, otherwise in the queue's
    /// next call; its raw reply.
    ///
    /// Cancel safe in the sense of a request on the wire: dropped, a queued operation still
    /// goes out with the next call, and an operation sent alone may still run.
    async fn run(
        self: &Arc<Self>,
        conn: &mut Conn,
        route: Queue,
        op: Work,
    ) -> Result<Value, Error> {
        if self.cap_of(&route) == 1 {
            return op.run_alone(conn).await;
        }
        let queued = {
            let mut busy = self.busy.lock();
            match busy.get_mut(&route) {
                Some(queue) => {
                    let (reply, answer) = oneshot::channel();
                    queue.push(Queued { op, reply });
                    Err(answer)
                }
                None => {
                    busy.insert(route.clone(), Vec::new());
                    Ok(op)
                }
            }
        };
        match queued {
            Ok(op) => {
                let _turn = Turn {
                    batcher: self,
                    route,
                };
                op.run_alone(conn).await
            }
            Err(answer) => answer.await.unwrap_or_else(|_| Err(call_lost())),
        }
    }

    /// The route's call returned: its queue goes out as the next call, or the route is idle.
    fn next(self: &Arc<Self>, route: &Queue) -> Option<Vec<Queued>> {
        let mut busy = self.busy.lock();
        let queue = busy.get_mut(route)?;
        if queue.is_empty() {
            busy.remove(route);
            return None;
        }
        let take = queue.len().min(self.cap_of(route));
        Some(queue.drain(..take).collect())
    }

    /// Sends the route's queued operations, call after call, until none are left.
    async fn flush(self: Arc<Self>, route: Queue, mut calls: Vec<Queued>) {
        loop {
            let outcomes = self.call(&calls).await;
            for (queued, outcome) in calls.into_iter().zip(outcomes) {
                // A caller that left needs no reply: its undo is on its way.
                let _ = queued.reply.send(outcome);
            }
            match self.next(&route) {
                Some(next) => calls = next,
                None => return,
            }
        }
    }

    /// One call with `queued`: alone by its own script when it is one operation.
    async fn call(&self, queued: &[Queued]) -> Vec<Result<Value, Error>> {
        let mut conn = self.conn.clone();
        let call = async {
            if let [one] = queued {
                return vec![one.op.run_alone(&mut conn).await];
            }
            tracing::debug!(
                name: "fencelock.batch",
                client = %self.client,
                operations = queued.len(),
                "operations of this client share one script call"
            );
            // A queue holds one kind of operation (its key says which).
            let outcome = match &queued[0].op {
                Work::Lock(_) => {
                    let ops = of_kind(queued, |op| match op {
                        Work::Lock(op) => Some(op),
                        _ => None,
                    });
                    batch::run_batch(&mut conn, &ops).await
                }
                Work::Read(_) => {
                    let reads = of_kind(queued, |op| match op {
                        Work::Read(read) => Some(read),
                        _ => None,
                    });
                    batch::run_reads(&mut conn, &reads).await
                }
                Work::HoldRelease(_) => {
                    let releases = of_kind(queued, |op| match op {
                        Work::HoldRelease(release) => Some(release),
                        _ => None,
                    });
                    batch::run_hold_releases(&mut conn, &releases).await
                }
            };
            match outcome {
                Ok(outcomes) => outcomes,
                Err(err) => queued
                    .iter()
                    .map(|_| Err(Error::from_reply(err.clone())))
                    .collect(),
            }
        };
        #[cfg(fencelock_negative_controls)]
        if let Some(control) = self.control {
            return controls::scoped(control, call).await;
        }
        call.await
    }
}

/// The operations of `queued` that `pick` takes (a queue's, which are all of one kind).
fn of_kind<'a, T>(queued: &'a [Queued], pick: impl Fn(&'a Work) -> Option<&'a T>) -> Vec<&'a T> {
    queued.iter().filter_map(|q| pick(&q.op)).collect()
}

/// The turn of an operation sent alone on an idle route: when its call ends (or its caller
/// drops it), whatever queued behind it goes out, from a task of its own.
struct Turn<'a> {
    batcher: &'a Arc<Batcher>,
    route: Queue,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let Some(calls) = self.batcher.next(&self.route) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.batcher.clone().flush(self.route.clone(), calls));
            }
            Err(_) => {
                // No runtime to send from (a caller dropped outside one): the queued
                // operations fail as if their connection dropped, and re-send themselves.
                for queued in calls {
                    let _ = queued.reply.send(Err(call_lost()));
                }
                self.batcher.busy.lock().remove(&self.route);
            }
        }
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
    /// `acquire.lua` of a plain lock in the default mode, through the group commit.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn acquire_grouped(
        &self,
        conn: &mut Conn,
        keys: &LockKeys,
        holder: &str,
        lease: Duration,
        op_ttl: Duration,
        label: Option<&str>,
        recorded: bool,
    ) -> Result<AcquireReply, Error> {
        if self.batcher.locks_alone() {
            // The call itself, without building an operation for a batch.
            return protocol::acquire_labelled(conn, keys, holder, lease, op_ttl, label, recorded)
                .await;
        }
        let op = Operation::acquire(keys, holder, lease, op_ttl, label, recorded);
        // Boxed: inline, the group commit's state would make every acquire future that much
        // larger, also with the group commit off (a waiting acquisition carries it).
        let queue = Queue::Locks(self.route(keys));
        let reply = Box::pin(self.batcher.run(conn, queue, Work::Lock(op))).await?;
        batch::acquire_outcome(reply)
    }

    /// `release.lua` of a plain lock's hold, through the group commit.
    pub(crate) async fn release_grouped(
        &self,
        conn: &mut Conn,
        keys: &LockKeys,
        holder: &str,
        op_id: &str,
        op_ttl: Duration,
    ) -> Result<OwnerReply, Error> {
        if self.batcher.locks_alone() {
            return protocol::release(conn, keys, holder, op_id, op_ttl, conn.pubsub()).await;
        }
        let op = Operation::release(keys, holder, op_id, op_ttl, conn.pubsub());
        let queue = Queue::Locks(self.route(keys));
        let reply = Box::pin(self.batcher.run(conn, queue, Work::Lock(op))).await?;
        batch::release_outcome(reply)
    }

    /// `rw_acquire.lua` of a read, through the group commit: with the reads of the same lock
    /// and lease that meet it, by `rw_read_many.lua`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn read_grouped(
        &self,
        conn: &mut Conn,
        keys: &LockKeys,
        holder: &str,
        lease: Duration,
        op_ttl: Duration,
        pubsub: PubSub,
        label: Option<&str>,
        recorded: bool,
    ) -> Result<RwAcquireReply, Error> {
        let field_expiry = self.field_expiry;
        if self.batcher.holds_alone() {
            return protocol::semaphore::rw_acquire(
                conn,
                keys,
                holder,
                protocol::semaphore::RwMode::Read,
                lease,
                false,
                op_ttl,
                pubsub,
                field_expiry,
                label,
                recorded,
            )
            .await;
        }
        let read = ReadOperation::new(
            keys,
            holder,
            lease,
            op_ttl,
            pubsub,
            field_expiry,
            label,
            recorded,
        );
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let queue = Queue::Reads(self.route(keys), keys.lock.clone(), lease_ms);
        let reply = Box::pin(self.batcher.run(conn, queue, Work::Read(read))).await?;
        batch::read_outcome(reply)
    }

    /// `sem_release.lua` of a semaphore's or read-write lock's hold, through the group commit:
    /// with the releases of holds of the same lock that meet it, by `sem_release_many.lua`.
    pub(crate) async fn hold_release_grouped(
        &self,
        conn: &mut Conn,
        keys: &LockKeys,
        holder: &str,
        op_id: &str,
        op_ttl: Duration,
        pubsub: PubSub,
    ) -> Result<OwnerReply, Error> {
        if self.batcher.holds_alone() {
            return protocol::release(conn, keys, holder, op_id, op_ttl, pubsub).await;
        }
        let release = HoldRelease::new(keys, holder, op_id, op_ttl, pubsub);
        let queue = Queue::HoldReleases(self.route(keys), keys.lock.clone());
        let work = Work::HoldRelease(release);
        let reply = Box::pin(self.batcher.run(conn, queue, work)).await?;
        batch::hold_release_outcome(reply)
    }
}
