//! The scripts' contracts, call by call, against a real redis-server: replays of the same
//! operation id change nothing, cancels undo exactly one operation, owners are checked.

use std::time::Duration;

use redis::AsyncCommands;

use super::contract_tests::{
    assert_replay, cancelled_by, connect_as, contract_checks, lock_keys, released_by, setup, undo,
    Checked, Conn, LEASE, OP_TTL,
};
use super::resource_tests::refused_write;
use super::*;
use crate::base::error::Superseded;

async fn count(conn: &mut Conn, keys: &LockKeys, holder: &str) -> Option<u64> {
    conn.hget(&keys.lock, holder).await.unwrap()
}

/// `holder`'s re-entry as operation `op`, answered.
async fn entered_by(conn: &mut Conn, keys: &LockKeys, holder: &str, op: &str) -> EnterReply {
    reenter(conn, keys, holder, op, OP_TTL).await.unwrap()
}

/// The token of a fresh acquisition by `holder`; panics when the lock was not free.
pub(super) async fn acquired(
    conn: &mut Conn,
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
    assert_replay(&first, &again);
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
    let label = |conn: &mut Conn| {
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
    assert_replay(&first, &again);
    assert_eq!(label(&mut conn).await.as_deref(), Some("req-1"));
    entered_by(&mut conn, &keys, "h1", "h1:r").await;
    assert_eq!(count(&mut conn, &keys, "h1").await, Some(2));
    assert_eq!(label(&mut conn).await.as_deref(), Some("req-1"));
    let busy = acquire_labelled(&mut conn, &keys, "h2", LEASE, OP_TTL, Some("req-2"), false)
        .await
        .unwrap();
    assert!(matches!(busy, AcquireReply::Held { .. }), "{busy:?}");
    assert_eq!(label(&mut conn).await.as_deref(), Some("req-1"));
    for op in ["h1:x1", "h1:x2"] {
        released_by(&mut conn, &keys, "h1", op).await;
    }
    let left: bool = conn.exists(&keys.lock).await.unwrap();
    assert!(!left, "the label left with the hold");
    acquired(&mut conn, &keys, "h3", LEASE).await;
    assert_eq!(label(&mut conn).await, None, "no label unless given");
}

#[tokio::test]
async fn a_replayed_reentry_or_release_applies_once() {
    let (_server, mut conn, keys) = setup().await;
    let token = acquired(&mut conn, &keys, "h", LEASE).await;
    let entered = entered_by(&mut conn, &keys, "h", "op-enter").await;
    assert_eq!(entered, EnterReply::Entered { token, count: 2 });
    assert_eq!(entered_by(&mut conn, &keys, "h", "op-enter").await, entered);
    assert_eq!(count(&mut conn, &keys, "h").await, Some(2));

    let released = released_by(&mut conn, &keys, "h", "op-rel-1").await;
    assert_eq!(released, OwnerReply::Done { remaining: 1 });
    assert_eq!(
        released_by(&mut conn, &keys, "h", "op-rel-1").await,
        released
    );
    assert_eq!(count(&mut conn, &keys, "h").await, Some(1));

    let last = released_by(&mut conn, &keys, "h", "op-rel-2").await;
    assert_eq!(last, OwnerReply::Done { remaining: 0 });
    // A new holder takes over; the old release replayed late must neither fail nor touch it.
    let next = acquired(&mut conn, &keys, "h2", LEASE).await;
    assert!(next > token);
    assert_eq!(released_by(&mut conn, &keys, "h", "op-rel-2").await, last);
    assert_eq!(count(&mut conn, &keys, "h2").await, Some(1));
    // One record per hold: the release that freed the lock marked the holder's acquire record
    // instead of writing its own, and a late copy of the acquire is still refused by it.
    let exists: bool = conn.exists(keys.op("op-rel-2")).await.unwrap();
    assert!(!exists, "the freeing release wrote a record of its own");
    let mark: Option<String> = conn.get(keys.op("h")).await.unwrap();
    assert_eq!(mark.as_deref(), Some("r:op-rel-2"));
    // Another release of that holder did not free the lock: not held, as before.
    assert_eq!(
        released_by(&mut conn, &keys, "h", "op-rel-3").await,
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

/// A release that skips its op record (`release.lua` ARGV[5] = 0, only for a hold never
/// re-entered) is still applied once: its copies, a straggling first send included, find the
/// mark of the release that freed the lock, as long as it lasts after a new holder took it.
#[tokio::test]
async fn a_release_of_a_hold_entered_once_needs_no_record_to_apply_once() {
    let (_server, mut conn, keys) = setup().await;
    acquired(&mut conn, &keys, "h", LEASE).await;
    let unread = |conn: &mut Conn| {
        let keys = keys.clone();
        let mut conn = conn.clone();
        async move {
            release(&mut conn, &keys, "h", "rel", OP_TTL, PubSub::Classic, false)
                .await
                .unwrap()
        }
    };
    assert_eq!(unread(&mut conn).await, OwnerReply::Done { remaining: 0 });
    assert_eq!(unread(&mut conn).await, OwnerReply::Done { remaining: 0 });
    acquired(&mut conn, &keys, "h2", LEASE).await;
    assert_eq!(unread(&mut conn).await, OwnerReply::Done { remaining: 0 });
    assert_eq!(count(&mut conn, &keys, "h2").await, Some(1));
    let exists: bool = conn.exists(keys.op("rel")).await.unwrap();
    assert!(!exists, "the release wrote a record of its own");
}

#[tokio::test]
async fn owner_checks_leave_another_holders_lock_alone() {
    let (_server, mut conn, keys) = setup().await;
    acquire(&mut conn, &keys, "owner", LEASE, OP_TTL)
        .await
        .unwrap();
    assert_eq!(
        released_by(&mut conn, &keys, "intruder", "op1").await,
        OwnerReply::NotHeld
    );
    assert_eq!(
        extend(&mut conn, &keys, "intruder", Duration::from_secs(600))
            .await
            .unwrap(),
        OwnerReply::NotHeld
    );
    assert_eq!(
        entered_by(&mut conn, &keys, "intruder", "op2").await,
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
    let undone = cancelled_by(&mut conn, &keys, "a", "a", CancelKind::Acquire).await;
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
        cancelled_by(&mut conn, &keys, "b", "b", CancelKind::Acquire).await,
        CancelReply::NotRun
    );
    assert_eq!(
        acquire(&mut conn, &keys, "b", LEASE, OP_TTL).await.unwrap(),
        AcquireReply::Cancelled
    );

    // A re-entry that ran is undone with exactly one decrement, however often cancel runs.
    acquire(&mut conn, &keys, "c", LEASE, OP_TTL).await.unwrap();
    entered_by(&mut conn, &keys, "c", "enter-1").await;
    entered_by(&mut conn, &keys, "c", "enter-2").await;
    assert_eq!(count(&mut conn, &keys, "c").await, Some(3));
    let undone = undo(&mut conn, &keys, "c", "enter-1", CancelKind::Reenter).await;
    assert_eq!(undone.unwrap(), CancelReply::Undone { remaining: 2 });
    let again = undo(&mut conn, &keys, "c", "enter-1", CancelKind::Reenter).await;
    assert_eq!(again.unwrap(), CancelReply::NotRun);
    assert_eq!(count(&mut conn, &keys, "c").await, Some(2));
    assert_eq!(
        entered_by(&mut conn, &keys, "c", "enter-1").await,
        EnterReply::Cancelled
    );

    // A re-entry cancelled before it ran leaves the count alone and never runs.
    let not_run = undo(&mut conn, &keys, "c", "enter-3", CancelKind::Reenter).await;
    assert_eq!(not_run.unwrap(), CancelReply::NotRun);
    assert_eq!(
        entered_by(&mut conn, &keys, "c", "enter-3").await,
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
        released_by(&mut conn, &keys, "h", "op").await,
        OwnerReply::Done { remaining: 0 }
    );
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

/// `fenced_write.lua` adding `delta` to the resource `keys` as the operation `op` of the holder
/// of `token`, kept for no retention.
async fn incr_by(
    conn: &mut Conn,
    keys: &ResourceKeys,
    (token, op): (u64, &str),
    delta: i64,
) -> Result<WriteReply, Error> {
    let token = FencingToken::new(token).unwrap();
    let write = Write::IncrBy(delta);
    fenced_write(conn, keys, token, op, OP_TTL, write, Duration::ZERO).await
}

/// Writes of many values (past the 8000 that one Lua `unpack` takes) apply whole, in one call.
#[tokio::test]
async fn a_fenced_write_of_ten_thousand_values_applies_whole() {
    let (_server, mut conn, _) = setup().await;
    let token = FencingToken::new(7).unwrap();
    let keys = ResourceKeys::new(b"t:", b"ledger");
    let items: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("entry-{i}").into_bytes())
        .collect();
    let items: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
    let pushed = fenced_write(
        &mut conn,
        &keys,
        token,
        "w1",
        OP_TTL,
        Write::Push(&items),
        Duration::ZERO,
    );
    assert_eq!(pushed.await.unwrap(), WriteReply::Accepted(10_000));
    let last: Vec<u8> = conn.lindex(&keys.data, -1).await.unwrap();
    assert_eq!(last, b"entry-9999");
    let keys = ResourceKeys::new(b"t:", b"profile");
    let names: Vec<Vec<u8>> = (0..5_000)
        .map(|i| format!("field-{i}").into_bytes())
        .collect();
    let fields: Vec<(&[u8], &[u8])> = names.iter().map(|n| (n.as_slice(), &b"v"[..])).collect();
    let set = fenced_write(
        &mut conn,
        &keys,
        token,
        "w2",
        OP_TTL,
        Write::SetFields(&fields),
        Duration::ZERO,
    );
    assert_eq!(set.await.unwrap(), WriteReply::Accepted(0));
    let count: u64 = conn.hlen(&keys.data).await.unwrap();
    assert_eq!(count, 5_000);
}

#[tokio::test]
async fn a_replayed_fenced_write_applies_once_and_a_stale_one_never() {
    let (_server, mut conn, _) = setup().await;
    let keys = ResourceKeys::new(b"t:", b"balance");
    let first = incr_by(&mut conn, &keys, (7, "w1"), 100).await;
    assert_eq!(first.unwrap(), WriteReply::Accepted(100));
    let replay = incr_by(&mut conn, &keys, (7, "w1"), 100).await;
    assert_eq!(
        replay.unwrap(),
        WriteReply::Accepted(100),
        "replayed, not applied"
    );
    let value: i64 = conn.get(&keys.data).await.unwrap();
    assert_eq!(value, 100);

    let newer = incr_by(&mut conn, &keys, (9, "w2"), -1).await;
    assert_eq!(newer.unwrap(), WriteReply::Accepted(99));
    let stale = incr_by(&mut conn, &keys, (8, "w3"), -50).await;
    assert_eq!(
        stale.unwrap(),
        WriteReply::Stale {
            latest: FencingToken::new(9).unwrap(),
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

/// An increment past 2^53, where a Lua number is inexact, answers the exact new value, and so
/// does its replay.
#[tokio::test]
async fn an_increment_past_two_to_the_53_answers_the_exact_value() {
    let (_server, mut conn, _) = setup().await;
    let keys = ResourceKeys::new(b"t:", b"wei");
    let start: i64 = (1 << 53) + 1;
    let _: () = conn.set(&keys.data, start).await.unwrap();
    for (op, delta, expected) in [("w1", 1000, start + 1000), ("w1", 1000, start + 1000)] {
        let reply = incr_by(&mut conn, &keys, (7, op), delta).await;
        assert_eq!(reply.unwrap(), WriteReply::Accepted(expected), "{op}");
    }
    let top = incr_by(&mut conn, &keys, (7, "w2"), i64::MAX - start - 1000).await;
    assert_eq!(top.unwrap(), WriteReply::Accepted(i64::MAX));
    let value: i64 = conn.get(&keys.data).await.unwrap();
    assert_eq!(value, i64::MAX);
}

#[tokio::test]
async fn a_late_duplicate_acquire_after_the_hold_ended_does_nothing() {
    let (_server, mut conn, keys) = setup().await;
    // A copy exists only of an acquisition sent more than once, and every send after one whose
    // outcome was unknown is recorded: the acquisitions here are such re-sends, and the late
    // copy is the first send (unrecorded), arriving last.
    let recorded = async |conn: &mut Conn, holder: &str, lease: Duration| {
        acquire_labelled(conn, &keys, holder, lease, OP_TTL, None, true)
            .await
            .unwrap()
    };
    // Released: a copy of the acquire that arrives afterwards must not take the lock again.
    recorded(&mut conn, "h", LEASE).await;
    released_by(&mut conn, &keys, "h", "rel").await;
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
        force_release(&mut conn, &keys, None, PubSub::Classic)
            .await
            .unwrap(),
        ForceReleaseReply::NotHeld
    );
    let exists: bool = conn.exists(&keys.fence).await.unwrap();
    assert!(!exists, "a free lock's force release writes nothing");

    let token = acquired(&mut conn, &keys, "h", LEASE).await;
    entered_by(&mut conn, &keys, "h", "op-enter").await;
    let _: () = conn.del(&keys.fence).await.unwrap();

    // Another token than the one held: nothing changes.
    let other = FencingToken::new(token.get() + 1).unwrap();
    assert_eq!(
        force_release(&mut conn, &keys, Some(other), PubSub::Classic)
            .await
            .unwrap(),
        ForceReleaseReply::OtherToken { token: Some(token) }
    );
    assert_eq!(count(&mut conn, &keys, "h").await, Some(2));

    assert_eq!(
        force_release(&mut conn, &keys, Some(token), PubSub::Classic)
            .await
            .unwrap(),
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
        released_by(&mut conn, &keys, "h", "op-rel").await,
        OwnerReply::NotHeld
    );
    let next = acquired(&mut conn, &keys, "h2", LEASE).await;
    assert!(next > token);
}

/// An operator who may not publish is refused before anything is written: the holder keeps
/// the lock, rather than losing it with no waiter told.
#[tokio::test]
async fn force_release_by_a_user_who_may_not_publish_changes_nothing() {
    let (server, mut conn, keys) = setup().await;
    let token = acquired(&mut conn, &keys, "h", LEASE).await;
    let mut operator = connect_as(&server, &mut conn, "nopublish", &["publish"]).await;
    let refused = force_release(&mut operator, &keys, None, PubSub::Classic).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        count(&mut conn, &keys, "h").await,
        Some(1),
        "the holder was evicted"
    );
    let fence: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(fence, token.get());
}

#[tokio::test]
async fn force_release_never_lowers_the_counter_and_refuses_foreign_data() {
    let (_server, mut conn, keys) = setup().await;
    let token = acquired(&mut conn, &keys, "h", LEASE).await;
    // Another lock of the bucket issued a higher token since.
    let higher = token.get() + 1000;
    let _: () = conn.set(&keys.fence, higher).await.unwrap();
    match force_release(&mut conn, &keys, None, PubSub::Classic)
        .await
        .unwrap()
    {
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
    let err = force_release(&mut conn, &keys, None, PubSub::Classic)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err:?}");
    assert_eq!(count(&mut conn, &keys, "h2").await, Some(1));

    let _: () = conn.set(&keys.lock, "not a hash").await.unwrap();
    let err = force_release(&mut conn, &keys, None, PubSub::Classic)
        .await
        .unwrap_err();
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
        let AcquireReply::Acquired {
            token,
            count: 1,
            lease_left: None,
        } = first
        else {
            panic!("{first:?}")
        };
        let again = acquire(&mut conn, keys, "h", LEASE, OP_TTL).await.unwrap();
        assert!(
            matches!(again, AcquireReply::Acquired { token: t, count: 1, lease_left: Some(left) }
                if t == token && left <= LEASE),
            "{again:?}"
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
        let released = release(&mut conn, keys, "h", "rel", OP_TTL, pubsub, false)
            .await
            .unwrap();
        assert_eq!(released, OwnerReply::Done { remaining: 1 });
        assert_eq!(
            release(&mut conn, keys, "h", "rel", OP_TTL, pubsub, true)
                .await
                .unwrap(),
            released
        );
        let count: Option<u64> = conn.hget(&keys.lock, "h").await.unwrap();
        assert_eq!(count, Some(1));
        assert_eq!(
            release(&mut conn, keys, "h", "last", OP_TTL, pubsub, false)
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
        let err = refused_write(
            &mut conn,
            &keys,
            "op-bad",
            &[token, "10000", "incrby", delta],
        )
        .await;
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
        release(&mut conn, &keys, "h", "r", OP_TTL, PubSub::Classic, false)
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
#[path = "fair_tests.rs"]
mod fair;

/// Re-entry hands back the holder's own token, whatever its digits: the scripts' Lua numbers
/// are doubles, printed with 14 significant digits, and a token is a 16-digit count of
/// microseconds, so a script that turned one into text with `tostring` (or `..`) would round it
/// to a multiple of 100.
mod reentry {
    use super::*;

    /// A token as the clock floor issues them (microseconds since the epoch), ending in 00:
    /// `tostring(token + 1)` rounds back to it.
    const ROUND_TOKEN: u64 = 1_796_447_178_797_000;

    async fn reentry_returns_the_holders_own_token(conn: &mut Conn, keys: &LockKeys) -> Checked {
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
    }

    contract_checks! {
        /// The control that bumps the token on re-entry is caught on every token, the ones
        /// ending in 00 included, which the client-side check of `tests/lock/basics.rs` met
        /// only by the clock.
        the_reentry_contract_check_holds, the_reentry_control_is_caught, lock_keys;
        reentry_returns_the_holders_own_token => [Control::ReentryBumpsToken],
    }
}
