//! One server at a fixed address: a self-reconnecting RESP3 connection
//! ([`ReconnectingConn`]) whose push messages go to the client's [`PushListener`].

use std::sync::Weak;

use redis::{IntoConnectionInfo, ProtocolVersion};

use super::push::PushListener;
use super::reconnecting::ReconnectingConn;
use crate::base::config::ClientConfig;
use crate::base::error::Error;

/// Connects to the server at `url`.
pub(crate) async fn connect(
    url: &str,
    config: &ClientConfig,
    listener: Weak<dyn PushListener>,
) -> Result<ReconnectingConn, Error> {
    let info = url.into_connection_info()?;
    // RESP3 lets release notifications arrive as push messages on the same multiplexed
    // connection as the commands, so there is no second connection to lose.
    let redis_settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let info = info.set_redis_settings(redis_settings);
    ReconnectingConn::connect(open_client(info, config)?, None, config, listener).await
}

/// A redis-rs client for `info`, with the client's private CA when it has one.
pub(crate) fn open_client(
    info: redis::ConnectionInfo,
    config: &ClientConfig,
) -> Result<redis::Client, Error> {
    #[cfg(feature = "tls")]
    {
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if tls && rustls::crypto::CryptoProvider::get_default().is_none() {
            // rustls needs a process-wide provider when the dependency graph enables more than
            // one; ours is ring. An application that installed its own keeps it.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        if let Some(root_ca) = &config.tls_root_ca {
            if !tls {
                return Err(Error::InvalidConfig {
                    reason: "a TLS root CA needs a rediss:// URL".into(),
                });
            }
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_ca.clone()),
            };
            return redis::Client::build_with_tls(info, certificates).map_err(|err| {
                Error::InvalidConfig {
                    reason: format!("unusable TLS root CA: {err}"),
                }
            });
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = config;
    Ok(redis::Client::open(info)?)
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
