//! Contracts of `acquire_all.lua` and `release_all.lua`, call by call, against a real
//! redis-server: all or nothing, replays, cancels of single members, shared fence counters.

use redis::AsyncCommands;

use fencelock_testing::RedisServer;

use super::contract_tests::{cancelled_by, released_by, Conn, LEASE, OP_TTL};
use super::*;

async fn setup(names: &[&[u8]]) -> (RedisServer, Conn, Vec<LockKeys>) {
    let (server, conn, _) = super::contract_tests::setup().await;
    let keys = names.iter().map(|n| LockKeys::new(b"t:", n)).collect();
    (server, conn, keys)
}

fn members<'a>(keys: &'a [LockKeys], holders: &[&'a str]) -> Vec<(&'a LockKeys, &'a str)> {
    keys.iter().zip(holders.iter().copied()).collect()
}

/// The set `members`' acquisition (`acquire_all.lua`) with the default lease, answered.
async fn take_all(conn: &mut Conn, members: &[(&LockKeys, &str)]) -> AcquireAllReply {
    acquire_all(conn, members, LEASE, OP_TTL, None)
        .await
        .unwrap()
}

/// Asserts that none of the locks of `keys` is held.
async fn assert_all_free(conn: &mut Conn, keys: &[LockKeys]) {
    for k in keys {
        assert!(!conn.exists::<_, bool>(&k.lock).await.unwrap());
    }
}

async fn holder_count(conn: &mut Conn, keys: &LockKeys, holder: &str) -> Option<u64> {
    conn.hget(&keys.lock, holder).await.unwrap()
}

#[tokio::test]
async fn all_members_or_none_and_a_replay_returns_the_same_tokens() {
    let (_server, mut conn, keys) = setup(&[b"a", b"b", b"c"]).await;
    let set = members(&keys, &["h1", "h2", "h3"]);
    let first = take_all(&mut conn, &set).await;
    let AcquireAllReply::Acquired { tokens } = &first else {
        panic!("{first:?}")
    };
    assert_eq!(tokens.len(), 3);
    for (k, h) in &set {
        assert_eq!(holder_count(&mut conn, k, h).await, Some(1));
    }
    assert_eq!(take_all(&mut conn, &set).await, first);

    // A second set overlapping in one member ("b", the second) takes nothing.
    let keys2 = vec![LockKeys::new(b"t:", b"x"), keys[1].clone()];
    let other = members(&keys2, &["g1", "g2"]);
    match take_all(&mut conn, &other).await {
        AcquireAllReply::Held {
            index: 1,
            pttl: Some(pttl),
        } => assert!(pttl <= LEASE),
        reply => panic!("{reply:?}"),
    }
    assert!(!conn.exists::<_, bool>(&keys2[0].lock).await.unwrap());
    assert!(!conn.exists::<_, bool>(keys2[0].op("g1")).await.unwrap());

    // Members are ordinary locks: release.lua frees one; release_all the rest, replayable.
    assert_eq!(
        released_by(&mut conn, &keys[0], "h1", "r1").await,
        OwnerReply::Done { remaining: 0 }
    );
    let rest = [(&keys[1], "h2", "r2"), (&keys[2], "h3", "r3")];
    let released = release_all(&mut conn, &rest, OP_TTL).await.unwrap();
    assert_eq!(released, vec![OwnerReply::Done { remaining: 0 }; 2]);
    assert_eq!(
        release_all(&mut conn, &rest, OP_TTL).await.unwrap(),
        released
    );
    assert_eq!(
        released_by(&mut conn, &keys[2], "h3", "r3").await,
        OwnerReply::Done { remaining: 0 }
    );
    // A late copy of the set's acquire, after its hold ended, does nothing.
    assert_eq!(take_all(&mut conn, &set).await, AcquireAllReply::Cancelled);
    assert_all_free(&mut conn, &keys).await;
    // Not held: -1 for that member, nothing touched.
    assert_eq!(
        release_all(&mut conn, &[(&keys[0], "h1", "r9")], OP_TTL)
            .await
            .unwrap(),
        vec![OwnerReply::NotHeld]
    );
}

#[tokio::test]
async fn cancelling_one_member_before_the_script_runs_makes_it_a_no_op() {
    let (_server, mut conn, keys) = setup(&[b"a", b"b"]).await;
    let set = members(&keys, &["h1", "h2"]);
    // The cancel of member 2 arrives first (its drop guard ran before the script).
    let undone = cancelled_by(&mut conn, &keys[1], "h2", "h2", CancelKind::Acquire).await;
    assert_eq!(undone, CancelReply::NotRun);
    assert_eq!(take_all(&mut conn, &set).await, AcquireAllReply::Cancelled);
    assert_all_free(&mut conn, &keys).await;
}

#[tokio::test]
async fn cancelling_every_member_after_the_script_frees_them_all() {
    let (_server, mut conn, keys) = setup(&[b"a", b"b"]).await;
    let set = members(&keys, &["h1", "h2"]);
    assert!(matches!(
        take_all(&mut conn, &set).await,
        AcquireAllReply::Acquired { .. }
    ));
    assert!(matches!(
        cancelled_by(&mut conn, &keys[0], "h1", "h1", CancelKind::Acquire).await,
        CancelReply::Undone { remaining: 0 }
    ));
    // Half undone: a re-sent copy of the script must not take the set again.
    assert_eq!(take_all(&mut conn, &set).await, AcquireAllReply::Cancelled);
    assert!(matches!(
        cancelled_by(&mut conn, &keys[1], "h2", "h2", CancelKind::Acquire).await,
        CancelReply::Undone { remaining: 0 }
    ));
    assert_all_free(&mut conn, &keys).await;
}

#[tokio::test]
async fn members_sharing_a_fence_counter_get_distinct_increasing_tokens() {
    // Two names in one slot bucket share a fence counter.
    let first = LockKeys::new(b"t:", b"n0");
    let twin = (1..)
        .map(|i| format!("n{i}"))
        .find(|n| LockKeys::new(b"t:", n.as_bytes()).fence == first.fence)
        .unwrap();
    let (_server, mut conn, keys) = setup(&[b"n0", twin.as_bytes(), b"other"]).await;
    assert_eq!(keys[0].fence, keys[1].fence);
    let set = members(&keys, &["h1", "h2", "h3"]);
    let AcquireAllReply::Acquired { tokens } = take_all(&mut conn, &set).await else {
        panic!("free set not acquired")
    };
    assert!(tokens[1] > tokens[0]);
    let counter: u64 = conn.get(&keys[0].fence).await.unwrap();
    assert_eq!(counter, tokens[1].get());
    // A single acquire in that bucket afterwards is higher still.
    released_by(&mut conn, &keys[0], "h1", "r1").await;
    let AcquireReply::Acquired { token, .. } = acquire(&mut conn, &keys[0], "s", LEASE, OP_TTL)
        .await
        .unwrap()
    else {
        panic!("free lock not acquired")
    };
    assert!(token > tokens[1]);
}

#[tokio::test]
async fn foreign_data_at_any_member_modifies_nothing() {
    let (_server, mut conn, keys) = setup(&[b"a", b"b"]).await;
    let _: () = conn.set(&keys[1].lock, "foreign").await.unwrap();
    let err = acquire_all(
        &mut conn,
        &members(&keys, &["h1", "h2"]),
        LEASE,
        OP_TTL,
        None,
    )
    .await
    .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    assert!(!conn.exists::<_, bool>(&keys[0].lock).await.unwrap());
    assert!(!conn.exists::<_, bool>(keys[0].op("h1")).await.unwrap());
    let err = release_all(
        &mut conn,
        &[(&keys[0], "h1", "r1"), (&keys[1], "h2", "r2")],
        OP_TTL,
    )
    .await
    .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    assert!(!conn.exists::<_, bool>(keys[0].op("r1")).await.unwrap());
}
