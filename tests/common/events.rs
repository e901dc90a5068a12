//! The library's trace events in this test process, counted per client, per channel and per
//! holder. One global subscriber serves every test of a binary (the runtime threads a test
//! starts are not the test's own, so a thread's default would miss them), and each count is
//! keyed by what a test owns (its client's id, its lock's name, its holders' ids), so tests
//! that run at once in one binary never read each other's events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

#[derive(Default)]
struct Counts {
    /// `fencelock.handoff` events per releasing client (the `from` holder's client id).
    handoffs: Mutex<HashMap<String, u64>>,
    /// `fencelock.batch` events per client.
    batches: Mutex<HashMap<String, u64>>,
    /// `fencelock.wait` events per channel.
    waits: Mutex<HashMap<String, u64>>,
    /// When each holder took its place in its client's queue (on [`tick`]'s clock), and how
    /// many waiters of its client were ahead of it.
    entered: Mutex<HashMap<String, (u64, usize)>>,
    clock: AtomicU64,
}

/// How many releases of the client with this id handed a lock or permits on to one of its own
/// waiting tasks (`fencelock.handoff` events).
pub fn handoffs_of(client: &str) -> u64 {
    counts()
        .handoffs
        .lock()
        .unwrap()
        .get(client)
        .copied()
        .unwrap_or(0)
}

/// How many script calls the client with this id shared between operations
/// (`fencelock.batch` events).
pub fn batches_of(client: &str) -> u64 {
    counts()
        .batches
        .lock()
        .unwrap()
        .get(client)
        .copied()
        .unwrap_or(0)
}

/// How many acquisitions of this process have queued to wait on a channel ending with
/// `suffix` (the channel is the key of the lock or semaphore they wait for, `sem:<name>` at its
/// end for a semaphore): the `fencelock.wait` events naming it. A test whose lock has a name of
/// its own can wait until its waiters are queued.
pub fn waits_on(suffix: &str) -> u64 {
    let waits = counts().waits.lock().unwrap();
    waits
        .iter()
        .filter(|(channel, _)| channel.ends_with(suffix))
        .map(|(_, count)| count)
        .sum()
}

/// When the holder with this id took its place in its client's queue, on [`tick`]'s clock,
/// and how many waiters of its client were ahead of it; `None` for an acquisition that never
/// queued (it found the lock free).
pub fn entered(holder: &str) -> Option<(u64, usize)> {
    counts().entered.lock().unwrap().get(holder).copied()
}

/// The next instant of one process-wide clock, which also stamps every queued wait: a test
/// stamps its grants with it to order them against the waits.
pub fn tick() -> u64 {
    counts().clock.fetch_add(1, Ordering::SeqCst)
}

/// Installs the binary's process-wide subscriber, if no test did yet. A test that captures
/// events with a subscriber of its own thread (`tracing::subscriber::set_default`) calls this
/// first: tracing decides once per process whether an event's call site is enabled, from the
/// subscriber of the first thread that reaches it, so a call site that another test's thread,
/// without any subscriber, reached first would be cached as disabled, and the capture would
/// see nothing from it. With the process-wide subscriber that first look says yes; events
/// still go to the subscriber of the thread that emits them.
pub fn install_process_subscriber() {
    counts();
}

fn counts() -> &'static Counts {
    static COUNTS: OnceLock<&'static Counts> = OnceLock::new();
    COUNTS.get_or_init(|| {
        let counts: &'static Counts = Box::leak(Box::default());
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Count(counts)))
            .expect("no other global subscriber in the test binaries");
        counts
    })
}

struct Count(&'static Counts);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let name = event.metadata().name();
        if !matches!(
            name,
            "fencelock.handoff" | "fencelock.batch" | "fencelock.wait"
        ) {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let field = |value: Option<String>, what: &str| {
            value.unwrap_or_else(|| panic!("{name} names its {what}: {event:?}"))
        };
        let bump = |map: &Mutex<HashMap<String, u64>>, key: String| {
            *map.lock().unwrap().entry(key).or_default() += 1;
        };
        match name {
            "fencelock.handoff" => {
                let from = field(fields.from, "releasing holder");
                // A holder id is its client's id, then a sequence number.
                let client = from
                    .rsplit_once(':')
                    .map_or(from.as_str(), |(client, _)| client);
                bump(&self.0.handoffs, client.to_owned());
            }
            "fencelock.batch" => bump(&self.0.batches, field(fields.client, "client")),
            _ => {
                let channel = field(fields.channel, "channel");
                let holder = field(fields.holder, "holder");
                let ahead = fields
                    .ahead
                    .expect("fencelock.wait names the waiters ahead");
                let at = self.0.clock.fetch_add(1, Ordering::SeqCst);
                bump(&self.0.waits, channel);
                let ahead = usize::try_from(ahead).unwrap();
                self.0.entered.lock().unwrap().insert(holder, (at, ahead));
            }
        }
    }
}

/// The fields the counts are keyed by (strings recorded as `Display` arrive through
/// `record_debug`, plain `&str` through `record_str`).
#[derive(Default)]
struct Fields {
    from: Option<String>,
    client: Option<String>,
    channel: Option<String>,
    holder: Option<String>,
    ahead: Option<u64>,
}

impl Fields {
    fn set(&mut self, field: &Field, value: String) {
        match field.name() {
            "from" => self.from = Some(value),
            "client" => self.client = Some(value),
            "channel" => self.channel = Some(value),
            "holder" => self.holder = Some(value),
            _ => {}
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "ahead" {
            self.ahead = Some(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.set(field, format!("{value:?}"));
    }
}
