//! The header's semantics, in one server process: replays, conflicts, refusals, failures.

use std::time::Duration;

use fencelock::IdempotencyOptions;
use fencelock_http::{default_disposition, Disposition, IdempotencyLayer};
use fencelock_testing::RedisServer;

use futures_util::StreamExt;
use http_body_util::BodyExt;

use crate::support::{
    client, eventually, keys, layer_events, namespace, pay, post_streaming, post_to, TestServer,
};

const HOLD: Duration = Duration::from_secs(5);

#[tokio::test]
async fn the_first_request_runs_and_its_duplicates_get_the_stored_response() {
    let redis = RedisServer::start().unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    let first = pay(server.addr, "k-1", "500", &[]).await;
    assert_eq!(first.status, 200);
    assert!(!first.replayed());
    assert_eq!(first.headers["x-not-kept"], "first only");
    for _ in 0..3 {
        let again = pay(server.addr, "k-1", "500", &[]).await;
        assert_eq!(again.answer(), first.answer());
        assert!(again.replayed());
        assert_eq!(again.headers["content-type"], "text/plain");
        assert_eq!(again.headers["location"], "/payments/1");
        assert!(
            !again.headers.contains_key("x-not-kept"),
            "only the kept headers are stored"
        );
    }
    assert_eq!(server.calls.started(), 1);
    // Another key is another request.
    let other = pay(server.addr, "k-2", "500", &[]).await;
    assert!(!other.replayed());
    assert_eq!(server.calls.started(), 2);
}

#[tokio::test]
async fn the_same_key_with_another_request_is_refused_without_calling_the_handler() {
    let redis = RedisServer::start().unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    assert_eq!(pay(server.addr, "k", "500", &[]).await.status, 200);
    let other_body = pay(server.addr, "k", "501", &[]).await;
    assert_eq!(other_body.status, 422);
    assert!(
        other_body.text().contains("another request"),
        "{}",
        other_body.text()
    );
    let other_path = post_to(
        server.addr,
        "/payments?to=9",
        &[("idempotency-key", "\"k\"")],
        "500",
    )
    .await;
    assert_eq!(other_path.status, 422);
    assert_eq!(server.calls.started(), 1);
    // Also while the first still runs.
    let slow = tokio::spawn(pay(server.addr, "s", "1", &[("x-delay-ms", "1000")]));
    assert!(eventually(HOLD, || server.calls.started() == 2).await);
    assert_eq!(pay(server.addr, "s", "2", &[]).await.status, 422);
    let ended = server.calls.ended.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(ended, 1, "the first still ran when the other was refused");
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(server.calls.started(), 2);
}

#[tokio::test]
async fn a_concurrent_duplicate_gets_409_with_retry_after() {
    let redis = RedisServer::start().unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    let slow = tokio::spawn(pay(server.addr, "k", "1", &[("x-delay-ms", "500")]));
    assert!(eventually(HOLD, || server.calls.started() == 1).await);
    let busy = pay(server.addr, "k", "1", &[]).await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.headers["retry-after"], "1");
    assert!(busy.text().contains("in progress"));
    let first = slow.await.unwrap();
    assert_eq!(first.status, 200);
    let after = pay(server.addr, "k", "1", &[]).await;
    assert_eq!(after.answer(), first.answer());
    assert_eq!(server.calls.started(), 1);
}

#[tokio::test]
async fn with_the_wait_option_a_concurrent_duplicate_gets_the_stored_response_once_it_is_stored() {
    let redis = RedisServer::start().unwrap();
    let options = IdempotencyOptions::new(HOLD).wait_for_outcome(Duration::from_secs(5));
    let keys = client(&redis)
        .await
        .idempotency(namespace("wait"), options)
        .unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys)).await;
    let calls = server.calls.clone();
    let slow = tokio::spawn(pay(server.addr, "k", "1", &[("x-delay-ms", "400")]));
    assert!(eventually(HOLD, || calls.started() == 1).await);
    let waited = pay(server.addr, "k", "1", &[]).await;
    // Never before the first finished: its handler had ended when the duplicate was answered.
    assert_eq!(calls.ended.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(waited.replayed());
    let first = slow.await.unwrap();
    assert_eq!(waited.answer(), first.answer());
    assert_eq!(calls.started(), 1);
}

#[tokio::test]
async fn missing_and_malformed_keys_behave_as_documented() {
    let redis = RedisServer::start().unwrap();
    let idem = keys(&redis, HOLD).await;
    let open = TestServer::start(IdempotencyLayer::new(idem.clone())).await;
    // No key: passed through, every time.
    for _ in 0..2 {
        let reply = post_to(open.addr, "/payments", &[], "1").await;
        assert_eq!(reply.status, 200);
        assert!(
            reply.text().ends_with("with token none"),
            "{}",
            reply.text()
        );
    }
    assert_eq!(open.calls.started(), 2);
    let long = format!("\"{}\"", "k".repeat(256));
    for bad in ["\"\"", "bare-key", "\"open", "\"a\\nb\"", &long] {
        let reply = post_to(open.addr, "/payments", &[("idempotency-key", bad)], "1").await;
        assert_eq!(reply.status, 400, "{bad}");
        assert_eq!(reply.headers["content-type"], "text/plain; charset=utf-8");
        assert!(!reply.body.is_empty());
    }
    let two = [("idempotency-key", "\"a\""), ("idempotency-key", "\"b\"")];
    assert_eq!(post_to(open.addr, "/payments", &two, "1").await.status, 400);
    assert_eq!(open.calls.started(), 2);

    let strict = TestServer::start(IdempotencyLayer::new(idem.clone()).require_key(true)).await;
    let reply = post_to(strict.addr, "/payments", &[], "1").await;
    assert_eq!(reply.status, 400);
    assert!(reply.text().contains("required"));
    assert_eq!(strict.calls.started(), 0);

    let bare = TestServer::start(IdempotencyLayer::new(idem).accept_bare_keys(true)).await;
    let first = post_to(
        bare.addr,
        "/payments",
        &[("idempotency-key", "bare-1")],
        "1",
    )
    .await;
    assert_eq!(first.status, 200);
    // The bare and the quoted form are the same key.
    let quoted = pay(bare.addr, "bare-1", "1", &[]).await;
    assert!(quoted.replayed());
    assert_eq!(quoted.answer(), first.answer());
}

#[tokio::test]
async fn a_5xx_is_retried_and_a_4xx_is_replayed() {
    let redis = RedisServer::start().unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    let failed = pay(server.addr, "k5", "1", &[("x-status", "503")]).await;
    assert_eq!(failed.status, 503);
    let retried = pay(server.addr, "k5", "1", &[]).await;
    assert_eq!(retried.status, 200);
    assert!(!retried.replayed());
    assert_eq!(server.calls.started(), 2);
    assert!(token_of(&retried) > token_of(&failed));

    let declined = pay(server.addr, "k4", "1", &[("x-status", "402")]).await;
    assert_eq!(declined.status, 402);
    let again = pay(server.addr, "k4", "1", &[]).await;
    assert!(again.replayed());
    assert_eq!(again.answer(), declined.answer());
    assert_eq!(server.calls.started(), 3);
}

#[tokio::test]
async fn a_429_or_408_leaves_the_key_to_a_retry() {
    let redis = RedisServer::start().unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    for (n, status) in ["429", "408", "425"].into_iter().enumerate() {
        let key = format!("k{status}");
        let limited = pay(server.addr, &key, "1", &[("x-status", status)]).await;
        assert_eq!(limited.status.to_string(), status);
        // The retry runs the handler again, with a newer token; its answer is the one stored.
        let retried = pay(server.addr, &key, "1", &[]).await;
        assert_eq!(retried.status, 200, "{status}: {}", retried.text());
        assert!(!retried.replayed(), "{status}");
        assert!(token_of(&retried) > token_of(&limited));
        assert_eq!(server.calls.started(), 2 * (n + 1));
        assert!(pay(server.addr, &key, "1", &[]).await.replayed());
    }
}

#[tokio::test]
async fn a_panicking_handler_leaves_the_key_to_a_retry() {
    let redis = RedisServer::start().unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    let panicked = pay(server.addr, "k", "1", &[("x-panic", "1")]).await;
    assert_eq!(panicked.status, 500);
    assert!(panicked.text().contains("panicked"));
    let retried = pay(server.addr, "k", "1", &[]).await;
    assert_eq!(retried.status, 200);
    assert!(!retried.replayed());
    assert_eq!(server.calls.started(), 2);
}

#[tokio::test]
async fn an_oversized_response_is_sent_once_and_not_stored() {
    let redis = RedisServer::start().unwrap();
    let layer = IdempotencyLayer::new(keys(&redis, HOLD).await).max_stored_response(4096);
    let server = TestServer::start(layer).await;
    let (events, _recording) = layer_events();
    // Over the bound: the client gets it whole, once; nothing is stored.
    for _ in 0..2 {
        let big = pay(server.addr, "big", "1", &[("x-size", "100000")]).await;
        assert_eq!(big.status, 200);
        assert_eq!(big.body.len(), 100_000);
        assert!(!big.replayed());
    }
    assert_eq!(server.calls.started(), 2);
    // Each time, an event with target `fencelock.http` said why.
    let said = events.lock().unwrap().clone();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said.iter().all(|m| m.contains("over the stored bound")),
        "{said:?}"
    );
    // Within it: stored. The bound counts the kept headers too.
    let small = pay(server.addr, "small", "1", &[("x-size", "4000")]).await;
    assert_eq!(
        pay(server.addr, "small", "1", &[]).await.answer(),
        small.answer()
    );
    let edge = pay(server.addr, "edge", "1", &[("x-size", "4090")]).await;
    assert_eq!(edge.body.len(), 4090);
    assert!(!pay(server.addr, "edge", "1", &[("x-size", "4090")])
        .await
        .replayed());
    assert_eq!(server.calls.started(), 5);
    // Over fencelock's own bound (1 MiB), with the default setting.
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    let huge = pay(server.addr, "huge", "1", &[("x-size", "1100000")]).await;
    assert_eq!(huge.body.len(), 1_100_000);
    assert!(!pay(server.addr, "huge", "1", &[("x-size", "10")])
        .await
        .replayed());
    assert_eq!(server.calls.started(), 2);
}

#[tokio::test]
async fn keys_of_two_principals_never_see_each_others_responses() {
    let redis = RedisServer::start().unwrap();
    let layer = IdempotencyLayer::new(keys(&redis, HOLD).await).scope_by(|parts| {
        parts
            .headers
            .get("x-customer")
            .map(|v| v.as_bytes().to_vec())
    });
    let server = TestServer::start(layer).await;
    let alice = pay(server.addr, "k", "500", &[("x-customer", "alice")]).await;
    let bob = pay(server.addr, "k", "500", &[("x-customer", "bob")]).await;
    assert!(!bob.replayed(), "bob's request ran, not alice's replayed");
    assert_ne!(bob.body, alice.body);
    assert_eq!(server.calls.started(), 2);
    // Each gets their own, and another body is refused for one without touching the other's.
    let alice_again = pay(server.addr, "k", "500", &[("x-customer", "alice")]).await;
    assert_eq!(alice_again.answer(), alice.answer());
    assert_eq!(
        pay(server.addr, "k", "9", &[("x-customer", "bob")])
            .await
            .status,
        422
    );
    // A scope that is a prefix of another's key does not collide with it.
    let a = pay(server.addr, "bk", "1", &[("x-customer", "a")]).await;
    let ab = pay(server.addr, "k", "1", &[("x-customer", "ab")]).await;
    assert!(!ab.replayed() && !a.replayed());
    // No principal: refused.
    assert_eq!(pay(server.addr, "k", "500", &[]).await.status, 401);
    assert_eq!(server.calls.started(), 4);
}

#[tokio::test]
async fn the_handler_gets_the_token_and_the_run_is_labelled_with_the_request() {
    let redis = RedisServer::start().unwrap();
    let idem = keys(&redis, HOLD).await;
    let server = TestServer::start(IdempotencyLayer::new(idem.clone())).await;
    let slow = tokio::spawn(pay(server.addr, "k", "1", &[("x-delay-ms", "300")]));
    assert!(eventually(HOLD, || server.calls.started() == 1).await);
    let admin = fencelock::admin::Admin::connect(&redis.url())
        .await
        .unwrap();
    let key = fencelock_http::stored_key(b"", "k");
    let info = admin
        .idempotency_key(idem.namespace(), &key)
        .await
        .unwrap()
        .unwrap();
    // What `fencelock keys` shows next to the running key.
    assert_eq!(info.runner_label.as_deref(), Some("POST /payments"));
    let reply = slow.await.unwrap();
    let record = idem.record(&key).await.unwrap().unwrap();
    assert!(
        reply
            .text()
            .ends_with(&format!("with token {}", record.token())),
        "{}",
        reply.text()
    );
}

/// The token the test handler named in its body.
fn token_of(reply: &crate::support::Reply) -> u64 {
    reply.text().rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_client_that_disconnects_mid_request_does_not_cut_its_run_off() {
    let redis = RedisServer::start().unwrap();
    // Long enough that no retry below could run the request by the hold's lapse.
    let at_most_for = Duration::from_secs(30);
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, at_most_for).await)).await;
    let gone = tokio::spawn(pay(server.addr, "k", "1", &[("x-delay-ms", "600")]));
    assert!(eventually(HOLD, || server.calls.started() == 1).await);
    // The client goes away mid-request: its connection closes, and the server drops the
    // request's future.
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    assert_eq!(
        server.calls.done(),
        0,
        "the client left before the handler's work"
    );
    // The run goes on: its handler does its work once and its response is stored, so a prompt
    // retry gets that response (after a 409 or two while it still runs).
    let mut retried = pay(server.addr, "k", "1", &[]).await;
    while retried.status == 409 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        retried = pay(server.addr, "k", "1", &[]).await;
    }
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert!(retried.replayed(), "{}", retried.text());
    assert_eq!(
        server.calls.done(),
        1,
        "the handler's work happened exactly once"
    );
    assert_eq!(server.calls.started(), 1);
}

#[tokio::test]
async fn a_streamed_response_is_buffered_up_to_the_bound_and_stored_or_passed_on_whole() {
    let redis = RedisServer::start().unwrap();
    let idem = keys(&redis, HOLD).await;
    let layer = IdempotencyLayer::new(idem.clone()).max_stored_response(20_000);
    let server = TestServer::start(layer).await;
    let send = |key: &'static str, chunks: &'static str| {
        let quoted = format!("\"{key}\"");
        async move {
            let headers = [("idempotency-key", quoted.as_str()), ("x-chunks", chunks)];
            post_to(server.addr, "/stream", &headers, "").await
        }
    };
    // 10 chunks: within the bound, stored as streamed, replayed byte for byte.
    let first = send("small", "10").await;
    assert_eq!(first.body.len(), 10_000);
    assert!(first.body.starts_with(b"00000....") && first.text().contains("00009"));
    let again = send("small", "10").await;
    assert!(again.replayed());
    assert_eq!(again.answer(), first.answer());
    // 50 chunks: over it; what was read and the rest reach the client in order, once.
    let big = send("big", "50").await;
    assert_eq!(big.body.len(), 50_000);
    for n in 0..50 {
        assert_eq!(
            &big.body[n * 1000..n * 1000 + 5],
            format!("{n:05}").as_bytes()
        );
    }
    assert!(!send("big", "50").await.replayed());
    assert_eq!(server.calls.started(), 3);
    // A response that never ends once over the bound: the client still gets it as it streams
    // (the layer does not wait for its end), and the key keeps no answer.
    let headers = [
        ("idempotency-key", "\"endless\""),
        ("x-chunks", "21"),
        ("x-forever", "1"),
    ];
    let empty = http_body_util::Empty::<bytes::Bytes>::new();
    let (status, mut body) = tokio::time::timeout(
        HOLD,
        post_streaming(server.addr, "/stream", &headers, empty),
    )
    .await
    .expect("the response comes before its body's end");
    assert_eq!(status, 200);
    let mut read = Vec::new();
    while read.len() < 21_000 {
        let frame = tokio::time::timeout(HOLD, body.frame())
            .await
            .expect("the response's bytes come before its end")
            .unwrap()
            .unwrap();
        read.extend_from_slice(&frame.into_data().unwrap());
    }
    assert!(read.starts_with(b"00000...") && read[20_000..].starts_with(b"00020"));
    let record = idem
        .record(&fencelock_http::stored_key(b"", "endless"))
        .await
        .unwrap()
        .unwrap();
    assert!(record.result().is_none(), "not stored");
}

#[tokio::test]
async fn a_request_body_over_the_bound_is_refused_with_413() {
    let redis = RedisServer::start().unwrap();
    let layer = IdempotencyLayer::new(keys(&redis, HOLD).await).max_request_body(1000);
    let server = TestServer::start(layer).await;
    let refused = pay(server.addr, "k", &"1".repeat(1001), &[]).await;
    assert_eq!(refused.status, 413);
    assert!(refused.text().contains("request body"));
    // A chunked body that never ends: refused once over the bound, without waiting for its end.
    let chunks = futures_util::stream::iter((0..3).map(|_| {
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from(vec![
            b'1';
            500
        ])))
    }))
    .chain(futures_util::stream::pending());
    let endless = http_body_util::StreamBody::new(chunks);
    let (status, _body) = tokio::time::timeout(
        HOLD,
        post_streaming(
            server.addr,
            "/payments",
            &[("idempotency-key", "\"e\"")],
            endless,
        ),
    )
    .await
    .expect("refused before the body's end");
    assert_eq!(status, 413);
    assert_eq!(
        pay(server.addr, "k", &"1".repeat(1000), &[]).await.status,
        200
    );
    // Without a key the layer reads nothing: the handler gets the body as sent.
    assert_eq!(
        post_to(server.addr, "/payments", &[], &"1".repeat(5000))
            .await
            .status,
        200
    );
    assert_eq!(server.calls.started(), 2);
}

#[tokio::test]
async fn the_settings_change_what_is_kept_compared_and_stored() {
    let redis = RedisServer::start().unwrap();
    let layer = IdempotencyLayer::new(keys(&redis, HOLD).await)
        .keep_headers([http::HeaderName::from_static("x-not-kept")])
        // The target alone: the same key with another body is the same request.
        .fingerprint_with(|parts, _body| parts.uri.path().as_bytes().to_vec())
        // A 402 leaves the key to a retry; a 503 is stored.
        .on_response(|status| match status.as_u16() {
            402 => Disposition::Retry,
            503 => Disposition::Store,
            _ => default_disposition(status),
        })
        .retry_after(Duration::from_millis(2500));
    let server = TestServer::start(layer).await;
    let first = pay(server.addr, "k", "500", &[]).await;
    let other_body = pay(server.addr, "k", "999", &[]).await;
    assert!(other_body.replayed());
    assert_eq!(other_body.answer(), first.answer());
    assert_eq!(other_body.headers["x-not-kept"], "first only");
    assert!(!other_body.headers.contains_key("location"));

    assert_eq!(
        pay(server.addr, "d", "1", &[("x-status", "402")])
            .await
            .status,
        402
    );
    assert!(!pay(server.addr, "d", "1", &[]).await.replayed());
    let unavailable = pay(server.addr, "u", "1", &[("x-status", "503")]).await;
    assert_eq!(
        pay(server.addr, "u", "1", &[]).await.answer(),
        unavailable.answer()
    );
    assert_eq!(server.calls.started(), 4);

    let slow = tokio::spawn(pay(server.addr, "s", "1", &[("x-delay-ms", "300")]));
    assert!(eventually(HOLD, || server.calls.started() == 5).await);
    let busy = pay(server.addr, "s", "1", &[]).await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.headers["retry-after"], "3", "2.5 s, rounded up");
    slow.await.unwrap();
}

#[tokio::test]
async fn with_redis_unreachable_a_keyed_request_gets_503_and_the_handler_is_not_called() {
    let mut redis = RedisServer::start().unwrap();
    let client = fencelock::LockClient::builder(redis.url())
        .retry_window(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let keys = client
        .idempotency(namespace("down"), IdempotencyOptions::new(HOLD))
        .unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys)).await;
    redis.stop().unwrap();
    let refused = pay(server.addr, "k", "1", &[]).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.headers["retry-after"], "1");
    assert!(refused.text().contains("unavailable"));
    // Without a key the request does not need Redis.
    assert_eq!(
        post_to(server.addr, "/payments", &[], "1").await.status,
        200
    );
    assert_eq!(server.calls.started(), 1);
    // Back: the client's retry runs it.
    redis.start_again().unwrap();
    let mut retried = pay(server.addr, "k", "1", &[]).await;
    for _ in 0..50 {
        if retried.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        retried = pay(server.addr, "k", "1", &[]).await;
    }
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(server.calls.started(), 2);
}

#[tokio::test]
async fn a_store_that_answers_with_an_error_gets_500_not_503() {
    let redis = RedisServer::start().unwrap();
    let server = TestServer::start(IdempotencyLayer::new(keys(&redis, HOLD).await)).await;
    assert_eq!(pay(server.addr, "k", "1", &[]).await.status, 200);
    // The key's record in Redis becomes a plain string: every read of it is refused with
    // WRONGTYPE, which a retry would only meet again.
    let mut db = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let records: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*idem-rec:*")
        .query_async(&mut db)
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let () = redis::cmd("SET")
        .arg(&records[0])
        .arg("not a record")
        .query_async(&mut db)
        .await
        .unwrap();
    let refused = pay(server.addr, "k", "1", &[]).await;
    assert_eq!(refused.status, 500, "{}", refused.text());
    assert!(!refused.headers.contains_key("retry-after"));
    assert_eq!(server.calls.started(), 1);
}

/// Rows keyed as the example keys its payments: by the key in its scope, with the fence of the
/// run that wrote them last.
type Rows = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Vec<u8>, (String, u64)>>>;

/// Writes the payment's row as the example does: inserted, or written over by a run whose
/// token is at least the row's fence.
async fn write_row(
    axum::extract::State(rows): axum::extract::State<Rows>,
    axum::Extension(run): axum::Extension<fencelock_http::IdempotencyRun>,
    amount: String,
) -> String {
    let token = run.token().get();
    let mut rows = rows.lock().unwrap();
    let row = rows
        .entry(run.stored_key().to_vec())
        .or_insert((amount.clone(), token));
    if row.1 <= token {
        *row = (amount.clone(), token);
    }
    format!("paid {amount}")
}

#[tokio::test]
async fn two_principals_sending_the_same_key_write_two_rows() {
    let redis = RedisServer::start().unwrap();
    let layer = IdempotencyLayer::new(keys(&redis, HOLD).await).scope_by(|parts| {
        parts
            .headers
            .get("x-customer")
            .map(|v| v.as_bytes().to_vec())
    });
    let rows = Rows::default();
    let app = axum::Router::new()
        .route("/payments", axum::routing::post(write_row))
        .with_state(rows.clone())
        .layer(layer);
    let (addr, task) = crate::support::serve(app).await;
    assert_eq!(
        pay(addr, "k", "100", &[("x-customer", "alice")])
            .await
            .status,
        200
    );
    assert_eq!(
        pay(addr, "k", "200", &[("x-customer", "bob")]).await.status,
        200
    );
    task.abort();
    let rows = rows.lock().unwrap();
    let amounts = |customer: &[u8]| rows[&fencelock_http::stored_key(customer, "k")].0.clone();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(amounts(b"alice"), "100");
    assert_eq!(amounts(b"bob"), "200");
}
