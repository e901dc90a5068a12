//! The one retry policy of the crate: exponential backoff with jitter (from `backon`), bounded
//! by a window; and the one retry loop, [`retry`].
//!
//! Every request that is tried again (an operation whose outcome is unknown, a replicated
//! acquisition looking for its primary, a connection being made, a channel subscribed again)
//! goes through [`retry`] with its pauses from here; the watchdog, which renews on a schedule
//! rather than retrying one request, takes its pauses after a failure from here too. Every
//! window that bounds the re-sends of one operation is here ([`Resends`], [`waiting_window`]). The jitter matters: the failures that make
//! clients retry (a restart, a failover, a network blip) hit every client at once, and pauses
//! of exactly 5, 10, 20 ms would bring them back at once too.

use std::future::Future;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use super::error::{Error, ErrorClass};

/// The crate's one retry loop: runs `attempt` until it succeeds, or fails in a way that
/// `again` does not retry, or `pauses` runs out; then the last failure stands. Between
/// attempts it sleeps the next pause.
///
/// Written here rather than with `backon`'s `Retryable`: the hot path's attempt future is
/// awaited in place, with no layer around it (each layer that holds a future and awaits it
/// doubles its size), and the re-send window is `Resends`, not a count.
pub(crate) async fn retry<T, E, Fut>(
    mut pauses: impl Iterator<Item = Duration>,
    mut attempt: impl FnMut() -> Fut,
    mut again: impl FnMut(&E) -> bool,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    loop {
        let err = match attempt().await {
            Ok(done) => return Ok(done),
            Err(err) => err,
        };
        match pauses.next() {
            Some(pause) if again(&err) => tokio::time::sleep(pause).await,
            _ => return Err(err),
        }
    }
}

/// Whether an operation that failed with `err` is sent again with the same op id: only after a
/// transient failure (its outcome unknown, or a primary that moved), which is logged as `what`.
pub(crate) fn resend_after(err: &Error, what: &str) -> bool {
    let transient = err.class().is_some_and(ErrorClass::is_transient);
    if transient {
        tracing::debug!(error = %err, "{what}");
    }
    transient
}

/// First pause before a re-send with the same operation id.
const FIRST_RESEND_PAUSE: Duration = Duration::from_millis(5);

/// Longest pause between re-sends: a primary that is back (a failover ended, a server finished
/// loading) should not wait long for the next attempt.
const MAX_RESEND_PAUSE: Duration = Duration::from_millis(250);

/// Pauses that start at `first` and double up to `max`, each stretched by a random factor in
/// `[1, 2)`. Never ends: the caller bounds it.
pub(crate) fn backoff(first: Duration, max: Duration) -> ExponentialBackoff {
    jittered(first, max).build()
}

/// The pauses between re-sends of one request (as [`Resends`]: from the first re-send pause
/// doubling to the longest, with jitter), drawn from `seed`, and never ending: for the
/// waiters' re-subscription, which goes on as long as someone waits (a unit test gives the
/// seed, so that its run replays).
pub(crate) fn resend_pauses(seed: u64) -> ExponentialBackoff {
    jittered(FIRST_RESEND_PAUSE, MAX_RESEND_PAUSE)
        .with_jitter_seed(seed)
        .build()
}

/// The one backoff of [`backoff`] and [`resend_pauses`], before its jitter is seeded.
fn jittered(first: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
}

/// The window for the attempts of an acquirer that is already waiting for the lock: until the
/// caller's deadline (without one, no end), never shorter than the client's `retry_window`.
///
/// Such an acquirer waits for the lock, not for one request: a server restart or a network
/// outage longer than the retry window would otherwise end a wait that had most of its time
/// left, while the holder's watchdog rides out the same outage until its lease ends. Its
/// re-sends also keep the connection reconnecting: it gives up after its own few tries and
/// starts again only when a request fails on it.
pub(crate) fn waiting_window(retry_window: Duration, deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(deadline) => deadline
            .saturating_duration_since(Instant::now())
            .max(retry_window),
        None => Duration::MAX,
    }
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
}

impl Iterator for Resends {
    type Item = Duration;

    /// How long to pause before the next attempt, or `None` when that attempt would start
    /// after the window closed (then the last error stands).
    fn next(&mut self) -> Option<Duration> {
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
    fn a_waiter_retries_until_its_deadline_and_never_less_than_the_window() {
        let window = Duration::from_secs(3);
        let far = Instant::now() + Duration::from_secs(30);
        assert!(waiting_window(window, Some(far)) > Duration::from_secs(29));
        assert_eq!(waiting_window(window, Some(Instant::now())), window);
        assert_eq!(waiting_window(window, None), Duration::MAX);
        // An open-ended window never closes.
        let mut resends = Resends::new(Duration::MAX);
        resends.started -= Duration::from_secs(3600);
        assert!(resends.next().is_some());
    }

    #[test]
    fn the_window_bounds_the_resends() {
        let mut resends = Resends::new(Duration::from_millis(100));
        let mut total = Duration::ZERO;
        while let Some(pause) = resends.next() {
            total += pause;
            // Time passes as if each pause had been slept.
            resends.started -= pause;
        }
        assert!(total < Duration::from_millis(100), "{total:?}");
        let mut closed = Resends::new(Duration::ZERO);
        assert_eq!(closed.next(), None);
    }
}
