//! Watching one lock: acquisitions, re-entries, releases, expiries, force releases, stopping.

use super::*;

#[tokio::test]
async fn watch_prints_acquisition_reentry_exit_and_release() {
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let lock = client.lock("orders").unwrap();

    let (mut watch, header) = Watcher::start(&url, &["orders", "--count", "4"]).await;
    assert!(header.starts_with("watching orders "), "{header}");
    assert!(header.contains(" (polling every 100ms): "), "{header}");
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
