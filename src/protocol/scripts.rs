//! The Lua scripts, loaded once per process and invoked by SHA.
//!
//! [`redis::Script`] sends `EVALSHA` and, when the server answers `NOSCRIPT` (first use, after
//! `SCRIPT FLUSH`, after a restart), loads the body and retries, so callers never see that error.

use std::sync::OnceLock;

use redis::Script;

// A script or library of `lua/` by its path there.
macro_rules! lua {
    ($path:expr) => {
        include_str!(concat!("../../lua/", $path, ".lua"))
    };
}

// The libraries (lua/lib), each before every script that calls it, after the libraries it
// calls itself: Redis scripts cannot import, so each script is loaded as its libraries' text
// followed by its own. Each script gets only the libraries it calls: each function a script
// defines costs every call of it (lua/lib/calls.lua).
const CALLS: &str = lua!("lib/calls");
const CLOCK: &str = lua!("lib/clock");
const NEXT_TOKEN: &str = lua!("lib/next_token");
const ACQUIRE: &str = lua!("lib/acquire");
const RELEASE: &str = lua!("lib/release");
const FAIR: &str = lua!("lib/fair");
const FENCED: &[&str] = &[lua!("lib/fence_mark")];
const RUN_RECORD: &str = lua!("lib/run_record");
const RUNS: &[&str] = &[CALLS, CLOCK, RUN_RECORD];
const TICKS: &[&str] = &[CALLS, CLOCK, RUN_RECORD, lua!("lib/tick_record")];
const IDEM: &[&str] = &[CALLS, CLOCK, RUN_RECORD, lua!("lib/idem_record")];
const SEM_HOLDS: &str = lua!("lib/sem_holds");
const TAKE: &str = lua!("lib/sem_take");
const GIVE: &str = lua!("lib/sem_give");
const HOLDS: &[&str] = &[CLOCK, SEM_HOLDS];
const GIVING: &[&str] = &[CLOCK, SEM_HOLDS, GIVE];
const TAKING: &[&str] = &[CLOCK, SEM_HOLDS, NEXT_TOKEN, TAKE];
const HANDING: &[&str] = &[CLOCK, SEM_HOLDS, NEXT_TOKEN, TAKE, GIVE];
const RW: &[&str] = &[CLOCK, SEM_HOLDS, NEXT_TOKEN, TAKE, lua!("lib/rw")];

// The table of scripts: each one's name (its field, and its file in `lua/`) and the libraries
// it is loaded after.
macro_rules! scripts {
    ($($name:ident: $libs:expr,)*) => {
        /// Every script of the protocol. See `lua/` for each one's contract.
        pub(crate) struct Scripts {
            $(pub(crate) $name: Script,)*
        }

        /// Builds the scripts from their sources, each passed through `source(name, text)`
        /// first (the identity in production; the negative controls of test builds substitute
        /// broken lines).
        pub(crate) fn build(source: impl Fn(&str, &str) -> String) -> Scripts {
            let load = |name: &str, libs: &[&str], script: &str| {
                Script::new(&source(name, &[libs, &[script]].concat().concat()))
            };
            Scripts {
                $($name: load(stringify!($name), $libs, lua!(stringify!($name))),)*
            }
        }
    };
}

scripts! {
    acquire: &[NEXT_TOKEN, ACQUIRE],
    acquire_fair: &[CALLS, CLOCK, NEXT_TOKEN, ACQUIRE, FAIR],
    release_fair: &[CALLS, CLOCK, RELEASE, FAIR],
    leave_fair: &[CALLS, CLOCK, FAIR],
    acquire_all: &[CLOCK, NEXT_TOKEN, ACQUIRE],
    release_all: &[CALLS, RELEASE],
    reenter: &[CALLS],
    release: &[RELEASE],
    handoff: &[NEXT_TOKEN, ACQUIRE, RELEASE],
    extend: &[CALLS],
    cancel: &[CALLS],
    renew: &[],
    fenced_write: FENCED,
    fenced_read: FENCED,
    force_release: &[CALLS, CLOCK],
    permissions: &[],
    announce: &[CALLS],
    leader: &[CALLS],
    job_begin: TICKS,
    job_finish: RUNS,
    job_read: TICKS,
    idem_begin: IDEM,
    idem_finish: RUNS,
    idem_read: IDEM,
    sem_acquire: TAKING,
    sem_release: GIVING,
    sem_handoff: HANDING,
    sem_cancel: HOLDS,
    sem_renew: HOLDS,
    sem_limit: HOLDS,
    hold_reenter: HOLDS,
    rw_acquire: RW,
    rw_downgrade: HOLDS,
    rw_read_many: RW,
    sem_release_many: GIVING,
    wait_record: &[CLOCK],
}

/// The production scripts, hashed on first use.
pub(crate) fn production() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| build(|_, text| text.to_owned()))
}
