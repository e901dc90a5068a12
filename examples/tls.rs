//! Locks over TLS with a private CA: a `rediss://` URL and `LockClientBuilder::tls_root_ca`.
//!
//! ```text
//! cargo run --features tls --example tls
//! ```
//!
//! Starts a throwaway `redis-server` with a TLS port and a certificate signed by a throwaway CA
//! (made with the `openssl` command), connects with that CA, takes and releases a lock, and
//! shows that a client that does not trust the CA is refused at connect. Exit status 0 when both
//! happened, 1 otherwise.

use std::process::ExitCode;

use fencelock::LockClient;
use fencelock_testing::RedisServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn run() -> Result<(), BoxError> {
    let server = RedisServer::builder().tls(true).start()?;
    let url = server.tls_url().ok_or("the server has no TLS port")?;
    let ca = server.tls_ca_cert_pem()?;
    println!(
        "tls: redis-server with TLS at {url}, CA {:?}",
        server.tls_ca_cert_path()
    );

    let client = LockClient::builder(&url).tls_root_ca(ca).connect().await?;
    let guard = client.lock("report:tls")?.acquire().await?;
    println!("acquired report:tls over TLS with token {}", guard.token());
    guard.release().await?;

    match LockClient::builder(&url).connect().await {
        Err(err) => println!("a client without the CA is refused: {err}"),
        Ok(_) => return Err("a client that does not trust the CA connected".into()),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => {
            println!("PASS");
            ExitCode::SUCCESS
        }
        Err(err) => {
            println!("FAIL: {err}");
            ExitCode::FAILURE
        }
    }
}
