//! Story 6: failover to a replica that missed the latest acquisition. Replication is
//! asynchronous: the primary grants the lock, dies before the replica got it, the replica is
//! promoted and has neither the lock nor the latest fence counter. A second holder gets in
//! while the first still believes it holds (documented). What must hold: tokens issued
//! afterwards are still greater than every token issued before (the clock floor in
//! `acquire.lua`: token = max(counter + 1, server time in µs)), and the old holder's writes
//! are refused by the storage (a separate server).
//!
//! Topology: two nodes that swap roles every iteration. Clients reach "the primary" through a
//! proxy that is retargeted on failover (a virtual IP); the replica replicates through a
//! second proxy, which is cut (blackholed) before the acquisition that it must miss. Pausing
//! the replica with `SIGSTOP` would not do: what the primary sent meanwhile waits in the
//! replica's socket buffer and is applied when the replica resumes, even after the primary
//! died.

use std::sync::Arc;
use std::time::Duration;

use fencelock::LockClient;
use fencelock_testing::{Direction, FaultProxy, RedisServer, RedisServerBuilder};

use crate::common::ledger::{Backend, Journal, Ledger};
use crate::stories::pause::assert_stale;
use crate::stories::support::claim_and_write;
use crate::stories::support::{
    check_ledger, on_each_backend, within, Iteration, LockServer, Runtime, Story, Tokens, GENEROUS,
};

const LOCK: &str = "story-6";

#[test]
fn s6_a_failover_that_loses_an_acquisition_keeps_tokens_increasing() {
    on_each_backend(Runtime::MultiThread, run);
}

fn node() -> RedisServerBuilder {
    RedisServer::builder().config("repl-diskless-sync-delay", "0")
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn run(backend: Backend) {
    let story = Story::new(format!("6 failover ({})", backend.name()));
    let first = node().start().expect("start the first primary");
    // Clients reach the primary through `front`; the replica follows it through `link`.
    let front = FaultProxy::start(first.addr()).expect("start the client proxy");
    let link = FaultProxy::start(first.addr()).expect("start the replication proxy");
    let second = node()
        .replica_of(link.addr())
        .start()
        .expect("start the replica");
    let mut nodes = [first, second];
    let mut primary = 0;

    let storage = backend.start(true);
    let store = storage.connect().await;
    let client_a = LockClient::builder(front.url())
        .default_lease(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let client_b = LockClient::connect(&front.url()).await.unwrap();
    let mut tokens = Tokens::default();
    let mut taken_before_lost = 0;

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let replica = 1 - primary;
        let ledger: Arc<dyn Ledger> = store.open(&format!("6-{i}")).await.unwrap().into();
        let journal = Journal::new(1);

        // An acquisition the replica does get: its fence counter is real, just old.
        let seen = within(
            &ctx,
            "H0's acquisition",
            client_b.lock(LOCK).unwrap().acquire(),
        )
        .await
        .unwrap();
        tokens.issued(&ctx, "H0", seen.token());
        seen.release().await.unwrap();
        blocking(|| {
            let offset = nodes[primary].replication_offset().unwrap();
            nodes[replica]
                .wait_for_replication(offset, GENEROUS)
                .unwrap_or_else(|err| panic!("{ctx}: {err}"));
        });

        // From here the replica gets nothing: A's acquisition exists only on the primary.
        link.blackhole(Direction::Both);
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

        // The primary dies; the replica is promoted and the clients are moved to it.
        blocking(|| {
            nodes[primary].kill();
            nodes[replica].promote().unwrap();
        });
        let promoted = LockServer(&nodes[replica]);
        assert_eq!(
            promoted.lock_key(LOCK),
            None,
            "{ctx}: the promoted replica has A's lock: the failover lost nothing"
        );
        let counters = promoted.fence_counters();
        assert!(
            counters.iter().all(|&c| c < a.token().get()),
            "{ctx}: the promoted replica's fence counter {counters:?} is not behind A's token {}",
            a.token()
        );
        front.retarget(nodes[replica].addr());
        link.retarget(nodes[replica].addr());
        link.heal();

        let b_first = rng.chance(50);
        let b = if b_first {
            let b = within(
                &ctx,
                "B's acquisition on the promoted replica",
                client_b.lock(LOCK).unwrap().acquire(),
            )
            .await
            .unwrap();
            if a.is_valid() {
                taken_before_lost += 1;
            }
            Some(b)
        } else {
            None
        };
        within(&ctx, "A learning that it lost the lock", a.lost()).await;
        let b = match b {
            Some(b) => b,
            None => within(
                &ctx,
                "B's acquisition on the promoted replica",
                client_b.lock(LOCK).unwrap().acquire(),
            )
            .await
            .unwrap(),
        };
        tokens.issued(&ctx, "B", b.token());

        claim_and_write(&journal, &*ledger, &mut rng, "B", b.token(), 2).await;
        let stale = journal
            .commit(&*ledger, "A", a.token(), snapshot, rng.amount())
            .await;
        assert_stale(&ctx, "A's write after the failover", &stale, b.token());

        assert!(a.release().await.unwrap_err().is_not_held(), "{ctx}");
        promoted.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());
        b.release().await.unwrap();
        let summary = check_ledger(&ctx, &*ledger, &journal).await;
        assert!(summary.stale_after_newer >= 1, "{ctx}: {summary:?}");
        promoted.assert_free(&ctx, LOCK);

        // The old primary comes back, empty, as a replica of the new one.
        blocking(|| {
            nodes[primary]
                .start_again()
                .expect("restart the old primary");
            nodes[primary].replicate(link.addr()).unwrap();
        });
        primary = replica;
    }
    story.done(&format!(
        "{} acquisitions over {} failovers; the promoted replica's fence counter was behind A's \
         token every time, so B's greater token came from the clock floor; B got the lock while \
         A still believed it held it in {taken_before_lost} iterations",
        tokens.count(),
        story.iterations
    ));
}
