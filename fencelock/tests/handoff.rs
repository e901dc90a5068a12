//! One-round-trip handoff inside a client (`handoff.lua`, `engine::handoff`): a release that
//! frees a lock a task of the same client waits for grants it to that waiter in the same call;
//! waiters of other clients are never passed over; a waiter dropped at any point of a handoff
//! never leaves the lock held for nobody; a handoff whose reply is lost is applied once.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::cancel::CancelPoints;
use common::deadline::HANDOFF;
use common::{eventually, Env, Fixture};
use fencelock::LockClient;
use fencelock_testing::{Direction, FaultProxy};

const LONG: Duration = Duration::from_secs(30);

on_topologies_multi_thread! {
    /// The holder's release is the only call: the waiting task holds the lock when it returns,
    /// with a greater token, its own label and lease, and makes no attempt of its own.
    async fn a_release_hands_the_lock_to_a_waiting_task_of_its_client_in_one_call(fx) {
        // Wait records off: the calls counted are the lock's own.
        let client = fx.builder().record_waits(false).connect().await.unwrap();
        fx.warm_up(&client).await;
        let lock = client.lock("sale").unwrap().with_lease(LONG).unwrap();
        let held = lock.acquire().await.unwrap();
        let base = fx.calls("evalsha");
        let waiter = tokio::spawn({
            let lock = lock.with_label("order:7").unwrap();
            async move { lock.acquire().await }
        });
        // Its busy fast attempt, then the look the first waiter takes once subscribed.
        assert!(
            eventually(Duration::from_secs(30), || fx.calls("evalsha") - base == 2).await,
            "the waiter did not queue"
        );
        // Let it settle into its wait: the look's reply is handled a moment after the server
        // counted the call (a waiter still on its way there is sent a release message instead,
        // and the count below would be 2).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = fx.calls("evalsha");
        let token = held.token();
        held.release().await.unwrap();
        let next = tokio::time::timeout(HANDOFF, waiter)
            .await
            .expect("the waiter was handed the lock")
            .unwrap()
            .unwrap();
        assert_eq!(fx.calls("evalsha") - before, 1, "one call for release and grant");
        assert!(next.token() > token);
        assert!(next.is_valid());
        let (holders, _) = fx.lock_state("sale").unwrap();
        assert_eq!(holders, vec![(next.holder_id().to_owned(), 1)]);
        let label: Option<String> = {
            use redis::Commands;
            fx.raw().hget(fx.lock_key("sale").unwrap(), "~label").unwrap()
        };
        assert_eq!(label.as_deref(), Some("order:7"));
        next.release().await.unwrap();
        assert!(fx.lock_key("sale").is_none());
    }
}

/// Tasks of client `a` take turns on one lock without pause while client `b` waits for it:
/// `b` gets it within `patience`, because a release hands the lock on inside its client only
/// while nobody else listens on the lock's channel.
async fn another_client_gets_in(
    fx: &Env,
    control: Option<fencelock::negative_controls::Control>,
    patience: Duration,
) -> Result<(), String> {
    let mut builder = fx.builder();
    if let Some(control) = control {
        builder = builder.negative_control(control);
    }
    let a = builder.connect().await.unwrap();
    let b = fx.client().await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (lock, stop) = (a.lock("busy").unwrap(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.acquire().await.unwrap();
                tokio::task::yield_now().await;
                guard.release().await.unwrap();
            }
        }));
    }
    // Client a's tasks are churning and handing the lock on among themselves.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outcome = b.lock("busy").unwrap().acquire_timeout(patience).await;
    stop.store(true, Ordering::Relaxed);
    let outcome = match outcome {
        Ok(guard) => {
            guard.release().await.unwrap();
            Ok(())
        }
        Err(err) => Err(format!("the other client never got the lock: {err}")),
    };
    for task in tasks {
        task.await.unwrap();
    }
    outcome
}

on_topologies_multi_thread! {
    async fn waiters_of_other_clients_are_never_passed_over(fx) {
        another_client_gets_in(&fx, None, Duration::from_secs(20))
            .await
            .unwrap();
    }
}

/// The negative control: a handoff that ignores the other client's subscription starves it;
/// the test above catches it.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handing_on_past_another_client_is_caught() {
    use fencelock::negative_controls::Control;
    let fx = Env::start(common::Topology::Standalone);
    let outcome = another_client_gets_in(
        &fx,
        Some(Control::HandoffIgnoresOtherClients),
        Duration::from_secs(3),
    )
    .await;
    assert!(
        outcome.is_err(),
        "Control::HandoffIgnoresOtherClients was not caught"
    );
}

/// `cases` handoffs whose waiter is dropped at a random point: before it queues, while the
/// release that grants it the lock is on the wire, after the grant arrived and before the
/// waiter claimed it. After each case the lock is free within [`HANDOFF`] (a grant nobody
/// claimed is undone), never held for the waiter's 30-second lease.
async fn waiters_dropped_during_handoffs(
    fx: &Env,
    control: Option<fencelock::negative_controls::Control>,
    cases: u32,
) -> Result<(), String> {
    let mut builder = fx.builder();
    if let Some(control) = control {
        builder = builder.negative_control(control);
    }
    let client = builder.connect().await.unwrap();
    fx.warm_up(&client).await;
    let lock = client.lock("dropped").unwrap().with_lease(LONG).unwrap();
    let mut points = CancelPoints::new(0x5eed_4a0d);
    for case in 0..cases {
        let held = lock.acquire().await.unwrap();
        let delay = Duration::from_micros(points.rng().below(1_500));
        let releaser = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            held.release().await.unwrap();
        });
        if let Some(guard) = points.run(lock.acquire()).await {
            guard.unwrap().release().await.unwrap();
        }
        releaser.await.unwrap();
        if !eventually(HANDOFF, || fx.lock_key("dropped").is_none()).await {
            return Err(format!(
                "case {case}: the lock stayed held: {:?}",
                fx.lock_state("dropped")
            ));
        }
    }
    points.assert_both_outcomes();
    Ok(())
}

on_topologies_multi_thread! {
    async fn a_waiter_dropped_at_any_point_of_a_handoff_never_strands_the_lock(fx) {
        let cases = common::env_cases("FENCELOCK_CANCEL_CASES", 500);
        waiters_dropped_during_handoffs(&fx, None, cases).await.unwrap();
    }
}

/// The negative control: a waiter that leaves without undoing a grant it did not claim leaves
/// the lock held for nobody; the test above catches it.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_a_grant_unclaimed_is_caught() {
    use fencelock::negative_controls::Control;
    let fx = Env::start(common::Topology::Standalone);
    let outcome =
        waiters_dropped_during_handoffs(&fx, Some(Control::HandoffGrantNotUndone), 500).await;
    assert!(
        outcome.is_err(),
        "Control::HandoffGrantNotUndone was not caught"
    );
}

/// The reply of a handing-off release is lost and its connection cut: the release is sent
/// again over the new connection and replays the grant (or gives up, and the waiter's own
/// attempt replays it), so the waiter holds the lock with the one token the grant issued, and
/// nothing is granted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_whose_reply_is_lost_is_applied_once() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let client = LockClient::builder(proxy.url())
        .record_waits(false)
        .connect()
        .await
        .unwrap();
    // Every script loaded: a NOSCRIPT answer would be lost with the reply.
    fx.warm_up(&client).await;
    let lock = client.lock("lost-reply").unwrap().with_lease(LONG).unwrap();
    let held = lock.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    // The waiter queued (subscribed) and settled into its wait.
    let channel = fx.lock_key("lost-reply").unwrap();
    assert!(eventually(Duration::from_secs(30), || fx.subscribers(&channel) == 1).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let releaser = held.holder_id().to_owned();
    let moved_on = || {
        fx.lock_state("lost-reply")
            .is_none_or(|(holders, _)| holders.iter().all(|(id, _)| *id != releaser))
    };
    proxy.blackhole(Direction::Downstream);
    let (released, ()) = tokio::join!(held.release(), async {
        // The release ran once the releaser is gone from the hash; then its reply is lost.
        assert!(eventually(Duration::from_secs(5), moved_on).await);
        proxy.reset_all();
        proxy.heal();
    });
    released.unwrap();
    let next = tokio::time::timeout(HANDOFF, waiter)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    let (holders, token) = fx.lock_state("lost-reply").unwrap();
    assert_eq!(holders, vec![(next.holder_id().to_owned(), 1)]);
    assert_eq!(next.token().get(), token, "the grant's token");
    assert_eq!(highest_token(&fx), token, "no token issued after the grant");
    next.release().await.unwrap();
    assert!(fx.lock_key("lost-reply").is_none());
    assert_eq!(highest_token(&fx), token, "nothing was granted again");
}

/// The highest token any fence counter issued.
fn highest_token(fx: &Fixture) -> u64 {
    use redis::Commands;
    let mut raw = fx.raw();
    let keys: Vec<String> = raw.keys("fencelock:{*}fence").unwrap();
    keys.iter()
        .map(|key| raw.get::<_, u64>(key).unwrap())
        .max()
        .unwrap_or(0)
}
