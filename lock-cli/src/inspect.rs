//! `lockctl inspect KEY`: the library's `inspect`, printed.

use lock_runtime::LockInfo;

use crate::error::{CliError, Exit};
use crate::format;
use crate::target::Target;

pub(crate) async fn run(target: &Target, key: &str, json: bool) -> Result<Exit, CliError> {
    let client = target.client()?;
    let info = client.inspect(key).await.map_err(|e| target.error(e))?;
    match info {
        Some(info) => {
            if json {
                println!("{}", to_json(&info));
            } else {
                print!(
                    "{}",
                    describe(&info, target.nodes.len() > 1 && !target.cluster)
                );
            }
            Ok(Exit::Ok)
        }
        None => {
            if json {
                println!("{}", serde_json::json!({ "key": key, "held": false }));
            } else {
                eprintln!("lock `{key}` is not held");
            }
            Ok(Exit::NotFound)
        }
    }
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
    let mut text = format::table(&["FIELD", "VALUE"], &fields);
    if per_node {
        let rows: Vec<Vec<String>> = info
            .nodes
            .iter()
            .map(|n| {
                vec![
                    n.node.clone(),
                    if n.held { "yes" } else { "no" }.to_owned(),
                    format::node_cell(n.held, n.remaining),
                    format::token(n.fencing_token),
                ]
            })
            .collect();
        text.push('\n');
        text.push_str(&format::table(
            &["NODE", "HELD", "REMAINING", "FENCE"],
            &rows,
        ));
    }
    text
}

fn to_json(info: &LockInfo) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = info
        .nodes
        .iter()
        .map(|n| format::node_json(&n.node, n.held, n.remaining, n.fencing_token))
        .collect();
    serde_json::json!({
        "key": info.key,
        "held": true,
        "remaining_ms": format::millis(info.remaining),
        "fencing_token": info.fencing_token,
        "holders": info.holders,
        "queued": info.queued,
        "nodes": nodes,
    })
}
