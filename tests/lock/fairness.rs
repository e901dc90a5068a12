//! Fair handoff across clients (`LockClientBuilder::fair_handoff`): separate `LockClient`s
//! stand for separate processes, each with its own local FIFO queue of waiters. Nothing here
//! measures time: the tests count grants in their grant order (checked against the tokens) and
//! wait for events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::deadline::{within, woken, Progress, HANDOFF};
use crate::common::events;
use crate::common::{eventually, Fixture};
use fencelock::admin::Admin;
use fencelock::{FencingToken, LockClient};
use fencelock_testing::{Direction, FaultProxy};
use parking_lot::Mutex;
use redis::Commands;

/// Long enough that a live client always claims its reservation, however loaded the machine:
/// the ordering bounds below assume no reservation lapses.
const LONG_GRACE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(30);

/// One grant, in grant order: which client, which token, and when on the [`events::tick`] clock.
#[derive(Debug, Clone, Copy)]
struct Grant {
    client: usize,
    token: FencingToken,
    at: u64,
}

#[derive(Default)]
struct Ledger {
    grants: Mutex<Vec<Grant>>,
    inside: AtomicBool,
    /// The wait that came closest to its bound (or went furthest past it): the grants to other
    /// clients one waiter saw while it waited, its bound, and its client and the clients
    /// granted meanwhile, in grant order (for the failure message).
    worst: Mutex<Option<Overrun>>,
}

/// One waiter's wait in fair mode, as checked against the bound.
#[derive(Clone)]
struct Overrun {
    seen: usize,
    bound: usize,
    ahead: usize,
    client: usize,
    served: Vec<usize>,
}

/// `clients` clients, each with `tasks` tasks that take the lock `rounds` times each.
async fn contend(
    fx: &Fixture,
    fair: bool,
    clients: usize,
    tasks: usize,
    rounds: usize,
) -> Arc<Ledger> {
    // The first use installs the counting subscriber, before any task waits.
    events::tick();
    let ledger = Arc::new(Ledger::default());
    let progress = Progress::new();
    let mut handles = Vec::new();
    let mut connected = Vec::new();
    for _ in 0..clients {
        let builder = fx.builder();
        let builder = if fair {
            builder.fair_handoff(LONG_GRACE)
        } else {
            builder
        };
        connected.push(builder.connect().await.unwrap());
    }
    for (client, lock_client) in connected.iter().enumerate() {
        for _ in 0..tasks {
            let lock = lock_client.lock("contended").unwrap();
            let (ledger, progress) = (ledger.clone(), progress.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = lock.acquire().await.unwrap();
                    progress.tick();
                    assert!(
                        !ledger.inside.swap(true, Ordering::SeqCst),
                        "two holders at once"
                    );
                    let window = {
                        let mut grants = ledger.grants.lock();
                        grants.push(Grant {
                            client,
                            token: guard.token(),
                            at: events::tick(),
                        });
                        // Grants stamped after the wait began. At most one of them came before
                        // it in grant order: the previous holder's, stamped just after its
                        // acquire returned.
                        events::entered(guard.holder_id()).map(|(entered, ahead)| {
                            let served: Vec<usize> = grants[..grants.len() - 1]
                                .iter()
                                .filter(|g| g.at > entered)
                                .map(|g| g.client)
                                .collect();
                            (served, ahead)
                        })
                    };
                    if let Some((served, ahead)) = window {
                        let seen = served.iter().filter(|c| **c != client).count();
                        let bound = fair_bound(clients, ahead);
                        let mut worst = ledger.worst.lock();
                        let margin = |seen: usize, bound: usize| bound as i64 - seen as i64;
                        if worst
                            .as_ref()
                            .is_none_or(|w| margin(seen, bound) < margin(w.seen, w.bound))
                        {
                            *worst = Some(Overrun {
                                seen,
                                bound,
                                ahead,
                                client,
                                served,
                            });
                        }
                    }
                    // Let the other tasks of every client reach their next attempt.
                    tokio::task::yield_now().await;
                    ledger.inside.store(false, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    progress
        .join("clients taking turns on one lock", handles)
        .await;
    let grants = ledger.grants.lock();
    assert_eq!(grants.len(), clients * tasks * rounds);
    assert!(
        grants.windows(2).all(|w| w[0].token < w[1].token),
        "tokens did not increase in grant order"
    );
    drop(grants);
    ledger
}

/// The most grants to other clients a fair-mode waiter may see from its place in its client's
/// queue, behind `ahead` waiters of its own client (DESIGN.md 7.1): its client is served once
/// per turn, so the waiter waits `ahead + 1` turns, in each of which every other client is
/// served at most once; plus one grant its first attempt can lose in a race on a free lock
/// before its client is queued in Redis, and one the measurement counts too early (the
/// previous holder's, stamped just after its acquire returned).
fn fair_bound(clients: usize, ahead: usize) -> usize {
    (ahead + 1) * (clients - 1) + 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_handoff_serves_contending_clients_round_robin() {
    let fx = Fixture::start();
    const CLIENTS: usize = 4;
    // Two and three waiting tasks per client: the client's local queue is FIFO and the client
    // gets one grant per turn, so a waiter behind `ahead` local waiters waits `ahead + 1`
    // turns. Every waiter's wait is checked against its own bound (`fair_bound`), from the
    // moment it had its place in its client's queue.
    let mut worst_seen = Vec::new();
    for (tasks, rounds) in [(2, 8), (3, 6)] {
        let ledger = contend(&fx, true, CLIENTS, tasks, rounds).await;
        let worst = ledger
            .worst
            .lock()
            .clone()
            .expect("some acquisitions waited");
        worst_seen.push(format!(
            "{tasks} tasks: {} behind {} (bound {})",
            worst.seen, worst.ahead, worst.bound
        ));
        assert!(
            worst.seen <= worst.bound,
            "{tasks} tasks per client: a waiter of client {} behind {} waiters of its own client \
             saw {} grants to other clients (bound {}); the clients served while it waited: {:?}",
            worst.client,
            worst.ahead,
            worst.seen,
            worst.bound,
            worst.served
        );
    }
    eprintln!("fair mode, most grants to other clients one waiter saw: {worst_seen:?}");

    // Every entry left the queue with its client's last grant; nothing is left behind.
    assert!(fx.keys("fencelock:{*}queue:*").is_empty());
    assert!(fx.lock_key("contended").is_none());

    // The default mode on the same schedule: a race among the clients' heads, allowed to be
    // unfair. Only its safety is checked (inside `contend`).
    let ledger = contend(&fx, false, CLIENTS, 3, 6).await;
    eprintln!(
        "default mode, 3 tasks: the wait furthest past the fair bound: {:?}",
        ledger.worst.lock().as_ref().map(|w| (w.seen, w.bound))
    );
}

async fn queue_of(fx: &Fixture) -> Vec<String> {
    let keys = fx.keys("fencelock:{*}queue:*");
    match keys.as_slice() {
        [] => Vec::new(),
        [key] => fx.raw().zrange(key, 0, -1).unwrap(),
        more => panic!("several queues: {more:?}"),
    }
}

/// Waits until the lock's queue in Redis is exactly `expected` (client ids, first first).
async fn queue_becomes(fx: &Fixture, expected: &[&str]) {
    let limit = std::time::Instant::now() + WAIT;
    loop {
        let seen = queue_of(fx).await;
        if seen == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < limit,
            "queue is {seen:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn fair_client(fx: &Fixture, grace: Duration) -> LockClient {
    fx.builder().fair_handoff(grace).connect().await.unwrap()
}

/// Puts `client` first in the queue of the held lock `name`, as a client that failed an
/// attempt and then crashed leaves it (an entry nobody will claim or remove).
fn queue_crashed(fx: &Fixture, name: &str, client: &str) {
    let lock = fx.lock_key(name).expect("the lock is held");
    let text = String::from_utf8(lock).unwrap();
    let queue = text.replacen("}lock:", "}queue:", 1);
    let mut raw = fx.raw();
    let _: () = raw.zadd(&queue, client, 0).unwrap();
    let _: () = raw.pexpire(&queue, 60_000).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_reserved_client_costs_one_grace_not_the_lock() {
    let fx = Fixture::start();
    // Short: the test waits this out once.
    let grace = Duration::from_millis(100);
    let holder = fair_client(&fx, grace).await;
    let next = fair_client(&fx, grace).await;
    let guard = holder.lock("stranded").unwrap().acquire().await.unwrap();
    queue_crashed(&fx, "stranded", "crashed-client");
    let lock = next.lock("stranded").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await.unwrap().token() });
    queue_becomes(&fx, &["crashed-client", next.id()]).await;

    // The release reserves the lock for the crashed client, which will never claim it; when
    // the grace ends the next client's head (its timer set to the reservation's pttl) takes it.
    let first = guard.token();
    guard.release().await.unwrap();
    let token = within(
        HANDOFF,
        "the next client's takeover one grace after the crashed client's reservation",
        waiting,
    )
    .await
    .unwrap();
    assert!(token > first);
    assert!(queue_of(&fx).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_last_waiter_gives_up_leaves_the_queue() {
    let fx = Fixture::start();
    for gives_up_by in ["cancelled", "timed out", "client dropped"] {
        let holder = fair_client(&fx, LONG_GRACE).await;
        let quitter = fair_client(&fx, LONG_GRACE).await;
        let next = fair_client(&fx, LONG_GRACE).await;
        let guard = holder.lock("quit").unwrap().acquire().await.unwrap();

        let lock = quitter.lock("quit").unwrap();
        let quitting = if gives_up_by == "timed out" {
            // Long enough for its attempts, the queue checks below and the next client's
            // attempt to happen before it gives up; the holder keeps the lock far longer.
            tokio::spawn(async move {
                let err = lock
                    .acquire_timeout(Duration::from_secs(3))
                    .await
                    .unwrap_err();
                assert!(err.is_timeout(), "{err}");
            })
        } else {
            tokio::spawn(async move {
                let _ = lock.acquire().await;
            })
        };
        queue_becomes(&fx, &[quitter.id()]).await;
        let lock = next.lock("quit").unwrap();
        let waiting = tokio::spawn(async move { lock.acquire().await.unwrap().token() });
        queue_becomes(&fx, &[quitter.id(), next.id()]).await;

        if gives_up_by == "timed out" {
            quitting.await.unwrap();
        } else {
            quitting.abort();
            assert!(quitting.await.unwrap_err().is_cancelled());
        }
        if gives_up_by == "client dropped" {
            drop(quitter);
            queue_becomes(&fx, &[next.id()]).await;
        } else {
            queue_becomes(&fx, &[next.id()]).await;
            drop(quitter);
        }
        // So the release reserves the lock for the client that still waits.
        let first = guard.token();
        guard.release().await.unwrap();
        let token = woken(
            "the release reserving the lock for the client that still waits",
            waiting,
        )
        .await
        .unwrap();
        assert!(token > first, "{gives_up_by}");
        assert!(queue_of(&fx).await.is_empty(), "{gives_up_by}");
    }
}

/// An acquisition that ends at its very first attempt (the deadline passed by the time it came
/// back, or the future was dropped while it was in flight) has no place in the local queue yet,
/// but that attempt queued its client in Redis: the client leaves the queue all the same,
/// instead of leaving an entry that would get the next release's reservation and cost everyone
/// a grace. The queue would otherwise live for the lease plus 2 x 30 s + 1 s, well past the
/// 30 s `queue_becomes` waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_ending_at_its_first_attempt_leaves_the_queue() {
    let fx = Fixture::start();
    let holder = fair_client(&fx, LONG_GRACE).await;
    let guard = holder.lock("first").unwrap().acquire().await.unwrap();

    // The deadline has passed when the first attempt comes back busy.
    let hasty = fair_client(&fx, LONG_GRACE).await;
    let err = hasty
        .lock("first")
        .unwrap()
        .acquire_timeout(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    queue_becomes(&fx, &[]).await;

    // Dropped while its first attempt is in flight: the script ran (the client is queued),
    // the reply is held back by the network.
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let dropped = LockClient::builder(proxy.url())
        .fair_handoff(LONG_GRACE)
        .connect()
        .await
        .unwrap();
    let lock = dropped.lock("first").unwrap();
    proxy.blackhole(Direction::Downstream);
    let attempt = tokio::spawn(async move { lock.acquire().await.map(drop) });
    queue_becomes(&fx, &[dropped.id()]).await;
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    queue_becomes(&fx, &[]).await;
    proxy.heal();

    // The lock was never reserved for either: the release frees it.
    guard.release().await.unwrap();
    assert!(eventually(WAIT, || fx.lock_key("first").is_none()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_held_for_everyone_else_shown_by_admin_and_force_releasable() {
    let fx = Fixture::start();
    let holder = fair_client(&fx, LONG_GRACE).await;
    let reserved = fair_client(&fx, LONG_GRACE).await;
    let other = fair_client(&fx, LONG_GRACE).await;
    let plain = fx.client().await;

    let lock = holder.lock("handoff").unwrap();
    let guard = lock.acquire().await.unwrap();
    let first = guard.token();
    // First in the queue without a waiter (a crashed process leaves that).
    queue_crashed(&fx, "handoff", reserved.id());
    guard.release().await.unwrap();

    // Reserved for a client with no waiter left, for the whole (long) grace.
    let admin = Admin::connect(&fx.server.url()).await.unwrap();
    let detail = admin.lock("handoff").await.unwrap();
    assert_eq!(detail.lock.reserved_for.as_deref(), Some(reserved.id()));
    assert!(!detail.lock.is_held());
    // The reservation's remaining grace is shown as the key's time to live.
    let ttl = detail.lock.ttl.expect("a reservation has a time to live");
    assert!(ttl > Duration::ZERO && ttl <= LONG_GRACE, "{ttl:?}");
    assert!(detail.to_string().contains("handoff"), "{detail}");
    let listed = admin.locks().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        listed[0].to_string().contains(reserved.id()),
        "{}",
        listed[0]
    );

    // Held for everyone else, whatever their mode and method.
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert!(other
        .lock("handoff")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(plain
        .lock("handoff")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    // Long enough for the first attempt to come back (and queue the client) before the
    // deadline, so the waiter gives up from the queue; the reservation lasts 30 s, so it does
    // give up.
    let timed_out = other
        .lock("handoff")
        .unwrap()
        .acquire_timeout(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(timed_out.is_timeout(), "{timed_out}");
    // The timed-out waiter was its client's last: the client left the queue again.
    queue_becomes(&fx, &[]).await;

    // A waiter of another client is woken by the operator's force release and wins.
    let lock = other.lock("handoff").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await.unwrap() });
    queue_becomes(&fx, &[other.id()]).await;
    match admin.force_release("handoff", None).await.unwrap() {
        fencelock::admin::ForceRelease::Evicted { holder, token, .. } => {
            assert_eq!(holder.id, format!("~reserved:{}", reserved.id()));
            assert_eq!(token, None);
        }
        other => panic!("{other:?}"),
    }
    let guard = woken("the operator's force release", waiting)
        .await
        .unwrap();
    assert!(guard.token() > first);
    guard.release().await.unwrap();
    assert!(queue_of(&fx).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserved_client_claims_with_a_fresh_token_and_guards_of_the_old_hold_are_not_held() {
    let fx = Fixture::start();
    let first_client = fair_client(&fx, LONG_GRACE).await;
    let second_client = fair_client(&fx, LONG_GRACE).await;
    let lock = first_client.lock("claimed").unwrap();
    let guard = lock.acquire().await.unwrap();
    let inner = guard.reenter().await.unwrap();
    let waiting = second_client.lock("claimed").unwrap();
    let waiting = tokio::spawn(async move { waiting.acquire().await.unwrap() });
    queue_becomes(&fx, &[second_client.id()]).await;

    let first = guard.token();
    inner.release().await.unwrap();
    guard.release().await.unwrap();
    let claimed = woken(
        "the release reserving the lock for the second client",
        waiting,
    )
    .await
    .unwrap();
    assert!(claimed.token() > first);
    // The new holder is an ordinary one: re-entry, extension, and a release that frees the
    // lock (nobody queued: the hash is deleted).
    let again = claimed.reenter().await.unwrap();
    assert_eq!(again.token(), claimed.token());
    again.release().await.unwrap();
    claimed.extend(Duration::from_secs(5)).await.unwrap();
    claimed.release().await.unwrap();
    assert!(fx.lock_key("claimed").is_none());
    assert!(queue_of(&fx).await.is_empty());
}

/// All clients of a lock should use one mode; mixing them loses the order, never safety.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixing_fair_and_default_clients_stays_safe() {
    let fx = Fixture::start();
    let ledger = Arc::new(Ledger::default());
    let progress = Progress::new();
    let mut handles = Vec::new();
    for client in 0..4 {
        let builder = fx.builder();
        let lock_client = if client % 2 == 0 {
            builder.fair_handoff(Duration::from_millis(200))
        } else {
            builder
        }
        .connect()
        .await
        .unwrap();
        for _ in 0..2 {
            let lock = lock_client.lock("mixed").unwrap();
            let (ledger, progress) = (ledger.clone(), progress.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let guard = lock.acquire().await.unwrap();
                    progress.tick();
                    assert!(
                        !ledger.inside.swap(true, Ordering::SeqCst),
                        "two holders at once"
                    );
                    ledger.grants.lock().push(Grant {
                        client,
                        token: guard.token(),
                        at: events::tick(),
                    });
                    tokio::task::yield_now().await;
                    ledger.inside.store(false, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    progress
        .join("fair and default clients taking turns", handles)
        .await;
    let grants = ledger.grants.lock();
    assert_eq!(grants.len(), 4 * 2 * 8);
    assert!(grants.windows(2).all(|w| w[0].token < w[1].token));
    // What a mixed run may leave: a reservation or queue entries, each with an expiry.
    let mut raw = fx.raw();
    for key in fx
        .keys("fencelock:{*}queue:*")
        .into_iter()
        .chain(fx.lock_key("mixed"))
    {
        let ttl: i64 = raw.pttl(&key).unwrap();
        assert!(ttl != -1, "{} has no expiry", String::from_utf8_lossy(&key));
    }
}

#[tokio::test]
async fn fair_mode_refuses_multi_locks_and_bad_graces_and_keeps_its_queue_past_the_lease() {
    let fx = Fixture::start();
    let client = fair_client(&fx, Duration::from_millis(100)).await;
    assert_eq!(client.fair_handoff(), Some(Duration::from_millis(100)));
    let err = client.multi_lock(["a", "b"]).unwrap_err();
    assert!(
        matches!(err, fencelock::Error::InvalidLockSet { .. }),
        "{err:?}"
    );
    assert_eq!(fx.client().await.fair_handoff(), None);
    for grace in [
        Duration::ZERO,
        Duration::from_micros(1500),
        Duration::from_secs(61),
    ] {
        let err = fx
            .builder()
            .fair_handoff(grace)
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(err, fencelock::Error::InvalidConfig { .. }),
            "{grace:?}: {err:?}"
        );
    }
    // The queue outlives the holder's lease by twice the grace plus a second of slack, so a
    // waiter that sleeps out a long hold keeps its place.
    let grace = Duration::from_secs(5);
    let holder = fair_client(&fx, grace).await;
    let waiter = fair_client(&fx, grace).await;
    let guard = holder.lock("slack").unwrap().acquire().await.unwrap();
    let lock = waiter.lock("slack").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await });
    let queued = eventually(Duration::from_secs(5), || {
        !fx.keys("fencelock:{*}queue:slack").is_empty()
    })
    .await;
    assert!(queued, "the waiter never queued");
    // Both PTTLs in one script, so at one instant: two reads one after the other would count
    // the time between them against the slack (CI once saw 11.001 s this way). The script
    // reads the lease and sets the queue's expiry a moment apart, so allow a few ms.
    let mut raw = fx.raw();
    let queue_key = fx.keys("fencelock:{*}queue:slack")[0].clone();
    let (queue_at, lock_at): (i64, i64) =
        redis::Script::new("return {redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2])}")
            .key(&queue_key)
            .key(fx.lock_key("slack").unwrap())
            .invoke(&mut raw)
            .unwrap();
    let beyond = Duration::from_millis((queue_at - lock_at).max(0) as u64);
    assert!(
        beyond > grace * 2 && beyond <= grace * 2 + Duration::from_millis(1_050),
        "the queue outlives the lease by {beyond:?}"
    );
    guard.release().await.unwrap();
    let next = woken("the release of the long hold", waiting)
        .await
        .unwrap();
    next.unwrap().release().await.unwrap();

    // Both ends of the documented range are accepted.
    for grace in [Duration::from_millis(1), Duration::from_secs(60)] {
        let client = fair_client(&fx, grace).await;
        assert_eq!(client.fair_handoff(), Some(grace));
    }
}

/// Round trips: a waiter's failed attempt is one EVALSHA, as in the default mode (the queue
/// entry rides on it), a claim is one, the release that reserves is one. (The waiter's wait
/// records, sent beside its attempts, are switched off: they are no round trip of its path.)
#[tokio::test]
async fn a_handoff_takes_no_extra_round_trip() {
    let fx = Fixture::start();
    let a = fair_client(&fx, LONG_GRACE).await;
    let b = fx
        .builder()
        .fair_handoff(LONG_GRACE)
        .record_waits(false)
        .connect()
        .await
        .unwrap();
    // Every script loaded, so that the count has no NOSCRIPT round trip in it.
    fx.warm_up(&a).await;
    let guard = a.lock("trips").unwrap().acquire().await.unwrap();
    let before = fx.calls("evalsha") + fx.calls("eval");
    let lock = b.lock("trips").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await.unwrap() });
    queue_becomes(&fx, &[b.id()]).await;
    guard.release().await.unwrap();
    let claimed = woken("the release reserving the lock for b", waiting)
        .await
        .unwrap();
    let calls = fx.calls("evalsha") + fx.calls("eval") - before;
    // b: the fast-path attempt, the head's attempt after subscribing (when it comes before the
    // release), the claim; a: the release.
    assert!(
        (3..=4).contains(&calls),
        "{calls} script calls for one contended handoff"
    );
    claimed.release().await.unwrap();
    assert!(eventually(WAIT, || fx.lock_key("trips").is_none()).await);
}

on_topologies_multi_thread! {
    /// Two clients queue one after the other behind a holder; the lock goes to them in that
    /// order (their tokens say so), on one server and on a cluster (sharded pub/sub, the queue
    /// in the lock's slot).
    async fn queued_clients_are_served_in_queue_order(fx) {
        let connect = || fx.builder().fair_handoff(LONG_GRACE).connect();
        let (a, b, c) = (connect().await.unwrap(), connect().await.unwrap(), connect().await.unwrap());
        let guard = a.lock("ordered").unwrap().acquire().await.unwrap();
        let queued = |n: usize| {
            let keys = fx.keys("fencelock:{*}queue:*");
            let mut raw = fx.raw();
            keys.iter()
                .map(|k| raw.zcard::<_, usize>(k).unwrap())
                .sum::<usize>()
                == n
        };
        let mut waiting = Vec::new();
        for (n, client) in [(1, &b), (2, &c)] {
            let lock = client.lock("ordered").unwrap();
            waiting.push(tokio::spawn(async move {
                let guard = lock.acquire().await.unwrap();
                let token = guard.token();
                guard.release().await.unwrap();
                token
            }));
            assert!(eventually(WAIT, || queued(n)).await, "client {n} never queued");
        }
        let first = guard.token();
        guard.release().await.unwrap();
        let mut tokens = vec![first];
        for handle in waiting {
            tokens.push(woken("the release handing the lock down the queue", handle).await.unwrap());
        }
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "not served in queue order: {tokens:?}"
        );
        assert!(eventually(WAIT, || fx.keys("fencelock:{*}queue:*").is_empty()).await);
        assert!(fx.lock_key("ordered").is_none());
    }
}

/// A claim whose reply is lost is re-sent with the same holder id and applies once: the same
/// token, one entry, no second reservation or queue entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_sent_claim_applies_once() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let holder = fair_client(&fx, LONG_GRACE).await;
    let claimer = LockClient::builder(proxy.url())
        .fair_handoff(LONG_GRACE)
        .connect()
        .await
        .unwrap();
    let guard = holder.lock("resent").unwrap().acquire().await.unwrap();
    // The claimer is first in line (as after a failed attempt) and the lock is reserved for it.
    queue_crashed(&fx, "resent", claimer.id());
    let first = guard.token();
    guard.release().await.unwrap();
    let admin = Admin::connect(&fx.server.url()).await.unwrap();
    let detail = admin.lock("resent").await.unwrap();
    assert_eq!(detail.lock.reserved_for.as_deref(), Some(claimer.id()));

    // The claim runs on Redis, its reply is lost with the connection; the client re-sends it
    // on a new one.
    let claiming = claimer.lock("resent").unwrap();
    proxy.blackhole(Direction::Downstream);
    let lock_key = fx.lock_key("resent").unwrap();
    let claimed_on_redis = || {
        let fields: Vec<(String, String)> = fx.raw().hgetall(&lock_key).unwrap();
        fields.iter().any(|(f, _)| f.starts_with(claimer.id()))
    };
    // The reply must have reached the proxy (and been dropped) before the connection is cut:
    // a cut that overtakes the reply on a busy machine would lose it without counting it.
    let reply_dropped = || proxy.stats().downstream.bytes_dropped > 0;
    let (claimed, ()) = tokio::join!(claiming.acquire(), async {
        assert!(eventually(WAIT, claimed_on_redis).await, "no claim");
        assert!(
            eventually(WAIT, reply_dropped).await,
            "the claim's reply never reached the proxy"
        );
        proxy.reset_all();
        proxy.heal();
    });
    let claimed = claimed.unwrap();
    assert!(claimed.token() > first);
    let (holders, token) = fx.lock_state("resent").unwrap();
    assert_eq!(holders, vec![(claimed.holder_id().to_owned(), 1)]);
    assert_eq!(token, claimed.token().get());
    assert!(
        proxy.stats().downstream.bytes_dropped > 0,
        "no reply was lost"
    );
    assert!(queue_of(&fx).await.is_empty());
    claimed.release().await.unwrap();
    assert!(fx.lock_key("resent").is_none());
}
