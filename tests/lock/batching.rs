//! Many operations per script call (`batch.lua`, `engine::batch`): the acquisitions and
//! releases of one client that meet on the way to one server (on a cluster, one hash slot)
//! ride one call, and each keeps its own semantics: one bad operation fails alone; operations
//! dropped while queued or on the wire leave nothing held; a call whose reply is lost is
//! re-sent across a reconnect and applied once.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::cancel::CancelPoints;
use crate::common::deadline::HANDOFF;
use crate::common::{eventually, key_slot_of_lock, Env, Fixture};
use fencelock::{LockClient, LockGuard};
use fencelock_testing::{Direction, FaultProxy};

const LONG: Duration = Duration::from_secs(30);

/// `groups` × `per_group` lock names, the names of each group in one hash slot and the groups
/// in distinct slots: on a cluster, operations on one group can share calls, and a call that
/// mixed groups would be refused by the server (`CROSSSLOT`), failing its operations.
fn names_by_slot(groups: usize, per_group: usize) -> Vec<String> {
    let mut by_slot: HashMap<u16, Vec<String>> = HashMap::new();
    let mut full: Vec<u16> = Vec::new();
    for i in 0.. {
        let name = format!("batched-{i}");
        let slot = key_slot_of_lock(&name);
        let group = by_slot.entry(slot).or_default();
        group.push(name);
        if group.len() == per_group {
            full.push(slot);
            if full.len() == groups {
                break;
            }
        }
    }
    full.iter()
        .flat_map(|slot| by_slot.remove(slot).unwrap())
        .collect()
}

on_topologies_multi_thread! {
    /// 64 tasks of one client, each on its own lock, take and release it 20 times: every
    /// acquisition gets a greater token than the one before on its lock, every release
    /// succeeds, nothing is left held, and the operations took fewer script calls than there
    /// were operations: they shared calls (on a cluster only within a slot, or the server would
    /// have refused them).
    async fn operations_that_meet_share_calls_and_each_applies_once(fx) {
        const TASKS: usize = 64;
        const CYCLES: u64 = 20;
        let client = fx.builder().op_batch(64).record_waits(false).connect().await.unwrap();
        fx.warm_up(&client).await;
        let names = names_by_slot(8, TASKS / 8);
        let before = fx.calls("evalsha");
        let tasks: Vec<_> = names
            .iter()
            .map(|name| {
                let lock = client.lock(name).unwrap().with_lease(LONG).unwrap();
                tokio::spawn(async move {
                    let mut last = 0;
                    for _ in 0..CYCLES {
                        let guard = lock.acquire().await.unwrap();
                        assert!(guard.token().get() > last, "tokens increase");
                        last = guard.token().get();
                        guard.release().await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let calls = fx.calls("evalsha") - before;
        let operations = TASKS as u64 * CYCLES * 2;
        assert!(calls < operations, "{calls} calls for {operations} operations");
        for name in &names {
            assert!(fx.lock_key(name).is_none(), "{name} left held");
        }
    }
}

/// An acquisition of a key that holds another type, sent together with 32 others: it fails
/// alone with [`fencelock::Error::WrongType`] and leaves the key as it was, and the others
/// take and release their locks, 20 rounds in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_operation_in_a_call_fails_alone() {
    let fx = Fixture::start();
    let client = fx
        .builder()
        .op_batch(64)
        .record_waits(false)
        .connect()
        .await
        .unwrap();
    fx.warm_up(&client).await;
    let bad = client.lock("bad").unwrap();
    // The key the lock uses, holding a string from now on.
    let held = bad.acquire().await.unwrap();
    let key = fx.lock_key("bad").unwrap();
    held.release().await.unwrap();
    {
        use redis::Commands;
        let _: () = fx.raw().set(&key, "foreign").unwrap();
    }
    let before = fx.calls("evalsha");
    let names: Vec<String> = (0..32).map(|i| format!("good-{i}")).collect();
    for _ in 0..20 {
        let good: Vec<_> = names
            .iter()
            .map(|name| {
                let lock = client.lock(name).unwrap();
                tokio::spawn(async move { lock.acquire().await?.release().await })
            })
            .collect();
        let err = bad.acquire().await.unwrap_err();
        assert!(matches!(err, fencelock::Error::WrongType { .. }), "{err:?}");
        for task in good {
            task.await.unwrap().unwrap();
        }
    }
    let calls = fx.calls("evalsha") - before;
    assert!(calls < 20 * 65, "{calls} calls: no operations shared one");
    let value: String = {
        use redis::Commands;
        fx.raw().get(&key).unwrap()
    };
    assert_eq!(value, "foreign");
    for name in &names {
        assert!(fx.lock_key(name).is_none(), "{name} left held");
    }
}

/// `cases` groups of 8 acquisitions and releases, started together so that the first goes
/// alone and the others queue behind it, dropped as a whole at a random point: while queued,
/// on the wire in a shared call, or after some were answered. After each case every lock is
/// free within [`HANDOFF`]: an acquisition that ran for a caller who left was undone.
async fn groups_dropped_at_random_points(
    fx: &Env,
    control: Option<fencelock::negative_controls::Control>,
    cases: u32,
) -> Result<(), String> {
    let mut builder = fx.builder().op_batch(64).record_waits(false);
    if let Some(control) = control {
        builder = builder.negative_control(control);
    }
    let client = builder.connect().await.unwrap();
    fx.warm_up(&client).await;
    let names = names_by_slot(1, 8);
    let locks: Vec<_> = names
        .iter()
        .map(|name| client.lock(name).unwrap().with_lease(LONG).unwrap())
        .collect();
    let mut points = CancelPoints::new(0xba7c_4ed0);
    for case in 0..cases {
        let group = futures_util::future::join_all(locks.iter().map(|lock| async move {
            let guard: LockGuard = lock.acquire().await.unwrap();
            guard.release().await.unwrap();
        }));
        points.run(group).await;
        let free = || names.iter().all(|name| fx.lock_key(name).is_none());
        if !eventually(HANDOFF, free).await {
            let held: Vec<_> = names.iter().filter_map(|n| fx.lock_state(n)).collect();
            return Err(format!("case {case}: locks stayed held: {held:?}"));
        }
    }
    points.assert_both_outcomes();
    Ok(())
}

on_topologies_multi_thread! {
    async fn operations_dropped_while_batched_never_leave_a_lock_held(fx) {
        let cases = crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500);
        groups_dropped_at_random_points(&fx, None, cases).await.unwrap();
    }
}

/// The negative control: acquisitions dropped without their undo leave locks held for
/// nobody; the test above catches it.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_batched_operations_without_their_undo_is_caught() {
    use fencelock::negative_controls::Control;
    let fx = Env::start(crate::common::Topology::Standalone);
    let outcome =
        groups_dropped_at_random_points(&fx, Some(Control::CancelMissingOnDrop), 500).await;
    assert!(
        outcome.is_err(),
        "Control::CancelMissingOnDrop was not caught"
    );
}

/// The highest token the fence counter of `name`'s slot issued.
fn counter_of(fx: &Fixture, name: &str) -> u64 {
    use redis::Commands;
    let key = fx.lock_key(name).expect("held");
    let tag_end = key.iter().position(|&b| b == b'}').unwrap();
    let fence = [&key[..=tag_end], b"fence"].concat();
    fx.raw().get(fence).unwrap()
}

/// 16 acquisitions start together while the server's replies are slow: the first goes alone,
/// the others queue behind it and ride one call once its reply is in. That call runs, and the
/// connection is cut before its reply arrives. Every acquisition in it is re-sent over the new
/// connection and replays: each holds its lock once, with the one token its first run issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_call_whose_reply_is_lost_is_applied_once() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let client = LockClient::builder(proxy.url())
        .op_batch(64)
        .record_waits(false)
        .connect()
        .await
        .unwrap();
    // Every script loaded: a NOSCRIPT answer would be lost with the reply.
    fx.warm_up(&client).await;
    // Distinct slots, so each lock's fence counter is its own.
    let names: Vec<String> = names_by_slot(16, 1);
    let before = fx.calls("evalsha");
    proxy.delay(Direction::Downstream, Duration::from_millis(500));
    let acquisitions = futures_util::future::join_all(names.iter().map(|name| {
        let lock = client.lock(name).unwrap().with_lease(LONG).unwrap();
        async move { lock.acquire().await }
    }));
    let (guards, shared) = tokio::join!(acquisitions, async {
        // All ran, in fewer calls than acquisitions; the shared call's reply is on its way
        // back, and is lost with the connection.
        let all_held = || names.iter().all(|name| fx.lock_key(name).is_some());
        assert!(
            eventually(Duration::from_secs(10), all_held).await,
            "not all ran"
        );
        let calls = fx.calls("evalsha") - before;
        proxy.reset_all();
        proxy.heal();
        calls
    });
    assert!(
        shared < 16,
        "{shared} calls for 16 acquisitions: none shared one"
    );
    for (name, guard) in names.iter().zip(guards) {
        let guard = guard.unwrap();
        let (holders, token) = fx.lock_state(name).unwrap();
        assert_eq!(holders, vec![(guard.holder_id().to_owned(), 1)], "{name}");
        assert_eq!(guard.token().get(), token, "{name}: the first run's token");
        assert_eq!(
            counter_of(&fx, name),
            token,
            "{name}: a second token was issued"
        );
        guard.release().await.unwrap();
        assert!(fx.lock_key(name).is_none());
    }
}
