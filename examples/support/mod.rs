//! Where the small examples get their Redis from: a throwaway `redis-server` on a free loopback
//! port (never 6379), or the server named by `REDIS_URL`, used under a fresh key prefix that is
//! deleted at the end so nothing of the example stays behind.

// Each example compiles its own copy of this module and uses a different part of it.
// Shared by several test binaries: `pub` means "for the files that include this module", and
// each binary uses only a part of it.
#![allow(dead_code, unreachable_pub)]

use fencelock_testing::RedisServer;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The Redis an example runs against. An own server lives exactly as long as this value.
pub struct ExampleRedis {
    own: Option<RedisServer>,
    url: String,
    prefix: String,
}

impl ExampleRedis {
    pub fn from_env() -> Result<ExampleRedis, BoxError> {
        let prefix = format!("fencelock-example-{}:", uuid::Uuid::new_v4().simple());
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.trim().is_empty() => Ok(ExampleRedis {
                own: None,
                url: url.trim().to_owned(),
                prefix,
            }),
            _ => {
                let server = RedisServer::start().map_err(|err| {
                    format!(
                        "could not start a throwaway redis-server: {err}; install it \
                         (apt-get install -y redis-server) or set REDIS_URL"
                    )
                })?;
                Ok(ExampleRedis {
                    url: server.url(),
                    own: Some(server),
                    prefix,
                })
            }
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A key prefix unique to this run, for `LockClientBuilder::prefix`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn describe(&self) -> String {
        match &self.own {
            Some(server) => format!("throwaway redis-server on 127.0.0.1:{}", server.port()),
            None => "the server at REDIS_URL".to_owned(),
        }
    }

    /// A plain connection, for what an operator (not a lock holder) would do.
    pub fn admin(&self) -> Result<redis::Connection, BoxError> {
        Ok(redis::Client::open(self.url.as_str())?.get_connection()?)
    }

    /// The keys under this run's prefix that match `pattern` (a SCAN pattern after the
    /// prefix), found with SCAN: never KEYS, which blocks a shared server.
    pub fn scan(&self, pattern: &str) -> Result<Vec<Vec<u8>>, BoxError> {
        let mut conn = self.admin()?;
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}{pattern}", self.prefix))
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn)?;
            found.extend(keys);
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// Deletes every key under this run's prefix. Returns how many.
    pub fn cleanup(&self) -> Result<usize, BoxError> {
        let keys = self.scan("*")?;
        if keys.is_empty() {
            return Ok(0);
        }
        Ok(redis::cmd("DEL")
            .arg(&keys)
            .query::<usize>(&mut self.admin()?)?)
    }
}

/// The exit status of an example that checks what it shows: success when `outcome` holds no
/// failed check, after printing PASS or each failure (or the error that stopped it).
pub fn exit_status(
    example: &str,
    outcome: Result<Vec<String>, BoxError>,
) -> std::process::ExitCode {
    match outcome {
        Ok(failures) if failures.is_empty() => {
            println!("PASS");
            std::process::ExitCode::SUCCESS
        }
        Ok(failures) => {
            for failure in failures {
                println!("FAIL: {failure}");
            }
            std::process::ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("{example}: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
