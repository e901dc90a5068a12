//! How each answer of the tool is written with `--json`: one function per kind of answer.

use std::time::SystemTime;

use fencelock::admin::{
    Check, ElectionInfo, HoldEntry, HolderEntry, JobInfo, KeyInfo, LockEvent, LockInfo,
    PossibleDeadlock, RwLockInfo, SemaphoreInfo, WaitInfo,
};
use fencelock::{FencingToken, HoldExpiry};
use serde_json::{json, Value};

pub(crate) fn lock_json(lock: &LockInfo) -> Value {
    let mut value = json!({
        "name": String::from_utf8_lossy(&lock.name),
        "key": String::from_utf8_lossy(&lock.key),
        "holders": lock.holders.iter().map(holder_json).collect::<Vec<_>>(),
        "token": lock.token.map(FencingToken::get),
        "pttl_ms": lock.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        "held_ms": lock.held_for.map(millis),
        "label": lock.label,
    });
    if let Some(client) = &lock.reserved_for {
        value["reserved_for"] = Value::String(client.clone());
    }
    if std::str::from_utf8(&lock.name).is_err() {
        value["name_hex"] = Value::String(hex(&lock.name));
    }
    value
}

pub(crate) fn election_json(election: &ElectionInfo) -> Value {
    let leader = election.leader.as_ref().map(|leader| {
        let mut value = json!({
            "id": leader.id(),
            "term": leader.term().get(),
            "metadata": String::from_utf8_lossy(leader.metadata()),
        });
        if std::str::from_utf8(leader.metadata()).is_err() {
            value["metadata_hex"] = Value::String(hex(leader.metadata()));
        }
        value
    });
    let mut value = json!({
        "name": String::from_utf8_lossy(&election.name),
        "key": String::from_utf8_lossy(&election.key),
        "leader": leader,
        "leader_client_name": election.leader_client_name,
        "leader_label": election.leader_label,
        "pttl_ms": election.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        "queued_candidates": election.queued_candidates,
        "subscribers": election.subscribers,
    });
    if std::str::from_utf8(&election.name).is_err() {
        value["name_hex"] = Value::String(hex(&election.name));
    }
    value
}

/// Milliseconds since the Unix epoch.
pub(crate) fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

pub(crate) fn job_json(job: &JobInfo) -> Value {
    let mut value = json!({
        "name": String::from_utf8_lossy(&job.name),
        "key": String::from_utf8_lossy(&job.key),
        "state": job.state(),
        "tick_ms": epoch_ms(job.last.tick()),
        "runner": job.last.runner(),
        "token": job.last.token().get(),
        "started_ms": epoch_ms(job.last.started()),
        "finished_ms": job.last.finished().map(epoch_ms),
        "failed_ms": job.last.failed().map(epoch_ms),
        "runner_client_name": job.runner_client_name,
        "runner_label": job.runner_label,
        "runner_holds": job.runner_holds,
        "retained_ms": job.retained_for.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    });
    if std::str::from_utf8(&job.name).is_err() {
        value["name_hex"] = Value::String(hex(&job.name));
    }
    value
}

pub(crate) fn hold_json(hold: &HoldEntry) -> Value {
    json!({
        "holder": hold.holder,
        "client_name": hold.client_name,
        "permits": hold.permits,
        "token": hold.token.map(FencingToken::get),
        "lease_ms": hold.lease_left.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        "held_ms": hold.held_for.map(millis),
        "label": hold.label,
    })
}

pub(crate) fn semaphore_json(semaphore: &SemaphoreInfo) -> Value {
    json!({
        "name": String::from_utf8_lossy(&semaphore.name),
        "limit": semaphore.limit,
        "used": semaphore.used,
        "holds": semaphore.holds.iter().map(hold_json).collect::<Vec<_>>(),
        "expiry": expiry_json(semaphore.expiry),
    })
}

pub(crate) fn rwlock_json(rwlock: &RwLockInfo) -> Value {
    json!({
        "name": String::from_utf8_lossy(&rwlock.name),
        "writer": rwlock.writer.as_ref().map(hold_json),
        "readers": rwlock.readers.iter().map(hold_json).collect::<Vec<_>>(),
        "waiting_writers": rwlock.waiting_writers,
        "expiry": expiry_json(rwlock.expiry),
    })
}

/// How a semaphore or read-write lock keeps its deadlines, as JSON says it.
pub(crate) fn expiry_json(expiry: HoldExpiry) -> &'static str {
    match expiry {
        HoldExpiry::FieldExpiry => "field_expiry",
        _ => "lease_zset",
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn holder_json(holder: &HolderEntry) -> Value {
    json!({"id": holder.id, "count": holder.count, "client_name": holder.client_name})
}

pub(crate) fn check_json(check: &Check) -> Value {
    json!({
        "name": check.name,
        "status": check.status.to_string(),
        "finding": check.finding,
        "fix": check.fix,
    })
}

pub(crate) fn event_json(event: &LockEvent) -> Value {
    let (kind, holder, token) = match event {
        LockEvent::Acquired { holder, token } => ("acquired", Some(holder), *token),
        LockEvent::Reentered { holder } => ("reentered", Some(holder), None),
        LockEvent::Exited { holder } => ("exited", Some(holder), None),
        LockEvent::Released { holder, token } => ("released", holder.as_ref(), *token),
        LockEvent::ForceReleased { holder, token } => ("force-released", holder.as_ref(), *token),
        LockEvent::Expired { holder, token } => ("expired", Some(holder), *token),
        _ => ("other", None, None),
    };
    json!({
        "at": now_rfc3339(),
        "event": kind,
        "holder": holder.map(holder_json),
        "token": token.map(FencingToken::get),
    })
}

/// The current UTC time, for event lines (RFC 3339, milliseconds).
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn key_json(key: &KeyInfo) -> Value {
    let record = &key.record;
    let mut value = json!({
        "namespace": String::from_utf8_lossy(&key.namespace),
        "key": String::from_utf8_lossy(&key.key),
        "redis_key": String::from_utf8_lossy(&key.redis_key),
        "state": key.state(),
        "runner": record.runner(),
        "token": record.token().get(),
        "started_ms": epoch_ms(record.started()),
        "finished_ms": record.finished().map(epoch_ms),
        "failed_ms": record.failed().map(epoch_ms),
        "age_ms": millis(key.age),
        "final_failure": record.is_final_failure(),
        "result": record.result().map(String::from_utf8_lossy),
        "fingerprint": String::from_utf8_lossy(record.fingerprint()),
        "runner_client_name": key.runner_client_name,
        "runner_label": key.runner_label,
        "runner_holds": key.runner_holds,
        "retained_ms": key.retained_for.map(millis),
    });
    if let Some(result) = record.result().filter(|r| std::str::from_utf8(r).is_err()) {
        value["result_hex"] = Value::String(hex(result));
    }
    if std::str::from_utf8(&key.key).is_err() {
        value["key_hex"] = Value::String(hex(&key.key));
    }
    value
}

pub(crate) fn wait_json(wait: &WaitInfo) -> Value {
    json!({
        "waiter": wait.waiter,
        "client_name": wait.client_name,
        "waits_for": wait.display_waits_for(),
        "key": String::from_utf8_lossy(&wait.waits_for),
        "label": wait.label,
        "waited_ms": millis(wait.waited_for),
        "holds": wait.holds.iter().map(|k| String::from_utf8_lossy(k)).collect::<Vec<_>>(),
    })
}

pub(crate) fn deadlock_json(deadlock: &PossibleDeadlock) -> Value {
    json!({"waits": deadlock.waits.iter().map(wait_json).collect::<Vec<_>>()})
}
