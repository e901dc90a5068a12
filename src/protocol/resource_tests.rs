//! The fenced resource's two kinds of read against a real redis-server (`fenced_read.lua`,
//! with `fenced_write.lua`): a claim refuses every older token, a shared read only an older
//! one than the newest write or claim; both fence every older writer.

use super::contract_tests::{contract_checks, refused_as_called, Checked, Conn, OP_TTL};
use super::*;
use crate::base::error::Superseded;

fn t(raw: u64) -> FencingToken {
    FencingToken::new(raw).unwrap()
}

fn resource() -> ResourceKeys {
    ResourceKeys::new(b"t:", b"catalog")
}

/// `fenced_write.lua` on `keys` with the op id `op` and `args` as given, past the bindings,
/// which it must refuse: the error, typed.
pub(super) async fn refused_write(
    conn: &mut Conn,
    keys: &ResourceKeys,
    op: &str,
    args: &[&str],
) -> Error {
    let keys = [
        keys.data.clone(),
        keys.mark.clone(),
        keys.op(op),
        keys.shared.clone(),
    ];
    Error::from_reply(refused_as_called(conn, &scripts().fenced_write, &keys, args).await)
}

async fn write(conn: &mut Conn, token: u64, op: &str) -> WriteReply {
    fenced_write(
        conn,
        &resource(),
        t(token),
        op,
        OP_TTL,
        Write::Set(token.to_string().as_bytes()),
        Duration::ZERO,
    )
    .await
    .unwrap()
}

async fn read(conn: &mut Conn, token: u64, mode: ReadMode) -> ReadReply {
    fenced_read(conn, &resource(), t(token), Read::Get, mode, Duration::ZERO)
        .await
        .unwrap()
}

/// What a read that was let through must have read: the value the writer `token` wrote.
fn read_value(reply: &ReadReply, written_by: u64) -> Checked {
    match reply {
        ReadReply::Read(redis::Value::BulkString(value))
            if *value == written_by.to_string().into_bytes() =>
        {
            Ok(())
        }
        other => Err(format!(
            "expected the value of writer {written_by}, got {other:?}"
        )),
    }
}

/// Checks that a read was refused as stale, superseded `by` the token `latest` (`what` says
/// which read).
fn refused_by(reply: ReadReply, by: Superseded, latest: u64, what: &str) -> Checked {
    match reply {
        ReadReply::Stale {
            latest: newest,
            by: why,
        } if why == by && newest == t(latest) => Ok(()),
        other => Err(format!("{what}: {other:?}")),
    }
}

/// Readers of one hold (tokens 7 and 9, after writer 5) read in any order, again and again,
/// and neither is refused: the newer reader's read does not refuse the older one.
async fn readers_never_refuse_each_other(conn: &mut Conn, _: &LockKeys) -> Checked {
    write(conn, 5, "w5").await;
    for reader in [7, 9, 7, 9, 7] {
        read_value(&read(conn, reader, ReadMode::Shared).await, 5)
            .map_err(|why| format!("reader {reader}: {why}"))?;
    }
    Ok(())
}

/// After a shared read by reader 9, a writer with an older token (6, or 8 between the
/// readers) is refused, naming the reader's token; a newer writer (10) is accepted.
async fn a_shared_read_fences_older_writers(conn: &mut Conn, _: &LockKeys) -> Checked {
    write(conn, 5, "w5").await;
    read(conn, 7, ReadMode::Shared).await;
    read(conn, 9, ReadMode::Shared).await;
    for writer in [6, 8] {
        match write(conn, writer, &format!("w{writer}")).await {
            WriteReply::Stale {
                latest,
                by: Superseded::SharedRead,
            } if latest == t(9) => {}
            other => return Err(format!("older writer {writer} after reader 9: {other:?}")),
        }
    }
    match write(conn, 10, "w10").await {
        WriteReply::Accepted(_) => Ok(()),
        other => Err(format!("newer writer 10 after reader 9: {other:?}")),
    }
}

/// Once a newer holder wrote (10) or claimed (12), a reader whose hold began before is
/// refused, naming that token: what it would read is not its view.
async fn a_newer_write_or_claim_refuses_older_readers(conn: &mut Conn, _: &LockKeys) -> Checked {
    write(conn, 5, "w5").await;
    read(conn, 9, ReadMode::Shared).await;
    write(conn, 10, "w10").await;
    let reply = read(conn, 9, ReadMode::Shared).await;
    refused_by(
        reply,
        Superseded::WroteOrClaimed,
        10,
        "reader 9 after writer 10",
    )?;
    read_value(&read(conn, 11, ReadMode::Shared).await, 10)?;
    read_value(&read(conn, 12, ReadMode::Claim).await, 10)?;
    let reply = read(conn, 11, ReadMode::Shared).await;
    refused_by(
        reply,
        Superseded::WroteOrClaimed,
        12,
        "reader 11 after a claim by 12",
    )
}

/// A claim refuses every older token, a reader's included: a claiming read by 8 after a
/// shared read by 9 is refused (a claim is a holder alone in its critical section).
async fn a_claim_is_refused_below_a_shared_read(conn: &mut Conn, _: &LockKeys) -> Checked {
    read(conn, 9, ReadMode::Shared).await;
    let reply = read(conn, 8, ReadMode::Claim).await;
    refused_by(
        reply,
        Superseded::SharedRead,
        9,
        "a claim by 8 after reader 9",
    )
}

contract_checks! {
    /// Each shared-read control breaks exactly the contract check that names it (which holds
    /// on the production scripts: [`the_fenced_read_contract_checks_hold`]), each on a fresh
    /// server.
    the_fenced_read_contract_checks_hold,
    the_shared_read_negative_controls_are_caught,
    || LockKeys::new(b"t:", b"unused");
    readers_never_refuse_each_other => [Control::SharedReadClaims],
    a_shared_read_fences_older_writers => [Control::SharedReadDoesNotFence],
    a_newer_write_or_claim_refuses_older_readers => [],
    a_claim_is_refused_below_a_shared_read => [],
}

/// A mode the script does not know is refused as a protocol error, and reads nothing.
#[tokio::test]
async fn an_unknown_read_mode_is_refused() {
    let (_server, mut conn, _) = super::contract_tests::setup().await;
    let keys = resource();
    let err = Error::from_reply(
        refused_as_called(
            &mut conn,
            &scripts().fenced_read,
            &[keys.data.clone(), keys.mark.clone(), keys.shared.clone()],
            &["5", "get", "", "borrow"],
        )
        .await,
    );
    assert!(
        matches!(&err, Error::Protocol(detail) if detail.contains("read mode")),
        "{err:?}"
    );
}
