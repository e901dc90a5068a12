//! Force releases: evicting a stuck holder, waking waiters, fencing it off, asking first.

use super::*;

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

/// `--holder` names a hold of a semaphore or a read-write lock; without `--semaphore` or
/// `--rwlock` it is refused as a usage error, and the lock's holder (whoever it is) is left
/// alone rather than evicted.
#[tokio::test]
async fn a_holder_without_its_kind_is_refused_and_evicts_nothing() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let guard = client.lock("x").unwrap().acquire().await.unwrap();
    let args = [
        "release",
        "x",
        "--force",
        "--holder",
        "someone-else:7",
        "--yes",
    ];
    let run = fencelock(&fx.server.url(), &args).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(guard.is_valid());
    guard.release().await.unwrap();
}
