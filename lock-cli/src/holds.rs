//! What each Redis node holds of a lock: the runtime's own `inspect` call
//! ([`layout::redis_inspect`]), pipelined.

use std::time::Duration;

use lock_runtime::layout::{self, NodeHold};
use lock_runtime::{LockInfo, Owner};

use crate::format::NodeView;
use crate::target::Node;

/// Names inspected in one pipeline.
const BATCH: usize = 500;

/// What one node holds of one lock: a Redis node's [`NodeHold`], or what etcd answers to the
/// library's `inspect` (the cluster is one node to lockctl). lockctl's own type because it makes
/// one from a [`LockInfo`], and cannot make a `NodeHold` (`#[non_exhaustive]`).
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) remaining: Option<Duration>,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) holders: usize,
    pub(crate) queued: usize,
    pub(crate) owners: Vec<Owner>,
}

impl From<NodeHold> for Hold {
    fn from(hold: NodeHold) -> Self {
        Hold {
            remaining: hold.remaining,
            fencing_token: hold.fencing_token,
            holders: hold.holders,
            queued: hold.queued,
            owners: hold.owners,
        }
    }
}

impl From<LockInfo> for Hold {
    fn from(info: LockInfo) -> Self {
        Hold {
            remaining: info.remaining,
            fencing_token: info.fencing_token,
            holders: info.holders,
            queued: info.queued,
            owners: info.owners,
        }
    }
}

/// The view of `node`, which holds a lock as `hold` (`None`: not there).
pub(crate) fn view<'a>(node: &'a str, hold: Option<&Hold>) -> NodeView<'a> {
    NodeView {
        node,
        held: hold.is_some(),
        remaining: hold.and_then(|h| h.remaining),
        fencing_token: hold.and_then(|h| h.fencing_token),
    }
}

/// What `node` holds of each of `names`, in order (`None`: not held there).
pub(crate) async fn read(
    node: &Node,
    prefix: &str,
    names: &[String],
) -> Result<Vec<Option<Hold>>, String> {
    let mut conn = node.connect().await?;
    let failed = |e: redis::RedisError| format!("{}: {e}", node.name);
    // A pipeline does not load the script: load it first.
    if let Some(name) = names.first() {
        let call = layout::redis_inspect(prefix, name);
        call.load_async(&mut conn).await.map_err(failed)?;
    }
    let mut holds = Vec::with_capacity(names.len());
    for batch in names.chunks(BATCH) {
        let calls: Vec<_> = batch
            .iter()
            .map(|name| layout::redis_inspect(prefix, name))
            .collect();
        let mut pipe = redis::pipe();
        for call in &calls {
            pipe.invoke_script(call);
        }
        let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await.map_err(failed)?;
        for reply in &replies {
            let hold = layout::decode_redis_inspect(reply)
                .map_err(|e| format!("{}: inspect: {e}", node.name))?;
            holds.push(hold.map(Hold::from));
        }
    }
    Ok(holds)
}
