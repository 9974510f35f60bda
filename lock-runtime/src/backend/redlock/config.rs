//! Redlock's configuration: the nodes' URLs, checked and built into a [`Quorum`] of single
//! nodes (Redlock over one node is that node).

use std::sync::Arc;

use super::Quorum;
use crate::backend::redis::{NodeAddr, RedisNode, ValidSingle};
use crate::backend::{Backend, BackendConfig, BackendKind, Node, ValidBackend};
use crate::config::{Settings, redact_all};
use crate::error::LockError;
use crate::wait::WakeRegistry;

/// What [`LockConfig::redlock`](crate::LockConfig::redlock) stores.
#[derive(Clone)]
pub(crate) struct RedlockConfig {
    pub(crate) urls: Vec<String>,
}

impl BackendConfig for RedlockConfig {
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        if self.urls.is_empty() {
            return Err(LockError::config("urls", "must name at least one node"));
        }
        let mut nodes: Vec<NodeAddr> = Vec::with_capacity(self.urls.len());
        for url in &self.urls {
            let node = NodeAddr::parse("urls", url)?;
            if nodes.iter().any(|n| n.same_node(&node)) {
                return Err(LockError::config(
                    "urls",
                    format!("names node {} twice", node.name),
                ));
            }
            nodes.push(node);
        }
        match <[NodeAddr; 1]>::try_from(nodes) {
            // Redlock over one node is that node: a single node in every respect.
            Ok([addr]) => Ok(Box::new(ValidSingle {
                addr,
                field: "urls",
            })),
            Err(nodes) => Ok(Box::new(ValidRedlock { nodes })),
        }
    }

    fn fmt_redacted(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redlock([{}])", redact_all(&self.urls))
    }
}

/// Two nodes or more.
struct ValidRedlock {
    nodes: Vec<NodeAddr>,
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
            .map(|addr| -> Result<Arc<dyn Node>, LockError> {
                let node = RedisNode::new(addr, "urls", settings, Arc::clone(&wakers), true)?;
                Ok(Arc::new(node))
            })
            .collect::<Result<_, _>>()?;
        Ok(Backend::Quorum(Quorum::new(nodes, wakers)))
    }
}
