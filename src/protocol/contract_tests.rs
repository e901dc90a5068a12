//! What every script family's contract tests share: a server of their own, the operation
//! timings, the two ways of keeping hold deadlines, and the contract checks with the negative
//! controls each one catches ([`contract_checks!`]).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use fencelock_testing::RedisServer;

use super::rwlock::{RwAcquireReply, RwMode};
use super::semaphore::SemAcquireReply;
use super::{cancel, release, CancelKind, CancelReply, LockKeys, OwnerReply, PubSub};
use crate::base::error::Error;
use crate::protocol::semaphore::HoldAcquire;

/// A connection to the server under test.
pub(super) type Conn = MultiplexedConnection;

/// What a contract check answers: `Err` says how the scripts broke the contract.
pub(super) type Checked = Result<(), String>;

pub(super) const LEASE: Duration = Duration::from_secs(30);

/// Asserts that `again` replays `first`, a fresh acquisition: the same token and count, and
/// what is left of the hold's lease (which a replay does not renew), at most [`LEASE`].
pub(super) fn assert_replay(first: &super::AcquireReply, again: &super::AcquireReply) {
    use super::AcquireReply;
    let replayed = match (first, again) {
        (
            AcquireReply::Acquired {
                token,
                count,
                lease_left: None,
            },
            AcquireReply::Acquired {
                token: again_token,
                count: again_count,
                lease_left: Some(left),
            },
        ) => token == again_token && count == again_count && *left <= LEASE,
        _ => false,
    };
    assert!(replayed, "{again:?} is no replay of {first:?}");
}
pub(super) const OP_TTL: Duration = Duration::from_secs(10);

tokio::task_local! {
    /// Whether the semaphores and read-write locks the hold scripts create in this scope keep
    /// their deadlines as hash-field expiry (else in the lease zset).
    pub(super) static HOLD_FIELD_EXPIRY_SCOPE: bool;
}

/// The way of keeping hold deadlines in scope ([`for_each_hold_expiry`]); the lease zset
/// outside any.
pub(super) fn hold_field_expiry() -> bool {
    HOLD_FIELD_EXPIRY_SCOPE
        .try_with(|way| *way)
        .unwrap_or(false)
}

/// Runs `test` once per way of keeping hold deadlines the server under test has: the lease
/// zset, and hash-field expiry where the server has it (else that run is skipped, and says
/// so). Each run sees its way through [`hold_field_expiry`].
pub(super) async fn for_each_hold_expiry(test: &str, mut run: impl AsyncFnMut()) {
    HOLD_FIELD_EXPIRY_SCOPE.scope(false, run()).await;
    let with_fields = format!("{test} (hash-field expiry)");
    if fencelock_testing::requires(fencelock_testing::Feature::HashFieldExpiry, &with_fields) {
        HOLD_FIELD_EXPIRY_SCOPE.scope(true, run()).await;
    }
}

/// Asserts that a semaphore's or read-write lock's hash and lease zset are gone.
pub(super) async fn assert_nothing_left(conn: &mut MultiplexedConnection, keys: &LockKeys) {
    let left: usize = conn
        .exists(&[keys.lock.clone(), keys.sem_leases()])
        .await
        .unwrap();
    assert_eq!(left, 0, "nothing left behind, entries included");
}

/// A lock's hash, as its fields.
pub(super) type Fields = std::collections::HashMap<String, String>;

/// The hold deadline of `holder` (server ms; -2: none), as the lock keeps it: its field's
/// expiry, or its score in the lease zset.
pub(super) async fn deadline_of(conn: &mut Conn, keys: &LockKeys, holder: &str) -> i64 {
    if hold_field_expiry() {
        let at: Vec<i64> = redis::cmd("HPEXPIRETIME")
            .arg(&keys.lock)
            .arg("FIELDS")
            .arg(1)
            .arg(holder)
            .query_async(conn)
            .await
            .unwrap();
        at[0]
    } else {
        let at: Option<f64> = conn.zscore(keys.sem_leases(), holder).await.unwrap();
        at.map_or(-2, |at| at as i64)
    }
}

/// Asserts that `holder`'s hold deadline is still `until` ([`deadline_of`]; `when` says at
/// which point).
pub(super) async fn assert_deadline(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    until: i64,
    when: &str,
) {
    let deadline = deadline_of(conn, keys, holder).await;
    assert_eq!(deadline, until, "{when}: {holder}'s lease");
}

/// Asserts that the lock's keys still expire: the hash, and on the lease-zset path the zset.
pub(super) async fn assert_keys_expire(conn: &mut Conn, keys: &LockKeys) {
    let hash: i64 = conn.pttl(&keys.lock).await.unwrap();
    assert!(hash > 0, "the hash expires: {hash}");
    if !hold_field_expiry() {
        let leases: i64 = conn.pttl(keys.sem_leases()).await.unwrap();
        assert!(leases > 0, "the lease zset expires: {leases}");
    }
}

/// Asserts that on the lease-zset path the hash's `~used` counts `used` permits (`when` says
/// at which point); with field expiry there is no such count.
pub(super) fn assert_used(hash: &Fields, used: &str, when: &str) {
    if !hold_field_expiry() {
        assert_eq!(
            hash.get("~used").map(String::as_str),
            Some(used),
            "{when}: {hash:?}"
        );
    }
}

/// Asserts that `outcome` is the `WRONGTYPE` the server raised at a `redis.call` of a script
/// run alone: typed by its code, or on Redis 6.2, which reports an error raised in a script as
/// "ERR Error running script ...: WRONGTYPE ...", named in that text.
pub(super) fn assert_raised_wrongtype<T: std::fmt::Debug>(outcome: &Result<T, Error>) {
    let raised = match outcome {
        Err(Error::WrongType { detail, .. }) => detail.contains("wrong kind"),
        Err(other) => other.to_string().contains("WRONGTYPE"),
        Ok(_) => false,
    };
    assert!(raised, "expected the server's WRONGTYPE: {outcome:?}");
}

/// Declares the functions that lay out the keys of the object a family's tests work on
/// (functions, so that a table of checks can name them), each under the prefix `t:`.
macro_rules! object_keys {
    ($($(#[$doc:meta])* $name:ident => $layout:ident($object:literal);)+) => {
        $(
            $(#[$doc])*
            pub(super) fn $name() -> LockKeys {
                LockKeys::$layout(b"t:", $object)
            }
        )+
    };
}

object_keys! {
    /// The keys of the lock `res`.
    lock_keys => new(b"res");
    /// The keys of the semaphore `pool`.
    sem_keys => semaphore(b"pool");
    /// The keys of the read-write lock `catalogue`.
    rw_keys => rwlock(b"catalogue");
    /// The keys of the election `scheduler`.
    election_keys => election(b"scheduler");
    /// The keys of the job `report`.
    job_keys => job(b"report");
    /// The keys of the idempotency key `payments:key-1`.
    idempotency_keys => idempotency(b"payments:key-1");
}

/// A connection to `server` as a new user `name` who may run every command but `denied`
/// (made through `admin`): a Redis user whose ACL refuses a command a script calls.
pub(super) async fn connect_as(
    server: &RedisServer,
    admin: &mut MultiplexedConnection,
    name: &str,
    denied: &[&str],
) -> MultiplexedConnection {
    let mut rule = vec!["SETUSER", name, "on", ">pw", "~*", "&*", "+@all"];
    let denied: Vec<String> = denied.iter().map(|command| format!("-{command}")).collect();
    rule.extend(denied.iter().map(String::as_str));
    let _: () = redis::cmd("ACL")
        .arg(&rule)
        .query_async(admin)
        .await
        .unwrap();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("AUTH")
        .arg(name)
        .arg("pw")
        .query_async(&mut conn)
        .await
        .unwrap();
    conn
}

/// A server of its own, a connection to it, and the keys of the lock `res` on it
/// ([`lock_keys`]).
pub(super) async fn setup() -> (RedisServer, MultiplexedConnection, LockKeys) {
    setup_for(lock_keys()).await
}

/// A server of its own, a connection to it, and `keys`.
pub(super) async fn setup_for(keys: LockKeys) -> (RedisServer, MultiplexedConnection, LockKeys) {
    let server = RedisServer::start().unwrap();
    let conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (server, conn, keys)
}

/// A read-write lock's acquisition by `holder` (`rw_acquire.lua`) with the deadlines kept as
/// the scope says ([`hold_field_expiry`]), unlabelled and not recorded; `wait`: the writer
/// queues its mark.
pub(super) async fn rw_take(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    mode: RwMode,
    lease: Duration,
    wait: bool,
) -> RwAcquireReply {
    let expiry = hold_field_expiry();
    HoldAcquire::of(
        keys,
        holder,
        lease,
        OP_TTL,
        PubSub::Classic,
        expiry,
        None,
        false,
    )
    .rw_acquire(conn, mode, wait)
    .await
    .unwrap()
}

/// A server of its own with `keys`, for `test`, which needs hash-field expiry: `None` on a
/// server without it (the test is skipped, and says so).
pub(super) async fn setup_with_field_expiry(
    test: &str,
    keys: LockKeys,
) -> Option<(RedisServer, MultiplexedConnection, LockKeys)> {
    if !fencelock_testing::requires(fencelock_testing::Feature::HashFieldExpiry, test) {
        return None;
    }
    Some(setup_for(keys).await)
}

/// `ops` in one call of their grouped script, each answered as `answer` reads its reply.
pub(super) async fn run_together<G: super::batch::Grouped, R>(
    conn: &mut MultiplexedConnection,
    ops: &[G],
    answer: fn(redis::Value) -> Result<R, Error>,
) -> Result<Vec<R>, String> {
    let refs: Vec<&G> = ops.iter().collect();
    let outcomes = G::run_together(conn, &refs)
        .await
        .map_err(|err| format!("the call failed: {err}"))?;
    outcomes
        .into_iter()
        .map(|outcome| outcome.and_then(answer).map_err(|err| err.to_string()))
        .collect()
}

/// The keys a read-write lock's grouped scripts take: its hash, its lease zset and its waiting
/// writers' zset, then `more`.
pub(super) fn grouped_keys(keys: &LockKeys, more: [Vec<u8>; 2]) -> Vec<Vec<u8>> {
    let writers = keys.rw_writers().unwrap();
    [
        vec![keys.lock.clone(), keys.sem_leases(), writers],
        more.to_vec(),
    ]
    .concat()
}

/// Runs `script` on `keys` and `args` as given, past the bindings (for a call they never
/// make), and expects the server to refuse it: its error.
pub(super) async fn refused_as_called(
    conn: &mut MultiplexedConnection,
    script: &redis::Script,
    keys: &[Vec<u8>],
    args: &[&str],
) -> redis::RedisError {
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(key);
    }
    for arg in args {
        call.arg(*arg);
    }
    call.invoke_async::<redis::Value>(conn).await.unwrap_err()
}

/// A semaphore acquisition (`sem_acquire.lua`) by `holder` of `permits.0` of a limit of
/// `permits.1`, with the deadlines kept as the scope says ([`hold_field_expiry`]), unlabelled;
/// `fair`: a fair-handoff client that will wait (`Some(true)`) or not; `recorded`: a send
/// after one of unknown outcome (only such an acquisition can have a late copy).
pub(super) async fn sem_take(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    (permits, limit): (u32, u32),
    lease: Duration,
    fair: Option<bool>,
    recorded: bool,
) -> Result<SemAcquireReply, Error> {
    let expiry = hold_field_expiry();
    let ps = PubSub::Classic;
    HoldAcquire::of(keys, holder, lease, OP_TTL, ps, expiry, None, recorded)
        .sem_acquire(conn, permits, limit, fair)
        .await
}

/// `holder`'s release as operation `op`, answered; sent as a re-send (the op record is read),
/// so that the same call can replay an earlier one.
pub(super) async fn released_by(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    op: &str,
) -> OwnerReply {
    release(conn, keys, holder, op, OP_TTL, PubSub::Classic, true)
        .await
        .unwrap()
}

/// Releases `holder`'s last entry as operation `op`; panics unless that ends its hold.
pub(super) async fn leave(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    op: &str,
) {
    let reply = released_by(conn, keys, holder, op).await;
    assert_eq!(
        reply,
        OwnerReply::Done { remaining: 0 },
        "{holder}'s release"
    );
}

/// Undoes (or forestalls) `holder`'s operation `op` of `kind` (`cancel.lua`, or
/// `sem_cancel.lua` for a hold's keys).
pub(super) async fn undo(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    op: &str,
    kind: CancelKind,
) -> Result<CancelReply, Error> {
    cancel(conn, keys, holder, op, kind, OP_TTL, PubSub::Classic).await
}

/// `holder`'s cancel of its operation `op` of `kind` ([`undo`]), answered.
pub(super) async fn cancelled_by(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    op: &str,
    kind: CancelKind,
) -> CancelReply {
    undo(conn, keys, holder, op, kind).await.unwrap()
}

/// Asserts that the cancel of the operation `ran` (holder, op id) of `kind` undoes it once,
/// leaving `remaining` entries, and finds nothing to undo when sent again; and that the cancel
/// of `early`, which has not run, finds nothing either (and forestalls it).
pub(super) async fn assert_undone_once(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    kind: CancelKind,
    (ran, remaining): ((&str, &str), u64),
    early: (&str, &str),
) {
    let undone = cancelled_by(conn, keys, ran.0, ran.1, kind).await;
    assert_eq!(undone, CancelReply::Undone { remaining });
    let again = cancelled_by(conn, keys, ran.0, ran.1, kind).await;
    assert_eq!(again, CancelReply::NotRun, "the cancel sent again");
    let first = cancelled_by(conn, keys, early.0, early.1, kind).await;
    assert_eq!(
        first,
        CancelReply::NotRun,
        "the cancel before its operation"
    );
}

/// A writer's acquisition by `holder` with the default lease; `wait`: it queues its mark.
pub(super) async fn rw_write(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    wait: bool,
) -> RwAcquireReply {
    rw_take(conn, keys, holder, RwMode::Write, LEASE, wait).await
}

/// A contract check of a script family: `Ok` when the scripts keep the contract on a fresh
/// server with `keys` free, `Err` saying how they broke it.
pub(super) type Check = for<'a> fn(
    &'a mut MultiplexedConnection,
    &'a LockKeys,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>,
>;

/// Runs every check, each on a server of its own with the keys `keys()` lays out; panics
/// naming the first check the production scripts break.
pub(super) async fn assert_checks_hold(checks: &[(&str, Check)], keys: fn() -> LockKeys) {
    for (name, check) in checks {
        let (_server, mut conn, _lock) = setup().await;
        if let Err(why) = check(&mut conn, &keys()).await {
            panic!("{name}: {why}");
        }
    }
}

/// Runs each control against the check next to it (as [`assert_checks_hold`]); panics naming
/// a control its check does not catch.
#[cfg(fencelock_negative_controls)]
pub(super) async fn assert_controls_caught(
    controls: &[super::controls::Control],
    checks: &[(&str, Check)],
    keys: fn() -> LockKeys,
) {
    assert_eq!(controls.len(), checks.len(), "one check per control");
    for (control, (name, check)) in controls.iter().zip(checks) {
        let (_server, mut conn, _lock) = setup().await;
        let keys = keys();
        match super::controls::scoped(*control, check(&mut conn, &keys)).await {
            Ok(()) => panic!("{control:?} was not caught by {name}"),
            Err(why) => eprintln!("{control:?} caught by {name}: {why}"),
        }
    }
}

/// Declares a script family's contract checks and the two tests over them:
///
/// ```text
/// contract_checks! {
///     /// The doc of the second test.
///     holds_test, caught_test, keys_fn[, per_hold_expiry];
///     check => [Control::Name, ...],
///     shared_check(arg, ...) => [Control::Name, ...],
///     ...
/// }
/// ```
///
/// `holds_test`: every check holds on the production scripts; `caught_test` (builds with
/// negative controls only): each control listed after a check is caught by that check; each on
/// a fresh server with the keys `keys_fn()` lays out. A check is an `async fn(&mut
/// MultiplexedConnection, &LockKeys) -> Result<(), String>`, or, given arguments, an `async
/// fn` that takes them before those two (a scenario several families share, told which one
/// runs it). With `per_hold_expiry`, the checks run once per way of keeping hold deadlines
/// ([`for_each_hold_expiry`]); the controls run on the lease zset.
macro_rules! contract_checks {
    (
        $(#[$caught_doc:meta])*
        $holds:ident, $caught:ident, $keys:expr $(, $run:ident)?;
        $($check:ident $(($($arg:expr),+))? => [$($control:path),* $(,)?]),+ $(,)?
    ) => {
        #[tokio::test]
        async fn $holds() {
            let checks: &[(&str, $crate::protocol::contract_tests::Check)] =
                &[$((
                    stringify!($check $(($($arg),+))?),
                    |c, k| Box::pin($check($($($arg,)+)? c, k)),
                )),+];
            contract_checks!(@run $($run)? $holds, {
                $crate::protocol::contract_tests::assert_checks_hold(checks, $keys).await;
            });
        }

        $(#[$caught_doc])*
        #[cfg(fencelock_negative_controls)]
        #[tokio::test]
        async fn $caught() {
            #[allow(unused_imports)]
            use $crate::protocol::controls::Control;
            let table: &[(
                &str,
                $crate::protocol::contract_tests::Check,
                &[$crate::protocol::controls::Control],
            )] = &[$((
                stringify!($check $(($($arg),+))?),
                |c, k| Box::pin($check($($($arg,)+)? c, k)),
                &[$($control),*],
            )),+];
            // One row a control, with the check that names it.
            let (controls, checks): (Vec<_>, Vec<_>) = table
                .iter()
                .flat_map(|(name, check, controls)| {
                    controls.iter().map(move |control| (*control, (*name, *check)))
                })
                .unzip();
            $crate::protocol::contract_tests::assert_controls_caught(&controls, &checks, $keys)
                .await;
        }
    };
    (@run per_hold_expiry $test:ident, $body:block) => {
        $crate::protocol::contract_tests::for_each_hold_expiry(
            stringify!($test),
            async || $body,
        )
        .await
    };
    (@run $test:ident, $body:block) => {
        $body
    };
}
pub(super) use contract_checks;

/// Declares a test that runs once per way of keeping hold deadlines the server has
/// ([`for_each_hold_expiry`]), each run on a server of its own ([`setup`]):
///
/// ```text
/// hold_test! {
///     /// The test's doc.
///     async fn test_name(server, conn, keys = keys_fn()) { body }
/// }
/// ```
///
/// The body sees the server under the pattern given (`_server` when it does not use it), a
/// connection to it as `conn`, and the keys `keys_fn()` lays out as `keys`.
macro_rules! hold_test {
    (
        $(#[$doc:meta])*
        async fn $name:ident($server:pat, $conn:ident, $keys:ident = $free:expr) $body:block
    ) => {
        $(#[$doc])*
        #[tokio::test]
        async fn $name() {
            $crate::protocol::contract_tests::for_each_hold_expiry(stringify!($name), async || {
                let ($server, mut $conn, _lock) = $crate::protocol::contract_tests::setup().await;
                let $keys = $free;
                $body
            })
            .await;
        }
    };
}
pub(super) use hold_test;
