//! The doctor: the server settings that break locks, each with what to change.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{InfoDict, RedisError, Value};

use super::{format_duration, Admin, HoldKind};
use crate::base::error::ErrorClass;
use crate::protocol::server::{EvictionRisk, ServerFlavour, ServerInfo};
use crate::Error;

/// The verdict of one [`Check`], ordered from good to bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// Nothing to change.
    Ok,
    /// A setting that can break a guarantee under some fault; the check says which and what to
    /// change.
    Warn,
    /// A setting under which locks do not work or are not safe at all.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        })
    }
}

/// One finding of [`Admin::doctor`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked: `version`, `protocol`, `maxmemory-policy`, `persistence`,
    /// `replication`, `cluster`, `latency`, `clock`; `max-hold` from
    /// [`Admin::check_hold_ages`]; `deadlock` from [`Admin::check_deadlocks`].
    pub name: &'static str,
    /// The verdict.
    pub status: Status,
    /// What was found.
    pub finding: String,
    /// What to change, when the status is not OK.
    pub fix: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4} {:<16} {}", self.status, self.name, self.finding)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n     {:<16} fix: {fix}", "")?;
        }
        Ok(())
    }
}

impl Check {
    /// The check `name` with what it found.
    pub(super) fn new(name: &'static str, (status, finding, fix): Finding) -> Check {
        Check {
            name,
            status,
            finding,
            fix,
        }
    }
}

/// What a check found: the verdict, the finding and, unless the verdict is OK, what to change.
pub(super) type Finding = (Status, String, Option<String>);

/// A finding with nothing to change.
pub(super) fn ok(finding: impl Into<String>) -> Finding {
    (Status::Ok, finding.into(), None)
}

impl Status {
    /// `finding` with this verdict, and `fix` to change unless the verdict is OK.
    pub(super) fn found(self, finding: impl Into<String>, fix: impl Into<String>) -> Finding {
        (
            self,
            finding.into(),
            (self != Status::Ok).then(|| fix.into()),
        )
    }

    /// This verdict when `bad`, else OK.
    pub(super) fn when(self, bad: bool) -> Status {
        if bad {
            self
        } else {
            Status::Ok
        }
    }
}

/// A check whose command failed: a broken connection is the caller's error, anything else (a
/// refused or renamed command) is a WARN that says the setting could not be checked.
fn settle(name: &'static str, outcome: Result<Finding, RedisError>) -> Result<Check, Error> {
    match outcome {
        Ok(found) => Ok(Check::new(name, found)),
        Err(err) if ErrorClass::of(&err) == ErrorClass::ConnectionLost => Err(Error::Redis(err)),
        Err(err) => Ok(Check::new(
            name,
            Status::Warn.found(
                format!(
                    "could not be checked: {}",
                    err.to_string().replace('\n', " ")
                ),
                "run the doctor as a user allowed CONFIG GET, INFO, PING and TIME",
            ),
        )),
    }
}

/// The `key:value` lines of an `INFO` or `CLUSTER INFO` reply.
async fn info(
    conn: &mut MultiplexedConnection,
    command: &redis::Cmd,
) -> Result<InfoDict, RedisError> {
    command.query_async(conn).await
}

async fn config(conn: &mut MultiplexedConnection, key: &str) -> Result<Option<String>, RedisError> {
    let reply: HashMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(key)
        .query_async(conn)
        .await?;
    Ok(reply.get(key).cloned())
}

/// A number as `CONFIG GET` gives it; 0 when it is missing or not a number.
fn number(text: Option<&String>) -> u64 {
    text.and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The server's flavour and version, judged against the tested releases: `HELLO` (the source
/// `LockClient::server` uses), or `INFO server` on a server too old to know `HELLO`.
async fn check_version(conn: &mut MultiplexedConnection) -> Result<Finding, RedisError> {
    let server = match redis::cmd("HELLO").query_async::<Value>(conn).await {
        Ok(reply) => ServerInfo::from_hello(&reply),
        Err(_) => {
            let info = info(conn, redis::cmd("INFO").arg("server")).await?;
            let version: Option<String> = info.get("redis_version");
            ServerInfo::named("redis", version.as_deref().unwrap_or("0"))
        }
    };
    let tested = ServerInfo::tested_matrix();
    let redis_like = server.flavour() != ServerFlavour::Valkey;
    let upgrade = "upgrade the server to a tested release";
    Ok(if redis_like && server.version() < (6, 2, 0) {
        Status::Fail.found(
            format!("{server}: fencelock needs Redis 6.2 or newer (RESP3 push messages for waiting, the script commands it uses); tested on {tested}"),
            upgrade,
        )
    } else if !server.is_at_least_tested() {
        Status::Warn.found(
            format!("{server}: older than every tested release of its kind (tested on {tested})"),
            upgrade,
        )
    } else if !server.has_sharded_pubsub() {
        ok(
            format!("{server} (tested on {tested}); serves one server and Sentinel, not a cluster client (sharded pub/sub: Redis 7.0+)"),
        )
    } else {
        ok(format!("{server} (tested on {tested})"))
    })
}

async fn check_eviction(conn: &mut MultiplexedConnection) -> Result<Finding, RedisError> {
    let policy = config(conn, "maxmemory-policy")
        .await?
        .unwrap_or_else(|| "noeviction".into());
    let maxmemory = number(config(conn, "maxmemory").await?.as_ref());
    // With a maxmemory the policy evicts under pressure now: a broken lock. Without one it
    // applies the moment one is set.
    let (status, limit) = match maxmemory {
        0 => (
            Status::Warn,
            "no maxmemory is set now, but the policy applies as soon as one is".to_owned(),
        ),
        bytes => (Status::Fail, format!("maxmemory is {bytes} bytes")),
    };
    Ok(match EvictionRisk::of(&policy) {
        None => ok("noeviction: locks and fence counters are never evicted"),
        Some(risk) => status.found(
            format!("{policy} {} ({limit})", risk.evicts()),
            EvictionRisk::FIX,
        ),
    })
}

async fn check_persistence(conn: &mut MultiplexedConnection) -> Result<Finding, RedisError> {
    let aof = config(conn, "appendonly").await?.unwrap_or_default();
    let fsync = config(conn, "appendfsync").await?.unwrap_or_default();
    let save = config(conn, "save").await?.unwrap_or_default();
    if aof == "yes" && fsync != "no" {
        return Ok(ok(format!(
            "append-only file on (appendfsync {fsync}): fence counters survive restarts"
        )));
    }
    let finding = if aof == "yes" {
        "append-only file on but appendfsync no: a crash can lose recent fence counter updates; tokens then stay increasing only through the server clock floor".to_owned()
    } else if !save.trim().is_empty() {
        format!("RDB snapshots only (save {save:?}): a restart rolls fence counters back to the last snapshot and tokens stay increasing only through the server clock floor")
    } else {
        "no persistence: a restart forgets held locks and fence counters; tokens stay increasing only through the server clock floor".to_owned()
    };
    Ok(Status::Warn.found(
        finding,
        "CONFIG SET appendonly yes and appendfsync everysec or always (and in redis.conf)",
    ))
}

async fn check_replication(conn: &mut MultiplexedConnection) -> Result<Finding, RedisError> {
    let replication = info(conn, redis::cmd("INFO").arg("replication")).await?;
    let field = |name| replication.get(name).unwrap_or_else(|| "?".to_owned());
    if matches!(field("role").as_str(), "slave" | "replica") {
        let primary = format!("{}:{}", field("master_host"), field("master_port"));
        return Ok(Status::Fail.found(
            format!("this server is a replica of {primary}: lock scripts write, so they fail with READONLY here"),
            "point the services and --url at the primary",
        ));
    }
    let replicas = replication.get::<u64>("connected_slaves").unwrap_or(0);
    let min_replicas = number(config(conn, "min-replicas-to-write").await?.as_ref());
    Ok(if replicas == 0 {
        ok("primary without replicas: no failover can lose an acquisition")
    } else if min_replicas == 0 {
        Status::Warn.found(
            format!("primary with {replicas} replica(s), asynchronous: a failover can lose recent acquisitions and let a second holder in (fenced storage still refuses the old one)"),
            "CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 10, so the primary refuses writes no replica follows (narrows the window; it is not consensus)",
        )
    } else {
        ok(format!(
            "primary with {replicas} replica(s), min-replicas-to-write {min_replicas}"
        ))
    })
}

async fn check_cluster(conn: &mut MultiplexedConnection) -> Result<Finding, RedisError> {
    let cluster = info(conn, redis::cmd("INFO").arg("cluster")).await?;
    if cluster.get::<String>("cluster_enabled").as_deref() != Some("1") {
        return Ok(ok("standalone (cluster mode disabled)"));
    }
    let state = info(conn, redis::cmd("CLUSTER").arg("INFO")).await?;
    if state.get::<String>("cluster_state").as_deref() != Some("ok") {
        return Ok(Status::Fail.found(
            "cluster mode is enabled but the cluster is not ok (CLUSTER INFO cluster_state): locks in slots without a serving primary cannot be taken or released",
            "fix the cluster (CLUSTER INFO, CLUSTER NODES): every slot needs a reachable primary",
        ));
    }
    Ok(Status::Warn.found(
        "cluster mode is enabled: a client built with a plain URL gets MOVED for most locks, and this tool's list/show/watch/release see this node's slots only",
        "connect lock clients with LockClient::cluster_builder(nodes); run this tool against the node that owns a lock's slot",
    ))
}

async fn check_latency(
    conn: &mut MultiplexedConnection,
    pings: usize,
) -> Result<Finding, RedisError> {
    // Above this a lock operation eats a tenth of the client's 1 s response timeout.
    const SLOW: Duration = Duration::from_millis(100);
    let mut samples = Vec::with_capacity(pings);
    for _ in 0..pings {
        let start = Instant::now();
        redis::cmd("PING").query_async::<()>(conn).await?;
        samples.push(start.elapsed());
    }
    samples.sort();
    let median = samples[samples.len() / 2];
    let finding = format!(
        "median round trip {:.3} ms over {pings} PINGs (max {:.3} ms)",
        median.as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3
    );
    Ok(Status::Warn.when(median > SLOW).found(
        finding,
        "every acquire and release is a round trip and the client gives up after 1 s: move the services closer to redis, or raise response_timeout and the lease",
    ))
}

async fn check_clock(conn: &mut MultiplexedConnection) -> Result<Finding, RedisError> {
    // More than this apart means one of the two machines is not synchronised.
    const DRIFT: Duration = Duration::from_secs(1);
    const SAMPLES: usize = 5;
    // The sample with the shortest round trip bounds the error best.
    let mut best: Option<(Duration, f64)> = None;
    for _ in 0..SAMPLES {
        // The round trip is measured on the wall clock it is compared with: read on two
        // clocks, a pause between the two reads (a loaded machine) would shift the estimate
        // by that pause while the stated uncertainty left it out.
        let sent = SystemTime::now();
        let (secs, micros): (String, String) = redis::cmd("TIME").query_async(conn).await?;
        // A wall clock stepped back meanwhile: no sample.
        let Ok(rtt) = SystemTime::now().duration_since(sent) else {
            continue;
        };
        let server =
            secs.parse::<f64>().unwrap_or(0.0) + micros.parse::<f64>().unwrap_or(0.0) / 1e6;
        let local = sent.duration_since(UNIX_EPOCH).unwrap_or_default() + rtt / 2;
        let offset = server - local.as_secs_f64();
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    let (rtt, offset) = best.unwrap_or_default();
    let finding = format!(
        "server clock is {:+.3} ms from this machine's (± {:.3} ms)",
        offset * 1e3,
        rtt.as_secs_f64() * 1e3 / 2.0
    );
    Ok(Status::Warn.when(offset.abs() > DRIFT.as_secs_f64()).found(
        finding,
        "run NTP (chrony, systemd-timesyncd) on both machines: the token's clock floor assumes server clocks do not step back, and leases run on the server's clock",
    ))
}

impl Admin {
    /// Checks the server for the settings that break locks; `pings` round trips measure the
    /// latency (at least 1). Every check gives OK, WARN or FAIL with what to change; a check
    /// that cannot read its setting (a renamed `CONFIG`, an ACL) is a WARN saying so.
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// use fencelock::admin::Status;
    ///
    /// let checks = admin.doctor(10).await?;
    /// for check in &checks {
    ///     println!("{check}");
    /// }
    /// let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    /// assert!(worst <= Status::Fail);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Redis`] only when the connection fails; refused or unknown commands become
    /// WARN findings.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only (`HELLO`, `INFO`, `CONFIG GET`, `PING`, `TIME`); a dropped call
    /// changes nothing.
    pub async fn doctor(&self, pings: usize) -> Result<Vec<Check>, Error> {
        let mut conn = self.conn.clone();
        let protocol = if self.resp3 {
            ok("RESP3 (HELLO 3): waiters get release messages as push messages")
        } else {
            Status::Fail.found(
                "the server refused HELLO 3: LockClient needs RESP3 and cannot connect",
                "use redis 6.2 or newer and do not rename or deny HELLO",
            )
        };
        // One at a time, in this order: a lost connection ends the doctor at once.
        Ok(vec![
            settle("version", check_version(&mut conn).await)?,
            Check::new("protocol", protocol),
            settle("maxmemory-policy", check_eviction(&mut conn).await)?,
            settle("persistence", check_persistence(&mut conn).await)?,
            settle("replication", check_replication(&mut conn).await)?,
            settle("cluster", check_cluster(&mut conn).await)?,
            settle("latency", check_latency(&mut conn, pings.max(1)).await)?,
            settle("clock", check_clock(&mut conn).await)?,
        ])
    }

    /// Whether any lock, semaphore hold or read-write lock hold under the prefix has been
    /// held longer than `max` (by the server's clock, from each hold's token: see
    /// [`LockInfo::held_for`](super::LockInfo::held_for)): FAIL naming the longest ones (a
    /// stuck holder: a task that never left its critical section, a process hung with its
    /// watchdog still renewing) with their holders as `list` names them, OK otherwise:
    ///
    /// ```text
    /// FAIL max-hold         1 hold(s) older than 5m: lock stuck held by 5f0c2e9a:3 (client checkout-7f9c, label order-8812) for 1h12m05s
    /// ```
    ///
    /// Elections are left out: a leader is meant to lead for long. Jobs and idempotency keys
    /// hold for at most their `at_most_for`. For `fencelock doctor --max-hold 5m`, which a cron
    /// job or a probe runs to alert.
    ///
    /// # Errors
    /// As [`Admin::locks`], [`Admin::semaphores`] and [`Admin::rwlocks`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn check_hold_ages(&self, max: Duration) -> Result<Check, Error> {
        let mut long: Vec<(Duration, String)> = Vec::new();
        // A hold held `held`, `what` it is and who holds it, kept when it is older than `max`.
        let mut note = |held: Option<Duration>, what: String| {
            long.extend(held.filter(|held| *held > max).map(|held| (held, what)));
        };
        for lock in self.locks().await? {
            let holder = lock.holders.first();
            let id = holder.map_or("?", |h| h.id.as_str());
            let client = holder.and_then(|h| h.client_name.as_deref());
            let by = held_by(id, client, lock.label.as_deref());
            note(lock.held_for, format!("lock {} {by}", lock.display_name()));
        }
        // A read-write lock's writer and readers are the holds of its hash, as a semaphore's.
        let kinds = [
            (HoldKind::Semaphore, "semaphore"),
            (HoldKind::RwLock, "read-write lock"),
        ];
        for (kind, word) in kinds {
            for (read, _) in self.all_holds(kind).await? {
                let name = read.display_name();
                for hold in read.holds {
                    let (client, label) = (hold.client_name.as_deref(), hold.label.as_deref());
                    let by = held_by(&hold.holder, client, label);
                    note(hold.held_for, format!("{word} {name} {by}"));
                }
            }
        }
        long.sort_by_key(|(held, _)| std::cmp::Reverse(*held));
        let mut shown: Vec<String> = long
            .iter()
            .take(5)
            .map(|(held, what)| format!("{what} for {}", format_duration(*held)))
            .collect();
        if long.len() > shown.len() {
            shown.push(format!("and {} more", long.len() - shown.len()));
        }
        let (count, max) = (long.len(), format_duration(max));
        let finding = match count {
            0 => format!("no hold is older than {max}"),
            _ => format!("{count} hold(s) older than {max}: {}", shown.join("; ")),
        };
        Ok(Check::new(
            "max-hold",
            Status::Fail.when(count > 0).found(
                finding,
                "find the holder's process (fencelock show NAME: the holder id starts with its \
                 client id) and end its critical section; fencelock release NAME --force evicts \
                 it (fenced storage refuses its token once the next holder writes)",
            ),
        ))
    }
}

/// `held by ID (client NAME, label LABEL)`: who holds a hold, as `list` names a holder (the
/// parts it has; the id alone when it has neither).
fn held_by(id: &str, client: Option<&str>, label: Option<&str>) -> String {
    let client = client.map(|client| format!("client {client}"));
    let label = label.map(|label| format!("label {label}"));
    let known: Vec<String> = client.into_iter().chain(label).collect();
    if known.is_empty() {
        format!("held by {id}")
    } else {
        format!("held by {id} ({})", known.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::held_by;

    #[test]
    fn a_holder_is_named_by_id_client_and_label_as_far_as_known() {
        let id = "5f0c2e9a:3";
        assert_eq!(
            held_by(id, Some("checkout-7f9c"), Some("order-8812")),
            "held by 5f0c2e9a:3 (client checkout-7f9c, label order-8812)"
        );
        let client = held_by(id, Some("checkout-7f9c"), None);
        assert_eq!(client, "held by 5f0c2e9a:3 (client checkout-7f9c)");
        let label = held_by(id, None, Some("order-8812"));
        assert_eq!(label, "held by 5f0c2e9a:3 (label order-8812)");
        assert_eq!(held_by(id, None, None), "held by 5f0c2e9a:3");
    }
}
