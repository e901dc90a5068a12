//! The failure-story suite: "fencing at the storage boundary".
//!
//! Each story is one way a lock holder ends up writing after it lost the lock (a pause, a
//! delayed packet, a late reply, a deleted key, a restart, a failover, a partition, a crash),
//! played against real `redis-server` lock servers and a real storage, seeded and repeated.
//! Every iteration checks the same three things:
//!
//! - **zero stale writes accepted**: the story's stale write is refused with a stale-token
//!   error, and [`crate::common::ledger::check`] finds no accepted write older than one accepted
//!   before it (in storage order, and in this process' real-time order);
//! - **the ledger equals a serial execution** of the accepted writes: replaying the entries
//!   gives every stored running balance and the stored balance, and every acknowledged write
//!   is there exactly once;
//! - **the lock is free at the end**, and every token is greater than all tokens the story
//!   saw before it (across iterations, restarts and failovers).
//!
//! The storage is always separate from the lock server, written through the
//! [`crate::common::ledger::Ledger`] abstraction, on three backends: Redis (a second `redis-server`,
//! via `FencedResource`), SQLite (a WAL-mode database file) and PostgreSQL (a throwaway
//! server), the SQL ones with the statements of `fencelock::sql`. Every story runs on every
//! backend, except story 2 on SQLite: it delays the storage's network traffic, and SQLite has
//! none. A story runs its backends at the same time, each on its own thread, tokio runtime
//! and servers (`support::on_each_backend`), as separate tests would.
//!
//! Knobs: `FENCELOCK_STORY_ITERATIONS` (default 50, per story and backend),
//! `FENCELOCK_STORY_SEED` (default random; every story prints its seed, and every failure
//! message repeats it), `FENCELOCK_STORY_STORAGE` (default: all of `redis,sqlite,postgres`; a
//! comma-separated list restricts them). Nothing asserts a wall-clock duration: waits are
//! bounded polls with a generous limit, and timing only ever decides *which* path an
//! iteration takes, never whether it passes.
//!
//! Stories that need another process (1b, 8) re-run this binary as a child with one test
//! selected; those child tests do nothing when run normally.

// The story modules share helpers with each other: `pub` here means "for the other stories".
#![allow(unreachable_pub)]

#[path = "stories/checker.rs"]
mod checker;
#[path = "stories/crash.rs"]
mod crash;
#[path = "stories/delayed_write.rs"]
mod delayed_write;
#[path = "stories/failover.rs"]
mod failover;
#[path = "stories/partition.rs"]
mod partition;
#[path = "stories/pause.rs"]
mod pause;
#[path = "stories/restart.rs"]
mod restart;
#[path = "stories/slow_acquire.rs"]
mod slow_acquire;
#[path = "stories/support.rs"]
mod support;
#[path = "stories/tampering.rs"]
mod tampering;
