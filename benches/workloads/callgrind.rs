//! `--callgrind`: instructions per uncontended cycle, client and server, counted by valgrind.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_testing::RedisServer;

use crate::common::{self, Contenders, Kind, Locker, Raw};

// ---------------------------------------------------------------------------------------------
// --callgrind: instructions per uncontended cycle, client and server, counted by valgrind.
// Deterministic where time on a shared 2-core machine is not; this is the evidence for where the
// W1/W2 gaps come from. Needs `valgrind` on PATH; takes a few minutes.

pub const CYCLES_FLAG: &str = "--cycles";

/// `--cycles <kind> <url> <n>`: n uncontended acquire + release cycles on a current-thread
/// runtime (one thread: the least scheduling noise for callgrind). `<kind>` is a contender,
/// or `variant:<i>`, our scripts with one call taken out (`common::script_variants`).
pub fn cycles_main(args: &[String]) {
    let [_, kind, url, n] = args else {
        panic!("cycles arguments: {args:?}");
    };
    let n: usize = n.parse().expect("n");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let locker = match kind.strip_prefix("variant:") {
                Some(i) => {
                    let variants = common::script_variants();
                    let (_, scripts) = &variants[i.parse::<usize>().expect("variant")];
                    let (acquire, release) = scripts.as_ref().expect("variant applies");
                    let raw = Raw::with_scripts(url, acquire, release).await;
                    let keys = raw.keys("callgrind");
                    Locker::Raw(Arc::new(raw), keys)
                }
                None => {
                    let contenders = Contenders::connect(url).await;
                    contenders.locker(Kind::from_slug(kind).expect("kind"), "callgrind")
                }
            };
            for _ in 0..n {
                locker.cycle().await;
            }
        });
}

/// The instructions callgrind counted (its `summary:` line).
fn callgrind_total(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).expect("callgrind output");
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("callgrind summary")
}

/// Whether valgrind can be run here.
pub fn have_valgrind() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Counts instructions per cycle with callgrind, as the difference between two run lengths so
/// start-up and connection set-up cancel out.
struct Callgrind {
    exe: PathBuf,
    dir: PathBuf,
    redis: String,
    small: usize,
    large: usize,
}

impl Callgrind {
    fn new() -> Callgrind {
        let dir = std::env::temp_dir().join(format!("fencelock-callgrind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let redis = std::env::var("FENCELOCK_REDIS_SERVER").unwrap_or_else(|_| {
            std::env::var("PATH")
                .unwrap_or_default()
                .split(':')
                .map(|d| Path::new(d).join("redis-server"))
                .find(|p| p.exists())
                .expect("redis-server on PATH")
                .display()
                .to_string()
        });
        Callgrind {
            exe: std::env::current_exe().expect("current exe"),
            dir,
            redis,
            small: 200,
            large: 1200,
        }
    }

    fn cycles(&self, kind: &str, url: &str, n: usize, valgrind_out: Option<&Path>) {
        let mut command = match valgrind_out {
            Some(out) => {
                let mut c = Command::new("valgrind");
                c.arg("--tool=callgrind")
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        let status = command
            .args([CYCLES_FLAG, kind, url, &n.to_string()])
            .stderr(Stdio::null())
            .status()
            .expect("run cycles");
        assert!(status.success(), "cycles run failed");
    }

    fn per_cycle(&self, counts: [u64; 2]) -> f64 {
        (counts[1] - counts[0]) as f64 / (self.large - self.small) as f64
    }

    /// Client instructions per cycle: this binary under callgrind against a normal server.
    fn client(&self, kind: &str) -> f64 {
        let server = common::start_server();
        let mut counts = [0u64; 2];
        for (i, n) in [self.small, self.large].into_iter().enumerate() {
            let out = self
                .dir
                .join(format!("client-{kind}-{n}.out").replace(':', "-"));
            self.cycles(kind, &server.url(), n, Some(&out));
            counts[i] = callgrind_total(&out);
        }
        self.per_cycle(counts)
    }

    /// Server instructions per cycle: redis-server under callgrind (through a wrapper that the
    /// harness starts), shut down cleanly so that callgrind writes its counts.
    fn server(&self, kind: &str) -> f64 {
        let mut counts = [0u64; 2];
        for (i, n) in [self.small, self.large].into_iter().enumerate() {
            let name = format!("{kind}-{n}").replace(':', "-");
            let out = self.dir.join(format!("server-{name}.out"));
            let wrapper = self.dir.join(format!("redis-under-callgrind-{name}"));
            std::fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={} {} \"$@\"\n",
                    out.display(),
                    self.redis
                ),
            )
            .expect("wrapper");
            let mut perms = std::fs::metadata(&wrapper).expect("wrapper").permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
            std::fs::set_permissions(&wrapper, perms).expect("chmod wrapper");
            let server = RedisServer::builder()
                .binary(&wrapper)
                .startup_timeout(Duration::from_secs(60))
                .start()
                .expect("redis-server under callgrind");
            self.cycles(kind, &server.url(), n, None);
            let mut conn = server.client().get_connection().expect("connection");
            let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query::<()>(&mut conn);
            let give_up = Instant::now() + Duration::from_secs(60);
            while server.is_running() && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(100));
            }
            counts[i] = callgrind_total(&out);
        }
        self.per_cycle(counts)
    }
}

impl Drop for Callgrind {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The instruction-count tables, and fencelock's server instructions per cycle as a multiple of
/// the limit's.
pub fn callgrind_section() -> (String, f64) {
    let cg = Callgrind::new();
    let mut text = format!(
        "### Instructions per uncontended acquire + release (callgrind, {} cycles)\n\n\
         | contender | client instructions / cycle | server instructions / cycle | server vs limit |\n\
         | --- | ---: | ---: | ---: |\n",
        cg.large - cg.small
    );
    let mut limit = f64::NAN;
    let mut ours_scripts = f64::NAN;
    let mut ours = f64::NAN;
    for kind in [
        Kind::Limit,
        Kind::OurScripts,
        Kind::Ours,
        Kind::Redisson,
        Kind::Rslock,
        Kind::Distkit,
    ] {
        let (client, server) = (cg.client(kind.slug()), cg.server(kind.slug()));
        match kind {
            Kind::Limit => limit = server,
            Kind::OurScripts => ours_scripts = server,
            Kind::Ours => ours = server,
            _ => {}
        }
        let _ = writeln!(
            text,
            "| {} | {client:.0} | {server:.0} | {:.2} |",
            kind.label(),
            server / limit
        );
        eprintln!("[callgrind {} done]", kind.slug());
    }
    let _ = writeln!(
        text,
        "\nEach figure is (count after {} cycles − count after {}) / {}, so start-up and \
         connection set-up cancel out. Client: this binary on a current-thread runtime under \
         `valgrind --tool=callgrind`; server: redis-server under callgrind (user-space \
         instructions; the kernel's share of a round trip is the same for every contender).\n\n\
         #### Where fencelock's server instructions go\n\n\
         Our scripts with one server call taken out at a time (the lock key and the op record \
         never exist when a lock is acquired in this loop, so their check can be assumed), \
         called raw:\n\n\
         | call taken out | server instructions / cycle | saved |\n| --- | ---: | ---: |\n\
         | (none: our scripts) | {ours_scripts:.0} | – |",
        cg.large,
        cg.small,
        cg.large - cg.small
    );
    for (i, (name, scripts)) in common::script_variants().into_iter().enumerate() {
        if scripts.is_none() {
            let _ = writeln!(text, "| {name} | n/a (the script changed) | |");
            continue;
        }
        let server = cg.server(&format!("variant:{i}"));
        let _ = writeln!(
            text,
            "| {name} | {server:.0} | {:.0} ({:.0} %) |",
            ours_scripts - server,
            100.0 * (ours_scripts - server) / ours_scripts
        );
        eprintln!("[callgrind variant {i} done]");
    }
    let _ = writeln!(
        text,
        "| (the limit's scripts) | {limit:.0} | {:.0} ({:.0} %) |",
        ours_scripts - limit,
        100.0 * (ours_scripts - limit) / ours_scripts
    );
    (text, ours / limit)
}
