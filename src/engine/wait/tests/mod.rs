//! The queue's hand-offs, without Redis: the channels are marked subscribed up front, so
//! `enter` never needs a connection. Every timing assertion below compares two timers set
//! seconds apart (a deadline against a lease), or is a lower bound a timer guarantees; none
//! depends on how fast the machine is.
use super::*;

/// The queue against a simulated connection's links (subscribe, unsubscribe, re-subscribe).
mod links;

/// The whole waiting machinery, explored deterministically against a simulated server.
mod exploration;

pub(super) const CHANNEL: &[u8] = b"fencelock:{0}lock:test";
/// Far beyond every deadline used here: a head that wakes before a deadline did not wake
/// for this lease.
pub(super) const LONG_LEASE: Duration = Duration::from_secs(30);

fn subscribed_to(channels: &[&[u8]]) -> Arc<Waiters> {
    let waiters = Arc::new(Waiters::default());
    let mut subscribed = waiters.subscribed.try_lock().unwrap();
    subscribed.extend(channels.iter().map(|c| c.to_vec()));
    drop(subscribed);
    waiters
}

pub(super) fn in_secs(secs: f64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs_f64(secs))
}

/// A head whose first look at Redis is behind it (the wake-up `enter` gives a first waiter),
/// answered.
pub(super) async fn head(waiters: &Arc<Waiters>, channel: &[u8]) -> WaitEntry {
    let head = waiters.enter(channel, None).await.unwrap();
    assert_eq!(head.wait(None).await, Wake::Try, "a first waiter asks once");
    head.answered();
    head
}

/// A queue on [`CHANNEL`] with an answered head and a second waiter behind it.
async fn head_and_next() -> (Arc<Waiters>, WaitEntry, WaitEntry) {
    let waiters = subscribed_to(&[CHANNEL]);
    let first = head(&waiters, CHANNEL).await;
    let second = waiters.enter(CHANNEL, None).await.unwrap();
    (waiters, first, second)
}

pub(super) async fn is_subscribed(waiters: &Arc<Waiters>, channel: &[u8]) -> bool {
    // Let the spawned unsubscribe decision run first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    waiters.subscribed.lock().await.contains(channel)
}

#[tokio::test]
async fn only_the_first_waiter_asks_redis_on_entering() {
    let (_waiters, _first, second) = head_and_next().await;
    assert_eq!(second.wait(in_secs(0.3)).await, Wake::Deadline);
}

#[tokio::test]
async fn a_head_that_leaves_with_an_unused_wake_hands_it_on() {
    let (waiters, first, second) = head_and_next().await;
    first.observed_lease(Some(LONG_LEASE));
    waiters.on_message(CHANNEL, b"released");
    drop(first); // cancelled before it used the wake
    assert_eq!(second.wait(in_secs(2.0)).await, Wake::Try);
}

#[tokio::test]
async fn a_waiter_that_tried_and_gave_up_hands_its_wake_on() {
    let (_waiters, first, second) = head_and_next().await;
    first.observed_lease(Some(LONG_LEASE));
    first.hand_on(); // a multi-lock whose other member was busy
    drop(first);
    assert_eq!(second.wait(in_secs(1.5)).await, Wake::Try);
}

#[tokio::test]
async fn a_winner_holds_the_next_waiter_for_its_lease() {
    let (waiters, first, second) = head_and_next().await;
    // A release message that arrived while the head was in Redis winning the lock: the
    // lock is the head's now, so the wake must not pass to the next waiter.
    waiters.on_message(CHANNEL, b"released");
    first.acquired(LONG_LEASE);
    assert_eq!(second.wait(in_secs(1.5)).await, Wake::Deadline);
}

#[tokio::test]
async fn a_new_head_rearms_its_timer_from_the_winners_lease() {
    let (_waiters, first, second) = head_and_next().await;
    // Not the head and no deadline: parked with no timer at all.
    let parked = tokio::spawn(async move {
        let wake = second.wait(None).await;
        (wake, second)
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!parked.is_finished());
    first.acquired(Duration::from_millis(50));
    let woken = tokio::time::timeout(Duration::from_secs(20), parked).await;
    let (wake, _second) = woken.expect("the new head never woke").unwrap();
    assert_eq!(wake, Wake::Try);
}

#[tokio::test]
async fn a_head_without_a_known_lease_asks_again_after_a_second() {
    let waiters = subscribed_to(&[CHANNEL]);
    let head = head(&waiters, CHANNEL).await;
    assert_eq!(head.wait(in_secs(0.5)).await, Wake::Deadline);
    assert_eq!(head.wait(in_secs(10.0)).await, Wake::Try);
}

#[tokio::test]
async fn a_head_sleeps_for_the_observed_lease() {
    let waiters = subscribed_to(&[CHANNEL]);
    let head = head(&waiters, CHANNEL).await;
    head.observed_lease(Some(Duration::from_secs(3)));
    assert_eq!(head.wait(in_secs(1.5)).await, Wake::Deadline);
    head.observed_lease(Some(Duration::from_millis(10)));
    assert_eq!(head.wait(in_secs(10.0)).await, Wake::Try);
}

#[tokio::test]
async fn a_reconnect_sends_every_head_to_redis_spread_over_the_jitter() {
    let channels: Vec<Vec<u8>> = (0..32).map(|i| format!("lock:{i}").into_bytes()).collect();
    let names: Vec<&[u8]> = channels.iter().map(Vec::as_slice).collect();
    let waiters = subscribed_to(&names);
    let mut heads = Vec::new();
    for channel in &names {
        let head = head(&waiters, channel).await;
        head.observed_lease(Some(LONG_LEASE));
        heads.push(head);
    }
    let started = Instant::now();
    waiters.on_disconnect();
    let mut waits = tokio::task::JoinSet::new();
    for head in heads {
        waits.spawn(async move { (head.wait(in_secs(5.0)).await, started.elapsed()) });
    }
    let mut waited = Vec::new();
    while let Some(done) = waits.join_next().await {
        let (wake, after) = done.unwrap();
        assert_eq!(wake, Wake::Try);
        waited.push(after);
    }
    // Each head sleeps its own draw in [0, 20 ms) and a sleep never ends early, so the
    // longest wait is at least the largest draw; 32 draws all below 5 ms have odds of 4^-32.
    let longest = waited.iter().max().unwrap();
    assert!(*longest >= HERD_JITTER / 4, "no jitter: {waited:?}");
}

#[tokio::test]
async fn a_deadline_inside_the_jitter_ends_the_wait() {
    let waiters = subscribed_to(&[CHANNEL]);
    let head = head(&waiters, CHANNEL).await;
    waiters.on_disconnect();
    assert_eq!(head.wait(Some(Instant::now())).await, Wake::Deadline);
}

#[tokio::test]
async fn a_moved_channel_with_waiters_sends_its_head_to_redis() {
    let waiters = subscribed_to(&[CHANNEL]);
    let head = head(&waiters, CHANNEL).await;
    head.observed_lease(Some(LONG_LEASE));
    waiters.clone().on_subscription_lost(CHANNEL);
    assert_eq!(head.wait(in_secs(3.0)).await, Wake::Try);
    // Re-subscribing failed (no connection here), so the channel is no longer counted as
    // subscribed and the next waiter to enter subscribes again.
    assert!(!is_subscribed(&waiters, CHANNEL).await);
}

#[tokio::test]
async fn the_last_waiter_to_leave_unsubscribes_unless_a_newcomer_arrived() {
    let waiters = subscribed_to(&[CHANNEL]);
    let first = waiters.enter(CHANNEL, None).await.unwrap();
    drop(first);
    // The newcomer enters before the unsubscribe decision runs, and relies on the
    // subscription it found.
    let newcomer = waiters.enter(CHANNEL, None).await.unwrap();
    assert!(is_subscribed(&waiters, CHANNEL).await);
    drop(newcomer);
    assert!(!is_subscribed(&waiters, CHANNEL).await);
}

#[tokio::test]
async fn an_election_message_wakes_followers_and_no_waiter() {
    let waiters = subscribed_to(&[CHANNEL]);
    let head = head(&waiters, CHANNEL).await;
    head.observed_lease(Some(LONG_LEASE));
    let follower = waiters.observe(CHANNEL).await.unwrap();
    let far = Instant::now() + LONG_LEASE;

    waiters.on_message(CHANNEL, b"elected");
    let woke = tokio::time::timeout(Duration::from_secs(2), follower.next_event(far)).await;
    assert!(woke.is_ok(), "the follower slept through an election");
    assert_eq!(
        head.wait(in_secs(0.3)).await,
        Wake::Deadline,
        "an election woke a waiter"
    );

    // A release wakes both; a reconnect wakes both.
    for reconnect in [false, true] {
        if reconnect {
            waiters.on_disconnect();
        } else {
            waiters.on_message(CHANNEL, b"released");
        }
        let woke = tokio::time::timeout(Duration::from_secs(2), follower.next_event(far)).await;
        assert!(
            woke.is_ok(),
            "the follower slept through a release or reconnect"
        );
        assert_eq!(head.wait(in_secs(2.0)).await, Wake::Try);
    }
    // A follower woken by nothing waits until its own deadline.
    let started = Instant::now();
    follower
        .next_event(Instant::now() + Duration::from_millis(200))
        .await;
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn a_follower_keeps_the_subscription_until_the_last_one_leaves() {
    let waiters = subscribed_to(&[CHANNEL]);
    let follower = waiters.observe(CHANNEL).await.unwrap();
    let waiter = waiters.enter(CHANNEL, None).await.unwrap();
    drop(waiter);
    assert!(
        is_subscribed(&waiters, CHANNEL).await,
        "a follower still needs it"
    );
    drop(follower);
    assert!(!is_subscribed(&waiters, CHANNEL).await);
}

/// Timer and reconnect wake-ups of many processes land together; the jitter must spread
/// them over its whole window, never beyond it.
#[test]
fn herd_jitter_spreads_retries_over_its_window() {
    let waiters = Waiters::default();
    let draws: Vec<Duration> = (0..200).map(|_| waiters.jitter()).collect();
    assert!(draws.iter().all(|d| *d < HERD_JITTER), "{draws:?}");
    let distinct: HashSet<Duration> = draws.iter().copied().collect();
    assert!(
        distinct.len() > 100,
        "only {} distinct delays",
        distinct.len()
    );
    assert!(draws.iter().any(|d| *d < HERD_JITTER / 4));
    assert!(draws.iter().any(|d| *d >= HERD_JITTER * 3 / 4));
}
