//! The classification of errors and their texts, checked.

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
        assert_eq!(ErrorClass::of(&err), ErrorClass::ConnectionLost, "{kind:?}");
        assert!(ErrorClass::of(&err).is_transient(), "{kind:?}");
        assert!(
            !(err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal())
                || err.is_io_error(),
            "{kind:?}: a narrower check outside ErrorKind::Io"
        );
    }
    let dropped = redis::RedisError::from((redis::ErrorKind::Io, "driver terminated"));
    assert!(dropped.is_connection_dropped());
    assert_eq!(ErrorClass::of(&dropped), ErrorClass::ConnectionLost);
    let reply = redis::parse_redis_value(b"-READONLY replica\r\n").unwrap();
    assert_eq!(
        ErrorClass::of(&reply.extract_error().unwrap_err()),
        ErrorClass::NotPrimary
    );
    // Redis before 7.0 wraps an error raised inside a script in an ERR of its own.
    let wrapped = server_error(
        b"-ERR Error running script (call to f_212fcb98cb0a4e13550bc47644bd9c604c31755e): \
          @user_script:83: @user_script: 83: -READONLY You can't write against a read only \
          replica.\r\n",
    );
    assert_eq!(ErrorClass::of(&wrapped), ErrorClass::NotPrimary);
    let parse = redis::RedisError::from((redis::ErrorKind::Parse, "bad reply"));
    assert_eq!(ErrorClass::of(&parse), ErrorClass::Other);
    assert!(!ErrorClass::of(&parse).is_transient());
    let client = redis::RedisError::from((redis::ErrorKind::Client, "bad reply"));
    assert!(!ErrorClass::of(&client).is_transient());
    assert!(
        Error::Redis(redis::RedisError::from(std::io::Error::from(BrokenPipe))).is_connection()
    );
    assert!(!Error::not_held(b"x").is_connection());
}

fn server_error(reply: &[u8]) -> redis::RedisError {
    redis::parse_redis_value(reply)
        .unwrap()
        .extract_error()
        .unwrap_err()
}

#[test]
fn every_server_code_has_one_class_and_the_policies_follow_from_it() {
    let cases: [(&[u8], ErrorClass); 11] = [
        (
            b"-LOADING Redis is loading the dataset in memory\r\n",
            ErrorClass::NotReady,
        ),
        (
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            ErrorClass::NotReady,
        ),
        (
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            ErrorClass::NotReady,
        ),
        (
            b"-READONLY You can't write against a read only replica.\r\n",
            ErrorClass::NotPrimary,
        ),
        (
            b"-MASTERDOWN Link with MASTER is down\r\n",
            ErrorClass::NotPrimary,
        ),
        (
            b"-CLUSTERDOWN The cluster is down\r\n",
            ErrorClass::NotPrimary,
        ),
        (b"-MOVED 3999 127.0.0.1:6381\r\n", ErrorClass::Redirected),
        (b"-ASK 3999 127.0.0.1:6381\r\n", ErrorClass::Redirected),
        (
            b"-NOPERM User x has no permissions to run the 'set' command\r\n",
            ErrorClass::PermissionDenied,
        ),
        (
            b"-WRONGPASS invalid username-password pair\r\n",
            ErrorClass::AuthRefused,
        ),
        (
            b"-ERR Error running script (call to f_x): @user_script:1: ACL failure in script\r\n",
            ErrorClass::PermissionDenied,
        ),
    ];
    for (reply, class) in cases {
        let err = server_error(reply);
        assert_eq!(
            ErrorClass::of(&err),
            class,
            "{}",
            String::from_utf8_lossy(reply)
        );
    }
    assert_eq!(
        ErrorClass::of(&server_error(b"-ERR unknown command\r\n")),
        ErrorClass::Other
    );
    // The codes alone, as they come inside a reply (a pipeline's or a transaction's
    // errors): the same classes.
    for (class, codes) in [
        (
            ErrorClass::NotReady,
            &["LOADING", "TRYAGAIN", "NOSCRIPT"][..],
        ),
        (
            ErrorClass::NotPrimary,
            &["READONLY", "MASTERDOWN", "CLUSTERDOWN"],
        ),
        (ErrorClass::Redirected, &["MOVED", "ASK"]),
        (ErrorClass::PermissionDenied, &["NOPERM"]),
        (ErrorClass::AuthRefused, &["WRONGPASS", "NOAUTH"]),
        (ErrorClass::Other, &["ERR", "EXECABORT"]),
    ] {
        for code in codes {
            assert_eq!(ErrorClass::of_code(code), class, "{code}");
        }
    }
    // Transient: may or may not have run, or did not run for a reason that passes.
    for class in [
        ErrorClass::ConnectionLost,
        ErrorClass::NotReady,
        ErrorClass::NotPrimary,
    ] {
        assert!(class.is_transient(), "{class:?}");
    }
    for class in [
        ErrorClass::Redirected,
        ErrorClass::PermissionDenied,
        ErrorClass::AuthRefused,
        ErrorClass::Other,
    ] {
        assert!(!class.is_transient(), "{class:?}");
        assert!(!class.primary_may_have_moved(), "{class:?}");
    }
    assert!(ErrorClass::ConnectionLost.primary_may_have_moved());
    assert!(ErrorClass::NotPrimary.primary_may_have_moved());
    assert!(!ErrorClass::NotReady.primary_may_have_moved());
    assert!(ErrorClass::ConnectionLost.outcome_unknown());
    assert!(!ErrorClass::NotPrimary.outcome_unknown());
    assert!(!ErrorClass::NotReady.outcome_unknown());
}

#[test]
fn refusals_become_typed_errors_and_scripts_name_their_own() {
    let noperm =
        server_error(b"-NOPERM this user has no permissions to run the 'pexpire' command\r\n");
    assert!(Error::from(noperm).is_permission_denied());
    let wrongtype =
        server_error(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
    assert!(matches!(Error::from(wrongtype.clone()), Error::Redis(_)));
    assert!(Error::from_reply(wrongtype).is_wrong_type());
    let ours = server_error(b"-FENCELOCK_OVERFLOW the fence counter reached 2^53\r\n");
    assert!(matches!(
        Error::from_reply(ours),
        Error::TokenOverflow { .. }
    ));
    let wrongpass = server_error(b"-WRONGPASS invalid username-password pair\r\n");
    assert!(Error::from(wrongpass).is_auth_refused());
    assert!(!Error::not_held(b"x").is_auth_refused());
    assert_eq!(Error::not_held(b"x").class(), None);
    assert_eq!(Error::Protocol("x".into()).class(), None);
}

/// Each public predicate answers `true` for its own kind of error and `false` for every
/// other: callers branch on them (retry, re-connect, alert), so one that answered for a
/// neighbour would send a caller down the wrong branch.
#[test]
fn each_predicate_answers_for_its_own_errors_only() {
    let token = |n| crate::FencingToken::new(n).unwrap();
    let reason = || "x".to_owned();
    let io = || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    let errors: Vec<(&str, Error)> = vec![
        ("invalid", Error::InvalidName { reason: reason() }),
        (
            "invalid",
            Error::InvalidLease {
                lease: Duration::ZERO,
                reason: "x",
            },
        ),
        ("invalid", Error::InvalidConfig { reason: reason() }),
        ("invalid", Error::InvalidLockSet { reason: reason() }),
        ("invalid", Error::InvalidMetadata { len: 2, max: 1 }),
        ("invalid", Error::InvalidJob { reason: reason() }),
        ("invalid", Error::InvalidPermits { reason: reason() }),
        ("invalid", Error::InvalidIdempotency { reason: reason() }),
        (
            "",
            Error::KeyReused {
                key: "k".into(),
                namespace: "n".into(),
            },
        ),
        ("", Error::ResultTooLarge { len: 2, max: 1 }),
        (
            "timeout",
            Error::Timeout {
                name: "x".into(),
                waited: Duration::ZERO,
            },
        ),
        ("not held", Error::not_held(b"x")),
        (
            "wrong type",
            Error::WrongType {
                name: "x".into(),
                detail: reason(),
            },
        ),
        (
            "stale",
            Error::StaleToken {
                resource: "x".into(),
                presented: token(1),
                latest: token(2),
                by: Superseded::WroteOrClaimed,
            },
        ),
        ("", Error::TokenOverflow { detail: reason() }),
        ("", Error::Cancelled),
        ("permission", Error::PermissionDenied { detail: reason() }),
        (
            "replication",
            Error::ReplicationTimeout {
                name: "x".into(),
                acked: 0,
                required: 1,
            },
        ),
        (
            "unsupported",
            Error::UnsupportedServer {
                server: reason(),
                lacks: reason(),
            },
        ),
        ("connection", Error::Redis(io())),
        ("connection", Error::connecting("127.0.0.1:7", io())),
        (
            "auth",
            Error::from(server_error(
                b"-WRONGPASS invalid username-password pair\r\n",
            )),
        ),
        ("", Error::Redis(server_error(b"-ERR unknown command\r\n"))),
        ("", Error::Protocol(reason())),
    ];
    for (kind, err) in &errors {
        let answers = [
            ("invalid", err.is_invalid_input()),
            ("timeout", err.is_timeout()),
            ("not held", err.is_not_held()),
            ("wrong type", err.is_wrong_type()),
            ("stale", err.is_stale_token()),
            ("permission", err.is_permission_denied()),
            ("replication", err.is_replication_timeout()),
            ("unsupported", err.is_unsupported_server()),
            ("connection", err.is_connection()),
            ("auth", err.is_auth_refused()),
        ];
        for (predicate, answer) in answers {
            assert_eq!(answer, predicate == *kind, "is {predicate}? for {err:?}");
        }
    }
}

/// A push taken for a request's reply (redis-rs 1.8 and a node's own `sunsubscribe`)
/// leaves the request's outcome unknown: re-sent, as after a lost connection.
#[test]
fn a_reply_taken_by_a_push_is_re_sent() {
    let push = redis::Value::Push {
        kind: redis::PushKind::SUnsubscribe,
        data: vec![
            redis::Value::BulkString(b"fencelock:{x}lock:a".to_vec()),
            redis::Value::Int(0),
        ],
    };
    let err = <Vec<redis::Value> as redis::FromRedisValue>::from_redis_value(push)
        .map(|_| ())
        .expect_err("a push is no script reply");
    let err: redis::RedisError = err.into();
    assert!(err.to_string().contains("(value was push("), "{err}");
    assert_eq!(ErrorClass::of(&err), ErrorClass::ConnectionLost);
    assert!(ErrorClass::of(&err).is_transient());
    let other =
        <Vec<redis::Value> as redis::FromRedisValue>::from_redis_value(redis::Value::Int(1))
            .map(|_| ())
            .expect_err("an integer is no script reply");
    let other: redis::RedisError = other.into();
    assert_eq!(ErrorClass::of(&other), ErrorClass::Other, "{other}");
}

/// A failed connect names the address it tried and classifies exactly as the bare failure
/// did: the I/O kind survives (redis-rs' narrower checks answer as before), and an error
/// that is not a connection failure is left as it was.
#[test]
fn a_failed_connect_names_its_address_and_keeps_its_class() {
    use std::io::ErrorKind::*;
    let general = || {
        // redis-rs' own I/O error, with no `io::Error` inside (a cluster client that
        // reached no seed node).
        redis::RedisError::from((redis::ErrorKind::Io, "Failed to create initial connections"))
    };
    let failures = [
        ConnectionRefused,
        TimedOut,
        ConnectionReset,
        NotFound,
        Other,
    ]
    .map(|kind| redis::RedisError::from(std::io::Error::from(kind)));
    for bare in failures.into_iter().chain([general()]) {
        let err = Error::connecting("127.0.0.1:7, 127.0.0.1:8", bare.clone());
        let text = err.to_string();
        assert!(
            text.starts_with("redis: connecting to 127.0.0.1:7, 127.0.0.1:8: "),
            "{text}"
        );
        assert!(text.ends_with(&bare.to_string()), "{text}");
        assert!(err.is_connection(), "{err:?}");
        let Error::Redis(inner) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(ErrorClass::of(inner), ErrorClass::of(&bare), "{bare:?}");
        assert_eq!(
            inner.is_connection_refusal(),
            bare.is_connection_refusal(),
            "{bare:?}"
        );
        assert_eq!(inner.is_timeout(), bare.is_timeout(), "{bare:?}");
        assert_eq!(
            inner.is_connection_dropped(),
            bare.is_connection_dropped(),
            "{bare:?}"
        );
    }
    let wrongpass = server_error(b"-WRONGPASS invalid username-password pair\r\n");
    let err = Error::connecting("127.0.0.1:7", wrongpass);
    assert!(err.is_auth_refused(), "{err:?}");
    assert!(!err.to_string().contains("127.0.0.1:7"), "{err}");
}

/// The detail of an ACL refusal is the server's own words, with the `NOPERM` code left
/// out; a refusal found elsewhere in the error keeps the whole text.
#[test]
fn a_permission_refusal_keeps_the_servers_words() {
    let noperm = server_error(b"-NOPERM User x has no permissions to run the 'set' command\r\n");
    match Error::from(noperm) {
        Error::PermissionDenied { detail } => {
            assert_eq!(detail, "User x has no permissions to run the 'set' command");
        }
        other => panic!("{other:?}"),
    }
    let script = server_error(
        b"-ERR Error running script (call to f_x): @user_script:1: ACL failure in script\r\n",
    );
    match Error::from(script) {
        Error::PermissionDenied { detail } => {
            assert!(detail.contains("ACL failure in script"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    let badarg = server_error(b"-FENCELOCK_BADARG lease must be positive\r\n");
    match Error::from_reply(badarg) {
        Error::Protocol(detail) => assert_eq!(detail, "lease must be positive"),
        other => panic!("{other:?}"),
    }
    let foreign = server_error(b"-FENCELOCK_WRONGTYPE a string at the lock key\r\n");
    assert!(Error::from_reply(foreign).is_wrong_type());
}

#[test]
fn an_unnamed_key_or_resource_reads_as_such() {
    let token = |raw| FencingToken::new(raw).unwrap();
    let foreign = |name: &str| Error::WrongType {
        name: name.into(),
        detail: "a string".into(),
    };
    assert_eq!(
        foreign("").to_string(),
        "a key of this lock holds foreign data: a string"
    );
    assert_eq!(
        foreign("orders").to_string(),
        "a key of orders holds foreign data: a string"
    );
    let stale = |resource: &[u8]| Error::stale(resource, token(3), token(5), Superseded::TookOver);
    assert_eq!(
        stale(b"").to_string(),
        "stale fencing token 3: another runner took the run (a job tick, an idempotency key) \
         over with token 5"
    );
    assert_eq!(
        stale(b"ledger").to_string(),
        "stale fencing token 3 for ledger: another runner took the run (a job tick, an \
         idempotency key) over with token 5"
    );
}
