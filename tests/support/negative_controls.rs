//! Negative controls: deliberately broken variants of the protocol, for proving that the
//! property tests can fail.
//!
//! **Test builds only.** This file is the library's module `protocol::controls`, compiled into
//! the crate (from `src/protocol/mod.rs`) only when it is built with
//! `--cfg fencelock_negative_controls`: the workspace's `.cargo/config.toml` sets it for the
//! project's own builds; a dependent crate never gets it, no cargo feature turns it on, and
//! the published package does not ship this file. It lives with the tests because it is test
//! scaffolding, not part of the protocol a reader of `src/` has to hold.
//!
//! Even then nothing changes unless a client is built with
//! [`LockClientBuilder::negative_control`](crate::LockClientBuilder::negative_control): the
//! broken variant is chosen per client, at run time, so tests of one binary running in
//! parallel cannot affect each other, and a client without a control runs exactly the
//! production scripts and code paths.
//!
//! A Lua control is derived from the real script text at load time by one exact textual
//! substitution. If the pattern is no longer in the script (the script changed), the control
//! no longer applies: [`Control::applies`] names the script and the pattern, so a test built
//! on the control can say so and step aside while the rest of the suite goes on judging the
//! changed script by its behaviour; the pattern check (the unit test below) fails naming
//! it; and a client that would load the control anyway panics: a control can never
//! silently become the correct protocol.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::scripts::{self, Scripts};

/// Declares [`Control`] from its variants, each with its docs and the substitutions
/// `(script, pattern, replacement)` it makes to the Lua scripts (none for controls that break
/// Rust code instead), and with them [`Control::ALL`].
macro_rules! controls {
    ($($(#[$doc:meta])* $name:ident => [$(($script:expr, $pattern:expr, $replacement:expr $(,)?)),* $(,)?],)+) => {
        /// One deliberately broken variant of the protocol. Each names what it breaks; the property
        /// that catches it is listed in DESIGN.md §10 and asserted by `tests/model/controls.rs`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Control {
            $($(#[$doc])* $name,)+
        }

        impl Control {
            /// Every control.
            pub const ALL: [Control; [$(Control::$name),+].len()] = [$(Control::$name),+];

            /// The substitutions `(script, pattern, replacement)` this control makes to the Lua
            /// scripts; empty for controls that break Rust code instead.
            fn substitutions(self) -> &'static [(&'static str, &'static str, &'static str)] {
                match self {
                    $(Control::$name => &[$(($script, $pattern, $replacement)),*],)+
                }
            }
        }
    };
}

/// The condition of `lib/fence_mark.lua` under which a resource has no floor, and its broken
/// form (never a floor).
const RETENTION_FLOOR: &str = "if retention == 0 or exclusive > 0 or shared > 0 then";
const RETENTION_NO_FLOOR: &str = "if true then";
/// The line of `lib/sem_holds.lua` that finds the expired holds, and its broken form.
const SEM_PURGE: &str = "redis.pcall('ZRANGEBYSCORE', leases, '-inf', int_text(now))";
const SEM_NO_PURGE: &str = "{}";
/// The owner check of `lib/run_record.lua`'s begin (jobs and idempotency keys alike).
const RUN_OWNER_CHECK: &str =
    "if not held or redis.call('HGET', run.lock, '~token') ~= run.token then";
/// The answer of `lib/run_record.lua`'s begin for a run that finished.
const RUN_DONE: &str = "return run.record(run.key, 2, recorded)";
/// The lines of `lib/release.lua` that read a release's own op record, that replay the mark
/// the freeing release left on the holder's acquire record, and that publish the release
/// (release.lua and handoff.lua run them).
const RELEASE_RECORD: &str = "local done = not first and redis.call('GET', keys[2])";
const RELEASE_MARK: &str = "if redis.call('GET', keys[3]) == 'r:' .. argv[4] then";
const RELEASE_PUBLISH: &str =
    "  redis.call(argv[3] == 'sharded' and 'SPUBLISH' or 'PUBLISH', keys[1], 'released')\n";
/// The test of `lib/sem_holds.lua` by which a release that ends the last hold skips its drop,
/// and its broken form (every release skips it).
const SEM_EMPTIES: &str = "if FIELD_EXPIRY or USED > permits then";
const SEM_ALWAYS_EMPTIES: &str = "if FIELD_EXPIRY then";
/// The op record a recorded send of a new lock hold leaves (`lib/acquire.lua`'s grant).
const LOCK_RECORD: &str = "  if op then\n    redis.call('SET', op, 'a', 'PX', ttl)\n  end\n";
/// A read-write lock's writer preference: a waiting writer's mark keeps new readers out
/// (`lib/rw.lua`, run by rw_acquire.lua and rw_read_many.lua).
const RW_WRITER_PREFERENCE: &str = "not (reading and #marked > 0)";

controls! {
    /// `acquire.lua` grants the lock even when another holder has it.
    AcquireIgnoresHolder => [(
        "acquire",
        "if reply or held then\n  return reply or {0, redis.call('PTTL', KEYS[1])}\nend",
        "if held and not reply then\n  redis.call('DEL', KEYS[1])\nend\nif reply then\n  return reply\nend",
    )],
    /// `acquire.lua` takes a free lock whatever its op record says: the first send of an
    /// acquisition that arrives after its cancel (sent on another connection) takes the lock
    /// for nobody.
    AcquireIgnoresOpRecord => [(
        "acquire",
        "local found = redis.call('EXISTS', lock, op)\n  local done = found > 0 and redis.call('GET', op)",
        "local found = redis.call('EXISTS', lock)\n  local done = false",
    )],
    /// `acquire.lua` takes over a lock key that holds data of another type instead of
    /// refusing it.
    AcquireOverwritesForeignData => [(
        "acquire",
        "  if type(count) == 'table' then\n",
        "  if type(count) == 'table' then\n    redis.call('DEL', lock)\n    return nil, false\n  end\n  if false then\n",
    )],
    /// `acquire.lua` issues the previous token again instead of a new one.
    AcquireReusesToken => [(
        "acquire",
        "and string.find(counter, '^%d+$') then\n    return text",
        "and string.find(counter, '^%d+$') then\n    redis.call('SET', fence_key, counter or text, 'KEEPTTL')\n    return counter or text",
    )],
    /// `reenter.lua` bumps the lock's token on every re-entry.
    ReentryBumpsToken => [(
        "reenter",
        "local token = redis.call('HGET', KEYS[1], '~token')",
        // '%.0f', not tostring: tostring prints 14 significant digits, which rounds a
        // 16-digit token to a multiple of 100, and so back to the holder's own token
        // for one token in a hundred (the bump would then go unseen by the client).
        "local token = string.format('%.0f', redis.call('HINCRBY', KEYS[1], '~token', 1))",
    )],
    /// `release.lua` takes a non-holder's release for the last entry: it frees the lock,
    /// whoever holds it.
    // A non-holder's release is taken for the last entry: it frees whoever's lock it
    // is (as the old HINCRBY -1 without an owner check did).
    // In both release scripts: a release that hands the lock on frees it as well.
    ReleaseWithoutOwnerCheck => [
        (
            "release",
            "if not count then\n",
            "if not count then\n  count = '1'\nend\nif false then\n",
        ),
        (
            "handoff",
            "if not count then\n",
            "if not count then\n  count = '1'\nend\nif false then\n",
        ),
    ],
    /// `release.lua` frees the lock without publishing on its channel.
    ReleaseDoesNotPublish => [
        ("release", RELEASE_PUBLISH, ""),
        ("handoff", RELEASE_PUBLISH, ""),
    ],
    /// `release.lua` and `reenter.lua` ignore their operation record, so a re-sent request
    /// applies twice.
    // Both records a release replays from: its own, and the mark the freeing release
    // leaves on the holder's acquire record.
    RetriesApplyTwice => [
        ("release", RELEASE_RECORD, "local done = false"),
        ("release", RELEASE_MARK, "if false then"),
        ("handoff", RELEASE_RECORD, "local done = false"),
        ("handoff", RELEASE_MARK, "if false then"),
        (
            "reenter",
            "local done = redis.call('GET', KEYS[2])",
            "local done = false",
        ),
    ],
    /// `extend.lua` extends for a holder that does not hold the lock.
    ExtendWithoutOwnerCheck => [
        ("extend", "if held == 0 then", "if false then"),
    ],
    /// `renew.lua` renews every lock key (and reports it renewed), whoever holds it.
    // Every key is renewed and reported renewed, whoever holds it.
    RenewWithoutOwnerCheck => [
        ("renew", "if held == 1 then", "if true then"),
    ],
    /// `fenced_write.lua` accepts only tokens strictly above the mark (`>` for `>=`).
    FenceStrictlyGreater => [(
        "fenced_write",
        "if token < mark then",
        "if token <= mark then",
    )],
    /// `fenced_write.lua` accepts every token.
    FenceNoCheck => [
        ("fenced_write", "if token < mark then", "if false then"),
    ],
    /// `fenced_read.lua`'s shared read raises the exclusive mark, as a claim does: readers of
    /// one hold refuse each other.
    SharedReadClaims => [(
        "fenced_read",
        "    redis.call('SET', KEYS[3], ARGV[1])",
        "    redis.call('SET', KEYS[2], ARGV[1])",
    )],
    /// `fenced_read.lua`'s shared read records nothing: a writer older than the readers can
    /// still write under them.
    SharedReadDoesNotFence => [(
        "fenced_read",
        "    redis.call('SET', KEYS[3], ARGV[1])\n",
        "",
    )],
    /// A resource kept for a retention forgets its floor: once its marks expired, any token
    /// writes or claims it.
    // The floor is shared by both fenced scripts (lib/fence_mark.lua): break it in each.
    RetentionForgetsExpiry => [
        ("fenced_write", RETENTION_FLOOR, RETENTION_NO_FLOOR),
        ("fenced_read", RETENTION_FLOOR, RETENTION_NO_FLOOR),
    ],
    /// An acquire or re-entry whose caller gave up is never undone (no compensating cancel).
    CancelMissingOnDrop => [],
    /// `acquire.lua` records no send: a copy of an acquisition that was re-sent takes the lock
    /// again when it arrives after the hold ended.
    ResendLeavesNoRecord => [(
        "acquire",
        LOCK_RECORD,
        "",
    )],
    /// `acquire_fair.lua` records no send (as [`Control::ResendLeavesNoRecord`]).
    FairResendLeavesNoRecord => [(
        "acquire_fair",
        LOCK_RECORD,
        "",
    )],
    /// `sem_acquire.lua` records no send: a late copy takes the permits again.
    SemResendLeavesNoRecord => [(
        "sem_acquire",
        "if ARGV[9] == '1' then\n  redis.call('SET', KEYS[4], 'a', 'PX', ARGV[5])\nend",
        "",
    )],
    /// `sem_acquire.lua`'s look for a free semaphore leaves out its op record: the first send
    /// of an acquisition whose cancel came first takes the permits for nobody.
    SemAcquireIgnoresOpRecord => [(
        "sem_acquire",
        "nil, nil, {KEYS[4], unpack(KEYS, 5)})",
        "nil, nil, {unpack(KEYS, 5)})",
    )],
    /// `rw_acquire.lua`'s look for a free lock leaves out its op record: the first send of an
    /// acquisition whose cancel came first takes the lock for nobody.
    RwAcquireIgnoresOpRecord => [(
        "rw_acquire",
        "KEYS[3], nil, {KEYS[5]})",
        "KEYS[3], nil, {})",
    )],
    /// A hold's release skips its drop even when other holds remain (`lib/sem_holds.lua`'s
    /// sem_empties, run by sem_release.lua and sem_release_many.lua): the released hold keeps
    /// its field, its lease and its permits.
    SemReleaseSkipsItsDrop => [
        ("sem_release", SEM_EMPTIES, SEM_ALWAYS_EMPTIES),
        ("sem_release_many", SEM_EMPTIES, SEM_ALWAYS_EMPTIES),
    ],
    /// `rw_acquire.lua` records no send: a late copy takes the read-write lock again.
    RwResendLeavesNoRecord => [(
        "rw_acquire",
        "if ARGV[8] == '1' then\n  redis.call('SET', KEYS[5], 'a', 'PX', ARGV[5])\nend",
        "",
    )],
    /// An acquisition that got a definite "busy" stops its undo even though an earlier send's
    /// outcome is unknown: that copy takes the lock after the caller gave up, for nobody.
    StragglerNotUndone => [],
    /// The client sends every release with `release.lua` ARGV[5] = 0, re-sends and releases of
    /// re-entered holds included: a copy of such a release reads no op record and applies
    /// twice.
    ReleaseResentAsFirst => [],
    /// The watchdog keeps renewing a holder whose guards are all gone.
    WatchdogIgnoresDrop => [],
    /// The holder's lease is measured from the reply instead of from the send.
    LeaseFromReply => [],
    /// `acquire_fair.lua` (fair handoff) claims a reservation without deleting it: the held
    /// lock keeps `~reserved`, so another waiter of the same client claims it again, over the
    /// holder.
    ClaimKeepsReservation => [(
        "acquire_fair",
        "if claim then\n  redis.call('DEL', KEYS[1])\nelse\n",
        "if claim then\nelse\n",
    )],
    /// `announce.lua` records the caller's metadata whoever holds the election, and with any
    /// term: a late announcement of a deposed leader lands next to the new leader's term.
    AnnounceWithoutOwnerCheck => [(
        "announce",
        "if not held or redis.call('HGET', KEYS[1], '~token') ~= ARGV[2] then",
        "if false then",
    )],
    /// `announce.lua` records the metadata without publishing `elected`.
    AnnounceDoesNotPublish => [(
        "announce",
        "publish(ARGV[4], KEYS[1], 'elected')\n",
        "",
    )],
    /// `leader.lua` trusts `~leader` without checking that it names a holder of the hash.
    LeaderTrustsRecord => [(
        "leader",
        "redis.call('HEXISTS', KEYS[1], leader) == 1",
        "true",
    )],
    /// `job_begin.lua` records a tick for a caller that does not hold the job's lock with its
    /// token.
    JobBeginWithoutOwnerCheck => [(
        "job_begin",
        RUN_OWNER_CHECK,
        "if false then",
    )],
    /// `job_finish.lua` records the tick done whoever took it over since.
    JobFinishWithoutFence => [(
        "job_finish",
        "if recorded and tonumber(recorded) > token then",
        "if false then",
    )],
    /// `job_begin.lua` runs a tick again that is recorded done.
    JobRerunsDoneTick => [
        ("job_begin", RUN_DONE, "return begin(0)"),
    ],
    /// `job_begin.lua` runs a tick older than the newest one begun.
    JobRunsOlderTick => [(
        "job_begin",
        "return tick_record(KEYS[2], 4, recorded)",
        "return 'new'",
    )],
    /// `job_begin.lua` ignores that a run failed and left its tick to a retry: the tick is
    /// given up like a dead runner's.
    JobGivesUpFailedTick => [(
        "job_begin",
        "if run.policy == 'run-again' or redis.call('HGET', run.key, 'failed') then",
        "if run.policy == 'run-again' then",
    )],
    /// `idem_begin.lua` records a run for a caller that does not hold the key's lock with its
    /// token.
    KeyBeginWithoutOwnerCheck => [(
        "idem_begin",
        RUN_OWNER_CHECK,
        "if false then",
    )],
    /// `idem_finish.lua` stores a result whoever took the key over since: an older run
    /// overwrites the newer one's record.
    KeyResultWithoutFence => [(
        "idem_finish",
        "if recorded and tonumber(recorded) > token then",
        "if false then",
    )],
    /// `idem_begin.lua` runs a key again whose result is stored.
    KeyRerunsDone => [
        ("idem_begin", RUN_DONE, "return begin(0)"),
    ],
    /// `idem_begin.lua` ignores the recorded fingerprint: a key reused for another request
    /// runs it.
    KeyIgnoresFingerprint => [(
        "idem_begin",
        "if redis.call('HGET', KEYS[2], 'fingerprint') ~= ARGV[3] then",
        "if false then",
    )],
    /// `sem_acquire.lua` grants permits however many are held already.
    SemAcquireIgnoresLimit => [(
        "sem_acquire",
        "if wanted > limit or used + wanted + head_need > limit then",
        "if wanted > limit then",
    )],
    /// The semaphore scripts never drop an expired hold: a crashed holder's permits stay
    /// counted until the whole semaphore expires.
    // The shared purge is prepended to every semaphore script: break it in each.
    SemKeepsExpiredHolds => [
        ("sem_acquire", SEM_PURGE, SEM_NO_PURGE),
        ("sem_release", SEM_PURGE, SEM_NO_PURGE),
        ("sem_cancel", SEM_PURGE, SEM_NO_PURGE),
        ("sem_renew", SEM_PURGE, SEM_NO_PURGE),
    ],
    /// `sem_acquire.lua` does not recognise its own hold: a re-sent acquisition whose first
    /// copy ran is answered as a late duplicate, and the permits it holds are orphaned.
    SemResendNotRecognised => [(
        "sem_acquire",
        "if hold.live then",
        "if false then",
    )],
    /// `sem_renew.lua` renews a hold whose lease has already passed.
    SemRenewRevivesExpired => [(
        "sem_renew",
        "if sem and sem.live then",
        "if sem and sem.held then",
    )],
    /// `sem_acquire.lua` (fair mode) grants a request that leaves the queue head short.
    SemIgnoresQueueHead => [(
        "sem_acquire",
        "if wanted > limit or used + wanted + head_need > limit then",
        "if wanted > limit or used + wanted > limit then",
    )],
    /// `rw_acquire.lua` lets new readers in while a writer waits (no writer preference).
    RwReadersIgnoreWaitingWriter => [(
        "rw_acquire",
        RW_WRITER_PREFERENCE,
        "true",
    )],
    /// `rw_acquire.lua` grants the write hold while readers hold the lock.
    RwWriterIgnoresReaders => [(
        "rw_acquire",
        "local wanted = writing and RW_LIMIT or 1",
        "local wanted = writing and 1 or 1",
    )],
    /// `rw_downgrade.lua` answers done but leaves the hold a writer's, so readers stay out.
    RwDowngradeKeepsWriting => [
        ("rw_downgrade", "if permits > 1 then", "if false then"),
    ],
    /// `rw_read_many.lua` lets grouped readers in while a writer waits (no writer preference
    /// for reads that share a call).
    RwGroupedReadersIgnoreWaitingWriter => [(
        "rw_read_many",
        RW_WRITER_PREFERENCE,
        "true",
    )],
    /// `rw_read_many.lua` writes no op record for a recorded send: a late copy of a grouped
    /// read takes the lock again after its hold ended.
    RwGroupedResendLeavesNoRecord => [(
        "rw_read_many",
        "    if recorded(i) then\n      redis.call('SET', KEYS[4 + i], 'a', 'PX', ARGV[3])\n    end\n",
        "",
    )],
    /// `sem_release_many.lua` ends a re-entered hold at its first release: the entries left
    /// are lost, and the hold's other guards hold nothing.
    SemGroupedReleaseIgnoresEntries => [(
        "sem_release_many",
        "if hold.live and hold.entries > 1 then",
        "if false then",
    )],
    /// `sem_release_many.lua` publishes nothing: waiters of a lock its releases freed sleep
    /// until their timers.
    SemGroupedReleaseDoesNotPublish => [(
        "sem_release_many",
        "  sem_publish(KEYS[1], ARGV[3], writers)\n",
        "",
    )],
    /// `handoff.lua` grants the freed lock to this client's waiter even while another client
    /// listens on the channel: a client's own waiters pass the others over.
    HandoffIgnoresOtherClients => [(
        "handoff",
        "and listeners[2] <= 1",
        "",
    )],
    /// `handoff.lua` grants the lock to a candidate whose acquisition was cancelled: the lock
    /// is held for nobody until its lease ends.
    HandoffIgnoresCancel => [(
        "handoff",
        "alone and not redis.call('GET', KEYS[5]) and take_token",
        "alone and take_token",
    )],
    /// A waiter that leaves while a release may have granted it the lock does not undo the
    /// grant: the lock is held for nobody until its lease ends.
    HandoffGrantNotUndone => [],
    /// `sem_handoff.lua` grants the freed permits to this client's waiter even while another
    /// client listens on the semaphore's channel.
    SemHandoffIgnoresOtherClients => [(
        "sem_handoff",
        "and listeners[2] <= 1",
        "",
    )],
    /// `sem_handoff.lua` grants permits to a candidate whose acquisition was cancelled: they
    /// are held for nobody until the lease ends.
    SemHandoffIgnoresCancel => [(
        "sem_handoff",
        "and not redis.call('GET', KEYS[6])",
        "",
    )],
    /// `sem_handoff.lua` grants a candidate without checking that its permits fit under the
    /// limit, or that it does not hold already (whose permits it would count twice).
    SemHandoffIgnoresRoom => [(
        "sem_handoff",
        "used + wanted <= limit and not redis.call('GET', KEYS[6])\n      and not redis.call('HGET', KEYS[1], ARGV[5]) then",
        "not redis.call('GET', KEYS[6]) then",
    )],
}

impl Control {
    /// Whether every substitution of this control finds its pattern exactly once in the
    /// current scripts. `Err` says which script and pattern no longer match: the control would
    /// not break what it claims to, so a test built on it has nothing to judge until the
    /// control is updated with the script.
    pub fn applies(self) -> Result<(), String> {
        // `scripts::build` visits every script by name; it takes an `Fn`, hence the cell.
        let problems = std::cell::RefCell::new(Vec::new());
        scripts::build(|name, text| {
            problems
                .borrow_mut()
                .extend(pattern_problems(self, name, text));
            text.to_owned()
        });
        let problems = problems.into_inner();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// What is wrong with `control`'s patterns for script `name`: one line per pattern that does
/// not occur exactly once in `text`.
fn pattern_problems(control: Control, name: &str, text: &str) -> Vec<String> {
    control
        .substitutions()
        .iter()
        .filter(|(script, _, _)| *script == name)
        .filter_map(|(script, pattern, _)| {
            let found = text.matches(pattern).count();
            (found != 1).then(|| {
                format!(
                    "negative control {control:?} no longer applies: its pattern {pattern:?} \
                     occurs {found} times in {script}.lua (expected once); update the control \
                     with the script"
                )
            })
        })
        .collect()
}

/// Applies `control`'s substitutions for script `name` to `text`.
///
/// # Panics
/// When a pattern does not occur exactly once in the script it names (see
/// [`Control::applies`]): loading the control anyway would run the correct protocol under the
/// control's name.
fn patch(control: Control, name: &str, text: &str) -> String {
    let problems = pattern_problems(control, name, text);
    assert!(problems.is_empty(), "{}", problems.join("; "));
    let mut text = text.to_owned();
    for (script, pattern, replacement) in control.substitutions() {
        if *script == name {
            text = text.replacen(pattern, replacement, 1);
        }
    }
    text
}

/// The scripts a client with `control` runs: loaded once per control and kept for the
/// process' life (a handful of small scripts).
pub(crate) fn scripts_for(control: Control) -> &'static Scripts {
    static BROKEN: OnceLock<Mutex<HashMap<Control, &'static Scripts>>> = OnceLock::new();
    let mut broken = BROKEN.get_or_init(Default::default).lock();
    broken.entry(control).or_insert_with(|| {
        Box::leak(Box::new(scripts::build(|name, text| {
            patch(control, name, text)
        })))
    })
}

tokio::task_local! {
    /// The control of the client whose protocol call is running in this task, if any. Set
    /// around each call by the client (not process-wide), read when a script is picked.
    pub(crate) static CURRENT: Option<Control>;
}

/// Whether any client of this process has ever made a protocol call under a control. Until one
/// has, no task-local can be set, so the script lookup skips the task-local access: the feature
/// is compiled into every test and bench build (the dev-dependency on the crate itself), and a
/// client without a control must cost what it costs without the feature.
static ARMED: AtomicBool = AtomicBool::new(false);

/// One protocol call of a client built with `control`, with the control in scope.
pub(crate) fn scoped<F: Future>(control: Control, call: F) -> impl Future<Output = F::Output> {
    // Relaxed is enough: the store happens before the scope is entered on this task, and the
    // only reader that matters is this task's own script lookup inside `call`.
    ARMED.store(true, Ordering::Relaxed);
    CURRENT.scope(Some(control), call)
}

/// The control of the client making the current protocol call.
pub(crate) fn current() -> Option<Control> {
    if !ARMED.load(Ordering::Relaxed) {
        return None;
    }
    CURRENT.try_with(|c| *c).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lua_control_applies_to_the_current_scripts() {
        let stale: Vec<String> = Control::ALL
            .iter()
            .filter_map(|control| control.applies().err())
            .collect();
        assert!(stale.is_empty(), "{}", stale.join("\n"));
        for control in Control::ALL {
            let broken = scripts_for(control);
            let correct = scripts::production();
            let changed = [
                (&broken.acquire, &correct.acquire),
                (&broken.reenter, &correct.reenter),
                (&broken.release, &correct.release),
                (&broken.handoff, &correct.handoff),
                (&broken.extend, &correct.extend),
                (&broken.renew, &correct.renew),
                (&broken.fenced_write, &correct.fenced_write),
                (&broken.fenced_read, &correct.fenced_read),
                (&broken.acquire_fair, &correct.acquire_fair),
                (&broken.release_fair, &correct.release_fair),
                (&broken.announce, &correct.announce),
                (&broken.leader, &correct.leader),
                (&broken.job_begin, &correct.job_begin),
                (&broken.job_finish, &correct.job_finish),
                (&broken.job_read, &correct.job_read),
                (&broken.idem_begin, &correct.idem_begin),
                (&broken.idem_finish, &correct.idem_finish),
                (&broken.idem_read, &correct.idem_read),
                (&broken.sem_acquire, &correct.sem_acquire),
                (&broken.sem_release, &correct.sem_release),
                (&broken.sem_handoff, &correct.sem_handoff),
                (&broken.sem_cancel, &correct.sem_cancel),
                (&broken.sem_renew, &correct.sem_renew),
                (&broken.rw_acquire, &correct.rw_acquire),
                (&broken.rw_downgrade, &correct.rw_downgrade),
                (&broken.rw_read_many, &correct.rw_read_many),
                (&broken.sem_release_many, &correct.sem_release_many),
            ]
            .iter()
            .filter(|(b, c)| b.get_hash() != c.get_hash())
            .count();
            let expected: std::collections::HashSet<_> =
                control.substitutions().iter().map(|s| s.0).collect();
            assert_eq!(changed, expected.len(), "{control:?}");
        }
    }
}
