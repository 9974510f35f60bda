//! `lockctl watch`: print each release. Redis: PSUBSCRIBE to the release channels of every node
//! (under Redlock each node announces a release: one line per node). etcd: a watch over the lock
//! prefix for deletions.

use std::time::SystemTime;

use futures_util::StreamExt as _;
use futures_util::stream::{self, BoxStream};
use lock_runtime::layout::{self, RedisKeyKind};

use crate::error::{CliError, Exit};
use crate::glob;
use crate::target::{Node, Servers, Target};

pub(crate) async fn run(
    target: &Target,
    pattern: &str,
    count: Option<u64>,
    json: bool,
) -> Result<Exit, CliError> {
    match &target.servers {
        Servers::Redis { cluster: true, .. } => Err(CliError::new(
            "watch does not work on a cluster: releases are announced on sharded channels, \
             which take no pattern subscriptions",
        )),
        Servers::Redis { nodes, .. } => on_redis(target, nodes, pattern, count, json).await,
        #[cfg(feature = "etcd")]
        Servers::Etcd(etcd) => on_etcd(target, etcd, pattern, count, json).await,
    }
}

async fn on_redis(
    target: &Target,
    nodes: &[Node],
    pattern: &str,
    count: Option<u64>,
    json: bool,
) -> Result<Exit, CliError> {
    let channels = format!("{}{{*", glob::escape_redis(&target.prefix));
    let mut streams: Vec<BoxStream<'static, (String, Option<redis::Msg>)>> = Vec::new();
    for node in nodes {
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
            "watching releases of `{pattern}` on {} node(s); only releases someone waits for are published",
            nodes.len()
        );
    }
    let per_node = nodes.len() > 1;
    let mut events = stream::select_all(streams);
    let mut seen = 0;
    while count.is_none_or(|n| seen < n) {
        let Some((node, msg)) = events.next().await else {
            break;
        };
        let Some(msg) = msg else {
            return Err(target.error(format!("{node}: connection closed")));
        };
        let channel = msg.get_channel_name();
        let Some(key) = layout::redis_lock_name(&target.prefix, channel, RedisKeyKind::Released)
        else {
            continue;
        };
        if !glob::matches(pattern, &key) {
            continue;
        }
        seen += 1;
        print_release(&key, &node, per_node, None, json);
    }
    Ok(Exit::Ok)
}

#[cfg(feature = "etcd")]
async fn on_etcd(
    target: &Target,
    etcd: &crate::etcd::Etcd,
    pattern: &str,
    count: Option<u64>,
    json: bool,
) -> Result<Exit, CliError> {
    let mut deletions = etcd
        .watch(&target.prefix)
        .await
        .map_err(|e| target.error(e))?;
    if !json {
        eprintln!(
            "watching releases of `{pattern}` on {}: deletions of lock keys, \
             expired leases included; acquisitions are not shown",
            etcd.name
        );
    }
    let mut seen = 0;
    while count.is_none_or(|n| seen < n) {
        let Some(deletion) = deletions.recv().await else {
            break;
        };
        let deletion = deletion.map_err(|e| target.error(e))?;
        if !glob::matches(pattern, &deletion.name) {
            continue;
        }
        seen += 1;
        print_release(
            &deletion.name,
            &etcd.name,
            false,
            Some(deletion.revision),
            json,
        );
    }
    Ok(Exit::Ok)
}

/// One line: the time, `released`, the lock, and the node that announced it when there are
/// several; in JSON also the node, and on etcd the revision of the deletion.
fn print_release(key: &str, node: &str, per_node: bool, revision: Option<i64>, json: bool) {
    let time = humantime::format_rfc3339_millis(SystemTime::now());
    if json {
        let mut line = serde_json::json!({
            "time": time.to_string(),
            "event": "released",
            "key": key,
            "node": node,
        });
        if let Some(revision) = revision {
            line["revision"] = revision.into();
        }
        println!("{line}");
    } else if per_node {
        println!("{time}  released  {key}  {node}");
    } else {
        println!("{time}  released  {key}");
    }
}
