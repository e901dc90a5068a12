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
    assert_nothing_left, cancelled_by, contract_checks, lock_keys, released_by, setup_for, Checked,
    Conn, LEASE, OP_TTL,
};
use super::sem_handoff_tests;
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
    let candidate = candidate(to);
    release_handing_off(conn, keys, holder, op, OP_TTL, PubSub::Classic, candidate)
        .await
        .map_err(|e| e.to_string())
}

/// The hold a handing-off release ends: the lock's, or a semaphore hold of 2 of its 3 permits
/// (`sem_handoff_tests.rs`). The scenarios both share take it first.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    Lock,
    Permits,
}

impl Hold {
    /// `holder` takes the hold; its token.
    async fn take(
        self,
        conn: &mut Conn,
        keys: &LockKeys,
        holder: &str,
    ) -> Result<FencingToken, String> {
        match self {
            Hold::Lock => match acquire(conn, keys, holder, LEASE, OP_TTL).await.unwrap() {
                AcquireReply::Acquired { token, .. } => Ok(token),
                other => Err(format!(
                    "{holder}'s acquisition of the free lock: {other:?}"
                )),
            },
            Hold::Permits => sem_handoff_tests::take(conn, keys, holder, 2, false).await,
        }
    }

    /// `holder`'s release by `op`, offering `to` what the hold had (the lock, or its 2 permits).
    async fn hand_off(
        self,
        conn: &mut Conn,
        keys: &LockKeys,
        (holder, op): (&str, &str),
        to: &str,
    ) -> Result<HandoffReply, String> {
        match self {
            Hold::Lock => hand_off(conn, keys, holder, op, to).await,
            Hold::Permits => sem_handoff_tests::hand_off(conn, keys, holder, op, to, 2).await,
        }
    }

    /// Checks that nothing is held any more: the lock's hash is gone (`Err` if not), or nothing
    /// of the semaphore is left (asserted).
    async fn nothing_held(self, conn: &mut Conn, keys: &LockKeys) -> Checked {
        match self {
            Hold::Lock => {
                let exists: bool = conn.exists(&keys.lock).await.unwrap();
                match exists {
                    true => Err("the lock was not freed".into()),
                    false => Ok(()),
                }
            }
            Hold::Permits => {
                assert_nothing_left(conn, keys).await;
                Ok(())
            }
        }
    }

    /// Checks the candidate's own recorded attempt, after its grant of `token`: it replays the
    /// grant. For the lock, a late copy of the releaser's own acquisition first finds the
    /// releaser's mark.
    async fn candidate_replays(
        self,
        conn: &mut Conn,
        keys: &LockKeys,
        token: FencingToken,
    ) -> Checked {
        if self == Hold::Permits {
            let replay = sem_handoff_tests::take(conn, keys, "h2", 2, true).await?;
            return match replay == token {
                true => Ok(()),
                false => Err(format!(
                    "the candidate's own attempt: {replay:?}, not {token:?}"
                )),
            };
        }
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
        // A replay of the grant: the lease left is the grant's, not a new one.
        let replayed = |left: Duration| left <= LEASE;
        match replay {
            AcquireReply::Acquired {
                token: t,
                count: 1,
                lease_left: Some(left),
            } if t == token && replayed(left) => Ok(()),
            _ => Err(format!("the candidate's own attempt: {replay:?}")),
        }
    }
}

/// Checks that the releaser's record carries the release `op1`'s mark and that no release was
/// published on `own`, the releasing client's subscription: what a grant leaves.
pub(super) async fn marked_and_not_published(
    conn: &mut Conn,
    keys: &LockKeys,
    own: &mut PubSubConn,
) -> Checked {
    let mark: Option<String> = conn.get(keys.op("h1")).await.unwrap();
    if mark.as_deref() != Some("r:op1") {
        return Err(format!("the releaser's record is {mark:?}"));
    }
    if published(own).await {
        return Err("a handoff published a release".into());
    }
    Ok(())
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
    marked_and_not_published(conn, keys, &mut own).await
}

/// While another client listens on the channel, the release that ends the hold frees what it
/// held and publishes: the clients race, and this client's waiters pass nobody over.
pub(super) async fn another_listening_client_gets_a_release(
    hold: Hold,
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    let _own = listener(conn, keys).await;
    let mut other = listener(conn, keys).await;
    hold.take(conn, keys, "h1").await?;
    freed_and_published(
        hold,
        conn,
        keys,
        &mut other,
        "handed on past another client",
    )
    .await
}

/// A candidate whose acquisition was cancelled first (`cancel.lua` or `sem_cancel.lua` marked
/// it) is never granted: what the hold had is freed and the release is published.
pub(super) async fn a_cancelled_candidate_is_never_granted(
    hold: Hold,
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    let mut own = listener(conn, keys).await;
    hold.take(conn, keys, "h1").await?;
    cancelled_by(conn, keys, "h2", "h2", CancelKind::Acquire).await;
    freed_and_published(
        hold,
        conn,
        keys,
        &mut own,
        "a cancelled candidate was granted",
    )
    .await
}

/// Checks that `h1`'s release `op1`, offering `h2`, is a plain one: it frees the hold, `heard`
/// hears it, and nothing is held after it. `granted` says what a grant would have broken.
async fn freed_and_published(
    hold: Hold,
    conn: &mut Conn,
    keys: &LockKeys,
    heard: &mut PubSubConn,
    granted: &str,
) -> Checked {
    let reply = hold.hand_off(conn, keys, ("h1", "op1"), "h2").await?;
    if reply != (HandoffReply::Released { remaining: 0 }) {
        return Err(format!("{granted}: {reply:?}"));
    }
    if !published(heard).await {
        return Err("the release was not published".into());
    }
    hold.nothing_held(conn, keys).await
}

/// A re-sent copy of a handing-off release replays the grant while the candidate holds, and
/// the plain release script replays it as a release; once the candidate's hold ended, the copy
/// answers a plain release. A release with entries left hands nothing on; a non-holder's is
/// refused, and nothing stays behind.
pub(super) async fn copies_replay_and_entries_left_hand_nothing_on(
    hold: Hold,
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    hold.take(conn, keys, "h1").await?;
    reenter(conn, keys, "h1", "in1", OP_TTL).await.unwrap();
    let reply = hold.hand_off(conn, keys, ("h1", "out1"), "h2").await?;
    if reply != (HandoffReply::Released { remaining: 1 }) {
        return Err(format!("an inner release: {reply:?}"));
    }
    let granted = hold.hand_off(conn, keys, ("h1", "op1"), "h2").await?;
    let HandoffReply::HandedOff { token, room } = granted else {
        return Err(format!("the outer release did not hand off: {granted:?}"));
    };
    if hold == Hold::Lock && room.is_some() {
        return Err(format!("a lock's grant counted permits: {granted:?}"));
    }
    let again = hold.hand_off(conn, keys, ("h1", "op1"), "h2").await?;
    if again != granted {
        return Err(format!(
            "a re-sent copy answered {again:?}, not {granted:?}"
        ));
    }
    let plain = released_by(conn, keys, "h1", "op1").await;
    if plain != (OwnerReply::Done { remaining: 0 }) {
        return Err(format!("the plain release replayed {plain:?}"));
    }
    hold.candidate_replays(conn, keys, token).await?;
    released_by(conn, keys, "h2", "op2").await;
    let after = hold.hand_off(conn, keys, ("h1", "op1"), "h2").await?;
    if after != (HandoffReply::Released { remaining: 0 }) {
        return Err(format!("a copy after the grant ended: {after:?}"));
    }
    if hold.hand_off(conn, keys, ("h9", "op9"), "h2").await? != HandoffReply::NotHeld {
        return Err("a non-holder's release was taken".into());
    }
    hold.nothing_held(conn, keys).await
}

contract_checks! {
    /// Each handoff control is caught by its check: a grant past another listening client,
    /// and a grant to a cancelled candidate.
    the_handoff_keeps_its_contract, the_handoff_checks_catch_their_controls, lock_keys;
    grants_the_freed_lock_to_the_candidate => [],
    another_listening_client_gets_a_release(Hold::Lock) => [Control::HandoffIgnoresOtherClients],
    a_cancelled_candidate_is_never_granted(Hold::Lock) => [Control::HandoffIgnoresCancel],
    copies_replay_and_entries_left_hand_nothing_on(Hold::Lock) => [],
}

/// A key of another type is refused before anything is written.
#[tokio::test]
async fn a_wrong_type_lock_key_is_refused_and_left_alone() {
    a_wrong_type_key_is_refused_and_left_alone(Hold::Lock, lock_keys()).await;
}

/// A `keys.lock` of another type fails `hold`'s handing-off release with a typed error, and
/// nothing is written.
pub(super) async fn a_wrong_type_key_is_refused_and_left_alone(hold: Hold, keys: LockKeys) {
    let (_server, mut conn, keys) = setup_for(keys).await;
    let _: () = conn.set(&keys.lock, "x").await.unwrap();
    let err = hold
        .hand_off(&mut conn, &keys, ("h1", "op1"), "h2")
        .await
        .unwrap_err();
    assert!(err.contains("not a fencelock hash"), "{err}");
    let value: String = conn.get(&keys.lock).await.unwrap();
    assert_eq!(value, "x");
    let written: bool = conn.exists(keys.op("h1")).await.unwrap();
    assert!(!written);
}
