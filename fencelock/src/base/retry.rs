//! The one retry policy of the crate: exponential backoff with jitter (from `backon`), bounded
//! by a window.
//!
//! Every loop that re-sends a request (an operation whose outcome is unknown, a replicated
//! acquisition looking for its primary) and every loop that tries again after a failure (the
//! watchdog's renewals) takes its pauses from here. The jitter matters: the failures that make
//! clients retry (a restart, a failover, a network blip) hit every client at once, and pauses
//! of exactly 5, 10, 20 ms would bring them back at once too.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// First pause before a re-send with the same operation id.
const FIRST_RESEND_PAUSE: Duration = Duration::from_millis(5);

/// Longest pause between re-sends: a primary that is back (a failover ended, a server finished
/// loading) should not wait long for the next attempt.
const MAX_RESEND_PAUSE: Duration = Duration::from_millis(250);

/// Pauses that start at `first` and double up to `max`, each stretched by a random factor in
/// `[1, 2)`. Never ends: the caller bounds it.
pub(crate) fn backoff(first: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The re-sends of one operation: pauses from [`backoff`] for as long as the next attempt
/// still starts inside the window that opened with the first attempt.
#[derive(Debug)]
pub(crate) struct Resends {
    started: Instant,
    window: Duration,
    pauses: ExponentialBackoff,
}

impl Resends {
    /// Opens the window: call it right before the first attempt.
    pub(crate) fn new(window: Duration) -> Resends {
        Resends {
            started: Instant::now(),
            window,
            pauses: backoff(FIRST_RESEND_PAUSE, MAX_RESEND_PAUSE),
        }
    }

    /// How long to pause before the next attempt, or `None` when that attempt would start
    /// after the window closed (then the last error stands).
    pub(crate) fn next_pause(&mut self) -> Option<Duration> {
        let pause = self.pauses.next()?;
        (self.started.elapsed() + pause < self.window).then_some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_with_jitter_and_stay_under_twice_the_cap() {
        let ms = Duration::from_millis;
        let pauses: Vec<Duration> = backoff(ms(5), ms(250)).take(12).collect();
        let mut nominal = ms(5);
        for pause in &pauses {
            assert!(
                *pause >= nominal && *pause < nominal * 2,
                "{pause:?} for {nominal:?}"
            );
            nominal = (nominal * 2).min(ms(250));
        }
    }

    #[test]
    fn the_window_bounds_the_resends() {
        let mut resends = Resends::new(Duration::from_millis(100));
        let mut total = Duration::ZERO;
        while let Some(pause) = resends.next_pause() {
            total += pause;
            // Time passes as if each pause had been slept.
            resends.started -= pause;
        }
        assert!(total < Duration::from_millis(100), "{total:?}");
        let mut closed = Resends::new(Duration::ZERO);
        assert_eq!(closed.next_pause(), None);
    }
}
