//! Redis Cluster: one [`Node`] over the whole cluster. Each call goes to the master of its keys'
//! slot through redis-rs's cluster client (which follows `MOVED`/`ASK` and refreshes its slot map
//! after a failover); the scripts are the single-node ones ([`Calls`]).
//!
//! A lock's own keys always share a slot (see [`redis_key`](super::redis_key)). A multi-key
//! lock whose names share a hash tag is one script call; otherwise its keys are grouped by slot
//! and taken group by group in canonical order, and a refusal or failure gives back the groups
//! already taken.
//!
//! Renewal sends one pipeline per master: the node keeps its own copy of the slot map
//! (`CLUSTER SLOTS`, refreshed every [`SLOT_MAP_AGE`] and after a redirection) to group the locks
//! by master; a lock whose slot moved meanwhile fails that round (`MOVED`) and is renewed by the
//! next one, well within its validity.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

use super::redis::{Calls, NodeAddr, OpenPubSub, PubSub, Subscriptions, hash_tag, own_channel};
use super::{
    Ask, Attempt, Backend, BackendConfig, BackendKind, BoxFuture, ExtendItem, ExtendOutcome, Mode,
    Node, NodeHold, Subscription, Token, ValidBackend,
};
use crate::config::{Settings, redact_all};
use crate::error::{FailureKind, LockError, NodeFailure};
use crate::wait::WakeRegistry;

pub(crate) struct ClusterNode {
    /// The script calls, over the cluster connection: each goes to the master of its keys' slot.
    calls: Calls,
    client: ClusterClient,
    conn: OnceCell<ClusterConnection>,
    /// Bound on connecting to the cluster.
    connect_bound: Duration,
    subs: Arc<Subscriptions>,
    /// Which master serves which slots, for renewal batches; `None` until read, or once stale.
    slot_map: Mutex<Option<(Instant, Arc<SlotMap>)>>,
}

/// How long a copy of the slot map is used before it is read again.
const SLOT_MAP_AGE: Duration = Duration::from_secs(5);

/// Slot ranges and their masters, sorted.
type SlotMap = Vec<SlotRange>;

/// Which lock of a renewal batch one slot's part belongs to: the item's index, the slot, and the
/// indices of the item's keys in it.
struct PartOf {
    item: usize,
    slot: u16,
    members: Vec<usize>,
}

/// The slots `first..=last`, and the master that serves them.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct SlotRange {
    first: u16,
    last: u16,
    host: String,
    port: u16,
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (or of the whole key), modulo
/// 16384.
pub(crate) fn key_slot(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for &byte in hash_tag(key).unwrap_or(key).as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc & 0x3FFF
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
/// redirections and a failover's slot-map refresh are retried a few times within them. The
/// certificates of `tls_root_ca` / `tls_client_cert` go to every node the client learns of.
fn builder(seeds: &[redis::ConnectionInfo], settings: &Settings) -> ClusterClientBuilder {
    let builder = ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(settings.connect_timeout)
        .response_timeout(settings.response_timeout)
        .retries(4)
        .min_retry_wait(10)
        .max_retry_wait(200);
    #[cfg(feature = "tls")]
    let builder = match settings.tls.redis() {
        Some(certs) => builder.certs(certs),
        None => builder,
    };
    builder
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
        let client = builder(&infos, settings).build().map_err(invalid)?;
        // Checked here, used on the notification task.
        builder(&infos, settings)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .build()
            .map_err(invalid)?;
        let notify_settings = settings.clone();
        let open: OpenPubSub = Box::new(move |on_push| {
            let notify = builder(&infos, &notify_settings)
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
                // `cluster(host:port, ...)`: the seeds, for inspection and failures.
                format!("cluster({})", names.join(", ")),
                settings,
                "SPUBLISH",
                false,
            ),
            client,
            conn: OnceCell::new(),
            connect_bound: settings.request_timeout(),
            subs: Subscriptions::new(open, wakers, settings),
            slot_map: Mutex::new(None),
        })
    }

    /// The slot map, read again when missing or older than [`SLOT_MAP_AGE`]; `None` when it
    /// cannot be read (renewal then sends one pipeline per slot).
    async fn slot_map(&self, conn: &ClusterConnection) -> Option<Arc<SlotMap>> {
        {
            let cached = self.slot_map.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((at, map)) = cached.as_ref()
                && at.elapsed() < SLOT_MAP_AGE
            {
                return Some(Arc::clone(map));
            }
        }
        let mut conn = conn.clone();
        let read = conn.route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
        );
        let value = tokio::time::timeout(self.connect_bound, read)
            .await
            .ok()?
            .ok()?;
        let map = Arc::new(parse_slots(value)?);
        *self.slot_map.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), Arc::clone(&map)));
        Some(map)
    }

    fn slot_map_is_stale(&self) {
        *self.slot_map.lock().unwrap_or_else(PoisonError::into_inner) = None;
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

    fn slot(&self, name: &str) -> u16 {
        let [lock, ..] = self.calls.keys(name);
        key_slot(&lock)
    }

    /// Indices of `names` grouped by slot, groups in the order of their first name.
    fn by_slot(&self, names: &[Arc<str>]) -> Vec<(u16, Vec<usize>)> {
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
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
    fn at_slot(&self, slot: u16, mut failure: NodeFailure) -> NodeFailure {
        failure.node = format!("{} slot {slot}", self.calls.addr);
        failure
    }

    async fn release_groups(
        &self,
        conn: &ClusterConnection,
        names: &[Arc<str>],
        groups: &[(u16, Vec<usize>)],
        token: &Token,
        mode: Mode,
        wake: bool,
    ) -> Result<bool, NodeFailure> {
        self.on_groups(names, groups, |subset| async move {
            self.calls.release(conn, &subset, token, mode, wake).await
        })
        .await
    }

    /// Runs `call` on the keys of each slot group at once; `Ok(true)` when every group answered
    /// that all its keys were ours.
    async fn on_groups<F, Fut>(
        &self,
        names: &[Arc<str>],
        groups: &[(u16, Vec<usize>)],
        call: F,
    ) -> Result<bool, NodeFailure>
    where
        F: Fn(Vec<Arc<str>>) -> Fut,
        Fut: Future<Output = Result<bool, NodeFailure>>,
    {
        let calls = groups.iter().map(|(slot, members)| {
            let subset: Vec<Arc<str>> = members.iter().map(|&i| Arc::clone(&names[i])).collect();
            let call = call(subset);
            async move { call.await.map_err(|f| self.at_slot(*slot, f)) }
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
    fn tells_waiters_alone(&self) -> bool {
        true
    }

    fn queues_starving_waiters(&self) -> bool {
        self.calls.queues_starving_waiters()
    }

    fn hand_off_is_a_grant(&self) -> bool {
        false
    }

    fn addr(&self) -> &str {
        &self.calls.addr
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeHold>, NodeFailure>> {
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
        ask: Ask,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            let groups = self.by_slot(names);
            if let [(slot, _)] = groups.as_slice() {
                return self
                    .calls
                    .acquire(conn, names, token, ask)
                    .await
                    .map_err(|f| self.at_slot(*slot, f));
            }
            // Keys in several slots (exclusive locks only): group by group, giving back what was
            // taken on a refusal.
            let mut fences = vec![0; if ask.fencing { names.len() } else { 0 }];
            for (taken, (slot, members)) in groups.iter().enumerate() {
                let subset: Vec<Arc<str>> =
                    members.iter().map(|&i| Arc::clone(&names[i])).collect();
                let outcome = self.calls.acquire(conn, &subset, token, ask).await;
                let refusal = match outcome {
                    Ok(Attempt::Acquired { fences: got }) => {
                        for (&i, fence) in members.iter().zip(got) {
                            if let Some(f) = fences.get_mut(i) {
                                *f = fence;
                            }
                        }
                        continue;
                    }
                    Ok(Attempt::Held {
                        index,
                        pttl,
                        ticket,
                        announced,
                    }) => Ok(Attempt::Held {
                        index: members.get(index).copied().unwrap_or(0),
                        pttl,
                        ticket,
                        announced,
                    }),
                    Ok(mismatch @ Attempt::Mismatch { .. }) => Ok(mismatch),
                    Err(failure) => Err(self.at_slot(*slot, failure)),
                };
                // Waiters that saw these keys taken are woken: they never were a lock.
                let back = self
                    .release_groups(conn, names, &groups[..taken], token, ask.mode, true)
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
                    return ExtendOutcome::all_failed(items.len(), &failure);
                }
            };
            // Each lock split into its slots' parts; the parts batched by master (by slot when
            // the slot map cannot be read), every batch one pipeline, all batches at once.
            let map = self.slot_map(conn).await;
            let mut parts: Vec<Vec<Arc<str>>> = Vec::new();
            let mut owners: Vec<PartOf> = Vec::new();
            let mut batches: HashMap<Batch, Vec<usize>> = HashMap::new();
            for (item_index, item) in items.iter().enumerate() {
                for (slot, members) in self.by_slot(item.names) {
                    let batch = map
                        .as_deref()
                        .and_then(|map| master_of(map, slot))
                        .map_or(Batch::Slot(slot), |(host, port)| {
                            Batch::Master(host.to_owned(), port)
                        });
                    batches.entry(batch).or_default().push(parts.len());
                    parts.push(
                        members
                            .iter()
                            .map(|&i| Arc::clone(&item.names[i]))
                            .collect(),
                    );
                    owners.push(PartOf {
                        item: item_index,
                        slot,
                        members,
                    });
                }
            }
            let runs = batches.into_iter().map(|(batch, part_indices)| {
                let (parts, owners) = (&parts, &owners);
                async move {
                    let chunk: Vec<ExtendItem<'_>> = part_indices
                        .iter()
                        .map(|&p| ExtendItem {
                            names: &parts[p],
                            token: items[owners[p].item].token,
                            ttl: items[owners[p].item].ttl,
                            mode: items[owners[p].item].mode,
                        })
                        .collect();
                    let outcomes = match batch {
                        Batch::Master(host, port) => {
                            let to = ToMaster {
                                conn: conn.clone(),
                                host,
                                port,
                            };
                            self.calls.extend_many(&to, &chunk).await
                        }
                        Batch::Slot(_) => self.calls.extend_many(conn, &chunk).await,
                    };
                    part_indices.into_iter().zip(outcomes).collect::<Vec<_>>()
                }
            });
            let mut out: Vec<ExtendOutcome> =
                items.iter().map(|_| ExtendOutcome::Extended).collect();
            for (p, outcome) in join_all(runs).await.into_iter().flatten() {
                let PartOf {
                    item: item_index,
                    slot,
                    members,
                } = &owners[p];
                let merged = match (&out[*item_index], outcome) {
                    // "Not ours" settles it, whatever the other parts say.
                    (ExtendOutcome::NotOwned { .. }, _) => continue,
                    (_, ExtendOutcome::NotOwned { index }) => ExtendOutcome::NotOwned {
                        index: members.get(index).copied().unwrap_or(0),
                    },
                    (ExtendOutcome::Failed(_), _) => continue,
                    (_, ExtendOutcome::Failed(failure)) => {
                        if failure.detail.contains("MOVED") || failure.detail.contains("ASK") {
                            // The slot moved: the next round reads the map again.
                            self.slot_map_is_stale();
                        }
                        ExtendOutcome::Failed(self.at_slot(*slot, failure))
                    }
                    (_, extended) => extended,
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
        mode: Mode,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            let groups = self.by_slot(names);
            self.release_groups(conn, names, &groups, token, mode, wake)
                .await
        })
    }

    fn keep<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        left: Duration,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(async move {
            let conn = self.conn().await?;
            let groups = self.by_slot(names);
            // Each slot's keys are kept (or found not ours) on their own: a group found not ours
            // makes the release `Lost`, whatever the others did.
            self.on_groups(names, &groups, |subset| async move {
                self.calls.keep(conn, &subset, token, left).await
            })
            .await
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

    fn watch(&self, name: &str, own: Option<u64>) -> Subscription {
        let [_, channel] = self.calls.keys(name);
        self.subs.watch(name, own_channel(channel, own))
    }
}

/// What one renewal pipeline goes to.
#[derive(PartialEq, Eq, Hash)]
enum Batch {
    Master(String, u16),
    /// The slot map is unknown: the cluster client routes by the slot.
    Slot(u16),
}

/// The master serving `slot` in `map`.
fn master_of(map: &SlotMap, slot: u16) -> Option<(&str, u16)> {
    map.iter()
        .find(|range| (range.first..=range.last).contains(&slot))
        .map(|range| (range.host.as_str(), range.port))
}

/// `CLUSTER SLOTS`: `[[first, last, [host, port, ..], replicas..], ..]`.
fn parse_slots(value: Value) -> Option<SlotMap> {
    let Value::Array(ranges) = value else {
        return None;
    };
    let mut map = SlotMap::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(parts) = range else {
            return None;
        };
        let first: u16 = redis::from_redis_value_ref(parts.first()?).ok()?;
        let last: u16 = redis::from_redis_value_ref(parts.get(1)?).ok()?;
        let Value::Array(master) = parts.get(2)? else {
            return None;
        };
        let host: String = redis::from_redis_value_ref(master.first()?).ok()?;
        let port: u16 = redis::from_redis_value_ref(master.get(1)?).ok()?;
        map.push(SlotRange {
            first,
            last,
            host,
            port,
        });
    }
    map.sort();
    Some(map)
}

/// A cluster connection that sends everything to one master, whatever the keys' slots: one
/// renewal pipeline for all the locks that master serves.
#[derive(Clone)]
struct ToMaster {
    conn: ClusterConnection,
    host: String,
    port: u16,
}

impl ToMaster {
    fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::ByAddress {
            host: self.host.clone(),
            port: self.port,
        }
    }
}

impl ConnectionLike for ToMaster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let route = RoutingInfo::SingleNode(self.route());
        Box::pin(self.conn.route_command(cmd.clone(), route))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let route = self.route();
        Box::pin(
            self.conn
                .route_pipeline(pipeline.clone(), offset, count, route),
        )
    }

    fn get_db(&self) -> i64 {
        0
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

/// What [`LockConfig::cluster`](crate::LockConfig::cluster) stores.
#[derive(Clone)]
pub(crate) struct ClusterConfig {
    pub(crate) seed_urls: Vec<String>,
}

impl BackendConfig for ClusterConfig {
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        let seeds =
            NodeAddr::parse_all("seed_urls", &self.seed_urls, "must name at least one node")?;
        Ok(Box::new(ValidCluster { seeds }))
    }

    fn fmt_redacted(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cluster([{}])", redact_all(&self.seed_urls))
    }
}

struct ValidCluster {
    seeds: Vec<NodeAddr>,
}

impl ValidBackend for ValidCluster {
    fn kind(&self) -> BackendKind {
        BackendKind::Cluster
    }

    fn uses_tls(&self) -> bool {
        self.seeds.iter().any(NodeAddr::uses_tls)
    }

    fn has_replicas(&self) -> bool {
        true
    }

    fn build(&self, settings: &Settings, wakers: Arc<WakeRegistry>) -> Result<Backend, LockError> {
        let node = ClusterNode::new(&self.seeds, settings, wakers)?;
        Ok(Backend::One(Arc::new(node)))
    }
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // CRC16/XMODEM("123456789") = 0x31C3; "foo" is 12182 in the Redis Cluster spec.
        assert_eq!(key_slot("123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        // Only the hash tag counts.
        assert_eq!(key_slot("{foo}:bar"), 12182);
        assert_eq!(key_slot("lock:{foo}=x"), key_slot("lock:{foo}:released=x"));
    }
}
