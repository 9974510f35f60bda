//! The single-node backend: one Redis master ([`LockConfig::single`](crate::LockConfig::single),
//! and Redlock over one node).

use std::fmt;
use std::sync::Arc;

use super::{NodeAddr, NodeSource, RedisNode};
use crate::backend::{Backend, BackendConfig, BackendKind, ValidBackend};
use crate::config::Settings;
use crate::error::LockError;
use crate::wait::WakeRegistry;

/// What [`LockConfig::single`](crate::LockConfig::single) and
/// [`LockConfig::from_client`](crate::LockConfig::from_client) store, and the argument it came
/// from (for errors).
#[derive(Clone)]
pub(crate) struct SingleConfig {
    pub(crate) node: NodeSource,
    pub(crate) field: &'static str,
}

impl BackendConfig for SingleConfig {
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        Ok(Box::new(ValidSingle {
            addr: self.node.addr(self.field)?,
            field: self.field,
        }))
    }

    fn fmt_redacted(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "single({})", self.node.redacted())
    }
}

/// One Redis master, and the argument its URL came from (for errors).
pub(crate) struct ValidSingle {
    pub(crate) addr: NodeAddr,
    pub(crate) field: &'static str,
}

impl ValidBackend for ValidSingle {
    fn kind(&self) -> BackendKind {
        BackendKind::Single
    }

    fn uses_tls(&self) -> bool {
        self.addr.uses_tls()
    }

    fn build(&self, settings: &Settings, wakers: Arc<WakeRegistry>) -> Result<Backend, LockError> {
        let node = RedisNode::new(&self.addr, self.field, settings, wakers, true)?;
        Ok(Backend::Redis(Arc::new(node)))
    }
}
