//! Looking at a lock from outside: what `inspect` answers, and the operator's forced release.

use std::time::Duration;

use futures_util::future::join_all;

use crate::backend::{Backend, Quorum};
use crate::error::{LockError, NodeFailure};
use crate::owner::Owner;

/// What the servers say of a lock (see [`inspect`](crate::inspect)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's key, without the configured prefix.
    pub key: String,
    /// How long the lock lives without a renewal: on one node its time to live, under Redlock
    /// the time until fewer than a majority of nodes hold it. `None` when the key has no expiry.
    pub remaining: Option<Duration>,
    /// The holder's fencing token where the server keeps one per lock: etcd (the key's
    /// revision) and in memory. `None` on Redis, which keeps one fence counter per server (per
    /// slot on a Cluster), not a token per lock: the holder's token is its guard's
    /// ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)).
    pub fencing_token: Option<u64>,
    /// How many holders the lock has: 1 for an exclusive lock that is held, the live shares or
    /// permits of a shared lock or semaphore (under Redlock, as a majority of nodes count them).
    pub holders: usize,
    /// How many waiters a fair lock's queue holds (0 for other locks).
    pub queued: usize,
    /// Who holds it, as each grant recorded it: one entry for an exclusive lock, one per live
    /// share or permit (under Redlock, the holders a majority of nodes record). A holder whose
    /// grant recorded nothing (a value written by something else) has no entry.
    pub owners: Vec<Owner>,
    /// Each node's view, in config order (one entry for a single node, `memory` in memory).
    pub nodes: Vec<NodeLockState>,
}

/// One node's view of a lock, in [`LockInfo::nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeLockState {
    /// The node's address (never with credentials).
    pub node: String,
    /// Whether the node holds the lock key.
    pub held: bool,
    /// The key's time to live on this node (`None`: not held, or no expiry).
    pub remaining: Option<Duration>,
    /// The holder's fencing token as this node knows it (`None` on Redis: see
    /// [`LockInfo::fencing_token`]).
    pub fencing_token: Option<u64>,
}

/// Asks every node about `name`. `None` when no node holds it (Redlock: fewer than a majority).
pub(crate) async fn inspect(backend: &Backend, name: &str) -> Result<Option<LockInfo>, LockError> {
    let nodes = backend.nodes();
    let quorum = Quorum::majority(nodes.len());
    let views = join_all(nodes.iter().map(|node| node.inspect(name))).await;
    let mut states = Vec::with_capacity(nodes.len());
    let mut failures = Vec::new();
    // The holders and the waiters each node that holds the lock counts.
    let mut holders_seen = Vec::new();
    let mut queued_seen = Vec::new();
    // The owners each node that holds the lock records.
    let mut owners_seen = Vec::new();
    for (node, view) in nodes.iter().zip(views) {
        match view {
            Ok(view) => {
                states.push(NodeLockState {
                    node: node.addr().to_owned(),
                    held: view.is_some(),
                    remaining: view.as_ref().and_then(|v| v.remaining),
                    fencing_token: view.as_ref().and_then(|v| v.fencing_token),
                });
                if let Some(v) = view {
                    holders_seen.push(v.holders);
                    queued_seen.push(v.queued);
                    owners_seen.push(v.owners);
                }
            }
            Err(failure) => failures.push(failure),
        }
    }
    if failures.len() > nodes.len() - quorum {
        return Err(unavailable(name, failures));
    }
    let held: Vec<&NodeLockState> = states.iter().filter(|s| s.held).collect();
    if held.len() < quorum.min(nodes.len()) {
        return Ok(None);
    }
    // Valid while a majority holds it: the quorum-th longest time to live.
    let mut ttls: Vec<Option<Duration>> = held.iter().map(|s| s.remaining).collect();
    ttls.sort_by(|a, b| b.cmp(a));
    let remaining = ttls.get(quorum - 1).copied().flatten();
    let fencing_token = states.iter().filter_map(|s| s.fencing_token).max();
    // As a majority counts them: the quorum-th largest count.
    let majority = |mut counts: Vec<usize>| {
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts.get(quorum - 1).copied().unwrap_or(0)
    };
    let holders = majority(holders_seen);
    // The longest line: the waiters of a contended Redlock lock line up at its gate node only.
    let queued = queued_seen.into_iter().max().unwrap_or(0);
    let owners = majority_owners(&owners_seen, quorum);
    Ok(Some(LockInfo {
        key: name.to_owned(),
        remaining,
        fencing_token,
        holders,
        queued,
        owners,
        nodes: states,
    }))
}

/// The owners a majority of nodes record, from the records of each node that holds the lock:
/// each record as many times as the `quorum`-th node counts it (two grants can record the same:
/// one client, one millisecond), in the order the nodes first list them.
pub(crate) fn majority_owners(per_node: &[Vec<Owner>], quorum: usize) -> Vec<Owner> {
    let mut distinct: Vec<&Owner> = Vec::new();
    for owner in per_node.iter().flatten() {
        if !distinct.contains(&owner) {
            distinct.push(owner);
        }
    }
    let mut owners = Vec::new();
    for owner in distinct {
        let mut counts: Vec<usize> = per_node
            .iter()
            .map(|records| records.iter().filter(|o| *o == owner).count())
            .collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let times = counts.get(quorum.saturating_sub(1)).copied().unwrap_or(0);
        owners.extend(std::iter::repeat_n(owner.clone(), times));
    }
    owners
}

/// Deletes `name` on every node whoever holds it. `Ok(true)` when any node held it.
pub(crate) async fn force_release(backend: &Backend, name: &str) -> Result<bool, LockError> {
    let nodes = backend.nodes();
    let quorum = Quorum::majority(nodes.len());
    let answers = join_all(nodes.iter().map(|node| node.force_release(name))).await;
    let mut held = 0;
    let mut failures = Vec::new();
    for answer in answers {
        match answer {
            Ok(true) => held += 1,
            Ok(false) => {}
            Err(failure) => failures.push(failure),
        }
    }
    if failures.len() > nodes.len() - quorum {
        return Err(unavailable(name, failures));
    }
    Ok(held > 0)
}

fn unavailable(name: &str, causes: Vec<NodeFailure>) -> LockError {
    LockError::Unavailable {
        key: name.to_owned(),
        causes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn owner(name: &str) -> Owner {
        Owner {
            name: name.to_owned(),
            host: "h".to_owned(),
            pid: 1,
            program: "p".to_owned(),
            since: Some(UNIX_EPOCH),
        }
    }

    #[test]
    fn owners_are_those_a_majority_records_as_often_as_it_does() {
        let (a, b, c) = (owner("a"), owner("b"), owner("c"));
        let per_node = vec![
            vec![a.clone(), b.clone(), b.clone()],
            vec![b.clone(), a.clone(), b.clone(), c.clone()],
            vec![c.clone()],
        ];
        // `a` on two of three, `b` twice on two, `c` on two.
        assert_eq!(
            majority_owners(&per_node, 2),
            vec![a.clone(), b.clone(), b.clone(), c.clone()]
        );
        assert_eq!(majority_owners(&per_node, 3), Vec::<Owner>::new());
        assert_eq!(majority_owners(&per_node[..1], 1), vec![a, b.clone(), b]);
    }
}
