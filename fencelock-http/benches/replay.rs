//! A replayed request's latency and Redis round trips, against the same handler without the
//! layer, measured in the same run.
//!
//! ```text
//! cargo bench -p fencelock-http --bench replay
//! ```
//!
//! Two axum servers on loopback ports serve one handler (a 64-byte body), one behind the
//! layer; one keep-alive HTTP/1 connection to each. 40 interleaved rounds (the order swapped
//! every round) of 200 requests each: the same key replayed against the layered server, no key
//! against the plain one; ratio = the median of the per-round ratios. Round trips are the
//! commands clients sent over 200 replays as `MONITOR` shows them (not the commands scripts
//! ran): one command is one round trip, as the layer pipelines nothing.
//!
//! Run without `--bench` (as `cargo test --all-targets` does), it makes a few requests and
//! checks the round-trip count only, never a time.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use fencelock::{IdempotencyOptions, LockClient};
use fencelock_http::IdempotencyLayer;
use fencelock_testing::RedisServer;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

async fn handler() -> &'static str {
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// One request on the kept-alive connection; its status and whether it was a replay.
async fn send(sender: &mut SendRequest<Full<Bytes>>, key: Option<&str>) -> (u16, bool) {
    sender.ready().await.unwrap();
    let mut request = http::Request::post("/pay").header("host", "bench");
    if let Some(key) = key {
        request = request.header("idempotency-key", format!("\"{key}\""));
    }
    let request = request.body(Full::new(Bytes::from_static(b"500"))).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let status = response.status().as_u16();
    response.into_body().collect().await.unwrap();
    (status, replayed)
}

/// How many commands clients sent to the server (not those scripts ran) while `work` ran,
/// read from `MONITOR`: each is one round trip, as the layer pipelines nothing.
async fn round_trips(server: &RedisServer, work: impl std::future::Future<Output = ()>) -> u64 {
    use futures_util::StreamExt;
    let monitor = server.client().get_async_monitor().await.unwrap();
    let mut marker_conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let marker = "fencelock-http-bench-marker";
    let collector = tokio::spawn(async move {
        let mut lines = monitor.into_on_message::<String>();
        let (mut count, mut started) = (0, false);
        while let Some(line) = lines.next().await {
            if line.contains(marker) {
                if started {
                    break;
                }
                started = true;
            } else if started
                && line
                    .split_once("] ")
                    .is_some_and(|(from, _)| !from.ends_with(" lua"))
            {
                count += 1;
            }
        }
        count
    });
    // MONITOR starts streaming once the server has the subscription: send markers until the
    // collector has seen one.
    let echo = redis::cmd("ECHO").arg(marker).to_owned();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _: String = echo.query_async(&mut marker_conn).await.unwrap();
    work.await;
    let _: String = echo.query_async(&mut marker_conn).await.unwrap();
    collector.await.unwrap()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let redis_server = RedisServer::start().unwrap();
    let client = LockClient::builder(redis_server.url())
        .connect()
        .await
        .unwrap();
    let options = IdempotencyOptions::new(Duration::from_secs(30));
    let payments = client.idempotency("payments", options).unwrap();
    let plain = serve(Router::new().route("/pay", post(handler))).await;
    let layered = serve(
        Router::new()
            .route("/pay", post(handler))
            .layer(IdempotencyLayer::new(payments)),
    )
    .await;
    let (mut plain, mut layered) = (connect(plain).await, connect(layered).await);
    assert_eq!(send(&mut layered, Some("bench")).await, (200, false));
    assert_eq!(send(&mut layered, Some("bench")).await, (200, true));

    // Round trips, counted by the server.
    let probe: u32 = if bench { 200 } else { 20 };
    let replays = round_trips(&redis_server, async {
        for _ in 0..probe {
            assert_eq!(send(&mut layered, Some("bench")).await, (200, true));
        }
    })
    .await;
    let replay_commands = replays as f64 / f64::from(probe);
    let firsts = round_trips(&redis_server, async {
        for n in 0..probe {
            assert_eq!(
                send(&mut layered, Some(&format!("new-{n}"))).await,
                (200, false)
            );
        }
    })
    .await;
    let first_commands = firsts as f64 / f64::from(probe);
    assert!(
        replay_commands <= 2.0,
        "a replay costs at most 2 round trips, not {replay_commands}"
    );
    if !bench {
        println!(
            "replay: {replay_commands:.2} round trips per replay, {first_commands:.2} per first \
             request (test mode: no timing)"
        );
        return;
    }

    let (rounds, per_round) = (40, 200u32);
    let (mut ratios, mut plain_us, mut replay_us) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut times = [0.0; 2];
        for which in [round % 2, 1 - round % 2] {
            let started = Instant::now();
            for _ in 0..per_round {
                match which {
                    0 => assert_eq!(send(&mut plain, None).await.0, 200),
                    _ => assert!(send(&mut layered, Some("bench")).await.1),
                }
            }
            times[which] = started.elapsed().as_secs_f64() * 1e6 / f64::from(per_round);
        }
        plain_us.push(times[0]);
        replay_us.push(times[1]);
        ratios.push(times[1] / times[0]);
    }
    let (plain_us, replay_us, ratio) = (
        median(&mut plain_us),
        median(&mut replay_us),
        median(&mut ratios),
    );
    println!("| what | Redis round trips per request | latency | / without the layer |");
    println!("| --- | ---: | ---: | ---: |");
    println!("| without the layer (no key) | 0 | {plain_us:.0} µs | 1.00 |");
    println!(
        "| replay: a finished key, answered from its record | {replay_commands:.2} | {replay_us:.0} µs | {ratio:.2} |"
    );
    println!("| (a first request with a new key, for comparison) | {first_commands:.2} | | |");
}
