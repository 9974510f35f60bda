//! Redis URLs as the config gives them, parsed into node addresses.

use crate::config::redact;
use crate::error::LockError;

/// Where a Redis node's address comes from: a URL of the config, or a `redis::Client` of the
/// user's own ([`LockConfig::from_client`](crate::LockConfig::from_client)).
#[derive(Clone)]
pub(crate) enum NodeSource {
    Url(String),
    Client(Box<redis::ConnectionInfo>),
}

impl NodeSource {
    /// The node's address, checked; errors name `field`.
    pub(crate) fn addr(&self, field: &'static str) -> Result<NodeAddr, LockError> {
        match self {
            NodeSource::Url(url) => NodeAddr::parse(field, url),
            NodeSource::Client(info) => NodeAddr::of_client(field, info),
        }
    }

    /// For `Debug`: a URL without its password; a client's address alone (its credentials,
    /// database and TLS settings stay out).
    pub(crate) fn redacted(&self) -> String {
        match self {
            NodeSource::Url(url) => redact(url),
            NodeSource::Client(info) => format!("client of {}", info.addr()),
        }
    }
}

/// One parsed Redis node address.
pub(crate) struct NodeAddr {
    /// `host:port`, for error messages (never with credentials).
    pub(crate) name: String,
    pub(crate) info: redis::ConnectionInfo,
}

impl NodeAddr {
    /// Parses `url` (`redis://`, or `rediss://` with the `tls` feature), reporting errors on
    /// `field`.
    pub(crate) fn parse(field: &'static str, url: &str) -> Result<NodeAddr, LockError> {
        let scheme = url.split_once("://").map(|(s, _)| s);
        match scheme {
            Some("redis") => {}
            Some("rediss") if cfg!(feature = "tls") => {}
            Some("rediss") => {
                return Err(LockError::config(
                    field,
                    format!(
                        "{} uses TLS; enable the `tls` feature of lock-runtime",
                        redact(url)
                    ),
                ));
            }
            _ => {
                return Err(LockError::config(
                    field,
                    format!("{} is not a redis:// or rediss:// URL", redact(url)),
                ));
            }
        }
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
            LockError::config(
                field,
                format!("{} is not a valid redis URL: {}", redact(url), e.category()),
            )
        })?;
        let name = info.addr().to_string();
        Ok(NodeAddr { name, info })
    }

    /// The address a `redis::Client` connects to, as it connects (user, password, database,
    /// protocol and TLS settings included). Only TCP: a Unix socket is an error naming `field`.
    fn of_client(field: &'static str, info: &redis::ConnectionInfo) -> Result<NodeAddr, LockError> {
        match info.addr() {
            redis::ConnectionAddr::Tcp(..) => {}
            redis::ConnectionAddr::TcpTls { .. } if cfg!(feature = "tls") => {}
            redis::ConnectionAddr::TcpTls { .. } => {
                return Err(LockError::config(
                    field,
                    format!(
                        "the client connects to {} with TLS; enable the `tls` feature of lock-runtime",
                        info.addr()
                    ),
                ));
            }
            other => {
                return Err(LockError::config(
                    field,
                    format!(
                        "the client connects to {other}, not over TCP: lock-runtime connects to \
                         Redis over TCP (or TLS) only"
                    ),
                ));
            }
        }
        Ok(NodeAddr {
            name: info.addr().to_string(),
            info: info.clone(),
        })
    }

    /// Parses every URL of `urls`, which must name at least one (`empty` says what is missing).
    pub(crate) fn parse_all(
        field: &'static str,
        urls: &[String],
        empty: &'static str,
    ) -> Result<Vec<NodeAddr>, LockError> {
        if urls.is_empty() {
            return Err(LockError::config(field, empty));
        }
        urls.iter().map(|url| NodeAddr::parse(field, url)).collect()
    }

    pub(crate) fn same_node(&self, other: &NodeAddr) -> bool {
        self.name == other.name
            && self.info.redis_settings().db() == other.info.redis_settings().db()
    }

    pub(crate) fn uses_tls(&self) -> bool {
        matches!(self.info.addr(), redis::ConnectionAddr::TcpTls { .. })
    }
}
