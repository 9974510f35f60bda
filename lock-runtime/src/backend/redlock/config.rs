//! Redlock's configuration: the nodes' URLs, checked and built into a [`Quorum`] of single
//! nodes (Redlock over one node is that node).

use std::sync::Arc;

use super::Quorum;
use crate::backend::redis::{NodeAddr, NodeSource, RedisNode, ValidSingle};
use crate::backend::{Backend, BackendConfig, BackendKind, ValidBackend};
use crate::config::Settings;
use crate::error::LockError;
use crate::wait::WakeRegistry;

/// What [`LockConfig::redlock`](crate::LockConfig::redlock) and
/// [`LockConfig::redlock_from_clients`](crate::LockConfig::redlock_from_clients) store, and the
/// argument it came from (for errors).
#[derive(Clone)]
pub(crate) struct RedlockConfig {
    pub(crate) nodes: Vec<NodeSource>,
    pub(crate) field: &'static str,
}

impl BackendConfig for RedlockConfig {
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        let field = self.field;
        if self.nodes.is_empty() {
            return Err(LockError::config(field, "must name at least one node"));
        }
        let mut nodes: Vec<NodeAddr> = Vec::with_capacity(self.nodes.len());
        for source in &self.nodes {
            let node = source.addr(field)?;
            if nodes.iter().any(|n| n.same_node(&node)) {
                return Err(LockError::config(
                    field,
                    format!("names node {} twice", node.name),
                ));
            }
            nodes.push(node);
        }
        match <[NodeAddr; 1]>::try_from(nodes) {
            // Redlock over one node is that node: a single node in every respect.
            Ok([addr]) => Ok(Box::new(ValidSingle { addr, field })),
            Err(nodes) => Ok(Box::new(ValidRedlock { nodes, field })),
        }
    }

    fn fmt_redacted(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(NodeSource::redacted).collect();
        write!(f, "redlock([{}])", nodes.join(", "))
    }
}

/// Two nodes or more, and the argument they came from (for errors).
struct ValidRedlock {
    nodes: Vec<NodeAddr>,
    field: &'static str,
}

impl ValidBackend for ValidRedlock {
    fn kind(&self) -> BackendKind {
        BackendKind::Redlock
    }

    fn uses_tls(&self) -> bool {
        self.nodes.iter().any(NodeAddr::uses_tls)
    }

    fn build(&self, settings: &Settings, wakers: Arc<WakeRegistry>) -> Result<Backend, LockError> {
        let nodes = self
            .nodes
            .iter()
            .map(|addr| {
                RedisNode::new(addr, self.field, settings, Arc::clone(&wakers), true).map(Arc::new)
            })
            .collect::<Result<_, _>>()?;
        Ok(Backend::Quorum(Quorum::new(nodes, wakers)))
    }
}
