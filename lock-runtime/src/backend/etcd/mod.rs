//! etcd v3 (feature `etcd`): one [`Node`](super::Node) for the whole cluster. etcd replicates
//! every write through raft, so the cluster is one linearizable node to us, not a quorum to count.
//!
//! A lock is its key `K` and entries under it (the layout is told on `kinds::Keys`). Every key and
//! entry of an acquisition lives under its lease, so a crashed caller's vanish within its ttl. The
//! fencing token is the create revision of `K` or of the holder's entry: it grows across the
//! cluster and across leader changes, and every grant has its own.
//!
//! Each step of the protocol is told on the function that takes it: acquiring on `Inner::acquire`
//! (`acquire/`, and `kinds::attempt` for fair, shared and permit locks), renewing on
//! `Inner::extend_many` (`node.rs`), releasing on `Inner::release` and `Inner::keep`
//! (`release.rs`), waiting on `Inner::subscribe` (`watch.rs`), inspecting and forcing a release on
//! `Inner::read_lock` (`node.rs`), and choosing the member a request goes to on `Inner::call`
//! (`members.rs`). Endpoints and credentials are parsed in `addrs.rs`.
//!
//! What [`LockConfig::etcd`](crate::LockConfig::etcd) stores ([`EtcdConfig`], here) exists
//! without the feature too: `init` then says that the build leaves etcd out.

#[cfg(feature = "etcd")]
mod acquire;
#[cfg(feature = "etcd")]
mod addrs;
#[cfg(feature = "etcd")]
mod kinds;
#[cfg(feature = "etcd")]
mod members;
#[cfg(feature = "etcd")]
mod node;
#[cfg(feature = "etcd")]
mod release;
#[cfg(feature = "etcd")]
mod watch;

use std::fmt;

#[cfg(feature = "etcd")]
pub(crate) use self::kinds::{etcd_key, etcd_lock_name};
use super::{BackendConfig, ValidBackend};
use crate::config::redact_endpoint;
use crate::error::LockError;
#[cfg(feature = "etcd")]
use {
    self::addrs::EtcdAddrs,
    super::{Backend, BackendKind},
    crate::config::Settings,
    crate::wait::WakeRegistry,
    std::sync::Arc,
};

/// What [`LockConfig::etcd`](crate::LockConfig::etcd) stores (or `from_env`, from
/// `LOCK_ETCD_ENDPOINTS`).
#[derive(Clone)]
pub(crate) struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    /// The argument (or variable) they came from, which errors name.
    pub(crate) field: &'static str,
}

impl BackendConfig for EtcdConfig {
    #[cfg(feature = "etcd")]
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        let addrs = EtcdAddrs::parse(self.field, &self.endpoints)?;
        Ok(Box::new(ValidEtcd(addrs)))
    }

    #[cfg(not(feature = "etcd"))]
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        Err(LockError::config(
            self.field,
            "selects etcd, which this build does not include: enable the `etcd` feature of lock-runtime",
        ))
    }

    fn fmt_redacted(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = self.endpoints.iter().map(|e| redact_endpoint(e)).collect();
        write!(f, "etcd([{}])", shown.join(", "))
    }
}

#[cfg(feature = "etcd")]
struct ValidEtcd(EtcdAddrs);

#[cfg(feature = "etcd")]
impl ValidBackend for ValidEtcd {
    fn fencing_free(&self) -> bool {
        true
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Etcd
    }

    fn uses_tls(&self) -> bool {
        self.0.uses_tls()
    }

    fn build(&self, settings: &Settings, wakers: Arc<WakeRegistry>) -> Result<Backend, LockError> {
        let node = node::EtcdNode::new(&self.0, settings, wakers);
        Ok(Backend::One(Arc::new(node)))
    }
}
