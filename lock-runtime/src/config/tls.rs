//! The PEM given for TLS: checked when the config is validated, and handed to redis-rs (etcd
//! reads it itself).

use std::fmt;

use crate::LockError;

/// The PEM given to [`LockConfig::tls_root_ca`] and [`LockConfig::tls_client_cert`]. `Debug`
/// says which are set, never what they hold.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    pub(crate) root_ca: Option<Vec<u8>>,
    /// The certificate chain and its private key.
    pub(crate) client_cert: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |on: bool| if on { "set" } else { "none" };
        write!(
            f,
            "root_ca: {}, client_cert: {}",
            set(self.root_ca.is_some()),
            set(self.client_cert.is_some())
        )
    }
}

impl Tls {
    /// The field of the first setting given, if any.
    fn field(&self) -> Option<&'static str> {
        if self.root_ca.is_some() {
            Some("tls_root_ca")
        } else if self.client_cert.is_some() {
            Some("tls_client_cert")
        } else {
            None
        }
    }

    /// Checks that what is set parses, and that some URL will use it (`uses_tls`).
    pub(super) fn check(&self, uses_tls: bool) -> Result<(), LockError> {
        let Some(field) = self.field() else {
            return Ok(());
        };
        if !cfg!(feature = "tls") {
            return Err(LockError::config(
                field,
                "needs TLS, which this build does not include: enable the `tls` feature of lock-runtime",
            ));
        }
        if !uses_tls {
            return Err(LockError::config(
                field,
                "applies to rediss:// URLs and https:// etcd endpoints, and none is given",
            ));
        }
        #[cfg(feature = "tls")]
        self.parse()?;
        Ok(())
    }

    /// Parses the PEM as rustls will on every connection, so that a mistake is a config error
    /// now rather than a failed connection later.
    #[cfg(feature = "tls")]
    fn parse(&self) -> Result<(), LockError> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let certificates = |field: &'static str, pem: &[u8]| {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| LockError::config(field, format!("is not valid PEM: {e}")))?;
            if certs.is_empty() {
                return Err(LockError::config(
                    field,
                    "holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)",
                ));
            }
            Ok(certs)
        };
        if let Some(pem) = &self.root_ca {
            let mut roots = rustls::RootCertStore::empty();
            for (i, cert) in certificates("tls_root_ca", pem)?.into_iter().enumerate() {
                roots.add(cert).map_err(|e| {
                    LockError::config(
                        "tls_root_ca",
                        format!("certificate {} is not a usable CA certificate: {e}", i + 1),
                    )
                })?;
            }
        }
        if let Some((cert, key)) = &self.client_cert {
            let chain = certificates("tls_client_cert", cert)?;
            // rustls' message never quotes the key.
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| LockError::config("tls_client_cert", format!("private key: {e}")))?;
            let provider = rustls::crypto::ring::default_provider();
            rustls::sign::CertifiedKey::from_der(chain, key, &provider)
                .map_err(|e| LockError::config("tls_client_cert", format!("private key: {e}")))?;
        }
        Ok(())
    }

    /// Both PEM as redis-rs takes them; `None` when neither is set (the webpki roots).
    #[cfg(feature = "tls")]
    pub(crate) fn redis(&self) -> Option<redis::TlsCertificates> {
        self.field()?;
        Some(redis::TlsCertificates {
            client_tls: self
                .client_cert
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_ca.clone(),
        })
    }

    /// `info` with these certificates if it is a TLS address (unchanged otherwise, and when
    /// nothing is set).
    pub(crate) fn apply(
        &self,
        info: redis::ConnectionInfo,
    ) -> Result<redis::ConnectionInfo, redis::RedisError> {
        #[cfg(feature = "tls")]
        if let (Some(certs), redis::ConnectionAddr::TcpTls { .. }) = (self.redis(), info.addr()) {
            return Ok(redis::Client::build_with_tls(info, certs)?
                .get_connection_info()
                .clone());
        }
        Ok(info)
    }
}
