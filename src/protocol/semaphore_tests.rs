//! The semaphore scripts' contracts (`sem_acquire.lua`, `sem_release.lua`, `sem_cancel.lua`,
//! `sem_renew.lua`) against a real redis-server: never more permits held than the limit,
//! expired holds give their permits back, re-sent requests apply once, renewals are
//! owner-checked and never revive an expired hold, and nothing stays behind.

use std::time::Duration;

use redis::AsyncCommands;

use super::contract_tests::{
    assert_nothing_left, assert_undone_once, cancelled_by, contract_checks, hold_field_expiry,
    hold_test, released_by, sem_keys, sem_take, Checked, Conn, LEASE, OP_TTL,
};
use super::semaphore::SemAcquireReply;
use super::*;

/// The layout of a semaphore's keys, both ways of keeping deadlines.
#[path = "semaphore_layout_tests.rs"]
mod layout;

/// Which scripts wake a semaphore's waiters.
#[path = "semaphore_wakeup_tests.rs"]
mod wakeups;

const LIMIT: u32 = 3;
/// A lease that runs out during a check.
const SHORT: Duration = Duration::from_millis(60);

async fn take(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    permits: u32,
    lease: Duration,
) -> SemAcquireReply {
    take_sent(conn, keys, holder, permits, lease, false).await
}

/// [`take`] by a send that `recorded` its acquisition (one sent after a send of unknown
/// outcome: only such an acquisition can have a late copy).
pub(super) async fn take_sent(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    permits: u32,
    lease: Duration,
    recorded: bool,
) -> SemAcquireReply {
    sem_take(conn, keys, holder, (permits, LIMIT), lease, None, recorded)
        .await
        .unwrap()
}

/// [`take`] by a fair-handoff client, on a semaphore of 4 permits; `wait`: the caller will wait
/// (a busy attempt queues it).
async fn take_fair(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    permits: u32,
    wait: bool,
    lease: Duration,
) -> SemAcquireReply {
    sem_take(conn, keys, holder, (permits, 4), lease, Some(wait), false)
        .await
        .unwrap()
}

pub(super) fn token_of(reply: SemAcquireReply) -> Result<FencingToken, String> {
    match reply {
        SemAcquireReply::Acquired { token, .. } => Ok(token),
        other => Err(format!("expected an acquisition, got {other:?}")),
    }
}

/// The permits held: the sum over the holds' fields (`None`: no hash). Also checks the
/// layout of the way in scope: with field expiry the hash says so and keeps no `~used`; with
/// the lease zset `~used` equals the sum.
async fn used(conn: &mut Conn, keys: &LockKeys) -> Option<u32> {
    let hash: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    if hash.is_empty() {
        return None;
    }
    let sum = hash
        .iter()
        .filter(|(field, _)| !field.starts_with('~'))
        .map(|(_, held)| held.split(':').next().unwrap().parse::<u32>().unwrap())
        .sum::<u32>();
    if hold_field_expiry() {
        assert_eq!(
            hash.get("~expiry").map(String::as_str),
            Some("fields"),
            "{hash:?}"
        );
        assert!(!hash.contains_key("~used"), "{hash:?}");
    } else {
        assert_eq!(hash.get("~used"), Some(&sum.to_string()), "{hash:?}");
    }
    Some(sum)
}

/// However the requests interleave, the holds never have more permits than the limit.
async fn never_more_than_the_limit(conn: &mut Conn, keys: &LockKeys) -> Checked {
    token_of(take(conn, keys, "a", 2, LEASE).await)?;
    match take(conn, keys, "b", 2, LEASE).await {
        SemAcquireReply::Busy {
            free: 1,
            limit: 3,
            wait: Some(wait),
        } if wait <= LEASE => {}
        other => return Err(format!("2 of 3 held, a request for 2 got {other:?}")),
    }
    token_of(take(conn, keys, "c", 1, LEASE).await)?;
    match take(conn, keys, "d", 1, LEASE).await {
        SemAcquireReply::Busy { free: 0, .. } => {}
        other => return Err(format!("3 of 3 held, a request for 1 got {other:?}")),
    }
    match used(conn, keys).await {
        Some(3) => Ok(()),
        other => Err(format!("~used is {other:?} with 3 permits held")),
    }
}

/// A hold whose lease passed gives its permits back at the next script, without a release.
async fn an_expired_hold_gives_its_permits_back(conn: &mut Conn, keys: &LockKeys) -> Checked {
    token_of(take(conn, keys, "crashed", 2, SHORT).await)?;
    token_of(take(conn, keys, "alive", 1, LEASE).await)?;
    tokio::time::sleep(SHORT * 2).await;
    token_of(take(conn, keys, "next", 2, LEASE).await)
        .map_err(|e| format!("after the crashed hold's lease: {e}"))?;
    let stale: Option<String> = conn.hget(&keys.lock, "crashed").await.unwrap();
    let release = released_by(conn, keys, "crashed", "r1").await;
    match (stale, release, used(conn, keys).await) {
        (None, OwnerReply::NotHeld, Some(3)) => Ok(()),
        other => Err(format!(
            "the expired hold's field, its late release and ~used: {other:?}"
        )),
    }
}

/// A re-sent acquisition is answered from the hold it made, a re-sent release from its mark;
/// each applies once, and a copy of the acquisition arriving after the release does nothing.
async fn resent_requests_apply_once(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let first = token_of(take(conn, keys, "a", 2, LEASE).await)?;
    let again = token_of(take(conn, keys, "a", 2, LEASE).await)
        .map_err(|e| format!("the re-sent acquisition: {e}"))?;
    if again != first || used(conn, keys).await != Some(2) {
        return Err(format!(
            "re-sent acquisition: token {again} (first {first}), ~used {:?}",
            used(conn, keys).await
        ));
    }
    for attempt in 0..2 {
        let reply = released_by(conn, keys, "a", "r1").await;
        if reply != (OwnerReply::Done { remaining: 0 }) {
            return Err(format!("release copy {attempt} answered {reply:?}"));
        }
    }
    let other_op = released_by(conn, keys, "a", "r2").await;
    let late = take(conn, keys, "a", 2, LEASE).await;
    let exists: bool = conn.exists(&keys.lock).await.unwrap();
    match (other_op, late, exists) {
        (OwnerReply::NotHeld, SemAcquireReply::Cancelled, false) => Ok(()),
        other => Err(format!(
            "another release, a late acquisition copy, and the hash exists: {other:?}"
        )),
    }
}

/// Renewal sets a live hold's deadline again, refuses a stranger, and never revives a hold
/// whose lease passed (its permits may have been counted free already).
async fn renewal_is_owner_checked_and_never_revives(conn: &mut Conn, keys: &LockKeys) -> Checked {
    token_of(take(conn, keys, "short", 1, SHORT).await)?;
    token_of(take(conn, keys, "long", 1, LEASE).await)?;
    tokio::time::sleep(SHORT * 2).await;
    let renewed = renew(
        conn,
        &[(keys, "short"), (keys, "long"), (keys, "stranger")],
        LEASE,
    )
    .await
    .unwrap();
    if renewed != [false, true, false] {
        return Err(format!(
            "short (expired), long, stranger renewed: {renewed:?}"
        ));
    }
    let pttl: i64 = conn.pttl(&keys.lock).await.unwrap();
    if pttl <= (LEASE - Duration::from_secs(1)).as_millis() as i64 {
        return Err(format!("after the renewal the hash expires in {pttl} ms"));
    }
    Ok(())
}

/// In fair mode the oldest queued request is protected: a small one that would fit is refused
/// while it would leave the head short; the head then gets in; an entry whose waiter died
/// stops protecting, and a waiter's cancel takes its entry out.
async fn the_queue_head_is_protected(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let ask = async |conn: &mut Conn, holder: &str, permits, wait, lease| {
        take_fair(conn, keys, holder, permits, wait, lease).await
    };
    token_of(ask(conn, "held", 3, false, LEASE).await)?;
    if !matches!(
        ask(conn, "big", 4, true, LEASE).await,
        SemAcquireReply::Busy { .. }
    ) {
        return Err("4 permits while 3 are held".into());
    }
    match ask(conn, "small", 1, false, LEASE).await {
        SemAcquireReply::Busy { .. } => {}
        other => {
            return Err(format!(
                "a small request ahead of the queued big one got {other:?}"
            ))
        }
    }
    released_by(conn, keys, "held", "r1").await;
    match ask(conn, "small", 1, false, LEASE).await {
        SemAcquireReply::Busy { .. } => {}
        other => return Err(format!("with all 4 free, the small request got {other:?}")),
    }
    token_of(ask(conn, "big", 4, true, LEASE).await).map_err(|e| format!("the queue head: {e}"))?;
    released_by(conn, keys, "big", "r2").await;
    // A head whose waiter died (its entry's deadline passed) protects nobody.
    token_of(ask(conn, "held-again", 3, false, SHORT).await)?;
    let _ = ask(conn, "dead", 4, true, SHORT).await;
    tokio::time::sleep(SHORT * 3).await;
    token_of(ask(conn, "small", 1, false, LEASE).await)
        .map_err(|e| format!("after the dead head's entry ended: {e}"))?;
    // A waiter that gives up takes its entry out.
    let _ = ask(conn, "quitter", 4, true, LEASE).await;
    cancelled_by(conn, keys, "quitter", "quitter", CancelKind::Acquire).await;
    token_of(ask(conn, "small2", 1, false, LEASE).await)
        .map_err(|e| format!("after the waiter gave up: {e}"))
        .map(|_| ())
}

contract_checks! {
    /// Each semaphore control breaks exactly the contract check that names it (which holds on
    /// the production scripts: [`the_semaphore_contract_checks_hold`]), each on a fresh
    /// server. On the lease-zset path: with hash-field expiry the server itself drops expired
    /// holds, which `SemKeepsExpiredHolds` and `SemRenewRevivesExpired` break only on the zset.
    the_semaphore_contract_checks_hold,
    the_semaphore_scripts_negative_controls_are_caught,
    sem_keys, per_hold_expiry;
    never_more_than_the_limit => [Control::SemAcquireIgnoresLimit],
    an_expired_hold_gives_its_permits_back => [Control::SemKeepsExpiredHolds],
    resent_requests_apply_once => [Control::SemResendNotRecognised],
    renewal_is_owner_checked_and_never_revives => [Control::SemRenewRevivesExpired],
    the_queue_head_is_protected => [Control::SemIgnoresQueueHead],
}

hold_test! {
    /// A recorded limit wins over the caller's; a request above it is refused, not queued.
    async fn the_recorded_limit_wins_and_a_request_above_it_is_refused(_server, conn, keys = sem_keys()) {
        token_of(take(&mut conn, &keys, "a", 1, LEASE).await).unwrap();
        let _: () = conn.hset(&keys.lock, "~limit", 2).await.unwrap();
        let wider = sem_take(&mut conn, &keys, "b", (1, 10), LEASE, None, false)
            .await
            .unwrap();
        assert!(
            matches!(
                wider,
                SemAcquireReply::Acquired {
                    limit: 2,
                    free: 0,
                    ..
                }
            ),
            "{wider:?}"
        );
        let over = take(&mut conn, &keys, "c", 3, LEASE).await;
        assert_eq!(over, SemAcquireReply::OverLimit { limit: 2 });
    }
}

hold_test! {
    /// Cancelling undoes a hold that ran, once; cancelling first makes the late request a no-op.
    async fn a_cancel_undoes_a_hold_or_forestalls_it(_server, conn, keys = sem_keys()) {
        token_of(take(&mut conn, &keys, "ran", 2, LEASE).await).unwrap();
        let (ran, early) = (("ran", "ran"), ("early", "early"));
        assert_undone_once(&mut conn, &keys, CancelKind::Acquire, (ran, 0), early).await;
        assert_eq!(
            take(&mut conn, &keys, "early", 1, LEASE).await,
            SemAcquireReply::Cancelled
        );
        let exists: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(!exists, "nothing held after both cancels");
    }
}

hold_test! {
    /// Foreign data under a semaphore key fails every script with a typed error, and nothing is
    /// written: not the fence counter, not an op record.
    async fn foreign_data_is_refused_and_nothing_is_written(_server, conn, keys = sem_keys()) {
        for key in [keys.lock.clone(), keys.sem_leases()] {
            let _: () = conn.set(&key, "foreign").await.unwrap();
            let err = sem_take(&mut conn, &keys, "h", (1, LIMIT), LEASE, None, false)
                .await
                .unwrap_err();
            assert!(err.is_wrong_type(), "{err:?}");
            let err = release(&mut conn, &keys, "h", "r", OP_TTL, PubSub::Classic, false)
                .await
                .unwrap_err();
            assert!(err.is_wrong_type(), "{err:?}");
            assert_eq!(
                renew(&mut conn, &[(&keys, "h")], LEASE).await.unwrap(),
                [false]
            );
            let _: () = conn.del(&key).await.unwrap();
        }
        let written: usize = conn
            .exists(&[keys.fence.clone(), keys.op("h"), keys.op("r")])
            .await
            .unwrap();
        assert_eq!(written, 0);
    }
}

hold_test! {
    /// An operator's new limit governs a semaphore in use at once (a raised one lets a waiter in,
    /// and tells it); an idle semaphore records nothing.
    async fn an_operator_changes_the_limit_of_a_semaphore_in_use(_server, conn, keys = sem_keys()) {
        use super::semaphore::sem_limit;
        assert_eq!(
            sem_limit(&mut conn, &keys, 5, PubSub::Classic)
                .await
                .unwrap(),
            None
        );
        let exists: bool = conn.exists(&keys.lock).await.unwrap();
        assert!(!exists, "an idle semaphore's limit is not recorded");
        token_of(take(&mut conn, &keys, "a", 3, LEASE).await).unwrap();
        assert!(matches!(
            take(&mut conn, &keys, "b", 2, LEASE).await,
            SemAcquireReply::Busy { .. }
        ));
        assert_eq!(
            sem_limit(&mut conn, &keys, 5, PubSub::Classic)
                .await
                .unwrap(),
            Some(3)
        );
        let reply = take(&mut conn, &keys, "b", 2, LEASE).await;
        assert!(
            matches!(
                reply,
                SemAcquireReply::Acquired {
                    limit: 5,
                    free: 0,
                    ..
                }
            ),
            "{reply:?}"
        );
        // Lowered under what is held: nothing is revoked, nothing new fits.
        assert_eq!(
            sem_limit(&mut conn, &keys, 1, PubSub::Classic)
                .await
                .unwrap(),
            Some(5)
        );
        assert!(matches!(
            take(&mut conn, &keys, "c", 1, LEASE).await,
            SemAcquireReply::Busy { .. }
        ));
        assert_eq!(used(&mut conn, &keys).await, Some(5));
    }
}

hold_test! {
    /// A busy reply says how long until the earliest deadline among the holds, not a later one.
    async fn a_busy_reply_waits_until_the_earliest_deadline(_server, conn, keys = sem_keys()) {
        token_of(take(&mut conn, &keys, "long", 2, LEASE).await).unwrap();
        token_of(take(&mut conn, &keys, "short", 1, SHORT).await).unwrap();
        let reply = take(&mut conn, &keys, "c", 1, LEASE).await;
        assert!(
            matches!(reply, SemAcquireReply::Busy { wait: Some(wait), free: 0, .. } if wait <= SHORT),
            "{reply:?}"
        );
    }
}

/// A subscriber to `channels` on `server`, on a connection of its own.
pub(super) async fn subscriber(
    server: &fencelock_testing::RedisServer,
    channels: &[Vec<u8>],
) -> redis::aio::PubSub {
    let mut sub = server.client().get_async_pubsub().await.unwrap();
    for channel in channels {
        sub.subscribe(channel).await.unwrap();
    }
    sub
}

/// The channel of the next message `sub` receives within two seconds, `None` when none came.
pub(super) async fn next_message(sub: &mut redis::aio::PubSub) -> Option<Vec<u8>> {
    use futures_util::StreamExt;
    let mut messages = sub.on_message();
    tokio::time::timeout(Duration::from_secs(2), messages.next())
        .await
        .ok()
        .flatten()
        .map(|msg| msg.get_channel_name().as_bytes().to_vec())
}

hold_test! {
    /// A hold whose lease passed is not held for any script, even before another one dropped
    /// it: its release is told it holds nothing, an operator's new limit finds the semaphore
    /// idle, and a late copy of its acquisition (its op record says it ran) takes nothing.
    async fn a_hold_whose_lease_passed_is_gone_for_every_script(_server, conn, keys = sem_keys()) {
        use super::semaphore::sem_limit;
        // a's acquisition was re-sent: the copy below is its first send, arriving late.
        token_of(take_sent(&mut conn, &keys, "a", 1, SHORT, true).await).unwrap();
        token_of(take(&mut conn, &keys, "b", 1, SHORT).await).unwrap();
        // A live hold keeps the semaphore's keys alive past the two short leases.
        token_of(take(&mut conn, &keys, "keeper", 1, LEASE).await).unwrap();
        tokio::time::sleep(SHORT * 2).await;
        let late = take(&mut conn, &keys, "a", 1, LEASE).await;
        assert_eq!(
            late,
            SemAcquireReply::Cancelled,
            "a late copy of a's acquisition"
        );
        let reply = released_by(&mut conn, &keys, "b", "r").await;
        assert_eq!(reply, OwnerReply::NotHeld, "b's release after its lease");
        assert_eq!(used(&mut conn, &keys).await, Some(1), "the keeper's permit");
        let reply = released_by(&mut conn, &keys, "keeper", "rk").await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        assert_nothing_left(&mut conn, &keys).await;
        token_of(take(&mut conn, &keys, "c", 1, SHORT).await).unwrap();
        tokio::time::sleep(SHORT * 2).await;
        let limit = sem_limit(&mut conn, &keys, 5, PubSub::Classic)
            .await
            .unwrap();
        assert_eq!(limit, None, "a new limit after the last hold's lease");
        assert_nothing_left(&mut conn, &keys).await;
    }
}

hold_test! {
    /// Tokens keep increasing from the slot's fence counter even when it runs ahead of the
    /// clock (the floor the clock gives does not hide a counter that was not written back).
    async fn tokens_follow_a_fence_counter_ahead_of_the_clock(_server, conn, keys = sem_keys()) {
        let ahead: u64 = 4_000_000_000_000_000;
        let _: () = conn.set(&keys.fence, ahead).await.unwrap();
        let first = token_of(take(&mut conn, &keys, "a", 1, LEASE).await).unwrap();
        let second = token_of(take(&mut conn, &keys, "b", 1, LEASE).await).unwrap();
        assert_eq!(first.get(), ahead + 1);
        assert_eq!(second.get(), ahead + 2);
    }
}

hold_test! {
    /// In fair mode a waiter keeps its place in the queue across its attempts: the one that
    /// queued first stays the head, and a later one is held back for it.
    async fn a_waiter_keeps_its_place_in_the_queue_across_attempts(_server, conn, keys = sem_keys()) {
        let ask = async |conn: &mut Conn, holder: &str, permits, wait| {
            take_fair(conn, &keys, holder, permits, wait, LEASE).await
        };
        token_of(ask(&mut conn, "held", 3, false).await).unwrap();
        for holder in ["first", "second", "first"] {
            let reply = ask(&mut conn, holder, 3, true).await;
            assert!(
                matches!(reply, SemAcquireReply::Busy { .. }),
                "{holder}: {reply:?}"
            );
        }
        released_by(&mut conn, &keys, "held", "r").await;
        let second = ask(&mut conn, "second", 3, true).await;
        assert!(
            matches!(second, SemAcquireReply::Busy { .. }),
            "the second waiter ahead of the first: {second:?}"
        );
        token_of(ask(&mut conn, "first", 3, true).await).unwrap();
    }
}

hold_test! {
    /// A waiter whose entry passed (it died) stops protecting its place even while the queue
    /// lives on for a later waiter: that one becomes the head and gets in.
    async fn a_dead_waiters_entry_ends_while_a_later_waiters_lives(_server, conn, keys = sem_keys()) {
        let ask = async |conn: &mut Conn, holder: &str, permits, lease| {
            take_fair(conn, &keys, holder, permits, true, lease).await
        };
        token_of(ask(&mut conn, "held", 2, LEASE).await).unwrap();
        token_of(ask(&mut conn, "brief", 1, SHORT).await).unwrap();
        for (holder, permits, lease) in [("dead", 3, SHORT), ("alive", 2, LEASE)] {
            let reply = ask(&mut conn, holder, permits, lease).await;
            assert!(
                matches!(reply, SemAcquireReply::Busy { .. }),
                "{holder}: {reply:?}"
            );
        }
        tokio::time::sleep(SHORT * 3).await;
        token_of(ask(&mut conn, "alive", 2, LEASE).await)
            .map_err(|e| format!("the live waiter behind a dead one: {e}"))
            .unwrap();
    }
}

hold_test! {
    /// The first send of the release of a hold never entered again reads no op record
    /// (`sem_release.lua` ARGV[5] "0") and ends the hold; a re-send of it replays that from the
    /// mark. A re-entered hold's release that leaves an entry records it, and its re-send
    /// replays it instead of leaving a second one.
    async fn a_first_release_reads_no_record_and_its_re_send_replays(_server, conn, keys = sem_keys()) {
        let ps = PubSub::Classic;
        take(&mut conn, &keys, "h", 1, LEASE).await;
        let first = release(&mut conn, &keys, "h", "rel", OP_TTL, ps, false).await.unwrap();
        assert_eq!(first, OwnerReply::Done { remaining: 0 });
        let again = release(&mut conn, &keys, "h", "rel", OP_TTL, ps, true).await.unwrap();
        assert_eq!(again, first, "the re-send replays from the mark");
        take(&mut conn, &keys, "e", 1, LEASE).await;
        let entered = reenter(&mut conn, &keys, "e", "in", OP_TTL).await.unwrap();
        assert!(matches!(entered, EnterReply::Entered { count: 2, .. }), "{entered:?}");
        let left = release(&mut conn, &keys, "e", "out", OP_TTL, ps, true).await.unwrap();
        assert_eq!(left, OwnerReply::Done { remaining: 1 });
        let again = release(&mut conn, &keys, "e", "out", OP_TTL, ps, true).await.unwrap();
        assert_eq!(again, left, "the re-send replays its record");
        let last = release(&mut conn, &keys, "e", "last", OP_TTL, ps, false).await.unwrap();
        assert_eq!(last, OwnerReply::Done { remaining: 0 });
        assert_nothing_left(&mut conn, &keys).await;
    }
}
