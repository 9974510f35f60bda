//! Redlock: N independent Redis masters, each running the single-node operations; a lock is held
//! while a majority (N/2 + 1) holds it. Every request fans out in parallel and the decision is taken
//! as soon as the quorum is won or can no longer be won: a slow or frozen minority never delays it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;

use super::{Attempt, ExtendOutcome, LockKeys, RedisNode, Token};
use crate::config::{NodeAddr, Settings};
use crate::error::{LockError, NodeFailure};
use crate::wait::{NodeSubscription, WakeRegistry};

#[derive(Debug)]
pub(crate) struct Redlock {
    nodes: Vec<Arc<RedisNode>>,
    quorum: usize,
    releasing: Arc<Mutex<HashMap<AttemptKey, Releases>>>,
}

/// A lock key and the token of one acquire call (which keeps its token across attempts).
type AttemptKey = (String, String);

/// One "done" signal per node (in node order) for the releases sent after a failed attempt.
type Releases = Arc<[CancellationToken]>;

impl Redlock {
    pub(crate) fn new(
        addrs: &[NodeAddr],
        settings: &Settings,
        wakers: Arc<WakeRegistry>,
    ) -> Result<Self, LockError> {
        let nodes = addrs
            .iter()
            .map(|addr| RedisNode::new(addr, settings, Arc::clone(&wakers)).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Redlock {
            quorum: nodes.len() / 2 + 1,
            nodes,
            releasing: Arc::default(),
        })
    }

    /// Acquires on a quorum. On failure the token is released on every node, including those whose
    /// grant arrives after the decision (the release is queued behind the acquire on the same
    /// connection, so it cannot overtake it).
    ///
    /// Failure is `Err` (unavailable) when more nodes failed than a quorum can spare, whatever the
    /// others answered, and `Held` (contended) otherwise. The answer is given as soon as it is
    /// settled, so a frozen minority never delays it, and never depends on which node answers first.
    pub(crate) async fn acquire(
        &self,
        keys: &Arc<LockKeys>,
        token: &Token,
        ttl: Duration,
    ) -> Result<Attempt, Vec<NodeFailure>> {
        let attempt_key = (keys.lock.clone(), token.as_str().to_owned());
        let previous = self.previous_releases(&attempt_key);
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let before = previous.as_ref().map(|p| p[i].clone());
                async move {
                    // A previous attempt's release carries this same token: were it to land after
                    // this grant, it would delete a grant counted here.
                    if let Some(before) = before {
                        before.cancelled().await;
                    }
                    node.acquire(keys, token, ttl, false).await
                }
            })
            .collect();
        // How many nodes may fail or refuse while a quorum is still possible.
        let spare = self.nodes.len() - self.quorum;
        let mut won = 0;
        let mut shortest_pttl: Option<Duration> = None;
        let mut failures = Vec::new();
        while let Some(reply) = pending.next().await {
            match reply {
                Ok(Attempt::Acquired { .. }) => won += 1,
                Ok(Attempt::Held { pttl }) => {
                    if let Some(p) = pttl {
                        shortest_pttl = Some(shortest_pttl.map_or(p, |s| s.min(p)));
                    }
                }
                Err(failure) => failures.push(failure),
            }
            let lost = won + pending.len() < self.quorum;
            // Contended for sure: even if every node still pending fails, the failures alone
            // would not have ruled out a quorum.
            let contended = lost && failures.len() + pending.len() <= spare;
            if won >= self.quorum || failures.len() > spare || contended {
                break;
            }
        }
        drop(pending);
        if won >= self.quorum {
            return Ok(Attempt::Acquired { fence: None });
        }
        self.release_after_failed_attempt(attempt_key, previous, keys, token);
        if failures.len() > spare {
            Err(failures)
        } else {
            Ok(Attempt::Held {
                pttl: shortest_pttl,
            })
        }
    }

    fn previous_releases(&self, attempt_key: &AttemptKey) -> Option<Releases> {
        self.releasing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(attempt_key)
            .cloned()
    }

    /// Releases a failed attempt's token on every node in the background. The next attempt with
    /// the same token waits, per node, until that node's release is answered (or failed), so a
    /// slow node never delays the next decision and a late release never deletes a newer grant.
    fn release_after_failed_attempt(
        &self,
        attempt_key: AttemptKey,
        previous: Option<Releases>,
        keys: &Arc<LockKeys>,
        token: &Token,
    ) {
        let done: Releases = self
            .nodes
            .iter()
            .map(|_| CancellationToken::new())
            .collect();
        for (i, node) in self.nodes.iter().enumerate() {
            let before = previous.as_ref().map(|p| p[i].clone());
            let (node, keys, token) = (Arc::clone(node), Arc::clone(keys), token.clone());
            let done = done[i].clone().drop_guard();
            tokio::spawn(async move {
                let _done = done;
                if let Some(before) = before {
                    before.cancelled().await;
                }
                let _ = node.release(&keys, &token).await;
            });
        }
        self.releasing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(attempt_key.clone(), Arc::clone(&done));
        // Forget the entry once every node answered, unless a later attempt replaced it.
        let releasing = Arc::clone(&self.releasing);
        tokio::spawn(async move {
            for node_done in done.iter() {
                node_done.cancelled().await;
            }
            let mut releasing = releasing.lock().unwrap_or_else(PoisonError::into_inner);
            if releasing
                .get(&attempt_key)
                .is_some_and(|current| Arc::ptr_eq(current, &done))
            {
                releasing.remove(&attempt_key);
            }
        });
    }

    /// Extends on every node in parallel; a lock is extended when a quorum confirms it, and not
    /// ours any more when a quorum can no longer confirm it because nodes said "not yours".
    pub(crate) async fn extend_many(
        &self,
        items: &[(&LockKeys, &Token, Duration)],
    ) -> Vec<ExtendOutcome> {
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| node.extend_many(items))
            .collect();
        let n = self.nodes.len();
        let mut yes = vec![0usize; items.len()];
        let mut no = vec![0usize; items.len()];
        let mut first_failure: Vec<Option<NodeFailure>> = vec![None; items.len()];
        let decided = |yes: &[usize], no: &[usize]| {
            yes.iter()
                .zip(no)
                .all(|(y, no)| *y >= self.quorum || n - no < self.quorum)
        };
        while let Some(replies) = pending.next().await {
            for (i, reply) in replies.into_iter().enumerate() {
                match reply {
                    ExtendOutcome::Extended => yes[i] += 1,
                    ExtendOutcome::NotOwned => no[i] += 1,
                    ExtendOutcome::Failed(f) => {
                        first_failure[i].get_or_insert(f);
                    }
                }
            }
            if decided(&yes, &no) {
                break;
            }
        }
        (0..items.len())
            .map(|i| {
                if yes[i] >= self.quorum {
                    ExtendOutcome::Extended
                } else if n - no[i] < self.quorum {
                    ExtendOutcome::NotOwned
                } else {
                    ExtendOutcome::Failed(first_failure[i].take().unwrap_or_else(|| {
                        NodeFailure::timeout("quorum", "extend on a quorum of nodes")
                    }))
                }
            })
            .collect()
    }

    /// Releases on every node. Returns once the outcome is settled (a quorum said "ours" or
    /// "not ours"), while the remaining nodes finish in the background, so a frozen or dead
    /// minority never makes the caller wait.
    pub(crate) async fn release(
        &self,
        keys: &Arc<LockKeys>,
        token: &Token,
    ) -> Result<bool, Vec<NodeFailure>> {
        let mut replies = self.release_everywhere(keys, token);
        let n = self.nodes.len();
        let (mut ours, mut not_ours) = (0, 0);
        let mut failures = Vec::new();
        while let Some(reply) = replies.recv().await {
            match reply {
                Ok(true) => ours += 1,
                Ok(false) => not_ours += 1,
                Err(f) => failures.push(f),
            }
            if ours >= self.quorum {
                return Ok(true);
            }
            if n - not_ours < self.quorum {
                return Ok(false);
            }
        }
        // Too many nodes failed to tell whether a quorum still held the lock.
        Err(failures)
    }

    /// Sends the release to every node as its own task, so each completes even if nobody waits.
    fn release_everywhere(
        &self,
        keys: &Arc<LockKeys>,
        token: &Token,
    ) -> tokio::sync::mpsc::UnboundedReceiver<Result<bool, NodeFailure>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for node in &self.nodes {
            let (node, keys, token, tx) = (
                Arc::clone(node),
                Arc::clone(keys),
                token.clone(),
                tx.clone(),
            );
            tokio::spawn(async move {
                let _ = tx.send(node.release(&keys, &token).await);
            });
        }
        rx
    }

    /// Subscribes on every node (a release publishes on each), concurrently.
    pub(crate) async fn subscribe(&self, keys: &LockKeys) -> Vec<NodeSubscription> {
        let subs: Vec<_> = self.nodes.iter().map(|node| node.subscribe(keys)).collect();
        futures_util::future::join_all(subs)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}
