//! Reads of one read-write lock that meet in one client share a script call
//! (`rw_read_many.lua`), and so do releases of holds of one semaphore or read-write lock
//! (`sem_release_many.lua`), through the group commit that is on for holds by default
//! (`hold_batch`, 64): each read
//! holds once with a token of its own, each release ends its own hold; reads and releases
//! dropped at any point, queued or on the wire, leave no hold behind; a shared call whose reply
//! is lost is re-sent and applied once.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::cancel::CancelPoints;
use crate::common::deadline::HANDOFF;
use crate::common::{eventually, Env, Fixture};
use fencelock::{LockClient, RwLock};
use fencelock_testing::{Direction, FaultProxy};

const LONG: Duration = Duration::from_secs(30);

/// A client with the default group commit of holds.
async fn grouping_client(fx: &Env) -> LockClient {
    fx.builder().record_waits(false).connect().await.unwrap()
}

/// `n` reads of `rw` started at once, so that those meeting a call in flight queue together.
async fn read_together(rw: &RwLock, n: usize) -> Vec<fencelock::ReadGuard> {
    futures_util::future::join_all((0..n).map(|_| async { rw.read().await.unwrap() })).await
}

/// Releases every guard at once, each successfully.
async fn release_together(guards: Vec<fencelock::ReadGuard>) {
    futures_util::future::join_all(guards.into_iter().map(|g| g.release()))
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .unwrap();
}

/// Whether anything of read-write lock `name` is left in Redis (its hash or its lease zset).
fn anything_left(fx: &Env, name: &str) -> bool {
    !fx.keys(&format!("fencelock:{{*}}rw*:{name}")).is_empty()
}

on_topologies_multi_thread! {
    async fn reads_of_one_lock_share_calls_and_each_holds_once(fx) {
        let client = grouping_client(&fx).await;
        fx.warm_up(&client).await;
        let rw = client.rwlock("shelf").unwrap().with_lease(LONG).unwrap();
        rw.read().await.unwrap().release().await.unwrap();
        let before = fx.calls("evalsha");
        let mut seen = HashSet::new();
        for _ in 0..10 {
            let guards = read_together(&rw, 32).await;
            for guard in &guards {
                assert!(seen.insert(guard.token()), "a token twice: {:?}", guard.token());
            }
            release_together(guards).await;
            assert!(!anything_left(&fx, "shelf"), "a read left its hold");
        }
        let calls = fx.calls("evalsha") - before;
        // 320 reads and 320 releases, each alone, would be 640 calls.
        assert!(calls < 10 * 32, "{calls} calls: few reads or releases shared one");
    }
}

/// With `hold_batch(1)` every read and every release goes by its own script call, also when
/// they meet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_cap_of_one_every_read_and_release_goes_alone() {
    let fx = Fixture::start();
    let client = fx
        .builder()
        .hold_batch(1)
        .record_waits(false)
        .connect()
        .await
        .unwrap();
    fx.warm_up(&client).await;
    let rw = client.rwlock("alone").unwrap().with_lease(LONG).unwrap();
    rw.read().await.unwrap().release().await.unwrap();
    let before = fx.calls("evalsha");
    release_together(read_together(&rw, 32).await).await;
    assert_eq!(
        fx.calls("evalsha") - before,
        64,
        "32 reads and 32 releases, one call each"
    );
    assert!(
        fx.keys("fencelock:{*}rw*:alone").is_empty(),
        "a read left its hold"
    );
}

/// A cap outside 1..=1000 is refused when the client is built, before anything is sent.
#[tokio::test]
async fn a_cap_out_of_range_is_a_typed_error() {
    let fx = Fixture::start();
    for builder in [fx.builder().hold_batch(0), fx.builder().hold_batch(1001)] {
        let err = builder.connect().await.map(|_| ()).unwrap_err();
        assert!(
            matches!(err, fencelock::Error::InvalidConfig { .. }),
            "{err}"
        );
    }
}

on_topologies_multi_thread! {
    async fn permits_of_one_semaphore_released_together_come_back(fx) {
        let client = grouping_client(&fx).await;
        let pool = client.semaphore("pool", 8).unwrap().with_lease(LONG).unwrap();
        for _ in 0..10 {
            let permits = futures_util::future::join_all(
                (0..8).map(|_| async { pool.acquire(1).await.unwrap() }),
            )
            .await;
            assert!(pool.try_acquire(1).await.unwrap().is_none(), "a ninth permit");
            futures_util::future::join_all(permits.into_iter().map(|p| p.release()))
                .await
                .into_iter()
                .collect::<Result<Vec<()>, _>>()
                .unwrap();
            assert!(fx.keys("fencelock:{*}sem*:pool").is_empty(), "a permit left held");
        }
    }
}

/// `cases` groups of 8 reads of one lock, started together so that the first goes alone and
/// the others queue behind it, dropped as a whole at a random point. After each case the lock
/// is free within [`HANDOFF`]: a read that ran for a caller who left was undone.
async fn grouped_reads_dropped_at_random_points(
    fx: &Env,
    control: Option<fencelock::negative_controls::Control>,
    cases: u32,
) -> Result<(), String> {
    let mut builder = fx.builder().record_waits(false);
    if let Some(control) = control {
        builder = builder.negative_control(control);
    }
    let client = builder.connect().await.unwrap();
    fx.warm_up(&client).await;
    let rw: RwLock = client.rwlock("dropped").unwrap().with_lease(LONG).unwrap();
    rw.read().await.unwrap().release().await.unwrap();
    let mut points = CancelPoints::new(0x4ead_5eed);
    for case in 0..cases {
        // Reads and their releases, queued behind one another and dropped anywhere.
        let group = futures_util::future::join_all((0..8).map(|_| async {
            let guard = rw.read().await.unwrap();
            guard.release().await.unwrap();
        }));
        points.run(group).await;
        if !eventually(HANDOFF, || !anything_left(fx, "dropped")).await {
            return Err(format!("case {case}: reads stayed held"));
        }
    }
    points.assert_both_outcomes();
    Ok(())
}

on_topologies_multi_thread! {
    async fn grouped_reads_dropped_at_random_points_never_leave_a_hold(fx) {
        let cases = crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500);
        grouped_reads_dropped_at_random_points(&fx, None, cases).await.unwrap();
    }
}

/// The negative control: reads dropped without their undo leave holds for nobody; the test
/// above catches it.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_grouped_reads_without_their_undo_is_caught() {
    use fencelock::negative_controls::Control;
    let fx = Env::start(crate::common::Topology::Standalone);
    let outcome =
        grouped_reads_dropped_at_random_points(&fx, Some(Control::CancelMissingOnDrop), 500).await;
    assert!(
        outcome.is_err(),
        "Control::CancelMissingOnDrop was not caught"
    );
}

/// 16 reads of one lock start together while the server's replies are slow: the first goes
/// alone, the others queue and ride one call once its reply is in. That call runs, and the
/// connection is cut before its reply arrives. Every read in it is re-sent over the new
/// connection and replays: each holds once, with the one token its first run issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_call_whose_reply_is_lost_is_applied_once() {
    use redis::Commands;
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let client = LockClient::builder(proxy.url())
        .record_waits(false)
        .connect()
        .await
        .unwrap();
    // Every script loaded: a NOSCRIPT answer would be lost with the reply.
    fx.warm_up(&client).await;
    let rw = client.rwlock("lost").unwrap().with_lease(LONG).unwrap();
    let pair = futures_util::future::join_all((0..2).map(|_| rw.read())).await;
    for guard in pair {
        guard.unwrap().release().await.unwrap();
    }
    let hash = fx.keys("fencelock:{*}rw:lost");
    assert!(hash.is_empty());
    let before = fx.calls("evalsha");
    proxy.delay(Direction::Downstream, Duration::from_millis(500));
    let reads = futures_util::future::join_all((0..16).map(|_| rw.read()));
    let held = |fx: &Fixture| -> usize {
        fx.keys("fencelock:{*}rw:lost")
            .pop()
            .map(|key| {
                let fields: Vec<String> = fx.raw().hkeys(key).unwrap();
                fields.iter().filter(|f| !f.starts_with('~')).count()
            })
            .unwrap_or(0)
    };
    let (guards, shared) = tokio::join!(reads, async {
        assert!(
            eventually(Duration::from_secs(10), || held(&fx) == 16).await,
            "not all ran"
        );
        let calls = fx.calls("evalsha") - before;
        proxy.reset_all();
        proxy.heal();
        calls
    });
    assert!(shared < 16, "{shared} calls for 16 reads: none shared one");
    let key = fx.keys("fencelock:{*}rw:lost").pop().unwrap();
    let fields: std::collections::HashMap<String, String> = fx.raw().hgetall(&key).unwrap();
    // Sixteen holds, once each (and, on the lease-zset path, counted once each).
    let holds = fields
        .keys()
        .filter(|field| !field.starts_with('~'))
        .count();
    assert_eq!(holds, 16, "{fields:?}");
    if let Some(used) = fields.get("~used") {
        assert_eq!(used, "16", "{fields:?}");
    }
    let fence = {
        let tag_end = key.iter().position(|&b| b == b'}').unwrap();
        [&key[..=tag_end], b"fence"].concat()
    };
    let counter: u64 = fx.raw().get(fence).unwrap();
    let mut tokens = Vec::new();
    for guard in guards {
        let guard = guard.unwrap();
        let field = &fields[guard.holder_id()];
        assert_eq!(
            field,
            &format!("1:{}", guard.token().get()),
            "the first run's token"
        );
        tokens.push(guard.token().get());
        guard.release().await.unwrap();
    }
    assert_eq!(
        tokens.iter().max(),
        Some(&counter),
        "a second token was issued"
    );
    assert!(fx.keys("fencelock:{*}rw*:lost").is_empty());
}
