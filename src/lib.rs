//! Reentrant, fenced distributed locks on Redis that stay correct when real systems misbehave.
//!
//! fencelock serialises work on one resource across many processes: deduct a balance, sell the
//! last item, process a payment once, run scheduled jobs on one instance. This page walks from
//! a first lock to the guarantees that make it safe to bet money on; `DESIGN.md` in the
//! repository has the protocol, the data layout in Redis and every limit.
//!
//! # A first lock
//!
//! One [`LockClient`] per process (clones share its connection), one [`Lock`] per resource name,
//! one [`LockGuard`] per critical section:
//!
//! ```no_run
//! # async fn demo() -> Result<(), fencelock::Error> {
//! use fencelock::LockClient;
//!
//! let client = LockClient::connect("redis://127.0.0.1:7000/").await?;
//! let lock = client.lock("account:42")?;
//!
//! let guard = lock.acquire().await?; // waits until the lock is free
//! // ... read the balance, check it, write it back *with* guard.token() ...
//! guard.release().await?; // Err(NotHeld) if the lease had run out meanwhile
//! # Ok(()) }
//! ```
//!
//! [`Lock::try_acquire`] returns `Ok(None)` at once when the lock is busy;
//! [`Lock::acquire_timeout`] gives up with [`Error::Timeout`] at a deadline. A guard that is
//! dropped instead of released releases in the background.
//!
//! # Fencing: the token is the real protection
//!
//! Every fresh acquisition returns a [`FencingToken`], strictly increasing per lock name. A lease
//! cannot stop a holder that pauses (GC, page fault, `SIGSTOP`) past it and then writes; storage
//! that remembers the highest token it has seen can. Send the token with every read and write of
//! the critical section and let the storage refuse older ones:
//!
//! - Redis as the storage: [`FencedResource`] checks the token, writes and raises its high-water
//!   mark in one script ([`Error::StaleToken`] for a holder that was overtaken). Its reads claim
//!   the resource for the reader's token, so a paused holder cannot slip a write in between the
//!   new holder's read and write.
//! - SQL: the [`sql`] module is the guide (a `fence` column, `fence <= token` in the statement)
//!   and reads the outcome.
//!
//! ```no_run
//! # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
//! let guard = client.lock("account:42")?.acquire().await?;
//! let balance = client.resource("balance:42")?;
//! let cents = balance.get_i64(guard.token()).await?.unwrap_or(0); // claims it for this token
//! if cents >= 500 {
//!     balance.incr_by(guard.token(), -500).await?; // StaleToken if a newer holder claimed it
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Re-entry
//!
//! A nested critical section on the same resource re-enters through the guard it already holds
//! ([`LockGuard::reenter`]) and sees the same token; the lock is free again when every entry is
//! released. Re-entry is a capability, not a thread or task identity: two tasks that merely share
//! a client are two holders and exclude each other (see `DESIGN.md` §4 for why).
//!
//! # Leases, the watchdog and the lost signal
//!
//! Every hold is a lease. A lock from [`LockClient::lock`] is renewed by the client's watchdog
//! (one batched script call per tick for all held locks) while its guard lives, and stops being
//! renewed the moment the guard is released or dropped; [`Lock::with_lease`] gives a fixed lease
//! that ends on its own, [`LockGuard::extend`] moves it. When the lock is found gone (expired,
//! deleted by an operator, lost in a failover), [`LockGuard::lost`] resolves and
//! [`LockGuard::is_valid`] turns false: stop working on the resource.
//!
//! ```no_run
//! # async fn debit(_: fencelock::FencingToken) {}
//! # async fn demo(lock: fencelock::Lock) -> Result<(), fencelock::Error> {
//! let guard = lock.acquire().await?;
//! tokio::select! {
//!     () = debit(guard.token()) => guard.release().await?,
//!     () = guard.lost() => eprintln!("lock lost mid-way; the debit was abandoned"),
//! }
//! # Ok(()) }
//! ```
//!
//! # Waiting without polling
//!
//! Waiters sleep on pub/sub: a release publishes on the lock's channel, and per client only the
//! first waiter of a lock (FIFO) asks Redis again, once per release. If a notification is lost
//! the waiter wakes when the holder's lease would have run out.
//!
//! # Cancellation and retries
//!
//! Every future of this crate may be dropped at any point: an acquisition that was granted on
//! the server after its future was dropped is undone (the exact operation, by its id), so a
//! `select!` or a timeout never leaks a lock. Requests that fail for transient reasons (a lost
//! reply, a reconnect) are re-sent with the same operation id and replay instead of applying
//! twice. Each method documents its cancellation behaviour.
//!
//! # Several locks at once
//!
//! [`LockClient::multi_lock`] takes a set of locks all or nothing, always in one global order,
//! so two transfers in opposite directions cannot deadlock; the [`MultiGuard`] has one token
//! per lock.
//!
//! ```no_run
//! # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
//! let guard = client.multi_lock(["account:7", "account:3"])?.acquire().await?;
//! let (from, to) = (client.resource("balance:7")?, client.resource("balance:3")?);
//! from.incr_by(guard.token("account:7").unwrap(), -100).await?;
//! to.incr_by(guard.token("account:3").unwrap(), 100).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Leadership election
//!
//! [`LockClient::election`] elects one leader per name among any number of candidates: the
//! leader holds the election's lock (so leases, the watchdog, waiting and cancellation are the
//! lock's), its [`LeaderGuard::term`] is that lock's fencing token, strictly increasing across
//! leaders, and its metadata (an address, at most [`MAX_METADATA_LEN`] bytes) is recorded
//! with it for everyone to read ([`Election::leader`]) or follow ([`Election::observe`]).
//!
//! ```no_run
//! # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
//! let election = client.election("scheduler")?;
//! let leader = election.campaign(b"10.0.0.7:8080").await?; // waits until this one leads
//! let state = client.resource("scheduler-state")?;
//! state.set(leader.term(), b"tick").await?; // a deposed leader's write is refused
//! leader.resign().await?; // the next candidate is woken at once
//! # Ok(()) }
//! ```
//!
//! # Replicas
//!
//! [`LockClientBuilder::replica_ack`] and [`Lock::with_replica_ack`] make an acquisition wait
//! (`WAIT`, on a connection of its own to the lock's primary, on every topology) until
//! replicas confirmed it, so that a failover to one
//! of them keeps the lock and its token; a shortfall rolls the acquisition back
//! ([`Error::ReplicationTimeout`]) or, by choice ([`OnShortfall`]), returns a guard marked
//! unreplicated. It is not consensus: `DESIGN.md` §13 says what it does not cover.
//!
//! # Redis Cluster and Sentinel
//!
//! [`LockClient::cluster_builder`] connects to a Redis Cluster (every key of a lock shares one
//! hash slot; waiters are woken by sharded pub/sub; the watchdog renews per slot), and
//! [`LockClient::sentinel_builder`] to the primary a set of Sentinels monitors, following it
//! through failovers. The API and the guarantees are the same; `DESIGN.md` §15 says what a
//! failover can still break.
//!
//! # Without async
//!
//! [`blocking`] wraps the same client, locks and guards for plain threads.
//!
//! # Observability and security
//!
//! Every acquisition, release, renewal batch and lost lease is a `tracing` event with a stable
//! name; the acquire span is a child of the caller's span. With the `metrics` feature the same
//! moments are counters and histograms on the `metrics` facade. [`observability`] lists every
//! name and field. ACL refusals are [`Error::PermissionDenied`]; the README gives the
//! least-privilege ACL line of a fencelock user. With the `tls` feature, `rediss://` URLs work,
//! and [`LockClientBuilder`] takes a private CA (`tls_root_ca`).
//!
//! # Operating it
//!
//! [`admin`] lists, inspects, watches and force-releases locks and checks a server for what
//! breaks locks (`doctor`: eviction policy, persistence, replication, clock offset); the
//! `fencelock` binary of the companion crate `fencelock-cli` (`cargo install fencelock-cli`)
//! is a thin shell over it with documented exit codes.
//!
//! # Testing your own code
//!
//! The companion crate `fencelock-testing` starts throwaway `redis-server` (replicas,
//! Sentinel, Cluster) and PostgreSQL processes on free loopback ports, injects network faults
//! with a proxy, and checks the history of your own critical sections (mutual exclusion,
//! fencing) with its `check` module: the same harness this crate's own tests use.
//!
//! # Guarantees and their limits
//!
//! At most one holder holds a lock while leases hold; fresh tokens strictly increase per lock
//! name, also across expiry, manual deletion and server restarts. Leases are time, and Redis
//! replication is asynchronous: a paused holder or a failover can let two holders run at once,
//! and then only fenced writes keep the data right. Configure `maxmemory-policy noeviction`
//! ([`LockClient::eviction_risk`] checks it). `DESIGN.md` §8 lists exactly which fault breaks
//! which guarantee.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
// Tokens are u64 here and integers in Lua; a sign or width lost in a cast is a wrong token.
#![warn(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

// The layers, lowest first. A module imports only from its own layer and the ones below it
// (`tests/layering.rs` checks this on every test run; DESIGN.md §1 draws it).
mod api;
mod base;
mod engine;
mod protocol;
mod transport;

pub mod admin;
pub mod blocking;
pub mod observability;
pub mod sql;

pub use api::builder::LockClientBuilder;
pub use api::client::LockClient;
pub use api::election::{Election, Leader, LeaderGuard, Observer, MAX_METADATA_LEN};
pub use api::guard::LockGuard;
pub use api::idempotency::{
    Failure, Idempotency, IdempotencyOptions, KeyRun, Processed, RunRecord, MAX_FINGERPRINT_LEN,
    MAX_RESULT_LEN,
};
pub use api::job::{
    Job, JobOptions, JobOutcome, JobRun, OnFailure, OnRunnerDeath, TickRecord, Ticks,
};
pub use api::lock::Lock;
pub use api::multi::{MultiGuard, MultiLock, MAX_MULTI_LOCKS};
pub use api::resource::FencedResource;
pub use api::rwlock::{ReadGuard, RwLock, WriteGuard};
pub use api::semaphore::{Semaphore, SemaphorePermit};
pub use base::config::HoldExpiry;
pub use base::error::{Error, Superseded};
pub use base::replica_ack::OnShortfall;
pub use base::token::FencingToken;
pub use protocol::keys::MAX_NAME_LEN;
pub use protocol::server::{ServerFlavour, ServerInfo};

/// Deliberately broken protocol variants for the project's own property tests; compiled only
/// with `--cfg fencelock_negative_controls`, never in a dependent's build.
#[cfg(fencelock_negative_controls)]
#[doc(hidden)]
pub mod negative_controls {
    pub use crate::protocol::controls::Control;
}

/// The README's examples, compiled as doc tests so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
