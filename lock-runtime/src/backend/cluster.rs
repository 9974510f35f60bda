//! Redis Cluster: one [`Node`] over the whole cluster. Each call goes to the master of its keys'
//! slot through redis-rs's cluster client (which follows `MOVED`/`ASK` and refreshes its slot map
//! after a failover); the scripts are the single-node ones ([`Calls`]).
//!
//! A lock's own keys always share a slot (see [`redis_keys`](super::redis_keys)). A multi-key
//! lock whose names share a hash tag is one script call; otherwise its keys are grouped by slot
//! and taken group by group in canonical order, and a refusal or failure gives back the groups
//! already taken.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{RedisError, RedisResult};
use tokio::sync::OnceCell;

use super::redis::{Calls, OpenPubSub, PubSub, Subscriptions};
use super::{Attempt, BoxFuture, ExtendItem, ExtendOutcome, Node, NodeView, Subscription, Token};
use crate::config::{NodeAddr, Settings};
use crate::error::{FailureKind, LockError, NodeFailure};
use crate::wait::WakeRegistry;

pub(crate) struct ClusterNode {
    /// `cluster(host:port, ...)`: the seeds, for inspection and failures.
    calls: Calls,
    client: ClusterClient,
    conn: OnceCell<ClusterConnection>,
    /// Bound on connecting to the cluster.
    connect_bound: Duration,
    subs: Arc<Subscriptions>,
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.subs.node_dropped();
    }
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("seeds", &self.calls.addr)
            .finish()
    }
}

/// The cluster client's settings: each request is bounded by the client's own timeouts, and
/// redirections and a failover's slot-map refresh are retried a few times within them.
fn builder(
    seeds: &[redis::ConnectionInfo],
    connect_timeout: Duration,
    response_timeout: Duration,
) -> ClusterClientBuilder {
    ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .retries(4)
        .min_retry_wait(10)
        .max_retry_wait(200)
}

impl ClusterNode {
    /// Must run inside the library's runtime: connections spawn their tasks there.
    pub(crate) fn new(
        seeds: &[NodeAddr],
        settings: &Settings,
        wakers: Arc<WakeRegistry>,
    ) -> Result<Self, LockError> {
        let invalid = |e: RedisError| LockError::config("seed_urls", e.category().to_owned());
        let infos: Vec<redis::ConnectionInfo> = seeds.iter().map(|s| s.info.clone()).collect();
        let (connect_timeout, response_timeout) =
            (settings.connect_timeout, settings.response_timeout);
        let client = builder(&infos, connect_timeout, response_timeout)
            .build()
            .map_err(invalid)?;
        // Checked here, used on the notification task.
        builder(&infos, connect_timeout, response_timeout)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .build()
            .map_err(invalid)?;
        let open: OpenPubSub = Box::new(move |on_push| {
            let notify = builder(&infos, connect_timeout, response_timeout)
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(move |push| on_push(push))
                .build();
            Box::pin(async move {
                let conn = notify?.get_async_connection().await?;
                Ok(Box::new(Sharded(conn)) as Box<dyn PubSub>)
            })
        });
        let names: Vec<&str> = seeds.iter().map(|s| s.name.as_str()).collect();
        Ok(ClusterNode {
            calls: Calls::new(
                format!("cluster({})", names.join(", ")),
                settings,
                "SPUBLISH",
            ),
            client,
            conn: OnceCell::new(),
            connect_bound: connect_timeout.saturating_add(response_timeout),
            subs: Subscriptions::new(open, wakers, settings),
        })
    }

    /// The cluster connection, made on first use (bounded; a failed attempt is retried by the
    /// next call).
    async fn conn(&self) -> Result<&ClusterConnection, NodeFailure> {
        self.conn
            .get_or_try_init(|| async {
                match tokio::time::timeout(self.connect_bound, self.client.get_async_connection())
                    .await
                {
                    Ok(Ok(conn)) => Ok(conn),
                    Ok(Err(err)) => Err(NodeFailure::from_redis(&self.calls.addr, &err)),
                    Err(_) => Err(NodeFailure::timeout(&self.calls.addr, "connect")),
                }
            })
            .await
    }

    fn slot(&self, name: &str) -> Slot {
        let [lock, ..] = self.calls.keys(name);
        Slot::for_key(lock)
    }

    /// Indices of `names` grouped by slot, groups in the order of their first name.
    fn by_slot(&self, names: &[Arc<str>]) -> Vec<(Slot, Vec<usize>)> {
        let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let slot = self.slot(name);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        groups
    }

    /// Names the slot in a failure of the cluster.
    fn at_slot(&self, slot: Slot, mut failure: NodeFailure) -> NodeFailure {
        failure.node = format!("{} {slot:?}", self.calls.addr);
        failure
    }

    async fn release_groups(
        &self,
        conn: &ClusterConnection,
        names: &[Arc<str>],
        groups: &[(Slot, Vec<usize>)],
        token: &Token,
        wake: bool,
    ) -> Result<bool, NodeFailure> {
        let calls = groups.iter().map(|(slot, members)| async move {
            let subset: Vec<Arc<str>> = members.iter().map(|&i| Arc::clone(&names[i])).collect();
            self.calls
                .release(conn, &subset, token, wake)
                .await
                .map_err(|f| self.at_slot(*slot, f))
        });
        let mut all_ours = true;
        let mut failure = None;
        for outcome in join_all(calls).await {
            match outcome {
                Ok(ours) => all_ours &= ours,
                Err(f) => failure = failure.or(Some(f)),
            }
        }
        match failure {
            Some(f) => Err(f),
            None => Ok(all_ours),
        }
    }
}

impl Node for ClusterNode {
    fn addr(&self) -> &str {
        &self.calls.addr
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeView>, NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            self.calls
                .inspect(conn, name)
                .await
                .map_err(|f| self.at_slot(self.slot(name), f))
        })
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            self.calls
                .force_release(conn, name)
                .await
                .map_err(|f| self.at_slot(self.slot(name), f))
        })
    }

    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ttl: Duration,
        fencing: bool,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            let groups = self.by_slot(names);
            if let [(slot, _)] = groups.as_slice() {
                return self
                    .calls
                    .acquire(conn, names, token, ttl, fencing)
                    .await
                    .map_err(|f| self.at_slot(*slot, f));
            }
            // Keys in several slots: group by group, giving back what was taken on a refusal.
            let mut fences = vec![0; if fencing { names.len() } else { 0 }];
            for (taken, (slot, members)) in groups.iter().enumerate() {
                let subset: Vec<Arc<str>> =
                    members.iter().map(|&i| Arc::clone(&names[i])).collect();
                let outcome = self.calls.acquire(conn, &subset, token, ttl, fencing).await;
                let refusal = match outcome {
                    Ok(Attempt::Acquired { fences: got }) => {
                        for (&i, fence) in members.iter().zip(got) {
                            if let Some(f) = fences.get_mut(i) {
                                *f = fence;
                            }
                        }
                        continue;
                    }
                    Ok(Attempt::Held { index, pttl }) => Ok(Attempt::Held {
                        index: members.get(index).copied().unwrap_or(0),
                        pttl,
                    }),
                    Err(failure) => Err(self.at_slot(*slot, failure)),
                };
                // Waiters that saw these keys taken are woken: they never were a lock.
                let back = self
                    .release_groups(conn, names, &groups[..taken], token, true)
                    .await;
                return match (refusal, back) {
                    (refusal, Ok(_)) => refusal,
                    // The grants may still be there: an unknown outcome, so the caller releases
                    // by token before giving up.
                    (_, Err(failure)) => Err(NodeFailure {
                        kind: if failure.kind.may_have_applied() {
                            failure.kind
                        } else {
                            FailureKind::Io
                        },
                        ..failure
                    }),
                };
            }
            Ok(Attempt::Acquired { fences })
        })
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        Box::pin(async move {
            let conn = match self.conn().await {
                Ok(conn) => conn,
                Err(failure) => {
                    return items
                        .iter()
                        .map(|_| ExtendOutcome::Failed(failure.clone()))
                        .collect();
                }
            };
            // Split each lock into its slots' parts, then one pipeline per slot, all at once
            // (the cluster client multiplexes them on one connection per master).
            let mut parts: Vec<Vec<Arc<str>>> = Vec::new();
            let mut owners: Vec<(usize, Vec<usize>)> = Vec::new();
            let mut per_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
            for (item_index, item) in items.iter().enumerate() {
                for (slot, members) in self.by_slot(item.names) {
                    per_slot.entry(slot).or_default().push(parts.len());
                    parts.push(
                        members
                            .iter()
                            .map(|&i| Arc::clone(&item.names[i]))
                            .collect(),
                    );
                    owners.push((item_index, members));
                }
            }
            let runs = per_slot.into_iter().map(|(slot, part_indices)| {
                let parts = &parts;
                let owners = &owners;
                async move {
                    let chunk: Vec<ExtendItem<'_>> = part_indices
                        .iter()
                        .map(|&p| ExtendItem {
                            names: &parts[p],
                            token: items[owners[p].0].token,
                            ttl: items[owners[p].0].ttl,
                        })
                        .collect();
                    let outcomes = self.calls.extend_many(conn, &chunk).await;
                    part_indices
                        .into_iter()
                        .zip(outcomes)
                        .map(|(p, outcome)| match outcome {
                            ExtendOutcome::Failed(f) => {
                                (p, ExtendOutcome::Failed(self.at_slot(slot, f)))
                            }
                            other => (p, other),
                        })
                        .collect::<Vec<_>>()
                }
            });
            let mut out: Vec<ExtendOutcome> =
                items.iter().map(|_| ExtendOutcome::Extended).collect();
            for (p, outcome) in join_all(runs).await.into_iter().flatten() {
                let (item_index, members) = &owners[p];
                let merged = match (&out[*item_index], outcome) {
                    // "Not ours" settles it, whatever the other parts say.
                    (ExtendOutcome::NotOwned { .. }, _) => continue,
                    (_, ExtendOutcome::NotOwned { index }) => ExtendOutcome::NotOwned {
                        index: members.get(index).copied().unwrap_or(0),
                    },
                    (ExtendOutcome::Failed(_), _) => continue,
                    (_, other) => other,
                };
                out[*item_index] = merged;
            }
            out
        })
    }

    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            let groups = self.by_slot(names);
            self.release_groups(conn, names, &groups, token, wake).await
        })
    }

    fn raise_fences<'a>(
        &'a self,
        names: &'a [Arc<str>],
        fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            for (slot, members) in self.by_slot(names) {
                let subset: Vec<Arc<str>> =
                    members.iter().map(|&i| Arc::clone(&names[i])).collect();
                let values: Vec<u64> = members
                    .iter()
                    .map(|&i| fences.get(i).copied().unwrap_or(0))
                    .collect();
                self.calls
                    .raise_fences(conn, &subset, &values)
                    .await
                    .map_err(|f| self.at_slot(slot, f))?;
            }
            Ok(())
        })
    }

    fn watch(&self, name: &str) -> Subscription {
        let [_, _, channel] = self.calls.keys(name);
        self.subs.watch(name, channel)
    }
}

/// Sharded pub/sub on a cluster connection: each channel is subscribed on its slot's shard
/// (channels of different slots cannot share one `SSUBSCRIBE`).
struct Sharded(ClusterConnection);

impl PubSub for Sharded {
    fn subscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>> {
        Box::pin(async move {
            let conn = &self.0;
            let all = channels.iter().map(|c| {
                let mut conn = conn.clone();
                async move { conn.ssubscribe(c).await }
            });
            join_all(all).await.into_iter().collect()
        })
    }

    fn unsubscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>> {
        Box::pin(async move {
            let conn = &self.0;
            let all = channels.iter().map(|c| {
                let mut conn = conn.clone();
                async move { conn.sunsubscribe(c).await }
            });
            join_all(all).await.into_iter().collect()
        })
    }
}
