//! The contract of `sem_release_many.lua` against a real redis-server: releases of holds of
//! one lock that share a call are each answered as `sem_release.lua` answers one alone (an
//! ended hold, an entry left, a replay, a holder that holds nothing), the releases of one
//! re-entered hold apply in order, waiters are woken as by releases alone, and a call with a
//! malformed list or foreign keys changes nothing.

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use super::batch::{hold_release_outcome, run_hold_releases, HoldRelease};
use super::semaphore::{rw_acquire, RwAcquireReply, RwMode};
#[cfg(fencelock_negative_controls)]
use super::tests::assert_controls_caught;
use super::tests::{
    assert_checks_hold, assert_nothing_left, for_each_hold_expiry, hold_field_expiry, Check, LEASE,
    OP_TTL,
};
use super::*;

fn rw_keys() -> LockKeys {
    LockKeys::rwlock(b"t:", b"ledger")
}

async fn take(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    mode: RwMode,
    wait: bool,
) -> RwAcquireReply {
    rw_acquire(
        conn,
        keys,
        holder,
        mode,
        LEASE,
        wait,
        OP_TTL,
        PubSub::Classic,
        hold_field_expiry(),
        None,
        false,
    )
    .await
    .unwrap()
}

async fn read(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
) -> Result<(), String> {
    match take(conn, keys, holder, RwMode::Read, false).await {
        RwAcquireReply::Acquired { .. } => Ok(()),
        other => Err(format!("{holder} did not read: {other:?}")),
    }
}

/// The releases `(holder, op id)` in one call, each answered.
async fn release_together(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    releases: &[(&str, &str)],
) -> Result<Vec<OwnerReply>, String> {
    let ops: Vec<HoldRelease> = releases
        .iter()
        .map(|(holder, op)| HoldRelease::new(keys, holder, op, OP_TTL, PubSub::Classic))
        .collect();
    let refs: Vec<&HoldRelease> = ops.iter().collect();
    let outcomes = run_hold_releases(conn, &refs)
        .await
        .map_err(|err| format!("the call failed: {err}"))?;
    outcomes
        .into_iter()
        .map(|o| o.and_then(hold_release_outcome).map_err(|e| e.to_string()))
        .collect()
}

/// A subscriber on the server `conn` talks to (a check gets only the connection).
async fn subscriber_of(conn: &mut MultiplexedConnection) -> redis::aio::PubSub {
    let (_, port): (String, u16) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query_async(conn)
        .await
        .unwrap();
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap()
}

const DONE: OwnerReply = OwnerReply::Done { remaining: 0 };

/// Releases in one call end their holds and leave the others'; a writer still waits for the
/// hold left and gets in once it is released; a re-sent release replays, and a holder with no
/// hold is told so, next to a release that ends one.
async fn grouped_releases_end_holds_as_releases_alone_do(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> Result<(), String> {
    for holder in ["a", "b", "c"] {
        read(conn, keys, holder).await?;
    }
    let ended = release_together(conn, keys, &[("a", "a:out"), ("b", "b:out")]).await?;
    if ended != [DONE, DONE] {
        return Err(format!("two releases: {ended:?}"));
    }
    let hash: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    if hash.contains_key("a") || hash.contains_key("b") || !hash.contains_key("c") {
        return Err(format!("the holds left: {hash:?}"));
    }
    if !hold_field_expiry() && hash.get("~used").map(String::as_str) != Some("1") {
        return Err(format!("~used after two of three left: {hash:?}"));
    }
    if !matches!(
        take(conn, keys, "w", RwMode::Write, false).await,
        RwAcquireReply::Busy { .. }
    ) {
        return Err("a writer while one reader holds".into());
    }
    let mixed = release_together(
        conn,
        keys,
        &[("a", "a:out"), ("c", "c:out"), ("x", "x:out")],
    )
    .await?;
    if mixed != [DONE, DONE, OwnerReply::NotHeld] {
        return Err(format!("a replay, the last release, a stranger: {mixed:?}"));
    }
    assert_nothing_left(conn, keys).await;
    match take(conn, keys, "w", RwMode::Write, false).await {
        RwAcquireReply::Acquired { .. } => Ok(()),
        other => Err(format!("a writer once every reader left: {other:?}")),
    }
}

/// Two releases of one hold entered twice, in one call, apply in order: the first leaves an
/// entry, the second ends the hold.
async fn releases_of_one_reentered_hold_apply_in_order(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> Result<(), String> {
    read(conn, keys, "h").await?;
    match reenter(conn, keys, "h", "h:in", OP_TTL).await.unwrap() {
        EnterReply::Entered { count: 2, .. } => {}
        other => return Err(format!("a re-entry: {other:?}")),
    }
    let replies = release_together(conn, keys, &[("h", "h:out1"), ("h", "h:out2")]).await?;
    if replies != [OwnerReply::Done { remaining: 1 }, DONE] {
        return Err(format!("two releases of one re-entered hold: {replies:?}"));
    }
    assert_nothing_left(conn, keys).await;
    Ok(())
}

/// Releases that end every hold wake the waiting writer and readers (both channels); with
/// holds left on the lease-zset path they publish nothing, as releases alone.
async fn grouped_releases_wake_waiters_as_releases_alone_do(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> Result<(), String> {
    let writers = keys.rw_writers().unwrap();
    for holder in ["a", "b", "c"] {
        read(conn, keys, holder).await?;
    }
    if !matches!(
        take(conn, keys, "w", RwMode::Write, true).await,
        RwAcquireReply::Busy { .. }
    ) {
        return Err("a writer while readers hold".into());
    }
    let mut sub = subscriber_of(conn).await;
    sub.subscribe(&keys.lock).await.unwrap();
    sub.subscribe(&writers).await.unwrap();
    release_together(conn, keys, &[("a", "a:out"), ("b", "b:out")]).await?;
    let _: () = conn.publish(&writers, "probe").await.unwrap();
    let mut expected = if hold_field_expiry() {
        vec!["released", "released", "probe"]
    } else {
        vec!["probe"]
    };
    release_together(conn, keys, &[("c", "c:out")]).await?;
    expected.extend(["released", "released"]);
    let mut messages = sub.on_message();
    let mut received = Vec::new();
    while received.len() < expected.len() {
        let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(2), messages.next()).await
        else {
            return Err(format!("messages {received:?}, expected {expected:?}"));
        };
        received.push(message.get_payload::<String>().unwrap());
    }
    if received != expected {
        return Err(format!("messages {received:?}, expected {expected:?}"));
    }
    Ok(())
}

/// The checks above, by name; each is also the check of one negative control (the first of
/// none of its own).
const CHECKS: [(&str, Check); 3] = [
    ("grouped_releases_end_holds_as_releases_alone_do", |c, k| {
        Box::pin(grouped_releases_end_holds_as_releases_alone_do(c, k))
    }),
    ("releases_of_one_reentered_hold_apply_in_order", |c, k| {
        Box::pin(releases_of_one_reentered_hold_apply_in_order(c, k))
    }),
    (
        "grouped_releases_wake_waiters_as_releases_alone_do",
        |c, k| Box::pin(grouped_releases_wake_waiters_as_releases_alone_do(c, k)),
    ),
];

#[tokio::test]
async fn the_grouped_release_checks_hold() {
    for_each_hold_expiry("the_grouped_release_checks_hold", async || {
        assert_checks_hold(&CHECKS, rw_keys).await;
    })
    .await;
}

#[cfg(fencelock_negative_controls)]
#[tokio::test]
async fn the_grouped_release_negative_controls_are_caught() {
    use super::controls::Control;
    let controls = [
        Control::SemGroupedReleaseIgnoresEntries,
        Control::SemGroupedReleaseDoesNotPublish,
    ];
    assert_controls_caught(&controls, &CHECKS[1..], rw_keys).await;
}

/// A semaphore's holds (no waiting writers' key) release together too.
#[tokio::test]
async fn a_semaphores_holds_release_together() {
    let (_server, mut conn, _lock) = super::tests::setup().await;
    let keys = LockKeys::semaphore(b"t:", b"pool");
    for holder in ["a", "b"] {
        let reply = semaphore::sem_acquire(
            &mut conn,
            &keys,
            holder,
            1,
            3,
            LEASE,
            OP_TTL,
            PubSub::Classic,
            None,
            hold_field_expiry(),
            None,
            false,
        )
        .await
        .unwrap();
        assert!(
            matches!(reply, semaphore::SemAcquireReply::Acquired { .. }),
            "{reply:?}"
        );
    }
    let replies = release_together(&mut conn, &keys, &[("a", "a:out"), ("b", "b:out")])
        .await
        .unwrap();
    assert_eq!(replies, [DONE, DONE]);
    assert_nothing_left(&mut conn, &keys).await;
}

/// An op id given twice in one call (a release re-sent while its first send waits in the same
/// call) is answered as its first: the hold ends once.
#[tokio::test]
async fn an_op_id_given_twice_is_answered_as_its_first() {
    let (_server, mut conn, _lock) = super::tests::setup().await;
    let keys = rw_keys();
    read(&mut conn, &keys, "a").await.unwrap();
    read(&mut conn, &keys, "b").await.unwrap();
    let replies = release_together(&mut conn, &keys, &[("a", "op"), ("b", "op-b"), ("a", "op")])
        .await
        .unwrap();
    assert_eq!(replies, [DONE, DONE, DONE]);
    assert_nothing_left(&mut conn, &keys).await;
}

/// A malformed list of releases, and a call whose lock key holds foreign data, are refused as
/// a whole, and nothing is written.
#[tokio::test]
async fn a_refused_release_call_writes_nothing() {
    let (_server, mut conn, _lock) = super::tests::setup().await;
    let keys = rw_keys();
    read(&mut conn, &keys, "a").await.unwrap();
    // Two releases announced, one given.
    let err = scripts()
        .sem_release_many
        .key(&keys.lock)
        .key(keys.sem_leases())
        .key(keys.rw_writers().unwrap())
        .key(keys.op("op"))
        .key(keys.op("a"))
        .arg(2)
        .arg(10_000)
        .arg("classic")
        .arg(3)
        .arg("a")
        .arg("op")
        .invoke_async::<redis::Value>(&mut conn)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("FENCELOCK_BADARG"), "{err}");
    let still: bool = conn.hexists(&keys.lock, "a").await.unwrap();
    assert!(still, "the hold is untouched");
    let _: () = conn
        .del(&[keys.lock.clone(), keys.sem_leases()])
        .await
        .unwrap();
    let _: () = conn.set(&keys.lock, "foreign").await.unwrap();
    let err = release_together(&mut conn, &keys, &[("a", "op1"), ("b", "op2")])
        .await
        .unwrap_err();
    assert!(
        err.contains("WRONGTYPE") || err.contains("foreign"),
        "{err}"
    );
    let value: String = conn.get(&keys.lock).await.unwrap();
    assert_eq!(value, "foreign");
    let written: usize = conn
        .exists(&[keys.op("a"), keys.op("b"), keys.op("op1"), keys.op("op2")])
        .await
        .unwrap();
    assert_eq!(written, 0);
}
