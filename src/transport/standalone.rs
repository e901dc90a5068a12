//! One server at a fixed address: a self-reconnecting RESP3 connection
//! ([`ReconnectingConn`]) whose push messages go to the client's [`PushListener`].

use std::sync::Weak;

use redis::{IntoConnectionInfo, ProtocolVersion};

use super::push::PushListener;
use super::reconnecting::ReconnectingConn;
use crate::base::config::ClientConfig;
use crate::base::error::Error;

/// Connects to the server at `url`; also returns the redis-rs client, for the dedicated
/// connections of replica acknowledgement.
pub(crate) async fn connect(
    url: &str,
    config: &ClientConfig,
    listener: Weak<dyn PushListener>,
) -> Result<(ReconnectingConn, redis::Client), Error> {
    let info = url.into_connection_info()?;
    // RESP3 lets release notifications arrive as push messages on the same multiplexed
    // connection as the commands, so there is no second connection to lose.
    let redis_settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let info = info.set_redis_settings(redis_settings);
    let client = open_client(info, config)?;
    let conn = connect_reconnecting(client.clone(), config, listener).await?;
    Ok((conn, client))
}

/// A self-reconnecting RESP3 connection to one server whose push messages go to `listener`.
/// A failure to connect names the server's address.
pub(crate) async fn connect_reconnecting(
    client: redis::Client,
    config: &ClientConfig,
    listener: Weak<dyn PushListener>,
) -> Result<ReconnectingConn, Error> {
    let addr = client.get_connection_info().addr().to_string();
    ReconnectingConn::connect(client, config, listener)
        .await
        .map_err(|err| Error::connecting(addr, err))
}

/// A redis-rs client for `info`, with the client's private CA when it has one.
#[cfg(not(feature = "tls"))]
pub(crate) fn open_client(
    info: redis::ConnectionInfo,
    _config: &ClientConfig,
) -> Result<redis::Client, Error> {
    Ok(redis::Client::open(info)?)
}

/// A redis-rs client for `info`, with the client's private CA when it has one.
#[cfg(feature = "tls")]
pub(crate) fn open_client(
    info: redis::ConnectionInfo,
    config: &ClientConfig,
) -> Result<redis::Client, Error> {
    let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    if tls && rustls::crypto::CryptoProvider::get_default().is_none() {
        // rustls needs a process-wide provider when the dependency graph enables more than
        // one; ours is ring. An application that installed its own keeps it.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let Some(root_ca) = &config.tls_root_ca else {
        return Ok(redis::Client::open(info)?);
    };
    if !tls {
        return Err(Error::InvalidConfig {
            reason: "a TLS root CA needs a rediss:// URL".into(),
        });
    }
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_ca.clone()),
    };
    redis::Client::build_with_tls(info, certificates).map_err(|err| Error::InvalidConfig {
        reason: format!("unusable TLS root CA: {err}"),
    })
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    /// rustls' process-wide provider is installed for a `rediss://` client only: an
    /// application whose connections are all plain stays free to install its own later.
    #[test]
    fn only_a_tls_client_installs_the_process_wide_crypto_provider() {
        let config = ClientConfig::default();
        let plain = "redis://127.0.0.1:7000/".into_connection_info().unwrap();
        open_client(plain, &config).unwrap();
        assert!(rustls::crypto::CryptoProvider::get_default().is_none());
        let tls = "rediss://127.0.0.1:7000/".into_connection_info().unwrap();
        open_client(tls, &config).unwrap();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
