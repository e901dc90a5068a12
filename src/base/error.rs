//! The one error type of the crate.

use std::fmt;
use std::time::Duration;

use super::token::FencingToken;

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// Match on the variants or use the predicates (`is_timeout()`, `is_not_held()`, ...), which stay
/// stable when variants are added.
///
/// ```
/// use fencelock::Error;
///
/// fn what_happened(err: &Error) -> &'static str {
///     match err {
///         Error::NotHeld { .. } => "lost the lock before the work was done",
///         err if err.is_timeout() => "gave up waiting",
///         _ => "something else",
///     }
/// }
/// assert_eq!(what_happened(&Error::Cancelled), "something else");
/// assert!(!Error::Cancelled.is_not_held());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name is empty or too long.
    #[error("invalid lock name: {reason}")]
    InvalidName {
        /// What is wrong with the name.
        reason: String,
    },

    /// A lease is zero, too long, or not a whole number of milliseconds above zero.
    #[error("invalid lease {lease:?}: {reason}")]
    InvalidLease {
        /// The lease that was asked for.
        lease: Duration,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A client option (prefix, timeouts, URL) is unusable.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },

    /// The deadline of a call passed before what it waited for came: an acquire's lock
    /// (semaphore's permits, read-write lock's side, election's term) stayed held by others,
    /// or an observer saw no change of leader.
    #[error("timed out after {waited:?} waiting for {name}")]
    #[non_exhaustive]
    Timeout {
        /// What the call waited for: the lock's (semaphore's, read-write lock's, election's)
        /// name, or a multi-lock's names, readable (control characters and bytes that are not
        /// UTF-8 escaped).
        name: String,
        /// How long the call waited.
        waited: Duration,
    },

    /// This guard's holder no longer holds the lock: its lease ran out, the key was deleted, or
    /// another holder took over. Nothing was changed on the server.
    #[error("{name} is not held by this holder any more (lease expired, deleted or taken over)")]
    #[non_exhaustive]
    NotHeld {
        /// The lock's name (a semaphore's, read-write lock's, election's, job's or idempotency
        /// key's lock), readable: control characters and bytes that are not UTF-8 escaped.
        name: String,
    },

    /// A key where the lock (or its fence counter) lives holds a value fencelock did not write,
    /// for example because someone ran `SET` on it. Nothing was changed.
    #[error(
        "a key of {} holds foreign data: {detail}",
        if name.is_empty() { "this lock" } else { name.as_str() }
    )]
    #[non_exhaustive]
    WrongType {
        /// The name of the lock (semaphore, read-write lock, election, job, fenced resource, or
        /// `namespace:key` of an idempotency key) whose key it is, readable as in
        /// [`Error::NotHeld`]; empty where the call concerns no single name.
        name: String,
        /// The server's description.
        detail: String,
    },

    /// A fenced operation was refused because a newer token got there first: the holder's
    /// lock (or its job tick, or its shared hold) was taken over while it still believed it
    /// held it. `by` says what the newer token did: wrote or claimed the resource, read it as
    /// a reader, or took the job's tick over. Nothing was written (or read).
    #[error(
        "stale fencing token {presented}{}{resource}: {by} with token {latest}",
        if resource.is_empty() { "" } else { " for " }
    )]
    #[non_exhaustive]
    StaleToken {
        /// What refused it, readable: the fenced resource's name, the job's name, or the
        /// idempotency key as `namespace:key`; empty for a SQL row (`fencelock::sql`), which
        /// only the caller can name.
        resource: String,
        /// The token the refused operation carried.
        presented: FencingToken,
        /// The newer token: the highest the resource has accepted, or the job's runner.
        latest: FencingToken,
        /// What the holder of `latest` did.
        by: Superseded,
    },

    /// The fence counter cannot issue another exact token (it reached 2^53).
    #[error("the fence counter is exhausted: {detail}")]
    TokenOverflow {
        /// The server's description.
        detail: String,
    },

    /// The operation had no effect because it was cancelled (a compensating cancel of the same
    /// operation id), or because it is a late copy of an acquisition whose hold had already
    /// ended (its reply was lost, it was re-sent after the lease ran out).
    #[error("the operation was cancelled before it took effect")]
    Cancelled,

    /// The Redis user lacks a command fencelock needs (also one of the commands a
    /// script calls), or may not touch a key or channel under this client's prefix (ACL). See
    /// the README's Security section for the ACL rules a fencelock user needs. A client whose
    /// prefix lies outside the user's key pattern gets this on its first operation, before
    /// anything is written; a script refused midway keeps what it wrote before the refused
    /// command.
    #[error("redis refused the operation (ACL): {detail}")]
    PermissionDenied {
        /// The server's description.
        detail: String,
    },

    /// An acquisition that required replica acknowledgement (`WAIT`) was confirmed by fewer
    /// replicas than required within its timeout. The acquisition was rolled back before this
    /// error was returned: the lock is free (unless someone else took it since).
    #[error(
        "acquisition of {name} reached {acked} of the {required} required replicas in time; \
         rolled back"
    )]
    #[non_exhaustive]
    ReplicationTimeout {
        /// The lock's name (a multi-lock's names, joined with ", "), readable as in
        /// [`Error::NotHeld`].
        name: String,
        /// Replicas that confirmed the acquisition.
        acked: u32,
        /// Replicas the acquisition required.
        required: u32,
    },

    /// The server cannot do what this client needs: for example a cluster client on Redis 6.2,
    /// which has no sharded pub/sub to wake waiters with. Refused at connect; nothing was
    /// written. README's compatibility table lists what each server supports.
    #[error("{server} cannot serve this client: it lacks {lacks}")]
    UnsupportedServer {
        /// The server and its version, as it reported them (`HELLO`).
        server: String,
        /// What it lacks, and which release has it.
        lacks: String,
    },

    /// The set of names given to a multi-lock is unusable: empty, too many names, or the same
    /// name twice. Nothing was sent.
    #[error("invalid lock set: {reason}")]
    InvalidLockSet {
        /// What is wrong with the set.
        reason: String,
    },

    /// The metadata given to an election campaign is larger than
    /// [`MAX_METADATA_LEN`](crate::MAX_METADATA_LEN). Nothing was sent.
    #[error("invalid leader metadata: {len} bytes, at most {max} are allowed")]
    InvalidMetadata {
        /// The length of the refused metadata.
        len: usize,
        /// The most an election accepts.
        max: usize,
    },

    /// The options of a scheduled job are unusable (a period of zero, `at_least_for` longer
    /// than `at_most_for`, a retention shorter than the period...), or a tick given to
    /// [`Job::run_exclusive`](crate::Job::run_exclusive) lies before the Unix epoch or too far
    /// after it. Nothing was sent.
    #[error("invalid job: {reason}")]
    InvalidJob {
        /// What is wrong.
        reason: String,
    },

    /// The options of an idempotency namespace are unusable (a retention shorter than
    /// `at_most_for`...), or a namespace, key or fingerprint is empty, too long or (for a
    /// namespace) contains `:`. Nothing was sent.
    #[error("invalid idempotency key: {reason}")]
    InvalidIdempotency {
        /// What is wrong.
        reason: String,
    },

    /// An idempotency key was used before for another request: the fingerprint recorded with
    /// it differs from the one given. Nothing ran and nothing changed.
    #[error(
        "idempotency key {key} of {namespace} was used for another request (its recorded \
         fingerprint differs)"
    )]
    #[non_exhaustive]
    KeyReused {
        /// The key as given to the run, readable (control characters and bytes that are not
        /// UTF-8 escaped).
        key: String,
        /// Its namespace ([`LockClient::idempotency`](crate::LockClient::idempotency)),
        /// readable.
        namespace: String,
    },

    /// A run returned a result longer than an idempotency record stores. The run happened;
    /// its result was not stored and the key was left to a retry, as after a failure.
    #[error("run result of {len} bytes is over the {max} bytes an idempotency record stores")]
    ResultTooLarge {
        /// The length of the refused result.
        len: usize,
        /// The most a record stores.
        max: usize,
    },

    /// A semaphore request asks for no permits, or for more than the semaphore has in all (its
    /// handle's limit, or the limit recorded in Redis while the semaphore is in use, which an
    /// operator may have lowered). Nothing is held.
    #[error("invalid permit request: {reason}")]
    InvalidPermits {
        /// What is wrong.
        reason: String,
    },

    /// Talking to Redis failed. The operation may or may not have taken effect; fencelock retries
    /// mutating operations with the same operation id so that a retry never applies twice.
    /// A connect that reached no server says which address it tried (`host:port`, never the
    /// password): the server's, the cluster's seed nodes' or the Sentinels'.
    #[error("redis: {0}")]
    Redis(redis::RedisError),

    /// The server answered something the protocol does not define (a different script under our
    /// SHA, a proxy that rewrites replies).
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        match ErrorClass::of(&err) {
            // ACL refusals are a configuration problem, not a flaky connection: typed, so
            // callers and the retry policy never retry them. The detail is the server's words,
            // wherever the refusal sits in the error.
            ErrorClass::PermissionDenied => Error::PermissionDenied {
                detail: match refusal_among(&err) {
                    Some((_, refused)) => refused.details().unwrap_or_default().to_owned(),
                    None => err.to_string(),
                },
            },
            _ => Error::Redis(err),
        }
    }
}

/// What a newer token did that made an older one stale ([`Error::StaleToken`]).
///
/// ```
/// use fencelock::{Error, FencingToken, Superseded};
/// assert_eq!(
///     Superseded::WroteOrClaimed.to_string(),
///     "a newer holder wrote or claimed the resource",
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Superseded {
    /// A holder with a newer token wrote the resource, or claimed it (a claiming read, a
    /// claim, a SQL fence): one mark records both, so they are not told apart.
    WroteOrClaimed,
    /// A reader with a newer token read the resource with a shared read: a write older than
    /// that reader's hold cannot land under it.
    SharedRead,
    /// Another runner took the job's tick (or the idempotency key) over with a newer token.
    TookOver,
    /// The resource is kept for a retention ([`FencedResource::with_retention`]) and its marks
    /// have expired, so it no longer knows which tokens wrote it; every token issued before
    /// the retention began may be older than one that did, and is refused. `latest` is the
    /// oldest token it accepts now.
    ///
    /// [`FencedResource::with_retention`]: crate::FencedResource::with_retention
    Expired,
}

impl fmt::Display for Superseded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Superseded::WroteOrClaimed => "a newer holder wrote or claimed the resource",
            Superseded::SharedRead => "a newer reader read the resource",
            Superseded::TookOver => {
                "another runner took the run (a job tick, an idempotency key) over"
            }
            Superseded::Expired => {
                "the resource's marks expired after its retention, and it accepts no token \
                 issued before it; the oldest accepted is"
            }
        })
    }
}

/// Bytes as readable text, for names in errors and listings: UTF-8 as is, control characters
/// and backslashes escaped as Rust does, other bytes as `\xNN`, so that no name can forge a
/// line or hide in a terminal.
pub(crate) fn display_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

impl Error {
    /// [`Error::Timeout`] of a call for `name` that started at `started`.
    pub(crate) fn timeout(name: &[u8], started: std::time::Instant) -> Error {
        Error::Timeout {
            name: display_bytes(name),
            waited: started.elapsed(),
        }
    }

    /// This error, naming `name` where it concerns a key of that name and names none yet
    /// ([`Error::WrongType`] from a script's reply, which knows only the key).
    pub(crate) fn named(self, name: &[u8]) -> Error {
        match self {
            Error::WrongType {
                name: unnamed,
                detail,
            } if unnamed.is_empty() => Error::WrongType {
                name: display_bytes(name),
                detail,
            },
            other => other,
        }
    }

    /// [`Error::NotHeld`]: the hold of `name` is no longer this holder's.
    pub(crate) fn not_held(name: &[u8]) -> Error {
        Error::NotHeld {
            name: display_bytes(name),
        }
    }

    /// [`Error::StaleToken`] of an operation on `resource` with token `presented`.
    pub(crate) fn stale(
        resource: &[u8],
        presented: FencingToken,
        latest: FencingToken,
        by: Superseded,
    ) -> Error {
        Error::StaleToken {
            resource: display_bytes(resource),
            presented,
            latest,
            by,
        }
    }

    /// The error of a request to one of fencelock's own keys (a script call, an inspection
    /// read): as [`From`], and the scripts' own error replies typed. `WRONGTYPE` (and the
    /// scripts' `FENCELOCK_WRONGTYPE`) says foreign data sits at one of our keys.
    pub(crate) fn from_reply(err: redis::RedisError) -> Error {
        let detail = || err.detail().unwrap_or_default().to_owned();
        match err.code() {
            Some("FENCELOCK_WRONGTYPE" | "WRONGTYPE") => Error::WrongType {
                name: String::new(),
                detail: detail(),
            },
            Some("FENCELOCK_OVERFLOW") => Error::TokenOverflow { detail: detail() },
            Some("FENCELOCK_BADARG") => Error::Protocol(detail()),
            _ => Error::from(err),
        }
    }

    /// The error of a failed connect to `to`: an address (`host:port`, a socket path) or a list
    /// of them, never a URL, so no password shows. A connection failure says where it was
    /// going ("connecting to 127.0.0.1:6380: Connection refused") and keeps its kinds, redis-rs'
    /// `Io` and the I/O error's own, so it classifies exactly as it did; any other error
    /// (refused credentials, a server's reply) is as [`From`], already self-explanatory.
    pub(crate) fn connecting(to: impl fmt::Display, err: redis::RedisError) -> Error {
        if !err.is_io_error() {
            return Error::from(err);
        }
        // redis-rs' own I/O errors without an `io::Error` inside (a cluster client that reached
        // no seed node) count as a dropped connection there; `NotConnected` keeps that.
        let kind = io_error_in(&err).map_or(std::io::ErrorKind::NotConnected, std::io::Error::kind);
        let addressed = Unreachable {
            to: to.to_string(),
            cause: err,
        };
        Error::Redis(redis::RedisError::from(std::io::Error::new(
            kind, addressed,
        )))
    }

    /// What a failed request says about itself and the server, for a Redis error; `None` for
    /// every error fencelock decided on by itself.
    pub(crate) fn class(&self) -> Option<ErrorClass> {
        match self {
            Error::Redis(err) => Some(ErrorClass::of(err)),
            _ => None,
        }
    }
}

/// The `io::Error` inside a redis-rs error. redis-rs 1.x keeps it behind an `Arc`, and its
/// `source()` is that `Arc`; `tests::a_failed_connect_names_its_address_and_keeps_its_class`
/// fails if a redis-rs release hides it otherwise.
fn io_error_in(err: &redis::RedisError) -> Option<&std::io::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let cause = std::error::Error::source(err)?;
    cause.downcast_ref::<std::io::Error>().or_else(|| {
        cause
            .downcast_ref::<Shared>()
            .and_then(|shared| shared.downcast_ref::<std::io::Error>())
    })
}

/// A connection failure and where it was going: the message of [`Error::connecting`].
#[derive(Debug, thiserror::Error)]
#[error("connecting to {to}: {cause}")]
struct Unreachable {
    to: String,
    #[source]
    cause: redis::RedisError,
}

/// The ACL refusal (`NOPERM`) among a reply's server errors: the reply's own error, or one of
/// an aborted transaction's (a command refused when queued in MULTI aborts the whole
/// transaction, and the refusal is not the error's own code) or a pipeline's.
fn refusal_among(err: &redis::RedisError) -> Option<(usize, redis::ServerError)> {
    err.clone()
        .into_server_errors()
        .and_then(|errors| errors.iter().find(|(_, e)| e.code() == "NOPERM").cloned())
}

/// What a failed request tells about itself and the server: the one place that reads
/// redis-rs' error kinds and the server's error codes. Every retry, failover and
/// redirection decision of the crate asks this, so they cannot disagree about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// The connection failed: not reached, cut, or no reply in time. The request may or may
    /// not have run, and the primary may be another server now.
    ///
    /// redis-rs (1.x) gives every one of those `ErrorKind::Io`: its `is_timeout`,
    /// `is_connection_dropped` and `is_connection_refusal` only narrow that kind down, so the
    /// kind alone decides. `tests::every_connection_failure_is_an_io_error` pins this per
    /// `io::ErrorKind`, so a redis-rs that classed them otherwise fails there.
    ConnectionLost,
    /// The server cannot serve the request yet (`LOADING` after a restart, `TRYAGAIN` during
    /// a slot migration, `NOSCRIPT` from a node the script was not loaded on): it did not run;
    /// the same server may serve it soon. A script call answered `NOSCRIPT` twice (redis-rs
    /// loads the script after the first and calls it again) met a cluster node the load did not
    /// reach, a primary just promoted while the client's map still names the old one: the next
    /// attempt, after the map is refreshed, loads it there.
    NotReady,
    /// The node is not the primary that may serve the request: `READONLY` (a replica, or a
    /// demoted primary), `MASTERDOWN` (a replica cut off from its primary), `CLUSTERDOWN` (a
    /// cluster without an owner for the slot). It did not run; the primary may have moved.
    NotPrimary,
    /// `MOVED` or `ASK`: another node serves the slot. It did not run.
    Redirected,
    /// The ACL refused a command (`NOPERM`, also inside a script or a transaction).
    PermissionDenied,
    /// The server refused the credentials (`WRONGPASS`, `NOAUTH`, a failed `AUTH`).
    AuthRefused,
    /// Anything else: a definite answer that a re-send would only repeat.
    Other,
}

impl ErrorClass {
    /// Classifies a redis-rs error.
    pub(crate) fn of(err: &redis::RedisError) -> ErrorClass {
        if err.is_io_error() {
            return ErrorClass::ConnectionLost;
        }
        if err.kind() == redis::ErrorKind::AuthenticationFailed {
            return ErrorClass::AuthRefused;
        }
        if err.redirect_node().is_some() {
            return ErrorClass::Redirected;
        }
        if let Some(failure) = ErrorClass::known(err.code()) {
            return failure;
        }
        if refusal_among(err).is_some() {
            return ErrorClass::PermissionDenied;
        }
        // A command refused inside a script comes back as a plain script error; Redis 7.0
        // and 7.2+ word it differently.
        let text = err.to_string();
        // Redis before 7.0 wraps the error a script's call raised in an ERR of its own
        // ("Error running script (call to f_…): @user_script:83: @user_script: 83: -READONLY
        // You can't write…"): the wrapped code says what happened (a demoted primary, here).
        let wrapped = text
            .split(": -")
            .nth(1)
            .and_then(|rest| rest.split(' ').next());
        if let Some(failure) = ErrorClass::known(wrapped) {
            return failure;
        }
        if text.contains("can't run this command or subcommand")
            || text.contains("ACL failure in script")
        {
            return ErrorClass::PermissionDenied;
        }
        // redis-rs 1.8 takes every `sunsubscribe` push for the confirmation of a request
        // (`PushKind::has_reply`), also one a cluster node sends by itself when it drops its
        // shard subscribers: the request in flight on that node's connection is answered with
        // the push ("... (value was push(SUnsubscribe, ...))"). Whether the request ran is
        // unknown, as when the connection is lost: it is re-sent with the same operation id,
        // which replays it if it ran (DESIGN.md 15, known limit).
        if text.contains("(value was push(") {
            return ErrorClass::ConnectionLost;
        }
        ErrorClass::Other
    }

    /// Classifies a server error code (a reply's `-CODE`, also an error value inside a reply).
    pub(crate) fn of_code(code: &str) -> ErrorClass {
        match code {
            "LOADING" | "TRYAGAIN" | "NOSCRIPT" => ErrorClass::NotReady,
            "READONLY" | "MASTERDOWN" | "CLUSTERDOWN" => ErrorClass::NotPrimary,
            "MOVED" | "ASK" => ErrorClass::Redirected,
            "NOPERM" => ErrorClass::PermissionDenied,
            "WRONGPASS" | "NOAUTH" => ErrorClass::AuthRefused,
            _ => ErrorClass::Other,
        }
    }

    /// The class of a server error code, when it is one of those above.
    fn known(code: Option<&str>) -> Option<ErrorClass> {
        code.map(ErrorClass::of_code)
            .filter(|&failure| failure != ErrorClass::Other)
    }

    /// A re-send with the same operation id is safe and may succeed: the request may or may
    /// not have run (a lost connection), or it did not run for a reason that passes.
    pub(crate) fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorClass::ConnectionLost | ErrorClass::NotReady | ErrorClass::NotPrimary
        )
    }

    /// The primary may be another server now: ask the Sentinels or the cluster again.
    pub(crate) fn primary_may_have_moved(self) -> bool {
        matches!(self, ErrorClass::ConnectionLost | ErrorClass::NotPrimary)
    }

    /// Whether the request may have run although no reply says so.
    pub(crate) fn outcome_unknown(self) -> bool {
        self == ErrorClass::ConnectionLost
    }
}

/// Declares the public predicates on [`Error`], one per line: what it asks, and the variants
/// (with a guard, the errors) it is true of.
macro_rules! predicates {
    ($($(#[$doc:meta])* $name:ident: $pattern:pat $(if $guard:expr)?,)*) => {
        impl Error {$(
            $(#[$doc])*
            pub fn $name(&self) -> bool {
                matches!(self, $pattern $(if $guard)?)
            }
        )*}
    };
}

predicates! {
    /// The Redis user lacks a permission fencelock needs (ACL `NOPERM`).
    is_permission_denied: Error::PermissionDenied { .. },

    /// The deadline passed before the lock could be taken.
    is_timeout: Error::Timeout { .. },

    /// A fenced operation was refused because a newer token got there first (see
    /// [`Error::StaleToken`]).
    is_stale_token: Error::StaleToken { .. },

    /// The guard's holder does not hold the lock any more.
    is_not_held: Error::NotHeld { .. },

    /// The input (name, lease, configuration, lock set, leader metadata, job options or tick,
    /// idempotency options, key or fingerprint) was rejected before anything was sent to Redis.
    is_invalid_input: Error::InvalidName { .. }
        | Error::InvalidLease { .. }
        | Error::InvalidConfig { .. }
        | Error::InvalidLockSet { .. }
        | Error::InvalidMetadata { .. }
        | Error::InvalidJob { .. }
        | Error::InvalidIdempotency { .. }
        | Error::InvalidPermits { .. },

    /// The server lacks something this client needs (refused at connect).
    is_unsupported_server: Error::UnsupportedServer { .. },

    /// Fewer replicas than required acknowledged an acquisition in time (it was rolled back).
    is_replication_timeout: Error::ReplicationTimeout { .. },

    /// A lock key held data that fencelock did not write.
    is_wrong_type: Error::WrongType { .. },

    /// Redis could not be reached or the connection failed mid-request.
    is_connection: Error::Redis(err) if ErrorClass::of(err) == ErrorClass::ConnectionLost,

    /// Redis refused the credentials (wrong user or password, or none given where one is
    /// required).
    is_auth_refused: Error::Redis(err) if ErrorClass::of(err) == ErrorClass::AuthRefused,
}

#[cfg(test)]
mod tests;
