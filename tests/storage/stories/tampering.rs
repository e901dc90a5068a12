//! Story 4: the lock is deleted (`DEL`) or made to expire early (`PEXPIRE 1`) behind the
//! holder's back, by an operator or a buggy tool, and someone else takes it. The old holder's
//! release, extend and re-entry fail with `NotHeld` without touching the new holder's lock;
//! a watched holder learns it through its watchdog; its writes are refused.

use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, LockClient, LockGuard};
use fencelock_testing::RedisServer;

use crate::common::ledger::{Backend, Journal, Ledger};
use crate::stories::pause::assert_stale;
use crate::stories::support::claim_and_write;
use crate::stories::support::{
    check_ledger, on_each_backend, until, within, Ctx, Iteration, LockServer, Runtime, Story,
    Tokens,
};

const LOCK: &str = "story-4";

#[test]
fn s4_a_lock_deleted_or_expired_early_leaves_the_new_holder_alone() {
    on_each_backend(Runtime::MultiThread, run);
}

fn assert_not_held<T: std::fmt::Debug>(ctx: &Ctx, what: &str, result: Result<T, Error>) {
    match result {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("{ctx}: {what} should fail with NotHeld, got {other:?}"),
    }
}

async fn run(backend: Backend) {
    let story = Story::new(format!(
        "4 lock deleted or expired early ({})",
        backend.name()
    ));
    let lock_server = RedisServer::start().expect("start the lock server");
    let view = LockServer(&lock_server);
    let storage = backend.start(false);
    let store = storage.connect().await;
    // A's locks are either watched (renewed every 100 ms) or have a long lease of their own.
    let client_a = LockClient::builder(lock_server.url())
        .default_lease(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let client_b = LockClient::connect(&lock_server.url()).await.unwrap();
    let mut tokens = Tokens::default();
    let mut watchdog_noticed = 0;

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let ledger: Arc<dyn Ledger> = store.open(&format!("4-{i}")).await.unwrap().into();
        let journal = Journal::new(1);
        let watched = rng.chance(50);
        let delete = rng.chance(50);
        let lock_a = client_a.lock(LOCK).unwrap();
        let lock_a = if watched {
            lock_a
        } else {
            lock_a.with_lease(Duration::from_secs(30)).unwrap()
        };

        let a = within(&ctx, "A's acquisition", lock_a.acquire())
            .await
            .unwrap();
        tokens.issued(&ctx, "A", a.token());
        let inner = if rng.chance(30) {
            Some(a.reenter().await.unwrap())
        } else {
            None
        };
        let mut snapshot = journal.begin(&*ledger, "A", a.token()).await.unwrap();
        for _ in 0..rng.range(0, 2) {
            let amount = rng.amount();
            snapshot = journal
                .commit(&*ledger, "A", a.token(), snapshot, amount)
                .await
                .unwrap();
        }

        let key = view.lock_key(LOCK).expect("A's lock key");
        let mut raw = view.raw();
        if delete {
            let _: () = redis::cmd("DEL").arg(&key).query(&mut raw).unwrap();
        } else {
            let _: () = redis::cmd("PEXPIRE")
                .arg(&key)
                .arg(1)
                .query(&mut raw)
                .unwrap();
        }
        // A watchdog renewal that reaches Redis within the 1 ms before the key expires sets a
        // fresh lease on it, legitimately (A still holds it then); tamper again until it is
        // gone rather than wait for a lease that keeps being renewed.
        until(&ctx, "the tampered lock key to vanish", || async {
            match view.lock_key(LOCK) {
                None => true,
                Some(key) => {
                    if !delete {
                        let _: () = redis::cmd("PEXPIRE")
                            .arg(&key)
                            .arg(1)
                            .query(&mut view.raw())
                            .unwrap();
                    }
                    false
                }
            }
        })
        .await;

        // The holder may notice before anyone takes over (its own call, or its watchdog) or
        // only after.
        let notice_first = rng.chance(50);
        if notice_first {
            notice(&ctx, &a, watched, &mut watchdog_noticed).await;
        }
        let b = within(
            &ctx,
            "B's acquisition",
            client_b.lock(LOCK).unwrap().acquire(),
        )
        .await
        .unwrap();
        tokens.issued(&ctx, "B", b.token());
        if !notice_first {
            notice(&ctx, &a, watched, &mut watchdog_noticed).await;
        }
        claim_and_write(&journal, &*ledger, &mut rng, "B", b.token(), 2).await;

        // Every operation of the old holder fails and leaves B's lock exactly as it was.
        assert!(!a.is_valid(), "{ctx}: A's guard valid after NotHeld");
        assert_not_held(&ctx, "A's extend", a.extend(Duration::from_secs(30)).await);
        view.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());
        assert_not_held(&ctx, "A's re-entry", a.reenter().await);
        view.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());
        let stale = journal
            .commit(&*ledger, "A", a.token(), snapshot, rng.amount())
            .await;
        assert_stale(&ctx, "A's write", &stale, b.token());
        if let Some(inner) = inner {
            assert_not_held(&ctx, "A's inner release", inner.release().await);
        }
        assert_not_held(&ctx, "A's release", a.release().await);
        view.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());

        b.release().await.unwrap();
        let summary = check_ledger(&ctx, &*ledger, &journal).await;
        assert!(summary.stale_after_newer >= 1, "{ctx}: {summary:?}");
        view.assert_free(&ctx, LOCK);
    }
    story.done(&format!(
        "{} acquisitions; the watchdog reported {watchdog_noticed} losses by itself",
        tokens.count()
    ));
}

/// The old holder learns of the loss: a watched one through its watchdog (lost() resolves
/// with no call of its own), an unwatched one when an extend is refused.
async fn notice(ctx: &Ctx, a: &LockGuard, watched: bool, watchdog_noticed: &mut u64) {
    if watched {
        within(ctx, "the watchdog reporting the loss", a.lost()).await;
        *watchdog_noticed += 1;
    } else {
        assert_not_held(ctx, "A's extend", a.extend(Duration::from_secs(30)).await);
    }
    assert!(!a.is_valid(), "{ctx}: A's guard valid after the loss");
}
