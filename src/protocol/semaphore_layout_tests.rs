//! How a semaphore is laid out in Redis, both ways of keeping its holds' deadlines (the lease
//! zset and hash-field expiry, `lib/sem_holds.lua`), against a real redis-server: the keys and
//! fields DESIGN.md gives, expiring no earlier than the latest hold, the way chosen at creation
//! kept, and nothing left after the last release.

use super::*;
use crate::protocol::contract_tests::{
    connect_as, hold_test, released_by, setup_for, setup_with_field_expiry,
};
use crate::protocol::rwlock::{RwAcquireReply, RwMode};
use crate::protocol::semaphore::HoldAcquire;

/// The layout DESIGN.md gives: the hash with the limit, the sum, the keys' expiry and one
/// field per hold, the zset of deadlines; both keys expire one lease after the hold's
/// deadline, as `~until` says; nothing left after the release.
#[tokio::test]
async fn a_hold_is_laid_out_as_documented_and_leaves_nothing_behind() {
    let (_server, mut conn, keys) = setup_for(sem_keys()).await;
    let token = token_of(take(&mut conn, &keys, "h", 2, LEASE).await).unwrap();
    let hash: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    assert_eq!(hash.get("~limit").map(String::as_str), Some("3"));
    assert_eq!(hash.get("~used").map(String::as_str), Some("2"));
    assert_eq!(hash.get("h"), Some(&format!("2:{token}")));
    assert_eq!(hash.len(), 4, "{hash:?}");
    let deadline: f64 = conn.zscore(keys.sem_leases(), "h").await.unwrap();
    let until: i64 = hash["~until"].parse().unwrap();
    let lease = LEASE.as_millis() as i64;
    assert_eq!(until, deadline as i64 + lease, "{hash:?}");
    for key in [keys.lock.clone(), keys.sem_leases()] {
        let pttl: i64 = conn.pttl(&key).await.unwrap();
        assert!(pttl > lease && pttl <= 2 * lease, "{pttl}");
    }
    let reply = released_by(&mut conn, &keys, "h", "r").await;
    assert_eq!(reply, OwnerReply::Done { remaining: 0 });
    assert_nothing_left(&mut conn, &keys).await;
}

/// Each field's own expiry, in server ms (-1: none, -2: no such field).
async fn field_deadlines(conn: &mut Conn, key: &[u8], fields: &[&str]) -> Vec<i64> {
    redis::cmd("HPEXPIRETIME")
        .arg(key)
        .arg("FIELDS")
        .arg(fields.len())
        .arg(fields)
        .query_async(conn)
        .await
        .unwrap()
}

/// The server clock in ms.
async fn server_ms(conn: &mut Conn) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

/// The layout DESIGN.md gives for hash-field expiry: one hash, no lease zset, no `~used`; a
/// hold's field expires at its deadline by itself, a renewal moves it, and the hash expires
/// with the latest one; nothing is left after the release.
#[tokio::test]
async fn a_hold_with_field_expiry_is_laid_out_as_documented_and_leaves_nothing_behind() {
    let test = "a_hold_with_field_expiry_is_laid_out_as_documented_and_leaves_nothing_behind";
    let Some((_server, mut conn, keys)) = setup_with_field_expiry(test, sem_keys()).await else {
        return;
    };
    let (token, short) = crate::protocol::contract_tests::HOLD_FIELD_EXPIRY_SCOPE
        .scope(true, async {
            let token = token_of(take(&mut conn, &keys, "h", 2, LEASE).await).unwrap();
            let short = token_of(take(&mut conn, &keys, "s", 1, SHORT).await).unwrap();
            (token, short)
        })
        .await;
    let hash: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    assert_eq!(hash.get("~limit").map(String::as_str), Some("3"));
    assert_eq!(hash.get("~expiry").map(String::as_str), Some("fields"));
    assert_eq!(hash.get("h"), Some(&format!("2:{token}")));
    assert_eq!(hash.get("s"), Some(&format!("1:{short}")));
    assert_eq!(hash.len(), 4, "{hash:?}");
    let zset: bool = conn.exists(keys.sem_leases()).await.unwrap();
    assert!(!zset, "no lease zset with field expiry");
    let now = server_ms(&mut conn).await;
    let deadlines = field_deadlines(&mut conn, &keys.lock, &["h", "s", "~limit"]).await;
    let lease = LEASE.as_millis() as i64;
    assert!(
        deadlines[0] > now && deadlines[0] <= now + lease,
        "{deadlines:?}"
    );
    assert!(
        deadlines[1] <= now + SHORT.as_millis() as i64,
        "{deadlines:?}"
    );
    assert_eq!(deadlines[2], -1, "the limit lives as long as the hash");
    let key_deadline: i64 = redis::cmd("PEXPIRETIME")
        .arg(&keys.lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        key_deadline, deadlines[0],
        "the hash expires with its latest hold"
    );
    // The short hold's field goes by itself, with nobody calling a script.
    tokio::time::sleep(SHORT * 2).await;
    let gone: bool = conn.hexists(&keys.lock, "s").await.unwrap();
    assert!(!gone, "the expired hold's field is gone");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        renew(&mut conn, &[(&keys, "h"), (&keys, "s")], LEASE * 2)
            .await
            .unwrap(),
        [true, false]
    );
    let renewed = field_deadlines(&mut conn, &keys.lock, &["h"]).await;
    assert!(renewed[0] > deadlines[0], "{renewed:?} after {deadlines:?}");
    let reply = released_by(&mut conn, &keys, "h", "r").await;
    assert_eq!(reply, OwnerReply::Done { remaining: 0 });
    assert_nothing_left(&mut conn, &keys).await;
}

/// A crashed holder's field whose expiry passed but that the server has not reclaimed yet
/// still counts in `HLEN`: the release of the last live hold looks through the small hash and
/// deletes it, limit included, instead of leaving it (and its limit) to its own expiry.
#[tokio::test]
async fn the_last_release_deletes_a_field_expiry_hash_that_still_counts_a_crashed_hold() {
    let test = "the_last_release_deletes_a_field_expiry_hash_that_still_counts_a_crashed_hold";
    let Some((_server, mut conn, keys)) = setup_with_field_expiry(test, sem_keys()).await else {
        return;
    };
    // One active expiry cycle a second: a field expired a few ms ago is usually still there.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("hz")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut judged = 0;
    for round in 0..10 {
        let (crashed, alive, op) = (
            format!("crashed{round}"),
            format!("alive{round}"),
            format!("r{round}"),
        );
        crate::protocol::contract_tests::HOLD_FIELD_EXPIRY_SCOPE
            .scope(true, async {
                token_of(take(&mut conn, &keys, &crashed, 1, SHORT).await).unwrap();
                token_of(take(&mut conn, &keys, &alive, 1, LEASE).await).unwrap();
            })
            .await;
        tokio::time::sleep(SHORT + Duration::from_millis(5)).await;
        let counted: usize = conn.hlen(&keys.lock).await.unwrap();
        let reply = released_by(&mut conn, &keys, &alive, &op).await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        assert_nothing_left(&mut conn, &keys).await;
        // `~limit`, `~expiry`, the live hold and the expired one not yet reclaimed.
        judged += usize::from(counted == 4);
    }
    assert!(
        judged > 0,
        "the server reclaimed every expired field before the release"
    );
}

/// [`take`] of `permits` with the default lease by a client that keeps hold deadlines as
/// field expiry (`fields`) or in the lease zset.
async fn take_keeping(
    fields: bool,
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    permits: u32,
) -> SemAcquireReply {
    let scope = &crate::protocol::contract_tests::HOLD_FIELD_EXPIRY_SCOPE;
    scope
        .scope(fields, take(conn, keys, holder, permits, LEASE))
        .await
}

/// A semaphore keeps the way it was created with, whatever later clients ask for: a lease-zset
/// semaphore joined by a field-expiry client keeps its zset and `~used`, and the reverse keeps
/// field expiry; the permits are counted right either way.
#[tokio::test]
async fn a_semaphore_keeps_the_way_it_was_created_with() {
    let test = "a_semaphore_keeps_the_way_it_was_created_with";
    let Some((_server, mut conn, keys)) = setup_with_field_expiry(test, sem_keys()).await else {
        return;
    };
    let scope = &crate::protocol::contract_tests::HOLD_FIELD_EXPIRY_SCOPE;
    for created_with_fields in [false, true] {
        let first = take_keeping(created_with_fields, &mut conn, &keys, "first", 1).await;
        token_of(first).unwrap();
        let second = take_keeping(!created_with_fields, &mut conn, &keys, "second", 1).await;
        token_of(second).unwrap();
        let third = take_keeping(!created_with_fields, &mut conn, &keys, "third", 2).await;
        assert!(
            matches!(third, SemAcquireReply::Busy { free: 1, .. }),
            "{third:?}"
        );
        let used = scope
            .scope(created_with_fields, used(&mut conn, &keys))
            .await;
        assert_eq!(used, Some(2));
        let zset: usize = conn.zcard(keys.sem_leases()).await.unwrap();
        assert_eq!(zset, if created_with_fields { 0 } else { 2 });
        for (holder, op) in [("first", "r1"), ("second", "r2")] {
            let reply = released_by(&mut conn, &keys, holder, op).await;
            assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        }
        assert_nothing_left(&mut conn, &keys).await;
        let _: () = redis::cmd("DEL")
            .arg(keys.op("first"))
            .arg(keys.op("second"))
            .arg(keys.op("third"))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// A caller that asks for field expiry where the server cannot keep it (a server without
/// hash-field expiry, or a user not granted `HPEXPIRETIME`) gets a lease-zset semaphore: the
/// probe decides, and the hold keeps a deadline.
#[tokio::test]
async fn a_field_expiry_request_gets_the_lease_zset_where_the_server_cannot_keep_it() {
    let (server, mut admin, _lock) = crate::protocol::contract_tests::setup().await;
    // Field expiry refused where the server has it.
    let binary = fencelock_testing::ServerBinary::current().unwrap();
    let has_fields = binary
        .lacks(fencelock_testing::Feature::HashFieldExpiry)
        .is_none();
    let denied: &[&str] = if has_fields { &["hpexpiretime"] } else { &[] };
    let mut conn = connect_as(&server, &mut admin, "nofields", denied).await;
    let keys = sem_keys();
    let reply = HoldAcquire::of(
        &keys,
        "h",
        LEASE,
        OP_TTL,
        PubSub::Classic,
        true,
        None,
        false,
    )
    .sem_acquire(&mut conn, 2, LIMIT, None)
    .await
    .unwrap();
    token_of(reply).unwrap();
    let hash: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    assert!(!hash.contains_key("~expiry"), "{hash:?}");
    assert_eq!(hash.get("~used").map(String::as_str), Some("2"), "{hash:?}");
    let deadline: Option<f64> = conn.zscore(keys.sem_leases(), "h").await.unwrap();
    assert!(
        deadline.is_some(),
        "the hold's deadline is in the lease zset"
    );
    let reply = released_by(&mut conn, &keys, "h", "r").await;
    assert_eq!(reply, OwnerReply::Done { remaining: 0 });
    assert_nothing_left(&mut conn, &keys).await;
}

/// A renewal its user may not run (an ACL refusal) fails the whole call, so that the watchdog
/// retries, instead of answering the holds not held: the holds are live, and taking them for
/// lost would end every guard on a permission change.
#[tokio::test]
async fn a_renewal_refused_by_the_acl_fails_instead_of_losing_the_holds() {
    let (server, mut admin, _lock) = crate::protocol::contract_tests::setup().await;
    let keys = sem_keys();
    token_of(take(&mut admin, &keys, "a", 1, LEASE).await).unwrap();
    let mut conn = connect_as(&server, &mut admin, "nohmget", &["hmget"]).await;
    let refused = renew(&mut conn, &[(&keys, "a")], LEASE).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        renew(&mut admin, &[(&keys, "a")], LEASE).await.unwrap(),
        [true],
        "the hold is live"
    );
}

hold_test! {
    /// A hold whose field was removed in Redis (an operator's HDEL) is not renewed: its holder
    /// learns that it lost it.
    async fn a_hold_whose_field_was_removed_is_not_renewed(_server, conn, keys = sem_keys()) {
        token_of(take(&mut conn, &keys, "a", 1, LEASE).await).unwrap();
        token_of(take(&mut conn, &keys, "b", 1, LEASE).await).unwrap();
        let _: () = conn.hdel(&keys.lock, "a").await.unwrap();
        assert_eq!(
            renew(&mut conn, &[(&keys, "a"), (&keys, "b")], LEASE)
                .await
                .unwrap(),
            [false, true]
        );
    }
}

hold_test! {
    /// The keys expire no earlier than the latest hold's deadline: a shorter hold granted later
    /// does not bring their expiry forward, nor does the release of the longest hold (the keys
    /// then outlive the holds left by at most its lease). An operator's new limit finds the
    /// semaphore idle once those holds' leases passed, and nothing is left.
    async fn the_keys_outlive_every_hold_and_go_with_the_last(_server, conn, keys = sem_keys()) {
        use crate::protocol::semaphore::sem_limit;
        token_of(take(&mut conn, &keys, "long", 1, LEASE).await).unwrap();
        token_of(take(&mut conn, &keys, "short", 1, SHORT).await).unwrap();
        let mut keys_now = vec![keys.lock.clone()];
        if !crate::protocol::contract_tests::hold_field_expiry() {
            keys_now.push(keys.sem_leases());
        }
        for key in &keys_now {
            let pttl: i64 = conn.pttl(key).await.unwrap();
            assert!(
                pttl > SHORT.as_millis() as i64,
                "{pttl} after the short hold"
            );
        }
        let reply = released_by(&mut conn, &keys, "long", "r").await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        tokio::time::sleep(SHORT * 2).await;
        assert_eq!(
            sem_limit(&mut conn, &keys, 5, PubSub::Classic)
                .await
                .unwrap(),
            None,
            "a new limit once the hold left has expired"
        );
        assert_nothing_left(&mut conn, &keys).await;
    }
}

/// With the lease zset, the keys' expiry moves only when a deadline passes `~until`, and
/// then to one lease beyond that deadline: the holds taken during the next lease leave it
/// (and both keys' expiry) alone, and a longer hold moves it again.
#[tokio::test]
async fn the_keys_expiry_moves_once_per_lease() {
    let (_server, mut conn, keys) = setup_for(sem_keys()).await;
    let until = async |conn: &mut Conn| -> i64 {
        let text: String = conn.hget(&keys.lock, "~until").await.unwrap();
        text.parse().unwrap()
    };
    token_of(take(&mut conn, &keys, "first", 1, LEASE).await).unwrap();
    let first = until(&mut conn).await;
    token_of(take(&mut conn, &keys, "second", 1, LEASE).await).unwrap();
    assert_eq!(until(&mut conn).await, first, "a hold within the lease");
    // The clock read before the expiry, so the expiry can only be nearer than `first - before`.
    let before = server_ms(&mut conn).await;
    let pttl: i64 = conn.pttl(keys.sem_leases()).await.unwrap();
    assert!(pttl <= first - before, "{pttl} against {}", first - before);
    token_of(take(&mut conn, &keys, "long", 1, LEASE * 3).await).unwrap();
    let long: f64 = conn.zscore(keys.sem_leases(), "long").await.unwrap();
    let moved = until(&mut conn).await;
    assert_eq!(moved, long as i64 + (LEASE * 3).as_millis() as i64);
    for key in [keys.lock.clone(), keys.sem_leases()] {
        let pttl: i64 = conn.pttl(&key).await.unwrap();
        assert!(pttl > (LEASE * 5).as_millis() as i64, "{pttl}");
    }
}

hold_test! {
    /// A replayed acquisition (a semaphore's, a read-write lock's) answers what is left of the
    /// hold's lease, which began before the replay's send and is not renewed by it; a fresh
    /// one answers nothing of the kind.
    async fn a_replay_answers_what_is_left_of_the_lease(_server, conn, keys = sem_keys()) {
        let first = take(&mut conn, &keys, "a", 1, LEASE).await;
        assert!(matches!(first, SemAcquireReply::Acquired { lease_left: None, .. }), "{first:?}");
        let again = take_sent(&mut conn, &keys, "a", 1, LEASE, true).await;
        assert!(
            matches!(again, SemAcquireReply::Acquired { lease_left: Some(left), .. }
                if left <= LEASE && left > LEASE / 2),
            "{again:?}"
        );
        let rw = crate::protocol::contract_tests::rw_keys();
        let take_rw = |conn: &mut Conn| {
            let mut conn = conn.clone();
            let rw = rw.clone();
            async move {
                crate::protocol::contract_tests::rw_take(&mut conn, &rw, "w", RwMode::Write, LEASE, false)
                    .await
            }
        };
        let first = take_rw(&mut conn).await;
        assert!(matches!(first, RwAcquireReply::Acquired { lease_left: None, .. }), "{first:?}");
        let again = take_rw(&mut conn).await;
        assert!(
            matches!(again, RwAcquireReply::Acquired { lease_left: Some(left), .. }
                if left <= LEASE && left > LEASE / 2),
            "{again:?}"
        );
    }
}
