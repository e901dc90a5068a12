//! Re-sends made by the cluster client itself, end to end on a real cluster: one primary sits
//! behind the harness' fault proxy (it announces the proxy's port, so the cluster client talks
//! to it only through the proxy), the proxy loses a script's reply and then cuts the
//! connection, and redis-rs re-sends the request on a new connection by itself. fencelock's own
//! retry loop is switched off (`retry_window(0)`) in those tests, so a call that succeeds after
//! its script ran twice can only have been re-sent by redis-rs. The lock state is then read on
//! the node directly: one hold, the right count, one token; `INFO commandstats` shows two
//! `EVALSHA` calls and the slow log shows which script they were. A reply that is only slow
//! (the connection stays open) is not re-sent by redis-rs (its overall timeout, which starts
//! first, ends the request); fencelock's retry loop re-sends it through the same cluster
//! connection, which the last test pins down.

use std::future::Future;
use std::time::Duration;

use crate::common::{eventually, key_slot_of_lock};
use fencelock::negative_controls::Control;
use fencelock::{LockClient, LockClientBuilder};
use fencelock_testing::{Direction, FaultProxy, RedisCluster, RedisServer};
use redis::Commands;

const LONG: Duration = Duration::from_secs(60);
// As the loader builds them: each script's libraries (lua/lib) prepended.
const ACQUIRE: &str = concat!(
    include_str!("../../lua/lib/next_token.lua"),
    include_str!("../../lua/lib/acquire.lua"),
    include_str!("../../lua/acquire.lua")
);
const REENTER: &str = concat!(
    include_str!("../../lua/lib/calls.lua"),
    include_str!("../../lua/reenter.lua")
);
const RELEASE: &str = concat!(
    include_str!("../../lua/lib/release.lua"),
    include_str!("../../lua/release.lua")
);
const CANCEL: &str = concat!(
    include_str!("../../lua/lib/calls.lua"),
    include_str!("../../lua/cancel.lua")
);

/// A 3-primary cluster (no replicas, so nothing else travels through the proxy) whose node 0
/// is reached through a proxy.
struct Proxied {
    cluster: RedisCluster,
}

impl Proxied {
    fn start() -> Proxied {
        let fx = Proxied {
            cluster: RedisCluster::builder()
                .replicas_per_primary(0)
                .proxy_node(0)
                .start()
                .expect("start a cluster with a proxied node"),
        };
        // Every command with its arguments goes to the slow log, which is how a test tells
        // which script ran (INFO commandstats only counts EVALSHA as a whole).
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .arg("slowlog-max-len")
            .arg(100_000)
            .query::<()>(&mut fx.con())
            .unwrap();
        // Loaded up front: a first EVALSHA answered NOSCRIPT would be one more logged run.
        for source in [ACQUIRE, REENTER, RELEASE, CANCEL] {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .query(&mut fx.con())
                .unwrap();
        }
        fx
    }

    fn reset_script_log(&self) {
        redis::cmd("SLOWLOG")
            .arg("RESET")
            .query::<()>(&mut self.con())
            .unwrap();
    }

    /// How many times the script `source` ran on node 0 since the last
    /// [`reset_script_log`](Self::reset_script_log).
    fn runs_of(&self, source: &str) -> usize {
        let sha = redis::Script::new(source).get_hash().to_owned();
        let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(-1)
            .query(&mut self.con())
            .unwrap();
        entries
            .iter()
            .filter(|entry| {
                let redis::Value::Array(fields) = entry else {
                    return false;
                };
                let Some(redis::Value::Array(args)) = fields.get(3) else {
                    return false;
                };
                let arg = |i: usize| match args.get(i) {
                    Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                };
                arg(0).eq_ignore_ascii_case("evalsha") && arg(1) == sha
            })
            .count()
    }

    fn node(&self) -> &RedisServer {
        &self.cluster.nodes()[0]
    }

    fn proxy(&self) -> &FaultProxy {
        self.cluster.proxy(0).expect("node 0 is proxied")
    }

    fn con(&self) -> redis::Connection {
        self.node()
            .client()
            .get_connection()
            .expect("direct connection")
    }

    /// A lock name (`base` plus a number) whose slot node 0 serves.
    fn name_on_node(&self, base: &str) -> String {
        (0..)
            .map(|i| format!("{base}:{i}"))
            .find(|name| {
                let owner = self.cluster.primary_for_slot(key_slot_of_lock(name));
                owner.expect("slot owner").port() == self.node().port()
            })
            .unwrap()
    }

    /// A client whose fencelock retry loop never re-sends: whatever re-send happens is the
    /// cluster client's. The long response timeout keeps redis-rs' per-attempt and overall
    /// timeouts out of the way, so the connection cut is the only failure it sees.
    fn builder(&self) -> LockClientBuilder {
        LockClient::cluster_builder(self.cluster.urls())
            .retry_window(Duration::ZERO)
            .response_timeout(Duration::from_secs(30))
    }

    /// Successful `EVALSHA` calls on node 0 so far.
    fn evalsha_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.con())
            .expect("INFO commandstats");
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("calls"))
    }

    /// Runs `request` while the proxy loses its reply: once the script has run on node 0
    /// (`EVALSHA` count) and its reply was discarded (the proxy's count), the proxy resets
    /// the connection, so the cluster client sees the connection drop with the request in
    /// flight. Returns the outcome and how many times the script ran.
    async fn cut_after_the_script_ran<T>(&self, request: impl Future<Output = T>) -> (T, u64) {
        self.reset_script_log();
        let calls = self.evalsha_calls();
        let dropped = self.proxy().stats().downstream.messages_dropped;
        let connections = self.proxy().stats().connections_accepted;
        self.proxy().lose_next_reply();
        let (out, ()) = tokio::join!(request, async {
            let ran = eventually(Duration::from_secs(10), || {
                self.evalsha_calls() > calls
                    && self.proxy().stats().downstream.messages_dropped > dropped
            })
            .await;
            assert!(ran, "the script never ran, or its reply was not lost");
            self.proxy().reset_all();
        });
        assert!(
            self.proxy().stats().connections_accepted > connections,
            "the re-send did not come over a new connection through the proxy"
        );
        (out, self.evalsha_calls() - calls)
    }

    /// Runs `request` while node 0's replies are held back by `delay`, healing once the first
    /// script call has run and its reply is in the proxy; returns the outcome and how many scripts ran before it returned.
    async fn slow_reply_of<T>(
        &self,
        delay: Duration,
        request: impl Future<Output = T>,
    ) -> (T, u64) {
        self.reset_script_log();
        let calls = self.evalsha_calls();
        let received = self.proxy().stats().downstream.bytes_received;
        self.proxy().delay(Direction::Downstream, delay);
        let (out, ()) = tokio::join!(request, async {
            // Healed only once the proxy has read the reply (and so given it its delay).
            let ran = eventually(Duration::from_secs(10), || {
                self.evalsha_calls() > calls
                    && self.proxy().stats().downstream.bytes_received > received
            })
            .await;
            assert!(ran, "the script never ran");
            self.proxy().heal();
        });
        (out, self.evalsha_calls() - calls)
    }

    /// The lock hash of `name` on node 0 as (holder id, count) pairs plus the stored token.
    fn lock_state(&self, name: &str) -> Option<(Vec<(String, u64)>, u64)> {
        let key = self.lock_key(name)?;
        let fields: Vec<(String, String)> = self.con().hgetall(&key).unwrap();
        let mut holders = Vec::new();
        let mut token = 0;
        for (field, value) in fields {
            if field == "~token" {
                token = value.parse().unwrap();
            } else {
                holders.push((field, value.parse().unwrap()));
            }
        }
        Some((holders, token))
    }

    fn lock_key(&self, name: &str) -> Option<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = self
            .con()
            .keys(format!("fencelock:{{*}}lock:{name}"))
            .unwrap();
        assert!(keys.len() <= 1);
        keys.pop()
    }

    /// The fence counter of `name`'s bucket (the same tag as its lock key).
    fn fence(&self, name: &str) -> u64 {
        let key = self.lock_key(name).expect("the lock is held");
        let end = key.iter().position(|&b| b == b'}').unwrap();
        let mut fence = key[..=end].to_vec();
        fence.extend_from_slice(b"fence");
        self.con().get(fence).unwrap()
    }
}

/// Loads every script on node 0 (a `NOSCRIPT` round would add `EVALSHA` calls of its own).
async fn warm_up(client: &LockClient, fx: &Proxied) {
    let lock = client
        .lock(fx.name_on_node("warm-up"))
        .unwrap()
        .with_lease(LONG)
        .unwrap();
    let guard = lock.acquire().await.unwrap();
    guard.reenter().await.unwrap().release().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_re_sent_by_the_cluster_client_holds_once_with_one_token() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "an_acquire_re_sent_by_the_cluster_client_holds_once_with_one_token",
    ) {
        return;
    }
    let fx = Proxied::start();
    let client = fx.builder().connect().await.unwrap();
    warm_up(&client, &fx).await;
    let name = fx.name_on_node("resent-acquire");
    let lock = client.lock(&name).unwrap().with_lease(LONG).unwrap();

    let (guard, runs) = fx.cut_after_the_script_ran(lock.acquire()).await;
    let guard = guard.expect("the re-sent acquire succeeds");
    assert_eq!(
        runs, 2,
        "acquire.lua ran once and once more for the re-send"
    );
    assert_eq!(fx.runs_of(ACQUIRE), 2);
    let (holders, token) = fx.lock_state(&name).unwrap();
    assert_eq!(holders, vec![(guard.holder_id().to_owned(), 1)], "one hold");
    assert_eq!(token, guard.token().get());
    assert_eq!(fx.fence(&name), token, "exactly one token was issued");
    assert!(guard.is_valid());

    // The lock is held: another client is refused, and the guard releases it normally.
    let other = fx.builder().connect().await.unwrap();
    assert!(other
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    assert!(fx.lock_key(&name).is_none());
    let next = other.lock(&name).unwrap().try_acquire().await.unwrap();
    let next = next.expect("free after the release");
    assert!(next.token().get() > token);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_entry_and_releases_re_sent_by_the_cluster_client_apply_once() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "a_re_entry_and_releases_re_sent_by_the_cluster_client_apply_once",
    ) {
        return;
    }
    let fx = Proxied::start();
    let client = fx.builder().connect().await.unwrap();
    warm_up(&client, &fx).await;
    let name = fx.name_on_node("resent-count");
    let lock = client.lock(&name).unwrap().with_lease(LONG).unwrap();
    let outer = lock.acquire().await.unwrap();
    let holder = outer.holder_id().to_owned();
    let token = outer.token().get();

    let (inner, runs) = fx.cut_after_the_script_ran(outer.reenter()).await;
    let inner = inner.expect("the re-sent re-entry succeeds");
    assert_eq!(runs, 2, "reenter.lua ran twice");
    assert_eq!(fx.runs_of(REENTER), 2);
    assert_eq!(inner.token(), outer.token());
    assert_eq!(
        fx.lock_state(&name),
        Some((vec![(holder.clone(), 2)], token)),
        "one re-entry counted, not two"
    );

    let (released, runs) = fx.cut_after_the_script_ran(inner.release()).await;
    released.expect("the re-sent inner release succeeds");
    assert_eq!(runs, 2, "release.lua ran twice");
    assert_eq!(fx.runs_of(RELEASE), 2);
    assert_eq!(
        fx.lock_state(&name),
        Some((vec![(holder, 1)], token)),
        "one decrement, not two: the outer frame still holds"
    );

    // The last release frees the lock; its re-send finds the hash gone and replays the
    // recorded reply instead of failing the caller with "not held".
    let (released, runs) = fx.cut_after_the_script_ran(outer.release()).await;
    released.expect("the re-sent final release succeeds");
    assert_eq!(runs, 2, "release.lua ran twice");
    assert_eq!(fx.runs_of(RELEASE), 2);
    assert!(fx.lock_key(&name).is_none());
    let next = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the release");
    assert!(next.token().get() > token);
    next.release().await.unwrap();
}

/// The same re-sent re-entry with the negative control that makes `reenter.lua` ignore its
/// operation record: the count goes up twice. So the re-send above really reached the script
/// with the same operation id, and the exactly-once outcome is the op record's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_op_records_the_re_sent_re_entry_would_count_twice() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "without_op_records_the_re_sent_re_entry_would_count_twice",
    ) {
        return;
    }
    let fx = Proxied::start();
    let client = fx
        .builder()
        .negative_control(Control::RetriesApplyTwice)
        .connect()
        .await
        .unwrap();
    warm_up(&client, &fx).await;
    let name = fx.name_on_node("control");
    let outer = client
        .lock(&name)
        .unwrap()
        .with_lease(LONG)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let (inner, runs) = fx.cut_after_the_script_ran(outer.reenter()).await;
    // Bound, not dropped: a dropped guard's background release would take one count away.
    let _inner = inner.expect("the re-sent re-entry returns");
    assert_eq!(runs, 2);
    let (holders, _) = fx.lock_state(&name).unwrap();
    assert_eq!(holders, vec![(outer.holder_id().to_owned(), 3)]);
}

/// A reply held up past the response timeout on a connection that stays open (a slow
/// network, not a broken one): redis-rs does not re-send it (its overall timeout, equal to the
/// response timeout, ends the request first), so with fencelock's retry loop off the caller
/// gets the connection-class error and the acquisition is undone in the background
/// (`cancel.lua`). With the default retry window, fencelock's loop re-sends the same holder id
/// through the cluster connection and the acquisition applies once.
///
/// (A reply that vanishes from an open connection, [`FaultProxy::lose_next_reply`] without a
/// reset, is not a fault TCP can produce, and it desynchronises any multiplexed connection:
/// every later reply is matched to the request before it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reply_on_an_open_connection_is_re_sent_by_fencelock_not_by_redis_rs() {
    if !fencelock_testing::requires(
        fencelock_testing::Feature::ShardedPubSub,
        "a_slow_reply_on_an_open_connection_is_re_sent_by_fencelock_not_by_redis_rs",
    ) {
        return;
    }
    let fx = Proxied::start();
    let timeout = Duration::from_millis(500);
    // Longer than the response timeout, so the first reply comes too late; once healed, the
    // re-sent request's reply only waits behind it.
    let slow = timeout + Duration::from_millis(300);
    let no_retry = LockClient::cluster_builder(fx.cluster.urls())
        .retry_window(Duration::ZERO)
        .response_timeout(timeout)
        .connect()
        .await
        .unwrap();
    warm_up(&no_retry, &fx).await;
    let name = fx.name_on_node("open-connection");
    let lock = no_retry.lock(&name).unwrap().with_lease(LONG).unwrap();
    let connections = fx.proxy().stats().connections_accepted;
    let (err, _) = fx.slow_reply_of(slow, lock.acquire()).await;
    let err = err.unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    // The acquisition that did run is undone by the background cancel.
    assert!(eventually(Duration::from_secs(10), || fx.lock_key(&name).is_none()).await);
    assert_eq!(fx.runs_of(ACQUIRE), 1, "nothing re-sent the acquire");
    assert_eq!(fx.runs_of(CANCEL), 1);
    assert_eq!(fx.proxy().stats().connections_accepted, connections);

    let retrying = LockClient::cluster_builder(fx.cluster.urls())
        .response_timeout(timeout)
        .connect()
        .await
        .unwrap();
    warm_up(&retrying, &fx).await;
    let lock = retrying.lock(&name).unwrap().with_lease(LONG).unwrap();
    let (guard, runs) = fx.slow_reply_of(slow, lock.acquire()).await;
    let guard = guard.expect("fencelock re-sends the acquire");
    assert!(runs >= 2, "the acquire was re-sent");
    assert_eq!(fx.runs_of(ACQUIRE) as u64, runs);
    assert_eq!(fx.runs_of(CANCEL), 0);
    let (holders, token) = fx.lock_state(&name).unwrap();
    assert_eq!(holders, vec![(guard.holder_id().to_owned(), 1)]);
    assert_eq!(token, guard.token().get());
    assert_eq!(fx.fence(&name), token, "exactly one token was issued");
    guard.release().await.unwrap();
}
