//! A fenced resource kept for a retention (`fenced_write.lua`, `fenced_read.lua` with
//! `lib/fence_mark.lua`'s `fence_mark` and `keep_for`) against a real redis-server: every
//! accepted call sets the expiry of its data and marks together, and once the marks are gone a
//! token issued before the retention began is refused.

use redis::AsyncCommands;

use super::contract_tests::{contract_checks, Checked, Conn, OP_TTL};
use super::resource_tests::refused_write;
use super::*;
use crate::base::error::Superseded;

const RETENTION: Duration = Duration::from_secs(60);

fn resource() -> ResourceKeys {
    ResourceKeys::new(b"t:", b"payment:5f2c:status")
}

/// A token as one issued `ago` before the server's now (tokens are at least their issue time
/// in microseconds).
async fn issued(conn: &mut Conn, ago: Duration) -> FencingToken {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    let now = secs * 1_000_000 + micros;
    FencingToken::new(now - u64::try_from(ago.as_micros()).unwrap()).unwrap()
}

async fn write(conn: &mut Conn, token: FencingToken, op: &str, retention: Duration) -> WriteReply {
    fenced_write(
        conn,
        &resource(),
        token,
        op,
        OP_TTL,
        Write::Set(b"captured"),
        retention,
    )
    .await
    .unwrap()
}

async fn claim(
    conn: &mut Conn,
    token: FencingToken,
    mode: ReadMode,
    retention: Duration,
) -> ReadReply {
    fenced_read(conn, &resource(), token, Read::Get, mode, retention)
        .await
        .unwrap()
}

async fn ttls(conn: &mut Conn) -> [i64; 3] {
    let keys = resource();
    let mut out = [0; 3];
    for (slot, key) in out.iter_mut().zip([&keys.data, &keys.mark, &keys.shared]) {
        *slot = conn.pttl(key).await.unwrap();
    }
    out
}

/// The marks expire: deleted, as their expiry would.
async fn marks_expire(conn: &mut Conn) {
    let keys = resource();
    let _: () = conn
        .del(&[&keys.data, &keys.mark, &keys.shared])
        .await
        .unwrap();
}

#[tokio::test]
async fn every_accepted_call_keeps_data_and_marks_for_the_retention_together() {
    let (_server, mut conn, _) = super::contract_tests::setup().await;
    let token = issued(&mut conn, Duration::from_secs(1)).await;
    assert_eq!(
        write(&mut conn, token, "w1", RETENTION).await,
        WriteReply::Accepted(0)
    );
    let [data, mark, shared] = ttls(&mut conn).await;
    assert!(
        data > 0 && data <= 60_000 && mark > 0 && mark <= 60_000,
        "{data} {mark}"
    );
    assert_eq!(shared, -2, "no shared mark yet");
    let reader = issued(&mut conn, Duration::ZERO).await;
    let read = claim(&mut conn, reader, ReadMode::Shared, RETENTION).await;
    assert!(matches!(read, ReadReply::Read(_)), "{read:?}");
    let [data, mark, shared] = ttls(&mut conn).await;
    assert!([data, mark, shared]
        .iter()
        .all(|ttl| *ttl > 0 && *ttl <= 60_000));

    // Without a retention nothing expires, and an old token meets no floor.
    marks_expire(&mut conn).await;
    let old = issued(&mut conn, Duration::from_secs(3600)).await;
    assert_eq!(
        write(&mut conn, old, "w2", Duration::ZERO).await,
        WriteReply::Accepted(0)
    );
    assert_eq!(ttls(&mut conn).await, [-1, -1, -2]);
}

/// Once the marks expired, a token issued before the retention began is refused (by the
/// floor, `Expired`), and one issued within it is accepted; while a mark lives, the marks
/// decide as without a retention.
async fn a_token_older_than_the_retention_is_refused_once_the_marks_expired(
    conn: &mut Conn,
    _keys: &LockKeys,
) -> Checked {
    let stale = issued(conn, RETENTION + Duration::from_secs(5)).await;
    let newer = issued(conn, RETENTION + Duration::from_secs(4)).await;
    // The newer holder wrote when its token was fresh: its mark is there.
    let _: () = conn
        .set(&resource().mark, newer.get())
        .await
        .map_err(|e| e.to_string())?;
    // While the mark lives the stale token is refused by it.
    match write(conn, stale, "w2", RETENTION).await {
        WriteReply::Stale {
            latest,
            by: Superseded::WroteOrClaimed,
        } if latest == newer => {}
        other => return Err(format!("below a live mark: {other:?}")),
    }
    marks_expire(conn).await;
    match write(conn, stale, "w3", RETENTION).await {
        WriteReply::Stale {
            latest,
            by: Superseded::Expired,
        } if latest > newer => {}
        other => return Err(format!("a stale write after the marks expired: {other:?}")),
    }
    match claim(conn, stale, ReadMode::Claim, RETENTION).await {
        ReadReply::Stale {
            by: Superseded::Expired,
            ..
        } => {}
        other => return Err(format!("a stale claim after the marks expired: {other:?}")),
    }
    match claim(conn, stale, ReadMode::Shared, RETENTION).await {
        ReadReply::Stale {
            by: Superseded::Expired,
            ..
        } => {}
        other => {
            return Err(format!(
                "a stale shared read after the marks expired: {other:?}"
            ))
        }
    }
    let fresh = issued(conn, Duration::from_secs(1)).await;
    match write(conn, fresh, "w4", RETENTION).await {
        WriteReply::Accepted(_) => Ok(()),
        other => Err(format!("a token within the retention: {other:?}")),
    }
}

contract_checks! {
    the_retention_contract_check_holds,
    the_retention_negative_control_is_caught,
    || LockKeys::new(b"t:", b"unused");
    a_token_older_than_the_retention_is_refused_once_the_marks_expired =>
        [Control::RetentionForgetsExpiry],
}

/// A retention that is not a whole number of milliseconds is refused, and nothing written.
#[tokio::test]
async fn a_bad_retention_argument_is_refused() {
    let (_server, mut conn, _) = super::contract_tests::setup().await;
    let keys = resource();
    let err = refused_write(&mut conn, &keys, "w", &["5", "10000", "set", "soon", "v"]).await;
    assert!(
        matches!(&err, Error::Protocol(detail) if detail.contains("retention")),
        "{err:?}"
    );
    let data: Option<String> = conn.get(&keys.data).await.unwrap();
    assert_eq!(data, None);
}
