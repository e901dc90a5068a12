//! Long holds: who holds each lock (client name, label), how long it has been held (from its
//! token, not its lease), listing only the holds older than a bound, and the doctor failing on
//! them.

use super::*;

#[tokio::test]
async fn long_holds_are_shown_listed_and_failed_by_the_doctor() {
    let fx = Fixture::start();
    let url = fx.server.url();
    // A short lease the watchdog keeps renewing: a held time read off the lease would stay
    // under 2 s however long the lock is held.
    let client = LockClient::builder(&url)
        .default_lease(Duration::from_secs(2))
        .client_name("checkout-7f9c")
        .connect()
        .await
        .unwrap();
    let sent = std::time::Instant::now();
    let stuck = client
        .lock("stuck")
        .unwrap()
        .with_label("order-8812")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;

    let admin = fencelock::admin::Admin::connect(&url).await.unwrap();
    let lock = admin.lock("stuck").await.unwrap().lock;
    let (held, truth) = (lock.held_for.unwrap(), sent.elapsed());
    let off = held.abs_diff(truth);
    assert!(
        off <= Duration::from_secs(1),
        "held {held:?}, truly {truth:?}"
    );

    // "fresh" is taken just before each command that must not count it: "stuck" is 6 s old
    // by then, and the 4 s threshold leaves seconds of margin on both sides for a loaded
    // machine between two commands.
    let fresh = client.lock("fresh").unwrap().acquire().await.unwrap();
    let long = fencelock(&url, &["list", "--held-longer", "4s"]).await;
    assert_eq!(long.code, 0, "{long:?}");
    let lines: Vec<&str> = long.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{long:?}");
    assert!(
        lines[0].starts_with("stuck ") && lines[0].contains(" held "),
        "{long:?}"
    );
    // Who: the client's name after its holder id, and the acquisition's label.
    assert!(
        lines[0].contains("  client checkout-7f9c") && lines[0].ends_with("  label order-8812"),
        "{long:?}"
    );
    let all = json(&fencelock(&url, &["list", "--json"]).await.stdout);
    assert_eq!(all.as_array().map(Vec::len), Some(2), "{all}");
    // Durations read in the units that fit: 25 hours is a day and an hour.
    let none = fencelock(&url, &["list", "--held-longer", "25h"]).await;
    assert!(
        none.stdout.contains("no lock is held longer than 1d1h "),
        "{none:?}"
    );

    let plain = fencelock(&url, &["doctor", "--pings", "1"]).await;
    assert_eq!(plain.code, 0, "{plain:?}");
    let relaxed = fencelock(&url, &["doctor", "--pings", "1", "--max-hold", "90m"]).await;
    assert_eq!(relaxed.code, 0, "{relaxed:?}");
    assert!(
        relaxed.stdout.contains("no hold is older than 1h30m"),
        "{relaxed:?}"
    );
    fresh.release().await.unwrap();
    let fresh = client.lock("fresh").unwrap().acquire().await.unwrap();
    let strict = fencelock(&url, &["doctor", "--pings", "1", "--max-hold", "4s"]).await;
    assert_eq!(strict.code, 5, "{strict:?}");
    // The stuck hold named as `list` names it: holder id, client name, label.
    let stuck_by = format!(
        "1 hold(s) older than 4.000s: lock stuck held by {} (client checkout-7f9c, label \
         order-8812) for ",
        stuck.holder_id()
    );
    assert!(strict.stdout.contains(&stuck_by), "{strict:?}");
    assert!(!strict.stdout.contains("fresh"), "{strict:?}");

    // Kept for 10 s by the watchdog: at least 10 s held, while the lease stays short.
    let wait = Duration::from_secs(10).saturating_sub(sent.elapsed());
    tokio::time::sleep(wait).await;
    let locks = json(&fencelock(&url, &["list", "--json"]).await.stdout);
    let stuck_json = locks
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "stuck")
        .unwrap()
        .clone();
    assert!(
        stuck_json["held_ms"].as_u64().unwrap() >= 10_000,
        "{stuck_json}"
    );
    assert!(
        stuck_json["pttl_ms"].as_u64().unwrap() <= 2_000,
        "{stuck_json}"
    );
    assert_eq!(stuck_json["label"], "order-8812", "{stuck_json}");
    assert_eq!(
        stuck_json["holders"][0]["client_name"], "checkout-7f9c",
        "{stuck_json}"
    );
    let shown = fencelock(&url, &["show", "stuck"]).await;
    assert!(shown.stdout.contains("held for    "), "{shown:?}");
    assert!(
        shown.stdout.contains("client      checkout-7f9c"),
        "{shown:?}"
    );
    assert!(shown.stdout.contains("label       order-8812"), "{shown:?}");
    stuck.release().await.unwrap();
    fresh.release().await.unwrap();
}
