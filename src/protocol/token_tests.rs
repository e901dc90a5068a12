//! The fencing token's issue (`lib/next_token.lua`): max(counter + 1, server time in µs),
//! exact up to 2^53, and a counter it refuses left as it was, for a lock and for a free
//! semaphore or read-write lock alike.

use redis::AsyncCommands;

use super::contract_tests::{
    hold_field_expiry, hold_test, released_by, rw_keys, sem_keys, setup, Conn, LEASE, OP_TTL,
};
use super::lock_tests::acquired;
use super::rwlock::{RwAcquireReply, RwMode};
use super::semaphore::{HoldAcquire, SemAcquireReply};
use super::*;

#[tokio::test]
async fn tokens_are_exact_past_the_time_floor() {
    let (_server, mut conn, keys) = setup().await;
    // A counter far above the clock floor keeps counting by one, exactly.
    let high = 9_007_199_254_740_000_u64;
    let _: () = conn.set(&keys.fence, high).await.unwrap();
    let token = acquired(&mut conn, &keys, "h", LEASE).await;
    assert_eq!(token.get(), high + 1);
    released_by(&mut conn, &keys, "h", "op").await;
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
        released_by(&mut conn, &keys, holder, &format!("rel-{holder}")).await;
    }
}

/// The counter is read and written by one `SET ... KEEPTTL GET` (`take_token`): whatever it
/// held that is below the clock (fewer digits, leading zeros, a number in another notation)
/// gives the clock's token, and an expiry someone set on it stays; a value it refuses (no
/// number, or the next token at 2^53) is put back as it was, expiry included, and no lock is
/// taken.
#[tokio::test]
async fn the_counter_is_taken_in_one_write_and_put_back_when_refused() {
    let (_server, mut conn, keys) = setup().await;
    for (i, below) in ["7", "0000000000000012", "1000000000000000", "1.5e3"]
        .into_iter()
        .enumerate()
    {
        let _: () = conn.pset_ex(&keys.fence, below, 60_000).await.unwrap();
        let token = acquired(&mut conn, &keys, &format!("b{i}"), LEASE).await;
        assert!(token.get() > 1_700_000_000_000_000, "{below}: {token}");
        let counter: u64 = conn.get(&keys.fence).await.unwrap();
        assert_eq!(counter, token.get(), "{below}: the counter holds the token");
        assert!(
            conn.pttl::<_, i64>(&keys.fence).await.unwrap() > 0,
            "{below}: the counter's expiry stays"
        );
        released_by(&mut conn, &keys, &format!("b{i}"), &format!("rb{i}")).await;
    }
    for (i, refused) in [
        "not a number",
        "99999999999999999",
        "9007199254740991",
        "12a",
    ]
    .into_iter()
    .enumerate()
    {
        let _: () = conn.pset_ex(&keys.fence, refused, 60_000).await.unwrap();
        let err = acquire(&mut conn, &keys, &format!("r{i}"), LEASE, OP_TTL)
            .await
            .unwrap_err();
        assert!(
            matches!(err, crate::Error::TokenOverflow { .. }) || err.is_wrong_type(),
            "{refused}: {err}"
        );
        let kept: String = conn.get(&keys.fence).await.unwrap();
        assert_eq!(kept, refused, "the refused counter is put back");
        assert!(
            conn.pttl::<_, i64>(&keys.fence).await.unwrap() > 0,
            "{refused}: with its expiry"
        );
        let exists: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(!exists, "{refused}: no lock taken");
    }
}

/// One acquisition of a free semaphore's permit or read-write lock's write (by the keys'
/// layout) by `holder`: its token, or the error it was refused with.
async fn hold_taken(conn: &mut Conn, keys: &LockKeys, holder: &str) -> Result<u64, crate::Error> {
    let expiry = hold_field_expiry();
    let acquisition = HoldAcquire::of(
        keys,
        holder,
        LEASE,
        OP_TTL,
        PubSub::Classic,
        expiry,
        None,
        false,
    );
    if keys.rw_writers().is_some() {
        match acquisition.rw_acquire(conn, RwMode::Write, false).await? {
            RwAcquireReply::Acquired { token, .. } => Ok(token.get()),
            other => panic!("a free lock answered {other:?}"),
        }
    } else {
        match acquisition.sem_acquire(conn, 1, 3, None).await? {
            SemAcquireReply::Acquired { token, .. } => Ok(token.get()),
            other => panic!("a free semaphore answered {other:?}"),
        }
    }
}

/// A free semaphore or read-write lock takes its counter as a lock does (one write, the
/// counter's expiry kept), and a counter it refuses is put back as it was, with no hold taken.
async fn a_free_holds_counter_is_taken_and_put_back_when_refused(conn: &mut Conn, keys: &LockKeys) {
    let _: () = conn.pset_ex(&keys.fence, "7", 60_000).await.unwrap();
    let token = hold_taken(conn, keys, "b").await.unwrap();
    assert!(token > 1_700_000_000_000_000, "{token}");
    let counter: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(counter, token, "the counter holds the token");
    assert!(conn.pttl::<_, i64>(&keys.fence).await.unwrap() > 0);
    released_by(conn, keys, "b", "rb").await;
    for (i, refused) in ["not a number", "9007199254740991"].into_iter().enumerate() {
        let _: () = conn.pset_ex(&keys.fence, refused, 60_000).await.unwrap();
        let err = hold_taken(conn, keys, &format!("r{i}")).await.unwrap_err();
        assert!(
            matches!(err, crate::Error::TokenOverflow { .. }) || err.is_wrong_type(),
            "{refused}: {err}"
        );
        let kept: String = conn.get(&keys.fence).await.unwrap();
        assert_eq!(kept, refused, "the refused counter is put back");
        assert!(conn.pttl::<_, i64>(&keys.fence).await.unwrap() > 0);
        let exists: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(!exists, "{refused}: no hold taken");
    }
}

hold_test! {
    async fn a_free_semaphores_counter_is_taken_as_a_locks(_server, conn, keys = sem_keys()) {
        a_free_holds_counter_is_taken_and_put_back_when_refused(&mut conn, &keys).await;
    }
}

hold_test! {
    async fn a_free_rwlocks_counter_is_taken_as_a_locks(_server, conn, keys = rw_keys()) {
        a_free_holds_counter_is_taken_and_put_back_when_refused(&mut conn, &keys).await;
    }
}
