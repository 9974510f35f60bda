//! `lockctl inspect KEY`: the library's `inspect`, printed; under Redlock, a lock that only a
//! minority of nodes hold shows each node's view (still exit 1: it is not a held lock).

use futures_util::future::join_all;
use lock_runtime::layout;
use lock_runtime::{LockInfo, NodeLockState};

use crate::error::{CliError, Exit};
use crate::format::{self, NodeView};
use crate::holds::{self, Hold};
use crate::target::{Node, Target};

/// How often `inspect` asks again when the nodes' own views say "held by a quorum" right after
/// the library said "not held" (an acquire landed in between).
const ROUNDS: usize = 3;

pub(crate) async fn run(target: &Target, key: &str, json: bool) -> Result<Exit, CliError> {
    let client = target.client()?;
    for _ in 0..ROUNDS {
        if let Some(info) = client.inspect(key).await.map_err(|e| target.error(e))? {
            if json {
                println!("{}", to_json(&info));
            } else {
                print!("{}", describe(&info, target.redlock().is_some()));
            }
            return Ok(Exit::Ok);
        }
        let Some(nodes) = target.redlock() else {
            return not_held(key, json);
        };
        let views = views(target, nodes, key).await?;
        let holding = views.iter().filter(|(_, hold)| hold.is_some()).count();
        let quorum = layout::majority(nodes.len());
        if holding == 0 {
            return not_held(key, json);
        }
        if holding < quorum {
            print_minority(key, &views, quorum, json);
            return Ok(Exit::NotFound);
        }
    }
    Err(CliError::new(format!(
        "lock `{key}` changed while it was inspected, {ROUNDS} times: try again"
    )))
}

fn not_held(key: &str, json: bool) -> Result<Exit, CliError> {
    if json {
        println!("{}", serde_json::json!({ "key": key, "held": false }));
    } else {
        eprintln!("lock `{key}` is not held");
    }
    Ok(Exit::NotFound)
}

/// Each Redlock node's view of `key` (`None`: not held there, or the node did not answer, which
/// the library's `inspect` tolerated for a minority of nodes).
async fn views<'a>(
    target: &Target,
    nodes: &'a [Node],
    key: &str,
) -> Result<Vec<(&'a str, Option<Hold>)>, CliError> {
    let names = [key.to_owned()];
    let answers = join_all(nodes.iter().map(|n| holds::read(n, &target.prefix, &names))).await;
    let mut views = Vec::with_capacity(nodes.len());
    for (node, answer) in nodes.iter().zip(answers) {
        let hold = match answer {
            Ok(holds) => holds.into_iter().next().flatten(),
            Err(why) => {
                eprintln!("lockctl: warning: {}", target.error(why));
                None
            }
        };
        views.push((node.name.as_str(), hold));
    }
    Ok(views)
}

/// A lock that fewer than `quorum` nodes hold: the verdict, then each node's view.
fn print_minority(key: &str, views: &[(&str, Option<Hold>)], quorum: usize, json: bool) {
    let holding = views.iter().filter(|(_, hold)| hold.is_some()).count();
    let views = views
        .iter()
        .map(|(node, hold)| holds::view(node, hold.as_ref()));
    if json {
        let doc = serde_json::json!({
            "key": key,
            "held": false,
            "nodes_holding": holding,
            "quorum": quorum,
            "nodes": views.map(|v| v.json()).collect::<Vec<_>>(),
        });
        println!("{doc}");
        return;
    }
    eprintln!(
        "lock `{key}` is not held: {holding} of {} nodes hold it, fewer than a quorum ({quorum})",
        views.len()
    );
    let rows: Vec<Vec<String>> = views.map(|v| v.row()).collect();
    print!("{}", format::table(&format::NODE_HEADER, &rows));
}

/// The lock's fields, then each node's view when there are several nodes.
pub(crate) fn describe(info: &LockInfo, per_node: bool) -> String {
    let fields = [
        vec!["key".to_owned(), info.key.clone()],
        vec!["remaining".to_owned(), format::duration(info.remaining)],
        vec![
            "fencing token".to_owned(),
            format::token(info.fencing_token),
        ],
        vec!["holders".to_owned(), info.holders.to_string()],
        vec!["queued".to_owned(), info.queued.to_string()],
    ];
    let owners = info
        .owners
        .iter()
        .map(|o| vec!["owner".to_owned(), format::owner(o)]);
    let fields: Vec<Vec<String>> = fields.into_iter().chain(owners).collect();
    let mut text = format::table(&["FIELD", "VALUE"], &fields);
    if per_node {
        let rows: Vec<Vec<String>> = info.nodes.iter().map(|n| view(n).row()).collect();
        text.push('\n');
        text.push_str(&format::table(&format::NODE_HEADER, &rows));
    }
    text
}

fn view(n: &NodeLockState) -> NodeView<'_> {
    NodeView {
        node: &n.node,
        held: n.held,
        remaining: n.remaining,
        fencing_token: n.fencing_token,
    }
}

fn to_json(info: &LockInfo) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = info.nodes.iter().map(|n| view(n).json()).collect();
    serde_json::json!({
        "key": info.key,
        "held": true,
        "remaining_ms": format::millis(info.remaining),
        "fencing_token": info.fencing_token,
        "holders": info.holders,
        "queued": info.queued,
        "owners": format::owners_json(&info.owners),
        "nodes": nodes,
    })
}
