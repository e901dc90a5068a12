//! The idempotency-key scripts' contracts (`idem_begin.lua`, `idem_finish.lua`,
//! `idem_read.lua`) against a real redis-server: who may begin a run, what a duplicate is
//! answered, what a dead or failed runner's key becomes, that a key is never run for another
//! fingerprint, and that a result is stored fenced by its token.

use redis::AsyncCommands;

use super::contract_tests::{contract_checks, idempotency_keys, setup_for, Checked, Conn};
use super::run_record_tests::{finish, hold_ends, try_begin, won, GIVE_UP, RUN_AGAIN};
use super::*;

const FINGERPRINT: &[u8] = b"charge acct-9 500";

async fn begin(
    conn: &mut Conn,
    keys: &LockKeys,
    runner: (&str, FencingToken),
    on_death: bool,
) -> BeginReply<KeyResult> {
    try_begin(conn, keys, runner, FINGERPRINT, on_death)
        .await
        .unwrap()
}

/// `idem_finish.lua` ending the run of `holder` with `token` as `end` says, storing `result`.
async fn store(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    token: FencingToken,
    end: RunEnd,
    result: &[u8],
) -> FinishReply {
    let runner = (holder, token);
    finish::<KeyResult>(conn, keys, runner, FINGERPRINT, (0, end), Some(result))
        .await
        .unwrap()
}

/// `holder` wins the key's lock and begins its run, `on_death` saying what a dead runner's
/// run becomes; its token.
async fn begun(conn: &mut Conn, keys: &LockKeys, holder: &str, on_death: bool) -> FencingToken {
    let token = won(conn, keys, holder).await;
    begin(conn, keys, (holder, token), on_death).await;
    token
}

/// Asserts that a begin took the run over from the runner with token `from` (`what` says
/// which begin).
fn assert_took_over(reply: BeginReply<KeyResult>, from: FencingToken, what: &str) {
    match reply {
        BeginReply::Begun {
            took_over: Some(old),
            ..
        } => assert_eq!(old, from, "{what}"),
        other => panic!("{what} got {other:?}"),
    }
}

async fn read(conn: &mut Conn, keys: &LockKeys) -> KeyRead {
    idem_read(conn, keys, KeyReadMode::Read).await.unwrap()
}

#[tokio::test]
async fn a_run_begins_stores_its_result_and_answers_duplicates() {
    let (_server, mut conn, keys) = setup_for(idempotency_keys()).await;
    assert_eq!(
        read(&mut conn, &keys).await,
        KeyRead {
            record: None,
            lock_token: None,
            lease_left: None
        }
    );
    let token = won(&mut conn, &keys, "a").await;
    let BeginReply::Begun {
        took_over: None,
        started_ms,
    } = begin(&mut conn, &keys, ("a", token), RUN_AGAIN).await
    else {
        panic!("a free key did not begin");
    };
    // A re-sent begin is the same begin.
    assert_eq!(
        begin(&mut conn, &keys, ("a", token), RUN_AGAIN).await,
        BeginReply::Begun {
            took_over: None,
            started_ms
        }
    );
    let running = read(&mut conn, &keys).await;
    let record = running.record.clone().unwrap();
    assert_eq!((record.runner.as_str(), record.token), ("a", token));
    assert_eq!(record.own.fingerprint, FINGERPRINT);
    assert_eq!(
        (record.finished_ms, record.own.result.as_slice()),
        (None, &b""[..])
    );
    assert_eq!(running.lock_token, Some(token), "the runner holds the key");
    let ttl: i64 = conn.pttl(keys.idem_record()).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "the record expires: {ttl}");

    // A result of any bytes, stored once; a re-sent finish answers the first one's time.
    let result = b"\x00ok\xff\r\n".to_vec();
    let FinishReply::Done { finished_ms } =
        store(&mut conn, &keys, "a", token, RunEnd::Done, &result).await
    else {
        panic!("the runner's finish was refused");
    };
    assert_eq!(
        store(&mut conn, &keys, "a", token, RunEnd::Done, &result).await,
        FinishReply::Done { finished_ms }
    );
    hold_ends(&mut conn, &keys).await;
    let done = read(&mut conn, &keys).await.record.unwrap();
    assert_eq!(done.finished_ms, Some(finished_ms));
    assert_eq!(
        (done.own.result.clone(), done.own.is_final_failure),
        (result.clone(), false)
    );

    // A duplicate is answered with the stored result, whatever its policy.
    for (holder, policy) in [("dup-1", RUN_AGAIN), ("dup-2", GIVE_UP)] {
        let dup = won(&mut conn, &keys, holder).await;
        match begin(&mut conn, &keys, (holder, dup), policy).await {
            BeginReply::Done(record) => assert_eq!(record, done),
            other => panic!("a duplicate of a done key got {other:?}"),
        }
        hold_ends(&mut conn, &keys).await;
    }
}

#[tokio::test]
async fn a_final_failure_is_stored_and_a_retryable_one_runs_again() {
    let (_server, mut conn, keys) = setup_for(idempotency_keys()).await;
    // Retryable: the record says failed, the next caller takes over whatever the policy.
    let first = begun(&mut conn, &keys, "first", GIVE_UP).await;
    store(&mut conn, &keys, "first", first, RunEnd::Failed, b"").await;
    let failed = read(&mut conn, &keys).await.record.unwrap();
    assert!(failed.failed_ms.is_some() && failed.finished_ms.is_none());
    hold_ends(&mut conn, &keys).await;
    let second = won(&mut conn, &keys, "second").await;
    let reply = begin(&mut conn, &keys, ("second", second), GIVE_UP).await;
    assert_took_over(reply, first, "the retry of a failed run");
    let reply = begin(&mut conn, &keys, ("second", second), GIVE_UP).await;
    assert_took_over(reply, first, "a re-sent retry of a failed run");
    // Final: stored like a result, marked.
    store(
        &mut conn,
        &keys,
        "second",
        second,
        RunEnd::Final,
        b"declined",
    )
    .await;
    let stored = read(&mut conn, &keys).await.record.unwrap();
    assert!(stored.own.is_final_failure && stored.failed_ms.is_none());
    assert_eq!(stored.own.result, b"declined");
}

#[tokio::test]
async fn a_dead_runners_key_is_run_again_or_given_up_by_policy() {
    let (_server, mut conn, keys) = setup_for(idempotency_keys()).await;
    let dead = begun(&mut conn, &keys, "dead", RUN_AGAIN).await;
    hold_ends(&mut conn, &keys).await;
    let careful = won(&mut conn, &keys, "careful").await;
    match begin(&mut conn, &keys, ("careful", careful), GIVE_UP).await {
        BeginReply::Abandoned(record) => assert_eq!(record.token, dead),
        other => panic!("a dead runner's key under GiveUp got {other:?}"),
    }
    hold_ends(&mut conn, &keys).await;
    let eager = won(&mut conn, &keys, "eager").await;
    let reply = begin(&mut conn, &keys, ("eager", eager), RUN_AGAIN).await;
    assert_took_over(reply, dead, "a dead runner's key under RunAgain");
    // A takeover whose reply was lost is re-sent: the re-send still says whose run it took
    // over, so the new runner knows the dead one's writes may be half done.
    let reply = begin(&mut conn, &keys, ("eager", eager), RUN_AGAIN).await;
    assert_took_over(reply, dead, "a re-sent takeover");
}

#[tokio::test]
async fn forget_deletes_only_a_record_nobody_holds() {
    let (_server, mut conn, keys) = setup_for(idempotency_keys()).await;
    let token = begun(&mut conn, &keys, "a", RUN_AGAIN).await;
    let held = idem_read(&mut conn, &keys, KeyReadMode::Forget(None))
        .await
        .unwrap();
    assert_eq!(held.lock_token, Some(token));
    assert!(
        read(&mut conn, &keys).await.record.is_some(),
        "kept under a holder"
    );
    hold_ends(&mut conn, &keys).await;
    // Meant for another run than the record's (one that took the key over since the caller
    // looked): answered and kept.
    let other = FencingToken::new(token.get() + 1000).unwrap();
    let kept = idem_read(&mut conn, &keys, KeyReadMode::Forget(Some(other)))
        .await
        .unwrap();
    assert_eq!(kept.record.map(|r| r.token), Some(token));
    assert!(read(&mut conn, &keys).await.record.is_some(), "kept");
    let forgotten = idem_read(&mut conn, &keys, KeyReadMode::Forget(Some(token)))
        .await
        .unwrap();
    assert_eq!(forgotten.record.map(|r| r.token), Some(token));
    assert_eq!(read(&mut conn, &keys).await.record, None);
}

#[tokio::test]
async fn foreign_data_is_a_typed_error_and_stays_untouched() {
    let (_server, mut conn, keys) = setup_for(idempotency_keys()).await;
    let _: () = conn.set(keys.idem_record(), "not ours").await.unwrap();
    let token = won(&mut conn, &keys, "a").await;
    let err = try_begin::<KeyResult>(&mut conn, &keys, ("a", token), FINGERPRINT, RUN_AGAIN)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let done = (0, RunEnd::Done);
    let err = finish::<KeyResult>(
        &mut conn,
        &keys,
        ("a", token),
        FINGERPRINT,
        done,
        Some(b"x"),
    )
    .await
    .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let err = idem_read(&mut conn, &keys, KeyReadMode::Forget(None))
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let kept: String = conn.get(keys.idem_record()).await.unwrap();
    assert_eq!(kept, "not ours");
}

/// Only the key's lock holder, with its token, begins a run; a refused begin writes nothing.
async fn only_the_holder_begins(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let holder = won(conn, keys, "holder").await;
    let stranger = FencingToken::new(holder.get() + 1).unwrap();
    let reply = begin(conn, keys, ("stranger", stranger), RUN_AGAIN).await;
    if reply != BeginReply::NotHeld {
        return Err(format!("a caller without the lock got {reply:?}"));
    }
    match read(conn, keys).await.record {
        None => Ok(()),
        Some(record) => Err(format!("a refused begin left {record:?}")),
    }
}

/// A runner whose key was taken over cannot store its result over the newer runner's: an
/// older run never overwrites the record.
async fn a_taken_over_runner_cannot_store(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let old = begun(conn, keys, "old", RUN_AGAIN).await;
    hold_ends(conn, keys).await;
    let new = begun(conn, keys, "new", RUN_AGAIN).await;
    store(conn, keys, "new", new, RunEnd::Done, b"new").await;
    let done = (0, RunEnd::Done);
    let late = finish::<KeyResult>(conn, keys, ("old", old), FINGERPRINT, done, Some(b"old")).await;
    let record = read(conn, keys).await.record.unwrap();
    match late {
        Ok(FinishReply::TakenOver { token })
            if token == new && record.token == new && record.own.result == b"new" =>
        {
            Ok(())
        }
        late => Err(format!(
            "the taken-over runner's finish answered {late:?}; the record is {record:?}"
        )),
    }
}

/// A key whose result is stored is never run again, by any caller, whatever its policy.
async fn a_done_key_is_never_run_again(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let first = begun(conn, keys, "first", RUN_AGAIN).await;
    store(conn, keys, "first", first, RunEnd::Done, b"paid").await;
    hold_ends(conn, keys).await;
    let second = won(conn, keys, "second").await;
    match begin(conn, keys, ("second", second), RUN_AGAIN).await {
        BeginReply::Done(record) if record.token == first && record.own.result == b"paid" => Ok(()),
        other => Err(format!("a duplicate of the done key got {other:?}")),
    }
}

/// A key used again with another fingerprint never runs that request, in any state of the
/// first one, and changes nothing.
async fn a_reused_key_never_runs(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let first = begun(conn, keys, "first", RUN_AGAIN).await;
    store(conn, keys, "first", first, RunEnd::Failed, b"").await;
    hold_ends(conn, keys).await;
    let other = won(conn, keys, "other").await;
    let other_fingerprint = b"refund acct-9 500";
    let reply = try_begin::<KeyResult>(conn, keys, ("other", other), other_fingerprint, RUN_AGAIN)
        .await
        .unwrap();
    let record = read(conn, keys).await.record.unwrap();
    match reply {
        BeginReply::Refused(seen) if seen.token == first && record.token == first => Ok(()),
        other => Err(format!(
            "a reused key answered {other:?}; the record is {record:?}"
        )),
    }
}

contract_checks! {
    /// Each idempotency control breaks exactly the contract check that names it (which holds
    /// on the production scripts: [`the_idempotency_contract_checks_hold`]), each on a fresh
    /// server.
    the_idempotency_contract_checks_hold,
    the_idempotency_scripts_negative_controls_are_caught,
    idempotency_keys;
    only_the_holder_begins => [Control::KeyBeginWithoutOwnerCheck],
    a_taken_over_runner_cannot_store => [Control::KeyResultWithoutFence],
    a_done_key_is_never_run_again => [Control::KeyRerunsDone],
    a_reused_key_never_runs => [Control::KeyIgnoresFingerprint],
}
