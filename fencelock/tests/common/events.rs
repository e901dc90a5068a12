//! Counts of the library's trace events in this test process.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use tracing_subscriber::layer::{Context, SubscriberExt};

/// Counts the `fencelock.handoff` and `fencelock.batch` events of this process, in that order
/// (a global subscriber, installed on first use: the runtime threads a test starts are not
/// the test's own).
pub fn event_counts() -> &'static [AtomicU64; 2] {
    static COUNTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    struct Count;
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            match event.metadata().name() {
                "fencelock.handoff" => COUNTS[0].fetch_add(1, Relaxed),
                "fencelock.batch" => COUNTS[1].fetch_add(1, Relaxed),
                _ => 0,
            };
        }
    }
    INSTALLED.call_once(|| {
        // Another subscriber set first (none in these binaries) would only hide the count.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Count));
    });
    &COUNTS
}
