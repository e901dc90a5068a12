//! Story 7: a partition between the holder and the lock server, while the holder can still
//! reach the storage. Its renewals get no answer, its lease runs out, and the lost signal must
//! fire before another holder can acquire: the guard's validity ends before the server-side
//! lease does. Its writes after the takeover are refused.
//!
//! The instants compared are this process' monotonic clock: when a task awaiting `lost()` got
//! its answer, and when the other holder's acquire returned. Only their order is asserted. The
//! story runs on a single-threaded runtime, so that both are observed by the same scheduler:
//! the other holder's acquire can only complete after its reply arrived, which is after the
//! server-side lease ended, which is after the guard's deadline (the library keeps 1 % of the
//! lease plus 2 ms of margin); by the time the runtime reads that reply, the watcher's timer
//! has fired too, and the watcher needs one task hop where the acquire needs two. Machine load
//! that stalls the thread stalls both observers alike, so it cannot invert the order. At the
//! moment the other holder has the lock, the old guard must also already say it is invalid,
//! its validity must have ended, and its `lost()` must complete without waiting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::LockClient;
use fencelock_testing::{Direction, FaultProxy, RedisServer};

use crate::common::ledger::{Backend, Journal, Ledger};
use crate::stories::pause::assert_stale;
use crate::stories::support::claim_and_write;
use crate::stories::support::{
    check_ledger, on_each_backend, poll_once, within, Iteration, LockServer, Runtime, Story, Tokens,
};

const LOCK: &str = "story-7";

#[test]
fn s7_a_partitioned_holder_is_told_before_anyone_else_gets_the_lock() {
    on_each_backend(Runtime::CurrentThread, run);
}

async fn run(backend: Backend) {
    let story = Story::new(format!(
        "7 partition from the lock server ({})",
        backend.name()
    ));
    let lock_server = RedisServer::start().expect("start the lock server");
    let view = LockServer(&lock_server);
    let proxy = FaultProxy::start(lock_server.addr()).expect("start the lock proxy");
    let storage = backend.start(false);
    let store = storage.connect().await;
    let lease = Duration::from_millis(150);
    let client_a = LockClient::builder(proxy.url())
        .default_lease(lease)
        .response_timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let client_b = LockClient::connect(&lock_server.url()).await.unwrap();
    let mut tokens = Tokens::default();
    let mut margin_min = Duration::MAX;

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let ledger: Arc<dyn Ledger> = store.open(&format!("7-{i}")).await.unwrap().into();
        let journal = Journal::new(1);

        let a = within(
            &ctx,
            "A's acquisition",
            client_a.lock(LOCK).unwrap().acquire(),
        )
        .await
        .unwrap();
        tokens.issued(&ctx, "A", a.token());
        let mut snapshot = journal.begin(&*ledger, "A", a.token()).await.unwrap();
        for _ in 0..rng.range(0, 2) {
            let amount = rng.amount();
            snapshot = journal
                .commit(&*ledger, "A", a.token(), snapshot, amount)
                .await
                .unwrap();
        }
        // Let some renewals happen (or not) before the partition.
        tokio::time::sleep(rng.millis(0, 100)).await;

        proxy.blackhole(Direction::Both);
        let a = Arc::new(a);
        let watcher = tokio::spawn({
            let a = a.clone();
            async move {
                a.lost().await;
                Instant::now()
            }
        });

        let b = within(
            &ctx,
            "B's acquisition after A's lease",
            client_b.lock(LOCK).unwrap().acquire(),
        )
        .await
        .unwrap();
        let b_at = Instant::now();
        assert!(!a.is_valid(), "{ctx}: A's guard valid when B got the lock");
        assert!(
            poll_once(a.lost()).is_ready(),
            "{ctx}: A's lost() not resolved when B got the lock"
        );
        assert!(
            a.valid_until() < b_at,
            "{ctx}: A's validity ends after B got the lock"
        );
        let lost_at = within(&ctx, "A's lost signal", watcher).await.unwrap();
        assert!(
            lost_at <= b_at,
            "{ctx}: A's lost() resolved after B had already acquired the lock"
        );
        margin_min = margin_min.min(b_at - lost_at);
        tokens.issued(&ctx, "B", b.token());

        claim_and_write(&journal, &*ledger, &mut rng, "B", b.token(), 2).await;
        // A still reaches the storage, and writes with what it had.
        let stale = journal
            .commit(&*ledger, "A", a.token(), snapshot, rng.amount())
            .await;
        assert_stale(&ctx, "the partitioned holder's write", &stale, b.token());

        // The partition heals (the stuck connection is reset, as TCP eventually would).
        proxy.reset_all();
        proxy.heal();
        let a = Arc::into_inner(a).expect("the watcher is done");
        assert!(a.release().await.unwrap_err().is_not_held(), "{ctx}");
        view.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());
        b.release().await.unwrap();
        let summary = check_ledger(&ctx, &*ledger, &journal).await;
        assert!(summary.stale_after_newer >= 1, "{ctx}: {summary:?}");
        view.assert_free(&ctx, LOCK);
    }
    story.done(&format!(
        "{} acquisitions; the lost signal came first every time (smallest lead {margin_min:?}, \
         reported, not asserted)",
        tokens.count()
    ));
}
