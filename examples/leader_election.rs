//! Leader election: one leader at a time, a term that fences the leader's writes, and a
//! follower that sees every change of leader without campaigning.
//!
//! ```text
//! cargo run --example leader_election
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --example leader_election
//! ```
//!
//! 1. Two schedulers campaign for `scheduler`; the first leads, the second waits.
//! 2. A follower sees the leader and the address it published.
//! 3. The leader resigns: the second scheduler leads at once with a higher term, and the
//!    follower sees it.
//! 4. The old leader writes with its old term after the new leader wrote: refused.
//!
//! Exit status 0 when all of that happened as described, 1 otherwise.

mod support;

use std::process::ExitCode;
use std::time::Duration;

use fencelock::{Error, LockClient};
use support::{BoxError, ExampleRedis};

/// How long any one step may take before the example calls it a failure.
const STEP: Duration = Duration::from_secs(5);

async fn run() -> Result<Vec<String>, BoxError> {
    let redis = ExampleRedis::from_env()?;
    println!("leader_election: {}", redis.describe());
    let connect = || {
        LockClient::builder(redis.url())
            .prefix(redis.prefix())
            .connect()
    };
    let (one, two, follower) = (connect().await?, connect().await?, connect().await?);
    let mut failures = Vec::new();

    // 1. The first scheduler leads; the second waits for its turn.
    let first = one
        .election("scheduler")?
        .campaign(b"10.0.0.1:8080")
        .await?;
    println!("scheduler 1 leads in term {}", first.term());
    let waiting = tokio::spawn({
        let election = two.election("scheduler")?;
        async move { election.campaign(b"10.0.0.2:8080").await }
    });

    // 2. The follower sees who leads and where to reach it.
    let mut observer = follower.election("scheduler")?.observe().await?;
    match observer.current() {
        Some(leader) if leader.term() == first.term() => println!(
            "follower: {} leads term {}",
            String::from_utf8_lossy(leader.metadata()),
            leader.term()
        ),
        other => failures.push(format!("follower saw {other:?} instead of scheduler 1")),
    }

    // The state only the leader writes, fenced by the term.
    let state = one.resource("scheduler:last-run")?;
    state.set(first.term(), "run by scheduler 1").await?;

    // 3. Resignation hands over at once: no lease has to run out.
    let old_term = first.term();
    first.resign().await?;
    let second = tokio::time::timeout(STEP, waiting).await???;
    println!("scheduler 2 leads in term {}", second.term());
    if second.term() <= old_term {
        failures.push("the new term is not higher".to_owned());
    }
    // The follower may see the vacancy first, then the new leader.
    loop {
        match tokio::time::timeout(STEP, observer.changed()).await?? {
            Some(leader) if leader.term() == second.term() => {
                println!(
                    "follower: {} leads term {}",
                    String::from_utf8_lossy(leader.metadata()),
                    leader.term()
                );
                break;
            }
            Some(other) => {
                failures.push(format!("follower saw an unexpected {other:?}"));
                break;
            }
            None => println!("follower: nobody leads for a moment"),
        }
    }
    two.resource("scheduler:last-run")?
        .set(second.term(), "run by scheduler 2")
        .await?;

    // 4. The old leader, still running somewhere, is refused by the storage.
    match state.set(old_term, "late write by scheduler 1").await {
        Err(Error::StaleToken { .. }) => println!("scheduler 1's late write was refused"),
        other => failures.push(format!(
            "scheduler 1's late write was not refused: {other:?}"
        )),
    }
    second.resign().await?;
    redis.cleanup()?;
    Ok(failures)
}

#[tokio::main]
async fn main() -> ExitCode {
    support::exit_status("leader_election", run().await)
}
