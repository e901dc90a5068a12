//! The blocking facade, from plain threads: the same exclusion, re-entry, tokens, leases and
//! errors as the async API.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Fixture;
use fencelock::blocking::LockClient;

#[test]
fn threads_exclude_each_other_and_tokens_follow_the_grant_order() {
    let fx = Fixture::start();
    let clients: Vec<LockClient> = (0..2)
        .map(|_| LockClient::connect(&fx.server.url()).unwrap())
        .collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let lock = clients[i % 2].lock("blocking").unwrap();
            let (inside, overlaps, tokens) = (inside.clone(), overlaps.clone(), tokens.clone());
            std::thread::spawn(move || {
                for _ in 0..30 {
                    let guard = lock.acquire().unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens.lock().push(guard.token());
                    std::thread::sleep(Duration::from_micros(100));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let tokens = tokens.lock();
    assert_eq!(tokens.len(), 180);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]));
    assert!(fx.lock_key("blocking").is_none());
}

#[test]
fn reentry_leases_and_errors_work_from_threads() {
    let fx = Fixture::start();
    let client = LockClient::connect(&fx.server.url()).unwrap();
    let lock = client.lock("sync").unwrap();
    let outer = lock.acquire().unwrap();
    let inner = outer.reenter().unwrap();
    assert_eq!(inner.token(), outer.token());
    assert_eq!(
        fx.lock_state("sync").unwrap().0,
        vec![(outer.holder_id().to_owned(), 2)]
    );
    // Another thread cannot get in, and times out with the typed error.
    let other = lock.clone();
    let err = std::thread::spawn(move || other.acquire_timeout(Duration::from_millis(100)))
        .join()
        .unwrap()
        .unwrap_err();
    assert!(err.is_timeout());
    assert!(lock.try_acquire().unwrap().is_none());
    // A guard moved to another thread is released there.
    std::thread::spawn(move || inner.release().unwrap())
        .join()
        .unwrap();
    outer.release().unwrap();
    assert!(fx.lock_key("sync").is_none());

    // A fixed lease runs out; the lost guard's release is refused and touches nothing.
    let short = lock.with_lease(Duration::from_millis(50)).unwrap();
    let stale = short.acquire().unwrap();
    assert!(stale.wait_lost(Duration::from_secs(5)));
    assert!(!stale.is_valid());
    let fresh = lock.acquire().unwrap();
    assert!(fresh.token() > stale.token());
    assert!(stale.release().unwrap_err().is_not_held());
    // A dropped guard is released in the background.
    drop(fresh);
    let again = lock.acquire_timeout(Duration::from_secs(5)).unwrap();
    again.release().unwrap();
    assert!(client.lock("").is_err());
    assert!(lock.with_lease(Duration::ZERO).is_err());
}
