//! Child processes of a test binary: the parent starts the binary again to run one test
//! function (a no-op unless its env variable is set), then freezes or kills it at will.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use super::deadline::within;

/// A child process running `test` of this binary, killed if the test ends first.
pub struct ChildProcess(std::process::Child);

/// The name the test harness knows the test function `test` of `module` by (`module` is the
/// caller's `module_path!()`): its path in the test binary, without the binary's own name.
pub fn test_path(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_binary, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}

impl ChildProcess {
    /// Starts this binary running only the test function `test` of the calling module, with
    /// `env = value` set (which makes `test` do its work instead of returning at once).
    #[track_caller]
    pub fn start(module: &str, test: &str, env: &str, value: &str) -> ChildProcess {
        let exe = std::env::current_exe().unwrap();
        let child = std::process::Command::new(exe)
            .args(["--exact", &test_path(module, test), "--nocapture"])
            .env(env, value)
            .spawn()
            .unwrap();
        ChildProcess(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits for the child to exit by itself, at most `limit` (panicking with `what` after);
    /// whether it succeeded.
    pub async fn exited(&mut self, limit: Duration, what: &str) -> bool {
        within(limit, what, async {
            loop {
                if let Some(status) = self.0.try_wait().unwrap() {
                    return status.success();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
