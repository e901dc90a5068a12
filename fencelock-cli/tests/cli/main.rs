//! The `fencelock` operator tool, end to end: the built binary runs as a subprocess against a
//! throwaway redis-server, while the test holds, waits for and releases locks with the library.

// The core crate's test fixture (a throwaway server and a look at the keys fencelock wrote).
#[path = "../../../tests/common/fixture.rs"]
mod fixture;

mod doctor;
mod errors;
mod holds;
mod keys;
mod list;
mod readme;
mod records;
mod release;
mod waits;
mod watch;

use std::process::Stdio;
use std::time::Duration;

use fencelock::LockClient;
use fencelock_testing::RedisServer;
use fixture::Fixture;
use redis::Commands;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Generous bound for things that happen in milliseconds, so a loaded machine does not fail
/// the test; never an assertion about how long something took.
const PATIENCE: Duration = Duration::from_secs(20);

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    cmd.args(args)
        .env_remove("REDIS_URL")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn finish(child: Child) -> Run {
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("fencelock did not exit")
        .expect("wait for fencelock");
    let run = Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
    };
    // Errors are one clean line: never a panic or a backtrace.
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    assert!(!run.stderr.contains("backtrace"), "{run:?}");
    run
}

/// Runs `fencelock --url URL ARGS...` and collects its output.
async fn fencelock(url: &str, args: &[&str]) -> Run {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    finish(command(&all).spawn().expect("spawn fencelock")).await
}

/// The same with `input` on stdin.
async fn fencelock_with_input(url: &str, args: &[&str], input: &str) -> Run {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    let mut child = command(&all)
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn fencelock");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(input.as_bytes())
        .await
        .expect("write stdin");
    drop(stdin);
    finish(child).await
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A running `watch`, read line by line.
struct Watcher {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Watcher {
    /// Starts `fencelock watch` and waits for its header, after which every change is seen.
    async fn start(url: &str, args: &[&str]) -> (Watcher, String) {
        let mut all = vec!["--url", url, "watch"];
        all.extend_from_slice(args);
        let mut child = command(&all).spawn().expect("spawn fencelock watch");
        let stdout = child.stdout.take().expect("stdout");
        let mut watcher = Watcher {
            child,
            lines: BufReader::new(stdout).lines(),
        };
        let header = watcher.line().await;
        (watcher, header)
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("no line from watch")
            .expect("read watch output")
            .expect("watch closed its output")
    }

    async fn finish(mut self) -> (Run, Vec<String>) {
        let mut rest = Vec::new();
        while let Some(line) = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("watch did not end")
            .expect("read watch output")
        {
            rest.push(line);
        }
        (finish(self.child).await, rest)
    }
}
