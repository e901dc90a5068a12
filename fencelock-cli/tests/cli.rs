//! The `fencelock` operator tool, end to end: the built binary runs as a subprocess against a
//! throwaway redis-server, while the test holds, waits for and releases locks with the library.

// The core crate's test fixture (a throwaway server and a look at the keys fencelock wrote).
#[path = "../../fencelock/tests/common/fixture.rs"]
mod fixture;

use std::process::Stdio;
use std::time::Duration;

use fencelock::LockClient;
use fencelock_testing::RedisServer;
use fixture::Fixture;
use redis::Commands;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Generous bound for things that happen in milliseconds, so a loaded machine does not fail
/// the test; never an assertion about how long something took.
const PATIENCE: Duration = Duration::from_secs(20);

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    cmd.args(args)
        .env_remove("REDIS_URL")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn finish(child: Child) -> Run {
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("fencelock did not exit")
        .expect("wait for fencelock");
    let run = Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
    };
    // Errors are one clean line: never a panic or a backtrace.
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    assert!(!run.stderr.contains("backtrace"), "{run:?}");
    run
}

/// Runs `fencelock --url URL ARGS...` and collects its output.
async fn fencelock(url: &str, args: &[&str]) -> Run {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    finish(command(&all).spawn().expect("spawn fencelock")).await
}

/// The same with `input` on stdin.
async fn fencelock_with_input(url: &str, args: &[&str], input: &str) -> Run {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    let mut child = command(&all)
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn fencelock");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(input.as_bytes())
        .await
        .expect("write stdin");
    drop(stdin);
    finish(child).await
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A running `watch`, read line by line.
struct Watcher {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Watcher {
    /// Starts `fencelock watch` and waits for its header, after which every change is seen.
    async fn start(url: &str, args: &[&str]) -> (Watcher, String) {
        let mut all = vec!["--url", url, "watch"];
        all.extend_from_slice(args);
        let mut child = command(&all).spawn().expect("spawn fencelock watch");
        let stdout = child.stdout.take().expect("stdout");
        let mut watcher = Watcher {
            child,
            lines: BufReader::new(stdout).lines(),
        };
        let header = watcher.line().await;
        (watcher, header)
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("no line from watch")
            .expect("read watch output")
            .expect("watch closed its output")
    }

    async fn finish(mut self) -> (Run, Vec<String>) {
        let mut rest = Vec::new();
        while let Some(line) = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("watch did not end")
            .expect("read watch output")
        {
            rest.push(line);
        }
        (finish(self.child).await, rest)
    }
}

#[tokio::test]
async fn list_shows_held_locks_as_text_and_json() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let orders = client.lock("orders").unwrap().acquire().await.unwrap();
    let nested = orders.reenter().await.unwrap();
    let payments = client.lock("payments").unwrap().acquire().await.unwrap();

    let text = fencelock(&url, &["list"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines[0].starts_with("orders "), "{text:?}");
    assert!(
        lines[0].contains(&format!("token {}", orders.token())),
        "{text:?}"
    );
    assert!(
        lines[0].contains(&format!("holder {} x2", orders.holder_id())),
        "{text:?}"
    );
    assert!(lines[1].starts_with("payments "), "{text:?}");
    assert!(
        lines[1].contains(&format!("holder {} x1", payments.holder_id())),
        "{text:?}"
    );

    let machine = fencelock(&url, &["list", "--json"]).await;
    assert_eq!(machine.code, 0, "{machine:?}");
    let locks = json(&machine.stdout);
    let locks = locks.as_array().expect("an array");
    assert_eq!(locks.len(), 2);
    assert_eq!(locks[0]["name"], "orders");
    assert_eq!(locks[0]["token"], orders.token().get());
    assert_eq!(locks[0]["holders"][0]["id"], orders.holder_id());
    assert_eq!(locks[0]["holders"][0]["count"], 2);
    let pttl = locks[0]["pttl_ms"].as_u64().expect("a lease");
    assert!(pttl > 0 && pttl <= client.default_lease().as_millis() as u64);
    assert_eq!(locks[1]["name"], "payments");
    assert_eq!(locks[1]["token"], payments.token().get());
    assert_eq!(
        fx.lock_key("orders").map(|k| String::from_utf8(k).unwrap()),
        locks[0]["key"].as_str().map(str::to_owned)
    );

    nested.release().await.unwrap();
    orders.release().await.unwrap();
    payments.release().await.unwrap();
    // Nothing held, but the prefix is in use (fence counters): an empty list, not an error.
    let empty = fencelock(&url, &["list"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(
        empty
            .stdout
            .contains("no lock is held under prefix \"fencelock:\""),
        "{empty:?}"
    );
    let empty = fencelock(&url, &["list", "--json"]).await;
    assert_eq!(json(&empty.stdout), serde_json::json!([]));
}

#[tokio::test]
async fn elections_show_each_leader_as_text_and_json_and_list_leaves_them_out() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let scheduler = client
        .election("scheduler")
        .unwrap()
        .campaign(b"10.0.0.7:8080")
        .await
        .unwrap();
    let binary = client
        .election(b"shard-\xff")
        .unwrap()
        .campaign(b"\xfe\x01")
        .await
        .unwrap();
    // A lock of the same name is a lock, not an election.
    let lock = client.lock("scheduler").unwrap().acquire().await.unwrap();

    let text = fencelock(&url, &["elections"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines[0].starts_with("scheduler "), "{text:?}");
    for part in [
        format!("term {}", scheduler.term()),
        format!("leader {}", scheduler.id()),
        "metadata 10.0.0.7:8080".to_owned(),
        "lease ".to_owned(),
    ] {
        assert!(lines[0].contains(&part), "{part}: {text:?}");
    }
    assert!(
        lines[1].contains(&format!("term {}", binary.term())),
        "{text:?}"
    );

    let machine = fencelock(&url, &["elections", "--json"]).await;
    assert_eq!(machine.code, 0, "{machine:?}");
    let elections = json(&machine.stdout);
    let elections = elections.as_array().expect("an array");
    assert_eq!(elections.len(), 2, "{machine:?}");
    assert_eq!(elections[0]["name"], "scheduler");
    assert_eq!(elections[0]["leader"]["id"], scheduler.id());
    assert_eq!(elections[0]["leader"]["term"], scheduler.term().get());
    assert_eq!(elections[0]["leader"]["metadata"], "10.0.0.7:8080");
    assert!(elections[0]["leader"].get("metadata_hex").is_none());
    let pttl = elections[0]["pttl_ms"].as_u64().expect("a lease");
    assert!(pttl > 0 && pttl <= client.default_lease().as_millis() as u64);
    assert_eq!(elections[1]["name_hex"], "73686172642dff");
    assert_eq!(elections[1]["leader"]["metadata_hex"], "fe01");

    // `list` shows the lock only; `elections` the elections only.
    let locks = fencelock(&url, &["list", "--json"]).await;
    let locks = json(&locks.stdout);
    assert_eq!(locks.as_array().map(Vec::len), Some(1), "{locks}");
    assert_eq!(locks[0]["token"], lock.token().get());

    scheduler.resign().await.unwrap();
    binary.resign().await.unwrap();
    lock.release().await.unwrap();
    let empty = fencelock(&url, &["elections"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(
        empty
            .stdout
            .contains("no election is led under prefix \"fencelock:\""),
        "{empty:?}"
    );
    let empty = fencelock(&url, &["elections", "--json"]).await;
    assert_eq!(json(&empty.stdout), serde_json::json!([]));
}

#[tokio::test]
async fn list_finds_locks_under_another_prefix_and_says_when_a_prefix_has_nothing() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = LockClient::builder(url.clone())
        .prefix("billing:")
        .connect()
        .await
        .unwrap();
    let guard = client.lock("invoice-7").unwrap().acquire().await.unwrap();

    let found = fencelock(&url, &["--prefix", "billing:", "list", "--json"]).await;
    assert_eq!(found.code, 0, "{found:?}");
    assert_eq!(json(&found.stdout)[0]["name"], "invoice-7");
    assert_eq!(json(&found.stdout)[0]["token"], guard.token().get());

    // The default prefix has no key at all: an empty answer (exit 0), with a hint on stderr
    // that the operator most likely typed the wrong prefix.
    let wrong = fencelock(&url, &["list"]).await;
    assert_eq!(wrong.code, 0, "an empty list is an answer: {wrong:?}");
    assert!(
        wrong.stdout.contains("no lock is held under prefix"),
        "{wrong:?}"
    );
    assert_eq!(wrong.stderr.lines().count(), 1, "{wrong:?}");
    assert!(
        wrong
            .stderr
            .contains("no fencelock key at all under prefix \"fencelock:\""),
        "{wrong:?}"
    );
    let wrong = fencelock(&url, &["--prefix", "bill*", "list", "--json"]).await;
    assert_eq!(
        wrong.code, 0,
        "a glob in the prefix is matched literally: {wrong:?}"
    );
    assert_eq!(json(&wrong.stdout), serde_json::json!([]));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn show_gives_holder_token_lease_fence_and_waiters() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let lock = client.lock("orders").unwrap();
    let guard = lock.acquire().await.unwrap();

    let text = fencelock(&url, &["show", "orders"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    assert!(text.stdout.contains("state       held"), "{text:?}");
    assert!(
        text.stdout.contains(&format!(
            "holder      {} (entry count 1)",
            guard.holder_id()
        )),
        "{text:?}"
    );
    assert!(
        text.stdout
            .contains(&format!("token       {}", guard.token())),
        "{text:?}"
    );
    // The only token of its bucket so far: the counter is exactly it, and says it is shared.
    assert!(
        text.stdout
            .contains(&format!("fence       {} at ", guard.token())),
        "{text:?}"
    );
    assert!(
        text.stdout
            .contains("shared by every lock name in that bucket"),
        "{text:?}"
    );
    assert!(text.stdout.contains("waiters     0 subscribed"), "{text:?}");

    // A waiter in another client subscribes to the lock's channel.
    let other = fx.client().await;
    let waiting = tokio::spawn(async move {
        let guard = other.lock("orders").unwrap().acquire().await.unwrap();
        guard.release().await.unwrap();
    });
    let mut detail = Value::Null;
    for _ in 0..200 {
        detail = json(&fencelock(&url, &["show", "orders", "--json"]).await.stdout);
        if detail["subscribers"] == 1 {
            break;
        }
    }
    assert_eq!(detail["subscribers"], 1, "{detail}");
    assert_eq!(detail["held"], true);
    assert_eq!(detail["fence"], guard.token().get());
    assert_eq!(detail["lock"]["holders"][0]["id"], guard.holder_id());
    guard.release().await.unwrap();
    tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap();

    // A free lock is shown as free, with its fence: an answer, exit 0.
    let free = fencelock(&url, &["show", "orders"]).await;
    assert_eq!(free.code, 0, "{free:?}");
    assert!(free.stdout.contains("state       free"), "{free:?}");
    let never = fencelock(&url, &["show", "never-used", "--json"]).await;
    assert_eq!(never.code, 0, "{never:?}");
    assert_eq!(json(&never.stdout)["held"], false);
}

#[tokio::test]
async fn watch_prints_acquisition_reentry_exit_and_release() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let lock = client.lock("orders").unwrap();

    let (mut watch, header) = Watcher::start(&url, &["orders", "--count", "4"]).await;
    assert!(header.starts_with("watching orders "), "{header}");
    assert!(header.ends_with("orders  free"), "{header}");

    let guard = lock.acquire().await.unwrap();
    let holder = guard.holder_id().to_owned();
    let line = watch.line().await;
    assert!(
        line.ends_with(&format!(
            " acquired holder={holder} token={} count=1",
            guard.token()
        )),
        "{line}"
    );
    let nested = guard.reenter().await.unwrap();
    let line = watch.line().await;
    assert!(
        line.ends_with(&format!(" reentered holder={holder} count=2")),
        "{line}"
    );
    nested.release().await.unwrap();
    let line = watch.line().await;
    assert!(
        line.ends_with(&format!(" exited holder={holder} count=1")),
        "{line}"
    );
    let token = guard.token();
    guard.release().await.unwrap();
    let (run, rest) = watch.finish().await;
    assert_eq!(rest.len(), 1, "--count 4 stops after the release: {rest:?}");
    assert!(
        rest[0].ends_with(&format!(" released holder={holder} token={token}")),
        "{rest:?}"
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("watch ended after 4 event(s)"),
        "{run:?}"
    );
}

#[tokio::test]
async fn watch_tells_expiry_and_force_release_apart_and_speaks_json() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let lock = client
        .lock("jobs")
        .unwrap()
        .with_lease(Duration::from_secs(60))
        .unwrap();

    let (mut watch, header) = Watcher::start(&url, &["jobs", "--json", "--count", "4"]).await;
    assert_eq!(json(&header)["event"], "watching");
    assert_eq!(json(&header)["lock"]["holders"], serde_json::json!([]));

    // A hold that ends by its lease (cut short here, as the clock would): no release message,
    // so it is reported as expired.
    let guard = lock.acquire().await.unwrap();
    let acquired = json(&watch.line().await);
    assert_eq!(acquired["event"], "acquired");
    assert_eq!(acquired["token"], guard.token().get());
    assert_eq!(acquired["holder"]["id"], guard.holder_id());
    let _: () = fx.raw().pexpire(fx.lock_key("jobs").unwrap(), 1).unwrap();
    let expired = json(&watch.line().await);
    assert_eq!(expired["event"], "expired", "{expired}");
    assert_eq!(expired["holder"]["id"], guard.holder_id());
    assert_eq!(expired["token"], guard.token().get());
    drop(guard);

    // A hold that an operator ends.
    let guard = client.lock("jobs").unwrap().acquire().await.unwrap();
    assert_eq!(json(&watch.line().await)["event"], "acquired");
    let forced = fencelock(&url, &["release", "jobs", "--force", "--yes"]).await;
    assert_eq!(forced.code, 0, "{forced:?}");
    let line = json(&watch.line().await);
    assert_eq!(line["event"], "force-released", "{line}");
    assert_eq!(line["token"], guard.token().get());
    let (run, rest) = watch.finish().await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn watch_stops_on_ctrl_c_and_after_its_duration() {
    let fx = Fixture::start();
    let url = fx.server.url();

    let (watch, _) = Watcher::start(&url, &["orders"]).await;
    let pid = watch.child.id().expect("running");
    fencelock_testing::send_signal(pid, fencelock_testing::Signal::Int).expect("SIGINT");
    let (run, rest) = watch.finish().await;
    assert_eq!(run.code, 0, "a Ctrl-C ends the watch cleanly: {run:?}");
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        run.stderr.contains("watch ended after 0 event(s)"),
        "{run:?}"
    );

    let (watch, _) = Watcher::start(&url, &["orders", "--for", "200ms"]).await;
    let (run, rest) = watch.finish().await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn force_release_frees_the_lock_wakes_a_waiter_and_fences_off_the_evicted_holder() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let evicted_client = fx.client().await;
    let evicted = evicted_client
        .lock("account:42")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let old_token = evicted.token();
    let balance = evicted_client.resource("balance:42").unwrap();
    balance.set(old_token, "100").await.unwrap();

    // A waiter in another process-like client, parked on the lock's channel.
    let waiter_client = fx.client().await;
    let waiter = tokio::spawn({
        let client = waiter_client.clone();
        async move { client.lock("account:42").unwrap().acquire().await.unwrap() }
    });
    let mut subscribed = false;
    for _ in 0..200 {
        let detail = json(
            &fencelock(&url, &["show", "account:42", "--json"])
                .await
                .stdout,
        );
        if detail["subscribers"] == 1 {
            subscribed = true;
            break;
        }
    }
    assert!(subscribed, "the waiter never subscribed");

    let run = fencelock(&url, &["release", "account:42", "--force", "--yes"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains(&format!(
            "evicted holder {} (count 1, token {old_token})",
            evicted.holder_id()
        )),
        "{run:?}"
    );

    // The waiter gets through on the release message and holds a greater token.
    let new_holder = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap();
    assert!(new_holder.token() > old_token);

    // The evicted holder cannot touch the new holder's lock.
    assert!(evicted
        .extend(Duration::from_secs(30))
        .await
        .unwrap_err()
        .is_not_held());
    assert!(fx.lock_state("account:42").unwrap().0[0].0 == new_holder.holder_id());

    // Storage fencing starts with the new holder's claim: before it, the old token is still
    // accepted (documented: force release does not know the lock's resources)...
    balance.set(old_token, "90").await.unwrap();
    let fresh = waiter_client.resource("balance:42").unwrap();
    assert_eq!(
        fresh.get(new_holder.token()).await.unwrap().as_deref(),
        Some(&b"90"[..])
    );
    // ...after it, the evicted holder's writes are refused.
    let refused = balance.set(old_token, "0").await.unwrap_err();
    assert!(refused.is_stale_token(), "{refused:?}");
    assert_eq!(fresh.peek().await.unwrap().as_deref(), Some(&b"90"[..]));
    new_holder.release().await.unwrap();
    drop(evicted);
}

#[tokio::test]
async fn force_release_without_waiters_leaves_the_lock_free_and_the_next_token_greater() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let lock = client.lock("orders").unwrap();
    let guard = lock.acquire().await.unwrap();
    let old = guard.token();
    // The fence counter was lost (an operator's DEL): the force release puts the evicted token
    // back, so the next token is above it whatever the clock says.
    let fence_key = {
        let key = fx.lock_key("orders").unwrap();
        let close = key.iter().position(|b| *b == b'}').unwrap();
        [&key[..=close], b"fence"].concat()
    };
    let _: () = fx.raw().del(&fence_key).unwrap();

    let run = fencelock(&url, &["release", "orders", "--force", "--yes", "--json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let outcome = json(&run.stdout);
    assert_eq!(outcome["released"], true);
    assert_eq!(outcome["token"], old.get());
    assert_eq!(outcome["fence"], old.get());
    let counter: u64 = fx.raw().get(&fence_key).unwrap();
    assert_eq!(counter, old.get());
    assert_eq!(fx.lock_state("orders"), None, "the lock is free");

    let again = fencelock(&url, &["release", "orders", "--force", "--yes"]).await;
    assert_eq!(again.code, 4, "{again:?}");
    assert!(again.stderr.contains("is not held"), "{again:?}");

    let next = lock.try_acquire().await.unwrap().expect("free");
    assert!(next.token() > old);
    assert!(guard.release().await.unwrap_err().is_not_held());
    next.release().await.unwrap();
}

#[tokio::test]
async fn release_asks_first_and_an_answer_of_no_changes_nothing() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let guard = client.lock("orders").unwrap().acquire().await.unwrap();
    let before = fx.lock_state("orders");

    let run = fencelock_with_input(&url, &["release", "orders", "--force"], "n\n").await;
    assert_eq!(run.code, 6, "{run:?}");
    assert!(run.stderr.contains("[y/N]"), "{run:?}");
    assert!(run.stderr.contains("lock orders not released"), "{run:?}");
    assert_eq!(fx.lock_state("orders"), before);

    // No answer at all (stdin closed) is a no as well.
    let run = fencelock(&url, &["release", "orders", "--force"]).await;
    assert_eq!(run.code, 6, "{run:?}");
    assert_eq!(fx.lock_state("orders"), before);

    // Without --force it is a usage error: an operator never holds the lock.
    let run = fencelock(&url, &["release", "orders"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--force"), "{run:?}");

    // A token that is not the current one (the lock changed hands since it was looked at).
    let stale = (guard.token().get() - 1).to_string();
    let run = fencelock(
        &url,
        &["release", "orders", "--force", "--yes", "--token", &stale],
    )
    .await;
    assert_eq!(run.code, 6, "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("held with token {}, not {stale}", guard.token())),
        "{run:?}"
    );
    assert_eq!(fx.lock_state("orders"), before);

    let current = guard.token().to_string();
    let run = fencelock_with_input(
        &url,
        &["release", "orders", "--force", "--token", &current],
        "y\n",
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(fx.lock_state("orders"), None);
    assert!(guard.release().await.unwrap_err().is_not_held());
}

#[tokio::test]
async fn doctor_on_a_default_test_server_warns_about_persistence_only() {
    let fx = Fixture::start();
    // No persistence weakens a guarantee (WARN) but breaks no lock: `doctor && deploy` passes.
    let run = fencelock(&fx.server.url(), &["doctor", "--pings", "5"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let strict = fencelock(&fx.server.url(), &["doctor", "--pings", "5", "--strict"]).await;
    assert_eq!(strict.code, 1, "--strict fails on a WARN: {strict:?}");
    for name in [
        "version",
        "protocol",
        "maxmemory-policy",
        "persistence",
        "replication",
        "cluster",
        "latency",
        "clock",
    ] {
        assert!(
            run.stdout
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(name)),
            "no {name} check: {run:?}"
        );
    }
    assert!(run.stdout.contains("WARN persistence"), "{run:?}");
    assert!(
        run.stdout.contains("fix: CONFIG SET appendonly yes"),
        "{run:?}"
    );
    assert!(run.stdout.contains("OK   maxmemory-policy"), "{run:?}");
    assert!(run.stdout.contains("OK   replication"), "{run:?}");
    assert!(run.stdout.contains("over 5 PINGs"), "{run:?}");
    assert!(run.stdout.ends_with("overall: WARN\n"), "{run:?}");
}

/// The doctor's verdicts by check name, from `--json`.
fn verdicts(run: &Run) -> std::collections::HashMap<String, String> {
    json(&run.stdout)["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn doctor_warns_about_an_eviction_policy_that_picks_held_locks() {
    let server = RedisServer::builder()
        .persistence(true)
        .config("maxmemory-policy", "volatile-lru")
        .start()
        .unwrap();
    let run = fencelock(&server.url(), &["doctor"]).await;
    assert_eq!(run.code, 0, "a WARN alone passes: {run:?}");
    assert!(
        run.stdout
            .contains("WARN maxmemory-policy volatile-lru evicts keys with a TTL"),
        "{run:?}"
    );
    assert!(
        run.stdout
            .contains("fix: CONFIG SET maxmemory-policy noeviction"),
        "{run:?}"
    );
    assert!(run.stdout.contains("OK   persistence"), "{run:?}");

    let machine = fencelock(&server.url(), &["doctor", "--json", "--strict"]).await;
    assert_eq!(machine.code, 1, "{machine:?}");
    let verdicts = verdicts(&machine);
    assert_eq!(verdicts["maxmemory-policy"], "WARN");
    assert_eq!(verdicts["persistence"], "OK");
    assert_eq!(json(&machine.stdout)["status"], "WARN");
}

#[tokio::test]
async fn doctor_passes_a_well_configured_server_and_fails_a_replica() {
    let primary = RedisServer::builder().persistence(true).start().unwrap();
    let run = fencelock(&primary.url(), &["doctor", "--json"]).await;
    let verdicts_primary = verdicts(&run);
    for (name, status) in &verdicts_primary {
        // Latency is the machine's business; everything else is configuration.
        if name != "latency" {
            assert_eq!(status, "OK", "{name}: {run:?}");
        }
    }
    assert_eq!(run.code, 0, "{run:?}");

    let replica = RedisServer::builder()
        .persistence(true)
        .replica_of(primary.addr())
        .start()
        .unwrap();
    let run = fencelock(&replica.url(), &["doctor"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stdout.contains("FAIL replication"), "{run:?}");
    assert!(run.stdout.contains("is a replica of 127.0.0.1:"), "{run:?}");
    assert!(run.stdout.ends_with("overall: FAIL\n"), "{run:?}");

    // With the replica attached the primary warns about asynchronous replication.
    let mut attached = false;
    for _ in 0..200 {
        let run = fencelock(&primary.url(), &["doctor", "--json"]).await;
        if verdicts(&run)["replication"] == "WARN" {
            attached = true;
            assert!(run.stdout.contains("min-replicas-to-write 1"), "{run:?}");
            break;
        }
    }
    assert!(attached, "the primary never reported its replica");
}

#[tokio::test]
async fn an_unreachable_server_is_one_line_and_exit_code_3() {
    let mut server = RedisServer::start().unwrap();
    // The harness keeps the port reserved while the server is stopped: nothing listens there.
    server.stop().unwrap();
    for args in [&["list"][..], &["doctor"], &["show", "x"], &["watch", "x"]] {
        let run = fencelock(&server.url(), args).await;
        assert_eq!(run.code, 3, "{args:?}: {run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
        assert!(
            run.stderr.starts_with(&format!(
                "fencelock: cannot reach redis at {}",
                server.url()
            )),
            "{run:?}"
        );
        // The address it tried, as the library's error names it.
        let tried = format!("connecting to 127.0.0.1:{}: ", server.port());
        assert!(run.stderr.contains(&tried), "{run:?}");
        assert_eq!(run.stdout, "");
    }
}

#[tokio::test]
async fn bad_credentials_are_reported_without_the_password() {
    let server = RedisServer::builder().password("s3cret").start().unwrap();
    let wrong = format!("redis://:wrong-pass@127.0.0.1:{}/", server.port());
    let run = fencelock(&wrong, &["list"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(run.stderr.contains("refused the credentials"), "{run:?}");
    assert!(!run.stderr.contains("wrong-pass"), "{run:?}");

    let none = format!("redis://127.0.0.1:{}/", server.port());
    let run = fencelock(&none, &["doctor"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains("refused the credentials"), "{run:?}");

    let run = fencelock(&server.url(), &["list"]).await;
    assert_eq!(run.code, 0, "the right password gets in: {run:?}");
}

/// A user whose ACL does not cover the prefix is told which prefix and which rule to add.
#[tokio::test]
async fn a_refused_prefix_names_the_prefix_and_the_acl_rule() {
    let server = RedisServer::builder()
        .acl_lines([
            "user default off",
            "user admin on >admin-pw ~* &* +@all",
            "user other on >other-pw resetchannels ~other:* &other:* +@all",
        ])
        .credentials("admin", "admin-pw")
        .start()
        .unwrap();
    let url = format!("redis://other:other-pw@127.0.0.1:{}/", server.port());
    let run = fencelock(&url, &["--prefix", "billing:", "show", "invoice-7"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(run.stderr.contains("prefix \"billing:\""), "{run:?}");
    assert!(run.stderr.contains("~billing:* &billing:*"), "{run:?}");
    assert!(!run.stderr.contains("other-pw"), "{run:?}");
}

#[tokio::test]
async fn bad_input_is_a_usage_error() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let run = fencelock(&url, &["show", ""]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        run.stderr,
        "fencelock: invalid lock name: a lock name must not be empty\n"
    );
    let long = "n".repeat(fencelock::MAX_NAME_LEN + 1);
    let run = fencelock(&url, &["release", &long, "--force", "--yes"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("invalid lock name"), "{run:?}");

    let run = fencelock(&url, &["--prefix", "a{b", "list"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("must not contain '{'"), "{run:?}");

    // A URL that does not parse says what is wrong with it and what is accepted.
    for (bad, problem) in [
        ("not a url", "no scheme"),
        ("http://127.0.0.1:7000/", "unknown scheme"),
        ("redis://127.0.0.1:99999/", "port \"99999\""),
    ] {
        let run = fencelock(bad, &["list"]).await;
        assert_eq!(run.code, 2, "{run:?}");
        assert!(run.stderr.contains("bad redis URL"), "{run:?}");
        assert!(run.stderr.contains(problem), "{bad}: {run:?}");
        assert!(
            run.stderr.contains("redis://[user:password@]host"),
            "{run:?}"
        );
    }

    let run = finish(command(&["list"]).spawn().unwrap()).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("REDIS_URL"), "{run:?}");

    let run = fencelock(&url, &["watch", "x", "--for", "soon"]).await;
    assert_eq!(run.code, 2, "{run:?}");

    let help = finish(command(&["--help"]).spawn().unwrap()).await;
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("Exit codes:"), "{help:?}");
    assert!(
        help.stdout.contains("4  release: the lock is not held"),
        "{help:?}"
    );
    assert!(help.stdout.contains("--strict"), "{help:?}");
}

#[tokio::test]
async fn the_url_can_come_from_redis_url_and_foreign_data_is_reported() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let guard = client.lock("orders").unwrap().acquire().await.unwrap();
    let run = finish(
        command(&["list", "--json"])
            .env("REDIS_URL", fx.server.url())
            .spawn()
            .unwrap(),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(json(&run.stdout)[0]["token"], guard.token().get());

    // Someone SETs a string where a lock lives: a clear error, nothing changed.
    let key = fx.lock_key("orders").unwrap();
    guard.release().await.unwrap();
    let _: () = fx.raw().set(&key, "not a lock").unwrap();
    let run = fencelock(&fx.server.url(), &["show", "orders"]).await;
    assert_eq!(run.code, 7, "{run:?}");
    assert!(run.stderr.contains("foreign data"), "{run:?}");
    let run = fencelock(&fx.server.url(), &["release", "orders", "--force", "--yes"]).await;
    assert_eq!(run.code, 7, "{run:?}");
    let value: String = fx.raw().get(&key).unwrap();
    assert_eq!(value, "not a lock");
}

#[tokio::test]
async fn watch_reports_a_hold_it_never_saw_from_its_release_message() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    // With an hour between polls, the only read is the one the release message triggers, and
    // it finds the lock free again: the hold itself was never seen.
    let (watch, _) = Watcher::start(&url, &["orders", "--interval", "1h", "--count", "1"]).await;
    let guard = client.lock("orders").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    let (run, rest) = watch.finish().await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert!(
        rest[0].ends_with(" released holder=? (a hold shorter than one poll interval)"),
        "{rest:?}"
    );
}

#[tokio::test]
async fn binary_names_are_escaped_in_text_and_given_in_hex_in_json() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let guard = client.lock(b"\xffbin\n").unwrap().acquire().await.unwrap();
    let text = fencelock(&url, &["list"]).await;
    assert!(text.stdout.starts_with("\\xffbin\\n  token "), "{text:?}");
    let machine = fencelock(&url, &["list", "--json"]).await;
    assert_eq!(json(&machine.stdout)[0]["name_hex"], "ff62696e0a");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn doctor_says_which_checks_a_restricted_user_could_not_run() {
    // A typical application user: everything but CONFIG.
    let server = RedisServer::builder()
        .persistence(true)
        .acl_lines([
            "user default off",
            "user app on >secret ~* &* +@all -config",
        ])
        .credentials("app", "secret")
        .start()
        .unwrap();
    let run = fencelock(&server.url(), &["doctor", "--json"]).await;
    assert_eq!(
        run.code, 0,
        "unchecked settings are WARNs, not FAILs: {run:?}"
    );
    let doc = json(&run.stdout);
    let checks = doc["checks"].as_array().unwrap();
    let eviction = checks
        .iter()
        .find(|c| c["name"] == "maxmemory-policy")
        .unwrap();
    assert_eq!(eviction["status"], "WARN");
    assert!(
        eviction["finding"]
            .as_str()
            .unwrap()
            .starts_with("could not be checked: "),
        "{eviction}"
    );
    // The checks that need no CONFIG still ran.
    let verdicts = verdicts(&run);
    assert_eq!(verdicts["version"], "OK");
    assert_eq!(verdicts["cluster"], "OK");
}

#[tokio::test]
async fn a_server_without_hello_is_diagnosed_instead_of_refused() {
    // What Redis 5 answers to HELLO, on the Redis we have.
    let server = RedisServer::builder()
        .persistence(true)
        .config("rename-command", "HELLO \"\"")
        .start()
        .unwrap();
    let run = fencelock(&server.url(), &["doctor"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stdout
            .contains("FAIL protocol         the server refused HELLO 3"),
        "{run:?}"
    );
    let run = fencelock(&server.url(), &["list"]).await;
    assert_eq!(run.code, 0, "inspection still works over RESP2: {run:?}");
    let run = fencelock(&server.url(), &["watch", "orders"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("watch needs RESP3"), "{run:?}");
}

#[tokio::test]
async fn doctor_on_a_cluster_node_warns_that_clients_need_the_cluster_builder() {
    let cluster = fencelock_testing::RedisCluster::builder()
        .replicas_per_primary(0)
        .start()
        .unwrap();
    let url = cluster.urls().remove(0);
    let run = fencelock(&url, &["doctor", "--json"]).await;
    let verdicts = verdicts(&run);
    assert_eq!(verdicts["cluster"], "WARN", "{run:?}");
    assert!(run.stdout.contains("cluster_builder"), "{run:?}");
    assert_eq!(run.code, 0, "a WARN alone passes: {run:?}");
    let strict = fencelock(&url, &["doctor", "--strict"]).await;
    assert_eq!(strict.code, 1, "{strict:?}");
}

#[tokio::test]
async fn jobs_show_the_last_tick_of_each_job_as_text_and_json() {
    use std::time::{Duration, UNIX_EPOCH};
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let options = fencelock::JobOptions::new(Duration::from_secs(60), Duration::from_secs(30));
    let empty = fencelock(&url, &["jobs"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stdout.contains("no scheduled job"), "{empty:?}");

    let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let report = client.job("report", options.clone()).unwrap();
    let token = report
        .run_exclusive(tick, |run| async move { run.token() })
        .await
        .unwrap()
        .into_output()
        .unwrap();
    // A job whose runner is still at it.
    let (began_tx, began_rx) = tokio::sync::oneshot::channel();
    let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
    let busy = client.job(b"busy-\xff", options).unwrap();
    let running = tokio::spawn(async move {
        busy.run_exclusive(tick, |run| async move {
            began_tx.send(run.token()).unwrap();
            end_rx.await.unwrap();
        })
        .await
        .unwrap()
    });
    let busy_token = began_rx.await.unwrap();

    let text = fencelock(&url, &["jobs"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines[0].starts_with("busy-"), "{text:?}");
    assert!(lines[0].contains("running"), "{text:?}");
    assert!(lines[1].starts_with("report "), "{text:?}");
    for part in [
        "tick 1800000000000",
        "done",
        &format!("token {token}"),
        "kept ",
    ] {
        assert!(lines[1].contains(part), "{part}: {text:?}");
    }

    let machine = fencelock(&url, &["jobs", "--json"]).await;
    let jobs = json(&machine.stdout);
    assert_eq!(jobs[0]["name_hex"], "627573792dff");
    assert_eq!(jobs[0]["state"], "running");
    assert_eq!(jobs[0]["token"], busy_token.get());
    assert_eq!(jobs[0]["finished_ms"], serde_json::Value::Null);
    assert_eq!(jobs[1]["name"], "report");
    assert_eq!(jobs[1]["state"], "done");
    assert_eq!(jobs[1]["tick_ms"], 1_800_000_000_000_u64);
    assert_eq!(jobs[1]["token"], token.get());
    assert_eq!(jobs[1]["runner_holds"], false);
    assert!(jobs[1]["retained_ms"].as_u64().unwrap() <= 120_000);

    end_tx.send(()).unwrap();
    assert!(running.await.unwrap().ran());
    // Jobs are not locks: `list` shows none of them.
    let locks = json(&fencelock(&url, &["list", "--json"]).await.stdout);
    assert_eq!(locks.as_array().map(Vec::len), Some(0), "{locks}");
}

#[tokio::test]
async fn elections_show_their_candidates_queued_and_subscribed() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let fair = |_| async {
        LockClient::builder(fx.server.url())
            .fair_handoff(Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
    };
    let (leading, waiting) = (fair(()).await, fair(()).await);
    let leader = leading
        .election("fair")
        .unwrap()
        .campaign(b"a")
        .await
        .unwrap();
    let election = waiting.election("fair").unwrap();
    let candidate = tokio::spawn(async move { election.campaign(b"b").await.unwrap() });
    // The waiting candidate queues its client and subscribes to the election's channel.
    let mut listed = Value::Null;
    for _ in 0..200 {
        listed = json(&fencelock(&url, &["elections", "--json"]).await.stdout);
        if listed[0]["queued_candidates"]
            .as_array()
            .is_some_and(|q| !q.is_empty())
            && listed[0]["subscribers"].as_u64() == Some(1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(listed[0]["queued_candidates"][0], waiting.id(), "{listed}");
    assert_eq!(listed[0]["subscribers"], 1, "{listed}");
    let text = fencelock(&url, &["elections"]).await.stdout;
    assert!(text.contains(&format!("queued {}", waiting.id())), "{text}");
    assert!(text.contains("subscribed connections 1"), "{text}");

    leader.resign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), candidate)
        .await
        .expect("the queued candidate leads")
        .unwrap();
    let listed = json(&fencelock(&url, &["elections", "--json"]).await.stdout);
    assert_eq!(listed[0]["leader"]["id"], next.id(), "{listed}");
    assert_eq!(
        listed[0]["queued_candidates"],
        serde_json::json!([]),
        "{listed}"
    );
    next.resign().await.unwrap();
}

#[tokio::test]
async fn semaphores_and_rwlocks_are_listed_and_a_stuck_hold_released() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let empty = fencelock(&url, &["semaphores"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stdout.contains("no semaphore"), "{empty:?}");
    let empty = fencelock(&url, &["rwlocks"]).await;
    assert!(empty.stdout.contains("no read-write lock"), "{empty:?}");

    let pool = client.semaphore("pool", 3).unwrap();
    let two = pool.acquire(2).await.unwrap();
    let one = pool.acquire(1).await.unwrap();
    let catalogue = client.rwlock("catalogue").unwrap();
    let read = catalogue.read().await.unwrap();
    let waiting = tokio::spawn({
        let catalogue = catalogue.clone();
        async move { catalogue.write().await.unwrap() }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let text = fencelock(&url, &["semaphores"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.starts_with("pool  3 of 3 permits in use"),
        "{text:?}"
    );
    assert!(text.stdout.contains(two.holder_id()) && text.stdout.contains(one.holder_id()));
    let json = fencelock(&url, &["--json", "semaphores"]).await;
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value[0]["limit"], 3);
    assert_eq!(value[0]["used"], 3);
    assert_eq!(value[0]["holds"].as_array().unwrap().len(), 2);

    let json = fencelock(&url, &["--json", "rwlocks"]).await;
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value[0]["name"], "catalogue");
    assert_eq!(value[0]["readers"][0]["holder"], read.holder_id());
    assert_eq!(value[0]["readers"][0]["token"], read.token().get());
    assert!(value[0]["writer"].is_null());
    assert_eq!(value[0]["waiting_writers"].as_array().unwrap().len(), 1);

    // The stuck reader is released by the operator; the waiting writer gets the lock.
    let released = fencelock(
        &url,
        &[
            "release",
            "catalogue",
            "--force",
            "--rwlock",
            "--holder",
            read.holder_id(),
            "--yes",
        ],
    )
    .await;
    assert_eq!(released.code, 0, "{released:?}");
    let write = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the writer after the operator's release")
        .unwrap();
    assert!(read.release().await.unwrap_err().is_not_held());
    let again = fencelock(
        &url,
        &[
            "release",
            "catalogue",
            "--force",
            "--rwlock",
            "--holder",
            "nobody:1",
            "--yes",
        ],
    )
    .await;
    assert_ne!(again.code, 0, "{again:?}");
    // A permit holder too, after a confirmation on stdin.
    let refused = fencelock_with_input(
        &url,
        &[
            "release",
            "pool",
            "--force",
            "--semaphore",
            "--holder",
            one.holder_id(),
        ],
        "n\n",
    )
    .await;
    assert_ne!(refused.code, 0, "{refused:?}");
    let released = fencelock_with_input(
        &url,
        &[
            "release",
            "pool",
            "--force",
            "--semaphore",
            "--holder",
            one.holder_id(),
        ],
        "y\n",
    )
    .await;
    assert_eq!(released.code, 0, "{released:?}");
    assert!(pool
        .try_acquire(1)
        .await
        .unwrap()
        .is_some_and(|p| p.permits() == 1));
    assert!(one.release().await.unwrap_err().is_not_held());
    two.release().await.unwrap();
    write.release().await.unwrap();
}

#[tokio::test]
async fn set_limit_changes_a_semaphore_in_use_and_refuses_an_idle_one() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let idle = fencelock(&url, &["set-limit", "pool", "5"]).await;
    assert_ne!(idle.code, 0, "{idle:?}");
    assert!(idle.stderr.contains("not in use"), "{idle:?}");
    let pool = client.semaphore("pool", 2).unwrap();
    let held = pool.acquire(2).await.unwrap();
    let waiter = tokio::spawn({
        let pool = client.semaphore("pool", 2).unwrap();
        async move { pool.acquire(1).await.unwrap() }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let set = fencelock(&url, &["set-limit", "pool", "3"]).await;
    assert_eq!(set.code, 0, "{set:?}");
    assert!(set.stdout.contains("limit 3 (was 2)"), "{set:?}");
    let permit = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
        .await
        .expect("the raised limit lets the waiter in")
        .unwrap();
    assert_eq!(permit.limit(), 3);
    let zero = fencelock(&url, &["set-limit", "pool", "0"]).await;
    assert_ne!(zero.code, 0, "{zero:?}");
    permit.release().await.unwrap();
    held.release().await.unwrap();
}

/// `show NAME --semaphore` / `--rwlock` shows one semaphore or read-write lock as the lists
/// show each, with the way it keeps its deadlines; one not in use is exit 4 (not found).
#[tokio::test]
async fn one_semaphore_or_read_write_lock_is_shown_with_how_it_keeps_deadlines() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let expiry = match client.hold_expiry() {
        fencelock::HoldExpiry::FieldExpiry => "field_expiry",
        _ => "lease_zset",
    };
    let pool = client.semaphore("pool", 3).unwrap();
    let permit = pool.acquire(2).await.unwrap();
    let text = fencelock(&url, &["show", "pool", "--semaphore"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout
            .starts_with("pool  2 of 3 permits in use  (deadlines "),
        "{text:?}"
    );
    assert!(text.stdout.contains(permit.holder_id()), "{text:?}");
    let json = fencelock(&url, &["--json", "show", "pool", "--semaphore"]).await;
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["used"], 2);
    assert_eq!(value["holds"][0]["token"], permit.token().get());
    assert_eq!(value["expiry"], expiry);

    let doc = client.rwlock("doc").unwrap();
    let write = doc.write().await.unwrap();
    let json = fencelock(&url, &["--json", "show", "doc", "--rwlock"]).await;
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["writer"]["holder"], write.holder_id());
    assert_eq!(value["readers"].as_array().unwrap().len(), 0);
    assert_eq!(value["expiry"], expiry);

    for kind in ["--semaphore", "--rwlock"] {
        let missing = fencelock(&url, &["show", "nothing", kind]).await;
        assert_eq!(missing.code, 4, "{kind}: {missing:?}");
        assert!(missing.stderr.contains("not in use"), "{kind}: {missing:?}");
    }
    let both = fencelock(&url, &["show", "pool", "--semaphore", "--rwlock"]).await;
    assert_eq!(both.code, 2, "{both:?}");
    permit.release().await.unwrap();
    write.release().await.unwrap();
}
