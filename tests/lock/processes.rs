//! Mutual exclusion and token order across OS processes: this test binary re-runs itself as
//! several child processes that compete for one lock against one redis-server.

use std::process::Command;
use std::time::Duration;

use crate::common::deadline::HANDOFF;
use crate::common::Fixture;
use fencelock::LockClient;
use redis::Commands;

const CHILD_ENV: &str = "FENCELOCK_TEST_CHILD_URL";
const CHILDREN: usize = 4;
const ROUNDS: usize = 50;

/// The child's work; a no-op unless the parent started this binary as a child.
#[tokio::test]
async fn child_competes_for_the_lock() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let client = LockClient::connect(&url).await.unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    let lock = client.lock("shared").unwrap();
    for _ in 0..ROUNDS {
        // Sections last 200 µs: a wait of seconds is a release that woke nobody (or a
        // deadlock), never contention.
        let guard = lock.acquire_timeout(HANDOFF).await.unwrap_or_else(|err| {
            panic!(
                "not granted within {HANDOFF:?} while the other processes hold the lock for \
                 200 µs at a time (a missing wake-up: a release that woke nobody; or a \
                 deadlock): {err}"
            )
        });
        // Inside the critical section: count who else is inside, and log our token in the
        // order the lock was granted.
        let inside: i64 = raw.incr("inside", 1).unwrap();
        let _: () = raw.rpush("tokens", guard.token().get()).unwrap();
        if inside != 1 {
            let _: () = raw.incr("violations", 1).unwrap();
        }
        std::thread::sleep(Duration::from_micros(200));
        let _: i64 = raw.decr("inside", 1).unwrap();
        guard.release().await.unwrap();
    }
}

#[test]
fn processes_exclude_each_other_and_tokens_follow_the_grant_order() {
    let fx = Fixture::start();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    &crate::common::child::test_path(module_path!(), "child_competes_for_the_lock"),
                    "--nocapture",
                ])
                .env(CHILD_ENV, fx.server.url())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    let mut raw = fx.raw();
    let violations: Option<i64> = raw.get("violations").unwrap();
    assert_eq!(violations, None, "two processes were inside at once");
    let tokens: Vec<u64> = raw.lrange("tokens", 0, -1).unwrap();
    assert_eq!(tokens.len(), CHILDREN * ROUNDS);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of grant order"
    );
    assert!(fx.lock_key("shared").is_none());
}
