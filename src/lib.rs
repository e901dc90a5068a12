//! Reentrant, fenced distributed locks on Redis that stay correct when real systems misbehave.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fencelock::Error> {
//! use fencelock::LockClient;
//!
//! let client = LockClient::connect("redis://127.0.0.1:7000/").await?;
//! let lock = client.lock("account:42")?;
//!
//! let guard = lock.acquire().await?;
//! // ... read the balance, check it, write it back *with* guard.token() ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! See `DESIGN.md` in the repository for the protocol, the Redis data layout and the exact
//! guarantees and their limits.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod blocking;
mod builder;
mod client;
mod connection;
mod error;
mod guard;
mod holder;
mod lease;
mod lock;
mod protocol;
mod resource;
mod token;
mod wait;
mod watchdog;

/// Fenced writes to SQL databases, and a guide to fencing any other storage.
pub mod sql;
#[cfg(feature = "testing")]
pub mod testing;

pub use builder::LockClientBuilder;
pub use client::LockClient;
pub use error::Error;
pub use guard::LockGuard;
pub use lock::Lock;
pub use protocol::keys::MAX_NAME_LEN;
pub use resource::FencedResource;
pub use token::FencingToken;

/// The README's examples, compiled as doc tests so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
