//! A primary with two replicas under three Sentinels: the client follows a failover.

mod common;

use std::time::Duration;

use common::eventually;
use fencelock::testing::{RedisSentinels, RedisServer};
use fencelock::LockClient;
use redis::Commands;

const LONG: Duration = Duration::from_secs(60);

fn con(node: &RedisServer) -> redis::Connection {
    node.client().get_connection().expect("node connection")
}

async fn client(set: &RedisSentinels) -> LockClient {
    LockClient::sentinel_builder(set.sentinel_urls(), set.master_name())
        .default_lease(Duration::from_secs(10))
        // A failover takes a few seconds (down-after 1 s, election, promotion): operations
        // caught in it are re-sent with their ids for longer than that.
        .retry_window(Duration::from_secs(10))
        .op_record_ttl(Duration::from_secs(30))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_holders_waiters_and_tokens_carry_on() {
    let mut set = RedisSentinels::start(2).unwrap();
    let holder_client = client(&set).await;
    let waiter_client = client(&set).await;
    let guard = holder_client.lock("acct").unwrap().acquire().await.unwrap();
    let token = guard.token();
    let waiter = tokio::spawn(async move {
        let lock = waiter_client
            .lock("acct")
            .unwrap()
            .with_lease(LONG)
            .unwrap();
        let guard = lock
            .acquire_timeout(Duration::from_secs(60))
            .await
            .expect("the waiter gets the lock after the failover and the release");
        let token = guard.token();
        guard.release().await.unwrap();
        token
    });

    let primary = set.primary().unwrap();
    let key: Vec<u8> = con(primary)
        .keys::<_, Vec<Vec<u8>>>("fencelock:{*}lock:acct")
        .unwrap()
        .pop()
        .expect("the lock is held");
    let subscribed = eventually(Duration::from_secs(10), || {
        let numsub: (Vec<u8>, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&key)
            .query(&mut con(primary))
            .unwrap();
        numsub.1 >= 1
    })
    .await;
    assert!(subscribed, "the waiter never subscribed");
    // The holder's acquisition reached both replicas before the crash (the replica
    // acknowledgement option is a separate feature; here the test asks for it).
    let acked: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(5000)
        .query(&mut con(primary))
        .unwrap();
    assert_eq!(acked, 2);

    let old = set.kill_primary().unwrap();
    let new = set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
    let new_primary = set.primary().unwrap();
    assert_eq!(new_primary.port(), new);

    // The holder keeps its lock: the promoted replica has it with the same token, and the
    // watchdog renews it there.
    let stored: u64 = con(new_primary).hget(&key, "~token").unwrap();
    assert_eq!(stored, token.get());
    let renewed_there = eventually(Duration::from_secs(30), || {
        con(new_primary)
            .pttl::<_, i64>(&key)
            .is_ok_and(|pttl| pttl > 9_000)
    })
    .await;
    assert!(
        renewed_there,
        "the watchdog did not renew at the new primary"
    );
    assert!(guard.is_valid());

    // New acquisitions work, and the held lock goes to the waiter with a greater token.
    let other = holder_client
        .lock("other")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    other.release().await.unwrap();
    guard.release().await.unwrap();
    let next = waiter.await.unwrap();
    assert!(next > token, "tokens keep increasing across the failover");
    let again = holder_client.lock("acct").unwrap().acquire().await.unwrap();
    assert!(again.token() > next);
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_answering_readonly_sends_the_client_to_the_new_one() {
    let set = RedisSentinels::start(1).unwrap();
    let client = client(&set).await;
    let first = client.lock("acct").unwrap().acquire().await.unwrap();
    let token = first.token();
    first.release().await.unwrap();
    let old_primary = set.primary().unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut con(old_primary))
        .unwrap();
    assert_eq!(acked, 1);

    // The old primary keeps running and becomes a replica: the client's connection to it may
    // stay open, and then its next write is answered READONLY.
    let old = set.failover().unwrap();
    let new = set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
    let demoted = eventually(Duration::from_secs(30), || {
        redis::cmd("ROLE")
            .query::<Vec<redis::Value>>(&mut con(old_primary))
            .is_ok_and(|role| role.first() == Some(&redis::Value::BulkString(b"slave".to_vec())))
    })
    .await;
    assert!(demoted, "the old primary did not become a replica");

    let next = client.lock("acct").unwrap().acquire().await.unwrap();
    assert!(next.token() > token);
    let new_primary = set.primary().unwrap();
    assert_eq!(new_primary.port(), new);
    let held: Vec<Vec<u8>> = con(new_primary).keys("fencelock:{*}lock:acct").unwrap();
    assert_eq!(held.len(), 1, "the lock was taken at the new primary");
    next.release().await.unwrap();
}
