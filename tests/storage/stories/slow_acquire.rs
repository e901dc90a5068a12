//! Story 3: the acquire's reply is so slow that the lease is over when it arrives (a proxy
//! delays the replies to the holder's lock client by more than the lease). The guard must be
//! reported lost at once (`is_valid()` false, `lost()` already resolved), and the holder's
//! writes are refused once someone else has written, whether it read first or not.

use std::sync::Arc;
use std::time::Duration;

use fencelock::LockClient;
use fencelock_testing::{Direction, FaultProxy, RedisServer};

use crate::common::ledger::{Backend, Journal, Ledger};
use crate::stories::pause::assert_stale;
use crate::stories::support::claim_and_write;
use crate::stories::support::{
    check_ledger, on_each_backend, poll_once, within, Iteration, LockServer, Runtime, Story, Tokens,
};

const LOCK: &str = "story-3";

#[test]
fn s3_an_acquire_reply_that_comes_after_the_lease_gives_a_lost_guard() {
    on_each_backend(Runtime::MultiThread, run);
}

async fn run(backend: Backend) {
    let story = Story::new(format!("3 slow acquire reply ({})", backend.name()));
    let lock_server = RedisServer::start().expect("start the lock server");
    let view = LockServer(&lock_server);
    let proxy = FaultProxy::start(lock_server.addr()).expect("start the lock proxy");
    let storage = backend.start(false);
    let store = storage.connect().await;
    // The slow reply must not count as a failed request.
    let client_a = LockClient::builder(proxy.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let client_b = LockClient::connect(&lock_server.url()).await.unwrap();
    let mut tokens = Tokens::default();
    // Loads the scripts through the proxy, so the slow request is the acquire itself.
    let warm = client_a.lock(LOCK).unwrap().acquire().await.unwrap();
    tokens.issued(&story.iteration(0).ctx, "warm-up", warm.token());
    warm.release().await.unwrap();

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let ledger: Arc<dyn Ledger> = store.open(&format!("3-{i}")).await.unwrap().into();
        let journal = Journal::new(1);
        let lease = rng.millis(20, 50);
        // Strictly longer than the lease: the reply cannot arrive before the lease is over.
        let delay = lease + rng.millis(20, 40);

        proxy.delay(Direction::Downstream, delay);
        let a = within(
            &ctx,
            "A's slow acquisition",
            client_a
                .lock(LOCK)
                .unwrap()
                .with_lease(lease)
                .unwrap()
                .acquire(),
        )
        .await
        .unwrap();
        proxy.heal();
        tokens.issued(&ctx, "A", a.token());
        assert!(
            !a.is_valid(),
            "{ctx}: a guard whose acquire reply came {delay:?} after a {lease:?} lease is valid"
        );
        assert!(
            poll_once(a.lost()).is_ready(),
            "{ctx}: lost() of a guard that arrived lost does not resolve at once"
        );

        // A careless holder reads (without claiming) before anyone else took over.
        let peeked = if rng.chance(50) {
            Some(ledger.peek().await.unwrap())
        } else {
            None
        };

        let b = within(
            &ctx,
            "B's acquisition",
            client_b.lock(LOCK).unwrap().acquire(),
        )
        .await
        .unwrap();
        tokens.issued(&ctx, "B", b.token());
        claim_and_write(&journal, &*ledger, &mut rng, "B", b.token(), 3).await;

        // A writes anyway: with the snapshot it peeked, or claiming first. Both are refused.
        let at = match peeked {
            Some(at) => at,
            None => ledger.peek().await.unwrap(),
        };
        let stale = journal
            .commit(&*ledger, "A", a.token(), at, rng.amount())
            .await;
        assert_stale(&ctx, "the lost guard's write", &stale, b.token());
        let stale = journal.begin(&*ledger, "A", a.token()).await;
        assert_stale(&ctx, "the lost guard's claim", &stale, b.token());

        assert!(a.release().await.unwrap_err().is_not_held(), "{ctx}");
        view.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());
        b.release().await.unwrap();
        let summary = check_ledger(&ctx, &*ledger, &journal).await;
        assert!(summary.stale_after_newer >= 2, "{ctx}: {summary:?}");
        view.assert_free(&ctx, LOCK);
    }
    story.done(&format!("{} acquisitions", tokens.count()));
}
