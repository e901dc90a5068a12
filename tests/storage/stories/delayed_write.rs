//! Story 2: a delayed write. The old holder sends its write while it still holds the lock,
//! the network holds the packet back (a `FaultProxy` delaying upstream, between the old
//! holder's storage client and the storage), the lease ends, the new holder acquires and
//! writes directly, and only then does the old write arrive: refused.
//!
//! The old holder's lock client talks to the lock server directly; only its storage traffic
//! is delayed. Whether the delayed write really arrives after the takeover depends on timing,
//! so an iteration whose write arrived first (and was then, correctly, accepted: no newer
//! token had written yet) is checked like any other and repeated with a longer delay, up to
//! four attempts; the story requires every iteration to end up exercising the refusal.

use std::sync::Arc;
use std::time::Duration;

use fencelock::LockClient;
use fencelock_testing::{Direction, FaultProxy, RedisServer};

use crate::common::ledger::{self, Journal, Ledger, LedgerError};
use crate::stories::pause::assert_stale;
use crate::stories::support::claim_and_write;
use crate::stories::support::{
    check_ledger, on_each_backend, within, Iteration, LockServer, Runtime, Story, Tokens,
};

const LOCK: &str = "story-2";
const ATTEMPTS: u32 = 4;

#[test]
fn s2_a_write_delayed_past_the_takeover_is_refused() {
    on_each_backend(Runtime::MultiThread, |backend| async move {
        // By design, not on SQLite: it is a file that each writer opens in its own process,
        // so there is no network between the writer and the storage to hold a write back in.
        // (A write held back in the writer itself is story 1: the pause.) PostgreSQL has one:
        // its client connects through the proxy like the Redis client does.
        if !backend.has_network() {
            println!(
                "story 2 skipped for {}: no network between writer and storage to delay",
                backend.name()
            );
            return;
        }
        run(backend.start(false)).await;
    });
}

async fn run(storage: ledger::Storage) {
    let story = Story::new(format!("2 delayed write ({})", storage.backend().name()));
    let lock_server = RedisServer::start().expect("start the lock server");
    let view = LockServer(&lock_server);
    let proxy = FaultProxy::start(storage.addr().unwrap()).expect("start the storage proxy");
    let store = storage.connect().await;
    let delayed_store = ledger::connect(&storage.url_via(proxy.addr()).unwrap())
        .await
        .expect("connect to the storage through the proxy");
    let client_a = LockClient::connect(&lock_server.url()).await.unwrap();
    let client_b = LockClient::connect(&lock_server.url()).await.unwrap();
    let mut tokens = Tokens::default();
    let mut repeats = 0;
    let mut sent_while_valid = 0;

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let lease = rng.millis(40, 80);
        let mut exercised = false;
        for attempt in 0..ATTEMPTS {
            let name = format!("2-{i}-{attempt}");
            let ledger: Arc<dyn Ledger> = store.open(&name).await.unwrap().into();
            let delayed: Arc<dyn Ledger> = delayed_store.open(&name).await.unwrap().into();
            let journal = Arc::new(Journal::new(1));
            let delay = Duration::from_millis(150 << attempt) + rng.millis(0, 30);

            let a = within(
                &ctx,
                "A's acquisition",
                client_a
                    .lock(LOCK)
                    .unwrap()
                    .with_lease(lease)
                    .unwrap()
                    .acquire(),
            )
            .await
            .unwrap();
            tokens.issued(&ctx, "A", a.token());
            let mut snapshot = journal.begin(&*delayed, "A", a.token()).await.unwrap();
            if rng.chance(50) {
                let amount = rng.amount();
                snapshot = journal
                    .commit(&*delayed, "A", a.token(), snapshot, amount)
                    .await
                    .unwrap();
            }

            // A's write leaves now, before anyone else even tries to take over, and sits in
            // the network for `delay`.
            proxy.delay(Direction::Upstream, delay);
            if a.is_valid() {
                sent_while_valid += 1;
            }
            let amount = rng.amount();
            let late = tokio::spawn({
                let (delayed, journal, token) = (delayed.clone(), journal.clone(), a.token());
                async move {
                    journal
                        .commit(&*delayed, "A", token, snapshot, amount)
                        .await
                }
            });

            let b = within(
                &ctx,
                "B's acquisition after A's lease",
                client_b.lock(LOCK).unwrap().acquire(),
            )
            .await
            .unwrap();
            tokens.issued(&ctx, "B", b.token());
            claim_and_write(&journal, &*ledger, &mut rng, "B", b.token(), 2).await;
            // Only the write already in the network stays delayed.
            proxy.heal();

            let late = within(&ctx, "A's delayed write", late).await.unwrap();
            match &late {
                Err(LedgerError::Stale { .. }) => {
                    assert_stale(&ctx, "A's delayed write", &late, b.token());
                    exercised = true;
                }
                Ok(_) => {
                    // It arrived before B claimed the ledger: legitimately accepted, and B's
                    // snapshot built on it (the ledger check proves that). Try again, slower.
                    repeats += 1;
                }
                Err(err) => panic!("{ctx}: A's delayed write failed: {err}"),
            }

            assert!(a.release().await.unwrap_err().is_not_held(), "{ctx}");
            view.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());
            b.release().await.unwrap();
            check_ledger(&ctx, &*ledger, &journal).await;
            view.assert_free(&ctx, LOCK);
            if exercised {
                break;
            }
        }
        assert!(
            exercised,
            "{ctx}: in {ATTEMPTS} attempts with growing delays, A's delayed write never arrived \
             after B's takeover"
        );
    }
    story.done(&format!(
        "{} acquisitions; {sent_while_valid} writes sent while the guard was valid; \
         {repeats} iterations repeated because the write arrived before the takeover",
        tokens.count()
    ));
}
