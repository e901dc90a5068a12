//! Lost replies, slow replies and partitions between the client and Redis, injected by the
//! harness' fault proxy: retries apply at most once, and a late reply is reported as lost.

use std::time::Duration;

use crate::common::{eventually, Fixture};
use fencelock::admin::Admin;
use fencelock::LockClient;
use fencelock_testing::{Direction, FaultProxy};
use redis::Commands;

struct Faulty {
    fx: Fixture,
    proxy: FaultProxy,
}

impl Faulty {
    fn start() -> Faulty {
        let fx = Fixture::start();
        let proxy = FaultProxy::start(fx.server.addr()).unwrap();
        Faulty { fx, proxy }
    }

    async fn client(&self) -> LockClient {
        LockClient::connect(&self.proxy.url()).await.unwrap()
    }

    /// Restores the connection and checks that whatever an abandoned attempt on `lock` did is
    /// undone: the lock ends free, and can be taken.
    async fn heal_and_find_free(&self, lock: &fencelock::Lock) {
        self.proxy.reset_all();
        self.proxy.heal();
        let name = String::from_utf8(lock.name().to_vec()).unwrap();
        assert!(
            eventually(Duration::from_secs(10), || self
                .fx
                .lock_key(&name)
                .is_none())
            .await,
            "{name} was left held"
        );
        let guard = lock.acquire_timeout(Duration::from_secs(10)).await.unwrap();
        guard.release().await.unwrap();
    }

    /// Lets `request` reach Redis and run, then kills the connection before the reply gets
    /// back: the client cannot know whether it ran, which is what a retry must survive.
    async fn lose_reply_of<T>(
        &self,
        ran: impl Fn(&Fixture) -> bool,
        request: impl std::future::Future<Output = T>,
    ) -> T {
        self.proxy.blackhole(Direction::Downstream);
        let (out, ()) = tokio::join!(request, async {
            assert!(eventually(Duration::from_secs(5), || ran(&self.fx)).await);
            self.proxy.reset_all();
            self.proxy.heal();
        });
        out
    }
}

/// A check that `holder` alone holds lock `name`, entered `count` times.
fn holds_alone(name: &'static str, holder: &str, count: u64) -> impl Fn(&Fixture) -> bool {
    let held = Some(vec![(holder.to_owned(), count)]);
    move |fx: &Fixture| fx.lock_state(name).map(|s| s.0) == held
}

/// A loopback port that refuses connections while the returned socket lives: bound, so that no
/// server another test starts meanwhile can take it (a port freed again could be), and not
/// listening.
fn a_closed_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    socket.bind(loopback).expect("bind a loopback port");
    let port = socket.local_addr().expect("its address").port();
    (socket, port)
}

/// A connect that reaches no server says which address it tried, whether that is the one
/// server, a cluster's seed node or a Sentinel, and stays a connection error; the password of
/// the URL does not show.
#[tokio::test]
async fn a_refused_connect_names_the_address_it_tried() {
    let (_bound, port) = a_closed_port();
    let addr = format!("127.0.0.1:{port}");
    let url = format!("redis://:hunter2@{addr}/");
    let attempts = [
        ("standalone", LockClient::connect(&url).await.err()),
        ("cluster", LockClient::connect_cluster([&url]).await.err()),
        (
            "sentinel",
            LockClient::connect_sentinel([&url], "primary").await.err(),
        ),
        ("admin", Admin::connect(&url).await.err()),
    ];
    for (client, err) in attempts {
        let err = err.unwrap_or_else(|| panic!("{client}: connected to a closed port"));
        let text = err.to_string();
        assert!(
            text.contains("connecting to") && text.contains(&addr),
            "{client}: {text}"
        );
        assert!(!text.contains("hunter2"), "{client}: {text}");
        assert!(err.is_connection(), "{client}: {err:?}");
    }
}

fn fence_value(fx: &Fixture) -> u64 {
    let counter = fx
        .keys("fencelock:{*}fence")
        .pop()
        .expect("a fence counter");
    fx.raw().get(counter).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_was_lost_is_retried_without_a_second_token() {
    let faulty = Faulty::start();
    let client = faulty.client().await;
    let lock = client.lock("retried").unwrap();
    // Load the scripts first, so the lost request is the acquire itself. An acquisition sent
    // once leaves no op record.
    let once = lock.acquire().await.unwrap();
    let record_of = |holder: &str| -> Option<String> {
        let key = faulty
            .fx
            .keys(&format!("fencelock:{{*}}op:{holder}"))
            .pop()?;
        faulty.fx.raw().get(key).unwrap()
    };
    assert_eq!(record_of(once.holder_id()), None);
    once.release().await.unwrap();

    let guard = faulty
        .lose_reply_of(|fx| fx.lock_key("retried").is_some(), lock.acquire())
        .await
        .unwrap();
    // The re-send recorded the acquisition, for a copy of the lost send still on its way.
    assert_eq!(record_of(guard.holder_id()).as_deref(), Some("a"));
    let (holders, token) = faulty.fx.lock_state("retried").unwrap();
    assert_eq!(
        holders,
        vec![(guard.holder_id().to_owned(), 1)],
        "no double count"
    );
    assert_eq!(token, guard.token().get());
    assert_eq!(
        fence_value(&faulty.fx),
        token,
        "exactly one token was issued"
    );
    guard.release().await.unwrap();
    assert!(faulty.fx.lock_key("retried").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_and_a_release_whose_replies_were_lost_apply_once() {
    let faulty = Faulty::start();
    let client = faulty.client().await;
    let lock = client.lock("counted").unwrap();
    let outer = lock.acquire().await.unwrap();
    outer.reenter().await.unwrap().release().await.unwrap();
    let holder = outer.holder_id().to_owned();
    let count_is = |n: u64| holds_alone("counted", &holder, n);

    let inner = faulty
        .lose_reply_of(count_is(2), outer.reenter())
        .await
        .unwrap();
    assert!(count_is(2)(&faulty.fx), "one re-entry, not two");
    faulty
        .lose_reply_of(count_is(1), inner.release())
        .await
        .unwrap();
    assert!(count_is(1)(&faulty.fx), "one decrement, not two");
    faulty
        .lose_reply_of(|fx| fx.lock_key("counted").is_none(), outer.release())
        .await
        .unwrap();
    assert!(faulty.fx.lock_key("counted").is_none());
}

/// A release of a re-entered hold that ran on the server but whose caller stopped waiting (a
/// timeout around it: the future is dropped) is finished by the guard's drop in the
/// background, with the same operation: that send must replay the release's op record, not
/// decrement again and free the lock under the other guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_release_that_ran_is_not_applied_again_by_the_guard_drop() {
    let faulty = Faulty::start();
    let client = faulty.client().await;
    let lock = client.lock("dropped").unwrap();
    let outer = lock.acquire().await.unwrap();
    // Loads the scripts first: a first EVALSHA's NOSCRIPT answer would be lost in the blackhole.
    outer.reenter().await.unwrap().release().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    let holder = outer.holder_id().to_owned();
    let count_is = |n: u64| holds_alone("dropped", &holder, n);
    assert!(count_is(2)(&faulty.fx));

    // The release runs (2 -> 1) but its reply never comes back, and its caller gives up on
    // it: the guard's drop sends the same release again, through the same blackhole (requests
    // still reach Redis), so it runs before anything heals.
    faulty.proxy.blackhole(Direction::Downstream);
    let release = tokio::spawn(inner.release());
    assert!(eventually(Duration::from_secs(5), || count_is(1)(&faulty.fx)).await);
    release.abort();
    assert!(release.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(count_is(1)(&faulty.fx), "the release was applied twice");
    faulty.proxy.reset_all();
    faulty.proxy.heal();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(count_is(1)(&faulty.fx), "the release was applied twice");
    assert!(outer.is_valid());
    outer.release().await.unwrap();
    assert!(faulty.fx.lock_key("dropped").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_reply_that_arrives_after_the_lease_is_reported_lost_at_once() {
    let faulty = Faulty::start();
    let client = LockClient::builder(faulty.proxy.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let lock = client
        .lock("late")
        .unwrap()
        .with_lease(Duration::from_millis(100))
        .unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    faulty
        .proxy
        .delay(Direction::Downstream, Duration::from_millis(300));
    let guard = lock.acquire().await.unwrap();
    faulty.proxy.heal();
    assert!(
        !guard.is_valid(),
        "the lease ended before the reply arrived"
    );
    tokio::time::timeout(Duration::from_millis(50), guard.lost())
        .await
        .expect("lost() resolves at once");
    let _ = guard.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_from_redis_ends_the_lease_and_fires_the_lost_signal() {
    let faulty = Faulty::start();
    let client = LockClient::builder(faulty.proxy.url())
        .default_lease(Duration::from_millis(900))
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let guard = client.lock("partitioned").unwrap().acquire().await.unwrap();
    faulty.proxy.blackhole(Direction::Both);
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("renewals fail until the lease runs out, then the holder is told");
    assert!(!guard.is_valid());
    // The lost signal fired no later than the server-side lease: by then the key is gone or
    // about to be, and another client (not partitioned) can take the lock.
    let other = faulty.fx.client().await;
    let next = other
        .lock("partitioned")
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(next.token() > guard.token());
    faulty.proxy.heal();
    next.release().await.unwrap();
}

/// An extension that shortens the lease and whose reply is lost may have run: the guard must
/// not go on reporting the longer lease it had, which the server no longer keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortening_extension_whose_reply_was_lost_shortens_the_guards_lease() {
    let faulty = Faulty::start();
    let client = LockClient::builder(faulty.proxy.url())
        .response_timeout(Duration::from_millis(200))
        .retry_window(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let long = Duration::from_secs(60);
    let lock = client.lock("shortened").unwrap().with_lease(long).unwrap();
    let guard = lock.acquire().await.unwrap();
    // Loaded once, so that the lost send below is the script itself and runs.
    guard.extend(long).await.unwrap();
    faulty.proxy.blackhole(Direction::Downstream);
    let short = Duration::from_secs(2);
    assert!(guard.extend(short).await.is_err(), "no reply came back");
    faulty.proxy.heal();
    assert!(
        guard.valid_until() <= std::time::Instant::now() + short,
        "the guard still counts on the long lease"
    );
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lost signal fires by the shortened lease's end");
    // The extension ran: the server's lease ends a moment later (the guard's deadline is
    // counted from the send), not a minute later, and another client takes the lock.
    let other = faulty.fx.client().await;
    let next = other
        .lock("shortened")
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await;
    assert!(
        next.is_ok(),
        "the extension did not run after all: {next:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_deadline_holds_while_redis_does_not_answer() {
    let faulty = Faulty::start();
    let client = LockClient::builder(faulty.proxy.url())
        .retry_window(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let lock = client.lock("unanswered").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    faulty.proxy.blackhole(Direction::Both);
    let started = std::time::Instant::now();
    let err = lock
        .acquire_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // Not the 3 s retry window nor the 1 s response timeout: the deadline cut the retries.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    faulty.heal_and_find_free(&lock).await;
}

/// An operation that meets a reconnect it cannot finish (the server's replies, the new
/// connection's handshake among them, are lost) gives up when its retry window closes, not
/// when the reconnect's tries run out: each attempt waits for the connection at most one
/// response timeout. Here the reconnect alone would take four connection timeouts (8 s and
/// pauses); the operation's bound is its window plus one response timeout, 1.2 s. Whatever
/// the acquisition did on Redis is undone once the server can be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_that_meets_a_reconnect_ends_with_its_retry_window() {
    const WINDOW: Duration = Duration::from_secs(1);
    const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
    let faulty = Faulty::start();
    let client = LockClient::builder(faulty.proxy.url())
        .response_timeout(Duration::from_millis(200))
        .connection_timeout(CONNECTION_TIMEOUT)
        .retry_window(WINDOW)
        .connect()
        .await
        .unwrap();
    let lock = client.lock("reconnecting").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    faulty.proxy.blackhole(Direction::Downstream);
    let started = std::time::Instant::now();
    let outcome = lock.try_acquire().await;
    let took = started.elapsed();
    assert!(outcome.is_err(), "{outcome:?}");
    // Far above the bound, for a loaded machine, and far below the reconnect's 8 s that an
    // attempt waiting for it would take.
    assert!(took < WINDOW + CONNECTION_TIMEOUT, "{took:?}");
    faulty.heal_and_find_free(&lock).await;
}

/// An ordered multi-lock (the member-by-member path a cluster takes) whose first member's
/// replies never arrive gives up after the retry window and undoes that member too: its
/// script ran on Redis, so it is held although the client never heard so.
///
/// The connection is restored halfway through the rollback's own retry window (the client
/// cannot reconnect while every reply is lost): 1.5 windows after the member ran, when its
/// acquisition has certainly given up (one window) and its rollback, or the drop guards that
/// finish a failed rollback, are still retrying (two windows and more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_set_undoes_the_member_whose_reply_was_lost() {
    const WINDOW: Duration = Duration::from_secs(3);
    let faulty = Faulty::start();
    let client = LockClient::builder(faulty.proxy.url())
        .response_timeout(Duration::from_millis(200))
        .retry_window(WINDOW)
        .connect()
        .await
        .unwrap();
    let set = client
        .multi_lock(["lost:1", "lost:2"])
        .unwrap()
        .force_ordered_acquisition();
    // Load the scripts first, so the lost requests are the acquisition and its rollback.
    set.acquire().await.unwrap().release().await.unwrap();
    let first = set.names().next().unwrap().to_owned();
    let first = String::from_utf8(first).unwrap();

    let fx = &faulty.fx;
    faulty.proxy.blackhole(Direction::Downstream);
    let (outcome, ()) = tokio::join!(set.try_acquire(), async {
        let ran = eventually(WINDOW, || fx.lock_state(&first).is_some()).await;
        assert!(ran, "the first member's acquisition never reached Redis");
        tokio::time::sleep(WINDOW * 3 / 2).await;
        faulty.proxy.reset_all();
        faulty.proxy.heal();
    });
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(
        eventually(Duration::from_secs(10), || fx.lock_state(&first).is_none()).await,
        "the first member ran on Redis and was never undone: {:?}",
        fx.lock_state(&first)
    );
    assert!(fx.lock_state("lost:1").is_none() && fx.lock_state("lost:2").is_none());
}

/// A set taken in one script whose reply was lost, one member of which is freed from outside
/// before the re-send: the re-send finds the other member still held but that one gone, and
/// answers "cancelled" without touching anything; the member still held is undone, not left
/// held for nobody until its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_answered_cancelled_undoes_the_members_it_still_holds() {
    let faulty = Faulty::start();
    let client = LockClient::builder(faulty.proxy.url())
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let set = client.multi_lock(["gone:1", "gone:2"]).unwrap();
    // Load the scripts first, so the lost request is the acquisition.
    set.acquire().await.unwrap().release().await.unwrap();

    let fx = &faulty.fx;
    faulty.proxy.blackhole(Direction::Downstream);
    let (outcome, ()) = tokio::join!(set.try_acquire(), async {
        let ran = eventually(Duration::from_secs(5), || fx.lock_state("gone:2").is_some()).await;
        assert!(ran, "the set's acquisition never reached Redis");
        let _: () = fx.raw().del(fx.lock_key("gone:1").unwrap()).unwrap();
        faulty.proxy.reset_all();
        faulty.proxy.heal();
    });
    let err = outcome.unwrap_err();
    assert!(matches!(err, fencelock::Error::Cancelled), "{err}");
    assert!(
        eventually(Duration::from_secs(10), || fx
            .lock_state("gone:2")
            .is_none())
        .await,
        "the member still held was left held: {:?}",
        fx.lock_state("gone:2")
    );
}

/// A request that keeps failing with a transient error is re-sent with a growing pause
/// (5 ms doubling up to 250 ms), not in a tight loop: a server that answers READONLY (a
/// primary demoted to a replica) gets a handful of re-sends within the retry window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_sends_of_a_transient_failure_back_off() {
    back_off_within_the_retry_window(false).await;
}

/// The same on the replicated path (`replica_ack`), whose re-sends run in its own loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_sends_of_a_replicated_acquisition_back_off() {
    back_off_within_the_retry_window(true).await;
}

async fn back_off_within_the_retry_window(replica_ack: bool) {
    let fx = Fixture::start();
    let elsewhere = fencelock_testing::RedisServer::start().unwrap();
    let mut builder = LockClient::builder(fx.server.url()).retry_window(Duration::from_secs(1));
    if replica_ack {
        builder = builder.replica_ack(1, Duration::from_millis(100));
    }
    let client = builder.connect().await.unwrap();
    // Loads the scripts (per server); a client without acknowledgement, as this server has no
    // replica to acknowledge anything.
    fx.warm_up(&fx.client().await).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(elsewhere.port())
        .query(&mut fx.raw())
        .unwrap();
    let before = evalsha_attempts(&fx);
    let err = client
        .lock("demoted")
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    // The failed acquisition is undone by its drop guard, whose re-sends back off the same
    // way; wait for its window to pass too, then count both.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let attempts = evalsha_attempts(&fx) - before;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut fx.raw())
        .unwrap();
    assert!(matches!(err, fencelock::Error::Redis(_)), "{err:?}");
    // Pauses of 5, 10, 20, 40, 80, 160, 250, 250 ms fit 8 re-sends into a 1 s window, so
    // the acquisition and its undo make at most 18 attempts; a tight loop makes thousands.
    assert!(
        (2..=20).contains(&attempts),
        "replica_ack {replica_ack}: {attempts} attempts within the retry window"
    );
}

/// Every `EVALSHA` the server saw, whether it ran, failed or was refused.
fn evalsha_attempts(fx: &Fixture) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut fx.raw())
        .unwrap();
    let line = info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .unwrap_or("");
    line.split(',')
        .filter_map(|field| field.split_once('='))
        .filter(|(name, _)| matches!(*name, "calls" | "rejected_calls"))
        .map(|(_, n)| n.parse::<u64>().unwrap())
        .sum()
}

/// A definite error (foreign data under the lock's key) is returned at once on the replicated
/// path too: not re-sent for the retry window as a transient failure would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definite_error_on_the_replicated_path_is_not_re_sent() {
    let fx = Fixture::start();
    let plain = fx.client().await;
    fx.warm_up(&plain).await;
    let held = plain.lock("foreign").unwrap().acquire().await.unwrap();
    let key = fx.lock_key("foreign").unwrap();
    held.release().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("not a lock")
        .query(&mut fx.raw())
        .unwrap();
    let client = LockClient::builder(fx.server.url())
        .replica_ack(1, Duration::from_millis(100))
        .retry_window(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let before = evalsha_attempts(&fx);
    let err = client
        .lock("foreign")
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(err.is_wrong_type(), "{err:?}");
    // The attempt, then the background undo of the failed attempt (whose first EVALSHA answers
    // NOSCRIPT: cancel.lua is loaded on first use); re-sends would be ~10 in the window.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts = evalsha_attempts(&fx) - before;
    assert!((1..=3).contains(&attempts), "{attempts} attempts");
}

/// A busy acquisition whose first send's reply was lost: the re-send is answered "busy", but
/// the lost send may still be on its way and take the lock later. When the caller gives up
/// (here once the acquisition waits quietly in its queue) the acquisition is undone in Redis
/// all the same, which marks its op record cancelled, so that copy does nothing when it
/// arrives.
async fn an_unknown_send_of_a_busy_acquisition_is_undone_when_it_gives_up(
    control: Option<fencelock::negative_controls::Control>,
) -> Result<(), String> {
    let faulty = Faulty::start();
    let holder = faulty.fx.client().await;
    let held = holder.lock("sold-out").unwrap().acquire().await.unwrap();
    let mut builder = LockClient::builder(faulty.proxy.url());
    if let Some(control) = control {
        builder = builder.negative_control(control);
    }
    let client = builder.connect().await.unwrap();
    faulty.fx.warm_up(&client).await;
    let lock = client.lock("sold-out").unwrap();
    let before = evalsha_attempts(&faulty.fx);
    // The caller gives up once the acquisition has had its re-send answered and no attempt of
    // it has reached Redis for half a second: it waits in its queue, with no attempt in flight
    // (whose own undo would mark the record whatever the busy reply did), rather than at a
    // fixed deadline that a loaded machine's reconnect and wake-up attempts may straddle.
    let waiting = async {
        let wait = lock.acquire();
        tokio::pin!(wait);
        let mut seen = evalsha_attempts(&faulty.fx);
        loop {
            tokio::select! {
                outcome = &mut wait => return Some(outcome),
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            let now = evalsha_attempts(&faulty.fx);
            if now == seen && now >= before + 2 {
                return None;
            }
            seen = now;
        }
    };
    let outcome = faulty
        .lose_reply_of(|fx| evalsha_attempts(fx) > before, waiting)
        .await;
    assert!(outcome.is_none(), "the lock was never free: {outcome:?}");
    // The holder took no record; the undone acquisition's is "c".
    let cancelled = eventually(Duration::from_secs(5), || {
        faulty.fx.keys("fencelock:{*}op:*").iter().any(|key| {
            let value: Option<String> = faulty.fx.raw().get(key).unwrap();
            value.as_deref() == Some("c")
        })
    })
    .await;
    held.release().await.unwrap();
    if cancelled {
        Ok(())
    } else {
        Err("the acquisition with a send of unknown outcome was not undone".into())
    }
}

/// A multi-lock taken in one script whose first send's reply was lost, and whose re-send was
/// answered "busy": the lost send may still take every member once the busy one is free, for
/// nobody. The set's undo marks every member's record cancelled, so that copy does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_set_with_a_lost_reply_is_undone() {
    let faulty = Faulty::start();
    let holder = faulty.fx.client().await;
    let client = LockClient::connect(&faulty.proxy.url()).await.unwrap();
    faulty.fx.warm_up(&client).await;
    let set = client.multi_lock(["sold-out", "spare"]).unwrap();
    set.acquire().await.unwrap().release().await.unwrap();
    let held = holder.lock("sold-out").unwrap().acquire().await.unwrap();
    let before = evalsha_attempts(&faulty.fx);
    let busy = faulty
        .lose_reply_of(|fx| evalsha_attempts(fx) > before, set.try_acquire())
        .await;
    assert!(busy.unwrap().is_none(), "the set was never free");
    let cancelled = eventually(Duration::from_secs(5), || {
        let records = faulty.fx.keys("fencelock:{*}op:*");
        let marked = records.iter().filter(|key| {
            let value: Option<String> = faulty.fx.raw().get(key).unwrap();
            value.as_deref() == Some("c")
        });
        marked.count() >= 2
    })
    .await;
    held.release().await.unwrap();
    assert!(
        cancelled,
        "the set with a send of unknown outcome was not undone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_acquisition_with_a_lost_reply_is_undone_when_it_gives_up() {
    an_unknown_send_of_a_busy_acquisition_is_undone_when_it_gives_up(None)
        .await
        .unwrap();
}

/// The negative control: an acquisition that stops its undo at the first definite "busy"
/// leaves the lost send free to take the lock for nobody; the test above catches it.
#[cfg(fencelock_negative_controls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_undo_at_a_busy_reply_is_caught() {
    use fencelock::negative_controls::Control;
    let outcome = an_unknown_send_of_a_busy_acquisition_is_undone_when_it_gives_up(Some(
        Control::StragglerNotUndone,
    ))
    .await;
    assert!(
        outcome.is_err(),
        "Control::StragglerNotUndone was not caught"
    );
}
