//! Story 8: the holder crashes. A child process holding a watchdog-renewed lock, in the middle
//! of a stream of writes, is killed with `SIGKILL`: it never releases. The lock must free
//! within one lease (the server-side remaining lease at the kill is at most one lease, and
//! another holder gets the lock with a generous timeout), the next holder's token is greater,
//! and the ledger holds every write the child was told succeeded; the one in flight at the
//! kill may or may not be there.

use fencelock::LockClient;
use fencelock_testing::RedisServer;

use crate::common::ledger::{Backend, Journal};
use crate::stories::pause::{parse_token, record_child};
use crate::stories::support::claim_and_write;
use crate::stories::support::ChildHolder;
use crate::stories::support::{
    check_ledger, on_each_backend, within, ChildArgs, ChildProcess, Control, Iteration, LockServer,
    Runtime, Story, Tokens, GENEROUS,
};

const LOCK: &str = "story-8";
const CHILD_TEST: &str = "stories::crash::child_crashing_holder";
const CHILD_ROLE: &str = "crashing-holder";

/// The child of story 8; does nothing unless started by it. Holds the lock and writes until
/// it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_crashing_holder() {
    let Some(args) = ChildArgs::from_env(CHILD_ROLE) else {
        return;
    };
    let ChildHolder {
        ctl,
        ledger,
        mut rng,
        guard,
        mut snapshot,
        client: _client,
        store: _store,
    } = ChildHolder::start(&args).await;
    let token = guard.token();
    for id in args.first_id.. {
        let amount = rng.amount();
        ctl.send(format!("try {id} {amount}")).await;
        snapshot = ledger.commit(token, snapshot, id, amount).await.unwrap();
        ctl.send(format!("ok {id}")).await;
        tokio::time::sleep(rng.millis(0, 3)).await;
    }
    unreachable!("killed long before");
}

#[test]
fn s8_a_crashed_holder_frees_the_lock_within_one_lease() {
    on_each_backend(Runtime::MultiThread, run);
}

async fn run(backend: Backend) {
    let story = Story::new(format!("8 crash ({})", backend.name()));
    let lock_server = RedisServer::start().expect("start the lock server");
    let view = LockServer(&lock_server);
    let storage = backend.start(false);
    let store = storage.connect().await;
    let client_b = LockClient::connect(&lock_server.url()).await.unwrap();
    let mut tokens = Tokens::default();
    let mut in_flight_at_kill = 0;
    let mut child_writes = 0;

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let name = format!("8-{i}");
        let ledger = store.open(&name).await.unwrap();
        let journal = Journal::new(1);
        let args = ChildArgs {
            lock_url: lock_server.url(),
            storage_url: storage.url().to_owned(),
            control_url: lock_server.url(),
            ledger: name,
            channel: format!("story:8:{}:{i}", story.seed),
            lock: LOCK.into(),
            lease_ms: rng.range(60, 120),
            first_id: 1_000_000,
            seed: rng.next_u64(),
        };
        let ctl = Control::connect(&args.control_url, &args.channel).await;
        let mut child = ChildProcess::spawn(CHILD_TEST, CHILD_ROLE, &args);
        // Kill it after a seeded number of acknowledged writes, plus a little: mid-write.
        let writes = rng.range(0, 4) as usize;
        let events = ctl
            .wait_for(&ctx, &mut child, "its writes", |events| {
                events.iter().any(|e| e == "claimed")
                    && events.iter().filter(|e| e.starts_with("ok ")).count() >= writes
            })
            .await;
        let child_token = parse_token(&events, "held ");
        tokens.issued(&ctx, "the child", child_token);
        tokio::time::sleep(rng.millis(0, 4)).await;
        child.kill(&ctx).await;
        let (_, _output) = child.finish(&ctx).await;

        // Nobody will release it; the server-side lease that remains is at most one lease.
        if let Some(pttl) = view.pttl(LOCK) {
            assert!(
                pttl <= args.lease_ms as i64,
                "{ctx}: the crashed holder's lock has {pttl} ms left of a {} ms lease",
                args.lease_ms
            );
        }
        let b = within(
            &ctx,
            "B's acquisition after the crash",
            client_b.lock(LOCK).unwrap().acquire_timeout(GENEROUS),
        )
        .await
        .unwrap();
        tokens.issued(&ctx, "B", b.token());
        assert!(b.token() > child_token, "{ctx}");

        let events = ctl.events().await;
        record_child(&journal, "child", child_token, &events, None);
        if events.last().is_some_and(|e| e.starts_with("try ")) {
            in_flight_at_kill += 1;
        }
        child_writes += events.iter().filter(|e| e.starts_with("ok ")).count();

        claim_and_write(&journal, &*ledger, &mut rng, "B", b.token(), 2).await;
        b.release().await.unwrap();
        let summary = check_ledger(&ctx, &*ledger, &journal).await;
        assert_eq!(
            summary.rejected, 0,
            "{ctx}: nothing here is stale: {summary:?}"
        );
        view.assert_free(&ctx, LOCK);
    }
    story.done(&format!(
        "{} acquisitions; {child_writes} acknowledged child writes; killed mid-write \
         {in_flight_at_kill} times",
        tokens.count()
    ));
}
