//! A throw-away certificate authority for the TLS tests, made with the `openssl` command in a
//! temporary directory: a CA, a server certificate it signed for 127.0.0.1 (and `localhost`),
//! and a client certificate it signed (for servers that verify clients). EC P-256 keys, valid
//! for two days; nothing is read from or written to the system's trust store.

// A harness failure should stop the test loudly, with openssl's own message.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use tempfile::TempDir;

use super::util::{reap_after_exit, unique_key};

/// The CA's certificate, and the files [`TestCa::file`] names.
pub(crate) const CA_CERT: &str = "ca.crt";
pub(crate) const SERVER_CERT: &str = "server.crt";
pub(crate) const SERVER_KEY: &str = "server.key";
pub(crate) const CLIENT_CERT: &str = "client.crt";
pub(crate) const CLIENT_KEY: &str = "client.key";

/// A CA with one server and one client certificate, in a directory removed when the last
/// clone is dropped (for [`shared`](Self::shared): when the test binary exits).
#[derive(Debug, Clone)]
pub struct TestCa {
    dir: Arc<TempDir>,
}

impl TestCa {
    /// Makes a new CA and its two certificates (a few `openssl` runs; panics with openssl's
    /// output if one fails).
    pub fn new() -> TestCa {
        let dir = tempfile::Builder::new()
            .prefix("lock-tests-ca-")
            .tempdir()
            .expect("create a temporary directory for the test CA");
        let path = dir.path();
        const EC: [&str; 5] = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        // A name of its own: a client trusting another test CA finds no issuer for this one's
        // certificates, as with an unrelated CA.
        let subject = format!("/CN={}", unique_key("lock-tests CA"));
        let ca_req = [
            "-keyout",
            "ca.key",
            "-out",
            CA_CERT,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ];
        openssl(path, &[&["req", "-x509"][..], &EC, &ca_req].concat());
        // Both leaves carry both purposes: redis-server presents its certificate as a client
        // too, on replication and cluster links.
        let extensions = "basicConstraints=CA:FALSE\n\
                          keyUsage=critical,digitalSignature\n\
                          extendedKeyUsage=serverAuth,clientAuth\n\
                          subjectAltName=IP:127.0.0.1,DNS:localhost\n";
        std::fs::write(path.join("leaf.ext"), extensions).expect("write leaf.ext");
        for (cert, key, subject) in [
            (SERVER_CERT, SERVER_KEY, "/CN=127.0.0.1"),
            (CLIENT_CERT, CLIENT_KEY, "/CN=lock-tests client"),
        ] {
            let leaf_req = ["-keyout", key, "-out", "leaf.csr", "-subj", subject];
            openssl(path, &[&["req", "-new"][..], &EC, &leaf_req].concat());
            openssl(
                path,
                &[
                    "x509",
                    "-req",
                    "-in",
                    "leaf.csr",
                    "-CA",
                    CA_CERT,
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    "leaf.ext",
                    "-out",
                    cert,
                ],
            );
        }
        TestCa { dir: Arc::new(dir) }
    }

    /// One CA for the whole test binary (the shared TLS topologies' servers use it); its
    /// directory is removed once the binary exits.
    pub fn shared() -> &'static TestCa {
        static SHARED: OnceLock<TestCa> = OnceLock::new();
        SHARED.get_or_init(|| {
            let ca = TestCa::new();
            reap_after_exit(&[], &[ca.dir.path()]);
            ca
        })
    }

    /// The CA's certificate (PEM): what a client trusts.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.read(CA_CERT)
    }

    /// The client certificate (PEM), signed by this CA.
    pub fn client_cert_pem(&self) -> Vec<u8> {
        self.read(CLIENT_CERT)
    }

    /// The client certificate's private key (PEM, PKCS#8).
    pub fn client_key_pem(&self) -> Vec<u8> {
        self.read(CLIENT_KEY)
    }

    /// The server certificate's private key (PEM): not the client certificate's.
    pub fn server_key_pem(&self) -> Vec<u8> {
        self.read(SERVER_KEY)
    }

    /// One of the files above, for a server's command line.
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// What the harness's own connections trust and present.
    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.client_cert_pem(),
                client_key: self.client_key_pem(),
            }),
            root_cert: Some(self.ca_pem()),
        }
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.file(name)).unwrap_or_else(|e| panic!("read the test CA's {name}: {e}"))
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `openssl` with `args` in `dir`; panics with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run openssl (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
