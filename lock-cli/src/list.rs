//! `lockctl list`: SCAN every node for lock keys, then read each one's time to live and fence.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use lock_runtime::__private::{KeyKind, lock_name_of, redis_keys};

use crate::error::{CliError, Exit};
use crate::format;
use crate::glob;
use crate::target::{Node, Target};

const SCAN_COUNT: usize = 1000;
/// Names whose PTTL and fence are read in one pipeline.
const BATCH: usize = 500;

/// What one node holds of one lock.
#[derive(Debug, Clone, Copy)]
struct NodeHold {
    remaining: Option<Duration>,
    fencing_token: Option<u64>,
}

/// One lock seen on at least one node: per node (in `--url` order), `None` where not held.
#[derive(Debug)]
struct Listed {
    name: String,
    holds: Vec<Option<NodeHold>>,
}

impl Listed {
    fn holding(&self) -> usize {
        self.holds.iter().flatten().count()
    }

    /// Like `inspect`: valid while a majority holds it, so the quorum-th longest time to live.
    fn remaining(&self, quorum: usize) -> Option<Duration> {
        let mut ttls: Vec<Option<Duration>> =
            self.holds.iter().flatten().map(|h| h.remaining).collect();
        ttls.sort_by(|a, b| b.cmp(a));
        ttls.get(quorum - 1).copied().flatten()
    }

    fn fencing_token(&self) -> Option<u64> {
        self.holds
            .iter()
            .flatten()
            .filter_map(|h| h.fencing_token)
            .max()
    }
}

pub(crate) async fn run(target: &Target, pattern: &str, json: bool) -> Result<Exit, CliError> {
    let answers = join_all(
        target
            .nodes
            .iter()
            .map(|node| scan(node, &target.prefix, pattern)),
    )
    .await;
    let mut locks: BTreeMap<String, Listed> = BTreeMap::new();
    let mut unreachable = Vec::new();
    let count = target.nodes.len();
    for (i, answer) in answers.into_iter().enumerate() {
        match answer {
            Ok(found) => {
                for (name, hold) in found {
                    let entry = locks.entry(name.clone()).or_insert_with(|| Listed {
                        name,
                        holds: vec![None; count],
                    });
                    entry.holds[i] = Some(hold);
                }
            }
            Err(why) => unreachable.push(why),
        }
    }
    if unreachable.len() > count - target.quorum() {
        return Err(target.error(unreachable.join("; ")));
    }
    for why in &unreachable {
        eprintln!("lockctl: warning: {}", target.error(why));
    }
    let locks: Vec<Listed> = locks.into_values().collect();
    if json {
        print_json(target, &locks, &unreachable);
    } else if locks.is_empty() {
        eprintln!("no held locks match `{pattern}`");
    } else {
        print_table(target, &locks);
    }
    Ok(Exit::Ok)
}

/// The locks of one node whose names match `pattern`.
async fn scan(node: &Node, prefix: &str, pattern: &str) -> Result<Vec<(String, NodeHold)>, String> {
    let mut conn = node.connect().await?;
    let failed = |e: redis::RedisError| format!("{}: {e}", node.name);
    let key_pattern = format!("{}{{*", glob::escape_redis(prefix));
    let mut names = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&key_pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(&mut conn)
            .await
            .map_err(failed)?;
        names.extend(
            keys.iter()
                .filter_map(|key| std::str::from_utf8(key).ok())
                .filter_map(|key| lock_name_of(prefix, key, KeyKind::Lock))
                .filter(|name| glob::matches(pattern, name)),
        );
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // SCAN may return a key twice.
    names.sort();
    names.dedup();
    let mut found = Vec::with_capacity(names.len());
    for batch in names.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for name in batch {
            let [lock, fence, _] = redis_keys(prefix, name);
            pipe.cmd("PTTL").arg(lock).cmd("GET").arg(fence);
        }
        let values: Vec<Option<i64>> = pipe.query_async(&mut conn).await.map_err(failed)?;
        for (name, pair) in batch.iter().zip(values.chunks(2)) {
            let (pttl, fence) = (
                pair.first().copied().flatten(),
                pair.get(1).copied().flatten(),
            );
            // -2: the key expired or was released since SCAN saw it.
            if pttl == Some(-2) {
                continue;
            }
            let hold = NodeHold {
                remaining: pttl
                    .and_then(|ms| u64::try_from(ms).ok())
                    .map(Duration::from_millis),
                fencing_token: fence.and_then(|f| u64::try_from(f).ok()),
            };
            found.push((name.clone(), hold));
        }
    }
    Ok(found)
}

fn print_table(target: &Target, locks: &[Listed]) {
    let quorum = target.quorum();
    if target.cluster {
        let header = ["KEY", "MASTER", "REMAINING", "FENCE"];
        let rows: Vec<Vec<String>> = locks
            .iter()
            .map(|lock| {
                let master = target
                    .nodes
                    .iter()
                    .zip(&lock.holds)
                    .filter(|(_, hold)| hold.is_some())
                    .map(|(node, _)| node.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",");
                vec![
                    lock.name.clone(),
                    master,
                    format::duration(lock.remaining(quorum)),
                    format::token(lock.fencing_token()),
                ]
            })
            .collect();
        print!("{}", format::table(&header, &rows));
        return;
    }
    let redlock = target.nodes.len() > 1;
    let mut header = vec!["KEY"];
    if redlock {
        header.push("NODES");
    }
    header.extend(["REMAINING", "FENCE"]);
    if redlock {
        header.extend(target.nodes.iter().map(|n| n.name.as_str()));
    }
    let rows: Vec<Vec<String>> = locks
        .iter()
        .map(|lock| {
            let mut row = vec![lock.name.clone()];
            if redlock {
                row.push(format!("{}/{}", lock.holding(), target.nodes.len()));
            }
            row.push(format::duration(lock.remaining(quorum)));
            row.push(format::token(lock.fencing_token()));
            if redlock {
                row.extend(
                    lock.holds
                        .iter()
                        .map(|h| format::node_cell(h.is_some(), h.and_then(|h| h.remaining))),
                );
            }
            row
        })
        .collect();
    print!("{}", format::table(&header, &rows));
}

fn print_json(target: &Target, locks: &[Listed], unreachable: &[String]) {
    let quorum = target.quorum();
    let locks: Vec<serde_json::Value> = locks
        .iter()
        .map(|lock| {
            let nodes: Vec<serde_json::Value> = target
                .nodes
                .iter()
                .zip(&lock.holds)
                .map(|(node, hold)| {
                    format::node_json(
                        &node.name,
                        hold.is_some(),
                        hold.and_then(|h| h.remaining),
                        hold.and_then(|h| h.fencing_token),
                    )
                })
                .collect();
            serde_json::json!({
                "key": lock.name,
                "held": lock.holding() >= quorum,
                "nodes_holding": lock.holding(),
                "remaining_ms": format::millis(lock.remaining(quorum)),
                "fencing_token": lock.fencing_token(),
                "nodes": nodes,
            })
        })
        .collect();
    let unreachable: Vec<String> = unreachable
        .iter()
        .map(|u| target.error(u).to_string())
        .collect();
    let doc = serde_json::json!({ "locks": locks, "unreachable": unreachable });
    println!("{doc}");
}
