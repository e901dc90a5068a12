//! Errors: unreachable servers, credentials, refused prefixes, usage, foreign data.

use super::*;

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
