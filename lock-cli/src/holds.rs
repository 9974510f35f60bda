//! What each Redis node holds of a lock: the runtime's own `inspect` script, pipelined.

use lock_runtime::__private::{KeyKind, decode_inspect, inspect_script, redis_key};

use crate::format::NodeView;
use crate::target::Node;

/// Names inspected in one pipeline.
const BATCH: usize = 500;

/// What one node holds of one lock (the runtime's reading of its inspect script's reply).
pub(crate) use lock_runtime::__private::NodeHold;

/// The view of `node`, which holds a lock as `hold` (`None`: not there).
pub(crate) fn view<'a>(node: &'a str, hold: Option<&NodeHold>) -> NodeView<'a> {
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
) -> Result<Vec<Option<NodeHold>>, String> {
    let mut conn = node.connect().await?;
    let failed = |e: redis::RedisError| format!("{}: {e}", node.name);
    let script = inspect_script();
    script.load_async(&mut conn).await.map_err(failed)?;
    let mut holds = Vec::with_capacity(names.len());
    for batch in names.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for name in batch {
            pipe.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(3)
                .arg(redis_key(prefix, name, KeyKind::Lock))
                .arg(redis_key(prefix, name, KeyKind::Fence))
                .arg(redis_key(prefix, name, KeyKind::QueueLeases));
        }
        let replies: Vec<Vec<redis::Value>> = pipe.query_async(&mut conn).await.map_err(failed)?;
        for reply in replies {
            let hold = decode_inspect(&reply)
                .ok_or_else(|| format!("{}: inspect: unexpected reply", node.name))?;
            holds.push(hold);
        }
    }
    Ok(holds)
}
