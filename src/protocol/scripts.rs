//! The Lua scripts, loaded once per process and invoked by SHA.
//!
//! [`redis::Script`] sends `EVALSHA` and, when the server answers `NOSCRIPT` (first use, after
//! `SCRIPT FLUSH`, after a restart), loads the body and retries, so callers never see that error.

use std::sync::OnceLock;

use redis::Script;

/// Every script of the protocol. See `lua/` for each one's contract.
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) acquire_fair: Script,
    pub(crate) release_fair: Script,
    pub(crate) leave_fair: Script,
    pub(crate) acquire_all: Script,
    pub(crate) release_all: Script,
    pub(crate) reenter: Script,
    pub(crate) release: Script,
    pub(crate) handoff: Script,
    pub(crate) extend: Script,
    pub(crate) cancel: Script,
    pub(crate) renew: Script,
    pub(crate) fenced_write: Script,
    pub(crate) fenced_read: Script,
    pub(crate) force_release: Script,
    pub(crate) permissions: Script,
    pub(crate) announce: Script,
    pub(crate) leader: Script,
    pub(crate) job_begin: Script,
    pub(crate) job_finish: Script,
    pub(crate) job_read: Script,
    pub(crate) idem_begin: Script,
    pub(crate) idem_finish: Script,
    pub(crate) idem_read: Script,
    pub(crate) sem_acquire: Script,
    pub(crate) sem_release: Script,
    pub(crate) sem_handoff: Script,
    pub(crate) sem_cancel: Script,
    pub(crate) sem_renew: Script,
    pub(crate) sem_limit: Script,
    pub(crate) hold_reenter: Script,
    pub(crate) rw_acquire: Script,
    pub(crate) rw_downgrade: Script,
    pub(crate) rw_read_many: Script,
    pub(crate) sem_release_many: Script,
    pub(crate) wait_record: Script,
}

/// Builds the scripts from their sources, each passed through `source(name, text)` first
/// (the identity in production; the negative controls of test builds substitute broken
/// lines).
pub(crate) fn build(source: impl Fn(&str, &str) -> String) -> Scripts {
    let fence_mark = include_str!("../../lua/lib/fence_mark.lua");
    let hash_field = include_str!("../../lua/lib/hash_field.lua");
    let run_record = include_str!("../../lua/lib/run_record.lua");
    let idem_record = include_str!("../../lua/lib/idem_record.lua");
    // The run-record scripts: hash_field and run_record before each, idem_record before the
    // idempotency scripts that answer a key's record.
    let run = |name: &str, libs: &[&str], text: &str| {
        let text = [&[hash_field, run_record][..], libs, &[text]]
            .concat()
            .concat();
        Script::new(&source(name, &text))
    };
    let sem_holds = include_str!("../../lua/lib/sem_holds.lua");
    let next_token = include_str!("../../lua/lib/next_token.lua");
    let load = |name: &str, text: &str| Script::new(&source(name, text));
    Scripts {
        acquire: load(
            "acquire",
            &[next_token, include_str!("../../lua/acquire.lua")].concat(),
        ),
        acquire_fair: load(
            "acquire_fair",
            &[next_token, include_str!("../../lua/acquire_fair.lua")].concat(),
        ),
        release_fair: load("release_fair", include_str!("../../lua/release_fair.lua")),
        leave_fair: load("leave_fair", include_str!("../../lua/leave_fair.lua")),
        acquire_all: load("acquire_all", include_str!("../../lua/acquire_all.lua")),
        release_all: load("release_all", include_str!("../../lua/release_all.lua")),
        reenter: load("reenter", include_str!("../../lua/reenter.lua")),
        release: load("release", include_str!("../../lua/release.lua")),
        handoff: load(
            "handoff",
            &[next_token, include_str!("../../lua/handoff.lua")].concat(),
        ),
        extend: load("extend", include_str!("../../lua/extend.lua")),
        cancel: load("cancel", include_str!("../../lua/cancel.lua")),
        renew: load("renew", include_str!("../../lua/renew.lua")),
        fenced_write: load(
            "fenced_write",
            &[fence_mark, include_str!("../../lua/fenced_write.lua")].concat(),
        ),
        fenced_read: load(
            "fenced_read",
            &[fence_mark, include_str!("../../lua/fenced_read.lua")].concat(),
        ),
        force_release: load("force_release", include_str!("../../lua/force_release.lua")),
        permissions: load("permissions", include_str!("../../lua/permissions.lua")),
        announce: load("announce", include_str!("../../lua/announce.lua")),
        leader: load("leader", include_str!("../../lua/leader.lua")),
        wait_record: load("wait_record", include_str!("../../lua/wait_record.lua")),
        job_begin: run("job_begin", &[], include_str!("../../lua/job_begin.lua")),
        job_finish: run("job_finish", &[], include_str!("../../lua/job_finish.lua")),
        job_read: run("job_read", &[], include_str!("../../lua/job_read.lua")),
        idem_begin: run(
            "idem_begin",
            &[idem_record],
            include_str!("../../lua/idem_begin.lua"),
        ),
        idem_finish: run(
            "idem_finish",
            &[],
            include_str!("../../lua/idem_finish.lua"),
        ),
        idem_read: run(
            "idem_read",
            &[idem_record],
            include_str!("../../lua/idem_read.lua"),
        ),
        sem_acquire: load(
            "sem_acquire",
            &[
                sem_holds,
                next_token,
                include_str!("../../lua/sem_acquire.lua"),
            ]
            .concat(),
        ),
        sem_release: load(
            "sem_release",
            &[sem_holds, include_str!("../../lua/sem_release.lua")].concat(),
        ),
        sem_handoff: load(
            "sem_handoff",
            &[
                sem_holds,
                next_token,
                include_str!("../../lua/sem_handoff.lua"),
            ]
            .concat(),
        ),
        sem_cancel: load(
            "sem_cancel",
            &[sem_holds, include_str!("../../lua/sem_cancel.lua")].concat(),
        ),
        sem_renew: load(
            "sem_renew",
            &[sem_holds, include_str!("../../lua/sem_renew.lua")].concat(),
        ),
        sem_limit: load(
            "sem_limit",
            &[sem_holds, include_str!("../../lua/sem_limit.lua")].concat(),
        ),
        hold_reenter: load(
            "hold_reenter",
            &[sem_holds, include_str!("../../lua/hold_reenter.lua")].concat(),
        ),
        rw_acquire: load(
            "rw_acquire",
            &[
                sem_holds,
                next_token,
                include_str!("../../lua/rw_acquire.lua"),
            ]
            .concat(),
        ),
        rw_downgrade: load(
            "rw_downgrade",
            &[sem_holds, include_str!("../../lua/rw_downgrade.lua")].concat(),
        ),
        sem_release_many: load(
            "sem_release_many",
            &[sem_holds, include_str!("../../lua/sem_release_many.lua")].concat(),
        ),
        rw_read_many: load(
            "rw_read_many",
            &[
                sem_holds,
                next_token,
                include_str!("../../lua/rw_read_many.lua"),
            ]
            .concat(),
        ),
    }
}

/// The production scripts, hashed on first use.
pub(crate) fn production() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| build(|_, text| text.to_owned()))
}
