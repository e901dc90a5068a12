//! Idempotency keys: listing them with state, runner, token and age; showing one with its
//! stored result; forgetting one nobody holds, and refusing while a run holds it.

use super::*;

#[tokio::test]
async fn keys_are_listed_shown_and_forgotten() {
    use fencelock::{Failure, IdempotencyOptions};
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let empty = fencelock(&url, &["keys"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stdout.contains("no idempotency key"), "{empty:?}");

    let options = IdempotencyOptions::new(Duration::from_secs(30));
    let payments = client.idempotency("payments", options.clone()).unwrap();
    let paid = payments
        .run("pay-1", "charge 500", |run| async move {
            Ok::<_, Failure<()>>(format!("paid with {}", run.token()).into_bytes())
        })
        .await
        .unwrap();
    let Some(result) = paid.result().map(<[u8]>::to_vec) else {
        panic!("{paid:?}")
    };
    // A key whose run is still going, in another namespace.
    // Labelled with the request: shown next to the running key while its run holds it.
    let refunds = client
        .idempotency("refunds", options)
        .unwrap()
        .with_label("POST /refunds")
        .unwrap();
    let (began_tx, began_rx) = tokio::sync::oneshot::channel();
    let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        refunds
            .run(b"ref-\xff", "refund 500", |run| async move {
                began_tx.send(run.token()).unwrap();
                end_rx.await.unwrap();
                Ok::<_, Failure<()>>(vec![])
            })
            .await
            .unwrap()
    });
    let running_token = began_rx.await.unwrap();

    let text = fencelock(&url, &["keys"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines[0].starts_with("payments:pay-1  done"), "{text:?}");
    assert!(
        lines[0].contains(&format!("result {} bytes", result.len())),
        "{text:?}"
    );
    assert!(lines[1].starts_with("refunds:ref-"), "{text:?}");
    assert!(lines[1].contains("running"), "{text:?}");
    assert!(lines[1].contains("  label POST /refunds"), "{text:?}");
    assert!(
        !lines[0].contains("label"),
        "a finished run holds no label: {text:?}"
    );
    let running_json = json(&fencelock(&url, &["keys", "refunds", "--json"]).await.stdout);
    assert_eq!(
        running_json[0]["runner_label"], "POST /refunds",
        "{running_json}"
    );
    assert!(
        lines[1].contains(&format!("token {running_token}")),
        "{text:?}"
    );
    let only = fencelock(&url, &["keys", "payments", "--json"]).await;
    let keys = json(&only.stdout);
    assert_eq!(keys.as_array().map(Vec::len), Some(1), "{only:?}");
    assert_eq!(keys[0]["namespace"], "payments");
    assert_eq!(keys[0]["key"], "pay-1");
    assert_eq!(keys[0]["state"], "done");
    assert_eq!(keys[0]["fingerprint"], "charge 500");
    assert_eq!(
        keys[0]["result"],
        String::from_utf8(result.clone()).unwrap()
    );
    assert_eq!(keys[0]["final_failure"], false);
    assert!(keys[0]["age_ms"].as_u64().unwrap() < 60_000, "{only:?}");
    assert!(keys[0]["retained_ms"].as_u64().unwrap() <= 86_400_000);
    let all = json(&fencelock(&url, &["keys", "--json"]).await.stdout);
    assert_eq!(all[1]["key_hex"], "7265662dff");
    assert_eq!(all[1]["runner_holds"], true);

    let one = fencelock(&url, &["key", "payments", "pay-1"]).await;
    assert_eq!(one.code, 0, "{one:?}");
    assert!(one.stdout.contains("fingerprint charge 500"), "{one:?}");
    assert!(
        one.stdout
            .contains(&format!("result {}", String::from_utf8_lossy(&result))),
        "{one:?}"
    );
    let missing = fencelock(&url, &["key", "payments", "pay-2"]).await;
    assert_eq!(missing.code, 4, "{missing:?}");

    // Forget: refused while a run holds the key, asked first, then done; the key runs anew.
    let held = fencelock(&url, &["forget", "refunds", "ref-\u{fffd}", "--yes"]).await;
    assert_eq!(
        held.code, 4,
        "a key the name does not reach has no record: {held:?}"
    );
    let no = fencelock_with_input(&url, &["forget", "payments", "pay-1"], "n\n").await;
    assert_eq!(no.code, 6, "{no:?}");
    let yes = fencelock(&url, &["forget", "payments", "pay-1", "--yes"]).await;
    assert_eq!(yes.code, 0, "{yes:?}");
    assert!(yes.stdout.contains("forgotten: payments:pay-1"), "{yes:?}");
    let again = payments
        .run("pay-1", "charge 500", |_run| async {
            Ok::<_, Failure<()>>(vec![1])
        })
        .await
        .unwrap();
    assert!(again.ran(), "{again:?}");

    end_tx.send(()).unwrap();
    assert!(running.await.unwrap().ran());
    // Keys are not locks: `list` shows none of them.
    let locks = json(&fencelock(&url, &["list", "--json"]).await.stdout);
    assert_eq!(locks.as_array().map(Vec::len), Some(0), "{locks}");
}

#[tokio::test]
async fn forget_refuses_while_a_run_holds_the_key() {
    use fencelock::{Failure, IdempotencyOptions};
    let fx = Fixture::start();
    let url = fx.server.url();
    let client = fx.client().await;
    let payments = client
        .idempotency("payments", IdempotencyOptions::new(Duration::from_secs(30)))
        .unwrap();
    let (began_tx, began_rx) = tokio::sync::oneshot::channel();
    let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        payments
            .run("pay-1", "charge 500", |_run| async move {
                began_tx.send(()).unwrap();
                end_rx.await.unwrap();
                Ok::<_, Failure<()>>(b"paid".to_vec())
            })
            .await
            .unwrap()
    });
    began_rx.await.unwrap();
    let refused = fencelock(&url, &["forget", "payments", "pay-1", "--yes"]).await;
    assert_eq!(refused.code, 6, "{refused:?}");
    assert!(refused.stderr.contains("held by a run"), "{refused:?}");
    end_tx.send(()).unwrap();
    assert_eq!(running.await.unwrap().result(), Some(&b"paid"[..]));
    let shown = json(
        &fencelock(&url, &["key", "payments", "pay-1", "--json"])
            .await
            .stdout,
    );
    assert_eq!(shown["state"], "done");
    assert_eq!(shown["result"], "paid");
}
