//! The read-write lock scripts' contracts (`rw_acquire.lua`, `rw_downgrade.lua`, and the
//! semaphore scripts that release, undo and renew its holds) against a real redis-server:
//! readers share and writers exclude, a waiting writer stops new readers, tokens place every
//! read between two writes, a downgrade lets readers in with no writer between, and a dead
//! writer's mark ends by itself.

use std::time::Duration;

use redis::AsyncCommands;

use super::contract_tests::{
    assert_nothing_left, assert_undone_once, cancelled_by, contract_checks, hold_field_expiry,
    hold_test, released_by, rw_keys, rw_take, rw_write, Checked, Conn, LEASE, OP_TTL,
};
use super::rwlock::{rw_downgrade, RwAcquireReply, RwMode};
use super::*;
use crate::protocol::semaphore::HoldAcquire;

/// A lease that runs out during a check.
const SHORT: Duration = Duration::from_millis(60);

async fn read(conn: &mut Conn, keys: &LockKeys, holder: &str) -> RwAcquireReply {
    rw_take(conn, keys, holder, RwMode::Read, LEASE, false).await
}

fn token_of(what: &str, reply: RwAcquireReply) -> Result<FencingToken, String> {
    match reply {
        RwAcquireReply::Acquired { token, .. } => Ok(token),
        other => Err(format!("{what}: expected a hold, got {other:?}")),
    }
}

fn busy(what: &str, reply: RwAcquireReply) -> Checked {
    match reply {
        RwAcquireReply::Busy { .. } => Ok(()),
        other => Err(format!("{what}: expected busy, got {other:?}")),
    }
}

async fn leave(conn: &mut Conn, keys: &LockKeys, holder: &str) {
    super::contract_tests::leave(conn, keys, holder, &format!("{holder}-r")).await;
}

/// Readers hold together; a writer is refused while any reader holds, and holds alone.
async fn readers_share_and_writers_exclude(conn: &mut Conn, keys: &LockKeys) -> Checked {
    token_of("first reader", read(conn, keys, "r1").await)?;
    token_of("second reader", read(conn, keys, "r2").await)?;
    busy(
        "a writer while two read",
        rw_write(conn, keys, "w", false).await,
    )?;
    leave(conn, keys, "r1").await;
    busy(
        "a writer while one reads",
        rw_write(conn, keys, "w", false).await,
    )?;
    leave(conn, keys, "r2").await;
    token_of("the writer alone", rw_write(conn, keys, "w", false).await)?;
    busy(
        "a reader while the writer holds",
        read(conn, keys, "r3").await,
    )?;
    busy("a second writer", rw_write(conn, keys, "w2", false).await)
}

/// A writer that waits keeps new readers out; once it gives up (its cancel), they enter.
async fn a_waiting_writer_stops_new_readers(conn: &mut Conn, keys: &LockKeys) -> Checked {
    token_of("the reader inside", read(conn, keys, "inside").await)?;
    busy("the writer", rw_write(conn, keys, "w", true).await)?;
    busy(
        "a new reader behind the waiting writer",
        read(conn, keys, "late").await,
    )?;
    let undone = cancelled_by(conn, keys, "w", "w", CancelKind::Acquire).await;
    if undone != CancelReply::NotRun {
        return Err(format!("the waiting writer's cancel answered {undone:?}"));
    }
    token_of(
        "the reader after the writer gave up",
        read(conn, keys, "late").await,
    )
    .map(|_| ())
}

/// The writer's and readers' tokens place every read between two writes, and a downgrade
/// keeps the writer's token while it lets readers in and keeps writers out.
async fn a_downgrade_lets_readers_in_and_keeps_writers_out(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    let w1 = token_of("the first writer", rw_write(conn, keys, "w1", false).await)?;
    busy("a reader during the write", read(conn, keys, "r").await)?;
    let reply = rw_downgrade(conn, keys, "w1", PubSub::Classic)
        .await
        .unwrap();
    if reply != (OwnerReply::Done { remaining: 0 }) {
        return Err(format!("the downgrade answered {reply:?}"));
    }
    let r = token_of("a reader after the downgrade", read(conn, keys, "r").await)?;
    busy(
        "a writer while both read",
        rw_write(conn, keys, "w2", false).await,
    )?;
    leave(conn, keys, "w1").await;
    leave(conn, keys, "r").await;
    let w2 = token_of("the next writer", rw_write(conn, keys, "w2", false).await)?;
    if w1 < r && r < w2 {
        Ok(())
    } else {
        Err(format!(
            "tokens: first writer {w1}, reader {r}, next writer {w2}"
        ))
    }
}

/// A crashed reader's share ends with its lease; so does a dead writer's waiting mark.
async fn crashed_holds_and_marks_end_by_themselves(conn: &mut Conn, keys: &LockKeys) -> Checked {
    token_of(
        "a reader",
        rw_take(conn, keys, "crashed", RwMode::Read, SHORT, false).await,
    )?;
    busy(
        "a writer that then dies",
        rw_take(conn, keys, "dead", RwMode::Write, SHORT, true).await,
    )?;
    busy("a reader behind the mark", read(conn, keys, "r").await)?;
    tokio::time::sleep(SHORT * 3).await;
    token_of(
        "a reader after the dead writer's mark",
        read(conn, keys, "r").await,
    )?;
    leave(conn, keys, "r").await;
    token_of(
        "a writer after the crashed reader's lease",
        rw_write(conn, keys, "w", false).await,
    )
    .map(|_| ())
}

contract_checks! {
    /// Each read-write lock control breaks the contract check that names it (the last check
    /// has no control of its own: `SemKeepsExpiredHolds` breaks the shared purge, caught by
    /// the semaphore's checks).
    the_rwlock_contract_checks_hold,
    the_rwlock_scripts_negative_controls_are_caught,
    rw_keys, per_hold_expiry;
    a_waiting_writer_stops_new_readers => [Control::RwReadersIgnoreWaitingWriter],
    readers_share_and_writers_exclude => [Control::RwWriterIgnoresReaders],
    a_downgrade_lets_readers_in_and_keeps_writers_out => [Control::RwDowngradeKeepsWriting],
    crashed_holds_and_marks_end_by_themselves => [],
}

hold_test! {
    /// A re-sent acquisition replays its hold; a release leaves nothing behind, waiting marks
    /// included; foreign data is a typed error.
    async fn replays_apply_once_and_nothing_stays_behind(_server, conn, keys = rw_keys()) {
        let first = token_of("write", rw_write(&mut conn, &keys, "w", true).await).unwrap();
        let again = token_of("re-sent write", rw_write(&mut conn, &keys, "w", true).await).unwrap();
        assert_eq!(first, again);
        busy(
            "a waiting writer",
            rw_write(&mut conn, &keys, "w2", true).await,
        )
        .unwrap();
        let writers = keys.rw_writers().unwrap();
        let marks: usize = conn.zcard(&writers).await.unwrap();
        assert_eq!(marks, 1);
        leave(&mut conn, &keys, "w").await;
        let second = token_of(
            "the waiting writer",
            rw_write(&mut conn, &keys, "w2", true).await,
        )
        .unwrap();
        assert!(second > first);
        leave(&mut conn, &keys, "w2").await;
        assert_eq!(
            read(&mut conn, &keys, "w").await,
            RwAcquireReply::Cancelled,
            "a late copy of a released acquisition"
        );
        let left: usize = conn
            .exists(&[keys.lock.clone(), keys.sem_leases(), writers.clone()])
            .await
            .unwrap();
        assert_eq!(left, 0);
        let _: () = conn.set(&writers, "foreign").await.unwrap();
        let err = HoldAcquire::of(&keys, "x", LEASE, OP_TTL, PubSub::Classic, hold_field_expiry(), None, false)
.rw_acquire(&mut conn, RwMode::Read, false)
        .await
        .unwrap_err();
        assert!(err.is_wrong_type(), "{err:?}");
        let counter: bool = conn.exists(&keys.fence).await.unwrap();
        assert!(
            counter,
            "the fence counter was written by the earlier holds"
        );
    }
}

hold_test! {
    /// A hold entered again through its guard keeps its token and is left entry by entry; a
    /// re-sent re-entry or release applies once; a cancelled re-entry is undone once, or
    /// forestalled; a hold whose lease passed is not entered again.
    async fn a_hold_entered_again_is_left_entry_by_entry(_server, conn, keys = rw_keys()) {
        let ps = PubSub::Classic;
        let token = token_of("write", rw_write(&mut conn, &keys, "w", false).await).unwrap();
        for _ in 0..2 {
            let again = reenter(&mut conn, &keys, "w", "e1", OP_TTL).await.unwrap();
            assert_eq!(again, EnterReply::Entered { token, count: 2 });
        }
        let third = reenter(&mut conn, &keys, "w", "e2", OP_TTL).await.unwrap();
        assert_eq!(third, EnterReply::Entered { token, count: 3 });
        let (ran, early) = (("w", "e2"), ("w", "e3"));
        assert_undone_once(&mut conn, &keys, CancelKind::Reenter, (ran, 2), early).await;
        assert_eq!(
            reenter(&mut conn, &keys, "w", "e3", OP_TTL).await.unwrap(),
            EnterReply::Cancelled
        );
        for _ in 0..2 {
            // A re-entered hold's releases read their op records (the client sends them so).
            let left = release(&mut conn, &keys, "w", "r1", OP_TTL, ps, true)
                .await
                .unwrap();
            assert_eq!(left, OwnerReply::Done { remaining: 1 });
        }
        busy(
            "a reader while one write entry remains",
            read(&mut conn, &keys, "r").await,
        )
        .unwrap();
        let last = release(&mut conn, &keys, "w", "r2", OP_TTL, ps, true)
            .await
            .unwrap();
        assert_eq!(last, OwnerReply::Done { remaining: 0 });
        token_of(
            "a reader after the last entry",
            read(&mut conn, &keys, "r").await,
        )
        .unwrap();
        leave(&mut conn, &keys, "r").await;
        assert_nothing_left(&mut conn, &keys).await;

        token_of(
            "a short read",
            rw_take(&mut conn, &keys, "short", RwMode::Read, SHORT, false).await,
        )
        .unwrap();
        tokio::time::sleep(SHORT * 2).await;
        assert_eq!(
            reenter(&mut conn, &keys, "short", "e4", OP_TTL)
                .await
                .unwrap(),
            EnterReply::NotHeld
        );
    }
}

/// A hold's deadline, in server ms, kept whichever way the lock keeps them; with field
/// expiry, also each of `fields` (-1: none, -2: no such field).
async fn deadlines(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    fields: &[&str],
) -> (i64, Vec<i64>) {
    if !hold_field_expiry() {
        let at: f64 = conn.zscore(keys.sem_leases(), holder).await.unwrap();
        return (at as i64, Vec::new());
    }
    let mut all = vec![holder];
    all.extend_from_slice(fields);
    let at: Vec<i64> = redis::cmd("HPEXPIRETIME")
        .arg(&keys.lock)
        .arg("FIELDS")
        .arg(all.len())
        .arg(&all)
        .query_async(conn)
        .await
        .unwrap();
    (at[0], at[1..].to_vec())
}

hold_test! {
    /// A downgrade and a re-entry change a hold's permits or entries but never its deadline: with
    /// field expiry, where rewriting a field clears its expiry, the hold's field keeps its
    /// deadline and the entries field gets the same one.
    async fn a_downgrade_and_a_reentry_keep_the_holds_deadline(_server, conn, keys = rw_keys()) {
        let token = token_of("write", rw_write(&mut conn, &keys, "w", false).await).unwrap();
        let (before, _) = deadlines(&mut conn, &keys, "w", &[]).await;
        let entered = reenter(&mut conn, &keys, "w", "e1", OP_TTL).await.unwrap();
        assert_eq!(entered, EnterReply::Entered { token, count: 2 });
        let (after_entry, entries) = deadlines(&mut conn, &keys, "w", &["~entries:w"]).await;
        assert_eq!(after_entry, before);
        if hold_field_expiry() {
            assert_eq!(entries, [before], "the entries field expires with its hold");
        }
        let reply = rw_downgrade(&mut conn, &keys, "w", PubSub::Classic)
            .await
            .unwrap();
        assert_eq!(reply, OwnerReply::Done { remaining: 0 });
        let (after_downgrade, entries) = deadlines(&mut conn, &keys, "w", &["~entries:w"]).await;
        assert_eq!(after_downgrade, before);
        if hold_field_expiry() {
            assert_eq!(entries, [before]);
        }
        token_of(
            "a reader beside the downgraded writer",
            read(&mut conn, &keys, "r").await,
        )
        .unwrap();
        for op in ["r1", "r2"] {
            released_by(&mut conn, &keys, "w", op).await;
        }
        leave(&mut conn, &keys, "r").await;
        assert_nothing_left(&mut conn, &keys).await;
    }
}

hold_test! {
    /// A writer's mark outlives its next attempt: it lasts until the earliest deadline among the
    /// holds plus the writer's lease, however short that lease, so readers stay out while the
    /// writer waits for the reader inside; a writer's try leaves no mark at all.
    async fn a_waiting_writers_mark_lasts_until_its_next_attempt_and_a_try_leaves_none(_server, conn, keys = rw_keys()) {
        token_of("the reader inside", read(&mut conn, &keys, "inside").await).unwrap();
        busy(
            "a writer's try",
            rw_write(&mut conn, &keys, "trying", false).await,
        )
        .unwrap();
        token_of(
            "a reader after a writer's try",
            read(&mut conn, &keys, "r1").await,
        )
        .unwrap();
        busy(
            "a waiting writer with a short lease",
            rw_take(&mut conn, &keys, "w", RwMode::Write, SHORT, true).await,
        )
        .unwrap();
        tokio::time::sleep(SHORT * 3).await;
        busy(
            "a reader once the writer's own lease has passed",
            read(&mut conn, &keys, "r2").await,
        )
        .unwrap();
    }
}

hold_test! {
    /// Undoing a re-entry that leaves the hold's first entry keeps the hold: it still excludes,
    /// and its one release ends it.
    async fn undoing_a_reentry_keeps_the_first_entry(_server, conn, keys = rw_keys()) {
        let token = token_of("write", rw_write(&mut conn, &keys, "w", false).await).unwrap();
        let entered = reenter(&mut conn, &keys, "w", "e1", OP_TTL).await.unwrap();
        assert_eq!(entered, EnterReply::Entered { token, count: 2 });
        let undone = cancelled_by(&mut conn, &keys, "w", "e1", CancelKind::Reenter).await;
        assert_eq!(undone, CancelReply::Undone { remaining: 1 });
        busy(
            "a reader while the write's first entry holds",
            read(&mut conn, &keys, "r").await,
        )
        .unwrap();
        leave(&mut conn, &keys, "w").await;
        token_of(
            "a reader after the write's release",
            read(&mut conn, &keys, "r").await,
        )
        .unwrap();
    }
}

hold_test! {
    /// A renewal moves a re-entered hold's whole deadline, its entries included: after the first
    /// lease would have passed, the hold still has both entries.
    async fn a_renewal_keeps_a_reentered_holds_entries(_server, conn, keys = rw_keys()) {
        let ps = PubSub::Classic;
        token_of(
            "a short write",
            rw_take(&mut conn, &keys, "w", RwMode::Write, SHORT, false).await,
        )
        .unwrap();
        reenter(&mut conn, &keys, "w", "e1", OP_TTL).await.unwrap();
        assert_eq!(
            renew(&mut conn, &[(&keys, "w")], LEASE).await.unwrap(),
            [true]
        );
        tokio::time::sleep(SHORT * 2).await;
        let first = release(&mut conn, &keys, "w", "r1", OP_TTL, ps, true)
            .await
            .unwrap();
        assert_eq!(
            first,
            OwnerReply::Done { remaining: 1 },
            "after the first lease"
        );
        let last = release(&mut conn, &keys, "w", "r2", OP_TTL, ps, true)
            .await
            .unwrap();
        assert_eq!(last, OwnerReply::Done { remaining: 0 });
        assert_nothing_left(&mut conn, &keys).await;
    }
}

hold_test! {
    /// A hold whose lease passed leaves nothing of its own, its entries included, once a script
    /// has dropped it; a late downgrade of it is told it holds nothing.
    async fn an_expired_hold_leaves_nothing_of_its_own(_server, conn, keys = rw_keys()) {
        token_of(
            "a short read",
            rw_take(&mut conn, &keys, "short", RwMode::Read, SHORT, false).await,
        )
        .unwrap();
        reenter(&mut conn, &keys, "short", "e1", OP_TTL)
            .await
            .unwrap();
        token_of("a long read", read(&mut conn, &keys, "long").await).unwrap();
        tokio::time::sleep(SHORT * 2).await;
        assert_eq!(
            reenter(&mut conn, &keys, "short", "e2", OP_TTL)
                .await
                .unwrap(),
            EnterReply::NotHeld,
            "a re-entry after the lease, the hash kept alive by another hold"
        );
        token_of("another read", read(&mut conn, &keys, "r").await).unwrap();
        let fields: Vec<String> = conn.hkeys(&keys.lock).await.unwrap();
        assert!(
            !fields.iter().any(|field| field.ends_with("short")),
            "{fields:?}"
        );
        let _: () = conn
            .del(&[keys.lock.clone(), keys.sem_leases()])
            .await
            .unwrap();
        // A writer downgraded to a reader, then a reader beside it that keeps the lock alive:
        // a re-sent downgrade after the first lease is told it holds nothing.
        token_of(
            "a short write",
            rw_take(&mut conn, &keys, "w", RwMode::Write, SHORT, false).await,
        )
        .unwrap();
        rw_downgrade(&mut conn, &keys, "w", PubSub::Classic)
            .await
            .unwrap();
        token_of("a long read", read(&mut conn, &keys, "long2").await).unwrap();
        tokio::time::sleep(SHORT * 2).await;
        assert_eq!(
            rw_downgrade(&mut conn, &keys, "w", PubSub::Classic)
                .await
                .unwrap(),
            OwnerReply::NotHeld
        );
    }
}

hold_test! {
    /// A dead writer's mark stops keeping readers out once it passes, even while the marks' key
    /// lives on for another writer's later mark.
    async fn a_dead_writers_mark_ends_while_another_writers_lives(_server, conn, keys = rw_keys()) {
        token_of(
            "a short read",
            rw_take(&mut conn, &keys, "inside", RwMode::Read, SHORT, false).await,
        )
        .unwrap();
        busy(
            "a writer that then dies",
            rw_take(&mut conn, &keys, "dead", RwMode::Write, SHORT, true).await,
        )
        .unwrap();
        busy(
            "a writer that waits on",
            rw_write(&mut conn, &keys, "alive", true).await,
        )
        .unwrap();
        tokio::time::sleep(SHORT * 3).await;
        token_of(
            "the live writer after the read's lease",
            rw_write(&mut conn, &keys, "alive", true).await,
        )
        .unwrap();
        leave(&mut conn, &keys, "alive").await;
        token_of(
            "a reader once the dead writer's mark passed",
            read(&mut conn, &keys, "late").await,
        )
        .unwrap();
    }
}

hold_test! {
    /// Waiting readers are told when a waiting writer gives up (its mark no longer keeps them
    /// out), and, with the lease zset, when an attempt dropped an expired hold.
    async fn readers_are_told_when_a_writer_gives_up_or_a_lease_ends(server, conn, keys = rw_keys()) {
        use super::semaphore_tests::{next_message, subscriber};
        let channel = keys.lock.clone();
        token_of("the reader inside", read(&mut conn, &keys, "inside").await).unwrap();
        busy("the writer", rw_write(&mut conn, &keys, "w", true).await).unwrap();
        let mut sub = subscriber(&server, std::slice::from_ref(&channel)).await;
        let undone = cancelled_by(&mut conn, &keys, "w", "w", CancelKind::Acquire).await;
        assert_eq!(undone, CancelReply::NotRun);
        assert_eq!(
            next_message(&mut sub).await,
            Some(channel.clone()),
            "a waiting writer gave up"
        );
        drop(sub);
        if !hold_field_expiry() {
            token_of(
                "a reader that crashes",
                rw_take(&mut conn, &keys, "crashed", RwMode::Read, SHORT, false).await,
            )
            .unwrap();
            tokio::time::sleep(SHORT * 2).await;
            let mut sub = subscriber(&server, std::slice::from_ref(&channel)).await;
            busy(
                "a writer's try",
                rw_write(&mut conn, &keys, "w2", false).await,
            )
            .unwrap();
            assert_eq!(
                next_message(&mut sub).await,
                Some(channel.clone()),
                "an attempt dropped the crashed reader's hold"
            );
        }
    }
}

hold_test! {
    /// A reader's release that leaves other readers holding publishes nothing on either channel
    /// (no waiter can use it: a writer waits for no hold at all, a reader for a writer's hold or
    /// mark); the last reader's release tells both sides. With field expiry the script does not
    /// know the holds left, and publishes every release.
    async fn only_the_release_that_leaves_no_hold_wakes_waiters(server, conn, keys = rw_keys()) {
        use futures_util::StreamExt;
        let writers = keys.rw_writers().unwrap();
        token_of("the first reader", read(&mut conn, &keys, "a").await).unwrap();
        token_of("the second reader", read(&mut conn, &keys, "b").await).unwrap();
        busy("the writer", rw_write(&mut conn, &keys, "w", true).await).unwrap();
        let mut sub = server.client().get_async_pubsub().await.unwrap();
        sub.subscribe(&keys.lock).await.unwrap();
        sub.subscribe(&writers).await.unwrap();
        leave(&mut conn, &keys, "a").await;
        // Messages arrive in the order they were published: a probe published after the
        // release is the first message unless the release published.
        let _: () = conn.publish(&writers, "probe").await.unwrap();
        let mut expected = if hold_field_expiry() {
            vec!["released", "released", "probe"]
        } else {
            vec!["probe"]
        };
        leave(&mut conn, &keys, "b").await;
        expected.extend(["released", "released"]);
        let mut messages = sub.on_message();
        let mut received = Vec::new();
        while received.len() < expected.len() {
            let message = tokio::time::timeout(Duration::from_secs(2), messages.next())
                .await
                .expect("a message within two seconds")
                .unwrap();
            received.push(message.get_payload::<String>().unwrap());
        }
        assert_eq!(received, expected);
    }
}
