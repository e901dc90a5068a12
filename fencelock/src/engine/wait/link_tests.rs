//! The waiters' own requests (SUBSCRIBE, UNSUBSCRIBE, `leave_fair`) through a test link
//! ([`TestLink`]) instead of a connection, so that a test decides how each one ends.

use std::sync::Arc;
use std::time::Duration;

use super::tests::is_subscribed;
use super::{FairExit, TestFuture, TestLink, Waiters};
use crate::base::error::Error;
use crate::protocol::LockKeys;

/// Records what the waiters send.
#[derive(Default)]
struct Recorder {
    sent: parking_lot::Mutex<Vec<&'static str>>,
}

/// The herd jitter through the link: 12.345 ms.
const RANDOM: u64 = 12_345;

impl TestLink for Recorder {
    fn subscribe(&self, _channel: &[u8]) -> TestFuture<Result<(), Error>> {
        self.sent.lock().push("subscribe");
        Box::pin(async { Ok(()) })
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

fn linked(link: &Arc<Recorder>) -> Arc<Waiters> {
    let waiters = Arc::new(Waiters::default());
    waiters.set_test_link(link.clone());
    waiters
}

#[tokio::test]
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
