//! The Lua scripts, loaded once per process and invoked by SHA.
//!
//! [`redis::Script`] sends `EVALSHA` and, when the server answers `NOSCRIPT` (first use, after
//! `SCRIPT FLUSH`, after a restart), loads the body and retries, so callers never see that error.

use std::sync::OnceLock;

use redis::Script;

/// Every script of the protocol. See `lua/` for each one's contract.
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) acquire_all: Script,
    pub(crate) release_all: Script,
    pub(crate) reenter: Script,
    pub(crate) release: Script,
    pub(crate) extend: Script,
    pub(crate) cancel: Script,
    pub(crate) renew: Script,
    pub(crate) fenced_write: Script,
    pub(crate) fenced_read: Script,
    pub(crate) force_release: Script,
}

/// The scripts, hashed on first use.
pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        acquire: Script::new(include_str!("../../lua/acquire.lua")),
        acquire_all: Script::new(include_str!("../../lua/acquire_all.lua")),
        release_all: Script::new(include_str!("../../lua/release_all.lua")),
        reenter: Script::new(include_str!("../../lua/reenter.lua")),
        release: Script::new(include_str!("../../lua/release.lua")),
        extend: Script::new(include_str!("../../lua/extend.lua")),
        cancel: Script::new(include_str!("../../lua/cancel.lua")),
        renew: Script::new(include_str!("../../lua/renew.lua")),
        fenced_write: Script::new(concat!(
            include_str!("../../lua/lib/fence_mark.lua"),
            include_str!("../../lua/fenced_write.lua")
        )),
        fenced_read: Script::new(concat!(
            include_str!("../../lua/lib/fence_mark.lua"),
            include_str!("../../lua/fenced_read.lua")
        )),
        force_release: Script::new(include_str!("../../lua/force_release.lua")),
    })
}
