//! `lockctl watch`: PSUBSCRIBE to the release channels of every node and print each release.

use std::time::SystemTime;

use futures_util::StreamExt as _;
use futures_util::stream::{self, BoxStream};
use lock_runtime::__private::{KeyKind, lock_name_of};

use crate::error::{CliError, Exit};
use crate::glob;
use crate::target::Target;

pub(crate) async fn run(
    target: &Target,
    pattern: &str,
    count: Option<u64>,
    json: bool,
) -> Result<Exit, CliError> {
    if target.cluster {
        return Err(CliError::new(
            "watch does not work on a cluster: releases are announced on sharded channels, \
             which take no pattern subscriptions",
        ));
    }
    let channels = format!("{}{{*", glob::escape_redis(&target.prefix));
    let mut streams: Vec<BoxStream<'static, (String, Option<redis::Msg>)>> = Vec::new();
    for node in &target.nodes {
        let mut pubsub = node.pubsub().await.map_err(|e| target.error(e))?;
        pubsub
            .psubscribe(&channels)
            .await
            .map_err(|e| target.error(format!("{}: {e}", node.name)))?;
        let (name, end) = (node.name.clone(), node.name.clone());
        // `None` marks the end of a node's stream: its connection closed.
        let messages = pubsub
            .into_on_message()
            .map(move |msg| (name.clone(), Some(msg)))
            .chain(stream::once(async move { (end, None) }));
        streams.push(messages.boxed());
    }
    if !json {
        eprintln!(
            "watching releases of `{pattern}` on {} node(s); acquisitions are not published",
            target.nodes.len()
        );
    }
    let per_node = target.nodes.len() > 1;
    let mut events = stream::select_all(streams);
    let mut seen = 0;
    while count.is_none_or(|n| seen < n) {
        let Some((node, msg)) = events.next().await else {
            break;
        };
        let Some(msg) = msg else {
            return Err(target.error(format!("{node}: connection closed")));
        };
        let Some(key) = lock_name_of(&target.prefix, msg.get_channel_name(), KeyKind::Released)
        else {
            continue;
        };
        if !glob::matches(pattern, &key) {
            continue;
        }
        seen += 1;
        let time = humantime::format_rfc3339_millis(SystemTime::now());
        if json {
            let line = serde_json::json!({
                "time": time.to_string(),
                "event": "released",
                "key": key,
                "node": node,
            });
            println!("{line}");
        } else if per_node {
            println!("{time}  released  {key}  {node}");
        } else {
            println!("{time}  released  {key}");
        }
    }
    Ok(Exit::Ok)
}
