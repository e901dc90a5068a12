//! Multi-lock: several locks taken as one, all or nothing, in one global order. Every test runs
//! the standalone path (one script for the whole set) and, where it matters, the member-by-member
//! path with rollback that a cluster needs (forced on the standalone server).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::cancel::CancelPoints;
use crate::common::deadline::{woken, Progress};
use crate::common::{eventually, Fixture};
use fencelock::{Error, LockClient, MultiLock, MAX_MULTI_LOCKS};

/// The two acquisition paths of a multi-lock.
#[derive(Debug, Clone, Copy)]
enum Path {
    OneScript,
    Ordered,
}

fn set(client: &LockClient, names: &[&str], path: Path) -> MultiLock {
    let set = client.multi_lock(names).unwrap();
    match path {
        Path::OneScript => set,
        Path::Ordered => set.force_ordered_acquisition(),
    }
}

/// `tasks_per_direction` tasks per ordered pair of `accounts` (both directions), spread over
/// two clients, each moving money `rounds` times between its pair under a multi-lock, with
/// claiming reads and fenced writes. Returns the number of transfers done.
async fn transfers(fx: &Fixture, accounts: &[&str], tasks_per_direction: usize, path: Path) -> u64 {
    const START: i64 = 1_000;
    const ROUNDS: usize = 10;
    let clients = [fx.client().await, fx.client().await];
    let setup = clients[0]
        .multi_lock(accounts)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    for account in accounts {
        let balance = clients[0].resource(format!("balance:{account}")).unwrap();
        balance
            .set(setup.token(account).unwrap(), START.to_string())
            .await
            .unwrap();
    }
    setup.release().await.unwrap();

    let done = Arc::new(AtomicU64::new(0));
    let progress = Progress::new();
    let mut tasks = Vec::new();
    let mut n = 0;
    for (i, from) in accounts.iter().enumerate() {
        for (j, to) in accounts.iter().enumerate() {
            if i == j {
                continue;
            }
            for _ in 0..tasks_per_direction {
                let client = clients[n % 2].clone();
                n += 1;
                let (from, to) = (from.to_string(), to.to_string());
                let (done, progress) = (done.clone(), progress.clone());
                let both = set(&client, &[&from, &to], path);
                tasks.push(tokio::spawn(async move {
                    let from_balance = client.resource(format!("balance:{from}")).unwrap();
                    let to_balance = client.resource(format!("balance:{to}")).unwrap();
                    for round in 0..ROUNDS {
                        // A deadlock or a missing wake-up stops every grant, which `progress`
                        // reports; contention does not.
                        let guard = both
                            .acquire()
                            .await
                            .unwrap_or_else(|e| panic!("{from}->{to} round {round}: {e}"));
                        progress.tick();
                        let (t_from, t_to) =
                            (guard.token(&from).unwrap(), guard.token(&to).unwrap());
                        let have = from_balance.get_i64(t_from).await.unwrap().unwrap();
                        let amount = (round as i64 % 7) + 1;
                        if have >= amount {
                            to_balance.get_i64(t_to).await.unwrap().unwrap();
                            from_balance.incr_by(t_from, -amount).await.unwrap();
                            to_balance.incr_by(t_to, amount).await.unwrap();
                        }
                        guard.release().await.unwrap();
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
    }
    progress.join("transfers between the accounts", tasks).await;

    let mut total = 0;
    for account in accounts {
        let balance = clients[0].resource(format!("balance:{account}")).unwrap();
        total += balance.peek_i64().await.unwrap().unwrap();
        assert!(fx.lock_state(account).is_none(), "{account} left held");
    }
    assert_eq!(
        total,
        START * accounts.len() as i64,
        "money created or lost"
    );
    let transfers = done.load(Ordering::Relaxed);
    assert_eq!(
        transfers,
        (accounts.len() * (accounts.len() - 1) * tasks_per_direction * ROUNDS) as u64
    );
    transfers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_transfers_between_two_accounts_never_deadlock() {
    let fx = Fixture::start();
    transfers(&fx, &["acct:a", "acct:b"], 8, Path::OneScript).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_transfers_never_deadlock_on_the_ordered_path() {
    let fx = Fixture::start();
    transfers(&fx, &["acct:a", "acct:b"], 8, Path::Ordered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_among_three_accounts_never_deadlock() {
    let fx = Fixture::start();
    // 6 directed pairs x 3 tasks: every pair in both directions, 18 tasks.
    transfers(&fx, &["acct:x", "acct:y", "acct:z"], 3, Path::OneScript).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_member_leaves_no_other_member_held() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    let other = b.lock("m:2").unwrap().acquire().await.unwrap();
    for path in [Path::OneScript, Path::Ordered] {
        let names = ["m:3", "m:1", "m:2", "m:4"];
        let three = set(&a, &names, path);
        assert!(three.try_acquire().await.unwrap().is_none(), "{path:?}");
        // Long enough that the set's attempts (the first, and one after subscribing) are over
        // by the deadline, so none is still being undone in the background when we look.
        let err = three
            .acquire_timeout(Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(err.is_timeout(), "{path:?}: {err}");
        // It names the set's members, in the set's order.
        let waited_for = err.to_string();
        assert!(
            waited_for.ends_with("waiting for m:1, m:2, m:3, m:4"),
            "{waited_for}"
        );
        for name in ["m:1", "m:3", "m:4"] {
            assert!(fx.lock_state(name).is_none(), "{path:?}: {name} left held");
        }
        let (holders, _) = fx.lock_state("m:2").unwrap();
        assert_eq!(holders, vec![(other.holder_id().to_owned(), 1)]);
    }
    // The members freed by the rollback are free for anyone at once.
    for name in ["m:1", "m:3", "m:4"] {
        b.lock(name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    other.release().await.unwrap();
    let all = a
        .multi_lock(["m:1", "m:2"])
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    all.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_gets_the_locks_when_the_last_busy_member_is_released() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    let first = b.lock("w:1").unwrap().acquire().await.unwrap();
    let second = b.lock("w:2").unwrap().acquire().await.unwrap();
    let both = a.multi_lock(["w:2", "w:1"]).unwrap();
    let waiting = tokio::spawn(async move { both.acquire_timeout(Duration::from_secs(30)).await });
    // Released one after the other: the waiter moves from the first busy member's queue to
    // the next one's, and takes both only when both are free.
    first.release().await.unwrap();
    // All or nothing: while w:2 is held, w:1 is never taken alone.
    assert!(
        !eventually(Duration::from_millis(300), || fx
            .lock_state("w:1")
            .is_some())
        .await
    );
    second.release().await.unwrap();
    let guard = woken("the last busy member's release", waiting)
        .await
        .unwrap()
        .unwrap();
    let t1 = fx.lock_state("w:1").unwrap().1;
    let t2 = fx.lock_state("w:2").unwrap().1;
    assert_eq!(guard.token("w:1").unwrap().get(), t1);
    assert_eq!(guard.token("w:2").unwrap().get(), t2);
    guard.release().await.unwrap();
    assert!(fx.lock_state("w:1").is_none() && fx.lock_state("w:2").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_set_is_one_script_to_take_and_one_to_release() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let trio = client.multi_lock(["s:c", "s:a", "s:b"]).unwrap();
    // Loads both scripts, so the counts below are exact.
    trio.acquire().await.unwrap().release().await.unwrap();

    let before = fx.calls("evalsha");
    let guard = trio.acquire().await.unwrap();
    assert_eq!(fx.calls("evalsha") - before, 1);
    let names: Vec<&[u8]> = guard.tokens().map(|(name, _)| name).collect();
    assert_eq!(names, trio.names().collect::<Vec<_>>());
    for (name, token) in guard.tokens() {
        let name = std::str::from_utf8(name).unwrap();
        let (holders, stored) = fx.lock_state(name).unwrap();
        assert_eq!(stored, token.get(), "{name}");
        assert_eq!(holders.len(), 1);
        assert_eq!(holders[0].1, 1);
    }
    guard.release().await.unwrap();
    assert_eq!(fx.calls("evalsha") - before, 2);
    for name in ["s:a", "s:b", "s:c"] {
        assert!(fx.lock_state(name).is_none());
    }
}

/// The ordered path (a cluster's) really goes member by member, even on a server where one
/// script could take the whole set: one acquire script per member, in the global order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ordered_path_takes_the_set_one_member_per_script() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let trio = client
        .multi_lock(["o:c", "o:a", "o:b"])
        .unwrap()
        .force_ordered_acquisition();
    trio.acquire().await.unwrap().release().await.unwrap();

    let before = fx.calls("evalsha");
    let guard = trio.acquire().await.unwrap();
    assert_eq!(fx.calls("evalsha") - before, 3, "one acquire per member");
    let tokens: Vec<u64> = guard.tokens().map(|(_, token)| token.get()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "taken in the global order, each with a fresh token: {tokens:?}"
    );
    guard.release().await.unwrap();
    for name in ["o:a", "o:b", "o:c"] {
        assert!(fx.lock_state(name).is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_names_its_members_in_debug_output() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let pair = client.multi_lock(["dbg:b", "dbg:a"]).unwrap();
    let shown = format!("{pair:?}");
    assert!(shown.starts_with("MultiLock"), "{shown}");
    assert!(
        shown.contains("dbg:a") && shown.contains("dbg:b"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_set_shows_its_members_and_comes_apart_into_their_guards() {
    let fx = Fixture::start();
    let client = fx.client().await;
    for path in [Path::OneScript, Path::Ordered] {
        let pair = set(&client, &["g:b", "g:a"], path);
        let order: Vec<Vec<u8>> = pair.names().map(<[u8]>::to_vec).collect();
        let guard = pair.acquire().await.unwrap();
        let shown = format!("{guard:?}");
        assert!(shown.starts_with("MultiGuard"), "{path:?}: {shown}");
        assert!(shown.contains("g:a") && shown.contains("g:b"), "{shown}");
        let tokens: Vec<_> = guard.tokens().map(|(_, t)| t).collect();
        let members = guard.into_guards();
        let names: Vec<Vec<u8>> = members.iter().map(|g| g.lock_name().to_vec()).collect();
        assert_eq!(names, order, "{path:?}: the members, in the global order");
        assert_eq!(
            members.iter().map(|g| g.token()).collect::<Vec<_>>(),
            tokens
        );
        // Each member guard releases its own lock.
        for member in members {
            member.release().await.unwrap();
        }
        assert!(fx.lock_state("g:a").is_none() && fx.lock_state("g:b").is_none());
    }
}

/// A set that waits for a busy member sleeps in that member's queue like a single lock's
/// waiter: it must not go back to Redis until the member is released (or its lease ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_sleeps_while_its_busy_member_is_held() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let other = fx.client().await;
    for path in [Path::OneScript, Path::Ordered] {
        let held = other.lock("z:2").unwrap().acquire().await.unwrap();
        let channel = fx.lock_key("z:2").unwrap();
        // The previous round's set may not have unsubscribed yet.
        assert!(
            eventually(Duration::from_secs(30), || fx.subscribers(&channel) == 0).await,
            "{path:?}: the previous waiter stayed subscribed"
        );
        let pair = set(&client, &["z:1", "z:2"], path);
        let waiting =
            tokio::spawn(async move { pair.acquire_timeout(Duration::from_secs(30)).await });
        // Its first attempt, its subscription and the first look after subscribing are behind
        // it once it is subscribed and its script calls stopped.
        assert!(
            eventually(Duration::from_secs(30), || fx.subscribers(&channel) == 1).await,
            "{path:?}: the set never subscribed"
        );
        let before = settled_calls(&fx).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let during = fx.calls("evalsha") - before;
        // At most a first look slowed past the settling and a watchdog renewal of `held`; a
        // polling set would have made one attempt per round trip.
        assert!(during <= 3, "{path:?}: {during} script calls while waiting");
        held.release().await.unwrap();
        let guard = woken("the busy member's release", waiting)
            .await
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
}

/// The server's `EVALSHA` count once it stopped moving: unchanged over 200 ms (30 s limit).
async fn settled_calls(fx: &Fixture) -> u64 {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = fx.calls("evalsha");
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = fx.calls("evalsha");
        if now == last {
            return now;
        }
        assert!(
            std::time::Instant::now() < until,
            "script calls never stopped"
        );
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_the_token_order_of_single_locks() {
    let fx = Fixture::start();
    let client = fx.client().await;
    for path in [Path::OneScript, Path::Ordered] {
        let single = client.lock("t:1").unwrap().acquire().await.unwrap();
        let before = single.token();
        single.release().await.unwrap();
        let pair = set(&client, &["t:1", "t:2"], path);
        let guard = pair.acquire().await.unwrap();
        assert!(guard.token("t:1").unwrap() > before, "{path:?}");
        assert!(guard.token("t:nope").is_none());
        // A member is an ordinary lock: re-entered with the same token, held until both go.
        let inner = guard.guard("t:2").unwrap().reenter().await.unwrap();
        assert_eq!(inner.token(), guard.token("t:2").unwrap());
        guard.release().await.unwrap();
        assert!(fx.lock_state("t:1").is_none());
        assert_eq!(fx.lock_state("t:2").unwrap().0[0].1, 1);
        inner.release().await.unwrap();
        assert!(fx.lock_state("t:2").is_none());
        let after = client.lock("t:1").unwrap().acquire().await.unwrap();
        assert!(after.token() > before);
        after.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_every_member_and_losing_one_loses_the_set() {
    let fx = Fixture::start();
    let client = LockClient::builder(fx.server.url())
        // Renewals a second apart, so a loaded machine delaying one cannot cost a member.
        .default_lease(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let guard = client
        .multi_lock(["l:1", "l:2", "l:3"])
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert_eq!(client.watched_locks(), 3);
    let calls = client.renewal_calls();
    // Outlive the lease: only renewals keep the members. One call renews the three, calls
    // are a third of a lease apart, and the first may come right after the acquisition: five
    // more calls are at least four thirds of a lease after it.
    assert!(
        eventually(Duration::from_secs(30), || client.renewal_calls()
            >= calls + 5)
        .await,
        "the watchdog stopped renewing the set's members"
    );
    assert!(guard.is_valid());
    for name in ["l:1", "l:2", "l:3"] {
        assert!(
            fx.lock_state(name).is_some(),
            "{name} expired while watched"
        );
    }
    // One member deleted behind the holder's back: the set is lost.
    let key = fx.lock_key("l:2").unwrap();
    redis::cmd("DEL")
        .arg(key)
        .query::<()>(&mut fx.raw())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("lost() resolves when a member is lost");
    assert!(!guard.is_valid());
    let err = guard.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert!(fx.lock_state("l:1").is_none() && fx.lock_state("l:3").is_none());
    assert_eq!(client.watched_locks(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_nothing_held() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    let cases: u64 = std::env::var("FENCELOCK_CANCEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let names = ["c:1", "c:2", "c:3"];
    let mut points = CancelPoints::new(0x5eed_3017).with_sleeps_up_to(Duration::from_micros(3000));
    for case in 0..cases {
        let path = if case % 2 == 0 {
            Path::OneScript
        } else {
            Path::Ordered
        };
        let trio = set(&a, &names, path);
        // Half the time another client holds one member and lets go at a random moment.
        let other = if points.rng().below(2) == 0 {
            let name = names[usize::try_from(points.rng().below(3)).unwrap()];
            let guard = b.lock(name).unwrap().acquire().await.unwrap();
            let after = Duration::from_micros(points.rng().below(3000));
            Some(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                guard.release().await.unwrap();
            }))
        } else {
            None
        };
        if let Some(guard) = points.run(Box::pin(trio.acquire())).await {
            guard.unwrap().release().await.unwrap();
        }
        if let Some(other) = other {
            other.await.unwrap();
        }
        assert!(
            eventually(Duration::from_secs(10), || names
                .iter()
                .all(|n| fx.lock_state(n).is_none()))
            .await,
            "case {case} ({path:?}): a member was left held"
        );
    }
    // Both outcomes happened, or the test did not test cancellation.
    points.assert_both_outcomes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sets_are_typed_errors_and_hold_nothing() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let empty: [&str; 0] = [];
    assert!(matches!(
        client.multi_lock(empty).unwrap_err(),
        Error::InvalidLockSet { .. }
    ));
    let twice = client.multi_lock(["d:1", "d:2", "d:1"]).unwrap_err();
    assert!(matches!(twice, Error::InvalidLockSet { .. }), "{twice}");
    assert!(twice.is_invalid_input());
    let bad_name = client.multi_lock(["d:1", ""]).unwrap_err();
    assert!(matches!(bad_name, Error::InvalidName { .. }), "{bad_name}");
    let long = "x".repeat(fencelock::MAX_NAME_LEN + 1);
    assert!(matches!(
        client.multi_lock(["d:1", long.as_str()]).unwrap_err(),
        Error::InvalidName { .. }
    ));
    let many: Vec<String> = (0..=MAX_MULTI_LOCKS).map(|i| format!("d:{i}")).collect();
    assert!(matches!(
        client.multi_lock(&many).unwrap_err(),
        Error::InvalidLockSet { .. }
    ));
    let most = client.multi_lock(&many[..MAX_MULTI_LOCKS]).unwrap();
    assert!(most
        .with_lease(Duration::ZERO)
        .unwrap_err()
        .is_invalid_input());
    assert!(
        fx.keys("fencelock:*").is_empty(),
        "a rejected set sent something"
    );
    // The full-size set works.
    most.acquire().await.unwrap().release().await.unwrap();

    // Foreign data at one member: a typed error, and the other members are not taken.
    redis::cmd("SET")
        .arg(probe_key(&fx, &client, "d:2").await)
        .arg("foreign")
        .query::<()>(&mut fx.raw())
        .unwrap();
    for path in [Path::OneScript, Path::Ordered] {
        let err = set(&client, &["d:1", "d:2", "d:3"], path)
            .try_acquire()
            .await
            .unwrap_err();
        assert!(err.is_wrong_type(), "{path:?}: {err}");
        assert!(fx.lock_state("d:1").is_none() && fx.lock_state("d:3").is_none());
    }
}

/// The lock key of `name`, learnt by taking and releasing the lock once.
async fn probe_key(fx: &Fixture, client: &LockClient, name: &str) -> Vec<u8> {
    let guard = client.lock(name).unwrap().acquire().await.unwrap();
    let key = fx.lock_key(name).unwrap();
    guard.release().await.unwrap();
    key
}

// One runtime thread: once the single waiter has been polled a few times it is certainly in the
// queue behind the set before the release below.
#[tokio::test(flavor = "current_thread")]
async fn a_set_that_moves_to_another_queue_hands_its_wake_up_on() {
    let fx = Fixture::start();
    let (a, b) = (fx.client().await, fx.client().await);
    let set = a.multi_lock(["h:x", "h:y"]).unwrap();
    let order: Vec<String> = set
        .names()
        .map(|n| String::from_utf8(n.to_vec()).unwrap())
        .collect();
    let (first, second) = (order[0].clone(), order[1].clone());
    // Leases far beyond the waits below: only release messages (and their hand-on) wake anyone
    // in time.
    let long = Duration::from_secs(300);
    let held_first = b.lock(&first).unwrap().with_lease(long).unwrap();
    let held_first = held_first.acquire().await.unwrap();
    let held_second = b.lock(&second).unwrap().with_lease(long).unwrap();
    let held_second = held_second.acquire().await.unwrap();

    let set_task = tokio::spawn(async move { set.acquire_timeout(Duration::from_secs(60)).await });
    let channel = fx.lock_key(&first).unwrap();
    assert!(eventually(Duration::from_secs(30), || fx.subscribers(&channel) == 1).await);
    let single = a.lock(&first).unwrap();
    let single_task =
        tokio::spawn(async move { single.acquire_timeout(Duration::from_secs(60)).await });
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }

    // The set wakes first (head of the queue), finds the second member busy and moves to its
    // queue; the single waiter behind it must get the wake-up, not sleep out the lease.
    held_first.release().await.unwrap();
    let single_guard = woken("the wake-up the set hands on", single_task)
        .await
        .unwrap()
        .expect("the wake-up was handed on");
    assert!(!set_task.is_finished());
    held_second.release().await.unwrap();
    single_guard.release().await.unwrap();
    let guard = set_task.await.unwrap().unwrap();
    assert_eq!(guard.guards().len(), 2);
    guard.release().await.unwrap();
}
