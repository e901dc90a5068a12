//! Counts of the library's trace events in this test process.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Counts the `fencelock.handoff` and `fencelock.batch` events of this process, in that order
/// (a global subscriber, installed on first use: the runtime threads a test starts are not
/// the test's own).
pub fn event_counts() -> &'static [AtomicU64; 2] {
    &counters().0
}

/// How many acquisitions of this process have queued to wait on a channel ending with
/// `suffix` (the channel is the key of the lock or semaphore they wait for, `sem:<name>` at its
/// end for a semaphore): the `fencelock.wait` events naming it. A test whose lock has a name of
/// its own can wait until its waiters are queued.
pub fn waits_on(suffix: &str) -> u64 {
    let waits = counters().1.lock().unwrap();
    waits
        .iter()
        .filter(|(channel, _)| channel.ends_with(suffix))
        .map(|(_, count)| count)
        .sum()
}

type Counters = ([AtomicU64; 2], Mutex<HashMap<String, u64>>);

fn counters() -> &'static Counters {
    static COUNTS: std::sync::OnceLock<Counters> = std::sync::OnceLock::new();
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    let counts = COUNTS.get_or_init(|| {
        (
            [AtomicU64::new(0), AtomicU64::new(0)],
            Mutex::new(HashMap::new()),
        )
    });
    struct Count(&'static Counters);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            match event.metadata().name() {
                "fencelock.handoff" => {
                    self.0 .0[0].fetch_add(1, Relaxed);
                }
                "fencelock.batch" => {
                    self.0 .0[1].fetch_add(1, Relaxed);
                }
                "fencelock.wait" => {
                    let mut channel = ChannelField(None);
                    event.record(&mut channel);
                    let channel = channel.0.expect("fencelock.wait names its channel");
                    *self.0 .1.lock().unwrap().entry(channel).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    INSTALLED.call_once(|| {
        // Another subscriber set first (none in these binaries) would only hide the count.
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(Count(counts)),
        );
    });
    counts
}

/// The `channel` field of an event (recorded as `Display`, so through `record_debug`).
struct ChannelField(Option<String>);

impl Visit for ChannelField {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "channel" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}
