//! The idempotency-key scripts' contracts (`idem_begin.lua`, `idem_finish.lua`,
//! `idem_read.lua`) against a real redis-server: who may begin a run, what a duplicate is
//! answered, what a dead or failed runner's key becomes, that a key is never run for another
//! fingerprint, and that a result is stored fenced by its token.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

#[cfg(fencelock_negative_controls)]
use super::lock_tests::assert_controls_caught;
use super::lock_tests::{assert_checks_hold, Check, LEASE, OP_TTL};
use super::*;

const RETENTION: Duration = Duration::from_secs(60);
const FINGERPRINT: &[u8] = b"charge acct-9 500";

/// The keys of a key nobody ran.
fn free_keys() -> LockKeys {
    LockKeys::idempotency(b"t:", b"payments:key-1")
}

/// Takes the key's free lock for `holder`.
async fn won(conn: &mut MultiplexedConnection, keys: &LockKeys, holder: &str) -> FencingToken {
    match acquire(conn, keys, holder, LEASE, OP_TTL).await.unwrap() {
        AcquireReply::Acquired { token, .. } => token,
        other => panic!("the free key's lock answered {other:?}"),
    }
}

fn args<'a>(holder: &'a str, token: FencingToken, fingerprint: &'a [u8]) -> KeyArgs<'a> {
    KeyArgs {
        holder,
        token,
        fingerprint,
        retention: RETENTION,
    }
}

async fn begin(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    token: FencingToken,
    on_death: RunnerDeathArg,
) -> KeyBeginReply {
    idem_begin(conn, keys, args(holder, token, FINGERPRINT), on_death)
        .await
        .unwrap()
}

async fn store(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    holder: &str,
    token: FencingToken,
    finish: KeyFinish<'_>,
) -> Result<FinishReply, Error> {
    idem_finish(conn, keys, args(holder, token, FINGERPRINT), 0, finish).await
}

async fn read(conn: &mut MultiplexedConnection, keys: &LockKeys) -> KeyRead {
    idem_read(conn, keys, KeyReadMode::Read).await.unwrap()
}

/// Frees the key's lock as a lost hold would (the lease ran out, the process died).
async fn hold_ends(conn: &mut MultiplexedConnection, keys: &LockKeys) {
    let _: () = conn.del(&keys.lock).await.unwrap();
}

#[tokio::test]
async fn a_run_begins_stores_its_result_and_answers_duplicates() {
    let (_server, mut conn, _) = super::lock_tests::setup().await;
    let keys = free_keys();
    assert_eq!(
        read(&mut conn, &keys).await,
        KeyRead {
            record: None,
            lock_token: None,
            lease_left: None
        }
    );
    let token = won(&mut conn, &keys, "a").await;
    let KeyBeginReply::Begun {
        took_over: None,
        started_ms,
    } = begin(&mut conn, &keys, "a", token, RunnerDeathArg::RunAgain).await
    else {
        panic!("a free key did not begin");
    };
    // A re-sent begin is the same begin.
    assert_eq!(
        begin(&mut conn, &keys, "a", token, RunnerDeathArg::RunAgain).await,
        KeyBeginReply::Begun {
            took_over: None,
            started_ms
        }
    );
    let running = read(&mut conn, &keys).await;
    let record = running.record.clone().unwrap();
    assert_eq!((record.runner.as_str(), record.token), ("a", token));
    assert_eq!(record.fingerprint, FINGERPRINT);
    assert_eq!(
        (record.finished_ms, record.result.as_slice()),
        (None, &b""[..])
    );
    assert_eq!(running.lock_token, Some(token), "the runner holds the key");
    let ttl: i64 = conn.pttl(keys.idem_record()).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "the record expires: {ttl}");

    // A result of any bytes, stored once; a re-sent finish answers the first one's time.
    let result = b"\x00ok\xff\r\n".to_vec();
    let FinishReply::Done { finished_ms } =
        store(&mut conn, &keys, "a", token, KeyFinish::Done(&result))
            .await
            .unwrap()
    else {
        panic!("the runner's finish was refused");
    };
    assert_eq!(
        store(&mut conn, &keys, "a", token, KeyFinish::Done(&result))
            .await
            .unwrap(),
        FinishReply::Done { finished_ms }
    );
    hold_ends(&mut conn, &keys).await;
    let done = read(&mut conn, &keys).await.record.unwrap();
    assert_eq!(done.finished_ms, Some(finished_ms));
    assert_eq!(
        (done.result.clone(), done.is_final_failure),
        (result.clone(), false)
    );

    // A duplicate is answered with the stored result, whatever its policy.
    for (holder, policy) in [
        ("dup-1", RunnerDeathArg::RunAgain),
        ("dup-2", RunnerDeathArg::GiveUp),
    ] {
        let dup = won(&mut conn, &keys, holder).await;
        match begin(&mut conn, &keys, holder, dup, policy).await {
            KeyBeginReply::Done(record) => assert_eq!(record, done),
            other => panic!("a duplicate of a done key got {other:?}"),
        }
        hold_ends(&mut conn, &keys).await;
    }
}

#[tokio::test]
async fn a_final_failure_is_stored_and_a_retryable_one_runs_again() {
    let (_server, mut conn, _) = super::lock_tests::setup().await;
    let keys = free_keys();
    // Retryable: the record says failed, the next caller takes over whatever the policy.
    let first = won(&mut conn, &keys, "first").await;
    begin(&mut conn, &keys, "first", first, RunnerDeathArg::GiveUp).await;
    store(&mut conn, &keys, "first", first, KeyFinish::Failed)
        .await
        .unwrap();
    let failed = read(&mut conn, &keys).await.record.unwrap();
    assert!(failed.failed_ms.is_some() && failed.finished_ms.is_none());
    hold_ends(&mut conn, &keys).await;
    let second = won(&mut conn, &keys, "second").await;
    match begin(&mut conn, &keys, "second", second, RunnerDeathArg::GiveUp).await {
        KeyBeginReply::Begun {
            took_over: Some(old),
            ..
        } => assert_eq!(old, first),
        other => panic!("the retry of a failed run got {other:?}"),
    }
    // Final: stored like a result, marked.
    store(
        &mut conn,
        &keys,
        "second",
        second,
        KeyFinish::Final(b"declined"),
    )
    .await
    .unwrap();
    let stored = read(&mut conn, &keys).await.record.unwrap();
    assert!(stored.is_final_failure && stored.failed_ms.is_none());
    assert_eq!(stored.result, b"declined");
}

#[tokio::test]
async fn a_dead_runners_key_is_run_again_or_given_up_by_policy() {
    let (_server, mut conn, _) = super::lock_tests::setup().await;
    let keys = free_keys();
    let dead = won(&mut conn, &keys, "dead").await;
    begin(&mut conn, &keys, "dead", dead, RunnerDeathArg::RunAgain).await;
    hold_ends(&mut conn, &keys).await;
    let careful = won(&mut conn, &keys, "careful").await;
    match begin(&mut conn, &keys, "careful", careful, RunnerDeathArg::GiveUp).await {
        KeyBeginReply::Abandoned(record) => assert_eq!(record.token, dead),
        other => panic!("a dead runner's key under GiveUp got {other:?}"),
    }
    hold_ends(&mut conn, &keys).await;
    let eager = won(&mut conn, &keys, "eager").await;
    match begin(&mut conn, &keys, "eager", eager, RunnerDeathArg::RunAgain).await {
        KeyBeginReply::Begun {
            took_over: Some(old),
            ..
        } => assert_eq!(old, dead),
        other => panic!("a dead runner's key under RunAgain got {other:?}"),
    }
}

#[tokio::test]
async fn forget_deletes_only_a_record_nobody_holds() {
    let (_server, mut conn, _) = super::lock_tests::setup().await;
    let keys = free_keys();
    let token = won(&mut conn, &keys, "a").await;
    begin(&mut conn, &keys, "a", token, RunnerDeathArg::RunAgain).await;
    let held = idem_read(&mut conn, &keys, KeyReadMode::Forget)
        .await
        .unwrap();
    assert_eq!(held.lock_token, Some(token));
    assert!(
        read(&mut conn, &keys).await.record.is_some(),
        "kept under a holder"
    );
    hold_ends(&mut conn, &keys).await;
    let forgotten = idem_read(&mut conn, &keys, KeyReadMode::Forget)
        .await
        .unwrap();
    assert_eq!(forgotten.record.map(|r| r.token), Some(token));
    assert_eq!(read(&mut conn, &keys).await.record, None);
}

#[tokio::test]
async fn foreign_data_is_a_typed_error_and_stays_untouched() {
    let (_server, mut conn, _) = super::lock_tests::setup().await;
    let keys = free_keys();
    let _: () = conn.set(keys.idem_record(), "not ours").await.unwrap();
    let token = won(&mut conn, &keys, "a").await;
    let err = idem_begin(
        &mut conn,
        &keys,
        args("a", token, FINGERPRINT),
        RunnerDeathArg::RunAgain,
    )
    .await
    .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let err = store(&mut conn, &keys, "a", token, KeyFinish::Done(b"x"))
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let err = idem_read(&mut conn, &keys, KeyReadMode::Forget)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let kept: String = conn.get(keys.idem_record()).await.unwrap();
    assert_eq!(kept, "not ours");
}

/// Only the key's lock holder, with its token, begins a run; a refused begin writes nothing.
async fn only_the_holder_begins(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> Result<(), String> {
    let holder = won(conn, keys, "holder").await;
    let stranger = FencingToken::new(holder.get() + 1).unwrap();
    let reply = begin(conn, keys, "stranger", stranger, RunnerDeathArg::RunAgain).await;
    if reply != KeyBeginReply::NotHeld {
        return Err(format!("a caller without the lock got {reply:?}"));
    }
    match read(conn, keys).await.record {
        None => Ok(()),
        Some(record) => Err(format!("a refused begin left {record:?}")),
    }
}

/// A runner whose key was taken over cannot store its result over the newer runner's: an
/// older run never overwrites the record.
async fn a_taken_over_runner_cannot_store(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> Result<(), String> {
    let old = won(conn, keys, "old").await;
    begin(conn, keys, "old", old, RunnerDeathArg::RunAgain).await;
    hold_ends(conn, keys).await;
    let new = won(conn, keys, "new").await;
    begin(conn, keys, "new", new, RunnerDeathArg::RunAgain).await;
    store(conn, keys, "new", new, KeyFinish::Done(b"new"))
        .await
        .unwrap();
    let late = store(conn, keys, "old", old, KeyFinish::Done(b"old")).await;
    let record = read(conn, keys).await.record.unwrap();
    match late {
        Ok(FinishReply::TakenOver { token })
            if token == new && record.token == new && record.result == b"new" =>
        {
            Ok(())
        }
        late => Err(format!(
            "the taken-over runner's finish answered {late:?}; the record is {record:?}"
        )),
    }
}

/// A key whose result is stored is never run again, by any caller, whatever its policy.
async fn a_done_key_is_never_run_again(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> Result<(), String> {
    let first = won(conn, keys, "first").await;
    begin(conn, keys, "first", first, RunnerDeathArg::RunAgain).await;
    store(conn, keys, "first", first, KeyFinish::Done(b"paid"))
        .await
        .unwrap();
    hold_ends(conn, keys).await;
    let second = won(conn, keys, "second").await;
    match begin(conn, keys, "second", second, RunnerDeathArg::RunAgain).await {
        KeyBeginReply::Done(record) if record.token == first && record.result == b"paid" => Ok(()),
        other => Err(format!("a duplicate of the done key got {other:?}")),
    }
}

/// A key used again with another fingerprint never runs that request, in any state of the
/// first one, and changes nothing.
async fn a_reused_key_never_runs(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> Result<(), String> {
    let first = won(conn, keys, "first").await;
    begin(conn, keys, "first", first, RunnerDeathArg::RunAgain).await;
    store(conn, keys, "first", first, KeyFinish::Failed)
        .await
        .unwrap();
    hold_ends(conn, keys).await;
    let other = won(conn, keys, "other").await;
    let reply = idem_begin(
        conn,
        keys,
        args("other", other, b"refund acct-9 500"),
        RunnerDeathArg::RunAgain,
    )
    .await
    .unwrap();
    let record = read(conn, keys).await.record.unwrap();
    match reply {
        KeyBeginReply::OtherFingerprint(seen) if seen.token == first && record.token == first => {
            Ok(())
        }
        other => Err(format!(
            "a reused key answered {other:?}; the record is {record:?}"
        )),
    }
}

/// The contract checks above, by name; each is also the check of one negative control.
const CHECKS: [(&str, Check); 4] = [
    ("only_the_holder_begins", |c, k| {
        Box::pin(only_the_holder_begins(c, k))
    }),
    ("a_taken_over_runner_cannot_store", |c, k| {
        Box::pin(a_taken_over_runner_cannot_store(c, k))
    }),
    ("a_done_key_is_never_run_again", |c, k| {
        Box::pin(a_done_key_is_never_run_again(c, k))
    }),
    ("a_reused_key_never_runs", |c, k| {
        Box::pin(a_reused_key_never_runs(c, k))
    }),
];

#[tokio::test]
async fn the_idempotency_contract_checks_hold() {
    assert_checks_hold(&CHECKS, free_keys).await;
}

/// Each idempotency control breaks exactly the contract check next to it (which holds on the
/// production scripts: [`the_idempotency_contract_checks_hold`]), each on a fresh server.
#[cfg(fencelock_negative_controls)]
#[tokio::test]
async fn the_idempotency_scripts_negative_controls_are_caught() {
    use super::controls::Control;
    let controls = [
        Control::KeyBeginWithoutOwnerCheck,
        Control::KeyResultWithoutFence,
        Control::KeyRerunsDone,
        Control::KeyIgnoresFingerprint,
    ];
    assert_controls_caught(&controls, &CHECKS, free_keys).await;
}
