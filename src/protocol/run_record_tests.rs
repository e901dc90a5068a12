//! What the contract tests of the run-record scripts (`job_tests.rs`, `idempotency_tests.rs`)
//! share: a lock won and a hold ended, each script called with a kind's own arguments, and the
//! table of a family's contract checks.

use std::time::Duration;

use redis::{AsyncCommands, ToRedisArgs};

use super::contract_tests::{Conn, LEASE, OP_TTL};
use super::*;

/// How long the tests' records are kept after each write.
pub(super) const RETENTION: Duration = Duration::from_secs(60);
/// The death policies as a begin takes them (`give_up`).
pub(super) const GIVE_UP: bool = true;
pub(super) const RUN_AGAIN: bool = false;

/// Takes the free lock of `keys` for `holder`.
pub(super) async fn won(conn: &mut Conn, keys: &LockKeys, holder: &str) -> FencingToken {
    match acquire(conn, keys, holder, LEASE, OP_TTL).await.unwrap() {
        AcquireReply::Acquired { token, .. } => token,
        other => panic!("the free lock answered {other:?}"),
    }
}

/// Frees the lock of `keys` as a lost hold would (the lease ran out, the process died).
pub(super) async fn hold_ends(conn: &mut Conn, keys: &LockKeys) {
    let _: () = conn.del(&keys.lock).await.unwrap();
}

/// `K`'s begin for `holder` with `token` and the kind's `own` arguments.
pub(super) async fn try_begin<K: RunKind>(
    conn: &mut Conn,
    keys: &LockKeys,
    (holder, token): (&str, FencingToken),
    own: impl ToRedisArgs,
    on_death: bool,
) -> Result<BeginReply<K>, Error> {
    let args = RunArgs {
        holder,
        token,
        retention: RETENTION,
    };
    run_begin(conn, keys, args, own, on_death).await
}

/// `K`'s finish for `holder` with `token`, the kind's `own` arguments and the `result` a key
/// stores, of a run begun at `started_ms`.
pub(super) async fn finish<K: RunKind>(
    conn: &mut Conn,
    keys: &LockKeys,
    (holder, token): (&str, FencingToken),
    own: impl ToRedisArgs,
    (started_ms, end): (u64, RunEnd),
    result: Option<&[u8]>,
) -> Result<FinishReply, Error> {
    let args = RunArgs {
        holder,
        token,
        retention: RETENTION,
    };
    run_finish::<K, _>(conn, keys, args, own, started_ms, end, result).await
}
