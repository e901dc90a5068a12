//! The tracing spans and events documented in `fencelock::observability`, captured from real
//! lock operations on a throwaway redis-server.
//!
//! Each test installs its capturing subscriber as the thread's default and runs on a
//! current-thread runtime, so everything the library does for it (background watchdog and
//! releases included) runs on that thread and is captured, and nothing of other tests is.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{eventually, Fixture};
use fencelock::LockClient;
use fencelock_testing::RedisServer;
use redis::Commands;
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing::Instrument;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Fields by name, values as their `Debug`/`Display` text (strings unquoted).
type Fields = HashMap<String, String>;

#[derive(Debug, Clone)]
struct Captured {
    name: String,
    level: tracing::Level,
    fields: Fields,
    /// The event's span and its ancestors, innermost first: (name, fields).
    spans: Vec<(String, Fields)>,
}

impl Captured {
    fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("event {} has no field {name}: {self:?}", self.name))
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

impl Capture {
    fn named(&self, name: &str) -> Vec<Captured> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.name == name)
            .cloned()
            .collect()
    }

    /// Installs this capture as the current thread's subscriber until the guard drops.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        crate::common::events::install_process_subscriber();
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::new();
        attrs.record(&mut Collect(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .map(|span| {
                        let fields = span
                            .extensions()
                            .get::<Fields>()
                            .cloned()
                            .unwrap_or_default();
                        (span.name().to_owned(), fields)
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.0.lock().unwrap().push(Captured {
            name: event.metadata().name().to_owned(),
            level: *event.metadata().level(),
            fields,
            spans,
        });
    }
}

#[tokio::test]
async fn acquire_and_release_report_the_documented_fields_inside_the_callers_span() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("orders:7").unwrap();

    let request = tracing::info_span!("http_request", trace_id = "4bf92f3577b34da6");
    let guard = lock.acquire().instrument(request.clone()).await.unwrap();
    let token = guard.token().get().to_string();
    let holder = guard.holder_id().to_owned();
    guard.release().instrument(request).await.unwrap();

    let acquired = capture.named("fencelock.acquire");
    assert_eq!(acquired.len(), 1, "{acquired:?}");
    let acquired = &acquired[0];
    assert_eq!(acquired.field("outcome"), "acquired");
    assert_eq!(acquired.field("token"), token);
    assert_eq!(acquired.field("holder"), holder);
    assert_eq!(acquired.field("contended"), "false");
    acquired.field("waited_us").parse::<u64>().unwrap();
    // The event sits in the `fencelock.acquire` span, which is a child of the caller's span.
    let span_names: Vec<_> = acquired.spans.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(span_names, ["fencelock.acquire", "http_request"]);
    let (_, acquire_span) = &acquired.spans[0];
    assert_eq!(acquire_span["lock"], "orders:7");
    assert_eq!(acquire_span["method"], "acquire");
    assert_eq!(acquired.spans[1].1["trace_id"], "4bf92f3577b34da6");

    let released = capture.named("fencelock.release");
    assert_eq!(released.len(), 1, "{released:?}");
    let released = &released[0];
    assert_eq!(released.field("lock"), "orders:7");
    assert_eq!(released.field("outcome"), "released");
    assert_eq!(released.field("method"), "release");
    assert_eq!(released.field("token"), token);
    assert_eq!(released.field("holder"), holder);
    assert_eq!(released.field("remaining"), "0");
    released.field("held_us").parse::<u64>().unwrap();
    assert_eq!(released.spans[0].0, "http_request");
}

/// A client whose watchdog looks every second (a third of its lease) for holds kept a second
/// or longer.
async fn long_hold_client(fx: &Fixture) -> LockClient {
    LockClient::builder(fx.server.url())
        .default_lease(Duration::from_secs(3))
        .max_hold(Duration::from_secs(1))
        .connect()
        .await
        .unwrap()
}

/// A label rides the acquire span, and a hold kept past the client's `max_hold` is reported
/// once, with its label and how long it has been held.
#[tokio::test]
async fn a_labelled_hold_past_max_hold_is_reported_once_with_its_label() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = long_hold_client(&fx).await;
    let guard = client
        .lock("orders:9")
        .unwrap()
        .with_label("req-51")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let acquired = capture.named("fencelock.acquire");
    assert_eq!(acquired[0].spans[0].1["label"], "req-51", "{acquired:?}");
    // Reported at the first watchdog round (one per second) at or past the bound...
    assert!(
        eventually(Duration::from_secs(20), || !capture
            .named("fencelock.long_hold")
            .is_empty())
        .await,
        "no long-hold report"
    );
    // ...and never again: two more rounds.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let long = capture.named("fencelock.long_hold");
    assert_eq!(long.len(), 1, "once per hold: {long:?}");
    let long = &long[0];
    assert_eq!(long.level, tracing::Level::WARN);
    assert_eq!(long.field("lock"), "orders:9");
    assert_eq!(long.field("label"), "req-51");
    assert_eq!(long.field("holder"), guard.holder_id());
    assert_eq!(long.field("max_hold_ms"), "1000");
    let held: u64 = long.field("held_ms").parse().unwrap();
    assert!((1000..3000).contains(&held), "held {held} ms");
    guard.release().await.unwrap();
}

/// A semaphore permit and a read-write lock's read carry their labels into their acquire
/// events and, held past `max_hold`, into their one `fencelock.long_hold` report each.
#[tokio::test]
async fn labelled_permits_and_reads_past_max_hold_are_reported_with_their_labels() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = long_hold_client(&fx).await;
    let pool = client.semaphore("exports", 2).unwrap();
    let permit = pool
        .with_label("export-9")
        .unwrap()
        .acquire(1)
        .await
        .unwrap();
    let catalogue = client.rwlock("catalogue").unwrap();
    let read = catalogue
        .with_label("report-4")
        .unwrap()
        .read()
        .await
        .unwrap();
    let acquired = capture.named("fencelock.semaphore");
    assert_eq!(acquired[0].field("label"), "export-9", "{acquired:?}");
    let acquired = capture.named("fencelock.rwlock");
    assert_eq!(acquired[0].field("label"), "report-4", "{acquired:?}");
    assert!(
        eventually(Duration::from_secs(20), || capture
            .named("fencelock.long_hold")
            .len()
            >= 2)
        .await,
        "no long-hold reports: {:?}",
        capture.named("fencelock.long_hold")
    );
    // Two more watchdog rounds report nothing new.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let long = capture.named("fencelock.long_hold");
    assert_eq!(long.len(), 2, "once per hold: {long:?}");
    let of = |name: &str| long.iter().find(|e| e.field("lock") == name).unwrap();
    let (permit_report, read_report) = (of("exports"), of("catalogue"));
    assert_eq!(permit_report.field("label"), "export-9");
    assert_eq!(permit_report.field("holder"), permit.holder_id());
    assert_eq!(permit_report.field("token"), permit.token().to_string());
    assert_eq!(read_report.field("label"), "report-4");
    assert_eq!(read_report.field("holder"), read.holder_id());
    permit.release().await.unwrap();
    read.release().await.unwrap();
}

#[tokio::test]
async fn busy_contended_and_timed_out_acquisitions_say_so() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("busy").unwrap();
    let guard = lock.acquire().await.unwrap();

    assert!(lock.try_acquire().await.unwrap().is_none());
    // Long enough for the first attempt to come back busy, so the acquisition waits (and is
    // contended) before the deadline; the lock stays held far longer.
    let err = lock
        .acquire_timeout(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    guard.release().await.unwrap();
    let won = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the release");
    won.release().await.unwrap();

    let events = capture.named("fencelock.acquire");
    let outcomes: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.field("outcome"),
                e.field("contended"),
                e.spans[0].1["method"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("acquired", "false", "acquire"),
            ("busy", "false", "try_acquire"),
            ("timeout", "true", "acquire_timeout"),
            ("acquired", "false", "try_acquire"),
        ]
    );
}

/// A multi-lock that fails is warned about; one that only timed out is not (a timeout is
/// the caller's own deadline, reported in the span like a single lock's).
#[tokio::test]
async fn a_failed_multi_lock_is_warned_about_and_a_timed_out_one_is_not() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = fx.client().await;
    let warnings = || {
        capture
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.level == tracing::Level::WARN)
            .map(|e| e.field("message").to_owned())
            .collect::<Vec<_>>()
    };

    let held = client.lock("pair:2").unwrap().acquire().await.unwrap();
    let pair = client.multi_lock(["pair:1", "pair:2"]).unwrap();
    let err = pair
        .acquire_timeout(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(warnings(), Vec::<String>::new());

    let key = fx.lock_key("pair:2").unwrap();
    held.release().await.unwrap();
    let _: () = fx.raw().set(&key, "foreign").unwrap();
    let err = pair.try_acquire().await.unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    assert_eq!(warnings(), ["multi-lock acquire failed"]);
}

#[tokio::test]
async fn a_deleted_lock_is_reported_lost_by_the_watchdog() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    // Renewals every 2 s: the watchdog notices the deletion within 2 s, while the lease (6 s)
    // leaves it at least 4 s before the loss could be blamed on the lease running out.
    let client = LockClient::builder(fx.server.url())
        .default_lease(Duration::from_secs(6))
        .connect()
        .await
        .unwrap();
    let guard = client.lock("doomed").unwrap().acquire().await.unwrap();
    let key = fx.lock_key("doomed").unwrap();
    let _: () = fx.raw().del(&key).unwrap();

    tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("the watchdog reports the deleted lock");
    let lost = capture.named("fencelock.lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    let lost = &lost[0];
    assert_eq!(lost.level, tracing::Level::WARN);
    assert_eq!(lost.field("lock"), "doomed");
    assert_eq!(lost.field("holder"), guard.holder_id());
    assert_eq!(lost.field("token"), guard.token().get().to_string());
    assert_eq!(
        lost.field("reason"),
        "renewal_refused",
        "the loss was not noticed by a renewal"
    );

    let renewals = capture.named("fencelock.renew");
    let refused = renewals
        .iter()
        .find(|e| e.field("lost") == "1")
        .unwrap_or_else(|| panic!("no renewal batch reported the loss: {renewals:?}"));
    assert_eq!(refused.field("outcome"), "ok");
    assert_eq!(refused.field("locks"), "1");
    assert_eq!(refused.field("renewed"), "0");

    let holder = guard.holder_id().to_owned();
    assert!(guard.release().await.unwrap_err().is_not_held());
    let released = capture.named("fencelock.release");
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(released[0].field("outcome"), "not_held");
    assert_eq!(released[0].field("holder"), holder);
    // Marked lost once, reported once.
    assert_eq!(capture.named("fencelock.lost").len(), 1);
}

#[tokio::test]
async fn a_dropped_guard_reports_its_background_release() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = fx.client().await;
    let guard = client.lock("dropped").unwrap().acquire().await.unwrap();
    let token = guard.token().get().to_string();
    drop(guard);
    assert!(
        eventually(Duration::from_secs(10), || !capture
            .named("fencelock.release")
            .is_empty())
        .await
    );
    let released = &capture.named("fencelock.release")[0];
    assert_eq!(released.field("method"), "drop");
    assert_eq!(released.field("outcome"), "released");
    assert_eq!(released.field("token"), token);
}

#[tokio::test]
async fn a_stale_write_is_reported() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("ledger").unwrap();
    let old = lock.acquire().await.unwrap();
    let old_token = old.token();
    old.release().await.unwrap();
    let new = lock.acquire().await.unwrap();
    let new_token = new.token();
    let resource = client.resource("ledger").unwrap();
    resource.set(new.token(), "new").await.unwrap();
    assert!(resource
        .set(old_token, "old")
        .await
        .unwrap_err()
        .is_stale_token());
    new.release().await.unwrap();

    let stale = capture.named("fencelock.stale_write");
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(stale[0].field("resource"), "ledger");
    assert_eq!(stale[0].field("presented"), old_token.get().to_string());
    assert_eq!(stale[0].field("latest"), new_token.get().to_string());
}

/// Connects to a server with `policy` and returns the eviction warnings the connect logged.
async fn eviction_warnings(policy: &str) -> Vec<Captured> {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let server = RedisServer::builder()
        .config("maxmemory-policy", policy)
        .start()
        .unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    // A few operations after the connect: the check runs once per connect, not per use.
    let guard = client.lock("x").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    capture.named("fencelock.eviction_risk")
}

#[tokio::test]
async fn an_evicting_maxmemory_policy_is_warned_about_once_per_connect() {
    let warnings = eviction_warnings("volatile-lru").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].level, tracing::Level::WARN);
    let message = warnings[0].field("message");
    assert!(message.contains("volatile-lru"), "{message}");
    assert!(message.contains("noeviction"), "{message}");

    let warnings = eviction_warnings("allkeys-lru").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].field("message").contains("fence counters"));

    assert!(eviction_warnings("noeviction").await.is_empty());
}

#[tokio::test]
async fn a_user_without_config_permission_connects_with_a_debug_note_instead_of_the_check() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let server = RedisServer::builder()
        .config("maxmemory-policy", "volatile-lru")
        .acl_lines([
            "user default off",
            "user admin on >admin-pw ~* &* +@all",
            // The README's least-privilege user (no CONFIG): connect checks its grant first.
            "user locks on >locks-pw resetkeys ~fencelock:* resetchannels &fencelock:* -@all \
             +evalsha +script|load +subscribe +unsubscribe +get +hget +lrange +set +del +type \
             +time +pttl +pexpire +hset +hexists +hincrby +incrby +rpush +publish +exists",
        ])
        .credentials("admin", "admin-pw")
        .start()
        .unwrap();
    let url = format!("redis://locks:locks-pw@127.0.0.1:{}/", server.port());
    let client = LockClient::connect(&url).await.unwrap();
    assert!(client
        .eviction_risk()
        .await
        .unwrap_err()
        .is_permission_denied());

    assert!(capture.named("fencelock.eviction_risk").is_empty());
    let notes = capture.named("fencelock.eviction_check_failed");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].level, tracing::Level::DEBUG);
    // Redis 7.0+ names the subcommand it refused, 6.2 only the command.
    let refused = if fencelock_testing::ServerBinary::current()
        .unwrap()
        .lacks(fencelock_testing::Feature::Redis7Commands)
        .is_some()
    {
        "'config'"
    } else {
        "config|get"
    };
    assert!(notes[0].field("error").contains(refused), "{notes:?}");
}

/// Connect checks the user's grant with one script call; when that call fails for another
/// reason than a refusal (here the server is busy running someone's script), the connect still
/// succeeds, with a DEBUG note, and the first real operation meets whatever the server says
/// then. Failing the connect would turn a moment of `BUSY` into an outage of the service.
#[tokio::test]
async fn a_permission_check_that_cannot_run_leaves_the_connect_alone() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    // The setting's name since 7.0; 6.2 calls it lua-time-limit.
    let busy_after = match fencelock_testing::ServerBinary::current()
        .unwrap()
        .lacks(fencelock_testing::Feature::Redis7Commands)
    {
        None => "busy-reply-threshold",
        Some(_) => "lua-time-limit",
    };
    let server = RedisServer::builder()
        .config(busy_after, "50")
        .start()
        .unwrap();
    let busy = std::thread::spawn({
        let client = server.client();
        move || {
            let mut con = client.get_connection().unwrap();
            redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query::<()>(&mut con)
                .unwrap_err()
        }
    });
    let mut admin = server.client().get_connection().unwrap();
    let is_busy = |admin: &mut redis::Connection| {
        redis::cmd("PING")
            .query::<String>(admin)
            .is_err_and(|e| e.code() == Some("BUSY"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !is_busy(&mut admin) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never got busy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let client = LockClient::connect(&server.url()).await.unwrap();
    let notes = capture.named("fencelock.permission_check_failed");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].level, tracing::Level::DEBUG);
    assert!(notes[0].field("error").contains("BUSY"), "{notes:?}");

    let _: () = redis::cmd("SCRIPT").arg("KILL").query(&mut admin).unwrap();
    let killed = busy.join().unwrap();
    assert!(killed.to_string().contains("killed"), "{killed}");
    let guard = client.lock("after").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn job_ticks_report_ran_and_skipped_with_the_runner() {
    use std::time::UNIX_EPOCH;
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = fx.client().await;
    let options = fencelock::JobOptions::new(Duration::from_secs(60), Duration::from_secs(5));
    let job = client.job("nightly", options).unwrap();
    let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let token = job
        .run_exclusive(tick, |run| async move { run.token() })
        .await
        .unwrap()
        .into_output()
        .unwrap();
    let again = job.run_exclusive(tick, |_run| async {}).await.unwrap();
    assert!(!again.ran());
    // Bad input is refused before anything happens: no event.
    let early = UNIX_EPOCH - Duration::from_secs(1);
    assert!(job.run_exclusive(early, |_run| async {}).await.is_err());

    let events = capture.named("fencelock.job");
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].field("job"), "nightly");
    assert_eq!(events[0].field("outcome"), "ran");
    assert_eq!(events[0].field("token"), token.get().to_string());
    assert_eq!(events[0].field("tick_ms"), "1800000000000");
    assert_eq!(events[1].field("outcome"), "skipped_done");
    assert_eq!(events[1].field("runner_token"), token.get().to_string());
}

#[tokio::test]
async fn leadership_changes_are_reported_with_the_term() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = fx.client().await;
    let election = client.election("scheduler").unwrap();
    let leader = election.campaign(b"a").await.unwrap();
    let (id, term) = (leader.id().to_owned(), leader.term());
    leader.resign().await.unwrap();
    // A deposed leader's resignation is not a change: no event.
    let deposed = election.campaign(b"b").await.unwrap();
    let _: () =
        redis::Commands::del(&mut fx.raw(), fx.keys("fencelock:{*}leader:scheduler")).unwrap();
    assert!(deposed.resign().await.unwrap_err().is_not_held());

    let events = capture.named("fencelock.leader");
    let changes: Vec<&str> = events.iter().map(|e| e.field("change")).collect();
    assert_eq!(changes, ["elected", "resigned", "elected"], "{events:?}");
    assert_eq!(events[0].field("election"), "scheduler");
    assert_eq!(events[0].field("leader"), id);
    assert_eq!(events[0].field("term"), term.get().to_string());
    assert_eq!(events[1].field("term"), term.get().to_string());
}

/// A key reused for another request is the client's mistake, answered (a 422 in an HTTP
/// service): its event stays at DEBUG, as the observability table says, so that ordinary
/// refusals are no warnings; a run that failed is still a warning.
#[tokio::test]
async fn a_reused_idempotency_key_is_logged_at_debug_not_as_a_warning() {
    let capture = Capture::default();
    let _subscriber = capture.install();
    let fx = Fixture::start();
    let client = LockClient::connect(&fx.server.url()).await.unwrap();
    let keys = client
        .idempotency(
            "orders",
            fencelock::IdempotencyOptions::new(Duration::from_secs(10)),
        )
        .unwrap();
    let run = |request: &'static str| {
        keys.run("order-1", request, |_run| async {
            Ok::<_, fencelock::Failure<()>>(b"done".to_vec())
        })
    };
    assert!(run("amount=5").await.unwrap().ran());
    let reused = run("amount=500").await.unwrap_err();
    assert!(
        matches!(reused, fencelock::Error::KeyReused { .. }),
        "{reused}"
    );

    let events = capture.named("fencelock.idempotent");
    let refusal = events
        .iter()
        .find(|e| e.field("outcome") == "key_reused")
        .unwrap_or_else(|| panic!("no key_reused event: {events:?}"));
    assert_eq!(refusal.level, tracing::Level::DEBUG, "{refusal:?}");
    assert_eq!(refusal.field("key"), "order-1");
    assert!(
        events.iter().all(|e| e.level != tracing::Level::WARN),
        "{events:?}"
    );
}
