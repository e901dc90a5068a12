//! One-round-trip handoff inside a client (`handoff.lua`, `sem_handoff.lua`,
//! `engine::handoff`): a release that frees a lock (or a semaphore hold's permits) a task of the
//! same client waits for grants it to that waiter in the same call; waiters of other clients are
//! never passed over; a waiter dropped at any point of a handoff never leaves the lock or the
//! permits held for nobody; a handoff whose reply is lost is applied once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::cancel::CancelPoints;
use crate::common::deadline::HANDOFF;
use crate::common::events::{handoffs_of, waits_on};
use crate::common::{eventually, Env, Fixture};
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
        let take = || async { Held::Lock(lock.acquire().await.unwrap()) };
        let wait = || {
            let lock = lock.with_label("order:7").unwrap();
            async move { lock.acquire().await.map(Held::Lock) }
        };
        let (Held::Lock(next), token) = handed_over_in_one_call(&fx, take, wait).await else {
            panic!("a lock's waiter holds a lock");
        };
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

/// What a test hands round between tasks: a lock, or the permit of a one-permit semaphore.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Lock,
    Permit,
}

/// A lock's guard or a semaphore's permit.
enum Held {
    Lock(fencelock::LockGuard),
    Permit(fencelock::SemaphorePermit),
}

impl Held {
    fn token(&self) -> fencelock::FencingToken {
        match self {
            Held::Lock(guard) => guard.token(),
            Held::Permit(permit) => permit.token(),
        }
    }

    async fn release(self) -> Result<(), fencelock::Error> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
        }
    }
}

impl Kind {
    /// Takes `name` with a 30-second lease, waiting at most `patience` (`None`: as long as it
    /// takes).
    async fn acquire(
        self,
        client: &LockClient,
        name: &str,
        patience: Option<Duration>,
    ) -> Result<Held, fencelock::Error> {
        match self {
            Kind::Lock => {
                let lock = client.lock(name).unwrap().with_lease(LONG).unwrap();
                match patience {
                    Some(patience) => lock.acquire_timeout(patience).await,
                    None => lock.acquire().await,
                }
                .map(Held::Lock)
            }
            Kind::Permit => {
                let pool = client.semaphore(name, 1).unwrap().with_lease(LONG).unwrap();
                match patience {
                    Some(patience) => pool.acquire_timeout(1, patience).await,
                    None => pool.acquire(1).await,
                }
                .map(Held::Permit)
            }
        }
    }

    /// The key that exists in Redis while `name` is held (its lock hash, its semaphore hash).
    fn pattern(self, name: &str) -> String {
        match self {
            Kind::Lock => format!("fencelock:{{*}}lock:{name}"),
            Kind::Permit => format!("fencelock:{{*}}sem:{name}"),
        }
    }
}

/// Rounds of a hold (`take`) released while another task of the same client waits for it
/// (`wait`), until a release hands it over as the only call, at most five: the waiter's hold
/// and the releaser's token. The waiter's busy fast attempt and the look it takes once
/// subscribed come first; then it is let settle into its wait, since the look's reply is
/// handled a moment after the server counted the call. A waiter still on its way in (a stalled
/// machine) is sent the release's message instead and makes an attempt of its own, two calls:
/// that round is let go. Any other count fails at once.
async fn handed_over_in_one_call<T, W>(
    fx: &Env,
    take: impl Fn() -> T,
    wait: impl Fn() -> W,
) -> (Held, fencelock::FencingToken)
where
    T: std::future::Future<Output = Held>,
    W: std::future::Future<Output = Result<Held, fencelock::Error>> + Send + 'static,
{
    for round in 1..=5 {
        let held = take().await;
        let base = fx.calls("evalsha");
        let waiter = tokio::spawn(wait());
        assert!(
            eventually(Duration::from_secs(30), || fx.calls("evalsha") - base == 2).await,
            "the waiter did not queue"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = fx.calls("evalsha");
        let token = held.token();
        held.release().await.unwrap();
        let next = tokio::time::timeout(HANDOFF, waiter)
            .await
            .expect("the waiter got the hold")
            .unwrap()
            .unwrap();
        match fx.calls("evalsha") - before {
            1 => return (next, token),
            2 if round < 5 => next.release().await.unwrap(),
            calls => panic!("{calls} calls for release and grant (round {round})"),
        }
    }
    unreachable!("the fifth round returns or fails")
}

/// Tasks of client `a` take turns on `name` without pause while client `b` waits for it: `b`
/// gets it within `patience`, because a release hands it on inside its client only while
/// nobody else listens on its channel.
async fn another_client_gets_in(
    fx: &Env,
    kind: Kind,
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
        let (a, stop) = (a.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let held = kind.acquire(&a, "busy", None).await.unwrap();
                tokio::task::yield_now().await;
                held.release().await.unwrap();
            }
        }));
    }
    // Client a's tasks are churning and handing it on among themselves.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outcome = kind.acquire(&b, "busy", Some(patience)).await;
    stop.store(true, Ordering::Relaxed);
    let outcome = match outcome {
        Ok(held) => {
            held.release().await.unwrap();
            Ok(())
        }
        Err(err) => Err(format!("the other client never got {kind:?}: {err}")),
    };
    for task in tasks {
        task.await.unwrap();
    }
    outcome
}

on_topologies_multi_thread! {
    async fn waiters_of_other_clients_are_never_passed_over(fx) {
        another_client_gets_in(&fx, Kind::Lock, None, Duration::from_secs(20))
            .await
            .unwrap();
    }
}

on_topologies_multi_thread! {
    async fn semaphore_waiters_of_other_clients_are_never_passed_over(fx) {
        another_client_gets_in(&fx, Kind::Permit, None, Duration::from_secs(20))
            .await
            .unwrap();
    }
}

/// The negative controls: a handoff that ignores the other client's subscription starves it;
/// the tests above catch it, for a lock and for a semaphore.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handing_on_past_another_client_is_caught() {
    use fencelock::negative_controls::Control;
    let fx = Env::start(crate::common::Topology::Standalone);
    for (kind, control) in [
        (Kind::Lock, Control::HandoffIgnoresOtherClients),
        (Kind::Permit, Control::SemHandoffIgnoresOtherClients),
    ] {
        let outcome =
            another_client_gets_in(&fx, kind, Some(control), Duration::from_secs(3)).await;
        assert!(outcome.is_err(), "Control::{control:?} was not caught");
    }
}

/// `cases` handoffs whose waiter is dropped at a random point: before it queues, while the
/// release that grants it the lock (or permit) is on the wire, after the grant arrived and
/// before the waiter claimed it. After each case it is free within [`HANDOFF`] (a grant nobody
/// claimed is undone), never held for the waiter's 30-second lease.
async fn waiters_dropped_during_handoffs(
    fx: &Env,
    kind: Kind,
    control: Option<fencelock::negative_controls::Control>,
    cases: u32,
) -> Result<(), String> {
    let mut builder = fx.builder();
    if let Some(control) = control {
        builder = builder.negative_control(control);
    }
    let client = builder.connect().await.unwrap();
    fx.warm_up(&client).await;
    let mut points = CancelPoints::new(match kind {
        Kind::Lock => 0x5eed_4a0d,
        Kind::Permit => 0x5eed_5e4a,
    });
    for case in 0..cases {
        let held = kind.acquire(&client, "dropped", None).await.unwrap();
        let delay = Duration::from_micros(points.rng().below(1_500));
        // Every other case the release waits until the waiter queued (subscribed), so that
        // grants in flight happen whatever the machine's load: a loaded machine's waiter can
        // take longer to queue than the random delay, and then no case hands anything on.
        let queued = case % 2 == 1;
        let channel = fx.keys(&kind.pattern("dropped")).pop().unwrap_or_default();
        // The waiter may be dropped before it queues: then the release waits no longer.
        let settled = AtomicBool::new(false);
        let release = async {
            if queued {
                let limit = Duration::from_millis(200);
                let ready = || settled.load(Ordering::SeqCst) || fx.subscribers(&channel) > 0;
                eventually(limit, ready).await;
            }
            tokio::time::sleep(delay).await;
            held.release().await.unwrap();
        };
        let waiter = async {
            let acquired = points.run(kind.acquire(&client, "dropped", None)).await;
            settled.store(true, Ordering::SeqCst);
            acquired
        };
        let (acquired, ()) = tokio::join!(waiter, release);
        if let Some(held) = acquired {
            held.unwrap().release().await.unwrap();
        }
        let pattern = kind.pattern("dropped");
        if !eventually(HANDOFF, || fx.keys(&pattern).is_empty()).await {
            return Err(format!(
                "case {case}: {kind:?} stayed held: {:?}",
                fx.keys(&pattern)
            ));
        }
    }
    points.assert_both_outcomes();
    Ok(())
}

on_topologies_multi_thread! {
    async fn a_waiter_dropped_at_any_point_of_a_handoff_never_strands_the_lock(fx) {
        let cases = crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500);
        waiters_dropped_during_handoffs(&fx, Kind::Lock, None, cases)
            .await
            .unwrap();
    }
}

on_topologies_multi_thread! {
    async fn a_semaphore_waiter_dropped_at_any_point_of_a_handoff_never_strands_permits(fx) {
        let cases = crate::common::env_cases("FENCELOCK_CANCEL_CASES", 500);
        waiters_dropped_during_handoffs(&fx, Kind::Permit, None, cases)
            .await
            .unwrap();
    }
}

/// The negative control: a waiter that leaves without undoing a grant it did not claim leaves
/// the lock (or the permit) held for nobody; the tests above catch it.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_a_grant_unclaimed_is_caught() {
    use fencelock::negative_controls::Control;
    let fx = Env::start(crate::common::Topology::Standalone);
    for kind in [Kind::Lock, Kind::Permit] {
        let outcome =
            waiters_dropped_during_handoffs(&fx, kind, Some(Control::HandoffGrantNotUndone), 500)
                .await;
        assert!(
            outcome.is_err(),
            "Control::HandoffGrantNotUndone was not caught for a {kind:?}"
        );
    }
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

/// A handing-off release whose replies never come back gives up after its retry window; the
/// grant ran, and the waiter learns of it from its own attempt (or the release's background
/// finish), which replays it. The waiter's lease is the grant's, begun when the release was
/// first sent: its guard must not count it from the later replay, or it would outlive the
/// server's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_replayed_after_its_release_gave_up_keeps_the_grants_lease() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let client = LockClient::builder(proxy.url())
        .record_waits(false)
        .retry_window(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    fx.warm_up(&client).await;
    let lease = Duration::from_secs(10);
    let lock = client
        .lock("replayed-grant")
        .unwrap()
        .with_lease(lease)
        .unwrap();
    let held = lock.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    let channel = fx.lock_key("replayed-grant").unwrap();
    assert!(eventually(Duration::from_secs(30), || fx.subscribers(&channel) == 1).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let releaser = held.holder_id().to_owned();
    proxy.blackhole(Direction::Downstream);
    let started = std::time::Instant::now();
    assert!(held.release().await.is_err(), "no reply came back");
    let granted = fx
        .lock_state("replayed-grant")
        .is_some_and(|(holders, _)| holders.iter().all(|(id, _)| *id != releaser));
    assert!(granted, "the release's grant ran");
    proxy.reset_all();
    proxy.heal();
    let next = tokio::time::timeout(HANDOFF * 4, waiter)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    assert!(
        next.valid_until() <= started + lease,
        "the guard counts its lease from a replay, {:?} past the grant's",
        next.valid_until() - (started + lease)
    );
    next.release().await.unwrap();
}

on_topologies_multi_thread! {
    /// A semaphore hold's release is the only call: the waiting task holds its permits when it
    /// returns, with a greater token, its label and the limit, and makes no attempt of its own.
    async fn a_release_hands_permits_to_a_waiting_task_of_its_client_in_one_call(fx) {
        let client = fx.builder().record_waits(false).connect().await.unwrap();
        fx.warm_up(&client).await;
        let pool = client.semaphore("exports", 3).unwrap().with_lease(LONG).unwrap();
        let _one = pool.acquire(1).await.unwrap();
        let take = || async { Held::Permit(pool.acquire(2).await.unwrap()) };
        let wait = || {
            let pool = pool.with_label("export:7").unwrap();
            async move { pool.acquire(2).await.map(Held::Permit) }
        };
        let (Held::Permit(next), token) = handed_over_in_one_call(&fx, take, wait).await else {
            panic!("a semaphore's waiter holds permits");
        };
        assert!(next.token() > token);
        assert_eq!((next.permits(), next.limit()), (2, 3));
        assert!(next.is_valid());
        let fields = semaphore_holds(&fx, "exports");
        let expected = format!("2:{}:export:7", next.token().get());
        assert_eq!(fields.get(next.holder_id()), Some(&expected), "{fields:?}");
        assert_eq!(fields.len(), 2, "{fields:?}");
        next.release().await.unwrap();
    }
}

on_topologies_multi_thread! {
    /// A release of three permits hands them to the first of three waiters for one, and the
    /// permits left wake the next ones at once (nothing was published: every waiter is of this
    /// client), so all three hold before the holder's lease could have mattered.
    async fn permits_left_after_a_handoff_go_on_to_the_next_waiters(fx) {
        let client = fx.client().await;
        // A name of its own: the topologies run at once, and the waits are counted by name.
        let name = format!("spread-{}", uuid::Uuid::new_v4().simple());
        let pool = client.semaphore(name.as_str(), 3).unwrap().with_lease(LONG).unwrap();
        let all = pool.acquire(3).await.unwrap();
        // Read before the waiters start: the first read installs the counting subscriber.
        let channel = format!("sem:{name}");
        let before = waits_on(&channel);
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let pool = pool.clone();
            waiters.push(tokio::spawn(async move { pool.acquire(1).await }));
        }
        // All three queued behind the holder before it releases (one still on its way would
        // find a permit free itself, and the permits left would go on to nobody).
        let queued = || waits_on(&channel) == before + 3;
        assert!(eventually(HANDOFF, queued).await, "the three waiters queued");
        all.release().await.unwrap();
        let mut held = Vec::new();
        for waiter in waiters {
            let permit = tokio::time::timeout(HANDOFF, waiter)
                .await
                .expect("every waiter got a permit promptly")
                .unwrap()
                .unwrap();
            held.push(permit);
        }
        let tokens: std::collections::HashSet<_> = held.iter().map(|p| p.token()).collect();
        assert_eq!(tokens.len(), 3);
        for permit in held {
            permit.release().await.unwrap();
        }
        assert!(fx.keys(&format!("fencelock:{{*}}sem*:{name}")).is_empty());
    }
}

/// Eight tasks of one client, behind a proxy that cuts its connections every few dozen
/// milliseconds (replies lost, requests re-sent), take one or two of three permits in turn,
/// some dropping their acquisition or their permit midway: at no moment do the tasks that hold
/// have more than three permits between them, releases hand permits on inside the client, and
/// when the tasks are done nothing is held. `Err` says which of these broke.
async fn churn_one_clients_semaphore(
    control: Option<fencelock::negative_controls::Control>,
) -> Result<(), String> {
    use std::sync::atomic::AtomicU32;
    let fx = Fixture::start();
    let proxy = Arc::new(FaultProxy::start(fx.server.addr()).unwrap());
    let mut builder = LockClient::builder(proxy.url()).record_waits(false);
    if let Some(control) = control {
        builder = builder.negative_control(control);
    }
    let client = builder.connect().await.unwrap();
    fx.warm_up(&client).await;
    let before = handoffs_of(client.id());
    let pool = client.semaphore("churn", 3).unwrap();
    let (held, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let cutter = tokio::spawn({
        let (proxy, stop) = (proxy.clone(), stop.clone());
        async move {
            let mut rng = crate::common::Rng(0x5eed_c0de);
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20 + rng.below(60))).await;
                proxy.reset_all();
            }
        }
    });
    let mut tasks = Vec::new();
    for task in 0..8u64 {
        let (pool, held, most) = (pool.clone(), held.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = crate::common::Rng(0x5eed_0000 + task);
            let failed = |err: fencelock::Error| format!("task {task}: {err}");
            for _ in 0..100 {
                let permits = 1 + u32::try_from(rng.below(2)).unwrap();
                let permit = if rng.below(8) == 0 {
                    let patience = Duration::from_micros(rng.below(3_000));
                    match tokio::time::timeout(patience, pool.acquire(permits)).await {
                        Ok(permit) => permit.map_err(failed)?,
                        Err(_dropped) => continue,
                    }
                } else {
                    pool.acquire(permits).await.map_err(failed)?
                };
                let now = held.fetch_add(permits, Ordering::SeqCst) + permits;
                most.fetch_max(now, Ordering::SeqCst);
                // Held a moment, so that waiters queue behind the holds.
                tokio::time::sleep(Duration::from_micros(rng.below(500))).await;
                held.fetch_sub(permits, Ordering::SeqCst);
                if rng.below(8) == 0 {
                    drop(permit);
                } else {
                    permit.release().await.map_err(failed)?;
                }
            }
            Ok::<(), String>(())
        }));
    }
    let mut outcome = Ok(());
    for task in tasks {
        outcome = outcome.and(task.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    cutter.await.unwrap();
    outcome?;
    let gone = || {
        use redis::Commands;
        let keys: Vec<String> = fx.raw().keys("fencelock:{*}sem*:churn").unwrap();
        keys.is_empty()
    };
    let handed = handoffs_of(client.id()) - before;
    let connections = proxy.stats().connections_accepted;
    eprintln!("{handed} handoffs over {connections} connections");
    let most = most.load(Ordering::SeqCst);
    if most > 3 {
        return Err(format!("{most} permits held at once of 3"));
    }
    if !eventually(HANDOFF, gone).await {
        return Err("permits stayed held".into());
    }
    if handed == 0 {
        return Err("no release handed permits on".into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_churning_a_semaphore_never_exceed_its_limit() {
    churn_one_clients_semaphore(None).await.unwrap();
}

/// The negative control: a handoff that grants permits that do not fit puts more than the
/// limit in the tasks' hands (or its reply shows the overdraft, a negative count of free
/// permits, which the client refuses as a protocol error); the test above catches it.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handing_on_permits_beyond_the_limit_is_caught() {
    use fencelock::negative_controls::Control;
    let outcome = churn_one_clients_semaphore(Some(Control::SemHandoffIgnoresRoom)).await;
    assert!(
        outcome.is_err(),
        "Control::SemHandoffIgnoresRoom was not caught"
    );
}

/// The holds' fields of semaphore `name` (holder id -> value); empty when it does not exist.
fn semaphore_holds(fx: &Env, name: &str) -> std::collections::HashMap<String, String> {
    use redis::Commands;
    let Some(key) = fx.keys(&format!("fencelock:{{*}}sem:{name}")).pop() else {
        return Default::default();
    };
    let fields: std::collections::HashMap<String, String> = fx.raw().hgetall(key).unwrap();
    fields
        .into_iter()
        .filter(|(field, _)| !field.starts_with('~'))
        .collect()
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
