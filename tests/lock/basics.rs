//! The core semantics of the issue "reentrant fenced lock on one Redis", each against a real
//! redis-server started for the test.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::deadline::{woken, Progress};
use crate::common::Fixture;
use fencelock::{Error, LockClient, MAX_NAME_LEN};
use redis::Commands;

on_topologies! {
    async fn two_clients_exclude_each_other(fx) {
        let (a, b) = (fx.client().await, fx.client().await);
        assert_ne!(a.id(), b.id());
        let guard = a.lock("res").unwrap().try_acquire().await.unwrap().unwrap();
        assert!(b
            .lock("res")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        let err = b
            .lock("res")
            .unwrap()
            .acquire_timeout(Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        // It names what it waited for.
        assert!(matches!(&err, Error::Timeout { name, .. } if name == "res"), "{err:?}");
        assert!(err.to_string().starts_with("timed out after "), "{err}");
        assert!(err.to_string().ends_with(" waiting for res"), "{err}");
        let first_token = guard.token();
        guard.release().await.unwrap();
        let next = b.lock("res").unwrap().try_acquire().await.unwrap().unwrap();
        assert!(next.token() > first_token);
        next.release().await.unwrap();
        assert!(fx.lock_state("res").is_none());
    }
}

on_topologies_multi_thread! {
    async fn many_clients_and_tasks_keep_the_critical_section_exclusive(fx) {
        const CLIENTS: usize = 4;
        const TASKS: usize = 8;
        const ROUNDS: usize = 100;
        let inside = Arc::new(AtomicUsize::new(0));
        let max_inside = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let progress = Progress::new();
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let client = fx.client().await;
            for _ in 0..TASKS {
                let lock = client.lock("hot").unwrap();
                let (inside, max_inside, order) = (inside.clone(), max_inside.clone(), order.clone());
                let progress = progress.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..ROUNDS {
                        let guard = lock.acquire().await.unwrap();
                        progress.tick();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_inside.fetch_max(now, Ordering::SeqCst);
                        order.lock().push(guard.token());
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.unwrap();
                    }
                }));
            }
        }
        progress.join("32 tasks of 4 clients taking turns", tasks).await;
        assert_eq!(max_inside.load(Ordering::SeqCst), 1);
        let order = order.lock();
        assert_eq!(order.len(), CLIENTS * TASKS * ROUNDS);
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "tokens must increase in acquisition order"
        );
        assert!(fx.lock_state("hot").is_none(), "the lock must end free");
    }
}

on_topologies! {
    async fn reentry_counts_up_and_down_with_one_token(fx) {
        let client = fx.client().await;
        let lock = client.lock("nested").unwrap();
        let outer = lock.acquire().await.unwrap();
        let holder = outer.holder_id().to_owned();
        assert_eq!(
            fx.lock_state("nested").unwrap().0,
            vec![(holder.clone(), 1)]
        );
        let inner = outer.reenter().await.unwrap();
        assert_eq!(inner.token(), outer.token());
        let (holders, token) = fx.lock_state("nested").unwrap();
        assert_eq!(holders, vec![(holder.clone(), 2)]);
        assert_eq!(token, outer.token().get());
        // Nobody else gets in while the holder is inside twice.
        assert!(lock.try_acquire().await.unwrap().is_none());
        inner.release().await.unwrap();
        assert_eq!(fx.lock_state("nested").unwrap().0, vec![(holder, 1)]);
        outer.release().await.unwrap();
        assert!(fx.lock_state("nested").is_none());
    }
}

on_topologies! {
    async fn out_of_order_release_of_nested_guards_frees_at_zero(fx) {
        let client = fx.client().await;
        let lock = client.lock("ooo").unwrap();
        let outer = lock.acquire().await.unwrap();
        let inner = outer.reenter().await.unwrap();
        let innermost = inner.reenter().await.unwrap();
        outer.release().await.unwrap();
        inner.release().await.unwrap();
        assert!(fx.lock_state("ooo").is_some());
        assert!(lock.try_acquire().await.unwrap().is_none());
        innermost.release().await.unwrap();
        assert!(fx.lock_state("ooo").is_none());
    }
}

on_topologies! {
    async fn join_branches_exclude_each_other(fx) {
        let client = fx.client().await;
        let lock = client.lock("joined").unwrap();
        let inside = AtomicUsize::new(0);
        let overlap = AtomicUsize::new(0);
        let branch = || async {
            for _ in 0..20 {
                let guard = woken("the other branch's release", lock.acquire()).await.unwrap();
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlap.fetch_add(1, Ordering::SeqCst);
                }
                // Yield inside the critical section so the other branch runs while we hold.
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        };
        tokio::join!(branch(), branch());
        assert_eq!(overlap.load(Ordering::SeqCst), 0);

        // select!: the losing branch's acquire is dropped mid-wait and must not leave anything.
        let held = lock.acquire().await.unwrap();
        tokio::select! {
            biased;
            _ = lock.acquire() => panic!("acquired a held lock"),
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        held.release().await.unwrap();
        let again = lock.acquire_timeout(Duration::from_secs(5)).await.unwrap();
        again.release().await.unwrap();
        assert!(fx.lock_state("joined").is_none());
    }
}

on_topologies! {
    async fn tokens_increase_across_expiry_delete_and_script_flush(fx) {
        let client = fx.client().await;
        let lock = client.lock("fenced").unwrap();
        let mut seen = Vec::new();

        // Expiry: a short lease runs out, the next holder gets a greater token.
        let short = lock.with_lease(Duration::from_millis(50)).unwrap();
        let first = short.acquire().await.unwrap();
        seen.push(first.token());
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(!first.is_valid());
        let second = lock
            .try_acquire()
            .await
            .unwrap()
            .expect("expired lock is free");
        seen.push(second.token());
        let err = first.release().await.unwrap_err();
        assert!(err.is_not_held());
        // The error names the lock it concerns.
        assert!(
            matches!(&err, fencelock::Error::NotHeld { name, .. } if name == "fenced"),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("fenced is not held"), "{err}");

        // Manual DEL of the lock hash.
        let key = fx.lock_key("fenced").unwrap();
        let _: () = fx.raw().del(&key).unwrap();
        let third = lock.try_acquire().await.unwrap().unwrap();
        seen.push(third.token());
        assert!(second.release().await.unwrap_err().is_not_held());

        // SCRIPT FLUSH: scripts reload transparently.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut fx.raw())
            .unwrap();
        third.release().await.unwrap();
        let fourth = lock.acquire().await.unwrap();
        seen.push(fourth.token());
        fourth.release().await.unwrap();

        // Even deleting every fence counter cannot make tokens go back.
        for counter in fx.keys("fencelock:{*}fence") {
            let _: () = fx.raw().del(counter).unwrap();
        }
        let fifth = lock.acquire().await.unwrap();
        seen.push(fifth.token());
        fifth.release().await.unwrap();

        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    }
}

#[tokio::test]
async fn tokens_increase_across_a_restart_with_and_without_persistence() {
    for persistence in [true, false] {
        let mut fx = if persistence {
            Fixture::with_persistence()
        } else {
            Fixture::start()
        };
        let client = fx.client().await;
        let lock = client.lock("restarted").unwrap();
        let before = lock.acquire().await.unwrap();
        let before_token = before.token();
        before.release().await.unwrap();

        fx.server.restart().unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut fx.raw())
            .unwrap();

        // The client reconnects by itself and reloads its scripts.
        let after = lock.acquire_timeout(Duration::from_secs(10)).await.unwrap();
        assert!(
            after.token() > before_token,
            "persistence={persistence}: {} after {before_token}",
            after.token()
        );
        after.release().await.unwrap();
    }
}

on_topologies! {
    async fn a_non_holder_cannot_release_or_extend(fx) {
        let client = fx.client().await;
        let lock = client.lock("owned").unwrap();
        let stale = lock
            .with_lease(Duration::from_millis(30))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        let current = lock.acquire().await.unwrap();
        let before = fx.lock_state("owned").unwrap();
        let ttl_before: i64 = fx.raw().pttl(fx.lock_key("owned").unwrap()).unwrap();

        assert!(stale
            .extend(Duration::from_secs(600))
            .await
            .unwrap_err()
            .is_not_held());
        assert!(stale.reenter().await.unwrap_err().is_not_held());
        assert!(!stale.is_valid());
        assert!(stale.release().await.unwrap_err().is_not_held());

        assert_eq!(fx.lock_state("owned").unwrap(), before);
        let ttl_after: i64 = fx.raw().pttl(fx.lock_key("owned").unwrap()).unwrap();
        assert!(
            ttl_after <= ttl_before,
            "the stale extend must not touch the lease"
        );
        current.release().await.unwrap();
    }
}

on_topologies! {
    async fn extend_moves_the_lease_and_the_guard_deadline(fx) {
        let client = fx.client().await;
        // Long enough to still be held at the extend: on a cluster every inspection below
        // opens fresh connections to every node.
        let lease = Duration::from_secs(2);
        let lock = client.lock("lease").unwrap().with_lease(lease).unwrap();
        let sent = Instant::now();
        let guard = lock.acquire().await.unwrap();
        let acquired = Instant::now();
        // Measured from the send, less the drift margin (1 % + 2 ms): never later than the server.
        let validity = lease - lease / 100 - Duration::from_millis(2);
        assert!(guard.valid_until() >= sent + validity);
        assert!(guard.valid_until() <= acquired + validity);
        let pttl: i64 = fx.raw().pttl(fx.lock_key("lease").unwrap()).unwrap();
        assert!((1..=2000).contains(&pttl), "{pttl}");

        guard.extend(Duration::from_secs(60)).await.unwrap();
        let pttl: i64 = fx.raw().pttl(fx.lock_key("lease").unwrap()).unwrap();
        assert!(pttl > 50_000, "{pttl}");
        assert!(guard.valid_until() > Instant::now() + Duration::from_secs(55));
        // Past the end of the original lease, wherever the server started it.
        tokio::time::sleep_until((acquired + lease + Duration::from_millis(100)).into()).await;
        assert!(guard.is_valid(), "extended past the original lease");
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn client_default_and_per_lock_leases_apply() {
    let fx = Fixture::start();
    let client = LockClient::builder(fx.server.url())
        .default_lease(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let lock = client.lock("leases").unwrap();
    assert_eq!(lock.lease(), Duration::from_secs(5));
    let guard = lock.acquire().await.unwrap();
    let pttl: i64 = fx.raw().pttl(fx.lock_key("leases").unwrap()).unwrap();
    assert!((4_000..=5_000).contains(&pttl), "{pttl}");
    guard.release().await.unwrap();
    let guard = lock
        .with_lease(Duration::from_secs(90))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let pttl: i64 = fx.raw().pttl(fx.lock_key("leases").unwrap()).unwrap();
    assert!((85_000..=90_000).contains(&pttl), "{pttl}");
    guard.release().await.unwrap();
}

on_topologies! {
    async fn a_dropped_guard_is_released_in_the_background(fx) {
        let client = fx.client().await;
        let lock = client.lock("dropped").unwrap();
        let guard = lock.acquire().await.unwrap();
        drop(guard);
        let next = woken("the dropped guard's background release", lock.acquire()).await.unwrap();
        next.release().await.unwrap();

        // A guard moved to another task is released there.
        let guard = lock.acquire().await.unwrap();
        tokio::spawn(async move { guard.release().await.unwrap() })
            .await
            .unwrap();
        assert!(fx.lock_state("dropped").is_none());
    }
}

#[test]
fn a_guard_dropped_after_its_runtime_is_gone_does_not_panic() {
    let fx = Fixture::start();
    let guard = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let guard = rt.block_on(async {
            let client = LockClient::connect(&fx.server.url()).await.unwrap();
            client
                .lock("orphan")
                .unwrap()
                .with_lease(Duration::from_millis(200))
                .unwrap()
                .acquire()
                .await
                .unwrap()
        });
        drop(rt);
        guard
    };
    drop(guard);
    // The lease is the backstop.
    std::thread::sleep(Duration::from_millis(300));
    assert!(fx.lock_state("orphan").is_none());
}

#[tokio::test]
async fn names_of_any_bytes_map_to_distinct_keys_under_the_prefix() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let long = "x".repeat(MAX_NAME_LEN);
    let names: Vec<Vec<u8>> = vec![
        b"a".to_vec(),
        b"a}".to_vec(),
        b"{a}".to_vec(),
        b"}{".to_vec(),
        b"a}lock:a".to_vec(),
        "\u{1f512} caf\u{e9}".as_bytes().to_vec(),
        vec![0, 255, 10, 13, b'*'],
        long.into_bytes(),
    ];
    let mut guards = Vec::new();
    for name in &names {
        guards.push(
            client
                .lock(name)
                .unwrap()
                .try_acquire()
                .await
                .unwrap()
                .expect("free"),
        );
    }
    let keys = fx.keys("*");
    let lock_keys: Vec<_> = keys
        .iter()
        .filter(|k| k.windows(6).any(|w| w == b"}lock:"))
        .collect();
    assert_eq!(lock_keys.len(), names.len(), "one distinct hash per name");
    assert!(keys.iter().all(|k| k.starts_with(b"fencelock:{")));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_custom_prefix_is_used_and_a_braced_one_is_refused() {
    let fx = Fixture::start();
    let client = LockClient::builder(fx.server.url())
        .prefix("shop:")
        .connect()
        .await
        .unwrap();
    let guard = client.lock("n").unwrap().acquire().await.unwrap();
    assert!(fx.keys("*").iter().all(|k| k.starts_with(b"shop:{")));
    guard.release().await.unwrap();
    let err = LockClient::builder(fx.server.url())
        .prefix("bad{tag}:")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
}

#[tokio::test]
async fn bad_names_and_leases_are_typed_errors() {
    let fx = Fixture::start();
    let client = fx.client().await;
    assert!(matches!(client.lock(""), Err(Error::InvalidName { .. })));
    assert!(matches!(
        client.lock(vec![b'n'; MAX_NAME_LEN + 1]),
        Err(Error::InvalidName { .. })
    ));
    let lock = client.lock("ok").unwrap();
    for lease in [
        Duration::ZERO,
        Duration::from_micros(500),
        Duration::from_micros(1500),
        Duration::from_secs(8 * 24 * 3600),
        Duration::MAX,
    ] {
        let err = lock.with_lease(lease).unwrap_err();
        assert!(
            matches!(err, Error::InvalidLease { .. }),
            "{lease:?}: {err}"
        );
    }
    // "Wait forever" as `Duration::MAX` is no deadline, not an overflow.
    let forever = Duration::MAX;
    let guard = lock.acquire_timeout(forever).await.unwrap();
    guard.release().await.unwrap();
    let both = client.multi_lock(["ok", "other"]).unwrap();
    let both = both.acquire_timeout(forever).await;
    both.unwrap().release().await.unwrap();
    let pool = client.semaphore("pool", 2).unwrap();
    pool.acquire_timeout(1, forever)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let election = client.election("leader").unwrap();
    let leader = election.campaign_timeout(b"me", forever).await;
    leader.unwrap().resign().await.unwrap();
    let guard = lock.acquire().await.unwrap();
    assert!(guard
        .extend(Duration::ZERO)
        .await
        .unwrap_err()
        .is_invalid_input());
    assert!(guard.is_valid(), "a refused extend leaves the lease alone");
    guard.release().await.unwrap();
    let err = LockClient::builder(fx.server.url())
        .default_lease(Duration::ZERO)
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_invalid_input());
    // Nothing but the fence counter and the release's short-lived operation record remains.
    for key in fx.keys("*") {
        let ttl: i64 = fx.raw().pttl(&key).unwrap();
        let is_counter = key.ends_with(b"}fence");
        let is_op_record = key.windows(4).any(|w| w == b"}op:") && ttl > 0;
        assert!(
            is_counter || is_op_record,
            "{}",
            String::from_utf8_lossy(&key)
        );
    }
}

#[tokio::test]
async fn a_foreign_value_at_a_lock_key_is_a_typed_error_and_stays_untouched() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("victim").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    // Find the hash's key by holding it once more, then put a foreign string there.
    let guard = lock.acquire().await.unwrap();
    let key = fx.lock_key("victim").unwrap();
    guard.release().await.unwrap();
    let _: () = fx.raw().set(&key, "someone else's").unwrap();

    let err = lock.try_acquire().await.unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    // The error names the lock whose key it is.
    assert!(
        matches!(&err, fencelock::Error::WrongType { name, .. } if name == "victim"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("a key of victim holds foreign data"),
        "{err}"
    );
    assert!(lock
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap_err()
        .is_wrong_type());
    let value: String = fx.raw().get(&key).unwrap();
    assert_eq!(value, "someone else's");

    // A guard whose key was replaced meanwhile gets the same error from every operation.
    let _: () = fx.raw().del(&key).unwrap();
    let guard = lock.acquire().await.unwrap();
    let _: () = fx.raw().del(&key).unwrap();
    let _: () = fx.raw().rpush(&key, "list").unwrap();
    let err = guard.reenter().await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("a key of victim holds foreign data"),
        "{err}"
    );
    assert!(guard
        .extend(Duration::from_secs(1))
        .await
        .unwrap_err()
        .is_wrong_type());
    let len: usize = fx.raw().llen(&key).unwrap();
    assert_eq!(len, 1);
    let _: () = fx.raw().del(&key).unwrap();
    assert!(guard.release().await.unwrap_err().is_not_held());

    // A foreign value at the fence counter: no lock is taken, the counter stays as it was.
    let counter = fx.keys("fencelock:{*}fence").pop().unwrap();
    let _: () = fx.raw().set(&counter, "not a number").unwrap();
    assert!(lock.try_acquire().await.unwrap_err().is_wrong_type());
    assert!(fx.lock_key("victim").is_none());
    let value: String = fx.raw().get(&counter).unwrap();
    assert_eq!(value, "not a number");
}

#[tokio::test]
async fn ten_thousand_names_leave_a_bounded_number_of_counter_keys() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let names = 10_000;
    let mut tasks = Vec::new();
    for chunk in 0..16 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (chunk..names).step_by(16) {
                let guard = client
                    .lock(format!("order:{i}"))
                    .unwrap()
                    .acquire()
                    .await
                    .unwrap();
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counters = fx.keys("fencelock:{*}fence").len();
    // One counter per slot bucket at most, so the count saturates at 16384 however many names
    // come and go; 10,000 names fill fewer buckets than that.
    assert!(counters <= 16_384, "{counters}");
    assert!(counters < names, "{counters} counters for {names} names");
    assert!(
        fx.keys("fencelock:{*}lock:*").is_empty(),
        "no lock hash left behind"
    );
    let tokens: HashSet<String> = fx
        .keys("fencelock:{*}fence")
        .into_iter()
        .map(|k| redis::Commands::get(&mut fx.raw(), k).unwrap())
        .collect();
    assert!(!tokens.is_empty());
}

/// A client knows what it talks to: the flavour and version the server reported at connect.
#[tokio::test]
async fn a_client_names_its_server() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let binary = fencelock_testing::ServerBinary::current().unwrap();
    let server = client.server();
    assert_eq!(server.version(), binary.version());
    let flavour = if binary.is_valkey() {
        fencelock::ServerFlavour::Valkey
    } else {
        fencelock::ServerFlavour::Redis
    };
    assert_eq!(server.flavour(), flavour);
    assert_eq!(server.to_string(), binary.to_string());
}

#[tokio::test]
async fn an_evicting_memory_policy_is_reported() {
    let fx = Fixture::start();
    let client = fx.client().await;
    assert_eq!(client.eviction_risk().await.unwrap(), None);
    for (policy, mentions_counters) in [("volatile-lru", false), ("allkeys-lfu", true)] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query(&mut fx.raw())
            .unwrap();
        let risk = client.eviction_risk().await.unwrap().expect("a risk");
        assert!(
            risk.contains(policy) && risk.contains("noeviction"),
            "{risk}"
        );
        assert_eq!(risk.contains("fence counters"), mentions_counters, "{risk}");
    }
}

/// A guard says which lock it holds, and its `Debug` (what ends up in logs) names the lock, the
/// holder and the token, never nothing.
#[tokio::test]
async fn a_guard_names_its_lock_holder_and_token() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let guard = client.lock("orders:7").unwrap().acquire().await.unwrap();
    assert_eq!(guard.lock_name(), b"orders:7");
    assert!(
        guard.holder_id().starts_with(client.id()),
        "{}",
        guard.holder_id()
    );
    let shown = format!("{guard:?}");
    for part in ["orders:7", guard.holder_id(), &guard.token().to_string()] {
        assert!(shown.contains(part), "{part:?} missing from {shown}");
    }
    guard.release().await.unwrap();
}

/// The handles a caller logs or matches on say what they are: a lock handle its name and
/// lease, a fenced resource its name.
#[tokio::test]
async fn lock_and_resource_handles_name_themselves() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("orders:8").unwrap();
    assert_eq!(lock.name(), b"orders:8");
    let lock = lock.with_lease(Duration::from_millis(1500)).unwrap();
    let shown = format!("{lock:?}");
    for part in ["orders:8", "1.5s"] {
        assert!(shown.contains(part), "{part:?} missing from {shown}");
    }
    let resource = client.resource("ledger:8").unwrap();
    assert_eq!(resource.name(), b"ledger:8");
    let shown = format!("{resource:?}");
    assert!(shown.contains("ledger:8"), "{shown}");
}

/// The client's own defence against a re-entry script that changes the token (say, a
/// mismatched script left on a server): the re-entry is refused with `Error::Protocol`, never
/// handed out as a guard with a token the holder does not have, and the entry the script
/// counted is undone, so releasing the outer guard frees the lock.
#[tokio::test]
async fn a_re_entry_that_changes_the_token_is_refused_and_undone_by_the_client() {
    let fx = Fixture::start();
    let client = fx
        .builder()
        .negative_control(fencelock::negative_controls::Control::ReentryBumpsToken)
        .connect()
        .await
        .unwrap();
    let outer = client.lock("bumped").unwrap().acquire().await.unwrap();
    let err = outer.reenter().await.unwrap_err();
    assert!(
        matches!(err, fencelock::Error::Protocol(_)),
        "expected a protocol error, got {err:?}"
    );
    assert!(outer.is_valid());

    let holder = outer.holder_id().to_owned();
    let undone = crate::common::eventually(Duration::from_secs(10), || {
        fx.lock_state("bumped")
            .is_some_and(|(holders, _)| holders == vec![(holder.clone(), 1)])
    })
    .await;
    assert!(
        undone,
        "the refused entry was not undone: {:?}",
        fx.lock_state("bumped")
    );
    outer.release().await.unwrap();
    assert_eq!(fx.lock_state("bumped"), None, "the lock was left held");
}
