//! `lockctl list`: SCAN every node for lock keys, then read each one's time to live, fence,
//! holders and queue (the runtime's own `inspect` script, pipelined).

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use lock_runtime::__private::{KeyKind, inspect_script, lock_name_of, redis_key};

use crate::error::{CliError, Exit};
use crate::format;
use crate::glob;
use crate::target::{Node, Target};

const SCAN_COUNT: usize = 1000;
/// Names inspected in one pipeline.
const BATCH: usize = 500;

/// What one node holds of one lock.
#[derive(Debug, Clone, Copy)]
struct NodeHold {
    remaining: Option<Duration>,
    fencing_token: Option<u64>,
    /// Live holders: 1, or the shares of a read lock, or the permits taken.
    holders: usize,
    /// Live waiters in a fair lock's queue.
    queued: usize,
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

    /// Like `inspect`: what a majority of the nodes holding it agree on at least.
    fn count(&self, quorum: usize, of: impl Fn(&NodeHold) -> usize) -> usize {
        let mut counts: Vec<usize> = self.holds.iter().flatten().map(of).collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts.get(quorum - 1).copied().unwrap_or(0)
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
    let script = inspect_script();
    script.load_async(&mut conn).await.map_err(failed)?;
    let mut found = Vec::with_capacity(names.len());
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
        let replies: Vec<Vec<i64>> = pipe.query_async(&mut conn).await.map_err(failed)?;
        for (name, reply) in batch.iter().zip(replies) {
            // [-2]: the lock expired or was released since SCAN saw it.
            let [pttl, fence, holders, queued] = reply[..] else {
                continue;
            };
            let hold = NodeHold {
                remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                fencing_token: u64::try_from(fence).ok(),
                holders: usize::try_from(holders).unwrap_or(0),
                queued: usize::try_from(queued).unwrap_or(0),
            };
            found.push((name.clone(), hold));
        }
    }
    Ok(found)
}

fn print_table(target: &Target, locks: &[Listed]) {
    let quorum = target.quorum();
    if target.cluster {
        let header = ["KEY", "MASTER", "REMAINING", "FENCE", "HOLDERS", "QUEUED"];
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
                    lock.count(quorum, |h| h.holders).to_string(),
                    lock.count(quorum, |h| h.queued).to_string(),
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
    header.extend(["REMAINING", "FENCE", "HOLDERS", "QUEUED"]);
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
            row.push(lock.count(quorum, |h| h.holders).to_string());
            row.push(lock.count(quorum, |h| h.queued).to_string());
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
                "holders": lock.count(quorum, |h| h.holders),
                "queued": lock.count(quorum, |h| h.queued),
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
