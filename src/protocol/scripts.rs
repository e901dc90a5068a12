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
    // A script or library of `lua/` by name.
    macro_rules! lua {
        ($name:literal) => {
            include_str!(concat!("../../lua/", $name, ".lua"))
        };
    }
    // The libraries (lua/lib), each before every script that calls it, after the libraries it
    // calls itself: Redis scripts cannot import, so each script is loaded as its libraries'
    // text followed by its own. Each script gets only the libraries it calls: each function a
    // script defines costs every call of it (lua/lib/calls.lua).
    let calls = lua!("lib/calls");
    let clock = lua!("lib/clock");
    let next_token = lua!("lib/next_token");
    let acquire = lua!("lib/acquire");
    let release = lua!("lib/release");
    let fair = lua!("lib/fair");
    let fenced = [lua!("lib/fence_mark")];
    let run_record = lua!("lib/run_record");
    let runs = [calls, clock, run_record];
    let idem = [calls, clock, run_record, lua!("lib/idem_record")];
    let (sem_holds, take, give) = (
        lua!("lib/sem_holds"),
        lua!("lib/sem_take"),
        lua!("lib/sem_give"),
    );
    let holds = [clock, sem_holds];
    let giving = [clock, sem_holds, give];
    let taking = [clock, sem_holds, next_token, take];
    let handing = [clock, sem_holds, next_token, take, give];
    let rw = [clock, sem_holds, next_token, take, lua!("lib/rw")];
    let text = |libs: &[&str], script: &str| [libs, &[script]].concat().concat();
    let load =
        |name: &str, libs: &[&str], script: &str| Script::new(&source(name, &text(libs, script)));
    Scripts {
        acquire: load("acquire", &[next_token, acquire], lua!("acquire")),
        acquire_fair: load(
            "acquire_fair",
            &[calls, clock, next_token, acquire, fair],
            lua!("acquire_fair"),
        ),
        release_fair: load(
            "release_fair",
            &[calls, clock, release, fair],
            lua!("release_fair"),
        ),
        leave_fair: load("leave_fair", &[calls, clock, fair], lua!("leave_fair")),
        acquire_all: load(
            "acquire_all",
            &[clock, next_token, acquire],
            lua!("acquire_all"),
        ),
        release_all: load("release_all", &[calls, release], lua!("release_all")),
        reenter: load("reenter", &[calls], lua!("reenter")),
        release: load("release", &[release], lua!("release")),
        handoff: load("handoff", &[next_token, acquire, release], lua!("handoff")),
        extend: load("extend", &[calls], lua!("extend")),
        cancel: load("cancel", &[calls], lua!("cancel")),
        renew: load("renew", &[], lua!("renew")),
        fenced_write: load("fenced_write", &fenced, lua!("fenced_write")),
        fenced_read: load("fenced_read", &fenced, lua!("fenced_read")),
        force_release: load("force_release", &[calls, clock], lua!("force_release")),
        permissions: load("permissions", &[], lua!("permissions")),
        announce: load("announce", &[calls], lua!("announce")),
        leader: load("leader", &[calls], lua!("leader")),
        wait_record: load("wait_record", &[clock], lua!("wait_record")),
        job_begin: load("job_begin", &runs, lua!("job_begin")),
        job_finish: load("job_finish", &runs, lua!("job_finish")),
        job_read: load("job_read", &runs, lua!("job_read")),
        idem_begin: load("idem_begin", &idem, lua!("idem_begin")),
        idem_finish: load("idem_finish", &runs, lua!("idem_finish")),
        idem_read: load("idem_read", &idem, lua!("idem_read")),
        sem_acquire: load("sem_acquire", &taking, lua!("sem_acquire")),
        sem_release: load("sem_release", &giving, lua!("sem_release")),
        sem_handoff: load("sem_handoff", &handing, lua!("sem_handoff")),
        sem_cancel: load("sem_cancel", &holds, lua!("sem_cancel")),
        sem_renew: load("sem_renew", &holds, lua!("sem_renew")),
        sem_limit: load("sem_limit", &holds, lua!("sem_limit")),
        hold_reenter: load("hold_reenter", &holds, lua!("hold_reenter")),
        rw_acquire: load("rw_acquire", &rw, lua!("rw_acquire")),
        rw_downgrade: load("rw_downgrade", &holds, lua!("rw_downgrade")),
        sem_release_many: load("sem_release_many", &giving, lua!("sem_release_many")),
        rw_read_many: load("rw_read_many", &rw, lua!("rw_read_many")),
    }
}

/// The production scripts, hashed on first use.
pub(crate) fn production() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| build(|_, text| text.to_owned()))
}
