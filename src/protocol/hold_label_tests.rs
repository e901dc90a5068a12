//! Labels on the holds of semaphores and read-write locks (`sem_acquire.lua` ARGV[9],
//! `rw_acquire.lua` ARGV[8]) against a real redis-server, in both ways of keeping deadlines:
//! a label is kept in its hold's own field only when given, survives a replay, a re-entry and
//! a downgrade, and ends with the hold on every path (release, an operator's release, cancel,
//! the lease running out).

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use super::SemAcquireReply;
use crate::protocol::contract_tests::{
    assert_nothing_left, cancelled_by, hold_field_expiry, hold_test, released_by, rw_keys,
    sem_keys, Conn, LEASE, OP_TTL,
};
use crate::protocol::rwlock::{rw_downgrade, RwAcquireReply, RwMode};
use crate::protocol::semaphore::HoldAcquire;
use crate::protocol::{reenter, CancelKind, CancelReply, OwnerReply, PubSub};
use crate::protocol::{EnterReply, LockKeys};
use crate::FencingToken;

/// Ends with a colon and digits, as a token does: the scripts must not take it for one.
const LABEL: &str = "order:8812";
/// A lease that runs out during a test.
const SHORT: Duration = Duration::from_millis(60);

async fn take(conn: &mut Conn, holder: &str, lease: Duration, label: Option<&str>) -> FencingToken {
    let reply = HoldAcquire::of(
        &sem_keys(),
        holder,
        lease,
        OP_TTL,
        PubSub::Classic,
        hold_field_expiry(),
        label,
        false,
    )
    .sem_acquire(conn, 1, 3, None)
    .await
    .unwrap();
    match reply {
        SemAcquireReply::Acquired { token, .. } => token,
        other => panic!("expected permits for {holder}, got {other:?}"),
    }
}

async fn hold(conn: &mut Conn, holder: &str, mode: RwMode, label: Option<&str>) -> FencingToken {
    let reply = HoldAcquire::of(
        &rw_keys(),
        holder,
        LEASE,
        OP_TTL,
        PubSub::Classic,
        hold_field_expiry(),
        label,
        false,
    )
    .rw_acquire(conn, mode, false)
    .await
    .unwrap();
    match reply {
        RwAcquireReply::Acquired { token, .. } => token,
        other => panic!("expected a hold for {holder}, got {other:?}"),
    }
}

/// Releases every one of `holders` (each with one entry) and checks that nothing is left.
async fn leave_all(conn: &mut Conn, keys: &LockKeys, holders: &[&str]) {
    for holder in holders {
        let reply = released_by(conn, keys, holder, &format!("{holder}-out")).await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 }, "{holder}");
    }
    assert_nothing_left(conn, keys).await;
}

/// Undoes `holder`'s acquisition, which ran: its hold ends.
async fn undo(conn: &mut Conn, keys: &LockKeys, holder: &str) {
    let kind = CancelKind::Acquire;
    let reply = cancelled_by(conn, keys, holder, holder, kind).await;
    assert_eq!(reply, CancelReply::Undone { remaining: 0 });
}

async fn fields(conn: &mut Conn, keys: &LockKeys) -> HashMap<String, String> {
    conn.hgetall(&keys.lock).await.unwrap()
}

/// Panics when any field or value of the hash still mentions the label.
async fn assert_label_gone(conn: &mut Conn, keys: &LockKeys, after: &str) {
    let hash = fields(conn, keys).await;
    assert!(
        !hash
            .iter()
            .any(|(f, v)| f.contains(LABEL) || v.contains(LABEL)),
        "the label is gone after {after}: {hash:?}"
    );
}

hold_test! {
    /// Without a label a hold's field is `<permits>:<token>` and nothing else is written; with one
    /// it is `<permits>:<token>:<label>`, still one field, and a replay of the acquisition keeps it
    /// and answers the hold's own token.
    async fn a_semaphore_label_is_kept_in_its_holds_field_only_when_given(_server, conn, keys = sem_keys()) {
        let plain = take(&mut conn, "plain", LEASE, None).await;
        let before = fields(&mut conn, &keys).await;
        assert_eq!(before.get("plain"), Some(&format!("1:{plain}")));
        // `~limit`, the hold and `~expiry` (field expiry) or `~used` and `~until` (the zset).
        let kept = if crate::protocol::contract_tests::hold_field_expiry() {
            3
        } else {
            4
        };
        assert_eq!(before.len(), kept, "{before:?}");
        let tagged = take(&mut conn, "tagged", LEASE, Some(LABEL)).await;
        let after = fields(&mut conn, &keys).await;
        assert_eq!(after.get("tagged"), Some(&format!("1:{tagged}:{LABEL}")));
        assert_eq!(
            after.len(),
            kept + 1,
            "one field more, the hold's own: {after:?}"
        );
        assert_eq!(take(&mut conn, "tagged", LEASE, Some(LABEL)).await, tagged);
        assert_eq!(
            fields(&mut conn, &keys).await,
            after,
            "a replay changes nothing"
        );
        if hold_field_expiry() {
            let deadline: Vec<i64> = redis::cmd("HPEXPIRETIME")
                .arg(&keys.lock)
                .arg("FIELDS")
                .arg(1)
                .arg("tagged")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(
                deadline[0] > 0,
                "the labelled field keeps its deadline: {deadline:?}"
            );
        }
        leave_all(&mut conn, &keys, &["plain", "tagged"]).await;
    }
}

hold_test! {
    /// The label ends with its hold whichever way the hold ends: its release, an operator's
    /// release (`Admin::release_hold`: the same script under an operator's op id), a cancel of its
    /// acquisition, and its lease running out (dropped by the next script on the lease zset, by
    /// the server with field expiry). Other holds keep theirs.
    async fn a_semaphore_label_ends_with_its_hold_on_every_path(_server, conn, keys = sem_keys()) {
        let keeper = take(&mut conn, "keeper", LEASE, Some("keeper-1")).await;

        take(&mut conn, "released", LEASE, Some(LABEL)).await;
        let reply = released_by(&mut conn, &keys, "released", "r1").await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        assert_label_gone(&mut conn, &keys, "a release").await;

        take(&mut conn, "evicted", LEASE, Some(LABEL)).await;
        let reply = released_by(&mut conn, &keys, "evicted", "operator:1").await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        assert_label_gone(&mut conn, &keys, "an operator's release").await;

        take(&mut conn, "undone", LEASE, Some(LABEL)).await;
        undo(&mut conn, &keys, "undone").await;
        assert_label_gone(&mut conn, &keys, "a cancel").await;

        take(&mut conn, "crashed", SHORT, Some(LABEL)).await;
        tokio::time::sleep(SHORT * 2).await;
        // The next acquisition purges the lease zset; field expiry needed nobody.
        take(&mut conn, "next", LEASE, None).await;
        assert_label_gone(&mut conn, &keys, "the lease ran out").await;
        assert!(!fields(&mut conn, &keys).await.contains_key("crashed"));

        let hash = fields(&mut conn, &keys).await;
        assert_eq!(hash.get("keeper"), Some(&format!("1:{keeper}:keeper-1")));
        leave_all(&mut conn, &keys, &["keeper", "next"]).await;
    }
}

hold_test! {
    /// A read-write lock's label is kept by a writer that downgrades (same holder, one permit) and
    /// by a hold entered again, whose re-entry answers the hold's token, not the digits at the end
    /// of the label; unlabelled readers write no more than before; everything ends with the holds.
    async fn a_read_write_label_survives_a_downgrade_and_a_reentry_and_ends_with_the_hold(_server, conn, keys = rw_keys()) {
        let ps = PubSub::Classic;
        let writer = hold(&mut conn, "w", RwMode::Write, Some(LABEL)).await;
        let hash = fields(&mut conn, &keys).await;
        assert_eq!(hash.get("w"), Some(&format!("1000000000:{writer}:{LABEL}")));
        assert_eq!(
            hold(&mut conn, "w", RwMode::Write, Some(LABEL)).await,
            writer
        );

        assert_eq!(
            rw_downgrade(&mut conn, &keys, "w", ps).await.unwrap(),
            OwnerReply::Done { remaining: 0 }
        );
        let hash = fields(&mut conn, &keys).await;
        assert_eq!(hash.get("w"), Some(&format!("1:{writer}:{LABEL}")));

        let entered = reenter(&mut conn, &keys, "w", "w-again", OP_TTL)
            .await
            .unwrap();
        assert_eq!(
            entered,
            EnterReply::Entered {
                token: writer,
                count: 2
            }
        );
        let reader = hold(&mut conn, "r", RwMode::Read, None).await;
        let hash = fields(&mut conn, &keys).await;
        assert_eq!(hash.get("r"), Some(&format!("1:{reader}")));
        assert_eq!(hash.get("w"), Some(&format!("1:{writer}:{LABEL}")));

        let reply = released_by(&mut conn, &keys, "w", "w-out").await;
        assert_eq!(reply, OwnerReply::Done { remaining: 1 });
        let reply = released_by(&mut conn, &keys, "w", "w-last").await;
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        assert_label_gone(&mut conn, &keys, "the last release").await;
        released_by(&mut conn, &keys, "r", "r-out").await;
        assert_nothing_left(&mut conn, &keys).await;

        // A labelled reader whose acquisition is undone leaves nothing either.
        hold(&mut conn, "undone", RwMode::Read, Some(LABEL)).await;
        undo(&mut conn, &keys, "undone").await;
        assert_nothing_left(&mut conn, &keys).await;
    }
}
