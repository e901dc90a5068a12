//! `fencelock`: the operator's tool for the locks of a Redis deployment.
//!
//! ```text
//! cargo run -p fencelock-cli -- --url redis://127.0.0.1:7000/ list
//! fencelock list [--held-longer 5m] [--json]  every held lock: name, holders, token, held
//!                                          for, lease
//! fencelock elections [--json]             every led election: leader, term, metadata, lease,
//!                                          candidates
//! fencelock jobs [--json]                  every scheduled job: last tick, state, runner, token
//! fencelock semaphores [--json]            every semaphore in use: limit, permits, holders
//! fencelock rwlocks [--json]               every read-write lock in use: writer, readers,
//!                                          waiting writers
//! fencelock set-limit NAME N               the limit of a semaphore in use, at once
//! fencelock show NAME                      one lock (held or free), its fence counter, waiters
//! fencelock watch NAME [--count N] [--for 30s] [--interval 100ms]
//! fencelock release NAME --force [--yes] [--token T]   evict the holder, wake the waiters
//! fencelock release NAME --force (--semaphore | --rwlock) --holder ID [--yes]
//!                                          release one stuck permit holder, reader or writer
//! fencelock keys [NAMESPACE] [--json]      every idempotency key with a record: state,
//!                                          runner, token, age
//! fencelock key NAMESPACE KEY              one idempotency key: its record and stored result
//! fencelock forget NAMESPACE KEY [--yes]   delete a key's record nobody holds: its next run
//!                                          runs the request as new
//! fencelock waits [--deadlock-after 30s]  who waits for what, then the wait-for cycles whose
//!                                          waits all lasted that long (default 30s)
//! fencelock doctor [--pings N] [--strict] [--max-hold 5m] [--deadlock-after 30s]  the server
//!                                          settings that break locks; with --max-hold, holds
//!                                          older than that; always, the wait-for cycles older
//!                                          than --deadlock-after (default 30s)
//! ```
//!
//! The work is done by `fencelock::admin`; this file parses arguments, prints and chooses the
//! exit code (the table is [`EXIT_CODES`], also in `--help`).
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fencelock::admin::{format_duration, Admin, ForceRelease, HoldKind, HoldRelease, Status};
use fencelock::{Error, FencingToken};
use serde_json::{json, Value};

mod json;
mod keys;
mod waits;

use json::{
    check_json, election_json, event_json, holder_json, job_json, lock_json, now_rfc3339,
    rwlock_json, semaphore_json,
};

/// The exit codes, as `--help` prints them.
const EXIT_CODES: &str = "\
Exit codes:
  0  done (an empty list and a free lock are answers too); doctor: no FAIL
  1  doctor --strict: at least one WARN, no FAIL
  2  usage: bad arguments, lock name, prefix or URL
  3  redis cannot be reached, refused the credentials (WRONGPASS, NOAUTH), or the user may
     not read the keys under the prefix (ACL); the message names the rule to add
  4  release: the lock is not held, nothing to release; key, forget: the key has no record
  5  doctor: at least one FAIL (a setting that breaks locks; with --max-hold, a hold older
     than that)
  6  release refused: not confirmed, or the lock changed hands since it was shown; forget
     refused: not confirmed, a run holds the key, or another run took it over since it was
     shown
  7  any other error (a redis error reply, foreign data at a lock key)";

/// How long every wait of a wait-for cycle must have lasted before `waits` reports it and the
/// doctor fails on it, unless `--deadlock-after` says otherwise: one value for both, so `waits`
/// shows exactly the cycles the doctor would fail on. A real deadlock lasts until someone acts,
/// so the bound only keeps out cycles that end by themselves: an acquisition with a timeout
/// giving up, or a dead holder's lease running out. 30 s is the default lease: a cycle older
/// than that is one the watchdogs keep renewing, which no lease will end.
const DEADLOCK_AFTER: &str = "30s";

const USAGE: u8 = 2;
const UNREACHABLE: u8 = 3;
const STRICT_WARN: u8 = 1;
const DOCTOR_FAIL: u8 = 5;
const NOT_FOUND: u8 = 4;
const REFUSED: u8 = 6;
const OTHER: u8 = 7;

/// Inspect and repair the fencelock locks on a Redis server.
#[derive(Parser)]
#[command(name = "fencelock", version, after_help = EXIT_CODES)]
struct Cli {
    /// Redis URL: `redis://[user:password@]host:port/[db]` or `redis+unix:///path/to/socket`
    #[arg(long, env = "REDIS_URL", hide_env_values = true, global = true)]
    url: Option<String>,

    /// Key prefix the services use (LockClientBuilder::prefix)
    #[arg(long, default_value = "fencelock:", global = true)]
    prefix: String,

    /// Machine-readable output: one JSON document (watch: one JSON object per line)
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every held lock under the prefix (SCAN, never KEYS): name, holders with re-entry
    /// counts, token, how long it has been held (from its token), remaining lease
    List {
        /// Only the locks held longer than this (500ms, 30s, 5m, 1h), by the server's clock
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        held_longer: Option<Duration>,
    },
    /// Every election under the prefix whose lock is held (SCAN, never KEYS): leader id, term,
    /// metadata, remaining lease, queued candidates (fair handoff) and subscribed connections
    /// (clients with waiting candidates or followers)
    Elections,
    /// Every scheduled job under the prefix with a tick record (SCAN, never KEYS): the newest
    /// tick, its state (running, done, failed, abandoned), runner, token and run time
    Jobs,
    /// Every semaphore in use under the prefix (SCAN, never KEYS): its limit, the permits in
    /// use, and each hold's holder id, permits, token, remaining lease, client name and label
    Semaphores,
    /// Every read-write lock in use under the prefix (SCAN, never KEYS): its writer, readers
    /// (holder id, token, remaining lease, client name, label) and waiting writers
    Rwlocks,
    /// Change the limit of a semaphore in use at once (every acquisition from now on is judged
    /// by it; holds above a lowered limit keep their permits until they leave). An idle
    /// semaphore has no limit recorded: its next acquisition records its own
    SetLimit {
        /// The semaphore name
        name: OsString,
        /// The new limit (at least 1)
        limit: u32,
    },
    /// One lock in detail: holders, token, lease, the fence counter of its bucket, waiters;
    /// with --semaphore or --rwlock, one semaphore or read-write lock (as semaphores and
    /// rwlocks show each)
    Show {
        /// The lock name
        name: OsString,
        /// NAME is a semaphore: its limit, permits in use and holds
        #[arg(long, conflicts_with = "rwlock")]
        semaphore: bool,
        /// NAME is a read-write lock: its writer, readers and waiting writers
        #[arg(long)]
        rwlock: bool,
    },
    /// Print acquisitions, re-entries and releases of one lock as they happen, until Ctrl-C,
    /// --count or --for. Polls the lock every --interval and listens to its release channel
    Watch {
        /// The lock name
        name: OsString,
        /// Stop after this many events
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this long (500ms, 30s, 5m, 1h)
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
        duration: Option<Duration>,
        /// How often to read the lock
        #[arg(long, default_value = "100ms", value_parser = parse_duration)]
        interval: Duration,
    },
    /// Evict the holder of a lock: delete it, raise its fence counter to the evicted token,
    /// wake the waiters. Fenced storage refuses the evicted holder's token once the next
    /// holder has claimed or written it
    #[command(group = clap::ArgGroup::new("hold_kind").args(["semaphore", "rwlock"]))]
    Release {
        /// The lock name
        name: OsString,
        /// Required: an operator does not hold the lock, so a release is always forced
        #[arg(long, required = true)]
        force: bool,
        /// Do not ask for confirmation on stdin
        #[arg(long)]
        yes: bool,
        /// Evict only if the lock is still held with this token (as shown by list or show)
        #[arg(long, conflicts_with_all = ["semaphore", "rwlock"])]
        token: Option<u64>,
        /// NAME is a semaphore: release the hold --holder (as shown by semaphores)
        #[arg(long, requires = "holder", conflicts_with = "rwlock")]
        semaphore: bool,
        /// NAME is a read-write lock: release the reader or writer --holder (as shown by
        /// rwlocks)
        #[arg(long, requires = "holder")]
        rwlock: bool,
        /// The holder id of the hold to release (with --semaphore or --rwlock; a lock is
        /// released by its token, --token)
        #[arg(long, requires = "hold_kind")]
        holder: Option<String>,
    },
    /// Who waits for what right now: each acquisition waiting at the head of its client's
    /// queue for a second or more (what it waits for, its label, how long, what its task
    /// holds), then the wait-for cycles among them whose waits all lasted --deadlock-after
    /// (possible deadlocks)
    Waits {
        /// Report a cycle only when every wait in it has lasted this long (500ms, 30s, 5m); the
        /// doctor's default too
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = DEADLOCK_AFTER)]
        deadlock_after: Duration,
    },
    /// Every idempotency key with a record under the prefix (SCAN, never KEYS), of NAMESPACE
    /// only if given: its state (running, done, failed, abandoned), runner, token, age and
    /// stored result's size
    Keys {
        /// Only the keys of this namespace
        namespace: Option<OsString>,
    },
    /// One idempotency key: its record, fingerprint and stored result
    Key {
        /// The namespace (Idempotency::namespace)
        namespace: OsString,
        /// The key within it
        key: OsString,
    },
    /// Delete an idempotency key's record when no run holds the key: its next run runs the
    /// request as new (a key given up after its runner died, a result known to be wrong).
    /// Refused while a run holds the key
    Forget {
        /// The namespace (Idempotency::namespace)
        namespace: OsString,
        /// The key within it
        key: OsString,
        /// Do not ask for confirmation on stdin
        #[arg(long)]
        yes: bool,
    },
    /// Check the server for settings that break locks (eviction, persistence, replication,
    /// cluster, version, latency, clock) and say what to change. FAIL: locks are not safe
    /// (exit 5); WARN: a guarantee is weaker (exit 0, or 1 with --strict)
    Doctor {
        /// How many PINGs measure the round trip
        #[arg(long, default_value_t = 10)]
        pings: usize,
        /// Exit 1 on a WARN too (a FAIL is always exit 5)
        #[arg(long)]
        strict: bool,
        /// Also FAIL when a lock, semaphore or read-write lock hold is older than this (5m,
        /// 1h): a stuck holder, for a cron job or a probe to alert on
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        max_hold: Option<Duration>,
        /// FAIL on a wait-for cycle (a possible deadlock) whose waits all lasted this long; the
        /// default of waits too
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = DEADLOCK_AFTER)]
        deadlock_after: Duration,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(url) = cli.url.as_deref() else {
        return ExitCode::from(fail(USAGE, "no redis URL: pass --url or set REDIS_URL"));
    };
    let outcome = match Admin::connect_with_prefix(url, &cli.prefix).await {
        Ok(admin) => run(&cli, &admin).await,
        Err(err) => Err(err),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(err) => report(&err, url, &cli.prefix),
    }
}

async fn run(cli: &Cli, admin: &Admin) -> Result<u8, Error> {
    match &cli.command {
        Command::List { held_longer } => list(cli, admin, *held_longer).await,
        Command::Elections => elections(cli, admin).await,
        Command::Jobs => jobs(cli, admin).await,
        Command::Semaphores => semaphores(cli, admin).await,
        Command::Rwlocks => rwlocks(cli, admin).await,
        Command::SetLimit { name, limit } => set_limit(cli, admin, &bytes(name), *limit).await,
        Command::Show {
            name,
            semaphore: true,
            ..
        } => show_hold(cli, admin, HoldKind::Semaphore, &bytes(name)).await,
        Command::Show {
            name, rwlock: true, ..
        } => show_hold(cli, admin, HoldKind::RwLock, &bytes(name)).await,
        Command::Show { name, .. } => show(cli, admin, &bytes(name)).await,
        Command::Watch {
            name,
            count,
            duration,
            interval,
        } => watch(cli, admin, &bytes(name), *count, *duration, *interval).await,
        Command::Release {
            name,
            yes,
            semaphore,
            rwlock,
            holder: Some(holder),
            ..
        } if *semaphore || *rwlock => {
            let kind = if *semaphore {
                HoldKind::Semaphore
            } else {
                HoldKind::RwLock
            };
            release_hold(cli, admin, kind, &bytes(name), holder, *yes).await
        }
        Command::Release {
            name, yes, token, ..
        } => release(cli, admin, &bytes(name), *yes, *token).await,
        Command::Waits { deadlock_after } => waits::waits(cli, admin, *deadlock_after).await,
        Command::Keys { namespace } => {
            keys::keys(cli, admin, namespace.as_ref().map(bytes).as_deref()).await
        }
        Command::Key { namespace, key } => {
            keys::key(cli, admin, &bytes(namespace), &bytes(key)).await
        }
        Command::Forget {
            namespace,
            key,
            yes,
        } => keys::forget(cli, admin, &bytes(namespace), &bytes(key), *yes).await,
        Command::Doctor {
            pings,
            strict,
            max_hold,
            deadlock_after,
        } => doctor(cli, admin, *pings, *strict, *max_hold, *deadlock_after).await,
    }
}

async fn list(cli: &Cli, admin: &Admin, held_longer: Option<Duration>) -> Result<u8, Error> {
    let mut locks = admin.locks().await?;
    if let Some(min) = held_longer {
        locks.retain(|lock| lock.held_for.is_some_and(|held| held > min));
        let none = format!(
            "no lock is held longer than {} under prefix {:?}",
            format_duration(min),
            cli.prefix
        );
        print_all(cli, &locks, lock_json, &none);
        return Ok(0);
    }
    if locks.is_empty() && !admin.prefix_in_use().await? {
        // An answer, not an error; the hint goes to stderr so `--json` stays one document.
        eprintln!(
            "fencelock: no fencelock key at all under prefix {:?}: nothing was ever locked there \
             (is --prefix right?)",
            cli.prefix
        );
    }
    let none = format!("no lock is held under prefix {:?}", cli.prefix);
    print_all(cli, &locks, lock_json, &none);
    Ok(0)
}

/// Prints `items` as one JSON array (`--json`), or one per line, or `none` when there are none.
fn print_all<T: std::fmt::Display>(cli: &Cli, items: &[T], to_json: fn(&T) -> Value, none: &str) {
    if cli.json {
        println!("{}", Value::Array(items.iter().map(to_json).collect()));
    } else if items.is_empty() {
        println!("{none}");
    } else {
        for item in items {
            println!("{item}");
        }
    }
}

async fn elections(cli: &Cli, admin: &Admin) -> Result<u8, Error> {
    let elections = admin.elections().await?;
    let none = format!("no election is led under prefix {:?}", cli.prefix);
    print_all(cli, &elections, election_json, &none);
    Ok(0)
}

async fn jobs(cli: &Cli, admin: &Admin) -> Result<u8, Error> {
    let jobs = admin.jobs().await?;
    // Nothing of a job outlives its tick record (its lock is gone by then too), so an empty
    // list cannot tell jobs that never ran from records that expired: say both.
    let none = format!(
        "no scheduled job has a tick record under prefix {:?}: none has run there, or the \
         records of those that ran have expired (each is kept for its job's retention, \
         JobOptions::with_retention)",
        cli.prefix
    );
    print_all(cli, &jobs, job_json, &none);
    Ok(0)
}

async fn semaphores(cli: &Cli, admin: &Admin) -> Result<u8, Error> {
    let semaphores = admin.semaphores().await?;
    let none = format!("no semaphore is in use under prefix {:?}", cli.prefix);
    print_all(cli, &semaphores, semaphore_json, &none);
    Ok(0)
}

async fn rwlocks(cli: &Cli, admin: &Admin) -> Result<u8, Error> {
    let rwlocks = admin.rwlocks().await?;
    let none = format!("no read-write lock is in use under prefix {:?}", cli.prefix);
    print_all(cli, &rwlocks, rwlock_json, &none);
    Ok(0)
}

async fn set_limit(cli: &Cli, admin: &Admin, name: &[u8], limit: u32) -> Result<u8, Error> {
    let shown = String::from_utf8_lossy(name);
    match admin.set_semaphore_limit(name, limit).await? {
        Some(old) => {
            if cli.json {
                println!("{}", json!({"name": shown, "limit": limit, "was": old}));
            } else {
                println!("semaphore {shown}: limit {limit} (was {old})");
            }
            Ok(0)
        }
        None => Ok(fail(
            NOT_FOUND,
            &format!(
                "semaphore {shown} is not in use: no limit is recorded; its next acquisition \
                 records its handle's"
            ),
        )),
    }
}

/// Asks on stdin whether to go ahead; EOF or an unreadable stdin counts as "no".
fn confirmed(question: &str) -> bool {
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    // A terminal echoed the operator's Enter; piped input did not.
    if !std::io::stdin().is_terminal() {
        eprintln!();
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

async fn release_hold(
    cli: &Cli,
    admin: &Admin,
    kind: HoldKind,
    name: &[u8],
    holder: &str,
    yes: bool,
) -> Result<u8, Error> {
    let shown = String::from_utf8_lossy(name);
    let what = match kind {
        HoldKind::Semaphore => "semaphore",
        _ => "read-write lock",
    };
    if !yes
        && !confirmed(&format!(
            "release hold {holder} of {what} {shown}? Its permits go to the waiters at once; the \
             holder learns at its next renewal."
        ))
    {
        return Ok(fail(
            REFUSED,
            &format!("hold {holder} of {shown} not released"),
        ));
    }
    match admin.release_hold(kind, name, holder).await? {
        HoldRelease::Released => {
            if cli.json {
                println!(
                    "{}",
                    json!({"released": true, "name": shown, "holder": holder})
                );
            } else {
                println!("released hold {holder} of {what} {shown}");
            }
            Ok(0)
        }
        _ => Ok(fail(
            NOT_FOUND,
            &format!("{what} {shown} has no hold {holder}; nothing released"),
        )),
    }
}

async fn show(cli: &Cli, admin: &Admin, name: &[u8]) -> Result<u8, Error> {
    let detail = admin.lock(name).await?;
    if cli.json {
        println!(
            "{}",
            json!({
                "lock": lock_json(&detail.lock),
                "held": detail.lock.is_held(),
                "slot": detail.slot,
                "fence_key": String::from_utf8_lossy(&detail.fence_key),
                "fence": detail.fence,
                "fence_shared_by": "every lock name in the same slot bucket",
                "subscribers": detail.subscribers,
            })
        );
    } else {
        println!("{detail}");
    }
    // A free lock is an answer ("state free"), not something missing.
    Ok(0)
}

/// One semaphore or read-write lock; exit NOT_FOUND when it is not in use.
async fn show_hold(cli: &Cli, admin: &Admin, kind: HoldKind, name: &[u8]) -> Result<u8, Error> {
    let shown = String::from_utf8_lossy(name);
    let (text, json) = match kind {
        HoldKind::Semaphore => match admin.semaphore(name).await? {
            Some(info) => (info.to_string(), semaphore_json(&info)),
            None => return Ok(fail(NOT_FOUND, &format!("semaphore {shown} is not in use"))),
        },
        _ => match admin.rwlock(name).await? {
            Some(info) => (info.to_string(), rwlock_json(&info)),
            None => {
                return Ok(fail(
                    NOT_FOUND,
                    &format!("read-write lock {shown} is not in use"),
                ))
            }
        },
    };
    if cli.json {
        println!("{json}");
    } else {
        println!("{text}");
    }
    Ok(0)
}

async fn watch(
    cli: &Cli,
    admin: &Admin,
    name: &[u8],
    count: Option<u64>,
    duration: Option<Duration>,
    interval: Duration,
) -> Result<u8, Error> {
    // Registered before the header is printed: a Ctrl-C from then on ends the watch cleanly.
    let mut stop = Stop::new();
    let mut watch = admin.watch(name, interval).await?;
    let current = watch.current();
    if cli.json {
        println!(
            "{}",
            json!({"at": now_rfc3339(), "event": "watching", "lock": lock_json(current)})
        );
    } else {
        println!(
            "watching {} (polling every {}): {current}",
            current.display_name(),
            format_duration(interval)
        );
    }
    let deadline = duration.map(|d| tokio::time::Instant::now() + d);
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        tokio::select! {
            event = watch.next() => {
                let event = event?;
                if cli.json {
                    println!("{}", event_json(&event));
                } else {
                    println!("{} {event}", now_rfc3339());
                }
                seen += 1;
            }
            () = stop.wait() => break,
            () = sleep_until(deadline) => break,
        }
    }
    eprintln!("fencelock: watch ended after {seen} event(s)");
    Ok(0)
}

async fn release(
    cli: &Cli,
    admin: &Admin,
    name: &[u8],
    yes: bool,
    expected: Option<u64>,
) -> Result<u8, Error> {
    let detail = admin.lock(name).await?;
    let shown = detail.lock.display_name();
    if !detail.lock.is_held() {
        return Ok(fail(
            NOT_FOUND,
            &format!("lock {shown} is not held; nothing to release"),
        ));
    }
    let held_with = detail.lock.token.map_or("?".into(), |t| t.to_string());
    if let Some(expected) =
        expected.filter(|e| detail.lock.token.map(FencingToken::get) != Some(*e))
    {
        return Ok(fail(
            REFUSED,
            &format!(
                "lock {shown} is held with token {held_with}, not {expected}; nothing released"
            ),
        ));
    }
    if !yes {
        eprint!(
            "force-release {}? The holder is evicted at once and its token {} is fenced off \
             once the next holder claims or writes its resources. [y/N] ",
            detail.lock,
            detail.lock.token.map_or("?".into(), |t| t.to_string())
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        // EOF or an unreadable stdin counts as "no".
        let _ = std::io::stdin().lock().read_line(&mut answer);
        // A terminal echoed the operator's Enter; piped input did not.
        if !std::io::stdin().is_terminal() {
            eprintln!();
        }
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            return Ok(fail(REFUSED, &format!("lock {shown} not released")));
        }
    }
    match admin.force_release(name, detail.lock.token).await? {
        ForceRelease::Evicted {
            holder,
            token,
            fence,
        } => {
            if cli.json {
                println!(
                    "{}",
                    json!({
                        "released": true,
                        "holder": holder_json(&holder),
                        "token": token.map(FencingToken::get),
                        "fence": fence,
                    })
                );
            } else {
                println!(
                    "force-released {shown}: evicted holder {} (count {}, token {}); fence \
                     counter now {fence}, so the next token is greater; waiters were notified. \
                     Fenced resources refuse token {} once the next holder claims or writes them.",
                    holder.id,
                    holder.count,
                    token.map_or("?".into(), |t| t.to_string()),
                    token.map_or("?".into(), |t| t.to_string()),
                );
            }
            Ok(0)
        }
        ForceRelease::NotHeld => Ok(fail(
            NOT_FOUND,
            &format!("lock {shown} was released in the meantime; nothing to release"),
        )),
        ForceRelease::OtherToken { token } => Ok(fail(
            REFUSED,
            &format!(
                "lock {shown} changed hands since it was read (now token {}); nothing released, \
                 look again",
                token.map_or("?".into(), |t| t.to_string())
            ),
        )),
        other => Ok(fail(OTHER, &format!("unexpected outcome {other:?}"))),
    }
}

async fn doctor(
    cli: &Cli,
    admin: &Admin,
    pings: usize,
    strict: bool,
    max_hold: Option<Duration>,
    deadlock_after: Duration,
) -> Result<u8, Error> {
    let mut checks = admin.doctor(pings).await?;
    if let Some(max) = max_hold {
        checks.push(admin.check_hold_ages(max).await?);
    }
    checks.push(admin.check_deadlocks(deadlock_after).await?);
    let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    if cli.json {
        let all: Vec<Value> = checks.iter().map(check_json).collect();
        println!("{}", json!({"status": worst.to_string(), "checks": all}));
    } else {
        for check in &checks {
            println!("{check}");
        }
        println!("overall: {worst}");
    }
    Ok(match worst {
        Status::Fail => DOCTOR_FAIL,
        Status::Warn if strict => STRICT_WARN,
        _ => 0,
    })
}

/// Prints one line on stderr and gives the exit code to return.
fn fail(code: u8, message: &str) -> u8 {
    eprintln!("fencelock: {}", message.replace('\n', " "));
    code
}

fn report(err: &Error, url: &str, prefix: &str) -> ExitCode {
    let url = redact(url);
    let (code, message) = match err {
        e if e.is_invalid_input() => (USAGE, e.to_string()),
        e if e.is_auth_refused() => (
            UNREACHABLE,
            format!("redis at {url} refused the credentials: {e} (check the user and password in the URL)"),
        ),
        Error::PermissionDenied { detail } => (
            UNREACHABLE,
            format!(
                "redis at {url} refused this user access to the locks under prefix {prefix:?}: \
                 {detail}. Grant it the prefix and the tool's commands, for example: ACL SETUSER \
                 <user> ~{prefix}* &{prefix}* +scan +hgetall +pttl +type +get +multi +exec \
                 +pubsub|numsub +subscribe +unsubscribe +evalsha +script|load +info +config|get \
                 +ping +time, and for release and set-limit the services' own commands too \
                 (the README's Security section; +publish, +spublish on a cluster), or run it \
                 as an admin user"
            ),
        ),
        e if e.is_connection() => (UNREACHABLE, format!("cannot reach redis at {url}: {e}")),
        e => (OTHER, e.to_string()),
    };
    ExitCode::from(fail(code, &message))
}

/// The URL without its password, for error messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let rest = rest.split_once('?').map_or(rest, |(path, _)| path);
    match rest.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}"),
        None => format!("{scheme}://{rest}"),
    }
}

#[cfg(unix)]
fn bytes(name: &OsString) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes().to_vec()
}

#[cfg(not(unix))]
fn bytes(name: &OsString) -> Vec<u8> {
    name.to_string_lossy().into_owned().into_bytes()
}

/// `500ms`, `30s`, `1.5s`, `5m`, `1h 30m` (humantime's forms); a bare number is seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string());
    }
    humantime::parse_duration(text)
        .map_err(|err| format!("{text:?} is not a duration like 500ms, 30s, 5m ({err})"))
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Ctrl-C (and on unix SIGTERM), registered when created so that none is missed later.
struct Stop {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Stop {
    fn new() -> Stop {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Stop {
                signals: signal(SignalKind::interrupt())
                    .and_then(|i| Ok((i, signal(SignalKind::terminate())?)))
                    .ok(),
            }
        }
        #[cfg(not(unix))]
        Stop {}
    }

    async fn wait(&mut self) {
        #[cfg(unix)]
        match &mut self.signals {
            Some((interrupt, terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            None => std::future::pending().await,
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_usual_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        // humantime's forms: several units, long unit names.
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("3 days"), Ok(Duration::from_secs(259_200)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 fortnights").is_err());
    }

    #[test]
    fn passwords_never_reach_the_error_message() {
        assert_eq!(
            redact("redis://user:secret@127.0.0.1:7000/0"),
            "redis://***@127.0.0.1:7000/0"
        );
        assert_eq!(
            redact("redis+unix:///tmp/r.sock?pass=secret"),
            "redis+unix:///tmp/r.sock"
        );
        assert_eq!(redact("redis://127.0.0.1:7000/"), "redis://127.0.0.1:7000/");
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        let now = now_rfc3339();
        assert_eq!(now.len(), "2026-01-02T03:04:05.678Z".len(), "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
    }
}
