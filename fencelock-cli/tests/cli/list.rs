//! Listing and showing locks and elections: text, JSON, prefixes, binary names.

use super::*;

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
        .with_label("build-7")
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
        "label build-7".to_owned(),
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
    assert_eq!(elections[0]["leader_label"], "build-7");
    assert!(elections[1]["leader_label"].is_null(), "no label given");
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
