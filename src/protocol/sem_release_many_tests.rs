//! The contract of `sem_release_many.lua` against a real redis-server: releases of holds of
//! one lock that share a call are each answered as `sem_release.lua` answers one alone (an
//! ended hold, an entry left, a replay, a holder that holds nothing), the releases of one
//! re-entered hold apply in order, waiters are woken as by releases alone, and a call with a
//! malformed list or foreign keys changes nothing.

use std::time::Duration;

use futures_util::StreamExt;
use redis::AsyncCommands;

use super::batch::{hold_release_outcome, Grouped, HoldRelease};
use super::contract_tests::{
    assert_deadline, assert_keys_expire, assert_nothing_left, assert_raised_wrongtype, assert_used,
    contract_checks, deadline_of, grouped_keys, hold_field_expiry, hold_test, refused_as_called,
    run_together, rw_keys, rw_take, sem_keys, sem_take, setup_for, Checked, Conn, Fields, LEASE,
    OP_TTL,
};
use super::rwlock::{RwAcquireReply, RwMode};
use super::*;

async fn take(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    mode: RwMode,
    wait: bool,
) -> RwAcquireReply {
    rw_take(conn, keys, holder, mode, LEASE, wait).await
}

async fn read(conn: &mut Conn, keys: &LockKeys, holder: &str) -> Checked {
    match take(conn, keys, holder, RwMode::Read, false).await {
        RwAcquireReply::Acquired { .. } => Ok(()),
        other => Err(format!("{holder} did not read: {other:?}")),
    }
}

/// The releases `(holder, op id)` in one call, each answered.
async fn release_together(
    conn: &mut Conn,
    keys: &LockKeys,
    releases: &[(&str, &str)],
) -> Result<Vec<OwnerReply>, String> {
    let ops: Vec<HoldRelease> = releases
        .iter()
        .map(|(holder, op)| HoldRelease::new(keys, holder, op, OP_TTL, PubSub::Classic, true))
        .collect();
    run_together(conn, &ops, hold_release_outcome).await
}

/// A subscriber on the server `conn` talks to (a check gets only the connection).
async fn subscriber_of(conn: &mut Conn) -> redis::aio::PubSub {
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
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
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

/// A release alone (`sem_release.lua`) that leaves other holds ends its own only: its field
/// goes and its permits come back, the other hold stays; the last release deletes the keys.
async fn a_release_alone_that_leaves_holds_ends_only_its_own(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    for holder in ["a", "b"] {
        read(conn, keys, holder).await?;
    }
    let release_alone = async |conn: &mut Conn, holder: &str| {
        let op = format!("{holder}:out");
        let release = HoldRelease::new(keys, holder, &op, OP_TTL, PubSub::Classic, true);
        let reply = release.run_alone(conn).await.map_err(|e| e.to_string())?;
        hold_release_outcome(reply).map_err(|e| e.to_string())
    };
    let ended = release_alone(conn, "a").await?;
    if ended != DONE {
        return Err(format!("the release of one of two holds: {ended:?}"));
    }
    let hash: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    if hash.contains_key("a") || !hash.contains_key("b") {
        return Err(format!("the holds left: {hash:?}"));
    }
    if !hold_field_expiry() && hash.get("~used").map(String::as_str) != Some("1") {
        return Err(format!("~used after one of two left: {hash:?}"));
    }
    let last = release_alone(conn, "b").await?;
    if last != DONE {
        return Err(format!("the last release: {last:?}"));
    }
    assert_nothing_left(conn, keys).await;
    Ok(())
}

/// Two releases of one hold entered twice, in one call, apply in order: the first leaves an
/// entry, the second ends the hold.
async fn releases_of_one_reentered_hold_apply_in_order(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
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
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
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

contract_checks! {
    /// Each grouped-release control is caught by the check that names it (the first check
    /// has no control of its own).
    the_grouped_release_checks_hold,
    the_grouped_release_negative_controls_are_caught,
    rw_keys, per_hold_expiry;
    a_release_alone_that_leaves_holds_ends_only_its_own => [Control::SemReleaseSkipsItsDrop],
    grouped_releases_end_holds_as_releases_alone_do => [Control::SemReleaseSkipsItsDrop],
    releases_of_one_reentered_hold_apply_in_order => [Control::SemGroupedReleaseIgnoresEntries],
    grouped_releases_wake_waiters_as_releases_alone_do =>
        [Control::SemGroupedReleaseDoesNotPublish],
}

/// A semaphore's holds (no waiting writers' key) release together too.
#[tokio::test]
async fn a_semaphores_holds_release_together() {
    let (_server, mut conn, keys) = setup_for(sem_keys()).await;
    for holder in ["a", "b"] {
        hold(&mut conn, &keys, holder).await;
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
    let (_server, mut conn, keys) = setup_for(rw_keys()).await;
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
    let (_server, mut conn, keys) = setup_for(rw_keys()).await;
    read(&mut conn, &keys, "a").await.unwrap();
    // Two releases announced, one given.
    let err = refused_as_called(
        &mut conn,
        &scripts().sem_release_many,
        &grouped_keys(&keys, [keys.op("op"), keys.op("a")]),
        &["2", "10000", "classic", "3", "a", "op"],
    )
    .await;
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

/// Declares the two tests of `scenario`: on a semaphore's holds and on a read-write lock's
/// reads, each once per way of keeping hold deadlines the server has.
macro_rules! on_both_kinds {
    ($scenario:ident => $in_a_semaphore:ident, $in_a_rwlock:ident) => {
        hold_test! {
            #[doc = concat!("[`", stringify!($scenario), "`] for a semaphore's holds.")]
            async fn $in_a_semaphore(_server, conn, keys = sem_keys()) {
                $scenario(&mut conn, &keys).await;
            }
        }

        hold_test! {
            #[doc = concat!("[`", stringify!($scenario), "`] for a read-write lock's reads.")]
            async fn $in_a_rwlock(_server, conn, keys = rw_keys()) {
                $scenario(&mut conn, &keys).await;
            }
        }
    };
}

/// A hold of `holder` on `keys`: one permit of a semaphore of three, or a read of a read-write
/// lock.
async fn hold(conn: &mut Conn, keys: &LockKeys, holder: &str) {
    if keys.rw_writers().is_some() {
        return read(conn, keys, holder).await.unwrap();
    }
    let reply = sem_take(conn, keys, holder, (1, 3), LEASE, None, false)
        .await
        .unwrap();
    assert!(
        matches!(reply, semaphore::SemAcquireReply::Acquired { .. }),
        "{holder} takes a permit: {reply:?}"
    );
}

/// A subscriber to the lock's channels: its hash's, and a read-write lock's waiting writers'.
async fn subscribed(conn: &mut Conn, keys: &LockKeys) -> redis::aio::PubSub {
    let mut sub = subscriber_of(conn).await;
    sub.subscribe(&keys.lock).await.unwrap();
    if let Some(writers) = keys.rw_writers() {
        sub.subscribe(&writers).await.unwrap();
    }
    sub
}

/// What `sub` received as (channel, payload), up to a probe published now on the hash's
/// channel: everything published before it.
async fn messages_before_probe(
    conn: &mut Conn,
    sub: &mut redis::aio::PubSub,
    keys: &LockKeys,
) -> Vec<(String, String)> {
    let _: () = conn.publish(&keys.lock, "probe").await.unwrap();
    let mut messages = sub.on_message();
    let mut received = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(2), messages.next())
            .await
            .expect("the probe arrives")
            .expect("the subscription is open");
        let payload: String = message.get_payload().unwrap();
        if payload == "probe" {
            return received;
        }
        received.push((message.get_channel_name().to_owned(), payload));
    }
}

/// The wake-up of a release that freed permits (`sem_release.lua`): "released" on the hash's
/// channel, and on a read-write lock's waiting writers' channel; none from a read-write lock's
/// release that leaves holds on the lease-zset path.
fn wake_up(keys: &LockKeys, holds_left: bool) -> Vec<(String, String)> {
    let channel = |key: Vec<u8>| (String::from_utf8(key).unwrap(), "released".to_owned());
    match keys.rw_writers() {
        None => vec![channel(keys.lock.clone())],
        Some(_) if holds_left && !hold_field_expiry() => vec![],
        Some(writers) => vec![channel(keys.lock.clone()), channel(writers)],
    }
}

/// Asserts that the `send` ("first" or "re-sent") of a call published what its releases alone
/// publish the first time, and nothing re-sent.
async fn assert_published_as_alone(
    conn: &mut Conn,
    sub: &mut redis::aio::PubSub,
    keys: &LockKeys,
    send: &str,
) {
    let expected = match send {
        "first" => wake_up(keys, true),
        _ => vec![],
    };
    assert_eq!(
        messages_before_probe(conn, sub, keys).await,
        expected,
        "{send}: what was published"
    );
}

/// No release of the call can raise on a key of its own: the releases' records are read with
/// one `MGET`, which reads a key of another type as absent, where `sem_release.lua` alone,
/// when it reads the op record, raises `WRONGTYPE` at its `GET` and changes nothing (DESIGN section 7.3;
/// this script's header does not say so). So a release whose op record key holds a hash is
/// answered as a release with no record: it ends its hold, and the foreign value is left as
/// it was (a release that ends a hold writes only its holder's mark). The other release of
/// the call applies once, the third hold is untouched, what is published is what the
/// releases alone publish, and the same call re-sent replays both from their marks.
async fn a_foreign_record_reads_as_absent(conn: &mut Conn, keys: &LockKeys) {
    for holder in ["a", "b", "c"] {
        hold(conn, keys, holder).await;
    }
    let _: () = conn.hset(keys.op("b:out"), "f", "foreign").await.unwrap();
    let foreign = Fields::from([("f".to_owned(), "foreign".to_owned())]);
    let before: Fields = conn.hgetall(&keys.lock).await.unwrap();

    // A send that reads its record (a re-send, or a re-entered hold's release).
    let alone = release(conn, keys, "b", "b:out", OP_TTL, PubSub::Classic, true).await;
    assert_raised_wrongtype(&alone);
    let after_alone: Fields = conn.hgetall(&keys.lock).await.unwrap();
    assert_eq!(after_alone, before, "the release alone changed the holds");
    let marked: usize = conn.exists(keys.op("b")).await.unwrap();
    assert_eq!(marked, 0, "the release alone marked its holder's record");

    let mut sub = subscribed(conn, keys).await;
    let group = [("a", "a:out"), ("b", "b:out")];
    for send in ["first", "re-sent"] {
        let replies = release_together(conn, keys, &group).await.unwrap();
        assert_eq!(replies, [DONE, DONE], "{send}");
        let hash: Fields = conn.hgetall(&keys.lock).await.unwrap();
        assert!(
            !hash.contains_key("a") && !hash.contains_key("b"),
            "{send}: {hash:?}"
        );
        assert_eq!(hash.get("c"), before.get("c"), "{send}: c's hold");
        assert_used(&hash, "1", send);
        let record: Fields = conn.hgetall(keys.op("b:out")).await.unwrap();
        assert_eq!(record, foreign, "{send}: the foreign value");
        let marks: Vec<Option<String>> = conn.mget(&[keys.op("a"), keys.op("b")]).await.unwrap();
        assert_eq!(
            marks,
            [Some("r:a:out".to_owned()), Some("r:b:out".to_owned())],
            "{send}: the holders' marks"
        );
        assert_keys_expire(conn, keys).await;
        assert_published_as_alone(conn, &mut sub, keys, send).await;
    }
}

on_both_kinds!(a_foreign_record_reads_as_absent =>
    a_release_whose_record_key_holds_another_type_reads_it_as_absent_in_a_semaphore,
    a_release_whose_record_key_holds_another_type_reads_it_as_absent_in_a_rwlock);

/// In one call, A's inner release of its re-entered hold leaves A one entry (its field, token
/// and deadline kept, its entries field gone) while B's release of its only entry ends B's
/// hold, and C's hold is untouched: the keys keep their expiry, and what is published is what
/// the two releases alone publish (B's freed permit wakes a semaphore's waiters; a read-write
/// lock's reader release that leaves holds wakes nobody on the lease-zset path, and both
/// channels with field expiry). Re-sent, the call replays both replies from their records,
/// takes no entry twice and publishes nothing.
async fn an_inner_and_a_final_release(conn: &mut Conn, keys: &LockKeys) {
    for holder in ["A", "B", "C"] {
        hold(conn, keys, holder).await;
    }
    match reenter(conn, keys, "A", "A:in", OP_TTL).await.unwrap() {
        EnterReply::Entered { count: 2, .. } => {}
        other => panic!("A enters its hold again: {other:?}"),
    }
    let before: Fields = conn.hgetall(&keys.lock).await.unwrap();
    assert_eq!(before.get("~entries:A").map(String::as_str), Some("2"));
    let (a_until, c_until) = (
        deadline_of(conn, keys, "A").await,
        deadline_of(conn, keys, "C").await,
    );

    let mut sub = subscribed(conn, keys).await;
    let group = [("A", "A:out1"), ("B", "B:out")];
    for send in ["first", "re-sent"] {
        let replies = release_together(conn, keys, &group).await.unwrap();
        assert_eq!(
            replies,
            [OwnerReply::Done { remaining: 1 }, DONE],
            "{send}: A's inner release, B's final one"
        );
        let hash: Fields = conn.hgetall(&keys.lock).await.unwrap();
        assert_eq!(hash.get("A"), before.get("A"), "{send}: A's hold: {hash:?}");
        assert!(
            !hash.contains_key("~entries:A"),
            "{send}: A's entries: {hash:?}"
        );
        assert!(
            !hash.contains_key("B") && !hash.contains_key("~entries:B"),
            "{send}: B's hold: {hash:?}"
        );
        assert_eq!(hash.get("C"), before.get("C"), "{send}: C's hold: {hash:?}");
        assert_used(&hash, "2", send);
        assert_deadline(conn, keys, "A", a_until, send).await;
        assert_deadline(conn, keys, "C", c_until, send).await;
        assert_eq!(deadline_of(conn, keys, "B").await, -2, "{send}: B's lease");
        assert_keys_expire(conn, keys).await;
        let records: Vec<Option<String>> = conn
            .mget(&[keys.op("A:out1"), keys.op("B:out"), keys.op("B")])
            .await
            .unwrap();
        assert_eq!(
            records,
            [Some("1".to_owned()), None, Some("r:B:out".to_owned())],
            "{send}: the inner release's record, the final release's mark"
        );
        assert_published_as_alone(conn, &mut sub, keys, send).await;
    }
}

on_both_kinds!(an_inner_and_a_final_release =>
    an_inner_release_and_a_final_release_share_a_call_in_a_semaphore,
    an_inner_release_and_a_final_release_share_a_call_in_a_rwlock);
