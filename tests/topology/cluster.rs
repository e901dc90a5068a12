//! Redis Cluster specifics, against real clusters started by the harness: locks spread over
//! every primary, renewals cut per slot, a manual failover and a slot migration under a held
//! lock with a waiter, and replica acknowledgement (WAIT at the slot's primary, once per node
//! for a set, a frozen replica, a failover, a migration). The semantics shared with one server
//! run on both topologies in `core.rs` and `liveness.rs`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::{key_slot_of_lock, quiet_renewal_calls, Env, Topology};
use fencelock::LockClient;
use fencelock_testing::{send_signal, RedisCluster, RedisServer, Signal};
use redis::Commands;

const LONG: Duration = Duration::from_secs(60);

/// Long enough for a healthy replica on a loaded machine; the tests that must see a shortfall
/// freeze the replica, so they never depend on this being short.
const HEALTHY_ACK: Duration = Duration::from_secs(10);

fn con(node: &RedisServer) -> redis::Connection {
    node.client().get_connection().expect("node connection")
}

fn node_id(cluster: &RedisCluster, node: &RedisServer) -> String {
    cluster
        .topology()
        .unwrap()
        .into_iter()
        .find(|n| n.port == node.port())
        .expect("node in topology")
        .id
}

/// `CLUSTER SETSLOT slot args..` on one node.
fn set_slot(node: &RedisServer, slot: u16, args: &[&str]) {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SETSLOT").arg(slot);
    for arg in args {
        cmd.arg(*arg);
    }
    let _: () = cmd.query(&mut con(node)).unwrap();
}

/// Starts moving `slot` from `source` to `target` (IMPORTING / MIGRATING) and MIGRATEs every
/// key of the slot; the slot itself still belongs to `source` (which now answers ASK) until
/// the caller assigns it with `SETSLOT .. NODE`. Returns the target's node id for that.
fn migrate_slot_keys(
    cluster: &RedisCluster,
    slot: u16,
    source: &RedisServer,
    target: &RedisServer,
) -> String {
    let (source_id, target_id) = (node_id(cluster, source), node_id(cluster, target));
    set_slot(target, slot, &["IMPORTING", &source_id]);
    set_slot(source, slot, &["MIGRATING", &target_id]);
    loop {
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut con(source))
            .unwrap();
        if keys.is_empty() {
            return target_id;
        }
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(target.port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut con(source))
            .unwrap();
    }
}

/// A server without sharded pub/sub cannot wake a cluster client's waiters on the node of a
/// lock's slot: connect refuses it with a typed error naming the server and what it lacks
/// (Redis 6.2), and writes nothing. Every other server is accepted and named.
#[tokio::test]
async fn a_cluster_without_sharded_pubsub_is_refused_at_connect_and_others_are_named() {
    let cluster = RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .unwrap();
    let binary = fencelock_testing::ServerBinary::current().unwrap();
    let outcome = LockClient::connect_cluster(cluster.urls()).await;
    match binary.lacks(fencelock_testing::Feature::ShardedPubSub) {
        Some(_) => {
            let err = outcome.unwrap_err();
            assert!(err.is_unsupported_server(), "{err:?}");
            let text = err.to_string();
            assert!(text.contains(&binary.to_string()), "{text}");
            assert!(text.contains("sharded pub/sub"), "{text}");
            for node in cluster.nodes() {
                let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut con(node)).unwrap();
                assert!(keys.is_empty(), "a refused connect wrote {keys:?}");
            }
        }
        None => {
            let client = outcome.unwrap();
            assert_eq!(client.server().to_string(), binary.to_string());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_names_spread_over_every_primary_and_leave_only_counters() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "ten_thousand_names_spread_over_every_primary_and_leave_only_counters",
    ) {
        return;
    }
    const NAMES: usize = 10_000;
    const TASKS: usize = 50;
    let fx = Env::start(Topology::Cluster);
    // This test is about where the keys go and what is left, not renewal. With the default
    // 30 s lease, on a 2-core machine running the three servers' clusters at once, a release
    // found its lock expired: the watchdog's rounds (one renewal call per slot, about 7,800
    // here) had fallen behind the lease. A lease longer than the test keeps renewal out of
    // it; renewals per slot are `renewals_are_batched_per_slot`'s to check.
    let client = fx
        .builder()
        .default_lease(Duration::from_secs(600))
        .connect()
        .await
        .expect("connect");
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::new();
            for i in (t..NAMES).step_by(TASKS) {
                let lock = client.lock(format!("item:{i}")).unwrap();
                guards.push(
                    lock.try_acquire()
                        .await
                        .unwrap()
                        .expect("a fresh name is free"),
                );
            }
            guards
        }));
    }
    let mut guards = Vec::with_capacity(NAMES);
    for task in tasks {
        guards.extend(task.await.unwrap());
    }
    assert_eq!(guards.len(), NAMES);

    // Every primary holds a share of the locks.
    let primaries = fx.data_nodes();
    assert_eq!(primaries.len(), 3);
    let mut total = 0;
    for node in &primaries {
        let held: Vec<Vec<u8>> = con(node).keys("fencelock:{*}lock:*").unwrap();
        assert!(!held.is_empty(), "no lock on node {}", node.port());
        total += held.len();
    }
    assert_eq!(total, NAMES);
    let tokens: HashSet<_> = guards
        .iter()
        .map(|g| (g.token(), g.holder_id().to_owned()))
        .collect();
    assert_eq!(tokens.len(), NAMES);

    for guard in guards {
        guard.release().await.unwrap();
    }
    assert!(fx.keys("fencelock:{*}lock:*").is_empty());
    // Left behind: one fence counter per slot used, and operation records that expire.
    let slots: HashSet<u16> = (0..NAMES)
        .map(|i| key_slot_of_lock(&format!("item:{i}")))
        .collect();
    assert_eq!(fx.keys("fencelock:{*}fence").len(), slots.len());
    for node in &primaries {
        let mut c = con(node);
        let keys: Vec<Vec<u8>> = c.keys("*").unwrap();
        for key in keys {
            if key.ends_with(b"}fence") || crate::common::fixture_is_name_registration(&key) {
                continue;
            }
            assert!(
                key.windows(4).any(|w| w == b"}op:"),
                "unexpected key {}",
                String::from_utf8_lossy(&key)
            );
            // -2: it expired between KEYS and PTTL, which is the point; -1 would be a leak.
            let ttl: i64 = c.pttl(&key).unwrap();
            assert_ne!(ttl, -1, "an operation record without expiry");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_batched_per_slot() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "renewals_are_batched_per_slot",
    ) {
        return;
    }
    const HELD: usize = 300;
    const BATCH: usize = 100;
    let fx = Env::start(Topology::Cluster);
    // Ticks a second apart: 300 locks stay valid even when a loaded machine slows a tick.
    let lease = Duration::from_secs(3);
    let client = fx
        .builder()
        .default_lease(lease)
        .renew_batch(BATCH)
        .connect()
        .await
        .unwrap();
    // What one tick must cost: a call per slot (and per batch within a slot).
    let mut per_slot: HashMap<u16, usize> = HashMap::new();
    let mut guards = Vec::new();
    for i in 0..HELD {
        let name = format!("held:{i}");
        *per_slot.entry(key_slot_of_lock(&name)).or_default() += 1;
        guards.push(client.lock(&name).unwrap().acquire().await.unwrap());
    }
    let per_tick: u64 = per_slot.values().map(|n| n.div_ceil(BATCH) as u64).sum();
    // Both snapshots between ticks, so every tick in the window is counted whole.
    let calls_before = quiet_renewal_calls(&client).await;
    assert!(
        crate::common::eventually(lease + crate::common::deadline::HANDOFF, || client
            .renewal_calls()
            >= calls_before + 2 * per_tick)
        .await,
        "two ticks did not run within a lease (one every third of it) and a handoff's slack: \
         the watchdog stopped renewing"
    );
    let calls = quiet_renewal_calls(&client).await - calls_before;
    assert!(
        calls.is_multiple_of(per_tick),
        "{calls} renewal calls are not whole ticks of {per_tick} (one per slot)"
    );
    assert!(guards.iter().all(|g| g.is_valid()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Starts a waiter on `name` (held by someone else): the task returns the waiter's token once
/// it got the lock. Its own deadline is far away, so that a slow topology change on a loaded
/// machine never ends the wait; each test bounds the wait from the release instead
/// ([`granted_after_release`]).
fn spawn_waiter(
    client: LockClient,
    name: &'static str,
) -> tokio::task::JoinHandle<fencelock::FencingToken> {
    tokio::spawn(async move {
        let lock = client.lock(name).unwrap().with_lease(LONG).unwrap();
        let guard = lock
            .acquire_timeout(WAITER_DEADLINE)
            .await
            .expect("the waiter gets the lock after the release");
        let token = guard.token();
        guard.release().await.unwrap();
        token
    })
}

/// The deadline of [`spawn_waiter`]'s acquisition.
const WAITER_DEADLINE: Duration = Duration::from_secs(300);

/// The token `waiter` got, which it must get within `within` of the release just made; the
/// holder's lease has long to run, so only the release message can wake it that soon.
async fn granted_after_release(
    waiter: tokio::task::JoinHandle<fencelock::FencingToken>,
    within: Duration,
) -> fencelock::FencingToken {
    match tokio::time::timeout(within, waiter).await {
        Ok(token) => token.unwrap(),
        Err(_) => panic!(
            "the waiter was not granted the lock within {within:?} of the release, with the \
             holder's lease far from over: was the release message lost?"
        ),
    }
}

/// Waits until some client is subscribed to `name`'s release channel at a node of the shard
/// that owns the lock's slot now (its primary or a replica: `SPUBLISH` reaches every node of
/// the shard), as `PUBSUB SHARDCHANNELS` there says. 30 s: 6-node clusters of several tests
/// share 2 cores, and with a 10 s limit this check failed once in four runs of this file while
/// two cargo-mutants runs loaded the machine (it passed alone). `stage` names the call in a
/// failure.
async fn wait_for_subscriber(cluster: &RedisCluster, name: &str, stage: &str) {
    let slot = key_slot_of_lock(name);
    let ok = crate::common::eventually(Duration::from_secs(30), || {
        let Ok(owner) = cluster.primary_for_slot(slot) else {
            return false;
        };
        let mut shard = cluster.replicas_of(owner).unwrap_or_default();
        shard.push(owner);
        shard.into_iter().any(|node| {
            let channels: Vec<Vec<u8>> = redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .query(&mut con(node))
                .unwrap_or_default();
            channels.iter().any(|c| c.ends_with(name.as_bytes()))
        })
    })
    .await;
    assert!(ok, "{stage}: the waiter never subscribed");
}

/// A node drops its shard subscribers by itself when their slot moves, with a `sunsubscribe`
/// push that redis-rs takes for the reply of whatever request is in flight on that node's
/// connection. So a cluster client subscribes on a connection of its own, where no script's
/// reply can be taken: on the lock's node, the connection holding the subscription is not the
/// one that ran the client's latest script, and that one holds no subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_ride_a_connection_that_runs_no_script() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "subscriptions_ride_a_connection_that_runs_no_script",
    ) {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    let client = LockClient::connect_cluster(cluster.urls()).await.unwrap();
    let lock = client.lock("own-connection").unwrap();
    let guard = lock.acquire().await.unwrap();
    let waiter = spawn_waiter(client.clone(), "own-connection");
    wait_for_subscriber(&cluster, "own-connection", "while held").await;
    // A script from the same client to the same node after the subscription.
    assert!(lock.try_acquire().await.unwrap().is_none());

    let primary = cluster
        .primary_for_slot(key_slot_of_lock("own-connection"))
        .unwrap();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut con(primary))
        .unwrap();
    let field = |line: &str, name: &str| -> String {
        line.split(' ')
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .unwrap_or_default()
            .to_owned()
    };
    let subscribed: Vec<&str> = clients
        .lines()
        .filter(|l| field(l, "ssub").parse::<u32>().unwrap_or(0) > 0)
        .collect();
    assert_eq!(subscribed.len(), 1, "one subscribing connection: {clients}");
    assert!(
        !field(subscribed[0], "cmd").starts_with("eval"),
        "the subscribing connection ran a script: {}",
        subscribed[0]
    );
    assert!(
        clients
            .lines()
            .any(|l| field(l, "cmd").starts_with("eval") && field(l, "ssub") == "0"),
        "the scripts ran on a connection without subscriptions: {clients}"
    );

    guard.release().await.unwrap();
    waiter.await.unwrap();
}

/// An operator's eviction on a cluster wakes the waiters at once, as a release does: they listen
/// with `SSUBSCRIBE`, which a plain `PUBLISH` never reaches, and the holder's lease has a minute
/// to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_on_a_cluster_wakes_the_waiters() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "a_force_release_on_a_cluster_wakes_the_waiters",
    ) {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    let client = LockClient::connect_cluster(cluster.urls()).await.unwrap();
    let lock = client.lock("stuck").unwrap().with_lease(LONG).unwrap();
    let guard = lock.acquire().await.unwrap();
    let waiter = spawn_waiter(client.clone(), "stuck");
    wait_for_subscriber(&cluster, "stuck", "while held").await;
    let owner = cluster.primary_for_slot(key_slot_of_lock("stuck")).unwrap();
    let admin = fencelock::admin::Admin::connect(&owner.url())
        .await
        .unwrap();
    // The operator sees the waiter, listening on the lock's shard channel.
    assert_eq!(admin.lock("stuck").await.unwrap().subscribers, 1);
    let evicted = admin.force_release("stuck", None).await.unwrap();
    assert!(
        matches!(evicted, fencelock::admin::ForceRelease::Evicted { token: Some(t), .. } if t == guard.token()),
        "{evicted:?}"
    );
    let token = granted_after_release(waiter, Duration::from_secs(10)).await;
    assert!(token > guard.token());
}

/// An operator's release of a stuck permit, and a raised limit, wake a cluster's semaphore
/// waiters at once, as a force release wakes a lock's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_hold_release_and_limit_on_a_cluster_wake_the_waiters() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "an_operators_hold_release_and_limit_on_a_cluster_wake_the_waiters",
    ) {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    let client = LockClient::connect_cluster(cluster.urls()).await.unwrap();
    let owner = cluster.primary_for_slot(key_slot_of_lock("pool")).unwrap();
    let admin = fencelock::admin::Admin::connect(&owner.url())
        .await
        .unwrap();
    let pool = client
        .semaphore("pool", 1)
        .unwrap()
        .with_lease(LONG)
        .unwrap();
    let stuck = pool.acquire(1).await.unwrap();
    let waiter = |pool: fencelock::Semaphore| {
        tokio::spawn(async move {
            let permit = pool.acquire_timeout(1, WAITER_DEADLINE).await.unwrap();
            permit.token()
        })
    };
    let first = waiter(pool.clone());
    wait_for_subscriber(&cluster, "pool", "behind the stuck permit").await;
    let released = admin
        .release_hold(
            fencelock::admin::HoldKind::Semaphore,
            "pool",
            stuck.holder_id(),
        )
        .await
        .unwrap();
    assert_eq!(released, fencelock::admin::HoldRelease::Released);
    granted_after_release(first, Duration::from_secs(10)).await;

    // The first waiter's permit is given back; one more holds the only permit, a waiter
    // queues, and the operator raises the limit.
    let holding = pool.acquire(1).await.unwrap();
    let second = waiter(pool.clone());
    wait_for_subscriber(&cluster, "pool", "behind the held permit").await;
    assert_eq!(admin.set_semaphore_limit("pool", 2).await.unwrap(), Some(1));
    granted_after_release(second, Duration::from_secs(10)).await;
    drop(holding);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_keeps_the_lock_the_token_and_the_waiter() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "a_manual_failover_keeps_the_lock_the_token_and_the_waiter",
    ) {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    // Long enough to outlast the failover, rerouting and backoff on a loaded machine: the test
    // is about keeping the lock, so it checks that renewals resumed, not how fast.
    let lease = Duration::from_secs(10);
    // Replica acknowledgement by the library: the lock's hash and fence counter are on the
    // replica before the guard is returned, so before the replica can take over.
    let holder_client = LockClient::cluster_builder(cluster.urls())
        .default_lease(lease)
        .replica_ack(1, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    let waiter_client = LockClient::connect_cluster(cluster.urls()).await.unwrap();
    let slot = key_slot_of_lock("failover");
    let old_primary = cluster.primary_for_slot(slot).unwrap();
    let waits_before = calls(old_primary, "wait");
    let guard = holder_client
        .lock("failover")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));
    assert_eq!(
        calls(old_primary, "wait"),
        waits_before + 1,
        "the WAIT ran at the slot's primary"
    );
    let token = guard.token();
    let waiter = spawn_waiter(waiter_client, "failover");
    wait_for_subscriber(&cluster, "failover", "before the failover").await;

    let replica = cluster.replicas_of(old_primary).unwrap()[0];
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut con(replica))
        .unwrap();
    let promoted = crate::common::eventually(Duration::from_secs(20), || {
        cluster
            .primary_for_slot(slot)
            .is_ok_and(|p| p.port() == replica.port())
    })
    .await;
    assert!(promoted, "the replica did not take over");
    // The waiter is still subscribed in the lock's shard (the demoted node keeps its sharded
    // subscribers and gets the new primary's messages).
    wait_for_subscriber(&cluster, "failover", "after the failover").await;

    // The new primary has the lock, with the same holder and token.
    let key: Vec<Vec<u8>> = con(replica).keys("fencelock:{*}lock:failover").unwrap();
    assert_eq!(key.len(), 1);
    let stored: u64 = con(replica).hget(&key[0], "~token").unwrap();
    assert_eq!(stored, token.get());
    // The watchdog goes on renewing it at the new primary. Every renewal call counted from
    // here on is sent after the promotion, and one that succeeds moves the guard's deadline to
    // more than 98 % of a lease past `promoted_at`, which only a renewal sent at most 1 % of a
    // lease before it could do. (Waiting for that, not for a number of lease periods:
    // failover, rerouting and the watchdog's backoff take seconds on a loaded machine, which
    // the 10 s lease absorbs.)
    let promoted_at = std::time::Instant::now();
    let renewals = holder_client.renewal_calls();
    assert!(
        crate::common::eventually(LONG, || holder_client.renewal_calls() >= renewals + 2
            && guard.valid_until() > promoted_at + lease * 49 / 50)
        .await,
        "the watchdog did not renew the lease at the new primary"
    );
    assert!(guard.is_valid(), "the holder lost its lock in the failover");
    let pttl: i64 = con(replica).pttl(&key[0]).unwrap();
    assert!(pttl > 0);

    guard.release().await.unwrap();
    let next = waiter.await.unwrap();
    assert!(next > token, "tokens keep increasing across the failover");

    // The holder's acknowledgement pool still has its connection to the demoted node, which
    // answers MOVED: the next replicated acquisition follows it to the new primary and WAITs
    // there, for the demoted node that is now its replica.
    let waits_there = calls(replica, "wait");
    let again = holder_client
        .lock("failover")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(again.replicated());
    assert_eq!(again.replica_acks(), Some(1));
    assert!(again.token() > next);
    assert_eq!(calls(replica, "wait"), waits_there + 1);
    let held: Vec<Vec<u8>> = con(replica).keys("fencelock:{*}lock:failover").unwrap();
    assert_eq!(held.len(), 1, "the lock was taken at the new primary");
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_a_held_lock_does_not_strand_the_waiter() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "a_slot_migration_under_a_held_lock_does_not_strand_the_waiter",
    ) {
        return;
    }
    let fx = Env::start(Topology::Cluster);
    let crate::common::Deployment::Cluster(cluster) = &fx.deployment else {
        unreachable!()
    };
    let holder_client = fx.client().await;
    let waiter_client = fx.client().await;
    // A lease far longer than any step below: within 30 s of the release the waiter can only
    // get the lock through the release message reaching it, however slow the migration was.
    let guard = holder_client
        .lock("moving")
        .unwrap()
        .with_lease(Duration::from_secs(600))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let token = guard.token();
    let waiter = spawn_waiter(waiter_client, "moving");
    wait_for_subscriber(cluster, "moving", "before the migration").await;

    let slot = key_slot_of_lock("moving");
    let source = cluster.primary_for_slot(slot).unwrap();
    let target = *cluster
        .primaries()
        .unwrap()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let target_id = migrate_slot_keys(cluster, slot, source, target);
    for node in cluster.primaries().unwrap() {
        set_slot(node, slot, &["NODE", &target_id]);
    }
    assert!(
        crate::common::eventually(Duration::from_secs(10), || cluster
            .primary_for_slot(slot)
            .is_ok_and(|p| p.port() == target.port()))
        .await
    );
    let moved: Vec<Vec<u8>> = con(target).keys("fencelock:{*}lock:moving").unwrap();
    assert_eq!(moved.len(), 1, "the held lock moved with its slot");
    // The source dropped the waiter's sharded subscription when it lost the slot; the client
    // subscribed again, now at the target.
    wait_for_subscriber(cluster, "moving", "after the migration").await;

    guard.release().await.unwrap();
    let next = granted_after_release(waiter, Duration::from_secs(30)).await;
    assert!(next > token);
    assert!(fx.lock_key("moving").is_none());
}

/// On a cluster a multi-lock is taken member by member in the global order (one script reaches
/// one slot only), with one token per lock, and released whole. Replica acknowledgement is
/// accepted on a cluster; with no replica to acknowledge, it is an immediate shortfall that
/// holds nothing.
#[tokio::test]
async fn multi_lock_works_across_slots_and_replica_ack_without_replicas_holds_nothing() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "multi_lock_works_across_slots_and_replica_ack_without_replicas_holds_nothing",
    ) {
        return;
    }
    let cluster = RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .unwrap();
    let client = LockClient::cluster_builder(cluster.urls())
        .connect()
        .await
        .unwrap();
    let names = ["account:alice", "account:bob", "account:carol"];
    let slots: HashSet<u16> = names.iter().map(|n| key_slot_of_lock(n)).collect();
    assert!(slots.len() > 1, "the names should span several slots");

    let set = client.multi_lock(names).unwrap();
    let guard = set.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    for name in names {
        assert!(guard.token(name).is_some(), "no token for {name}");
        assert!(client
            .lock(name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none());
    }
    guard.release().await.unwrap();
    for name in names {
        let free = client.lock(name).unwrap().try_acquire().await.unwrap();
        free.expect("a member stayed held").release().await.unwrap();
    }

    let acked = LockClient::cluster_builder(cluster.urls())
        .replica_ack(1, Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let err = acked
        .lock("account:alice")
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            fencelock::Error::ReplicationTimeout {
                acked: 0,
                required: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let err = acked
        .multi_lock(names)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(err.is_replication_timeout(), "{err:?}");
    for name in names {
        let free = client.lock(name).unwrap().try_acquire().await.unwrap();
        free.expect("the shortfall left the lock held")
            .release()
            .await
            .unwrap();
    }
}

/// Successful calls of `command` at `node` so far (`INFO commandstats`).
fn calls(node: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con(node))
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Freezes a node with SIGSTOP (the harness' `pause` needs the node mutably, which a cluster
/// does not hand out) and lets it go again when dropped, even when the test fails first.
struct Frozen(u32);

impl Frozen {
    fn new(node: &RedisServer) -> Frozen {
        signal(node.pid(), Signal::Stop);
        Frozen(node.pid())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, Signal::Cont);
    }
}

fn signal(pid: u32, signal: Signal) {
    send_signal(pid, signal).unwrap_or_else(|err| panic!("{signal:?} to {pid}: {err}"));
}

/// The lock keys of `name` at `node` (at most one).
fn lock_keys_at(node: &RedisServer, name: &str) -> Vec<Vec<u8>> {
    con(node)
        .keys(format!("fencelock:{{*}}lock:{name}"))
        .unwrap()
}

/// Replica acknowledgement on a cluster: the script and its WAIT run at the primary that owns
/// the lock's slot; a set WAITs once per node it wrote to; and when the slot's replica cannot
/// acknowledge (frozen), the acquisition is rolled back (or, by choice, returned unreplicated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_ack_waits_at_the_slot_primary_once_per_node_and_a_frozen_replica_is_a_shortfall() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "replica_ack_waits_at_the_slot_primary_once_per_node_and_a_frozen_replica_is_a_shortfall",
    ) {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    let client = LockClient::cluster_builder(cluster.urls())
        .replica_ack(1, HEALTHY_ACK)
        .connect()
        .await
        .unwrap();
    // Two names owned by one primary, one by another, none by the third.
    let mut by_node: HashMap<u16, Vec<String>> = HashMap::new();
    for i in 0.. {
        let name = format!("acked:{i}");
        let port = cluster
            .primary_for_slot(key_slot_of_lock(&name))
            .unwrap()
            .port();
        by_node.entry(port).or_default().push(name);
        if by_node.len() >= 2 && by_node.values().any(|names| names.len() >= 2) {
            break;
        }
    }
    let (&x, two) = by_node.iter().find(|(_, n)| n.len() >= 2).unwrap();
    let (&y, one) = by_node.iter().find(|(&p, _)| p != x).unwrap();
    let (x1, x2, y1) = (two[0].clone(), two[1].clone(), one[0].clone());
    let primaries = cluster.primaries().unwrap();
    assert_eq!(primaries.len(), 3);
    let node_x = cluster.node(x).unwrap();
    let node_y = cluster.node(y).unwrap();
    let replica_x = cluster.replicas_of(node_x).unwrap()[0];
    let waits = || -> Vec<u64> { primaries.iter().map(|p| calls(p, "wait")).collect() };
    let index = |port: u16| primaries.iter().position(|p| p.port() == port).unwrap();

    // One lock: one WAIT, at its slot's primary.
    let before = waits();
    let guard = client.lock(&x1).unwrap().acquire().await.unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));
    let after = waits();
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        let expected = u64::from(i == index(x));
        assert_eq!(a - b, expected, "WAITs at primary {i}");
    }
    guard.release().await.unwrap();

    // A set over two nodes (two members on one): one WAIT per node, none at the third.
    let before = waits();
    let set = client.multi_lock([&x1, &x2, &y1]).unwrap();
    let guard = set.acquire().await.unwrap();
    assert!(guard.replicated());
    let after = waits();
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        let expected = u64::from(i == index(x) || i == index(y));
        assert_eq!(a - b, expected, "WAITs at primary {i}");
    }
    guard.release().await.unwrap();
    assert!(client.replica_ack_connections() >= 2);

    // The slot's only replica frozen: nobody can acknowledge.
    {
        let _frozen = Frozen::new(replica_x);
        let lock = client
            .lock(&x1)
            .unwrap()
            .with_replica_ack(1, Duration::from_millis(200))
            .unwrap();
        let err = lock.try_acquire().await.unwrap_err();
        assert!(
            matches!(
                err,
                fencelock::Error::ReplicationTimeout {
                    acked: 0,
                    required: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            lock_keys_at(node_x, &x1).is_empty(),
            "rolled back at the primary"
        );

        // A set with a member there is rolled back whole.
        let set = client
            .multi_lock([&x1, &y1])
            .unwrap()
            .with_replica_ack(1, Duration::from_millis(200))
            .unwrap();
        let err = set.try_acquire().await.unwrap_err();
        assert!(err.is_replication_timeout(), "{err:?}");
        assert!(lock_keys_at(node_x, &x1).is_empty());
        assert!(lock_keys_at(node_y, &y1).is_empty());

        // By choice, the guard comes back marked, and holds the lock.
        let lenient = lock.on_replica_shortfall(fencelock::OnShortfall::ReturnUnreplicated);
        let guard = lenient.try_acquire().await.unwrap().expect("free");
        assert!(!guard.replicated());
        assert_eq!(guard.replica_acks(), Some(0));
        let key = lock_keys_at(node_x, &x1);
        assert_eq!(key.len(), 1);
        let count: Option<u64> = con(node_x).hget(&key[0], guard.holder_id()).unwrap();
        assert_eq!(count, Some(1));
        guard.release().await.unwrap();
    }

    // Thawed: the replica catches up and acknowledges again.
    let guard = client.lock(&x1).unwrap().acquire().await.unwrap();
    assert!(guard.replicated());
    guard.release().await.unwrap();
}

/// A replicated acquisition during a slot migration follows `ASK` to the importing node (which
/// answers `TRYAGAIN` while the lock's keys are split between the nodes), keeps re-sending, and
/// once the slot has moved is taken and acknowledged at its new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_acquisition_during_a_slot_migration_follows_ask_and_waits_at_the_new_owner() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "a_replicated_acquisition_during_a_slot_migration_follows_ask_and_waits_at_the_new_owner",
    ) {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    let client = LockClient::cluster_builder(cluster.urls())
        .replica_ack(1, HEALTHY_ACK)
        // The acquisition below keeps meeting TRYAGAIN until the test finishes the migration.
        .retry_window(Duration::from_secs(30))
        .op_record_ttl(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    // The slot gets its fence counter, and the pool its connection to the source.
    let first = client.lock("migrating").unwrap().acquire().await.unwrap();
    let token = first.token();
    first.release().await.unwrap();

    let slot = key_slot_of_lock("migrating");
    let source = cluster.primary_for_slot(slot).unwrap();
    let target = *cluster
        .primaries()
        .unwrap()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let target_id = migrate_slot_keys(&cluster, slot, source, target);

    // Every key of the slot is at the target now: the source answers ASK.
    let askings = calls(target, "asking");
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move { client.lock("migrating").unwrap().acquire().await }
    });
    // More round trips through ASK and TRYAGAIN than the 16 redirections the pool follows in
    // a row: the re-sends in between keep it going for the whole retry window.
    assert!(
        crate::common::eventually(Duration::from_secs(25), || calls(target, "asking")
            > askings + 20)
        .await,
        "the acquisition did not keep following ASK to the importing node"
    );
    assert!(!acquiring.is_finished(), "taken while the slot was split");
    let waits = calls(target, "wait");
    for node in cluster.primaries().unwrap() {
        set_slot(node, slot, &["NODE", &target_id]);
    }
    let guard = acquiring.await.unwrap().unwrap();
    assert!(guard.replicated());
    assert_eq!(guard.replica_acks(), Some(1));
    assert!(guard.token() > token);
    assert_eq!(
        calls(target, "wait"),
        waits + 1,
        "the WAIT ran at the new owner"
    );
    assert_eq!(lock_keys_at(target, "migrating").len(), 1);
    guard.release().await.unwrap();
}
