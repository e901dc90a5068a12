//! The contract of `rw_read_many.lua` against a real redis-server: reads of one read-write lock
//! that share a call are each answered as `rw_acquire.lua` answers a read alone (fresh holds
//! with consecutive tokens, replays, late copies, a writer holding or waiting), and a call with
//! a malformed list or foreign keys changes nothing.

use std::time::Duration;

use redis::AsyncCommands;

use super::batch::{read_outcome, Grouped, ReadOperation};
use super::contract_tests::{
    assert_deadline, assert_keys_expire, assert_nothing_left, assert_raised_wrongtype, assert_used,
    contract_checks, deadline_of, grouped_keys, hold_field_expiry, hold_test, refused_as_called,
    run_together, rw_keys, rw_write, setup_for, Checked, Conn, Fields, LEASE, OP_TTL,
};
use super::rwlock::RwAcquireReply;
use super::*;
use crate::protocol::semaphore::HoldAcquire;

/// A read of `holder` as the group commit builds it; `recorded`: a send that records.
fn reading(keys: &LockKeys, holder: &str, label: Option<&str>, recorded: bool) -> ReadOperation {
    ReadOperation::from(&HoldAcquire::of(
        keys,
        holder,
        LEASE,
        OP_TTL,
        PubSub::Classic,
        hold_field_expiry(),
        label,
        recorded,
    ))
}

/// The reads of `holders` in one call, each answered; `recorded` for every one.
async fn read_together(
    conn: &mut Conn,
    keys: &LockKeys,
    holders: &[&str],
    recorded: bool,
) -> Result<Vec<RwAcquireReply>, String> {
    let reads: Vec<ReadOperation> = holders
        .iter()
        .map(|holder| reading(keys, holder, None, recorded))
        .collect();
    run_together(conn, &reads, read_outcome).await
}

async fn leave(conn: &mut Conn, keys: &LockKeys, holder: &str) {
    super::contract_tests::leave(conn, keys, holder, &format!("{holder}:out")).await;
}

fn tokens(what: &str, replies: &[RwAcquireReply]) -> Result<Vec<u64>, String> {
    replies
        .iter()
        .map(|reply| match reply {
            RwAcquireReply::Acquired { token, .. } => Ok(token.get()),
            other => Err(format!(
                "{what}: expected holds, got {replies:?} ({other:?})"
            )),
        })
        .collect()
}

/// Fresh reads of one call hold one permit each with consecutive tokens, all above the last
/// writer's; a read already held is a replay with its own token, next to a fresh one whose
/// token continues the count; a late copy of a released read does nothing; and a writer is
/// then refused, as after the same reads sent one by one.
async fn grouped_reads_hold_as_reads_alone_do(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let RwAcquireReply::Acquired { token: written, .. } = rw_write(conn, keys, "w", false).await
    else {
        return Err("a writer on a free lock".into());
    };
    leave(conn, keys, "w").await;
    let first = tokens(
        "three reads",
        &read_together(conn, keys, &["a", "b", "c"], false).await?,
    )?;
    if first[0] <= written.get() || first[1] != first[0] + 1 || first[2] != first[1] + 1 {
        return Err(format!("tokens {first:?} after the writer's {written:?}"));
    }
    let hash: std::collections::HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
    for (holder, token) in ["a", "b", "c"].iter().zip(&first) {
        if hash.get(*holder) != Some(&format!("1:{token}")) {
            return Err(format!("{holder}'s field in {hash:?}"));
        }
    }
    if !hold_field_expiry() && hash.get("~used").map(String::as_str) != Some("3") {
        return Err(format!("~used in {hash:?}"));
    }
    let again = tokens(
        "a replay and a fresh read",
        &read_together(conn, keys, &["b", "d"], false).await?,
    )?;
    if again[0] != first[1] || again[1] <= first[2] {
        return Err(format!("replay and fresh {again:?} after {first:?}"));
    }
    leave(conn, keys, "a").await;
    let late = read_together(conn, keys, &["a"], false).await?;
    if late != [RwAcquireReply::Cancelled] {
        return Err(format!("a late copy of a released read: {late:?}"));
    }
    match rw_write(conn, keys, "w2", false).await {
        RwAcquireReply::Busy { .. } => Ok(()),
        other => Err(format!("a writer while reads hold: {other:?}")),
    }
}

/// Reads that share a call while a writer holds the lock, or waits for it, are all busy, with
/// the wait of a read alone; once the writer is done they all get in.
async fn grouped_reads_wait_for_a_writer_together(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let RwAcquireReply::Acquired { .. } = rw_write(conn, keys, "w", false).await else {
        return Err("a writer on a free lock".into());
    };
    let behind_holder = read_together(conn, keys, &["a", "b"], false).await?;
    if !behind_holder
        .iter()
        .all(|reply| matches!(reply, RwAcquireReply::Busy { wait: Some(_) }))
    {
        return Err(format!("reads behind a writer: {behind_holder:?}"));
    }
    leave(conn, keys, "w").await;
    tokens("a reader", &read_together(conn, keys, &["r"], false).await?)?;
    // A writer that will wait marks itself, and the mark keeps new readers out.
    if !matches!(
        rw_write(conn, keys, "w2", true).await,
        RwAcquireReply::Busy { .. }
    ) {
        return Err("a writer while a reader holds".into());
    }
    let behind_mark = read_together(conn, keys, &["a", "b", "c"], false).await?;
    if !behind_mark
        .iter()
        .all(|reply| matches!(reply, RwAcquireReply::Busy { .. }))
    {
        return Err(format!("reads behind a waiting writer: {behind_mark:?}"));
    }
    leave(conn, keys, "r").await;
    tokens(
        "the waiting writer",
        &[rw_write(conn, keys, "w2", true).await],
    )?;
    leave(conn, keys, "w2").await;
    tokens(
        "reads after the writer",
        &read_together(conn, keys, &["a", "b", "c"], false).await?,
    )?;
    Ok(())
}

/// A recorded read (a re-send) leaves its op record, so a late copy of it that arrives after
/// its hold ended does nothing, as for a read alone.
async fn a_recorded_grouped_read_stops_its_late_copies(
    conn: &mut Conn,
    keys: &LockKeys,
) -> Checked {
    tokens(
        "recorded reads",
        &read_together(conn, keys, &["a", "b"], true).await?,
    )?;
    // Gone without a release that marks the record: an operator's, or its lease's end.
    let _: () = conn.hdel(&keys.lock, &["a", "b"]).await.unwrap();
    let _: () = conn.zrem(keys.sem_leases(), &["a", "b"]).await.unwrap();
    if !hold_field_expiry() {
        let _: () = conn.hset(&keys.lock, "~used", 0).await.unwrap();
    }
    let late = read_together(conn, keys, &["a", "b"], false).await?;
    if late != [RwAcquireReply::Cancelled, RwAcquireReply::Cancelled] {
        return Err(format!("late copies of recorded reads: {late:?}"));
    }
    Ok(())
}

contract_checks! {
    /// Each grouped-read control is caught by the check that names it (the first check has
    /// no control of its own: the grouped path shares the library the semaphore controls
    /// break).
    the_grouped_read_checks_hold,
    the_grouped_read_negative_controls_are_caught,
    rw_keys, per_hold_expiry;
    grouped_reads_hold_as_reads_alone_do => [],
    grouped_reads_wait_for_a_writer_together => [Control::RwGroupedReadersIgnoreWaitingWriter],
    a_recorded_grouped_read_stops_its_late_copies => [Control::RwGroupedResendLeavesNoRecord],
}

/// A labelled read keeps its label in its own field, next to a read without one.
#[tokio::test]
async fn a_grouped_read_keeps_its_own_label() {
    let (_server, mut conn, keys) = setup_for(rw_keys()).await;
    let reads = [
        reading(&keys, "plain", None, false),
        reading(&keys, "tagged", Some("req:7"), false),
    ];
    let outcomes = ReadOperation::run_together(&mut conn, &[&reads[0], &reads[1]])
        .await
        .unwrap();
    let tokens: Vec<u64> = outcomes
        .into_iter()
        .map(|o| match read_outcome(o.unwrap()).unwrap() {
            RwAcquireReply::Acquired { token, .. } => token.get(),
            other => panic!("{other:?}"),
        })
        .collect();
    let plain: String = conn.hget(&keys.lock, "plain").await.unwrap();
    let tagged: String = conn.hget(&keys.lock, "tagged").await.unwrap();
    assert_eq!(plain, format!("1:{}", tokens[0]));
    assert_eq!(tagged, format!("1:{}:req:7", tokens[1]));
}

/// A holder given twice in one call (a read re-sent while its first send waits in the same
/// call) is answered as its first: one hold, one token, one permit.
#[tokio::test]
async fn a_holder_given_twice_is_answered_as_its_first() {
    let (_server, mut conn, keys) = setup_for(rw_keys()).await;
    let twice = read_together(&mut conn, &keys, &["a", "b", "a"], true)
        .await
        .unwrap();
    assert_eq!(twice[0], twice[2]);
    assert!(
        matches!(twice[0], RwAcquireReply::Acquired { .. }),
        "{twice:?}"
    );
    let used: Option<String> = conn.hget(&keys.lock, "~used").await.unwrap();
    assert_eq!(used.as_deref(), Some("2"));
}

/// A malformed list of reads, and a call whose lock key holds foreign data, are refused as a
/// whole, and nothing is written.
#[tokio::test]
async fn a_refused_call_writes_nothing() {
    let (_server, mut conn, keys) = setup_for(rw_keys()).await;
    // Two reads announced, one given.
    let err = refused_as_called(
        &mut conn,
        &scripts().rw_read_many,
        &grouped_keys(&keys, [keys.fence.clone(), keys.op("a")]),
        &["2", "30000", "10000", "classic", "zset", "a", "1", ""],
    )
    .await;
    assert!(err.to_string().contains("FENCELOCK_BADARG"), "{err}");
    assert_nothing_left(&mut conn, &keys).await;
    let records: usize = conn.exists(keys.op("a")).await.unwrap();
    assert_eq!(records, 0);

    let _: () = conn.set(&keys.lock, "foreign").await.unwrap();
    let reads = [
        reading(&keys, "a", None, true),
        reading(&keys, "b", None, true),
    ];
    let err = ReadOperation::run_together(&mut conn, &[&reads[0], &reads[1]])
        .await
        .unwrap_err();
    let err = Error::from_reply(err);
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    let value: String = conn.get(&keys.lock).await.unwrap();
    assert_eq!(value, "foreign");
    let written: usize = conn
        .exists(&[keys.op("a"), keys.op("b"), keys.fence.clone()])
        .await
        .unwrap();
    assert_eq!(written, 0);
}

hold_test! {
    /// The reads of a call expire with their lease like reads alone: a crashed grouped reader's
    /// hold ends by itself and lets a writer in.
    async fn grouped_reads_end_with_their_lease(_server, conn, keys = rw_keys()) {
        let short = Duration::from_millis(60);
        let reads: Vec<ReadOperation> = ["a", "b"]
            .iter()
            .map(|h| {
                ReadOperation::from(&HoldAcquire::of(&keys, h, short, OP_TTL, PubSub::Classic, hold_field_expiry(), None, false))
            })
            .collect();
        let outcomes = ReadOperation::run_together(&mut conn, &[&reads[0], &reads[1]])
            .await
            .unwrap();
        for outcome in outcomes {
            let reply = read_outcome(outcome.unwrap()).unwrap();
            assert!(
                matches!(reply, RwAcquireReply::Acquired { .. }),
                "{reply:?}"
            );
        }
        tokio::time::sleep(short * 3).await;
        let reply = rw_write(&mut conn, &keys, "w", false).await;
        assert!(
            matches!(reply, RwAcquireReply::Acquired { .. }),
            "{reply:?}"
        );
    }
}

/// One read alone (`rw_acquire.lua`), which must hold: its token.
async fn read_alone(conn: &mut Conn, keys: &LockKeys, holder: &str) -> u64 {
    let reply = reading(keys, holder, None, false)
        .run_alone(conn)
        .await
        .and_then(read_outcome)
        .unwrap();
    match reply {
        RwAcquireReply::Acquired { token, .. } => token.get(),
        other => panic!("{holder} reads a lock only readers hold: {other:?}"),
    }
}

/// The reads `(holder, recorded)` in one call, each answered.
async fn reads_of(conn: &mut Conn, keys: &LockKeys, reads: &[(&str, bool)]) -> Vec<RwAcquireReply> {
    let reads: Vec<ReadOperation> = reads
        .iter()
        .map(|(holder, recorded)| reading(keys, holder, None, *recorded))
        .collect();
    let refs: Vec<&ReadOperation> = reads.iter().collect();
    ReadOperation::run_together(conn, &refs)
        .await
        .expect("the call as a whole")
        .into_iter()
        .map(|outcome| outcome.and_then(read_outcome).expect("a read's reply"))
        .collect()
}

fn held(token: u64) -> RwAcquireReply {
    RwAcquireReply::Acquired {
        token: FencingToken::new(token).unwrap(),
        lease_left: None,
    }
}

/// No read of the call can raise on a key of its own: the reads' op records are read with one
/// `MGET`, which reads a key of another type as absent, where `rw_acquire.lua` alone raises
/// `WRONGTYPE` at its `GET` of the record and changes nothing (the one difference the header
/// and DESIGN section 7.3 state). So a read whose record key holds a hash is answered as a read
/// with no record: a fresh hold, its token next in the call's order; the other reads apply
/// once, and a first send writes nothing over the foreign value. Re-sent (recorded), every
/// read replays with its token, no token is issued, and the foreign value is still there (a
/// replay records only where no record is).
async fn a_foreign_record_reads_as_absent(conn: &mut Conn, keys: &LockKeys) {
    let tc = read_alone(conn, keys, "c").await;
    let ta = read_alone(conn, keys, "a").await;
    let _: () = conn.hset(keys.op("x"), "f", "foreign").await.unwrap();
    let foreign = Fields::from([("f".to_owned(), "foreign".to_owned())]);
    let before: Fields = conn.hgetall(&keys.lock).await.unwrap();

    let alone = reading(keys, "x", None, false).run_alone(conn).await;
    assert_raised_wrongtype(&alone);
    let after_alone: Fields = conn.hgetall(&keys.lock).await.unwrap();
    assert_eq!(after_alone, before, "the read alone changed the lock");

    let group = [("a", true), ("x", false), ("b", false)];
    let first = reads_of(conn, keys, &group).await;
    let got = tokens("a replay and two fresh reads", &first).unwrap();
    let (tx, tb) = (got[1], got[2]);
    assert_eq!(got[0], ta, "{first:?}");
    assert!(
        tx > ta.max(tc) && tb == tx + 1,
        "{first:?} after {ta}, {tc}"
    );
    let hash: Fields = conn.hgetall(&keys.lock).await.unwrap();
    for (holder, token) in [("a", ta), ("b", tb), ("c", tc), ("x", tx)] {
        assert_eq!(hash.get(holder), Some(&format!("1:{token}")), "{hash:?}");
    }
    assert_used(&hash, "4", "after the call");
    let record: Fields = conn.hgetall(keys.op("x")).await.unwrap();
    assert_eq!(
        record, foreign,
        "the first send wrote over the foreign value"
    );
    let counter: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(counter, tb);

    let resent = [("a", true), ("x", true), ("b", true)];
    let again = reads_of(conn, keys, &resent).await;
    assert_eq!(again, [held(ta), held(tx), held(tb)]);
    let after: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(after, counter, "a replay issued a token");
    let rehash: Fields = conn.hgetall(&keys.lock).await.unwrap();
    assert_eq!(rehash, hash, "a replay changed the holds");
    let record: Fields = conn.hgetall(keys.op("x")).await.unwrap();
    assert_eq!(record, foreign, "a replay wrote over the foreign value");
    let records: Vec<Option<String>> = conn.mget(&[keys.op("a"), keys.op("b")]).await.unwrap();
    assert_eq!(records, [Some("a".to_owned()), Some("a".to_owned())]);
    assert_keys_expire(conn, keys).await;
}

hold_test! {
    /// [`a_foreign_record_reads_as_absent`], on each way of keeping hold deadlines the server
    /// has.
    async fn a_read_whose_record_key_holds_another_type_reads_it_as_absent(_server, conn, keys = rw_keys()) {
        a_foreign_record_reads_as_absent(&mut conn, &keys).await;
    }
}

/// A group of reads holds only reads, so there is no inner release here: the mixed group of a
/// read-write lock's reads is a re-send of a read already granted beside a new reader, while a
/// third reader holds. The re-send is a replay (its own token, its deadline unchanged, a
/// recorded send leaves its record), the new reader holds with the next token of the slot,
/// the third reader's hold is untouched, and the keys still expire. The group re-sent replays
/// both, with no new token and no change to the holds.
async fn a_replay_beside_a_new_reader_and_a_holder(conn: &mut Conn, keys: &LockKeys) {
    let tc = read_alone(conn, keys, "c").await;
    let ta = read_alone(conn, keys, "a").await;
    let a_until = deadline_of(conn, keys, "a").await;
    let c_until = deadline_of(conn, keys, "c").await;

    let first = reads_of(conn, keys, &[("a", true), ("b", false)]).await;
    let got = tokens("a replay and a fresh read", &first).unwrap();
    let tb = got[1];
    assert_eq!(got[0], ta, "the replay's token: {first:?}");
    assert!(
        tb > ta.max(tc),
        "the new reader's token {tb} after {ta}, {tc}"
    );
    let hash: Fields = conn.hgetall(&keys.lock).await.unwrap();
    for (holder, token) in [("a", ta), ("b", tb), ("c", tc)] {
        assert_eq!(hash.get(holder), Some(&format!("1:{token}")), "{hash:?}");
    }
    assert_used(&hash, "3", "after the call");
    assert_deadline(conn, keys, "a", a_until, "after the call").await;
    assert_deadline(conn, keys, "c", c_until, "after the call").await;
    assert!(
        deadline_of(conn, keys, "b").await > 0,
        "b's hold has a deadline"
    );
    let records: Vec<Option<String>> = conn.mget(&[keys.op("a"), keys.op("b")]).await.unwrap();
    assert_eq!(
        records,
        [Some("a".to_owned()), None],
        "a recorded send's record only"
    );
    assert_keys_expire(conn, keys).await;
    let counter: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(counter, tb);

    let again = reads_of(conn, keys, &[("a", true), ("b", true)]).await;
    assert_eq!(again, [held(ta), held(tb)]);
    let after: u64 = conn.get(&keys.fence).await.unwrap();
    assert_eq!(after, counter, "a replay issued a token");
    let rehash: Fields = conn.hgetall(&keys.lock).await.unwrap();
    assert_eq!(rehash, hash, "a replay changed the holds");
    assert_keys_expire(conn, keys).await;
}

hold_test! {
    /// [`a_replay_beside_a_new_reader_and_a_holder`], on each way of keeping hold deadlines the
    /// server has.
    async fn a_replayed_read_and_a_new_reader_share_a_call_beside_a_holder(_server, conn, keys = rw_keys()) {
        a_replay_beside_a_new_reader_and_a_holder(&mut conn, &keys).await;
    }
}
