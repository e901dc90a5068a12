//! What the tests share: a real axum server on a free loopback port behind the layer, a
//! handler whose answer each request steers by headers, and a real HTTP/1 client.

// `pub` means "for the test modules of this binary".
#![allow(unreachable_pub)]
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use fencelock::{Idempotency, IdempotencyOptions, LockClient};
use fencelock_http::{IdempotencyLayer, IdempotencyRun};
use fencelock_testing::RedisServer;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

/// A namespace of its own for each use.
pub fn namespace(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client of `redis`.
pub async fn client(redis: &RedisServer) -> LockClient {
    LockClient::builder(redis.url()).connect().await.unwrap()
}

/// A namespace's keys, held by a run for at most `at_most_for`.
pub async fn keys(redis: &RedisServer, at_most_for: Duration) -> Idempotency {
    let options = IdempotencyOptions::new(at_most_for);
    client(redis)
        .await
        .idempotency(namespace("http"), options)
        .unwrap()
}

/// What the test handler saw: how many times it was called, how many of its calls ended (ran
/// to the end or were dropped), and how many did their work (the side effect a payment's
/// write would be: counted once the delay it was asked for has passed).
#[derive(Debug, Default)]
pub struct Calls {
    pub started: AtomicUsize,
    pub ended: AtomicUsize,
    pub done: AtomicUsize,
}

impl Calls {
    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    pub fn done(&self) -> usize {
        self.done.load(Ordering::SeqCst)
    }
}

/// Counts a call as ended when dropped: run to the end, or its future dropped mid-way.
struct Ending(Arc<Calls>);

impl Drop for Ending {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

/// The test handler: counts its calls, waits `x-delay-ms`, panics on `x-panic`, answers the
/// status `x-status` (200 by default) with a body naming its input and its run's token, and
/// `x-size` bytes of body instead when asked.
async fn handler(
    State(calls): State<Arc<Calls>>,
    run: Option<Extension<IdempotencyRun>>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    calls.started.fetch_add(1, Ordering::SeqCst);
    let _ending = Ending(calls.clone());
    let number = |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.parse().ok() };
    if let Some(ms) = number("x-delay-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    calls.done.fetch_add(1, Ordering::SeqCst);
    assert!(
        !headers.contains_key("x-panic"),
        "the test handler panics as asked"
    );
    let status = number("x-status").map_or(StatusCode::OK, |s| {
        StatusCode::from_u16(u16::try_from(s).unwrap()).unwrap()
    });
    let mut out = HeaderMap::new();
    out.insert("content-type", "text/plain".parse().unwrap());
    out.insert("location", "/payments/1".parse().unwrap());
    out.insert("x-not-kept", "first only".parse().unwrap());
    let body = match number("x-size") {
        Some(size) => vec![b'x'; usize::try_from(size).unwrap()],
        None => {
            let token = run.map_or_else(
                || "none".to_owned(),
                |Extension(run)| run.token().to_string(),
            );
            format!("{status} for {body} with token {token}").into_bytes()
        }
    };
    (status, out, body)
}

/// A handler whose body streams: `x-chunks` chunks of 1000 bytes (the chunk's number, then
/// dots), a pause between each, and with `x-forever` then nothing, never ending; counted as
/// the test handler is.
async fn streaming(State(calls): State<Arc<Calls>>, headers: HeaderMap) -> axum::body::Body {
    calls.started.fetch_add(1, Ordering::SeqCst);
    let chunks: usize = headers["x-chunks"].to_str().unwrap().parse().unwrap();
    let forever = headers.contains_key("x-forever");
    let stream = futures_util::stream::unfold(0, move |n| async move {
        if n == chunks {
            if forever {
                std::future::pending::<()>().await;
            }
            return None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut chunk = format!("{n:05}").into_bytes();
        chunk.resize(1000, b'.');
        Some((Ok::<_, std::convert::Infallible>(chunk), n + 1))
    });
    axum::body::Body::from_stream(stream)
}

/// A server on a free loopback port: the test handler at `POST /payments` behind `layer`.
pub struct TestServer {
    pub addr: SocketAddr,
    pub calls: Arc<Calls>,
    task: JoinHandle<()>,
}

impl TestServer {
    pub async fn start(layer: IdempotencyLayer) -> TestServer {
        let calls = Arc::new(Calls::default());
        let app = Router::new()
            .route("/payments", post(handler))
            .route("/stream", post(streaming))
            .with_state(calls.clone())
            .layer(layer);
        let (addr, task) = serve(app).await;
        TestServer { addr, calls, task }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `app` on a free loopback port.
pub async fn serve(app: Router) -> (SocketAddr, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, task)
}

/// A reply as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Status and body: what a replay repeats byte for byte.
    pub fn answer(&self) -> (u16, Bytes) {
        (self.status, self.body.clone())
    }
}

/// `POST path` to `addr` with `headers` and `body`, on a connection of its own.
pub async fn post_to(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::post(path).header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

/// `POST /payments` with the key `key` (quoted) and `body`, plus `extra` headers.
pub async fn pay(addr: SocketAddr, key: &str, body: &str, extra: &[(&str, &str)]) -> Reply {
    let quoted = format!("\"{key}\"");
    let mut headers = vec![("idempotency-key", quoted.as_str())];
    headers.extend_from_slice(extra);
    post_to(addr, "/payments", &headers, body).await
}

/// Polls `check` every 10 ms until it holds or `limit` passes; whether it held.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < until {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// The messages of the events with target `fencelock.http` emitted on this thread (the
/// current-thread runtime of a `#[tokio::test]` runs the server there too) while the guard
/// lives.
pub fn layer_events() -> (
    Arc<std::sync::Mutex<Vec<String>>>,
    tracing::subscriber::DefaultGuard,
) {
    use tracing_subscriber::layer::SubscriberExt;
    // tracing decides once per process whether an event's call site is enabled, from the
    // subscriber of the first thread that reaches it; without a process-wide subscriber, a
    // test that reached one first on a thread with no capture (the endless response's test
    // emits the same "over the stored bound" event) had it cached as disabled, and this
    // capture saw nothing. A bare process-wide registry makes every such first look say yes;
    // the events still go to the subscriber of the thread that emits them.
    static PROCESS_WIDE: std::sync::Once = std::sync::Once::new();
    PROCESS_WIDE.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry())
            .expect("no other process-wide subscriber in this test binary");
    });
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorder = Recorder(seen.clone());
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder));
    (seen, guard)
}

struct Recorder(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "fencelock.http" {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// `POST path` to `addr` with `headers` and `body`, on a connection of its own: the status and
/// the response's body as it streams.
pub async fn post_streaming<B>(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: B,
) -> (u16, hyper::body::Incoming)
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::post(path).header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(body).unwrap())
        .await
        .unwrap();
    (response.status().as_u16(), response.into_body())
}
