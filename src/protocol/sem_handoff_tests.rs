//! The contract of `sem_handoff.lua` against a real redis-server, both ways of keeping hold
//! deadlines: a release that gives a hold's permits back grants the candidate its permits with
//! a greater token and publishes nothing, unless another client listens on the channel, the
//! candidate was cancelled or already holds, or too few permits are free (then it releases and
//! publishes, as `sem_release.lua` does); entries left hand nothing on; a re-sent copy replays
//! the grant, and either release script replays the other's release.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use super::contract_tests::{
    contract_checks, hold_field_expiry, released_by, sem_keys, Checked, Conn, LEASE, OP_TTL,
};
use super::handoff_tests::{
    a_cancelled_candidate_is_never_granted, a_wrong_type_key_is_refused_and_left_alone,
    another_listening_client_gets_a_release, copies_replay_and_entries_left_hand_nothing_on,
    listener, marked_and_not_published, published, Hold,
};
use super::semaphore::sem_limit;
use super::semaphore_tests::{take_sent, token_of};
use super::*;

const CANDIDATE_LEASE: Duration = Duration::from_secs(20);

/// `holder` takes `permits` of the semaphore's 3 (its acquisition's only send, or a
/// `recorded` one).
pub(super) async fn take(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    permits: u32,
    recorded: bool,
) -> Result<FencingToken, String> {
    token_of(take_sent(conn, keys, holder, permits, LEASE, recorded).await)
        .map_err(|why| format!("{holder}, {permits} permits: {why}"))
}

/// `holder`'s release by `op`, offering `to` its `permits`.
pub(super) async fn hand_off(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    op: &str,
    to: &str,
    permits: u32,
) -> Result<HandoffReply, String> {
    let candidate = Candidate {
        holder: to,
        lease: CANDIDATE_LEASE,
        label: Some("export:7"),
        permits,
    };
    release_handing_off(conn, keys, holder, op, OP_TTL, PubSub::Classic, candidate)
        .await
        .map_err(|e| e.to_string())
}

/// The holds' fields (holder id -> value), and the permits held as the layout counts them
/// (`~used` on the lease zset, which must equal the fields' sum).
async fn holds(conn: &mut Conn, keys: &LockKeys) -> Result<(HashMap<String, String>, u32), String> {
    let hash: HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    let holds: HashMap<String, String> = hash
        .iter()
        .filter(|(field, _)| !field.starts_with('~'))
        .map(|(f, v)| (f.clone(), v.clone()))
        .collect();
    let sum: u32 = holds
        .values()
        .map(|v| v.split(':').next().unwrap().parse::<u32>().unwrap())
        .sum();
    if !hold_field_expiry() && !hash.is_empty() && hash.get("~used") != Some(&sum.to_string()) {
        return Err(format!("~used does not count the holds: {hash:?}"));
    }
    Ok((holds, sum))
}

/// With one listener (the releasing client's own subscription), the release that ends the
/// hold grants the candidate its permits: a greater token, its label and lease, the room left,
/// no message; the releaser's record carries the release's mark.
async fn grants_the_permits_to_the_candidate(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let mut own = listener(conn, keys).await;
    take(conn, keys, "other", 1, false).await?;
    let first = take(conn, keys, "h1", 2, false).await?;
    let reply = hand_off(conn, keys, "h1", "op1", "h2", 2).await?;
    let HandoffReply::HandedOff { token, room } = reply else {
        return Err(format!("not handed off: {reply:?}"));
    };
    if token <= first || room != Some(Room { limit: 3, free: 0 }) {
        return Err(format!("handed off {reply:?} after token {first:?}"));
    }
    let (holds, used) = holds(conn, keys).await?;
    let expected = format!("2:{}:export:7", token.get());
    if holds.get("h2") != Some(&expected) || holds.contains_key("h1") || used != 3 {
        return Err(format!("the holds after the handoff: {holds:?}"));
    }
    let deadline: i64 = if hold_field_expiry() {
        let at: Vec<i64> = redis::cmd("HPEXPIRETIME")
            .arg(&keys.lock)
            .arg("FIELDS")
            .arg(1)
            .arg("h2")
            .query_async(conn)
            .await
            .unwrap();
        at[0]
    } else {
        let at: Option<i64> = conn.zscore(keys.sem_leases(), "h2").await.unwrap();
        at.unwrap_or(0)
    };
    let time: (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    let left = deadline - (time.0 * 1000 + time.1 / 1000);
    if !(10_000..=20_000).contains(&left) {
        return Err(format!("the candidate's lease is not set: {left} ms left"));
    }
    marked_and_not_published(conn, keys, &mut own).await?;
    // An operator lowers the limit below the permits held; a re-sent copy of the handoff (its
    // reply was lost) still replays the grant, with no room left.
    let lowered = sem_limit(conn, keys, 1, PubSub::Classic).await;
    lowered.map_err(|e| format!("lowering the limit: {e}"))?;
    let replay = hand_off(conn, keys, "h1", "op1", "h2", 2).await?;
    let room = Some(Room { limit: 1, free: 0 });
    if replay != (HandoffReply::HandedOff { token, room }) {
        return Err(format!(
            "the handoff's replay under a lower limit: {replay:?}"
        ));
    }
    Ok(())
}

/// A candidate the freed permits are not enough for, or one that already holds (a straggling
/// copy of its own acquisition ran), is not granted: the permits come back, the release is
/// published, and no hold is counted twice.
async fn a_candidate_that_does_not_fit_or_holds_is_not_granted(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    let mut own = listener(conn, keys).await;
    take(conn, keys, "h1", 1, false).await?;
    take(conn, keys, "other", 2, false).await?;
    let reply = hand_off(conn, keys, "h1", "op1", "big", 2).await?;
    if reply != (HandoffReply::Released { remaining: 0 }) || !published(&mut own).await {
        return Err(format!(
            "2 free of 3 was handed to a request for 2: {reply:?}"
        ));
    }
    released_by(conn, keys, "other", "op2").await;
    take(conn, keys, "h3", 1, false).await?;
    let straggler = take(conn, keys, "h4", 1, false).await?;
    let reply = hand_off(conn, keys, "h3", "op3", "h4", 1).await?;
    if reply != (HandoffReply::Released { remaining: 0 }) || !published(&mut own).await {
        return Err(format!("a holding candidate was granted again: {reply:?}"));
    }
    let (holds, used) = holds(conn, keys).await?;
    let expected = format!("1:{}", straggler.get());
    if holds.get("h4") != Some(&expected) || used != 1 {
        return Err(format!("the holds after a straggler's handoff: {holds:?}"));
    }
    Ok(())
}

contract_checks! {
    /// Each control is caught by its check: a grant past another listening client, to a
    /// cancelled candidate, and beyond the limit (or twice to a holding candidate).
    the_semaphore_handoff_keeps_its_contract,
    the_semaphore_handoff_checks_catch_their_controls,
    sem_keys, per_hold_expiry;
    grants_the_permits_to_the_candidate => [],
    another_listening_client_gets_a_release(Hold::Permits)
        => [Control::SemHandoffIgnoresOtherClients],
    a_cancelled_candidate_is_never_granted(Hold::Permits) => [Control::SemHandoffIgnoresCancel],
    a_candidate_that_does_not_fit_or_holds_is_not_granted => [Control::SemHandoffIgnoresRoom],
    copies_replay_and_entries_left_hand_nothing_on(Hold::Permits) => [],
}

/// A key of another type is refused before anything is written.
#[tokio::test]
async fn a_wrong_type_semaphore_key_is_refused_and_left_alone() {
    a_wrong_type_key_is_refused_and_left_alone(Hold::Permits, sem_keys()).await;
}
