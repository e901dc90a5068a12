//! A synchronous facade for callers without async code: the same locks, guards, tokens and
//! guarantees, driven by a small runtime that the client owns.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock::blocking::LockClient;
//!
//! let client = LockClient::connect("redis://127.0.0.1:7000/")?;
//! let lock = client.lock("report:daily")?;
//! if let Some(guard) = lock.try_acquire()? {
//!     // ... the job that must run on one instance only, writing with guard.token() ...
//!     guard.release()?;
//! }
//! let guard = lock.acquire_timeout(Duration::from_secs(5))?;
//! guard.release()?;
//! # Ok::<(), fencelock::Error>(())
//! ```
//!
//! Every type here is its async namesake driven by the client's runtime, and every method is
//! documented there: a method of this module links to its async counterpart and says only
//! what differs. What differs is the same everywhere. Each method blocks the calling thread
//! until the async operation it wraps completes, so do not call it from inside an async
//! runtime (it panics there, as `Runtime::block_on` does); use the async API instead. The
//! async docs' notes on cancel safety do not apply: a blocking call cannot be cancelled from
//! outside. Bound waiting with the `*_timeout` methods, whose deadline cancels the async
//! operation exactly as dropping its future would (an attempt in flight is undone in the
//! background). A guard dropped without `release` is released in the background, as the
//! async guard is.
//!
//! Multi-lock ([`LockClient::multi_lock`], [`MultiLock`], [`MultiGuard`]) and replica
//! acknowledgement ([`Lock::with_replica_ack`], [`MultiLock::with_replica_ack`]) have the
//! async API's semantics (DESIGN sections 13 and 14); so do elections ([`LockClient::election`],
//! [`Election`], [`LeaderGuard`], [`Observer`]; DESIGN section 18) and scheduled jobs
//! ([`LockClient::job`], [`Job`]; DESIGN section 19), idempotency keys
//! ([`LockClient::idempotency`], [`Idempotency`]; DESIGN section 22), semaphores ([`LockClient::semaphore`],
//! [`Semaphore`], [`SemaphorePermit`]; DESIGN section 20) and read-write locks
//! ([`LockClient::rwlock`], [`RwLock`], [`ReadGuard`], [`WriteGuard`]; DESIGN section 21). They run on the same client
//! runtime. Background work (the watchdog, releases of dropped guards, undoing
//! abandoned acquisitions) runs on the client's own runtime threads; when the last client,
//! lock and guard of a runtime are gone the runtime stops, and a release still pending then
//! falls back to the lease.

// How the facade is built. Every blocking type is the async value (`inner`) plus the client's
// runtime (`runtime`), and nearly every method is the async one, run under `block_on` when it
// is async, with any async type in its result swapped for the blocking one. Two pieces say
// that once:
//
// - `blocking!` declares a whole wrapper from its list of methods: the struct (a plain struct
//   per public name, not an alias of one generic `Blocking<T>`: an alias cannot carry the
//   guards' `#[must_use]`, and a struct keeps its own name in `Debug` output and its own page
//   in rustdoc), its `FromAsync`, and each method from its public signature, one line, with
//   its doc: a link to the async method it runs (or to the one named in `[...]` before it,
//   for a method an async guard has through `Deref`) and whatever the line adds. `= block`
//   runs the method under `block_on`, `= wrap` converts its result with `FromAsync`, `= lost`
//   waits for the async `lost()` with a timeout. The signature is written out, so the public
//   API reads in the source as it does in rustdoc, and the compiler checks it against the
//   async method's.
// - `FromAsync` is the one generic part: it turns what an async method returned (an async
//   handle or guard, or an `Option`, `Result` or `Vec` of them) into the blocking type, handing
//   on the runtime.
//
// Methods that do more than forward (connecting, running a closure on the calling thread, a
// timed wait for a change) are written out, with `block_on_timeout` for the timed
// waits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::{Error, IdempotencyOptions, JobOptions};

/// Declares blocking types, each `pub struct Name(Async) { methods }` (with its docs and
/// attributes; `Debug` is derived for every one): a struct of the async value `inner` and the
/// client's `runtime`, its `FromAsync` of the async value, and its methods. A method is
/// `fn name(receiver, arg: Type, ...) -> Return;`, optionally `= block`, `= wrap`,
/// `= block wrap` or `= lost`, and preceded by `[path]` when its async counterpart is a
/// method of `path` (a type the async value dereferences to); its docs are added to the link.
/// `fn name | twin(...) -> Return;` declares two methods of the same signature, such as a
/// fenced read in its claiming and its shared form; `fn try | wait | timed(&self, ...) -> Guard;`
/// the three acquisitions of a guard (its docs go to the waiting one), as `try_acquire`,
/// `acquire` and `acquire_timeout`.
macro_rules! blocking {
    ($(
        $(#[$attr:meta])*
        pub struct $name:ident($async:path) { $($methods:tt)* }
    )+) => {$(
        $(#[$attr])*
        #[derive(Debug)]
        pub struct $name {
            inner: $async,
            runtime: crate::blocking::Runtime,
        }

        impl crate::blocking::FromAsync<$async> for $name {
            fn from_async(inner: $async, runtime: &crate::blocking::Runtime) -> Self {
                $name {
                    inner,
                    runtime: runtime.clone(),
                }
            }
        }

        impl $name {
            blocking!(@methods $async; $($methods)*);
        }
    )+};
    (@methods $async:path;) => {};
    (
        @methods $async:path;
        $(#[$doc:meta])*
        fn $try:ident | $wait:ident | $timed:ident(&self $(, $arg:ident: $ty:ty)*) -> $guard:ty;
        $($rest:tt)*
    ) => {
        blocking!(
            @methods $async;
            fn $try(&self $(, $arg: $ty)*) -> Result<Option<$guard>, Error> = block wrap;
            $(#[$doc])*
            fn $wait(&self $(, $arg: $ty)*) -> Result<$guard, Error> = block wrap;
            /// At most `timeout`.
            fn $timed(&self $(, $arg: $ty)*, timeout: Duration) -> Result<$guard, Error> = block wrap;
            $($rest)*
        );
    };
    (
        @methods $async:path;
        $(#[$doc:meta])* $([$see:path])?
        fn $fname:ident | $twin:ident $params:tt -> $ret:ty $(= $($how:ident)+)?;
        $($rest:tt)*
    ) => {
        blocking!(
            @methods $async;
            $(#[$doc])* $([$see])? fn $fname $params -> $ret $(= $($how)+)?;
            $(#[$doc])* $([$see])? fn $twin $params -> $ret $(= $($how)+)?;
            $($rest)*
        );
    };
    (
        @methods $async:path;
        $(#[$doc:meta])* $([$see:path])?
        fn $fname:ident $params:tt -> $ret:ty $(= $($how:ident)+)?;
        $($rest:tt)*
    ) => {
        #[doc = blocking!(@doc [$($($how)+)?] $fname, $($see,)? $async)]
        $(#[$doc])*
        pub fn $fname $params -> $ret {
            blocking!(@body [$($($how)+)?] $fname $params)
        }
        blocking!(@methods $async; $($rest)*);
    };
    (@doc [lost] $fname:ident, $of:path $(, $_async:path)?) => {
        concat!(
            "Blocks the thread until [`", stringify!($of), "::lost`] resolves, or `timeout` ",
            "passed; returns whether it did."
        )
    };
    (@doc [$($how:ident)*] $fname:ident, $of:path $(, $_async:path)?) => {
        concat!(
            "See [`", stringify!($of), "::", stringify!($fname), "`]",
            blocking!(@blocks [$($how)*]),
        )
    };
    (@blocks [block $($wrap:ident)?]) => { "; blocks the thread until it returns." };
    (@blocks [$($wrap:ident)?]) => { "." };
    (@body [lost] $fname:ident (&$s:ident, $timeout:ident: $ty:ty)) => {
        crate::blocking::block_on_timeout(&$s.runtime, $timeout, $s.inner.lost()).is_some()
    };
    (@body $how:tt $fname:ident (&mut $s:ident $(, $arg:ident: $ty:ty)* $(,)?)) => {
        blocking!(@call $how $s, $s.inner.$fname($($arg),*))
    };
    (@body $how:tt $fname:ident ($(&)? $s:ident $(, $arg:ident: $ty:ty)* $(,)?)) => {
        blocking!(@call $how $s, $s.inner.$fname($($arg),*))
    };
    (@call [] $s:ident, $call:expr) => {
        $call
    };
    (@call [wrap] $s:ident, $call:expr) => {
        crate::blocking::FromAsync::from_async($call, &$s.runtime)
    };
    (@call [block $($wrap:ident)?] $s:ident, $call:expr) => {
        blocking!(@call [$($wrap)?] $s, $s.runtime.block_on($call))
    };
}

mod election;
mod idempotency;
mod job;
mod lock;
mod multi;
mod resource;
mod rwlock;
mod semaphore;

pub use election::{Election, LeaderGuard, Observer};
pub use idempotency::Idempotency;
pub use job::Job;
pub use lock::{Lock, LockGuard};
pub use multi::{MultiGuard, MultiLock};
pub use resource::FencedResource;
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};

/// The client's runtime, shared by its clones and everything made from it; it stops when the
/// last of them is gone. `Debug` shows the runtime itself, as `Arc` does.
type Runtime = Arc<tokio::runtime::Runtime>;

/// `future` run to completion on `runtime`, blocking the calling thread (panics inside an async
/// runtime, as tokio's `Runtime::block_on` does), giving up after `timeout`: `None` then, and
/// `future` is dropped. The timer is made inside the runtime, where tokio's timers must be made.
fn block_on_timeout<F: Future>(
    runtime: &Runtime,
    timeout: Duration,
    future: F,
) -> Option<F::Output> {
    runtime
        .block_on(async { tokio::time::timeout(timeout, future).await })
        .ok()
}

/// A blocking value made from what an async method returned, sharing the client's runtime.
trait FromAsync<A> {
    fn from_async(value: A, runtime: &Runtime) -> Self;
}

impl<A, B: FromAsync<A>> FromAsync<Option<A>> for Option<B> {
    fn from_async(value: Option<A>, runtime: &Runtime) -> Self {
        value.map(|value| B::from_async(value, runtime))
    }
}

impl<A, B: FromAsync<A>> FromAsync<Result<A, Error>> for Result<B, Error> {
    fn from_async(value: Result<A, Error>, runtime: &Runtime) -> Self {
        value.map(|value| B::from_async(value, runtime))
    }
}

impl<A, B: FromAsync<A>> FromAsync<Vec<A>> for Vec<B> {
    fn from_async(value: Vec<A>, runtime: &Runtime) -> Self {
        value
            .into_iter()
            .map(|value| B::from_async(value, runtime))
            .collect()
    }
}

blocking! {
    /// A blocking [`crate::LockClient`]. Cheap to clone; clones share the connection and
    /// runtime.
    ///
    /// ```no_run
    /// use fencelock::blocking::LockClient;
    ///
    /// let client = LockClient::connect("redis://127.0.0.1:7000/")?;
    /// let worker = client.clone(); // the same connection and runtime, for another thread
    /// std::thread::spawn(move || worker.lock("report:daily")?.acquire()?.release());
    /// println!("client {}", client.as_async().id());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    #[derive(Clone)]
    pub struct LockClient(crate::LockClient) {
        /// [`crate::Lock`] has an example.
        fn lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, Error> = wrap;
        fn election(&self, name: impl AsRef<[u8]>) -> Result<Election, Error> = wrap;
        /// [`Job`] shows a job run from a thread.
        fn job(&self, name: impl AsRef<[u8]>, options: JobOptions) -> Result<Job, Error> = wrap;
        /// [`Idempotency`] shows a request run from a thread.
        fn idempotency(
            &self,
            namespace: impl AsRef<[u8]>,
            options: IdempotencyOptions,
        ) -> Result<Idempotency, Error> = wrap;
        /// [`crate::FencedResource`] has an example.
        fn resource(&self, name: impl AsRef<[u8]>) -> Result<FencedResource, Error> = wrap;
        /// [`Semaphore`] has an example.
        fn semaphore(&self, name: impl AsRef<[u8]>, limit: u32) -> Result<Semaphore, Error> = wrap;
        /// [`crate::RwLock`] has an example.
        fn rwlock(&self, name: impl AsRef<[u8]>) -> Result<RwLock, Error> = wrap;
    }
}

impl LockClient {
    /// Connects with default options; see [`crate::LockClient::connect`].
    ///
    /// # Errors
    /// As [`crate::LockClient::connect`]; [`Error::InvalidConfig`] if the runtime cannot start.
    pub fn connect(url: &str) -> Result<LockClient, Error> {
        LockClient::connect_with(crate::LockClient::builder(url))
    }

    /// Connects with the options of `builder`; see [`crate::LockClientBuilder::connect`].
    ///
    /// # Errors
    /// As [`crate::LockClientBuilder::connect`]; [`Error::InvalidConfig`] if the runtime
    /// cannot start.
    pub fn connect_with(builder: crate::LockClientBuilder) -> Result<LockClient, Error> {
        // Two worker threads: one for the connection and the watchdog, one so that a release
        // scheduled by a dropped guard never waits behind a blocked caller.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fencelock")
            .enable_all()
            .build()
            .map_err(|e| Error::InvalidConfig {
                reason: format!("cannot start the blocking client's runtime: {e}"),
            })?;
        let inner = runtime.block_on(builder.connect())?;
        Ok(LockClient {
            inner,
            runtime: Arc::new(runtime),
        })
    }

    /// See [`crate::LockClient::multi_lock`] (and [`crate::MultiLock`] for an example).
    ///
    /// # Errors
    /// As [`crate::LockClient::multi_lock`].
    pub fn multi_lock<I, N>(&self, names: I) -> Result<MultiLock, Error>
    where
        I: IntoIterator<Item = N>,
        N: AsRef<[u8]>,
    {
        FromAsync::from_async(self.inner.multi_lock(names), &self.runtime)
    }

    /// The async client underneath, for code that mixes both.
    pub fn as_async(&self) -> &crate::LockClient {
        &self.inner
    }
}
