//! Story 1: the holder pauses past its lease (GC, page faults, `SIGSTOP`) and writes after
//! another holder took over and wrote.
//!
//! (a) In one process: a chain of 2..=4 fixed-lease holders, of which the seed picks some to
//!     pause: a paused holder's task sleeps past its deadline, the next holders acquire (after
//!     its lease) and write, and it wakes after a seeded later holder has written and writes
//!     with its old token and snapshot. Every holder works under a lease that storage latency
//!     cannot outlast (a loaded machine and an SQL round trip can take tens of milliseconds);
//!     a holder that pauses first shortens its lease to a seeded 40..=100 ms (`extend`), so
//!     the lease runs out during the pause and only there.
//! (b) Across processes: a child process holding a watchdog-renewed lock is frozen with
//!     `SIGSTOP` (so its watchdog stops renewing), another holder takes over and writes, then
//!     `SIGCONT`: the child finishes the write it was about to make, and it is refused.

use std::sync::Arc;

use fencelock::{FencingToken, LockClient};
use fencelock_testing::{RedisServer, Signal};
use tokio::sync::oneshot;

use crate::common::ledger::{Attempt, Backend, Journal, Ledger, LedgerError, Outcome, Write};
use crate::stories::support::claim_and_write;
use crate::stories::support::ChildHolder;
use crate::stories::support::{
    check_ledger, on_each_backend, poll_once, within, ChildArgs, ChildProcess, Control, Iteration,
    LockServer, Runtime, Story, Tokens, GENEROUS,
};

#[test]
fn s1a_a_holder_that_sleeps_past_its_lease_is_fenced_off() {
    on_each_backend(Runtime::MultiThread, in_process);
}

async fn in_process(backend: Backend) {
    const LOCK: &str = "story-1a";
    let story = Story::new(format!("1a pause in-process ({})", backend.name()));
    let lock_server = RedisServer::start().expect("start the lock server");
    let view = LockServer(&lock_server);
    let storage = backend.start(false);
    let store = storage.connect().await;
    let client = LockClient::connect(&lock_server.url()).await.unwrap();
    let mut tokens = Tokens::default();
    let (mut paused_total, mut rejected) = (0, 0);

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let ledger: Arc<dyn Ledger> = store.open(&format!("1a-{i}")).await.unwrap().into();
        let journal = Arc::new(Journal::new(1));
        let lock = client.lock(LOCK).unwrap().with_lease(GENEROUS).unwrap();
        let lease_left = rng.millis(40, 100);

        // A chain of 2..=4 holders; the seed picks which of them (never the last) pause.
        let holders = rng.range(2, 4);
        let mut pauses: Vec<bool> = (0..holders - 1).map(|_| rng.chance(40)).collect();
        if !pauses.contains(&true) {
            let who = rng.range(0, holders - 2) as usize;
            pauses[who] = true;
        }
        pauses.push(false);

        // A paused holder's task sleeps past its deadline and then until the holder it is
        // scheduled to wake after has written; then it writes what it computed before.
        let mut sleepers = Vec::new();
        let mut last = None;
        for (h, paused) in pauses.into_iter().enumerate() {
            let who = format!("H{h}");
            let guard = within(&ctx, &format!("{who}'s acquisition"), lock.acquire())
                .await
                .unwrap();
            tokens.issued(&ctx, &who, guard.token());
            let mut snapshot = journal.begin(&*ledger, &who, guard.token()).await.unwrap();
            for _ in 0..rng.range(0, 2) {
                let amount = rng.amount();
                snapshot = journal
                    .commit(&*ledger, &who, guard.token(), snapshot, amount)
                    .await
                    .unwrap();
            }

            let (due, waiting): (Vec<Sleeper>, Vec<Sleeper>) = std::mem::take(&mut sleepers)
                .into_iter()
                .partition(|s: &Sleeper| s.wake_after == h);
            sleepers = waiting;
            for sleeper in due {
                sleeper.wake.send(guard.token()).unwrap();
                let stale = within(&ctx, "a paused holder's stale write", sleeper.task)
                    .await
                    .expect("the paused holder's task");
                assert!(stale.release().await.unwrap_err().is_not_held(), "{ctx}");
                view.assert_held_by(&ctx, LOCK, guard.holder_id(), guard.token());
            }

            if paused {
                paused_total += 1;
                // The pause begins with `lease_left` of the lease left.
                guard.extend(lease_left).await.unwrap();
                let (wake, woken) = oneshot::channel::<FencingToken>();
                let wake_after = rng.range(h as u64 + 1, holders - 1) as usize;
                let overshoot = rng.millis(0, 20);
                let (amount, again) = (rng.amount(), rng.chance(50));
                let (ledger, journal, ctx) = (ledger.clone(), journal.clone(), ctx.clone());
                let task = tokio::spawn(async move {
                    tokio::time::sleep_until((guard.valid_until() + overshoot).into()).await;
                    let newer = woken.await.expect("the wake-up");
                    assert!(
                        !guard.is_valid(),
                        "{ctx}: {who}'s guard valid after a takeover"
                    );
                    assert!(
                        poll_once(guard.lost()).is_ready(),
                        "{ctx}: {who}'s lost() not resolved after a takeover"
                    );
                    let stale = journal
                        .commit(&*ledger, &who, guard.token(), snapshot, amount)
                        .await;
                    assert_stale(
                        &ctx,
                        &format!("{who}'s write after the pause"),
                        &stale,
                        newer,
                    );
                    if again {
                        // Claiming afresh does not help either.
                        let stale = journal.begin(&*ledger, &who, guard.token()).await;
                        assert_stale(
                            &ctx,
                            &format!("{who}'s claim after the pause"),
                            &stale,
                            newer,
                        );
                    }
                    guard
                });
                sleepers.push(Sleeper {
                    wake_after,
                    wake,
                    task,
                });
            } else if h + 1 < holders as usize {
                guard.release().await.unwrap();
            } else {
                last = Some(guard);
            }
        }
        assert!(
            sleepers.is_empty(),
            "{ctx}: a paused holder was never woken"
        );
        last.expect("the last holder").release().await.unwrap();

        let summary = check_ledger(&ctx, &*ledger, &journal).await;
        assert!(summary.stale_after_newer >= 1, "{ctx}: {summary:?}");
        rejected += summary.rejected;
        view.assert_free(&ctx, LOCK);
    }
    story.done(&format!(
        "{} acquisitions, {paused_total} paused holders, {rejected} stale writes refused",
        tokens.count()
    ));
}

/// A paused holder: its task, the signal that wakes it, and after which holder it wakes.
struct Sleeper {
    wake_after: usize,
    wake: oneshot::Sender<FencingToken>,
    task: tokio::task::JoinHandle<fencelock::LockGuard>,
}

/// `result` must be a stale-token refusal naming `newer` as the ledger's latest token.
pub fn assert_stale<T: std::fmt::Debug>(
    ctx: &crate::stories::support::Ctx,
    what: &str,
    result: &Result<T, LedgerError>,
    newer: FencingToken,
) {
    match result {
        Err(LedgerError::Stale { latest, .. }) if *latest == newer.get() => {}
        other => panic!(
            "{ctx}: {what} should be refused as stale by token {newer}, got {other:?} \
             (a STALE WRITE ACCEPTED if Ok)"
        ),
    }
}

const CHILD_TEST: &str = "stories::pause::child_frozen_holder";
const CHILD_ROLE: &str = "frozen-holder";

/// The child of story 1b; does nothing unless started by it.
///
/// It acquires a watchdog-renewed lock, claims the ledger, writes 0..=2 entries, checks that
/// it still holds the lock, says "ready" and is about to write once more. The parent freezes
/// it right there; "go" pins the point so that the write is issued after the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_frozen_holder() {
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
    let mut id = args.first_id;
    for _ in 0..rng.range(0, 2) {
        let amount = rng.amount();
        ctl.send(format!("try {id} {amount}")).await;
        snapshot = ledger.commit(token, snapshot, id, amount).await.unwrap();
        ctl.send(format!("ok {id}")).await;
        id += 1;
    }
    ctl.send(format!("ready {}", guard.is_valid())).await;
    ctl.wait_for_go().await;

    let amount = rng.amount();
    ctl.send(format!("try {id} {amount}")).await;
    match ledger.commit(token, snapshot, id, amount).await {
        Ok(_) => ctl.send(format!("ok {id}")).await,
        Err(LedgerError::Stale { latest, .. }) => ctl.send(format!("stale {id} {latest}")).await,
        Err(err) => ctl.send(format!("failed {id} {err}")).await,
    }
    ctl.send(format!("after valid={}", guard.is_valid())).await;
    let outcome = match guard.release().await {
        Ok(()) => "ok".to_owned(),
        Err(err) if err.is_not_held() => "not-held".to_owned(),
        Err(err) => format!("error {err}"),
    };
    ctl.send(format!("release {outcome}")).await;
}

#[test]
fn s1b_a_process_frozen_with_sigstop_is_fenced_off() {
    on_each_backend(Runtime::MultiThread, cross_process);
}

async fn cross_process(backend: Backend) {
    const LOCK: &str = "story-1b";
    let story = Story::new(format!("1b pause cross-process ({})", backend.name()));
    let lock_server = RedisServer::start().expect("start the lock server");
    let view = LockServer(&lock_server);
    let storage = backend.start(false);
    let store = storage.connect().await;
    let client_b = LockClient::connect(&lock_server.url()).await.unwrap();
    let mut tokens = Tokens::default();
    let mut believed_valid = 0;

    for i in 0..story.iterations {
        let Iteration { mut rng, ctx } = story.iteration(i);
        let name = format!("1b-{i}");
        let ledger = store.open(&name).await.unwrap();
        let journal = Journal::new(1);
        let args = ChildArgs {
            lock_url: lock_server.url(),
            storage_url: storage.url().to_owned(),
            control_url: lock_server.url(),
            ledger: name.clone(),
            channel: format!("story:1b:{}:{i}", story.seed),
            lock: LOCK.into(),
            lease_ms: rng.range(80, 150),
            first_id: 1_000_000,
            seed: rng.next_u64(),
        };
        let ctl = Control::connect(&args.control_url, &args.channel).await;
        let mut child = ChildProcess::spawn(CHILD_TEST, CHILD_ROLE, &args);
        let events = ctl
            .wait_for(&ctx, &mut child, "ready", |events| {
                events.iter().any(|e| e.starts_with("ready"))
            })
            .await;
        child.signal(&ctx, Signal::Stop);
        let child_token = parse_token(&events, "held ");
        tokens.issued(&ctx, "the child", child_token);
        if events.iter().any(|e| e == "ready true") {
            believed_valid += 1;
        }

        // The frozen child's watchdog renews nothing, so its lease runs out.
        let b = within(
            &ctx,
            "B's acquisition while the child is frozen",
            client_b.lock(LOCK).unwrap().acquire(),
        )
        .await
        .unwrap();
        tokens.issued(&ctx, "B", b.token());
        claim_and_write(&journal, &*ledger, &mut rng, "B", b.token(), 3).await;

        let go_at = std::time::Instant::now();
        child.signal(&ctx, Signal::Cont);
        ctl.go().await;
        let (success, output) = child.finish(&ctx).await;
        assert!(success, "{ctx}: the child failed\n{output}");
        let events = ctl.events().await;
        record_child(&journal, "child", child_token, &events, Some(go_at));

        let stale = events
            .iter()
            .rev()
            .find(|e| e.starts_with("stale ") || e.starts_with("ok ") || e.starts_with("failed "));
        assert!(
            stale.is_some_and(|e| e.starts_with("stale ")
                && e.ends_with(&format!(" {}", b.token()))),
            "{ctx}: the thawed child's write should be refused by B's token {}: {events:?}",
            b.token()
        );
        assert!(
            events.iter().any(|e| e == "release not-held"),
            "{ctx}: the child's release should fail as not held: {events:?}"
        );
        assert!(
            events.iter().any(|e| e == "after valid=false"),
            "{ctx}: the thawed child's guard should know it is invalid: {events:?}"
        );
        view.assert_held_by(&ctx, LOCK, b.holder_id(), b.token());
        b.release().await.unwrap();

        let summary = check_ledger(&ctx, &*ledger, &journal).await;
        assert!(summary.stale_after_newer >= 1, "{ctx}: {summary:?}");
        view.assert_free(&ctx, LOCK);
    }
    story.done(&format!(
        "{} acquisitions; the child believed it held the lock when frozen in \
         {believed_valid} iterations",
        tokens.count()
    ));
}

/// The token in the event that starts with `prefix` ("held 123").
pub fn parse_token(events: &[String], prefix: &str) -> FencingToken {
    events
        .iter()
        .find_map(|e| e.strip_prefix(prefix))
        .and_then(|t| t.parse().ok())
        .and_then(FencingToken::new)
        .unwrap_or_else(|| panic!("no {prefix:?} event in {events:?}"))
}

/// Turns a child's events into journal attempts. Writes it made after "ready" were issued
/// after `go_at` (when the parent said go) by this process' clock; the others get no times.
pub fn record_child(
    journal: &Journal,
    who: &str,
    token: FencingToken,
    events: &[String],
    go_at: Option<std::time::Instant>,
) {
    let token = token.get();
    let mut after_go = false;
    let mut pending: Option<(u64, i64, bool)> = None;
    let push = |write, outcome, after: bool| {
        journal.record(Attempt {
            who: who.into(),
            token,
            write,
            outcome,
            issued: go_at.filter(|_| after),
            done: None,
        });
    };
    for event in events {
        let words: Vec<&str> = event.split(' ').collect();
        match words.as_slice() {
            ["claimed"] => push(Write::Claim, Outcome::Accepted, false),
            ["ready", ..] => after_go = true,
            ["try", id, amount] => {
                pending = Some((id.parse().unwrap(), amount.parse().unwrap(), after_go));
            }
            [kind @ ("ok" | "stale" | "failed"), id, rest @ ..] => {
                let (pid, amount, after) = pending.take().expect("an outcome follows a try");
                assert_eq!(pid, id.parse::<u64>().unwrap(), "{events:?}");
                let outcome = match *kind {
                    "ok" => Outcome::Accepted,
                    "stale" => Outcome::Stale {
                        latest: rest[0].parse().unwrap(),
                    },
                    _ => Outcome::Unknown,
                };
                push(Write::Entry { id: pid, amount }, outcome, after);
            }
            _ => {}
        }
    }
    if let Some((id, amount, after)) = pending {
        // Sent, and then the process died: it may or may not have been applied.
        push(Write::Entry { id, amount }, Outcome::Unknown, after);
    }
}
