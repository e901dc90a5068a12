//! The public API: the client and its builder, the lock and its guard, the multi-lock, the
//! fenced resource and the leadership election. Each file holds one of them; what they share (ids, connection, waiting,
//! renewal, undo) is the engine's.

pub(crate) mod builder;
pub(crate) mod client;
pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod idempotency;
pub(crate) mod job;
pub(crate) mod lock;
pub(crate) mod multi;
pub(crate) mod resource;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
