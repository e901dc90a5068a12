//! Jobs, elections' candidates, semaphores and read-write locks: listing, showing, repairing.

use super::*;

#[tokio::test]
async fn jobs_show_the_last_tick_of_each_job_as_text_and_json() {
    use std::time::{Duration, UNIX_EPOCH};
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let options = fencelock::JobOptions::new(Duration::from_secs(60), Duration::from_secs(30));
    let empty = fencelock(&url, &["jobs"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    let nothing = "no scheduled job has a tick record under prefix \"fencelock:\": none has run \
                   there, or the records of those that ran have expired";
    assert!(empty.stdout.starts_with(nothing), "{empty:?}");

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
        "tick 2027-01-15 08:00:00.000 UTC  done",
        &format!("token {token}"),
        "kept ",
    ] {
        assert!(lines[1].contains(part), "{part}: {text:?}");
    }
    // The run's end is a time too, never milliseconds since the epoch.
    let finished = lines[1].split("(finished ").nth(1).unwrap_or("");
    assert!(
        finished.starts_with("20") && finished.contains(" UTC)"),
        "{text:?}"
    );

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

    // Once the records expire (here at once), nothing says whether the jobs ever ran: the
    // listing says so rather than that none has run.
    let mut raw = fx.raw();
    for record in fx.keys("fencelock:{*}job-tick:*") {
        let _: () = raw.pexpire(record, 1).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = fencelock(&url, &["jobs"]).await;
    assert_eq!(expired.code, 0, "{expired:?}");
    assert!(expired.stdout.starts_with(nothing), "{expired:?}");
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
    let two = pool
        .with_label("export-7731")
        .unwrap()
        .acquire(2)
        .await
        .unwrap();
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
    // The labelled hold's line ends with its label; the other shows none.
    let line = |holder: &str| text.stdout.lines().find(|l| l.contains(holder)).unwrap();
    assert!(
        line(two.holder_id()).ends_with("  label export-7731"),
        "{text:?}"
    );
    assert!(!line(one.holder_id()).contains("label"), "{text:?}");
    let json = fencelock(&url, &["--json", "semaphores"]).await;
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value[0]["limit"], 3);
    assert_eq!(value[0]["used"], 3);
    let holds = value[0]["holds"].as_array().unwrap();
    assert_eq!(holds.len(), 2);
    let label = |holder: &str| &holds.iter().find(|h| h["holder"] == holder).unwrap()["label"];
    assert_eq!(label(two.holder_id()), "export-7731");
    assert!(label(one.holder_id()).is_null());

    // A reader is a reader: no permit count on its line (JSON keeps `permits`).
    let text = fencelock(&url, &["rwlocks"]).await;
    let reader = format!(
        "\n  reader {}  token {}  held ",
        read.holder_id(),
        read.token()
    );
    assert!(text.stdout.contains(&reader), "{text:?}");
    assert!(!text.stdout.contains("permits"), "{text:?}");
    let json = fencelock(&url, &["--json", "rwlocks"]).await;
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value[0]["name"], "catalogue");
    assert_eq!(value[0]["readers"][0]["permits"], 1);
    assert_eq!(value[0]["readers"][0]["holder"], read.holder_id());
    assert_eq!(value[0]["readers"][0]["token"], read.token().get());
    assert!(value[0]["readers"][0]["label"].is_null());
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
/// show each (a hold's label included), with the way it keeps its deadlines; one not in use is
/// exit 4 (not found).
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
    let write = doc.with_label("rebuild:5").unwrap().write().await.unwrap();
    let text = fencelock(&url, &["show", "doc", "--rwlock"]).await;
    let writer = format!("writer {}  token ", write.holder_id());
    let line = text.stdout.lines().find(|l| l.contains(&writer));
    assert!(line.unwrap().ends_with("  label rebuild:5"), "{text:?}");
    assert!(!text.stdout.contains("permits"), "{text:?}");
    let json = fencelock(&url, &["--json", "show", "doc", "--rwlock"]).await;
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["writer"]["holder"], write.holder_id());
    assert_eq!(value["writer"]["label"], "rebuild:5");
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
