//! The job scripts' contracts (`job_begin.lua`, `job_finish.lua`, `job_read.lua`) against a
//! real redis-server: who may begin a tick, which ticks count as the same, what a dead
//! runner's tick becomes, and that a finish is fenced by its token.

use std::time::Duration;

use redis::AsyncCommands;

use super::contract_tests::{contract_checks, job_keys, setup_for, Checked, Conn, LEASE};
use super::run_record_tests::{finish, hold_ends, try_begin, won, GIVE_UP, RUN_AGAIN};
use super::*;

const PERIOD: Duration = Duration::from_secs(10);
/// A tick as an instance saw it (ms since the epoch).
const TICK: u64 = 1_800_000_000_000;

/// `job_begin.lua` for `holder` with `token`, for the tick `tick_ms`.
async fn try_begin_tick(
    conn: &mut Conn,
    keys: &LockKeys,
    (holder, token): (&str, FencingToken),
    tick_ms: u64,
    on_death: bool,
) -> Result<BeginReply<Tick>, Error> {
    let own = (tick_ms, millis(PERIOD));
    try_begin(conn, keys, (holder, token), own, on_death).await
}

async fn begin(
    conn: &mut Conn,
    keys: &LockKeys,
    holder: &str,
    token: FencingToken,
    tick_ms: u64,
    on_death: bool,
) -> BeginReply<Tick> {
    try_begin_tick(conn, keys, (holder, token), tick_ms, on_death)
        .await
        .unwrap()
}

/// `job_finish.lua` recording the tick `tick_ms` of `runner`, begun at `started_ms`, done.
async fn finish_done(
    conn: &mut Conn,
    keys: &LockKeys,
    runner: (&str, FencingToken),
    tick_ms: u64,
    started_ms: u64,
) -> Result<FinishReply, Error> {
    finish::<Tick>(
        conn,
        keys,
        runner,
        tick_ms,
        (started_ms, RunEnd::Done),
        None,
    )
    .await
}

/// `holder` wins the job's lock and begins the tick `TICK`, giving a dead runner's tick up:
/// its token and the tick's start.
async fn begun_tick(conn: &mut Conn, keys: &LockKeys, holder: &str) -> (FencingToken, u64) {
    let token = won(conn, keys, holder).await;
    let BeginReply::Begun { started_ms, .. } =
        begin(conn, keys, holder, token, TICK, GIVE_UP).await
    else {
        panic!("a free tick was not begun")
    };
    (token, started_ms)
}

fn begun(reply: &BeginReply<Tick>) -> bool {
    matches!(reply, BeginReply::Begun { .. })
}

#[tokio::test]
async fn a_run_begins_finishes_and_reads_back() {
    let (_server, mut conn, keys) = setup_for(job_keys()).await;
    assert_eq!(
        job_read(&mut conn, &keys).await.unwrap(),
        JobRead {
            record: None,
            lock_token: None,
            lease_left: None
        }
    );

    let token = won(&mut conn, &keys, "a").await;
    let reply = begin(&mut conn, &keys, "a", token, TICK, GIVE_UP).await;
    let BeginReply::Begun {
        took_over: None,
        started_ms,
    } = reply
    else {
        panic!("a free tick answered {reply:?}")
    };
    // A re-sent begin is the same begin.
    let again = begin(&mut conn, &keys, "a", token, TICK, GIVE_UP).await;
    assert_eq!(
        again,
        BeginReply::Begun {
            took_over: None,
            started_ms
        }
    );
    let running = job_read(&mut conn, &keys).await.unwrap();
    let record = running.record.clone().unwrap();
    assert_eq!((record.own.tick_ms, record.runner.as_str()), (TICK, "a"));
    assert_eq!((record.token, record.finished_ms), (token, None));
    assert_eq!(running.lock_token, Some(token), "the runner holds the lock");
    assert!(matches!(running.lease_left, Some(Some(left)) if left <= LEASE));
    let ttl: i64 = conn.pttl(keys.job_record()).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "the record expires: {ttl}");

    let done = finish_done(&mut conn, &keys, ("a", token), TICK, started_ms)
        .await
        .unwrap();
    let FinishReply::Done { finished_ms } = done else {
        panic!("the runner's finish answered {done:?}")
    };
    assert!(finished_ms >= started_ms);
    let ttl: i64 = conn.pttl(keys.job_record()).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "the done record expires: {ttl}");
    // A re-sent finish, later, answers the first one's time and keeps it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let again = finish_done(&mut conn, &keys, ("a", token), TICK, started_ms).await;
    assert_eq!(again.unwrap(), done);
    let read = job_read(&mut conn, &keys).await.unwrap().record.unwrap();
    assert_eq!(read.finished_ms, Some(finished_ms));
    assert_eq!(read.started_ms, started_ms);

    // Foreign data at either key is refused and left alone.
    let _: () = conn.set(keys.job_record(), "foreign").await.unwrap();
    let err = try_begin_tick(&mut conn, &keys, ("a", token), TICK, GIVE_UP)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let err = finish_done(&mut conn, &keys, ("a", token), TICK, started_ms)
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    assert!(job_read(&mut conn, &keys)
        .await
        .unwrap_err()
        .is_wrong_type());
    let value: String = conn.get(keys.job_record()).await.unwrap();
    assert_eq!(value, "foreign");
    let _: () = conn.del(keys.job_record()).await.unwrap();
    let _: () = conn.set(&keys.lock, "foreign").await.unwrap();
    assert!(job_read(&mut conn, &keys)
        .await
        .unwrap_err()
        .is_wrong_type());
}

#[tokio::test]
async fn views_less_than_half_a_period_apart_are_one_tick() {
    let (_server, mut conn, keys) = setup_for(job_keys()).await;
    let half = u64::try_from(PERIOD.as_millis()).unwrap() / 2;
    let first = won(&mut conn, &keys, "a").await;
    assert!(begun(
        &begin(&mut conn, &keys, "a", first, TICK, GIVE_UP).await
    ));
    finish_done(&mut conn, &keys, ("a", first), TICK, 0)
        .await
        .unwrap();
    hold_ends(&mut conn, &keys).await;
    // Both sides of the first view, up to a millisecond short of half a period: done.
    for (i, view) in [TICK - half + 1, TICK + half - 1].into_iter().enumerate() {
        let holder = format!("b{i}");
        let token = won(&mut conn, &keys, &holder).await;
        let reply = begin(&mut conn, &keys, &holder, token, view, GIVE_UP).await;
        assert!(matches!(reply, BeginReply::Done(_)), "{view}: {reply:?}");
        hold_ends(&mut conn, &keys).await;
    }
    // Half a period behind: an older tick, past. Half a period ahead: the next tick.
    let token = won(&mut conn, &keys, "c").await;
    let reply = begin(&mut conn, &keys, "c", token, TICK - half, GIVE_UP).await;
    assert!(matches!(reply, BeginReply::Refused(_)), "{reply:?}");
    let reply = begin(&mut conn, &keys, "c", token, TICK + half, GIVE_UP).await;
    assert!(begun(&reply), "{reply:?}");
}

#[tokio::test]
async fn a_dead_runners_tick_is_given_up_or_taken_over_as_the_policy_says() {
    let (_server, mut conn, keys) = setup_for(job_keys()).await;
    let (dead, started_ms) = begun_tick(&mut conn, &keys, "dead").await;
    hold_ends(&mut conn, &keys).await;

    let next = won(&mut conn, &keys, "next").await;
    let reply = begin(&mut conn, &keys, "next", next, TICK + 1, GIVE_UP).await;
    match reply {
        BeginReply::Abandoned(record) => assert_eq!(
            (record.runner.as_str(), record.token, record.finished_ms),
            ("dead", dead, None)
        ),
        other => panic!("a dead runner's tick under give-up answered {other:?}"),
    }
    // Sent twice, as a begin whose reply was lost is: the re-send still says whose run it took
    // over.
    for _ in 0..2 {
        let reply = begin(&mut conn, &keys, "next", next, TICK + 1, RUN_AGAIN).await;
        assert!(
            matches!(reply, BeginReply::Begun { took_over: Some(t), .. } if t == dead),
            "{reply:?}"
        );
    }
    // The dead runner wakes up and finishes: refused, the record stays the new runner's.
    let late = finish_done(&mut conn, &keys, ("dead", dead), TICK, started_ms).await;
    assert_eq!(late.unwrap(), FinishReply::TakenOver { token: next });
    let record = job_read(&mut conn, &keys).await.unwrap().record.unwrap();
    assert_eq!((record.runner.as_str(), record.token), ("next", next));
    assert_eq!(record.finished_ms, None);
}

/// A begin whose reply was lost, re-sent after the caller's hold ended: answered "not held"
/// (its caller runs nothing), and its own record left to a retry, so the next runner takes the
/// tick over even under give-up instead of taking it for a dead runner's.
#[tokio::test]
async fn a_begin_re_sent_after_its_hold_ended_leaves_the_tick_to_a_retry() {
    let (_server, mut conn, keys) = setup_for(job_keys()).await;
    let first = won(&mut conn, &keys, "first").await;
    let reply = begin(&mut conn, &keys, "first", first, TICK, GIVE_UP).await;
    assert!(matches!(reply, BeginReply::Begun { .. }), "{reply:?}");
    hold_ends(&mut conn, &keys).await;
    let resent = begin(&mut conn, &keys, "first", first, TICK, GIVE_UP).await;
    assert_eq!(resent, BeginReply::NotHeld);
    let next = won(&mut conn, &keys, "next").await;
    let reply = begin(&mut conn, &keys, "next", next, TICK, GIVE_UP).await;
    assert!(
        matches!(reply, BeginReply::Begun { took_over: Some(t), .. } if t == first),
        "{reply:?}"
    );
}

#[tokio::test]
async fn a_finish_whose_record_expired_records_the_tick_again() {
    let (_server, mut conn, keys) = setup_for(job_keys()).await;
    let (token, started_ms) = begun_tick(&mut conn, &keys, "a").await;
    let _: () = conn.del(keys.job_record()).await.unwrap();
    let done = finish_done(&mut conn, &keys, ("a", token), TICK, started_ms).await;
    assert!(matches!(done.unwrap(), FinishReply::Done { .. }));
    let record = job_read(&mut conn, &keys).await.unwrap().record.unwrap();
    assert_eq!(
        (record.own.tick_ms, record.token, record.started_ms),
        (TICK, token, started_ms)
    );
    assert!(record.finished_ms.is_some());
}

#[tokio::test]
async fn a_record_with_a_newer_token_than_the_holders_is_left_alone() {
    // The fence counter went back (restored from an old backup, say): the holder's token is
    // older than the record's. Nothing of the record is overwritten.
    let (_server, mut conn, keys) = setup_for(job_keys()).await;
    let token = won(&mut conn, &keys, "holder").await;
    let newer = token.get() + 1_000;
    let record: [(&str, String); 4] = [
        ("tick", (TICK - 20_000).to_string()),
        ("runner", "future".into()),
        ("token", newer.to_string()),
        ("started", "5".into()),
    ];
    let _: () = conn
        .hset_multiple(keys.job_record(), &record)
        .await
        .unwrap();
    for policy in [GIVE_UP, RUN_AGAIN] {
        match begin(&mut conn, &keys, "holder", token, TICK, policy).await {
            BeginReply::Newer(record) => {
                assert_eq!(
                    (record.token.get(), record.runner.as_str()),
                    (newer, "future")
                );
            }
            other => panic!("a begin under a newer record answered {other:?}"),
        }
    }
    let read = job_read(&mut conn, &keys).await.unwrap().record.unwrap();
    assert_eq!((read.token.get(), read.own.tick_ms), (newer, TICK - 20_000));
}

/// Only the job's lock holder, with its own token, begins a tick; anyone else changes nothing.
async fn only_the_holder_begins(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let token = won(conn, keys, "holder").await;
    let other = FencingToken::new(token.get() + 1).unwrap();
    for (holder, token) in [("intruder", token), ("holder", other)] {
        let reply = begin(conn, keys, holder, token, TICK, GIVE_UP).await;
        if reply != BeginReply::NotHeld {
            return Err(format!("{holder} with {token} began: {reply:?}"));
        }
    }
    match job_read(conn, keys).await.unwrap().record {
        None => Ok(()),
        Some(record) => Err(format!("a refused begin left {record:?}")),
    }
}

/// A runner whose tick was taken over cannot record it done over the newer runner.
async fn a_taken_over_runner_cannot_finish(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let old = won(conn, keys, "old").await;
    begin(conn, keys, "old", old, TICK, RUN_AGAIN).await;
    hold_ends(conn, keys).await;
    let new = won(conn, keys, "new").await;
    begin(conn, keys, "new", new, TICK, RUN_AGAIN).await;
    let late = finish_done(conn, keys, ("old", old), TICK, 0).await;
    let record = job_read(conn, keys).await.unwrap().record.unwrap();
    match late {
        Ok(FinishReply::TakenOver { token }) if token == new && record.token == new => Ok(()),
        late => Err(format!(
            "the taken-over runner's finish answered {late:?}; the record is {record:?}"
        )),
    }
}

/// A tick recorded done is never begun again, by any instance, whatever its policy.
async fn a_done_tick_is_never_run_again(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let first = won(conn, keys, "first").await;
    begin(conn, keys, "first", first, TICK, RUN_AGAIN).await;
    finish_done(conn, keys, ("first", first), TICK, 0)
        .await
        .unwrap();
    hold_ends(conn, keys).await;
    let second = won(conn, keys, "second").await;
    match begin(conn, keys, "second", second, TICK + 2000, RUN_AGAIN).await {
        BeginReply::Done(record) if record.token == first => Ok(()),
        other => Err(format!("a second instance for the done tick got {other:?}")),
    }
}

/// A tick half a period or more older than the newest one begun is never begun.
async fn an_older_tick_is_never_begun(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let newer = won(conn, keys, "newer").await;
    begin(conn, keys, "newer", newer, TICK + 10_000, GIVE_UP).await;
    finish_done(conn, keys, ("newer", newer), TICK + 10_000, 0)
        .await
        .unwrap();
    hold_ends(conn, keys).await;
    let late = won(conn, keys, "late").await;
    match begin(conn, keys, "late", late, TICK, GIVE_UP).await {
        BeginReply::Refused(record) if record.token == newer => Ok(()),
        other => Err(format!("a call for the older tick got {other:?}")),
    }
}

/// A run that failed and left its tick to a retry is taken over by the next caller for the
/// same tick, under either death policy, with a newer token; the failed runner's late finish
/// is then refused. A tick recorded done after a failure is never run again.
async fn a_failed_tick_is_run_again(conn: &mut Conn, keys: &LockKeys) -> Checked {
    let failed = won(conn, keys, "failed").await;
    begin(conn, keys, "failed", failed, TICK, GIVE_UP).await;
    let recorded = finish::<Tick>(
        conn,
        keys,
        ("failed", failed),
        TICK,
        (0, RunEnd::Failed),
        None,
    )
    .await
    .unwrap();
    if !matches!(recorded, FinishReply::Done { .. }) {
        return Err(format!("recording the failure answered {recorded:?}"));
    }
    let record = job_read(conn, keys).await.unwrap().record;
    if record
        .as_ref()
        .is_none_or(|r| r.failed_ms.is_none() || r.finished_ms.is_some())
    {
        return Err(format!("the failed run's record: {record:?}"));
    }
    hold_ends(conn, keys).await;
    let retry = won(conn, keys, "retry").await;
    match begin(conn, keys, "retry", retry, TICK + 1_000, GIVE_UP).await {
        BeginReply::Begun {
            took_over: Some(old),
            ..
        } if old == failed => {}
        other => return Err(format!("the failed tick's retry answered {other:?}")),
    }
    let late = finish_done(conn, keys, ("failed", failed), TICK, 0).await;
    if !matches!(late, Ok(FinishReply::TakenOver { token }) if token == retry) {
        return Err(format!("the failed runner's late finish answered {late:?}"));
    }
    Ok(())
}

contract_checks! {
    /// Each job control breaks exactly the contract check that names it (which holds on the
    /// production scripts: [`the_job_contract_checks_hold`]), each on a fresh server.
    the_job_contract_checks_hold, the_job_scripts_negative_controls_are_caught, job_keys;
    only_the_holder_begins => [Control::JobBeginWithoutOwnerCheck],
    a_taken_over_runner_cannot_finish => [Control::JobFinishWithoutFence],
    a_done_tick_is_never_run_again => [Control::JobRerunsDoneTick],
    an_older_tick_is_never_begun => [Control::JobRunsOlderTick],
    a_failed_tick_is_run_again => [Control::JobGivesUpFailedTick],
}
