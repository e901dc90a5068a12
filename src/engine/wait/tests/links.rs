//! The waiters' own requests (SUBSCRIBE, UNSUBSCRIBE, `leave_fair`) through a test link
//! ([`TestLink`]) instead of a connection, so that a test decides how each one ends: the seam
//! itself, and the wake-ups that were lost when a request failed or a waiter left at the
//! wrong moment. The tests run on a paused clock, so their timers are virtual: a deadline
//! against a lease timer or a second's recheck compares instants, whatever the machine's load.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::{now, FairExit, TestFuture, TestLink, Waiters, Wake};
use super::{head, is_subscribed, CHANNEL, LONG_LEASE};
use crate::base::error::Error;
use crate::protocol::LockKeys;
use crate::transport::PushListener;

/// Records what the waiters send. A SUBSCRIBE fails as on a lost connection while `failures`
/// lasts, then is redirected (`MOVED`, as the cluster client returns it once its own re-sends
/// are spent) while `redirects` lasts, and never completes while `stalled`.
#[derive(Default)]
struct Recorder {
    sent: parking_lot::Mutex<Vec<&'static str>>,
    failures: AtomicUsize,
    redirects: AtomicUsize,
    stalled: AtomicBool,
}

/// Takes one from `counter` if it is above zero.
fn take_one(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

impl Recorder {
    fn count(&self, what: &str) -> usize {
        self.sent
            .lock()
            .iter()
            .filter(|sent| **sent == what)
            .count()
    }
}

/// The herd jitter through the link: 12.345 ms.
const RANDOM: u64 = 12_345;

impl TestLink for Recorder {
    fn subscribe(&self, _channel: &[u8]) -> TestFuture<Result<(), Error>> {
        self.sent.lock().push("subscribe");
        let fails = take_one(&self.failures);
        let redirected = !fails && take_one(&self.redirects);
        let stalled = self.stalled.load(Ordering::Acquire);
        Box::pin(async move {
            if stalled {
                std::future::pending::<()>().await;
            }
            if fails {
                let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                return Err(redis::RedisError::from(io).into());
            }
            if redirected {
                let moved = redis::parse_redis_value(b"-MOVED 14604 127.0.0.1:7001\r\n")
                    .expect("a MOVED reply")
                    .extract_error()
                    .expect_err("an error reply");
                return Err(moved.into());
            }
            Ok(())
        })
    }

    fn unsubscribe(&self, _channel: &[u8]) -> TestFuture<Result<(), Error>> {
        self.sent.lock().push("unsubscribe");
        Box::pin(async { Ok(()) })
    }

    fn leave_fair(&self, _fair: &FairExit) -> TestFuture<()> {
        self.sent.lock().push("leave_fair");
        Box::pin(async {})
    }

    fn random(&self) -> u64 {
        RANDOM
    }
}

/// A deadline `secs` from now on the (paused) clock.
fn after(secs: f64) -> Option<Instant> {
    Some(now() + Duration::from_secs_f64(secs))
}

fn linked(link: &Arc<Recorder>) -> Arc<Waiters> {
    let waiters = Arc::new(Waiters::default());
    waiters.set_test_link(link.clone());
    waiters
}

#[tokio::test(start_paused = true)]
async fn the_waiters_own_requests_go_through_the_test_link() {
    let link = Arc::new(Recorder::default());
    let waiters = linked(&link);
    let keys = Arc::new(LockKeys::new(b"fencelock:", b"seam"));
    let fair = FairExit {
        keys: keys.clone(),
        client: "client".into(),
        grace: Duration::from_secs(1),
    };
    let entry = waiters.enter(&keys.lock, Some(fair)).await.unwrap();
    assert!(is_subscribed(&waiters, &keys.lock).await);
    drop(entry);
    assert!(!is_subscribed(&waiters, &keys.lock).await);
    assert_eq!(
        *link.sent.lock(),
        ["subscribe", "leave_fair", "unsubscribe"]
    );
    assert_eq!(waiters.jitter(), Duration::from_micros(RANDOM));
}

/// A SUBSCRIBE whose connection dropped under it leaves no subscription (the old connection's
/// went with it, and the transport restores only those whose confirmation it read): it is
/// sent again, and the head then looks at Redis. Given up instead, every later release went
/// unheard, the waiters left to their lease timers until a newcomer subscribed.
#[tokio::test(start_paused = true)]
async fn a_subscribe_lost_with_the_connection_is_sent_again() {
    let link = Arc::new(Recorder::default());
    link.failures.store(1, Ordering::Release);
    let waiters = linked(&link);
    let head = head(&waiters, CHANNEL).await;
    head.observed_lease(Some(LONG_LEASE));
    assert_eq!(
        head.wait(after(2.0)).await,
        Wake::Try,
        "the head was not sent to Redis once subscribed again"
    );
    assert!(is_subscribed(&waiters, CHANNEL).await);
    assert_eq!(link.count("subscribe"), 2);
}

/// The same for a channel whose slot moved (cluster): its new SUBSCRIBE is sent until it
/// goes through, not tried once and forgotten.
#[tokio::test(start_paused = true)]
async fn a_moved_channel_is_subscribed_again_through_a_lost_connection() {
    subscribed_again_through(|link| link.failures.store(2, Ordering::Release), 2.0, 4).await;
}

/// A re-subscription redirected while a slot move completes (the node that handed the slot
/// over names the new owner, which does not know yet that it owns it, and names the old one)
/// is sent again until it lands. Given up on the first `MOVED`, it left the waiters without a
/// subscription: every release until the next newcomer was heard only by the head's lease
/// timer (found on a cluster under load: a waiter stranded behind a released lock).
#[tokio::test(start_paused = true)]
async fn a_redirected_re_subscription_is_sent_again_until_it_lands() {
    subscribed_again_through(|link| link.redirects.store(3, Ordering::Release), 5.0, 5).await;
}

/// A head's channel whose subscription was lost (its slot moved), with `trouble` set on the
/// link before: the new SUBSCRIBE lands within `secs` and wakes the head, after `subscribes`
/// SUBSCRIBEs in all.
async fn subscribed_again_through(trouble: impl FnOnce(&Recorder), secs: f64, subscribes: usize) {
    let link = Arc::new(Recorder::default());
    let waiters = linked(&link);
    let head = head(&waiters, CHANNEL).await;
    head.observed_lease(Some(LONG_LEASE));
    trouble(&link);
    waiters.clone().on_subscription_lost(CHANNEL);
    assert_eq!(head.wait(after(secs)).await, Wake::Try);
    assert!(
        is_subscribed(&waiters, CHANNEL).await,
        "the waiters stay without a subscription"
    );
    assert_eq!(link.count("subscribe"), subscribes);
}

/// A newcomer whose first SUBSCRIBE is redirected (a slot move completing) still joins the
/// queue, and is subscribed in the background, as after a lost connection.
#[tokio::test(start_paused = true)]
async fn a_redirected_first_subscription_does_not_end_the_wait() {
    let link = Arc::new(Recorder::default());
    let waiters = linked(&link);
    link.redirects.store(2, Ordering::Release);
    let entry = waiters
        .enter(CHANNEL, None)
        .await
        .expect("a redirect does not end the wait");
    entry.observed_lease(Some(LONG_LEASE));
    assert_eq!(entry.wait(after(5.0)).await, Wake::Try);
    assert!(is_subscribed(&waiters, CHANNEL).await);
    assert_eq!(link.count("subscribe"), 3);
}

/// A head that took a wake-up but leaves before an attempt it led to was answered (here:
/// dropped in its reconnect jitter; the same for a deadline there, or an attempt an outage
/// held until the deadline) hands it on. Taken and lost, the release it stood for was lost
/// for everyone behind it: they slept until the lease ran out.
#[tokio::test(start_paused = true)]
async fn a_head_that_leaves_with_a_wake_up_in_hand_hands_it_on() {
    let link = Arc::new(Recorder::default());
    let waiters = linked(&link);
    let first = head(&waiters, CHANNEL).await;
    let second = waiters.enter(CHANNEL, None).await.unwrap();
    first.observed_lease(Some(LONG_LEASE));
    waiters.on_disconnect();
    // The head takes the wake-up and sleeps its jitter (12 ms here), and is dropped there.
    let jittering = tokio::time::timeout(Duration::from_millis(1), first.wait(None)).await;
    assert!(jittering.is_err(), "no jitter before going to Redis");
    drop(first);
    assert_eq!(second.wait(after(2.0)).await, Wake::Try);

    // A release message taken, and an attempt not answered.
    let third = waiters.enter(CHANNEL, None).await.unwrap();
    second.answered();
    waiters.on_message(CHANNEL, b"released");
    assert_eq!(second.wait(None).await, Wake::Try);
    drop(second);
    assert_eq!(third.wait(after(2.0)).await, Wake::Try);
}

/// The first waiter's look at Redis once subscribed (a release before the subscription was
/// not heard) passes to the next waiter when the first leaves while subscribing. Given only
/// to the first, it was lost with it: the next had become head with no look, and waited for
/// the unknown lease's recheck (a second) or the next release.
#[tokio::test(start_paused = true)]
async fn a_first_waiter_that_leaves_while_subscribing_hands_its_look_on() {
    let link = Arc::new(Recorder::default());
    link.stalled.store(true, Ordering::Release);
    let waiters = linked(&link);
    let entering = waiters.clone();
    let first = tokio::spawn(async move { entering.enter(CHANNEL, None).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let entering = waiters.clone();
    let second = tokio::spawn(async move {
        let second = entering.enter(CHANNEL, None).await.unwrap();
        second.wait(after(0.5)).await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        link.count("subscribe"),
        1,
        "the second waits for the first's"
    );
    link.stalled.store(false, Ordering::Release);
    first.abort();
    assert_eq!(second.await.unwrap(), Wake::Try);
    assert_eq!(link.count("subscribe"), 2);
}
