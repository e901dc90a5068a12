//! The scripts' contracts, call by call, against a real redis-server: replays of the same
//! operation id change nothing, cancels undo exactly one operation, owners are checked.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use fencelock_testing::RedisServer;

use super::*;
use crate::base::error::Superseded;

pub(super) const LEASE: Duration = Duration::from_secs(30);
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

/// A contract check of a script family: `Ok` when the scripts keep the contract on a fresh
/// server with `keys` free, `Err` saying how they broke it. Each check is also the check of one
/// negative control.
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

/// A server of its own, a connection to it, and the keys of the lock `res` on it.
pub(super) async fn setup() -> (RedisServer, MultiplexedConnection, LockKeys) {
    let server = RedisServer::start().unwrap();
    let conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (server, conn, LockKeys::new(b"t:", b"res"))
}

async fn count(conn: &mut MultiplexedConnection, keys: &LockKeys, holder: &str) -> Option<u64> {
    conn.hget(&keys.lock, holder).await.unwrap()
}

/// The token of a fresh acquisition by `holder`; panics when the lock was not free.
async fn acquired(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    lease: Duration,
) -> FencingToken {
    match acquire(conn, keys, holder, lease, OP_TTL).await.unwrap() {
        AcquireReply::Acquired { token, .. } => token,
        other => panic!("{holder} did not get a free lock: {other:?}"),
    }
}

#[tokio::test]
async fn a_replayed_acquire_returns_the_same_token_and_count() {
    let (_server, mut conn, keys) = setup().await;
    let first = acquire(&mut conn, &keys, "h1", LEASE, OP_TTL)
        .await
        .unwrap();
    let again = acquire(&mut conn, &keys, "h1", LEASE, OP_TTL)
        .await
        .unwrap();
    assert!(matches!(first, AcquireReply::Acquired { count: 1, .. }));
    assert_eq!(first, again);
    assert_eq!(count(&mut conn, &keys, "h1").await, Some(1));
    let other = acquire(&mut conn, &keys, "h2", LEASE, OP_TTL)
        .await
        .unwrap();
    match other {
        AcquireReply::Held { pttl: Some(pttl) } => assert!(pttl <= LEASE),
        other => panic!("{other:?}"),
    }
}

/// A label is stored only when given, survives a replay and a re-entry unchanged, holds no
/// count (owner checks ignore it), and leaves with the hold.
#[tokio::test]
async fn a_label_is_kept_with_its_hold_and_only_there() {
    let (_server, mut conn, keys) = setup().await;
    let label = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        let lock = keys.lock.clone();
        async move {
            let label: Option<String> = conn.hget(lock, "~label").await.unwrap();
            label
        }
    };
    let first = acquire_labelled(&mut conn, &keys, "h1", LEASE, OP_TTL, Some("req-1"), false)
        .await
        .unwrap();
    assert!(matches!(first, AcquireReply::Acquired { count: 1, .. }));
    assert_eq!(label(&mut conn).await.as_deref(), Some("req-1"));
    // A replay with another label (a client never sends one) changes nothing.
    let again = acquire_labelled(&mut conn, &keys, "h1", LEASE, OP_TTL, Some("other"), false)
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(label(&mut conn).await.as_deref(), Some("req-1"));
    reenter(&mut conn, &keys, "h1", "h1:r", OP_TTL)
        .await
        .unwrap();
    assert_eq!(count(&mut conn, &keys, "h1").await, Some(2));
    assert_eq!(label(&mut conn).await.as_deref(), Some("req-1"));
    let busy = acquire_labelled(&mut conn, &keys, "h2", LEASE, OP_TTL, Some("req-2"), false)
        .await
        .unwrap();
    assert!(matches!(busy, AcquireReply::Held { .. }), "{busy:?}");
    assert_eq!(label(&mut conn).await.as_deref(), Some("req-1"));
    for op in ["h1:x1", "h1:x2"] {
        release(&mut conn, &keys, "h1", op, OP_TTL, PubSub::Classic)
            .await
            .unwrap();
    }
    let left: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!left, "the label left with the hold");
    acquired(&mut conn, &keys, "h3", LEASE).await;
    assert_eq!(label(&mut conn).await, None, "no label unless given");
}

#[tokio::test]
async fn a_replayed_reentry_or_release_applies_once() {
    let (_server, mut conn, keys) = setup().await;
    let AcquireReply::Acquired { token, .. } =
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap()
    else {
        panic!("free lock not acquired")
    };
    let entered = reenter(&mut conn, &keys, "h", "op-enter", OP_TTL)
        .await
        .unwrap();
    assert_eq!(entered, EnterReply::Entered { token, count: 2 });
    assert_eq!(
        reenter(&mut conn, &keys, "h", "op-enter", OP_TTL)
            .await
            .unwrap(),
        entered
    );
    assert_eq!(count(&mut conn, &keys, "h").await, Some(2));

    let released = release(&mut conn, &keys, "h", "op-rel-1", OP_TTL, PubSub::Classic)
        .await
        .unwrap();
    assert_eq!(released, OwnerReply::Done { remaining: 1 });
    assert_eq!(
        release(&mut conn, &keys, "h", "op-rel-1", OP_TTL, PubSub::Classic)
            .await
            .unwrap(),
        released
    );
    assert_eq!(count(&mut conn, &keys, "h").await, Some(1));

    let last = release(&mut conn, &keys, "h", "op-rel-2", OP_TTL, PubSub::Classic)
        .await
        .unwrap();
    assert_eq!(last, OwnerReply::Done { remaining: 0 });
    // A new holder takes over; the old release replayed late must neither fail nor touch it.
    let AcquireReply::Acquired { token: next, .. } = acquire(&mut conn, &keys, "h2", LEASE, OP_TTL)
        .await
        .unwrap()
    else {
        panic!("released lock not free")
    };
    assert!(next > token);
    assert_eq!(
        release(&mut conn, &keys, "h", "op-rel-2", OP_TTL, PubSub::Classic)
            .await
            .unwrap(),
        last
    );
    assert_eq!(count(&mut conn, &keys, "h2").await, Some(1));
    // One record per hold: the release that freed the lock marked the holder's acquire record
    // instead of writing its own, and a late copy of the acquire is still refused by it.
    let exists: bool = conn.exists(keys.op("op-rel-2")).await.unwrap();
    assert!(!exists, "the freeing release wrote a record of its own");
    let mark: Option<String> = conn.get(keys.op("h")).await.unwrap();
    assert_eq!(mark.as_deref(), Some("r:op-rel-2"));
    // Another release of that holder did not free the lock: not held, as before.
    assert_eq!(
        release(&mut conn, &keys, "h", "op-rel-3", OP_TTL, PubSub::Classic)
            .await
            .unwrap(),
        OwnerReply::NotHeld
    );
    assert_eq!(
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap(),
        AcquireReply::Cancelled
    );
    // The records expire: their memory is bounded by the op-record lifetime.
    for record in ["h", "op-rel-1"] {
        let ttl: i64 = conn.pttl(keys.op(record)).await.unwrap();
        assert!(ttl > 0 && ttl <= 10_000, "{record}: {ttl}");
    }
}

#[tokio::test]
async fn owner_checks_leave_another_holders_lock_alone() {
    let (_server, mut conn, keys) = setup().await;
    acquire(&mut conn, &keys, "owner", LEASE, OP_TTL)
        .await
        .unwrap();
    assert_eq!(
        release(&mut conn, &keys, "intruder", "op1", OP_TTL, PubSub::Classic)
            .await
            .unwrap(),
        OwnerReply::NotHeld
    );
    assert_eq!(
        extend(&mut conn, &keys, "intruder", Duration::from_secs(600))
            .await
            .unwrap(),
        OwnerReply::NotHeld
    );
    assert_eq!(
        reenter(&mut conn, &keys, "intruder", "op2", OP_TTL)
            .await
            .unwrap(),
        EnterReply::NotHeld
    );
    assert_eq!(count(&mut conn, &keys, "owner").await, Some(1));
    let pttl: i64 = conn.pttl(&keys.lock).await.unwrap();
    assert!(pttl <= 30_000);
    // A failed owner check writes no record, so nothing is left to replay.
    let exists: bool = conn.exists(keys.op("op1")).await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn cancel_undoes_exactly_the_cancelled_operation() {
    let (_server, mut conn, keys) = setup().await;

    // An acquisition that ran: the lock is freed.
    acquire(&mut conn, &keys, "a", LEASE, OP_TTL).await.unwrap();
    let undone = cancel(
        &mut conn,
        &keys,
        "a",
        "a",
        CancelKind::Acquire,
        OP_TTL,
        PubSub::Classic,
    )
    .await
    .unwrap();
    assert_eq!(undone, CancelReply::Undone { remaining: 0 });
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists);
    // ... and if that acquisition arrives again (a slow re-send), it does nothing.
    assert_eq!(
        acquire(&mut conn, &keys, "a", LEASE, OP_TTL).await.unwrap(),
        AcquireReply::Cancelled
    );
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists);

    // An acquisition cancelled before it ran never runs.
    assert_eq!(
        cancel(
            &mut conn,
            &keys,
            "b",
            "b",
            CancelKind::Acquire,
            OP_TTL,
            PubSub::Classic
        )
        .await
        .unwrap(),
        CancelReply::NotRun
    );
    assert_eq!(
        acquire(&mut conn, &keys, "b", LEASE, OP_TTL).await.unwrap(),
        AcquireReply::Cancelled
    );

    // A re-entry that ran is undone with exactly one decrement, however often cancel runs.
    acquire(&mut conn, &keys, "c", LEASE, OP_TTL).await.unwrap();
    reenter(&mut conn, &keys, "c", "enter-1", OP_TTL)
        .await
        .unwrap();
    reenter(&mut conn, &keys, "c", "enter-2", OP_TTL)
        .await
        .unwrap();
    assert_eq!(count(&mut conn, &keys, "c").await, Some(3));
    let undone = cancel(
        &mut conn,
        &keys,
        "c",
        "enter-1",
        CancelKind::Reenter,
        OP_TTL,
        PubSub::Classic,
    )
    .await;
    assert_eq!(undone.unwrap(), CancelReply::Undone { remaining: 2 });
    let again = cancel(
        &mut conn,
        &keys,
        "c",
        "enter-1",
        CancelKind::Reenter,
        OP_TTL,
        PubSub::Classic,
    )
    .await;
    assert_eq!(again.unwrap(), CancelReply::NotRun);
    assert_eq!(count(&mut conn, &keys, "c").await, Some(2));
    assert_eq!(
        reenter(&mut conn, &keys, "c", "enter-1", OP_TTL)
            .await
            .unwrap(),
        EnterReply::Cancelled
    );

    // A re-entry cancelled before it ran leaves the count alone and never runs.
    let not_run = cancel(
        &mut conn,
        &keys,
        "c",
        "enter-3",
        CancelKind::Reenter,
        OP_TTL,
        PubSub::Classic,
    )
    .await;
    assert_eq!(not_run.unwrap(), CancelReply::NotRun);
    assert_eq!(
        reenter(&mut conn, &keys, "c", "enter-3", OP_TTL)
            .await
            .unwrap(),
        EnterReply::Cancelled
    );
    assert_eq!(count(&mut conn, &keys, "c").await, Some(2));
}

#[tokio::test]
async fn the_scripts_run_after_script_flush() {
    let (_server, mut conn, keys) = setup().await;
    acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        release(&mut conn, &keys, "h", "op", OP_TTL, PubSub::Classic)
            .await
            .unwrap(),
        OwnerReply::Done { remaining: 0 }
    );
}

#[tokio::test]
async fn tokens_are_exact_past_the_time_floor() {
    let (_server, mut conn, keys) = setup().await;
    // A counter far above the clock floor keeps counting by one, exactly.
    let high = 9_007_199_254_740_000_u64;
    let _: () = conn.set(&keys.fence, high).await.unwrap();
    let AcquireReply::Acquired { token, .. } =
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap()
    else {
        panic!()
    };
    assert_eq!(token.get(), high + 1);
    release(&mut conn, &keys, "h", "op", OP_TTL, PubSub::Classic)
        .await
        .unwrap();
    // At 2^53 the acquire refuses instead of issuing an inexact token, and changes nothing.
    let _: () = conn
        .set(&keys.fence, 9_007_199_254_740_991_u64)
        .await
        .unwrap();
    let err = acquire(&mut conn, &keys, "h2", LEASE, OP_TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, crate::Error::TokenOverflow { .. }), "{err}");
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn a_lost_fence_counter_is_replaced_by_the_clock_floor() {
    let (_server, mut conn, keys) = setup().await;
    let mut last = 0;
    // Each holder id acquires once (a second acquire under the same id would be a late
    // duplicate). Between acquisitions the counter is lost (restart without persistence,
    // failover to a replica that missed it), then everything is (`FLUSHALL`).
    for (holder, lose) in [("h1", None), ("h2", Some("DEL")), ("h3", Some("FLUSHALL"))] {
        match lose {
            Some("DEL") => conn.del::<_, ()>(&keys.fence).await.unwrap(),
            Some(command) => redis::cmd(command)
                .query_async::<()>(&mut conn)
                .await
                .unwrap(),
            None => {}
        }
        let token = acquired(&mut conn, &keys, holder, LEASE).await;
        assert!(
            token.get() > last,
            "after {lose:?}: token {} is not above {last}",
            token.get()
        );
        last = token.get();
        release(
            &mut conn,
            &keys,
            holder,
            &format!("rel-{holder}"),
            OP_TTL,
            PubSub::Classic,
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn a_lease_is_what_was_asked_and_ends_with_a_silent_holder() {
    let (_server, mut conn, keys) = setup().await;
    let lease = Duration::from_millis(200);
    let first = acquired(&mut conn, &keys, "crashed", lease).await;
    // Never longer than asked: a partitioned holder's own clock ends its lease first.
    let pttl: i64 = conn.pttl(&keys.lock).await.unwrap();
    assert!(pttl > 0 && pttl <= 200, "{pttl}");
    match acquire(&mut conn, &keys, "next", LEASE, OP_TTL)
        .await
        .unwrap()
    {
        AcquireReply::Held { .. } => {}
        other => panic!("a second holder while the lease holds: {other:?}"),
    }
    // A holder that says nothing more (crashed) loses the lock when the lease ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = acquired(&mut conn, &keys, "next-2", LEASE).await;
    assert!(next > first);
}

#[tokio::test]
async fn a_replayed_fenced_write_applies_once_and_a_stale_one_never() {
    let (_server, mut conn, _) = setup().await;
    let keys = ResourceKeys::new(b"t:", b"balance");
    let t = |raw| FencingToken::new(raw).unwrap();
    let first = fenced_write(
        &mut conn,
        &keys,
        t(7),
        "w1",
        OP_TTL,
        Write::IncrBy(100),
        Duration::ZERO,
    )
    .await;
    assert_eq!(first.unwrap(), WriteReply::Accepted(100));
    let replay = fenced_write(
        &mut conn,
        &keys,
        t(7),
        "w1",
        OP_TTL,
        Write::IncrBy(100),
        Duration::ZERO,
    )
    .await;
    assert_eq!(
        replay.unwrap(),
        WriteReply::Accepted(100),
        "replayed, not applied"
    );
    let value: i64 = conn.get(&keys.data).await.unwrap();
    assert_eq!(value, 100);

    let newer = fenced_write(
        &mut conn,
        &keys,
        t(9),
        "w2",
        OP_TTL,
        Write::IncrBy(-1),
        Duration::ZERO,
    )
    .await;
    assert_eq!(newer.unwrap(), WriteReply::Accepted(99));
    let stale = fenced_write(
        &mut conn,
        &keys,
        t(8),
        "w3",
        OP_TTL,
        Write::IncrBy(-50),
        Duration::ZERO,
    )
    .await;
    assert_eq!(
        stale.unwrap(),
        WriteReply::Stale {
            latest: t(9),
            by: Superseded::WroteOrClaimed
        }
    );
    // A refused write leaves no record, so it cannot be replayed into success either.
    let exists: bool = conn.exists(keys.op("w3")).await.unwrap();
    assert!(!exists);
    let value: i64 = conn.get(&keys.data).await.unwrap();
    assert_eq!(value, 99);
    let mark: u64 = conn.get(&keys.mark).await.unwrap();
    assert_eq!(mark, 9);
}

#[tokio::test]
async fn a_late_duplicate_acquire_after_the_hold_ended_does_nothing() {
    let (_server, mut conn, keys) = setup().await;
    // A copy exists only of an acquisition sent more than once, and every send after one whose
    // outcome was unknown is recorded: the acquisitions here are such re-sends, and the late
    // copy is the first send (unrecorded), arriving last.
    let recorded = async |conn: &mut MultiplexedConnection, holder: &str, lease: Duration| {
        acquire_labelled(conn, &keys, holder, lease, OP_TTL, None, true)
            .await
            .unwrap()
    };
    // Released: a copy of the acquire that arrives afterwards must not take the lock again.
    recorded(&mut conn, "h", LEASE).await;
    release(&mut conn, &keys, "h", "rel", OP_TTL, PubSub::Classic)
        .await
        .unwrap();
    assert_eq!(
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap(),
        AcquireReply::Cancelled
    );
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists, "the duplicate took the lock");
    // Expired: the same.
    recorded(&mut conn, "e", Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(
        acquire(&mut conn, &keys, "e", LEASE, OP_TTL).await.unwrap(),
        AcquireReply::Cancelled
    );
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists, "the duplicate took the lock");
}

#[tokio::test]
async fn force_release_evicts_any_holder_and_puts_a_lost_counter_back_to_its_token() {
    let (_server, mut conn, keys) = setup().await;
    assert_eq!(
        force_release(&mut conn, &keys, None).await.unwrap(),
        ForceReleaseReply::NotHeld
    );
    let exists: bool = conn.exists(&keys.fence).await.unwrap();
    assert!(!exists, "a free lock's force release writes nothing");

    let AcquireReply::Acquired { token, .. } =
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap()
    else {
        panic!("free lock not acquired")
    };
    reenter(&mut conn, &keys, "h", "op-enter", OP_TTL)
        .await
        .unwrap();
    let _: () = conn.del(&keys.fence).await.unwrap();

    // Another token than the one held: nothing changes.
    let other = FencingToken::new(token.get() + 1).unwrap();
    assert_eq!(
        force_release(&mut conn, &keys, Some(other)).await.unwrap(),
        ForceReleaseReply::OtherToken { token: Some(token) }
    );
    assert_eq!(count(&mut conn, &keys, "h").await, Some(2));

    assert_eq!(
        force_release(&mut conn, &keys, Some(token)).await.unwrap(),
        ForceReleaseReply::Evicted {
            token: Some(token),
            fence: token.get(),
            holder: b"h".to_vec(),
            count: 2,
        }
    );
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists);
    let fence: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(fence, token.get());
    // The evicted holder's own release is a non-holder's: nothing happens.
    assert_eq!(
        release(&mut conn, &keys, "h", "op-rel", OP_TTL, PubSub::Classic)
            .await
            .unwrap(),
        OwnerReply::NotHeld
    );
    let AcquireReply::Acquired { token: next, .. } = acquire(&mut conn, &keys, "h2", LEASE, OP_TTL)
        .await
        .unwrap()
    else {
        panic!("lock not free after the force release")
    };
    assert!(next > token);
}

#[tokio::test]
async fn force_release_never_lowers_the_counter_and_refuses_foreign_data() {
    let (_server, mut conn, keys) = setup().await;
    let AcquireReply::Acquired { token, .. } =
        acquire(&mut conn, &keys, "h", LEASE, OP_TTL).await.unwrap()
    else {
        panic!("free lock not acquired")
    };
    // Another lock of the bucket issued a higher token since.
    let higher = token.get() + 1000;
    let _: () = conn.set(&keys.fence, higher).await.unwrap();
    match force_release(&mut conn, &keys, None).await.unwrap() {
        ForceReleaseReply::Evicted { fence, .. } => assert_eq!(fence, higher),
        other => panic!("{other:?}"),
    }
    let fence: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(fence, higher);

    // A corrupt counter: the held lock is left exactly as it was.
    acquire(&mut conn, &keys, "h2", LEASE, OP_TTL)
        .await
        .unwrap();
    let _: () = conn.set(&keys.fence, "garbage").await.unwrap();
    let err = force_release(&mut conn, &keys, None).await.unwrap_err();
    assert!(err.is_wrong_type(), "{err:?}");
    assert_eq!(count(&mut conn, &keys, "h2").await, Some(1));

    let _: () = conn.set(&keys.lock, "not a hash").await.unwrap();
    let err = force_release(&mut conn, &keys, None).await.unwrap_err();
    assert!(err.is_wrong_type(), "{err:?}");
    let value: String = conn.get(&keys.lock).await.unwrap();
    assert_eq!(value, "not a hash");
}

/// The same contracts through the cluster client, which routes each script by its first key
/// and re-sends requests by itself (MOVED, ASK, TRYAGAIN, lost connections): a request that
/// arrives twice with one operation id applies once, on every primary.
#[tokio::test]
async fn over_a_cluster_replays_apply_once_and_a_call_never_spans_slots() {
    use fencelock_testing::{Feature, RedisCluster};

    // A cluster client publishes with SPUBLISH; without it (Redis 6.2) clients refuse a
    // cluster at connect, so there is no cluster protocol to check.
    let test =
        "protocol::lock_tests::over_a_cluster_replays_apply_once_and_a_call_never_spans_slots";
    if !fencelock_testing::requires(Feature::ShardedPubSub, test) {
        return;
    }
    let cluster = RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .unwrap();
    let client = redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .use_protocol(redis::ProtocolVersion::RESP3)
        .build()
        .unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    // What `transport::Conn` picks for a cluster connection.
    let pubsub = PubSub::Sharded;

    // One lock on each primary.
    let mut per_primary = std::collections::HashMap::new();
    for i in 0.. {
        let keys = LockKeys::new(b"t:", format!("res-{i}").as_bytes());
        let owner = cluster.primary_for_slot(keys.slot).unwrap().port();
        per_primary.entry(owner).or_insert(keys);
        if per_primary.len() == 3 {
            break;
        }
    }
    for keys in per_primary.values() {
        let first = acquire(&mut conn, keys, "h", LEASE, OP_TTL).await.unwrap();
        let AcquireReply::Acquired { token, count: 1 } = first else {
            panic!("{first:?}")
        };
        assert_eq!(
            acquire(&mut conn, keys, "h", LEASE, OP_TTL).await.unwrap(),
            first
        );
        let entered = reenter(&mut conn, keys, "h", "enter", OP_TTL)
            .await
            .unwrap();
        assert_eq!(entered, EnterReply::Entered { token, count: 2 });
        assert_eq!(
            reenter(&mut conn, keys, "h", "enter", OP_TTL)
                .await
                .unwrap(),
            entered
        );
        let released = release(&mut conn, keys, "h", "rel", OP_TTL, pubsub)
            .await
            .unwrap();
        assert_eq!(released, OwnerReply::Done { remaining: 1 });
        assert_eq!(
            release(&mut conn, keys, "h", "rel", OP_TTL, pubsub)
                .await
                .unwrap(),
            released
        );
        let count: Option<u64> = conn.hget(&keys.lock, "h").await.unwrap();
        assert_eq!(count, Some(1));
        assert_eq!(
            release(&mut conn, keys, "h", "last", OP_TTL, pubsub)
                .await
                .unwrap(),
            OwnerReply::Done { remaining: 0 }
        );
        let exists: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(!exists);
    }

    // Renewals of locks in two slots cannot share a script call on a cluster: this is why the
    // watchdog cuts its batches per slot.
    let mut two = per_primary.values();
    let (a, b) = (two.next().unwrap(), two.next().unwrap());
    for keys in [a, b] {
        acquire(&mut conn, keys, "r", LEASE, OP_TTL).await.unwrap();
    }
    let err = renew(&mut conn, &[(a, "r"), (b, "r")], LEASE)
        .await
        .unwrap_err();
    assert!(
        err.to_string().to_ascii_lowercase().contains("crossslot"),
        "{err}"
    );
    assert_eq!(
        renew(&mut conn, &[(a, "r")], LEASE).await.unwrap(),
        vec![true]
    );
}

/// The library never sends a malformed token or delta (the types rule them out), but the
/// scripts still refuse one without writing, and the refusal is a typed protocol error, not a
/// generic Redis error a caller might retry.
#[tokio::test]
async fn malformed_arguments_are_refused_as_protocol_errors_and_write_nothing() {
    let (_server, mut conn, _) = setup().await;
    let keys = ResourceKeys::new(b"t:", b"balance");
    for (token, delta) in [("12abc", "1"), ("0", "1"), ("5", "one")] {
        let err = scripts()
            .fenced_write
            .key(&keys.data)
            .key(&keys.mark)
            .key(keys.op("op-bad"))
            .key(&keys.shared)
            .arg(token)
            .arg(10_000)
            .arg("incrby")
            .arg(delta)
            .invoke_async::<redis::Value>(&mut conn)
            .await
            .map_err(Error::from_reply)
            .unwrap_err();
        assert!(
            matches!(&err, Error::Protocol(detail) if !detail.is_empty()),
            "token {token}, delta {delta}: {err:?}"
        );
        let written: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys.data)
            .arg(&keys.mark)
            .arg(keys.op("op-bad"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            written,
            vec![None, None, None],
            "token {token}, delta {delta}"
        );
    }
}

/// The type checks ride on each script's first read of a key (`redis.pcall`): foreign data
/// is still refused with the typed error before anything is written.
#[tokio::test]
async fn foreign_data_is_refused_by_the_first_read_and_left_alone() {
    let (_server, mut conn, keys) = setup().await;
    let _: () = conn.set(&keys.lock, "foreign").await.unwrap();
    let refused = [
        release(&mut conn, &keys, "h", "r", OP_TTL, PubSub::Classic)
            .await
            .unwrap_err(),
        reenter(&mut conn, &keys, "h", "e", OP_TTL)
            .await
            .unwrap_err(),
        extend(&mut conn, &keys, "h", LEASE).await.unwrap_err(),
    ];
    for err in refused {
        assert!(err.is_wrong_type(), "{err}");
    }
    // Renewal counts foreign data as not held.
    assert_eq!(
        renew(&mut conn, &[(&keys, "h")], LEASE).await.unwrap(),
        vec![false]
    );
    let value: String = conn.get(&keys.lock).await.unwrap();
    assert_eq!(value, "foreign");
    for op in ["r", "e", "h"] {
        let exists: bool = conn.exists(keys.op(op)).await.unwrap();
        assert!(!exists, "record {op} written");
    }

    // A fence counter of another type: no lock, no record, the counter as it was.
    let _: () = conn.del(&keys.lock).await.unwrap();
    let _: () = conn.hset(&keys.fence, "f", "v").await.unwrap();
    let err = acquire(&mut conn, &keys, "h", LEASE, OP_TTL)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!exists);
    let exists: bool = conn.exists(keys.op("h")).await.unwrap();
    assert!(!exists);
    let kept: String = conn.hget(&keys.fence, "f").await.unwrap();
    assert_eq!(kept, "v");
}

/// Fair handoff (`acquire_fair.lua`, `release_fair.lua`): the release that frees the lock
/// reserves it for the first queued client; nobody else can take it, nobody holds it, and the
/// claim is an ordinary fresh acquisition.
mod fair {
    use super::*;

    const GRACE: Duration = Duration::from_secs(5);

    fn waiter(client: &str) -> FairAttempt<'_> {
        FairAttempt {
            client,
            enqueue: true,
            queue_slack: Duration::from_secs(1),
        }
    }

    fn trying(client: &str) -> FairAttempt<'_> {
        FairAttempt {
            enqueue: false,
            ..waiter(client)
        }
    }

    async fn fair_acquire(
        conn: &mut MultiplexedConnection,
        keys: &LockKeys,
        holder: &str,
        fair: FairAttempt<'_>,
    ) -> AcquireReply {
        acquire_fair(conn, keys, holder, LEASE, OP_TTL, fair, None, false)
            .await
            .unwrap()
    }

    async fn fair_release(
        conn: &mut MultiplexedConnection,
        keys: &LockKeys,
        holder: &str,
        op: &str,
        grace: Duration,
    ) -> OwnerReply {
        release_fair(conn, keys, holder, op, OP_TTL, PubSub::Classic, grace, None)
            .await
            .unwrap()
    }

    async fn queue(conn: &mut MultiplexedConnection, keys: &LockKeys) -> Vec<String> {
        conn.zrange(keys.queue(), 0, -1).await.unwrap()
    }

    async fn reserved(conn: &mut MultiplexedConnection, keys: &LockKeys) -> Vec<(String, String)> {
        conn.hgetall(&keys.lock).await.unwrap()
    }

    fn token_of(reply: AcquireReply) -> FencingToken {
        match reply {
            AcquireReply::Acquired { token, count: 1 } => token,
            other => panic!("expected a fresh acquisition, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_release_reserves_the_lock_for_the_first_queued_client_only() {
        let (_server, mut conn, keys) = setup().await;
        let first = token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
        // Waiters queue in the order of their first failed attempt; a try_acquire never does,
        // and a second failure of a queued client keeps its place.
        for (holder, fair) in [
            ("cb:1", waiter("cb")),
            ("cc:1", waiter("cc")),
            ("cd:1", trying("cd")),
            ("cb:1", waiter("cb")),
        ] {
            let reply = fair_acquire(&mut conn, &keys, holder, fair).await;
            assert!(
                matches!(reply, AcquireReply::Held { pttl: Some(_) }),
                "{reply:?}"
            );
        }
        assert_eq!(queue(&mut conn, &keys).await, ["cb", "cc"]);
        let ttl: i64 = conn.pttl(keys.queue()).await.unwrap();
        assert!(ttl > 0, "the queue has no expiry: {ttl}");

        assert_eq!(
            fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE).await,
            OwnerReply::Done { remaining: 0 }
        );
        let reservation = vec![("~reserved".to_owned(), "cb".to_owned())];
        assert_eq!(reserved(&mut conn, &keys).await, reservation);
        assert_eq!(queue(&mut conn, &keys).await, ["cc"]);
        // A re-sent copy of that release replays its reply and reserves nothing again.
        assert_eq!(
            fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE).await,
            OwnerReply::Done { remaining: 0 }
        );
        assert_eq!(queue(&mut conn, &keys).await, ["cc"]);

        // Held for everyone else: fair waiters, try_acquire, and a default-mode acquire.
        for reply in [
            fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await,
            fair_acquire(&mut conn, &keys, "cd:2", trying("cd")).await,
            acquire(&mut conn, &keys, "x:1", LEASE, OP_TTL)
                .await
                .unwrap(),
        ] {
            match reply {
                AcquireReply::Held { pttl: Some(pttl) } => assert!(pttl <= GRACE),
                other => panic!("a reservation was taken by another client: {other:?}"),
            }
        }
        // Nobody holds it: every owner-checked script says so and changes nothing.
        // (Holder ids are `<client id>:<n>`; none can be the "~reserved" field.)
        for holder in ["ca:1", "cb:1"] {
            assert_eq!(
                release(&mut conn, &keys, holder, "r-x", OP_TTL, PubSub::Classic)
                    .await
                    .unwrap(),
                OwnerReply::NotHeld
            );
            assert_eq!(
                fair_release(&mut conn, &keys, holder, "r-y", GRACE).await,
                OwnerReply::NotHeld
            );
            assert_eq!(
                extend(&mut conn, &keys, holder, LEASE).await.unwrap(),
                OwnerReply::NotHeld
            );
            assert_eq!(
                reenter(&mut conn, &keys, holder, "e-x", OP_TTL)
                    .await
                    .unwrap(),
                EnterReply::NotHeld
            );
            assert_eq!(
                renew(&mut conn, &[(&keys, holder)], LEASE).await.unwrap(),
                vec![false]
            );
            let undone = cancel(
                &mut conn,
                &keys,
                holder,
                "c-x",
                CancelKind::Acquire,
                OP_TTL,
                PubSub::Classic,
            )
            .await
            .unwrap();
            assert_eq!(undone, CancelReply::NotRun);
        }
        assert_eq!(reserved(&mut conn, &keys).await, reservation);
        let ttl: i64 = conn.pttl(&keys.lock).await.unwrap();
        assert!(ttl > 0 && ttl <= GRACE.as_millis() as i64, "{ttl}");

        // The reserved client claims with a fresh, higher token; a re-sent claim replays it.
        let claim = fair_acquire(&mut conn, &keys, "cb:7", waiter("cb")).await;
        let second = token_of(claim);
        assert!(second > first);
        assert_eq!(
            fair_acquire(&mut conn, &keys, "cb:7", waiter("cb")).await,
            claim
        );
        assert_eq!(count(&mut conn, &keys, "cb:7").await, Some(1));
        let fields = reserved(&mut conn, &keys).await;
        assert!(
            fields.iter().all(|(f, _)| f != "~reserved"),
            "the claim kept the reservation: {fields:?}"
        );
        let lease: i64 = conn.pttl(&keys.lock).await.unwrap();
        assert!(
            lease > GRACE.as_millis() as i64,
            "the claim kept the grace: {lease}"
        );

        // Next in line: cc. Then the queue is empty and the last release frees the lock.
        fair_release(&mut conn, &keys, "cb:7", "cb:8", GRACE).await;
        let third = token_of(fair_acquire(&mut conn, &keys, "cc:2", waiter("cc")).await);
        assert!(third > second);
        fair_release(&mut conn, &keys, "cc:2", "cc:3", GRACE).await;
        let left: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(!left, "a release with an empty queue left the hash");
        let left: bool = conn.exists(keys.queue()).await.unwrap();
        assert!(!left, "the empty queue is still there");
    }

    #[tokio::test]
    async fn a_winner_leaves_the_queue_and_an_unclaimed_reservation_ends_with_its_grace() {
        let (_server, mut conn, keys) = setup().await;
        token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
        fair_acquire(&mut conn, &keys, "cb:1", waiter("cb")).await;
        fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await;
        // Reserved for cb, which never comes (crashed): after the grace anyone may take it.
        let grace = Duration::from_millis(20);
        fair_release(&mut conn, &keys, "ca:1", "ca:2", grace).await;
        let mut tries = 0;
        let won = loop {
            tries += 1;
            assert!(tries < 10_000, "the unclaimed reservation never ended");
            match fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await {
                AcquireReply::Held { .. } => tokio::time::sleep(Duration::from_millis(5)).await,
                won => break won,
            }
        };
        token_of(won);
        // cc won without a reservation: its own entry left with it; cb's was consumed by the
        // reservation it never claimed.
        assert!(queue(&mut conn, &keys).await.is_empty());
        let left: bool = conn.exists(keys.queue()).await.unwrap();
        assert!(!left);
    }

    #[tokio::test]
    async fn a_release_with_more_local_waiters_queues_its_client_again_behind_the_others() {
        let (_server, mut conn, keys) = setup().await;
        token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
        fair_acquire(&mut conn, &keys, "cb:1", waiter("cb")).await;
        fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await;
        let requeue = Some(("ca", Duration::from_secs(10)));
        let released = release_fair(
            &mut conn,
            &keys,
            "ca:1",
            "ca:2",
            OP_TTL,
            PubSub::Classic,
            GRACE,
            requeue,
        )
        .await
        .unwrap();
        assert_eq!(released, OwnerReply::Done { remaining: 0 });
        assert_eq!(queue(&mut conn, &keys).await, ["cc", "ca"]);
        // Its replay changes nothing, also not the queue.
        let again = release_fair(
            &mut conn,
            &keys,
            "ca:1",
            "ca:2",
            OP_TTL,
            PubSub::Classic,
            GRACE,
            requeue,
        )
        .await
        .unwrap();
        assert_eq!(again, released);
        assert_eq!(queue(&mut conn, &keys).await, ["cc", "ca"]);
        let ttl: i64 = conn.pttl(keys.queue()).await.unwrap();
        assert!(ttl > 0, "{ttl}");
    }

    #[tokio::test]
    async fn a_client_that_leaves_passes_its_reservation_on_and_leaves_others_alone() {
        let (_server, mut conn, keys) = setup().await;
        let leaver = conn.clone();
        let leave = |client: &'static str| {
            let (keys, mut conn) = (keys.clone(), leaver.clone());
            async move {
                leave_fair(&mut conn, &keys, client, GRACE, PubSub::Classic)
                    .await
                    .unwrap()
            }
        };
        token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
        for client in ["cb", "cc", "cd"] {
            fair_acquire(&mut conn, &keys, &format!("{client}:1"), waiter(client)).await;
        }
        // A held lock is never touched; only the entry goes.
        assert_eq!(leave("cd").await, LeaveReply::Dequeued);
        assert_eq!(leave("cd").await, LeaveReply::Absent);
        assert_eq!(count(&mut conn, &keys, "ca:1").await, Some(1));
        fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE).await;
        // Reserved for cb; cc leaving does not touch cb's reservation.
        assert_eq!(leave("cc").await, LeaveReply::Dequeued);
        let reservation = vec![("~reserved".to_owned(), "cb".to_owned())];
        assert_eq!(reserved(&mut conn, &keys).await, reservation);
        // cb leaves: nobody is queued any more, so the lock is free at once.
        assert_eq!(leave("cb").await, LeaveReply::PassedOn);
        let exists: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(!exists);

        // With someone queued behind, the reservation passes to them.
        token_of(fair_acquire(&mut conn, &keys, "ca:3", waiter("ca")).await);
        fair_acquire(&mut conn, &keys, "cb:2", waiter("cb")).await;
        fair_acquire(&mut conn, &keys, "cc:2", waiter("cc")).await;
        fair_release(&mut conn, &keys, "ca:3", "ca:4", GRACE).await;
        assert_eq!(leave("cb").await, LeaveReply::PassedOn);
        let passed = vec![("~reserved".to_owned(), "cc".to_owned())];
        assert_eq!(reserved(&mut conn, &keys).await, passed);
        assert!(queue(&mut conn, &keys).await.is_empty());
        token_of(fair_acquire(&mut conn, &keys, "cc:2", waiter("cc")).await);

        // Foreign data: refused, nothing changed.
        let _: () = conn.set(keys.queue(), "foreign").await.unwrap();
        let err = leave_fair(&mut conn, &keys, "cc", GRACE, PubSub::Classic)
            .await
            .unwrap_err();
        assert!(err.is_wrong_type(), "{err}");
        assert_eq!(count(&mut conn, &keys, "cc:2").await, Some(1));
    }

    #[tokio::test]
    async fn a_release_that_reserves_for_its_own_client_does_not_queue_it_twice() {
        let (_server, mut conn, keys) = setup().await;
        token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
        // Another waiter of the same client queues the client behind its own holder.
        fair_acquire(&mut conn, &keys, "ca:2", waiter("ca")).await;
        assert_eq!(queue(&mut conn, &keys).await, ["ca"]);
        let requeue = Some(("ca", Duration::from_secs(10)));
        let released = release_fair(
            &mut conn,
            &keys,
            "ca:1",
            "ca:3",
            OP_TTL,
            PubSub::Classic,
            GRACE,
            requeue,
        )
        .await
        .unwrap();
        assert_eq!(released, OwnerReply::Done { remaining: 0 });
        let reservation = vec![("~reserved".to_owned(), "ca".to_owned())];
        assert_eq!(reserved(&mut conn, &keys).await, reservation);
        assert!(queue(&mut conn, &keys).await.is_empty());
        // The waiter claims; its release, with nobody left, frees the lock for good: no stale
        // entry of the client is left to be reserved for later.
        token_of(fair_acquire(&mut conn, &keys, "ca:2", waiter("ca")).await);
        fair_release(&mut conn, &keys, "ca:2", "ca:4", GRACE).await;
        let exists: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(
            !exists,
            "the lock was reserved for a client nobody waits in"
        );
    }

    #[tokio::test]
    async fn force_release_frees_a_reservation_and_reports_it() {
        let (_server, mut conn, keys) = setup().await;
        let first = token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
        fair_acquire(&mut conn, &keys, "cb:1", waiter("cb")).await;
        fair_release(&mut conn, &keys, "ca:1", "ca:2", GRACE).await;
        let reply = force_release(&mut conn, &keys, None).await.unwrap();
        assert_eq!(
            reply,
            ForceReleaseReply::Evicted {
                token: None,
                fence: first.get(),
                holder: b"~reserved:cb".to_vec(),
                count: 0,
            }
        );
        let second = token_of(fair_acquire(&mut conn, &keys, "cc:1", waiter("cc")).await);
        assert!(second > first);
    }

    #[tokio::test]
    async fn a_foreign_queue_key_is_refused_before_anything_is_written() {
        let (_server, mut conn, keys) = setup().await;
        let _: () = conn.set(keys.queue(), "foreign").await.unwrap();
        // Free lock: the winner's ZREM would fail; nothing is taken.
        let err = acquire_fair(
            &mut conn,
            &keys,
            "ca:1",
            LEASE,
            OP_TTL,
            waiter("ca"),
            None,
            false,
        )
        .await
        .unwrap_err();
        assert!(err.is_wrong_type(), "{err}");
        for key in [keys.lock.clone(), keys.fence.clone(), keys.op("ca:1")] {
            let exists: bool = conn.exists(&key).await.unwrap();
            assert!(!exists, "{} written", String::from_utf8_lossy(&key));
        }
        // Held lock: the waiter's ZADD fails; the release that frees it refuses too.
        let _: () = conn.del(keys.queue()).await.unwrap();
        token_of(fair_acquire(&mut conn, &keys, "ca:1", waiter("ca")).await);
        let _: () = conn.set(keys.queue(), "foreign").await.unwrap();
        let err = acquire_fair(
            &mut conn,
            &keys,
            "cb:1",
            LEASE,
            OP_TTL,
            waiter("cb"),
            None,
            false,
        )
        .await
        .unwrap_err();
        assert!(err.is_wrong_type(), "{err}");
        let err = release_fair(
            &mut conn,
            &keys,
            "ca:1",
            "ca:2",
            OP_TTL,
            PubSub::Classic,
            GRACE,
            None,
        )
        .await
        .unwrap_err();
        assert!(err.is_wrong_type(), "{err}");
        assert_eq!(count(&mut conn, &keys, "ca:1").await, Some(1));
        let value: String = conn.get(keys.queue()).await.unwrap();
        assert_eq!(value, "foreign");
    }

    /// The claim's contract: a lock reserved for a client is claimed by one of its waiters,
    /// and from then on it is held. Another waiter of the same client (a second task, its
    /// `try_acquire`) finds it held like everyone else, and so do a re-sent claim's neighbours:
    /// the claim must not leave the reservation in the held hash. Called by the scripts
    /// directly, so it judges the scripts whatever the machine's load.
    fn a_claimed_reservation_is_held_for_the_clients_other_waiters_too<'a>(
        conn: &'a mut MultiplexedConnection,
        keys: &'a LockKeys,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            token_of(fair_acquire(conn, keys, "ca:1", waiter("ca")).await);
            fair_acquire(conn, keys, "cb:1", waiter("cb")).await;
            fair_release(conn, keys, "ca:1", "ca:2", GRACE).await;
            let claimed = token_of(fair_acquire(conn, keys, "cb:1", waiter("cb")).await);
            for (holder, attempt) in [("cb:2", waiter("cb")), ("cb:3", trying("cb"))] {
                match fair_acquire(conn, keys, holder, attempt).await {
                    AcquireReply::Held { .. } => {}
                    other => {
                        return Err(format!(
                            "{holder} of the reserved client got {other:?} while cb:1 held the \
                             lock it claimed with {claimed:?}"
                        ))
                    }
                }
            }
            if count(conn, keys, "cb:1").await != Some(1) {
                return Err("the claim's holder lost the lock to its own client".into());
            }
            Ok(())
        })
    }

    const CHECKS: [(&str, Check); 1] = [(
        "a_claimed_reservation_is_held_for_the_clients_other_waiters_too",
        a_claimed_reservation_is_held_for_the_clients_other_waiters_too,
    )];

    fn free_keys() -> LockKeys {
        LockKeys::new(b"t:", b"res")
    }

    #[tokio::test]
    async fn the_fair_handoff_contract_checks_hold() {
        assert_checks_hold(&CHECKS, free_keys).await;
    }

    /// The fair-handoff control breaks the contract check above, on a fresh server, whatever
    /// the timing: the scripts are called directly.
    #[cfg(fencelock_negative_controls)]
    #[tokio::test]
    async fn the_fair_handoff_negative_control_is_caught() {
        use crate::protocol::controls::Control;
        assert_controls_caught(&[Control::ClaimKeepsReservation], &CHECKS, free_keys).await;
    }
}

/// Re-entry hands back the holder's own token, whatever its digits: the scripts' Lua numbers
/// are doubles, printed with 14 significant digits, and a token is a 16-digit count of
/// microseconds, so a script that turned one into text with `tostring` (or `..`) would round it
/// to a multiple of 100.
mod reentry {
    use super::*;

    /// A token as the clock floor issues them (microseconds since the epoch), ending in 00:
    /// `tostring(token + 1)` rounds back to it.
    const ROUND_TOKEN: u64 = 1_796_447_178_797_000;

    fn reentry_returns_the_holders_own_token<'a>(
        conn: &'a mut MultiplexedConnection,
        keys: &'a LockKeys,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            acquired(conn, keys, "h", LEASE).await;
            // The token the lock holds, set to one whose successor prints as itself.
            let _: () = conn
                .hset(&keys.lock, "~token", ROUND_TOKEN)
                .await
                .map_err(|e| e.to_string())?;
            let token = FencingToken::new(ROUND_TOKEN).expect("a token above zero");
            let entered = reenter(conn, keys, "h", "enter", OP_TTL)
                .await
                .map_err(|e| e.to_string())?;
            if entered != (EnterReply::Entered { token, count: 2 }) {
                return Err(format!(
                    "re-entry of a lock with token {token} gave {entered:?}"
                ));
            }
            let stored: u64 = conn
                .hget(&keys.lock, "~token")
                .await
                .map_err(|e| e.to_string())?;
            if stored != ROUND_TOKEN {
                return Err(format!("re-entry moved the lock's token to {stored}"));
            }
            Ok(())
        })
    }

    const CHECKS: [(&str, Check); 1] = [(
        "reentry_returns_the_holders_own_token",
        reentry_returns_the_holders_own_token,
    )];

    fn free_keys() -> LockKeys {
        LockKeys::new(b"t:", b"res")
    }

    #[tokio::test]
    async fn the_reentry_contract_check_holds() {
        assert_checks_hold(&CHECKS, free_keys).await;
    }

    /// The control that bumps the token on re-entry is caught on every token, the ones ending
    /// in 00 included, which the client-side check of `tests/lock/basics.rs` met only by the clock.
    #[cfg(fencelock_negative_controls)]
    #[tokio::test]
    async fn the_reentry_control_is_caught() {
        use crate::protocol::controls::Control;
        assert_controls_caught(&[Control::ReentryBumpsToken], &CHECKS, free_keys).await;
    }
}
