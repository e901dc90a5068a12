//! The one error type of the crate.

use std::time::Duration;

use crate::FencingToken;

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// Match on the variants or use the predicates (`is_timeout()`, `is_not_held()`, ...), which stay
/// stable when variants are added.
///
/// ```
/// use fencelock::Error;
///
/// let err = Error::Timeout { waited: std::time::Duration::from_millis(250) };
/// assert!(err.is_timeout());
/// assert!(!err.is_not_held());
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

    /// The deadline of an acquire passed while the lock was held by someone else.
    #[error("lock still held by another holder after waiting {waited:?}")]
    Timeout {
        /// How long the acquire waited.
        waited: Duration,
    },

    /// This guard's holder no longer holds the lock: its lease ran out, the key was deleted, or
    /// another holder took over. Nothing was changed on the server.
    #[error("the lock is not held by this holder any more (lease expired, deleted or taken over)")]
    NotHeld,

    /// A key where the lock (or its fence counter) lives holds a value fencelock did not write,
    /// for example because someone ran `SET` on it. Nothing was changed.
    #[error("a key of this lock holds foreign data: {detail}")]
    WrongType {
        /// The server's description.
        detail: String,
    },

    /// A fenced write was refused because a newer token has already written to the resource:
    /// the writer's lock was taken over while it still believed it held it. Nothing was
    /// written.
    #[error("stale fencing token {presented}: the resource has already accepted {latest}")]
    StaleToken {
        /// The token the refused write carried.
        presented: FencingToken,
        /// The highest token the resource has accepted.
        latest: FencingToken,
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

    /// The Redis user may not run a command fencelock needs (also one of the commands a
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
        "acquisition reached {acked} of the {required} required replicas in time; rolled back"
    )]
    ReplicationTimeout {
        /// Replicas that confirmed the acquisition.
        acked: u32,
        /// Replicas the acquisition required.
        required: u32,
    },

    /// The set of names given to a multi-lock is unusable: empty, too many names, or the same
    /// name twice. Nothing was sent.
    #[error("invalid lock set: {reason}")]
    InvalidLockSet {
        /// What is wrong with the set.
        reason: String,
    },

    /// Talking to Redis failed. The operation may or may not have taken effect; fencelock retries
    /// mutating operations with the same operation id so that a retry never applies twice.
    #[error("redis: {0}")]
    Redis(redis::RedisError),

    /// The server answered something the protocol does not define (a different script under our
    /// SHA, a proxy that rewrites replies).
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        // ACL refusals are a configuration problem, not a flaky connection: typed, so callers
        // and `is_transient` never retry them.
        if err.code() == Some("NOPERM") {
            return Error::PermissionDenied {
                detail: err.detail().unwrap_or_default().to_owned(),
            };
        }
        // A command refused when queued in MULTI aborts the whole transaction; the refusal is
        // one of the aborted transaction's errors, not the error's own code.
        if let Some(refused) = err
            .clone()
            .into_server_errors()
            .and_then(|errors| errors.iter().find(|(_, e)| e.code() == "NOPERM").cloned())
        {
            return Error::PermissionDenied {
                detail: refused.1.details().unwrap_or_default().to_owned(),
            };
        }
        // A command refused inside a script comes back as a plain script error; Redis 7.0
        // and 7.2+ word it differently.
        let text = err.to_string();
        if text.contains("can't run this command or subcommand")
            || text.contains("ACL failure in script")
        {
            return Error::PermissionDenied { detail: text };
        }
        Error::Redis(err)
    }
}

impl Error {
    /// The Redis user lacks a permission fencelock needs (ACL `NOPERM`).
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Error::PermissionDenied { .. })
    }

    /// The deadline passed before the lock could be taken.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// A fenced write was refused because a newer holder has written.
    pub fn is_stale_token(&self) -> bool {
        matches!(self, Error::StaleToken { .. })
    }

    /// The guard's holder does not hold the lock any more.
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld)
    }

    /// The input (name, lease, configuration) was rejected before anything was sent to Redis.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidName { .. }
                | Error::InvalidLease { .. }
                | Error::InvalidConfig { .. }
                | Error::InvalidLockSet { .. }
        )
    }

    /// Fewer replicas than required acknowledged an acquisition in time (it was rolled back).
    pub fn is_replication_timeout(&self) -> bool {
        matches!(self, Error::ReplicationTimeout { .. })
    }

    /// A lock key held data that fencelock did not write.
    pub fn is_wrong_type(&self) -> bool {
        matches!(self, Error::WrongType { .. })
    }

    /// Redis could not be reached or the connection failed mid-request.
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Redis(e) => connection_lost(e),
            _ => false,
        }
    }
}

/// The request's connection failed: not reached, cut, or no reply in time.
///
/// redis-rs (1.x) gives every one of those `ErrorKind::Io`: its `is_timeout`,
/// `is_connection_dropped` and `is_connection_refusal` only narrow that kind down, so the
/// kind alone decides (mutation testing showed the narrower checks `||`-ed to it could never
/// change an answer). `tests::every_connection_failure_is_an_io_error` pins this per
/// `io::ErrorKind`, so a redis-rs that classed them otherwise fails there.
pub(crate) fn connection_lost(err: &redis::RedisError) -> bool {
    err.is_io_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_failure_is_an_io_error() {
        use std::io::ErrorKind::*;
        for kind in [
            TimedOut,
            WouldBlock,
            BrokenPipe,
            ConnectionReset,
            ConnectionRefused,
            ConnectionAborted,
            UnexpectedEof,
            NotConnected,
            NotFound,
            Other,
        ] {
            let err = redis::RedisError::from(std::io::Error::from(kind));
            assert!(connection_lost(&err), "{kind:?}");
            assert!(
                !(err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal())
                    || err.is_io_error(),
                "{kind:?}: a narrower check outside ErrorKind::Io"
            );
        }
        let dropped = redis::RedisError::from((redis::ErrorKind::Io, "driver terminated"));
        assert!(dropped.is_connection_dropped() && connection_lost(&dropped));
        let reply = redis::parse_redis_value(b"-READONLY replica\r\n").unwrap();
        assert!(!connection_lost(&reply.extract_error().unwrap_err()));
        let parse = redis::RedisError::from((redis::ErrorKind::Parse, "bad reply"));
        assert!(!connection_lost(&parse));
        assert!(
            Error::Redis(redis::RedisError::from(std::io::Error::from(BrokenPipe))).is_connection()
        );
        assert!(!Error::NotHeld.is_connection());
    }
}
