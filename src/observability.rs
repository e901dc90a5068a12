//! What fencelock reports: tracing spans and events, and metrics. This module holds no code;
//! the names and fields below are a stable interface (renaming one is a breaking change).
//!
//! # Tracing
//!
//! fencelock emits through the [`tracing`](https://docs.rs/tracing) facade, so any subscriber
//! sees it (`tracing-subscriber`'s `fmt`, OpenTelemetry...). Targets are the crate's module
//! paths, all under `fencelock` (`RUST_LOG=fencelock=debug` enables everything). Events carry
//! the name in the table (`Metadata::name`), so a layer can match on it.
//!
//! The `fencelock.acquire` span is created as a child of the caller's current span: a trace id
//! (or any field) on the request's span follows the request into the lock, and the
//! acquisition's event sits under both.
//!
//! ```no_run
//! # async fn demo(lock: fencelock::Lock) -> Result<(), fencelock::Error> {
//! use tracing::Instrument;
//!
//! let request = tracing::info_span!("http_request", trace_id = "4bf92f3577b34da6");
//! let guard = lock.acquire().instrument(request).await?; // fencelock.acquire is its child
//! # guard.release().await }
//! ```
//!
//! | name | kind, level | when | fields |
//! | --- | --- | --- | --- |
//! | `fencelock.acquire` | span, DEBUG | around each `acquire`, `acquire_timeout`, `try_acquire` call | `lock` (name, lossy UTF-8), `method` (`acquire` / `acquire_timeout` / `try_acquire`), `label` (the acquisition's [label](crate::Lock::with_label), when it has one) |
//! | `fencelock.multi_acquire` | span, DEBUG | around each [`MultiLock`](crate::MultiLock) acquire call | `locks` (how many), `method`, `label` (when the set has one) |
//! | `fencelock.acquire` | event, DEBUG (WARN for `error`) | when that call returns, inside the span | `outcome` (`acquired` / `busy` / `timeout` / `error`), `waited_us` (time in the call, µs), `contended` (the call found the lock held and queued for it), `token` and `holder` (when acquired), `error` (when `error`) |
//! | `fencelock.wait` | event, DEBUG | inside the `fencelock.acquire` span (or a semaphore's or read-write lock's acquire), when a call that found its lock held has its place in this client's FIFO queue for it: from here on it is woken by releases | `holder` (the holder id it will have if it wins), `ahead` (waiters of this client ahead of it: in fair handoff, the turns of its client before its own), `channel` (the release channel it waits on, lossy UTF-8: the lock's or semaphore's key, a read-write lock writer's waiting-writers key) |
//! | `fencelock.release` | event, DEBUG (WARN unless released) | when a guard's release ends: `release()`, or the background release of a dropped guard | `lock`, `holder`, `token`, `method` (`release` / `drop` / `set`: released with its multi-lock set), `outcome` (`released`: the lock is free / `exited`: an inner re-entry left, the holder still holds it / `not_held`: it was no longer this holder's / `error`: Redis could not be reached, the lease will free it), `held_us` (since the holder acquired the lock, µs), `remaining` (entries left, when released or exited), `error` |
//! | `fencelock.renew` | event, DEBUG (WARN for `error`) | after each watchdog renewal script call (one per batch of up to `renew_batch` locks) | `locks` (in the batch), `outcome` (`ok` / `error`), `renewed` and `lost` (when `ok`: leases extended, locks found gone or taken over), `error` |
//! | `fencelock.handoff` | event, DEBUG | a release that freed a lock (or a semaphore hold's permits) granted it in the same call to a waiting task of this client (one-round-trip handoff); that release's own `fencelock.release` event follows | `lock` (the lock's or semaphore's name), `from` (the releasing holder), `to` (the waiter's holder id), `token` (the waiter's), `permits` (granted: the semaphore waiter's, 1 for a lock) |
//! | `fencelock.batch` | event, DEBUG | reads of one read-write lock of this client that met on the way to one server (one hash slot of a cluster) went as one script call (`rw_read_many.lua`), or releases of holds of one semaphore or read-write lock did (`sem_release_many.lua`); each still has its own events | `client` (the client's [`id`](crate::LockClient::id)), `operations` (how many shared the call) |
//! | `fencelock.lost` | event, WARN | once per holder, when it learns it lost the lock | `lock`, `holder`, `token`, `reason` (`renewal_refused`: a renewal found it gone or taken over / `lease_expired`: the lease ran out by this process' clock without a successful renewal / `not_held`: a re-entry, extension or release was refused) |
//! | `fencelock.stale_write` | event, WARN | a [`FencedResource`](crate::FencedResource) write was refused for a stale token | `resource` (name), `presented` (the refused token), `latest` (the resource's high-water mark) |
//! | `fencelock.leader` | event, DEBUG | a candidate became leader (its metadata recorded), or a leader resigned successfully; a leadership lost behind the leader's back is the `fencelock.lost` event of its lock | `election` (name, lossy UTF-8), `leader` (holder id), `term`, `change` (`elected` / `resigned`) |
//! | `fencelock.job` | event, DEBUG (WARN for `error`) | when a [`Job::run_exclusive`](crate::Job::run_exclusive) or [`Job::run_fallible`](crate::Job::run_fallible) call decided a tick: skipped, ran, or failed | `job` (name, lossy UTF-8), `tick_ms` (the caller's view of the tick, ms since the epoch), `outcome` (`ran` / `ran_failed` (the job returned an error and the tick is left to a retry) / `skipped_running` / `skipped_done` / `skipped_abandoned` / `skipped_late` / `error`), `runner` and `runner_token` (when skipped: the record's runner, if any), `token`, `took_over` and `run_ms` (when ran: the run's token, the dead runner's token it took over, the run time by the server's clock), `error` |
//! | `fencelock.idempotent` | event, DEBUG (WARN for `error`; a reused key, `key_reused`, is the client's mistake and stays at DEBUG) | when an [`Idempotency::run`](crate::Idempotency::run) call ended: ran here, or answered without running | `namespace` and `key` (lossy UTF-8), `outcome` (`ran` / `ran_final` / `ran_failed` / `completed` / `in_progress` / `abandoned` / `key_reused` / `error`), `runner` and `runner_token` (when answered: the record's runner, if any), `token`, `took_over` and `run_ms` (when ran), `error` |
//! | `fencelock.semaphore` | event, DEBUG (WARN for `error`) | when a [`Semaphore`](crate::Semaphore) acquire call ended | `semaphore` (name, lossy UTF-8), `method`, `permits` (asked for), `outcome` (`acquired` / `busy` / `timeout` / `error`), `token`, `holder` and `limit` (when acquired), `label` (the handle's [label](crate::Semaphore::with_label), when it has one), `error`; a permit's release is a `fencelock.release` event with the semaphore's name as `lock` |
//! | `fencelock.rwlock` | event, DEBUG (WARN for `error`) | when an [`RwLock`](crate::RwLock) acquire call ended | `lock` (name, lossy UTF-8), `mode` (`read` / `write`), `method`, `outcome` (`acquired` / `busy` / `timeout` / `error`), `label` (the handle's [label](crate::RwLock::with_label), when it has one), `error`; releases are `fencelock.release` events |
//! | `fencelock.long_hold` | event, WARN | once per hold, at the first watchdog round (every third of the default lease) that finds it held for the client's [`max_hold`](crate::LockClientBuilder::max_hold) or longer; holds with a lease of their own included | `lock` (name, lossy UTF-8), `holder`, `token`, `label` (a lock's, semaphore permit's or read-write hold's; empty without one), `held_ms` (since the acquire's reply, by this process' clock), `max_hold_ms` |
//! | `fencelock.eviction_risk` | event, WARN | once per `connect`, when the server's `maxmemory-policy` can evict lock data | `message` (the policy, what it can evict, the fix) |
//! | `fencelock.untested_server` | event, WARN | once per `connect`, when the server is older than every tested release of its flavour (or of a flavour nobody tested) | `server` (flavour and version), `tested` (the tested releases) |
//! | `fencelock.eviction_check_failed` | event, DEBUG | once per `connect`, when `CONFIG GET maxmemory-policy` is refused (ACL, renamed command) | `error` |
//!
//! Tokens are integers; holder ids are `<client id>:<sequence>` ([`LockClient::id`](crate::LockClient::id)).
//! Other DEBUG events (retries of an operation with the same id, undoing an abandoned
//! operation) are diagnostics without a stable name.
//!
//! # Metrics
//!
//! With the cargo feature `metrics`, fencelock records through the
//! [`metrics`](https://docs.rs/metrics) facade (0.24) into whatever recorder the application
//! installed (Prometheus exporter, StatsD...). Without the feature nothing is recorded and the
//! crate does not depend on `metrics`.
//!
//! | metric | type | labels | counts |
//! | --- | --- | --- | --- |
//! | `fencelock_acquisitions_total` | counter | `outcome` = `acquired` / `busy` / `timeout` / `error` | acquire calls (`acquire`, `acquire_timeout`, `try_acquire`), by how they ended |
//! | `fencelock_contended_total` | counter | | acquire calls that found the lock held and had to wait |
//! | `fencelock_wait_seconds` | histogram | | time spent in each acquire call, whatever its outcome |
//! | `fencelock_hold_seconds` | histogram | | from acquisition to the release that freed the lock (one sample per holder that released; lost locks have none) |
//! | `fencelock_renewals_total` | counter | | leases the watchdog renewed |
//! | `fencelock_renewal_calls_total` | counter | | renewal script calls (each renews up to `renew_batch` locks); equals [`LockClient::renewal_calls`](crate::LockClient::renewal_calls) summed over clients |
//! | `fencelock_lost_leases_total` | counter | | holders that learnt they lost their lock (the `fencelock.lost` event) |
//! | `fencelock_stale_writes_rejected_total` | counter | | fenced writes refused for a stale token, including a job run's finish refused because another runner took its tick over (claiming reads that are refused are not counted) |
//! | `fencelock_leadership_changes_total` | counter | `change` = `elected` / `resigned` | leaders elected and resignations (as the `fencelock.leader` event) |
//! | `fencelock_job_ticks_total` | counter | `outcome` = `ran` / `ran_failed` / `skipped_running` / `skipped_done` / `skipped_abandoned` / `skipped_late` / `error` | [`Job::run_exclusive`](crate::Job::run_exclusive) calls, by outcome (as the `fencelock.job` event) |
//! | `fencelock_idempotent_runs_total` | counter | `outcome` = `ran` / `ran_final` / `ran_failed` / `completed` / `in_progress` / `abandoned` / `key_reused` / `error` | [`Idempotency::run`](crate::Idempotency::run) calls, by outcome (as the `fencelock.idempotent` event) |
//! | `fencelock_semaphore_acquisitions_total` | counter | `outcome` = `acquired` / `busy` / `timeout` / `error` | [`Semaphore`](crate::Semaphore) acquire calls, by outcome; their releases count in `fencelock_releases_total` |
//! | `fencelock_rwlock_acquisitions_total` | counter | `mode` = `read` / `write`; `outcome` = `acquired` / `busy` / `timeout` / `error` | [`RwLock`](crate::RwLock) acquire calls, by side and outcome; releases count in `fencelock_releases_total` |
//! | `fencelock_holds` | gauge | | holds of this client alive: acquired, and not yet released, dropped or given up (a re-entry is no new hold; locks, multi-lock members, semaphore permits and read-write lock holds) |
//! | `fencelock_long_holds_total` | counter | | holds found held past the client's [`max_hold`](crate::LockClientBuilder::max_hold), each counted once (the label is in the `fencelock.long_hold` event, not a metric label: request ids are unbounded) |
//! | `fencelock_releases_total` | counter | `outcome` = `released` / `exited` / `not_held` / `error` | releases, explicit and of dropped guards, by outcome (as the `fencelock.release` event); an explicit release that failed goes on from the guard's drop and counts once, with the outcome it ends with |
//!
//! Three more gauges are read from the client rather than recorded, for an exporter to poll:
//! [`LockClient::watched_locks`](crate::LockClient::watched_locks) (holds the watchdog keeps
//! alive), [`LockClient::renewal_calls`](crate::LockClient::renewal_calls) (the watchdog's load
//! on Redis) and [`LockClient::replica_ack_connections`](crate::LockClient::replica_ack_connections)
//! (connections opened for replica acknowledgement).
//!
//! No metric is labelled by lock name, on purpose: names are data of unbounded variety (a
//! lock per account or order), and every distinct label value is one more time series kept
//! forever by the recorder and the monitoring system. Per-lock detail is in the events above,
//! which carry the name; aggregate the metrics per client or per service instead.
