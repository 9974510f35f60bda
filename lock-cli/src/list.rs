//! `lockctl list`: find the held locks and show each one's time to live, fence, holders and
//! queue. Redis: SCAN every node for lock keys, then the runtime's own `inspect` script,
//! pipelined. etcd: range reads over the prefix for lock names, then the library's `inspect`.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use lock_runtime::Owner;
use lock_runtime::layout::{self, RedisKeyKind};

use crate::error::{CliError, Exit};
use crate::format;
use crate::glob;
use crate::holds::{self, Hold};
use crate::target::{Node, Servers, Target};

const SCAN_COUNT: usize = 1000;

/// What `list` found.
#[derive(Debug)]
struct Listing {
    /// The nodes' names, in `--url` order (etcd: one, the cluster).
    nodes: Vec<String>,
    /// How many nodes must hold a lock for it to be held.
    quorum: usize,
    /// A Redis Cluster: each lock lives on one of `nodes`.
    cluster: bool,
    locks: Vec<Listed>,
    /// The nodes that did not answer (at most a minority).
    unreachable: Vec<String>,
}

/// One lock seen on at least one node: per node (in `--url` order), `None` where not held.
#[derive(Debug)]
struct Listed {
    name: String,
    holds: Vec<Option<Hold>>,
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
    fn count(&self, quorum: usize, of: impl Fn(&Hold) -> usize) -> usize {
        let mut counts: Vec<usize> = self.holds.iter().flatten().map(of).collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts.get(quorum - 1).copied().unwrap_or(0)
    }

    /// Like `inspect`: the owners a majority of the nodes holding it record.
    fn owners(&self, quorum: usize) -> Vec<Owner> {
        let per_node: Vec<Vec<Owner>> = self
            .holds
            .iter()
            .flatten()
            .map(|h| h.owners.clone())
            .collect();
        layout::majority_owners(&per_node, quorum)
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
    let listing = match &target.servers {
        Servers::Redis { nodes, cluster } => on_redis(target, nodes, *cluster, pattern).await?,
        #[cfg(feature = "etcd")]
        Servers::Etcd(etcd) => on_etcd(target, etcd, pattern).await?,
    };
    for why in &listing.unreachable {
        eprintln!("lockctl: warning: {}", target.error(why));
    }
    if json {
        print_json(target, &listing);
    } else if listing.locks.is_empty() {
        eprintln!("no held locks match `{pattern}`");
    } else {
        print_table(&listing);
    }
    Ok(Exit::Ok)
}

async fn on_redis(
    target: &Target,
    nodes: &[Node],
    cluster: bool,
    pattern: &str,
) -> Result<Listing, CliError> {
    let answers = join_all(nodes.iter().map(|node| scan(node, &target.prefix, pattern))).await;
    let mut locks: BTreeMap<String, Listed> = BTreeMap::new();
    let mut unreachable = Vec::new();
    let count = nodes.len();
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
    // A cluster's lock lives on one master: one answer is enough for it.
    let quorum = if cluster { 1 } else { layout::majority(count) };
    if unreachable.len() > count - quorum {
        return Err(target.error(unreachable.join("; ")));
    }
    Ok(Listing {
        nodes: nodes.iter().map(|n| n.name.clone()).collect(),
        quorum,
        cluster,
        locks: locks.into_values().collect(),
        unreachable,
    })
}

/// The locks of one node whose names match `pattern`.
async fn scan(node: &Node, prefix: &str, pattern: &str) -> Result<Vec<(String, Hold)>, String> {
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
                .filter_map(|key| layout::redis_lock_name(prefix, key, RedisKeyKind::Lock))
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
    let holds = holds::read(node, prefix, &names).await?;
    // A lock that expired or was released since SCAN saw it is not held.
    Ok(names
        .into_iter()
        .zip(holds)
        .filter_map(|(name, hold)| Some((name, hold?)))
        .collect())
}

/// Inspections of etcd at once: each is a read and a lease lookup per holder.
#[cfg(feature = "etcd")]
const INSPECTIONS_IN_FLIGHT: usize = 16;

#[cfg(feature = "etcd")]
async fn on_etcd(
    target: &Target,
    etcd: &crate::etcd::Etcd,
    pattern: &str,
) -> Result<Listing, CliError> {
    use futures_util::StreamExt as _;

    let names = etcd
        .names(&target.prefix)
        .await
        .map_err(|e| target.error(e))?;
    let client = target.client()?;
    let infos: Vec<_> =
        futures_util::stream::iter(names.iter().filter(|n| glob::matches(pattern, n)))
            .map(|name| client.inspect(name))
            .buffered(INSPECTIONS_IN_FLIGHT)
            .collect()
            .await;
    let mut locks = Vec::new();
    for info in infos {
        // `None`: released or expired since the range read.
        if let Some(info) = info.map_err(|e| target.error(e))? {
            locks.push(Listed {
                name: info.key.clone(),
                holds: vec![Some(Hold::from(info))],
            });
        }
    }
    Ok(Listing {
        nodes: vec![etcd.name.clone()],
        quorum: 1,
        cluster: false,
        locks,
        unreachable: Vec::new(),
    })
}

fn print_table(listing: &Listing) {
    let quorum = listing.quorum;
    if listing.cluster {
        let header = [
            "KEY",
            "MASTER",
            "REMAINING",
            "FENCE",
            "HOLDERS",
            "QUEUED",
            "OWNER",
        ];
        let rows: Vec<Vec<String>> = listing
            .locks
            .iter()
            .map(|lock| {
                let master = listing
                    .nodes
                    .iter()
                    .zip(&lock.holds)
                    .filter(|(_, hold)| hold.is_some())
                    .map(|(node, _)| node.as_str())
                    .collect::<Vec<_>>()
                    .join(",");
                vec![
                    lock.name.clone(),
                    master,
                    format::duration(lock.remaining(quorum)),
                    format::token(lock.fencing_token()),
                    lock.count(quorum, |h| h.holders).to_string(),
                    lock.count(quorum, |h| h.queued).to_string(),
                    format::owners_cell(&lock.owners(quorum)),
                ]
            })
            .collect();
        print!("{}", format::table(&header, &rows));
        return;
    }
    let redlock = listing.nodes.len() > 1;
    let mut header = vec!["KEY"];
    if redlock {
        header.push("NODES");
    }
    header.extend(["REMAINING", "FENCE", "HOLDERS", "QUEUED", "OWNER"]);
    if redlock {
        header.extend(listing.nodes.iter().map(String::as_str));
    }
    let rows: Vec<Vec<String>> =
        listing
            .locks
            .iter()
            .map(|lock| {
                let mut row = vec![lock.name.clone()];
                if redlock {
                    row.push(format!("{}/{}", lock.holding(), listing.nodes.len()));
                }
                row.push(format::duration(lock.remaining(quorum)));
                row.push(format::token(lock.fencing_token()));
                row.push(lock.count(quorum, |h| h.holders).to_string());
                row.push(lock.count(quorum, |h| h.queued).to_string());
                row.push(format::owners_cell(&lock.owners(quorum)));
                if redlock {
                    row.extend(lock.holds.iter().map(|h| {
                        format::node_cell(h.is_some(), h.as_ref().and_then(|h| h.remaining))
                    }));
                }
                row
            })
            .collect();
    print!("{}", format::table(&header, &rows));
}

fn print_json(target: &Target, listing: &Listing) {
    let quorum = listing.quorum;
    let locks: Vec<serde_json::Value> = listing
        .locks
        .iter()
        .map(|lock| {
            let nodes: Vec<serde_json::Value> = listing
                .nodes
                .iter()
                .zip(&lock.holds)
                .map(|(node, hold)| holds::view(node, hold.as_ref()).json())
                .collect();
            serde_json::json!({
                "key": lock.name,
                "held": lock.holding() >= quorum,
                "nodes_holding": lock.holding(),
                "remaining_ms": format::millis(lock.remaining(quorum)),
                "fencing_token": lock.fencing_token(),
                "holders": lock.count(quorum, |h| h.holders),
                "queued": lock.count(quorum, |h| h.queued),
                "owners": format::owners_json(&lock.owners(quorum)),
                "nodes": nodes,
            })
        })
        .collect();
    let unreachable: Vec<String> = listing
        .unreachable
        .iter()
        .map(|u| target.error(u).to_string())
        .collect();
    let doc = serde_json::json!({ "locks": locks, "unreachable": unreachable });
    println!("{doc}");
}
