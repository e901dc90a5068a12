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
use super::tests::assert_controls_caught;
use super::tests::{assert_checks_hold, setup, Check, LEASE, OP_TTL};
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
