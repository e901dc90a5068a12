//! The public API: the client and its builder, the lock and its guard, the multi-lock, the
//! fenced resource, the leadership election, the semaphore and the read-write lock, jobs and
//! idempotency keys. Each file holds one of them; what the handles of holds share (options,
//! the acquisition request, the acquire calls) is `handle.rs`, and what everything shares (ids,
//! connection, waiting, renewal, undo) is the engine's.

pub(crate) mod builder;
pub(crate) mod client;
pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod handle;
pub(crate) mod idempotency;
pub(crate) mod job;
pub(crate) mod lock;
pub(crate) mod multi;
pub(crate) mod resource;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
