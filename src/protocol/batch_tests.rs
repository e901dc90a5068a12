//! The contract of `batch.lua` against a real redis-server: operations run in order, each
//! exactly as its own script runs it, each with its own reply; an operation that fails fails
//! alone and leaves nothing behind; a re-sent batch replays; a malformed list runs nothing; and
//! the negative controls of the scripts a batch is built from break the batch too.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

#[cfg(fencelock_negative_controls)]
use super::lock_tests::assert_controls_caught;
use super::lock_tests::{assert_checks_hold, setup, Check, LEASE, OP_TTL};
use super::*;
use batch::{acquire_outcome, release_outcome, run_batch, Operation};

fn free_keys() -> LockKeys {
    LockKeys::new(b"t:", b"res")
}

fn acquiring(keys: &LockKeys, holder: &str, recorded: bool) -> Operation {
    Operation::acquire(keys, holder, LEASE, OP_TTL, Some("batch"), recorded)
}

fn releasing(keys: &LockKeys, holder: &str, op: &str) -> Operation {
    Operation::release(keys, holder, op, OP_TTL, PubSub::Classic)
}

/// One batch call; each operation's outcome as its typed reply, or its error's text.
async fn batch_of(
    conn: &mut MultiplexedConnection,
    ops: &[&Operation],
) -> Vec<Result<String, String>> {
    let outcomes = run_batch(conn, ops).await.expect("the call as a whole");
    outcomes
        .into_iter()
        .zip(ops)
        .map(|(outcome, op)| {
            let reply = outcome.map_err(|e| e.to_string())?;
            Ok(match op.is_acquire() {
                true => format!("{:?}", acquire_outcome(reply).map_err(|e| e.to_string())?),
                false => format!("{:?}", release_outcome(reply).map_err(|e| e.to_string())?),
            })
        })
        .collect()
}

fn token_in(outcome: &Result<String, String>) -> Option<u64> {
    let text = outcome.as_ref().ok()?;
    let start = text.find("FencingToken(")? + "FencingToken(".len();
    let end = start + text[start..].find(')')?;
    text[start..end].parse().ok()
}

/// Acquisitions and releases in one call see each other in order, a second holder is refused,
/// a non-holder's release changes nothing, the freeing release publishes, a later acquisition
/// gets a greater token, and a re-sent release replays.
fn batched_operations_keep_their_contracts<'a>(
    conn: &'a mut MultiplexedConnection,
    keys: &'a LockKeys,
) -> Checked<'a> {
    Box::pin(async move {
        let mut listener = super::handoff_tests::listener(conn, keys).await;

        let (a1, a2) = (acquiring(keys, "h1", false), acquiring(keys, "h2", false));
        let first = batch_of(conn, &[&a1, &a2]).await;
        let Some(t1) = token_in(&first[0]) else {
            return Err(format!("the first acquisition: {first:?}"));
        };
        if !first[1].as_ref().is_ok_and(|r| r.starts_with("Held")) {
            return Err(format!("a second holder got in: {first:?}"));
        }
        let (r9, r1, a3) = (
            releasing(keys, "h9", "op9"),
            releasing(keys, "h1", "op1"),
            acquiring(keys, "h3", false),
        );
        let second = batch_of(conn, &[&r9, &r1, &a3]).await;
        if second[0] != Ok("NotHeld".into()) {
            return Err(format!("a non-holder's release: {second:?}"));
        }
        if second[1] != Ok("Done { remaining: 0 }".into()) {
            return Err(format!("the holder's release: {second:?}"));
        }
        match token_in(&second[2]) {
            Some(t3) if t3 > t1 => {}
            _ => return Err(format!("the next acquisition after {t1}: {second:?}")),
        }
        let mut messages = listener.on_message();
        if tokio::time::timeout(Duration::from_millis(500), messages.next())
            .await
            .is_err()
        {
            return Err("the freeing release published nothing".into());
        }
        let again = batch_of(conn, &[&r1]).await;
        if again[0] != Ok("Done { remaining: 0 }".into()) {
            return Err(format!("a re-sent release: {again:?}"));
        }
        let fields: HashMap<String, String> = conn.hgetall(&keys.lock).await.unwrap();
        if fields.get("h3").map(String::as_str) != Some("1")
            || fields.get("~label").map(String::as_str) != Some("batch")
            || fields.len() != 3
        {
            return Err(format!("the hash after the batches: {fields:?}"));
        }
        Ok(())
    })
}

/// The checks' result: a future borrowing the connection and the keys.
type Checked<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>;

const CHECKS: [(&str, Check); 1] = [(
    "batched_operations_keep_their_contracts",
    batched_operations_keep_their_contracts,
)];

#[tokio::test]
async fn batched_operations_keep_their_contract() {
    assert_checks_hold(&CHECKS, free_keys).await;
}

/// The controls of `acquire.lua` and `release.lua` break their batched use too: the batch runs
/// their text.
#[cfg(fencelock_negative_controls)]
#[tokio::test]
async fn the_batch_check_catches_the_controls_of_its_scripts() {
    use super::controls::Control;
    let controls = [
        Control::AcquireIgnoresHolder,
        Control::AcquireReusesToken,
        Control::ReleaseWithoutOwnerCheck,
        Control::ReleaseDoesNotPublish,
        Control::RetriesApplyTwice,
    ];
    assert_controls_caught(&controls, &[CHECKS[0]; 5], free_keys).await;
}

/// An operation on a key of another type fails alone, with the typed error its own script
/// gives, and writes nothing; the others in the call apply, once: the same call re-sent
/// (recorded) replays them with the same tokens and issues no new one.
#[tokio::test]
async fn one_bad_operation_fails_alone_and_the_others_apply_once() {
    let (_server, mut conn, _) = setup().await;
    let (a, bad, c) = (
        LockKeys::new(b"t:", b"a"),
        LockKeys::new(b"t:", b"bad"),
        LockKeys::new(b"t:", b"c"),
    );
    let _: () = conn.set(&bad.lock, "not a lock").await.unwrap();
    let ops = [
        acquiring(&a, "h1", true),
        acquiring(&bad, "h2", true),
        acquiring(&c, "h3", true),
    ];
    let refs: Vec<&Operation> = ops.iter().collect();
    let first = batch_of(&mut conn, &refs).await;
    let err = first[1].as_ref().unwrap_err();
    assert!(err.contains("not a fencelock hash"), "{first:?}");
    // Two locks in two slots: two counters, whose tokens are not ordered against each other
    // (with the clock frozen during a script, as on Redis 8 and Valkey, they may be equal).
    let (ta, tc) = (token_in(&first[0]).unwrap(), token_in(&first[2]).unwrap());
    let value: String = conn.get(&bad.lock).await.unwrap();
    assert_eq!(value, "not a lock");
    let written: bool = conn.exists(bad.op("h2")).await.unwrap();
    assert!(!written, "the failed operation left its record");
    let counter: u64 = conn.get(&c.fence).await.unwrap();

    let again = batch_of(&mut conn, &refs).await;
    assert_eq!(token_in(&again[0]), Some(ta), "{again:?}");
    assert_eq!(token_in(&again[2]), Some(tc), "{again:?}");
    assert!(again[1].is_err(), "{again:?}");
    let after: u64 = conn.get(&c.fence).await.unwrap();
    assert_eq!(after, counter, "a replay issued a token");
    for (keys, holder) in [(&a, "h1"), (&c, "h3")] {
        let count: Option<u64> = conn.hget(&keys.lock, holder).await.unwrap();
        assert_eq!(count, Some(1), "applied once");
    }
}

/// A malformed operation list is refused before anything runs.
#[tokio::test]
async fn a_malformed_batch_runs_nothing() {
    let (_server, mut conn, keys) = setup().await;
    let malformed: Result<redis::Value, redis::RedisError> = scripts::production()
        .batch
        .key(&keys.lock)
        .key(&keys.fence)
        .key(keys.op("h1"))
        .arg(2)
        .arg("a")
        .arg(3)
        .arg(4)
        .arg("h1")
        .arg(30_000)
        .arg(10_000)
        .arg(0)
        .invoke_async(&mut conn)
        .await;
    let err = malformed.unwrap_err();
    assert_eq!(err.code(), Some("FENCELOCK_BADARG"), "{err}");
    let left: usize = conn
        .exists(&[keys.lock.clone(), keys.fence.clone()])
        .await
        .unwrap();
    assert_eq!(left, 0, "the first, well-formed operation ran");
}

/// `count` plain locks whose keys share one slot, and so one fence counter and one set of op
/// records: the operations one batch carries on a cluster.
fn locks_in_one_slot(count: usize) -> Vec<LockKeys> {
    let mut locks = vec![LockKeys::new(b"t:", b"slot-0")];
    let mut n = 1;
    while locks.len() < count {
        let keys = LockKeys::new(b"t:", format!("slot-{n}").as_bytes());
        if keys.slot == locks[0].slot {
            locks.push(keys);
        }
        n += 1;
    }
    locks
}

/// The fields of a hash at `key` (an empty map when there is no such key).
async fn fields_of(conn: &mut MultiplexedConnection, key: &[u8]) -> HashMap<String, String> {
    conn.hgetall(key).await.unwrap()
}

/// A subscriber to the release channels of `locks`, on the server `conn` talks to.
async fn subscribed(conn: &mut MultiplexedConnection, locks: &[&LockKeys]) -> redis::aio::PubSub {
    let port: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query_async(conn)
        .await
        .unwrap();
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", port[1])).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    for keys in locks {
        pubsub.subscribe(&keys.lock).await.unwrap();
    }
    pubsub
}

/// The messages `pubsub` received, as (channel, payload), up to a probe published now on
/// `probe_channel` (which `pubsub` listens to): everything published before the probe.
async fn messages_before_probe(
    conn: &mut MultiplexedConnection,
    pubsub: &mut redis::aio::PubSub,
    probe_channel: &[u8],
) -> Vec<(String, String)> {
    let _: () = conn.publish(probe_channel, "probe").await.unwrap();
    let mut messages = pubsub.on_message();
    let mut received = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(2), messages.next())
            .await
            .expect("the probe arrives")
            .expect("the subscription is open");
        let payload: String = message.get_payload().unwrap();
        if payload == "probe" {
            return received;
        }
        received.push((message.get_channel_name().to_owned(), payload));
    }
}

/// The acquisition's typed reply from a batch outcome.
fn acquired(outcome: Result<redis::Value, Error>) -> AcquireReply {
    acquire_outcome(outcome.expect("an acquisition's reply")).expect("a typed reply")
}

/// Whether a batch outcome is the `WRONGTYPE` the server raised (at a `redis.call`) in that
/// operation: typed by its code, its detail the server's own description of the failure.
fn raised_wrongtype(outcome: &Result<redis::Value, Error>) -> Result<(), String> {
    match outcome {
        Err(Error::WrongType { detail }) if detail.contains("wrong kind of value") => Ok(()),
        other => Err(format!("expected the server's WRONGTYPE, got {other:?}")),
    }
}

/// An operation whose script raises at a `redis.call` (a `WRONGTYPE` from the first `GET` of
/// `acquire.lua`, and of `release.lua`, when its op record key holds a hash) is answered with
/// that error alone, and left nothing of its own: no lock, no token, no record written, the
/// foreign values as they were, the held lock still held with its count and nothing
/// published. The other operations of the call apply, once: the same call re-sent replays
/// them with the same tokens, issues no new one, and fails the raising ones again.
#[tokio::test]
async fn an_operation_whose_script_raises_fails_alone_and_the_others_apply_once() {
    let (_server, mut conn, _) = setup().await;
    let locks = locks_in_one_slot(4);
    let (a, x, c, d) = (&locks[0], &locks[1], &locks[2], &locks[3]);
    let Ok(AcquireReply::Acquired {
        token: held_token, ..
    }) = acquire(&mut conn, c, "h3", LEASE, OP_TTL).await
    else {
        panic!("h3 takes the free lock c");
    };
    let _: () = conn.hset(x.op("h2"), "f", "foreign").await.unwrap();
    let _: () = conn.hset(c.op("op3"), "f", "foreign").await.unwrap();
    let mut pubsub = subscribed(&mut conn, &[a, x, c, d]).await;
    let held_before = fields_of(&mut conn, &c.lock).await;

    let ops = [
        acquiring(a, "h1", true),
        acquiring(x, "h2", true),
        releasing(c, "h3", "op3"),
        acquiring(d, "h4", true),
    ];
    let refs: Vec<&Operation> = ops.iter().collect();
    let mut first = run_batch(&mut conn, &refs)
        .await
        .expect("the call as a whole");
    raised_wrongtype(&first[1]).unwrap();
    raised_wrongtype(&first[2]).unwrap();
    let AcquireReply::Acquired {
        token: t1,
        count: 1,
    } = acquired(first.remove(0))
    else {
        panic!("h1's acquisition of the free lock a");
    };
    let AcquireReply::Acquired {
        token: t4,
        count: 1,
    } = acquired(first.remove(2))
    else {
        panic!("h4's acquisition of the free lock d");
    };
    // One slot, one counter: the applied acquisitions took the next two tokens, in order.
    assert!(held_token < t1 && t1 < t4, "{held_token:?} {t1:?} {t4:?}");
    let counter: u64 = conn.get(&a.fence).await.unwrap();
    assert_eq!(counter, t4.get());

    let nothing_of_x: usize = conn.exists(&x.lock).await.unwrap();
    assert_eq!(nothing_of_x, 0, "the raising acquisition took its lock");
    let foreign = HashMap::from([("f".to_owned(), "foreign".to_owned())]);
    assert_eq!(fields_of(&mut conn, &x.op("h2")).await, foreign);
    assert_eq!(fields_of(&mut conn, &c.op("op3")).await, foreign);
    assert_eq!(fields_of(&mut conn, &c.lock).await, held_before);
    let marked: bool = conn.exists(c.op("h3")).await.unwrap();
    assert!(!marked, "the raising release marked its holder's record");
    let lease_left: i64 = conn.pttl(&c.lock).await.unwrap();
    assert!(lease_left > 0, "the held lock kept its lease: {lease_left}");
    let recorded: Vec<Option<String>> = conn.mget(&[a.op("h1"), d.op("h4")]).await.unwrap();
    assert_eq!(recorded, [Some("a".to_owned()), Some("a".to_owned())]);
    assert_eq!(
        messages_before_probe(&mut conn, &mut pubsub, &a.lock).await,
        [],
        "nothing was released"
    );

    let mut again = run_batch(&mut conn, &refs)
        .await
        .expect("the call as a whole");
    raised_wrongtype(&again[1]).unwrap();
    raised_wrongtype(&again[2]).unwrap();
    assert_eq!(
        acquired(again.remove(0)),
        AcquireReply::Acquired {
            token: t1,
            count: 1
        }
    );
    assert_eq!(
        acquired(again.remove(2)),
        AcquireReply::Acquired {
            token: t4,
            count: 1
        }
    );
    let after: u64 = conn.get(&a.fence).await.unwrap();
    assert_eq!(after, counter, "a replay issued a token");
    for (keys, holder) in [(a, "h1"), (d, "h4")] {
        let count: Option<u64> = conn.hget(&keys.lock, holder).await.unwrap();
        assert_eq!(count, Some(1), "applied once");
    }
    assert_eq!(fields_of(&mut conn, &c.lock).await, held_before);
    let nothing_of_x: usize = conn.exists(&x.lock).await.unwrap();
    assert_eq!(nothing_of_x, 0);
    assert_eq!(
        messages_before_probe(&mut conn, &mut pubsub, &a.lock).await,
        []
    );
}

/// In one call, the inner release of a re-entered lock L leaves its holder's other entry (L
/// stays held, count 1, with its token and lease, and nothing is published on it), while
/// another holder's final release frees M and publishes on M once; an acquisition after them
/// in the same call finds L held by the entry left. Re-sent, the call replays: the same
/// replies, no entry taken twice, nothing published again.
#[tokio::test]
async fn an_inner_release_and_a_final_release_share_a_call() {
    let (_server, mut conn, _) = setup().await;
    let locks = locks_in_one_slot(2);
    let (l, m) = (&locks[0], &locks[1]);
    let Ok(AcquireReply::Acquired { token, .. }) = acquire(&mut conn, l, "A", LEASE, OP_TTL).await
    else {
        panic!("A takes the free lock L");
    };
    match reenter(&mut conn, l, "A", "A:in", OP_TTL).await.unwrap() {
        EnterReply::Entered { count: 2, .. } => {}
        other => panic!("A enters L again: {other:?}"),
    }
    let Ok(AcquireReply::Acquired { .. }) = acquire(&mut conn, m, "B", LEASE, OP_TTL).await else {
        panic!("B takes the free lock M");
    };
    let mut pubsub = subscribed(&mut conn, &[l, m]).await;

    let ops = [
        releasing(l, "A", "A:out1"),
        releasing(m, "B", "B:out"),
        acquiring(l, "C", false),
    ];
    let refs: Vec<&Operation> = ops.iter().collect();
    for send in ["first", "re-sent"] {
        let replies = batch_of(&mut conn, &refs).await;
        assert_eq!(
            replies[..2],
            [
                Ok("Done { remaining: 1 }".to_owned()),
                Ok("Done { remaining: 0 }".to_owned())
            ],
            "{send}: {replies:?}"
        );
        assert!(
            replies[2].as_ref().is_ok_and(|r| r.starts_with("Held")),
            "{send}: L is held by A's remaining entry: {replies:?}"
        );
        let fields = fields_of(&mut conn, &l.lock).await;
        let expected = HashMap::from([
            ("A".to_owned(), "1".to_owned()),
            ("~token".to_owned(), token.get().to_string()),
        ]);
        assert_eq!(fields, expected, "{send}: L after the call");
        let lease_left: i64 = conn.pttl(&l.lock).await.unwrap();
        assert!(lease_left > 0, "{send}: L kept its lease: {lease_left}");
        let m_left: usize = conn.exists(&m.lock).await.unwrap();
        assert_eq!(m_left, 0, "{send}: M is free");
        let records: Vec<Option<String>> = conn.mget(&[l.op("A:out1"), m.op("B")]).await.unwrap();
        assert_eq!(
            records,
            [Some("1".to_owned()), Some("r:B:out".to_owned())],
            "{send}: the inner release's record, the final release's mark"
        );
        let published = messages_before_probe(&mut conn, &mut pubsub, &l.lock).await;
        let expected: Vec<(String, String)> = match send {
            "first" => vec![(
                String::from_utf8(m.lock.clone()).unwrap(),
                "released".to_owned(),
            )],
            _ => vec![],
        };
        assert_eq!(published, expected, "{send}: what was published");
    }
}
