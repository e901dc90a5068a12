//! Fenced writes to Redis as storage: a token older than the newest accepted one writes
//! nothing, and every write is applied at most once.

use std::time::Duration;

use crate::common::Fixture;
use fencelock::{Error, FencingToken, LockClient};
use fencelock_testing::{Direction, FaultProxy};
use redis::Commands;

fn token(raw: u64) -> FencingToken {
    FencingToken::new(raw).unwrap()
}

#[tokio::test]
async fn newer_and_equal_tokens_write_older_ones_are_refused_with_both_tokens() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let stock = client.resource("stock:sku-1").unwrap();
    stock.set(token(10), "5").await.unwrap();
    stock.set(token(10), "4").await.unwrap();
    assert_eq!(stock.incr_by(token(11), -1).await.unwrap(), 3);
    let err = stock.set(token(10), "999").await.unwrap_err();
    // The refusal names the resource, in its fields and its text.
    assert_eq!(
        err.to_string(),
        "stale fencing token 10 for stock:sku-1: a newer holder wrote or claimed the resource \
         with token 11"
    );
    match err {
        Error::StaleToken {
            resource,
            presented,
            latest,
            by,
            ..
        } => {
            assert_eq!(resource, "stock:sku-1");
            assert_eq!((presented.get(), latest.get()), (10, 11));
            assert_eq!(by, fencelock::Superseded::WroteOrClaimed);
        }
        other => panic!("{other}"),
    }
    assert!(stock
        .incr_by(token(9), 100)
        .await
        .unwrap_err()
        .is_stale_token());
    assert_eq!(
        stock.peek_i64().await.unwrap(),
        Some(3),
        "nothing was written"
    );
    assert_eq!(stock.high_water_mark().await.unwrap(), Some(token(11)));
}

#[tokio::test]
async fn hashes_and_lists_are_fenced_and_the_mark_outlives_the_data() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let account = client.resource("account:7").unwrap();
    account
        .set_fields(token(5), &[(b"owner", b"ada"), (b"cents", b"100")])
        .await
        .unwrap();
    assert_eq!(
        account.peek_field("cents").await.unwrap(),
        Some(b"100".to_vec())
    );
    let ledger = client.resource("ledger:7").unwrap();
    assert_eq!(ledger.push(token(5), &[b"open"]).await.unwrap(), 1);
    assert_eq!(
        ledger
            .push(token(6), &[b"debit 10", b"debit 5"])
            .await
            .unwrap(),
        3
    );
    assert!(ledger
        .push(token(5), &[b"late"])
        .await
        .unwrap_err()
        .is_stale_token());
    assert_eq!(ledger.peek_items().await.unwrap().len(), 3);

    // Claiming reads return what was written, to the current and to a newer holder.
    assert_eq!(
        account.get_field(token(5), "cents").await.unwrap(),
        Some(b"100".to_vec())
    );
    assert_eq!(account.get_field(token(5), "nope").await.unwrap(), None);
    assert_eq!(
        ledger.items(token(6)).await.unwrap(),
        vec![b"open".to_vec(), b"debit 10".to_vec(), b"debit 5".to_vec()]
    );

    // Deleting the data keeps the fence: old tokens stay refused.
    ledger.delete(token(7)).await.unwrap();
    assert!(ledger.peek_items().await.unwrap().is_empty());
    assert!(ledger
        .push(token(6), &[b"zombie"])
        .await
        .unwrap_err()
        .is_stale_token());
    assert!(ledger.peek_items().await.unwrap().is_empty());

    // The mark never expires, and sits in the data's slot.
    let marks = fx.keys("fencelock:{*}mark:ledger:7");
    assert_eq!(marks.len(), 1);
    let ttl: i64 = fx.raw().pttl(&marks[0]).unwrap();
    assert_eq!(ttl, -1);
    let tag = |k: &[u8]| k.split(|b| *b == b'}').next().unwrap().to_vec();
    let data = fx.keys("fencelock:{*}data:account:7");
    let account_mark = fx.keys("fencelock:{*}mark:account:7");
    assert_eq!(tag(&data[0]), tag(&account_mark[0]));
}

#[tokio::test]
async fn wrong_types_and_empty_writes_are_typed_errors_and_write_nothing() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let r = client.resource("typed").unwrap();
    r.set_fields(token(3), &[(b"f", b"v")]).await.unwrap();
    let err = r.set(token(4), "x").await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("a key of typed holds foreign data"),
        "{err}"
    );
    assert!(r.incr_by(token(4), 1).await.unwrap_err().is_wrong_type());
    assert!(r.push(token(4), &[b"x"]).await.unwrap_err().is_wrong_type());
    assert_eq!(
        r.high_water_mark().await.unwrap(),
        Some(token(3)),
        "no mark moved"
    );
    assert!(r
        .set_fields(token(4), &[])
        .await
        .unwrap_err()
        .is_invalid_input());
    assert!(r.push(token(4), &[]).await.unwrap_err().is_invalid_input());

    let n = client.resource("not-a-number").unwrap();
    n.set(token(1), "abc").await.unwrap();
    assert!(n.incr_by(token(2), 1).await.unwrap_err().is_wrong_type());
    assert_eq!(n.peek().await.unwrap(), Some(b"abc".to_vec()));
    assert!(client.resource("").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_increment_whose_reply_was_lost_is_applied_once() {
    let fx = Fixture::start();
    let proxy = FaultProxy::start(fx.server.addr()).unwrap();
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let balance = client.resource("balance").unwrap();
    balance.incr_by(token(1), 100).await.unwrap();

    proxy.blackhole(Direction::Downstream);
    let (result, ()) = tokio::join!(balance.incr_by(token(1), -30), async {
        assert!(
            crate::common::eventually(Duration::from_secs(5), || {
                fx.keys("fencelock:{*}data:balance")
                    .first()
                    .map(|k| fx.raw().get::<_, i64>(k).unwrap())
                    == Some(70)
            })
            .await
        );
        proxy.reset_all();
        proxy.heal();
    });
    assert_eq!(result.unwrap(), 70, "the retry replays the first reply");
    assert_eq!(balance.peek_i64().await.unwrap(), Some(70), "not 40");
}

#[tokio::test]
async fn a_holder_that_lost_its_lock_cannot_write_after_the_next_holder() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let lock = client.lock("account:1").unwrap();
    let balance = client.resource("balance:1").unwrap();
    let old = lock
        .with_lease(Duration::from_millis(50))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    balance.set(old.token(), "100").await.unwrap();
    // The old holder pauses past its lease; a new holder takes over and writes.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let new = lock.acquire().await.unwrap();
    let read = balance.get_i64(new.token()).await.unwrap().unwrap();
    balance
        .set(new.token(), (read - 40).to_string())
        .await
        .unwrap();
    // The old holder wakes up and writes what it computed before the pause.
    let err = balance.set(old.token(), "0").await.unwrap_err();
    assert!(err.is_stale_token(), "{err}");
    assert_eq!(balance.peek_i64().await.unwrap(), Some(60));
    new.release().await.unwrap();
    assert!(old.release().await.unwrap_err().is_not_held());
}

#[tokio::test]
async fn a_claiming_read_stops_an_older_holder_between_the_read_and_the_write() {
    let fx = Fixture::start();
    let client = fx.client().await;
    let balance = client.resource("balance:2").unwrap();
    balance.set(token(1), "100").await.unwrap();
    // Old holder (token 5) read 100 and paused; the new holder (token 6) reads, claiming.
    assert_eq!(balance.get_i64(token(6)).await.unwrap(), Some(100));
    // The old holder wakes between the new holder's read and write: refused, so the new
    // holder's write (computed from its read) cannot silently overwrite a debit.
    assert!(balance
        .set(token(5), "10")
        .await
        .unwrap_err()
        .is_stale_token());
    balance.set(token(6), "70").await.unwrap();
    assert_eq!(balance.peek_i64().await.unwrap(), Some(70));
    // Reads by older tokens are refused too, and nothing is read.
    assert!(balance.get(token(5)).await.unwrap_err().is_stale_token());
    balance.claim(token(7)).await.unwrap();
    assert!(balance
        .set(token(6), "1")
        .await
        .unwrap_err()
        .is_stale_token());
    assert_eq!(balance.high_water_mark().await.unwrap(), Some(token(7)));
    // Missing values read as None; fields and lists work the same way.
    let other = client.resource("empty").unwrap();
    assert_eq!(other.get(token(1)).await.unwrap(), None);
    assert_eq!(other.get_field(token(1), "f").await.unwrap(), None);
    assert!(other.items(token(1)).await.unwrap().is_empty());
}

/// A resource per request, kept for a retention: its data and marks expire together after
/// it, and a holder whose token predates the expiry is refused (`Superseded::Expired`), while
/// the next holder writes as usual.
#[tokio::test]
async fn a_resource_with_a_retention_expires_and_still_refuses_holders_from_before() {
    use crate::common::deadline::{within, HANDOFF};
    let fx = Fixture::start();
    let client = fx.client().await;
    let retention = Duration::from_millis(1500);
    let lock = client.lock("payment:5f2c").unwrap();
    let status = client
        .resource("payment:5f2c:status")
        .unwrap()
        .with_retention(retention)
        .unwrap();
    assert_eq!(status.retention(), Some(retention));
    let shown = format!("{status:?}");
    assert!(shown.contains("retention: Some(1.5s)"), "{shown}");

    let stale = lock.acquire().await.unwrap();
    status.set(stale.token(), "pending").await.unwrap();
    let stale_token = stale.token();
    drop(stale);
    let newer = lock.acquire().await.unwrap();
    status.set(newer.token(), "captured").await.unwrap();
    let pttl: i64 = fx
        .raw()
        .pttl(
            fx.keys("fencelock:{*}data:payment:5f2c:status")
                .pop()
                .unwrap(),
        )
        .unwrap();
    assert!(pttl > 0 && pttl <= 1500, "{pttl}");
    let newer_token = newer.token();
    newer.release().await.unwrap();

    within(retention + HANDOFF, "the resource expires", async {
        while !fx.keys("fencelock:{*}*:payment:5f2c:status").is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(status.peek().await.unwrap(), None);
    for token in [stale_token, newer_token] {
        let err = status.set(token, "late").await.unwrap_err();
        assert!(
            matches!(err, Error::StaleToken { by: fencelock::Superseded::Expired, latest, .. } if latest > newer_token),
            "{err}"
        );
        let err = status.get(token).await.unwrap_err();
        assert!(err.is_stale_token(), "{err}");
    }
    assert!(
        fx.keys("fencelock:{*}*:payment:5f2c:status").is_empty(),
        "refusals write nothing"
    );
    let next = lock.acquire().await.unwrap();
    status.set(next.token(), "refunded").await.unwrap();
    assert_eq!(
        status.get(next.token()).await.unwrap(),
        Some(b"refunded".to_vec())
    );

    for bad in [
        Duration::ZERO,
        Duration::from_micros(1500),
        Duration::from_secs(400_000_000),
    ] {
        let err = status.with_retention(bad).unwrap_err();
        assert!(err.is_invalid_input(), "{bad:?}: {err}");
    }
}
