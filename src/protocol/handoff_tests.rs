//! The contract of `handoff.lua` against a real redis-server: a release that frees the lock
//! grants it to the candidate with a greater token and publishes nothing, unless another
//! client listens on the channel or the candidate was cancelled (then it frees and publishes,
//! as `release.lua` does); entries left hand nothing on; a re-sent copy replays the grant,
//! and either release script replays the other's release.

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSub as PubSubConn;
use redis::AsyncCommands;

use super::contract_tests::{
    cancelled_by, contract_checks, lock_keys, released_by, Checked, Conn, LEASE, OP_TTL,
};
use super::*;

fn candidate(holder: &str) -> Candidate<'_> {
    Candidate {
        holder,
        lease: Duration::from_secs(20),
        label: Some("order:7"),
        permits: 1,
    }
}

/// A client subscribed to the lock's release channel, on a connection of its own.
pub(super) async fn listener(conn: &mut Conn, keys: &LockKeys) -> PubSubConn {
    let port: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query_async(conn)
        .await
        .unwrap();
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", port[1])).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe(&keys.lock).await.unwrap();
    pubsub
}

/// Whether a message arrives on `pubsub` within a moment.
pub(super) async fn published(pubsub: &mut PubSubConn) -> bool {
    let mut messages = pubsub.on_message();
    tokio::time::timeout(Duration::from_millis(200), messages.next())
        .await
        .is_ok()
}

async fn hand_off(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    op: &str,
    to: &str,
) -> Result<HandoffReply, String> {
    release_handing_off(
        conn,
        keys,
        holder,
        op,
        OP_TTL,
        PubSub::Classic,
        candidate(to),
    )
    .await
    .map_err(|e| e.to_string())
}

async fn token_of(conn: &mut Conn, keys: &LockKeys) -> Result<u64, String> {
    match acquire(conn, keys, "probe", LEASE, OP_TTL).await {
        Ok(AcquireReply::Held { .. }) => {}
        other => return Err(format!("the lock should be held: {other:?}")),
    }
    let token: Option<u64> = conn.hget(&keys.lock, "~token").await.unwrap();
    token.ok_or_else(|| "no token".to_owned())
}

/// With one listener (the releasing client's own subscription), the freeing release grants
/// the lock to the candidate: count 1, a greater token, its label and lease, no message; the
/// releaser's record carries the release's mark.
async fn grants_the_freed_lock_to_the_candidate(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let mut own = listener(conn, keys).await;
    let AcquireReply::Acquired { token: first, .. } =
        acquire(conn, keys, "h1", LEASE, OP_TTL).await.unwrap()
    else {
        return Err("the first acquisition failed".into());
    };
    let reply = hand_off(conn, keys, "h1", "op1", "h2").await?;
    let HandoffReply::HandedOff { token, .. } = reply else {
        return Err(format!("not handed off: {reply:?}"));
    };
    if token <= first || token_of(conn, keys).await? != token.get() {
        return Err(format!("token {token:?} after {first:?}"));
    }
    let fields: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    if fields.get("h2").map(String::as_str) != Some("1")
        || fields.contains_key("h1")
        || fields.get("~label").map(String::as_str) != Some("order:7")
    {
        return Err(format!("the hash after the handoff: {fields:?}"));
    }
    let pttl: i64 = conn.pttl(&keys.lock).await.unwrap();
    if !(10_000..=20_000).contains(&pttl) {
        return Err(format!("the candidate's lease is not set: {pttl} ms"));
    }
    let mark: Option<String> = conn.get(keys.op("h1")).await.unwrap();
    if mark.as_deref() != Some("r:op1") {
        return Err(format!("the releaser's record is {mark:?}"));
    }
    if published(&mut own).await {
        return Err("a handoff published a release".into());
    }
    Ok(())
}

/// While another client listens on the channel, the freeing release frees the lock and
/// publishes: the clients race, and this client's waiters pass nobody over.
async fn another_listening_client_gets_a_release(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let _own = listener(conn, keys).await;
    let mut other = listener(conn, keys).await;
    acquire(conn, keys, "h1", LEASE, OP_TTL).await.unwrap();
    let reply = hand_off(conn, keys, "h1", "op1", "h2").await?;
    if reply != (HandoffReply::Released { remaining: 0 }) {
        return Err(format!("handed on past another client: {reply:?}"));
    }
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    if exists || !published(&mut other).await {
        return Err("the lock was not freed and published".into());
    }
    Ok(())
}

/// A candidate whose acquisition was cancelled first (`cancel.lua` marked it) is never
/// granted: the lock is freed and published.
async fn a_cancelled_candidate_is_never_granted(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let mut own = listener(conn, keys).await;
    acquire(conn, keys, "h1", LEASE, OP_TTL).await.unwrap();
    cancelled_by(conn, keys, "h2", "h2", CancelKind::Acquire).await;
    let reply = hand_off(conn, keys, "h1", "op1", "h2").await?;
    if reply != (HandoffReply::Released { remaining: 0 }) {
        return Err(format!("a cancelled candidate got the lock: {reply:?}"));
    }
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    if exists || !published(&mut own).await {
        return Err("the lock was not freed and published".into());
    }
    Ok(())
}

/// A re-sent copy of a handing-off release replays the grant while the candidate holds the
/// lock, and `release.lua` replays it as a release; once the candidate's hold ended, the copy
/// answers a plain release. A release with entries left hands nothing on.
async fn copies_replay_and_entries_left_hand_nothing_on(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    acquire(conn, keys, "h1", LEASE, OP_TTL).await.unwrap();
    reenter(conn, keys, "h1", "in1", OP_TTL).await.unwrap();
    let reply = hand_off(conn, keys, "h1", "out1", "h2").await?;
    if reply != (HandoffReply::Released { remaining: 1 }) {
        return Err(format!("an inner release: {reply:?}"));
    }
    let HandoffReply::HandedOff { token, .. } = hand_off(conn, keys, "h1", "op1", "h2").await?
    else {
        return Err("the outer release did not hand off".into());
    };
    let again = hand_off(conn, keys, "h1", "op1", "h2").await?;
    if again != (HandoffReply::HandedOff { token, room: None }) {
        return Err(format!("a re-sent copy answered {again:?}"));
    }
    let plain = released_by(conn, keys, "h1", "op1").await;
    if plain != (OwnerReply::Done { remaining: 0 }) {
        return Err(format!("release.lua replayed {plain:?}"));
    }
    // A late copy of the releaser's acquisition finds the mark; the candidate's replays.
    let late = acquire_labelled(conn, keys, "h1", LEASE, OP_TTL, None, true)
        .await
        .unwrap();
    if late != AcquireReply::Cancelled {
        return Err(format!(
            "a late copy of the releaser's acquisition: {late:?}"
        ));
    }
    let replay = acquire_labelled(conn, keys, "h2", LEASE, OP_TTL, None, true)
        .await
        .unwrap();
    if replay != (AcquireReply::Acquired { token, count: 1 }) {
        return Err(format!("the candidate's own attempt: {replay:?}"));
    }
    released_by(conn, keys, "h2", "op2").await;
    let after = hand_off(conn, keys, "h1", "op1", "h2").await?;
    if after != (HandoffReply::Released { remaining: 0 }) {
        return Err(format!("a copy after the grant ended: {after:?}"));
    }
    if hand_off(conn, keys, "h9", "op9", "h2").await? != HandoffReply::NotHeld {
        return Err("a non-holder's release was taken".into());
    }
    Ok(())
}

contract_checks! {
    /// Each handoff control is caught by its check: a grant past another listening client,
    /// and a grant to a cancelled candidate.
    the_handoff_keeps_its_contract, the_handoff_checks_catch_their_controls, lock_keys;
    grants_the_freed_lock_to_the_candidate => [],
    another_listening_client_gets_a_release => [Control::HandoffIgnoresOtherClients],
    a_cancelled_candidate_is_never_granted => [Control::HandoffIgnoresCancel],
    copies_replay_and_entries_left_hand_nothing_on => [],
}

/// A key of another type is refused before anything is written.
#[tokio::test]
async fn a_wrong_type_lock_key_is_refused_and_left_alone() {
    let (_server, mut conn, keys) = super::contract_tests::setup().await;
    let _: () = conn.set(&keys.lock, "x").await.unwrap();
    let err = hand_off(&mut conn, &keys, "h1", "op1", "h2")
        .await
        .unwrap_err();
    assert!(err.contains("not a fencelock hash"), "{err}");
    let value: String = conn.get(&keys.lock).await.unwrap();
    assert_eq!(value, "x");
    let written: bool = conn.exists(keys.op("h1")).await.unwrap();
    assert!(!written);
}
