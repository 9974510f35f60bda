//! The etcd cluster behind one client as one [`Node`]: its state, renewal, inspection and
//! forced release, and the transaction helpers the other steps share (see `mod.rs`).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use futures_util::future::join_all;
use tokio::sync::OnceCell;

use super::EtcdAddrs;
use super::kinds::{self, Keys, Tag};
use super::members::Member;
use super::watch::Watched;
use crate::backend::{
    Ask, Attempt, BoxFuture, ExtendItem, ExtendOutcome, Mode, Node, NodeHold, Subscription, Token,
};
use crate::config::Settings;
use crate::error::NodeFailure;
use crate::wait::WakeRegistry;

/// Whole seconds of lease for `ttl`: etcd counts leases in seconds, so a lease is never shorter
/// than the lock's ttl.
pub(super) fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The etcd cluster behind one client.
pub(crate) struct EtcdNode {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) members: Vec<Member>,
    pub(super) user: Option<(String, String)>,
    /// Every member, for errors and inspection.
    pub(super) addr: String,
    pub(super) prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    /// What `https://` endpoints are trusted with and presented.
    #[cfg(feature = "tls")]
    pub(super) tls: crate::config::Tls,
    /// The member the next request goes to first: the last that answered.
    pub(super) preferred: AtomicUsize,
    /// Each live acquisition's lease, by token.
    pub(super) grants: Mutex<HashMap<Token, Grant>>,
    /// The names this client watches.
    pub(super) watched: Mutex<HashMap<String, Watched>>,
    pub(super) wakers: Arc<WakeRegistry>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    pub(super) lease: i64,
    /// The keys' (or the entry's) create revision once granted: the release deletes only that
    /// incarnation.
    pub(super) revision: Option<i64>,
    /// A waiting writer's marks are on some keys (under the lease): the release revokes the
    /// lease at once.
    pub(super) marked: bool,
}

impl fmt::Debug for EtcdNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdNode")
            .field("members", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

/// What a key of the lock holds, as read back in a transaction.
pub(super) enum Seen {
    Absent,
    Ours { revision: i64, lease: i64 },
    Theirs,
}

impl EtcdNode {
    pub(crate) fn new(addrs: &EtcdAddrs, settings: &Settings, wakers: Arc<WakeRegistry>) -> Self {
        let members: Vec<Member> = addrs
            .members
            .iter()
            .map(|m| Member {
                name: m.name.clone(),
                url: m.url.clone(),
                client: OnceCell::new(),
            })
            .collect();
        let addr = members
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        EtcdNode {
            inner: Arc::new(Inner {
                members,
                user: addrs.user.clone(),
                addr: format!("etcd[{addr}]"),
                prefix: settings.key_prefix.clone(),
                connect_timeout: settings.connect_timeout,
                response_timeout: settings.response_timeout,
                #[cfg(feature = "tls")]
                tls: settings.tls.clone(),
                preferred: AtomicUsize::new(0),
                grants: Mutex::new(HashMap::new()),
                watched: Mutex::new(HashMap::new()),
                wakers,
            }),
        }
    }
}

impl Inner {
    pub(super) fn keys(&self, name: &str) -> Keys {
        Keys::new(&self.prefix, name)
    }

    pub(super) fn key(&self, name: &str) -> Vec<u8> {
        self.keys(name).lock().to_vec()
    }

    pub(super) fn grants(&self) -> std::sync::MutexGuard<'_, HashMap<Token, Grant>> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key that says `item` still holds key `k` of its lock: the lock key, or the entry of
    /// a fair, shared or permit lock.
    fn held_key(&self, item: &ExtendItem<'_>, k: usize) -> Vec<u8> {
        let keys = self.keys(&item.names[k]);
        match Tag::of(item.mode) {
            Some(tag) => keys.entry(tag, item.token),
            None => keys.lock().to_vec(),
        }
    }

    /// Renews `items`: one keepalive per lease, all at once, then one read of every key whose
    /// lease lives, in transactions of at most [`MAX_TXN_OPS`] reads (a key deleted by hand or
    /// by a forced release is a loss even while its lease lives).
    ///
    /// A lease keepalive, then a read of the keys (or of the entry) that prove the hold (deleted by
    /// hand, or by `force_release`: not ours any more).
    async fn extend_many(&self, items: &[ExtendItem<'_>]) -> Vec<ExtendOutcome> {
        let grants: Vec<Option<Grant>> = {
            let grants = self.grants();
            items.iter().map(|i| grants.get(i.token).copied()).collect()
        };
        let alive = join_all(grants.iter().map(|grant| async move {
            match grant {
                Some(grant) => self.keep_alive(grant.lease).await,
                None => Ok(false),
            }
        }))
        .await;
        let mut outcomes: Vec<Option<ExtendOutcome>> = alive
            .into_iter()
            .map(|alive| match alive {
                Ok(true) => None,
                Ok(false) => Some(ExtendOutcome::NotOwned { index: 0 }),
                Err(failure) => Some(ExtendOutcome::Failed(failure)),
            })
            .collect();
        // (item, key index) of every key to read.
        let pending: Vec<(usize, usize)> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, outcome)| outcome.is_none())
            .flat_map(|(i, _)| (0..items[i].names.len()).map(move |k| (i, k)))
            .collect();
        let reads = join_all(pending.chunks(MAX_TXN_OPS).map(|chunk| {
            let keys: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&(i, k)| self.held_key(&items[i], k))
                .collect();
            self.txn("renewal check", Txn::new().and_then(gets(&keys)))
        }))
        .await;
        for (chunk, read) in pending.chunks(MAX_TXN_OPS).zip(reads) {
            let read = read.and_then(|resp| {
                let found = kvs(&resp);
                if found.len() == chunk.len() {
                    Ok(found)
                } else {
                    Err(NodeFailure::response(
                        &self.addr,
                        "renewal check: etcd answered with fewer reads than asked",
                    ))
                }
            });
            let found = match read {
                Ok(found) => found,
                Err(failure) => {
                    fail_all(&mut outcomes, chunk, &failure);
                    continue;
                }
            };
            for (&(i, k), kv) in chunk.iter().zip(found) {
                let ours = grants[i].is_some_and(|grant| {
                    kv.as_ref().is_some_and(|kv| match held_kv(kv, &items[i]) {
                        Seen::Ours { revision, lease } => {
                            lease == grant.lease && grant.revision.is_none_or(|r| r == revision)
                        }
                        _ => false,
                    })
                });
                // "Not ours" is definite: it wins over a failed read of another chunk.
                if !ours && !matches!(outcomes[i], Some(ExtendOutcome::NotOwned { .. })) {
                    outcomes[i] = Some(ExtendOutcome::NotOwned { index: k });
                }
            }
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(ExtendOutcome::Extended))
            .collect()
    }

    /// What etcd holds of the lock `keys`: its key and entries, read at once.
    ///
    /// Inspect and `force_release` read `K` and the entries; a forced release deletes what holds
    /// the lock (`K`, every reader, the first N entries, the first in line) and leaves the waiters
    /// in place.
    async fn read_lock(&self, what: &str, keys: &Keys) -> Result<Option<kinds::Seen>, NodeFailure> {
        let (start, end) = keys.entries();
        let txn = Txn::new().and_then([
            TxnOp::get(keys.lock(), None),
            TxnOp::get(start, Some(GetOptions::new().with_range(end))),
        ]);
        let resp = self.txn(what, txn).await?;
        match ranges(&resp).as_slice() {
            [lock, entries] => Ok(kinds::seen(keys, lock.first(), entries)),
            _ => Err(NodeFailure::response(
                &self.addr,
                &format!("{what}: etcd answered with other reads than asked"),
            )),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<NodeHold>, NodeFailure> {
        let Some(seen) = self.read_lock("inspect", &self.keys(name)).await? else {
            return Ok(None);
        };
        let mut leases = seen.leases.clone();
        leases.sort_unstable();
        leases.dedup();
        // The longest of the holders' leases (`None`: a holder without one), as Redis reports
        // the key's time to live; a few leases are enough for an estimate.
        let remaining = if leases.contains(&0) {
            None
        } else {
            let ttls = join_all(leases.into_iter().take(16).map(|lease| {
                let op = move |mut client: Client| -> BoxFuture<'static, _> {
                    Box::pin(async move { client.lease_time_to_live(lease, None).await })
                };
                async move { self.call("inspect", &op).await }
            }))
            .await;
            let mut longest = Duration::ZERO;
            for ttl in ttls {
                let secs = u64::try_from(ttl?.ttl()).unwrap_or(0);
                longest = longest.max(Duration::from_secs(secs));
            }
            Some(longest)
        };
        Ok(Some(NodeHold {
            remaining,
            fencing_token: u64::try_from(seen.fence).ok(),
            holders: seen.holders,
            queued: seen.queued,
            owners: seen.owners,
        }))
    }

    /// Deletes what holds the lock `name`: its key (and the rest of that holder's lock, by
    /// revoking its lease), or the entries that hold it (every reader, the first N of a
    /// semaphore, the first of a fair queue). Waiters keep their places.
    async fn force_release(&self, name: &str) -> Result<bool, NodeFailure> {
        let keys = self.keys(name);
        let Some(seen) = self.read_lock("force release", &keys).await? else {
            return Ok(false);
        };
        let options = etcd_client::DeleteOptions::new().with_prev_key();
        let deletes: Vec<TxnOp> = seen
            .keys
            .iter()
            .map(|k| TxnOp::delete(k.clone(), Some(options.clone())))
            .collect();
        let mut deleted = Vec::new();
        for chunk in deletes.chunks(MAX_TXN_OPS) {
            let resp = self
                .txn("force release", Txn::new().and_then(chunk.to_vec()))
                .await?;
            for op in resp.op_responses() {
                if let TxnOpResponse::Delete(d) = op {
                    deleted.extend(d.prev_kvs().iter().cloned());
                }
            }
        }
        if let Some(lock) = deleted.iter().find(|kv| kv.key() == keys.lock())
            && lock.lease() != 0
        {
            // The holder's other keys (of a multi-key lock) go with its lease.
            self.revoke(lock.lease()).await?;
        }
        Ok(!deleted.is_empty())
    }
}

/// etcd's default limit on the operations of one transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// What each `get` of a transaction found (its first key), in order.
pub(super) fn kvs(resp: &TxnResponse) -> Vec<Option<KeyValue>> {
    ranges(resp)
        .into_iter()
        .map(|r| r.into_iter().next())
        .collect()
}

/// Every key each `get` (or range) of a transaction found, in order.
pub(super) fn ranges(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().to_vec()),
            _ => None,
        })
        .collect()
}

/// Marks the items of `chunk` that are not settled yet as failed.
fn fail_all(
    outcomes: &mut [Option<ExtendOutcome>],
    chunk: &[(usize, usize)],
    failure: &NodeFailure,
) {
    for &(i, _) in chunk {
        if outcomes[i].is_none() {
            outcomes[i] = Some(ExtendOutcome::Failed(failure.clone()));
        }
    }
}

/// One read of each key, in order.
pub(super) fn gets(keys: &[Vec<u8>]) -> Vec<TxnOp> {
    keys.iter().map(|k| TxnOp::get(k.clone(), None)).collect()
}

pub(super) fn seen_kv(kv: &KeyValue, token: &Token) -> Seen {
    if kv.value() == token.as_str().as_bytes() {
        Seen::Ours {
            revision: kv.create_revision(),
            lease: kv.lease(),
        }
    } else {
        Seen::Theirs
    }
}

/// What the key read for `item` by [`Inner::held_key`] says: an entry's key names its token.
fn held_kv(kv: &KeyValue, item: &ExtendItem<'_>) -> Seen {
    match item.mode {
        Mode::Exclusive => seen_kv(kv, item.token),
        _ => Seen::Ours {
            revision: kv.create_revision(),
            lease: kv.lease(),
        },
    }
}

impl Node for EtcdNode {
    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ask: Ask,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        Box::pin(self.inner.acquire(names, token, ask))
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        Box::pin(self.inner.extend_many(items))
    }

    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        mode: Mode,
        _wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        // etcd's watches wake the waiters of every client.
        match mode {
            Mode::Exclusive => Box::pin(self.inner.release(names, token)),
            _ => Box::pin(self.inner.release_kind(&names[0], token, mode)),
        }
    }

    fn keep<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        left: Duration,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(self.inner.keep(names, token, left))
    }

    fn raise_fences<'a>(
        &'a self,
        _names: &'a [Arc<str>],
        _fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        // Revisions are the cluster's own: nothing to write back.
        Box::pin(async { Ok(()) })
    }

    /// etcd tells a waiter by a watch on the lock's keys, whatever its place.
    fn watch(&self, name: &str, _own: Option<u64>) -> Subscription {
        self.inner.subscribe(name)
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeHold>, NodeFailure>> {
        Box::pin(self.inner.inspect(name))
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(self.inner.force_release(name))
    }

    fn addr(&self) -> &str {
        &self.inner.addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn leases_round_up_to_whole_seconds() {
        assert_eq!(lease_secs(Duration::from_millis(1)), 1);
        assert_eq!(lease_secs(Duration::from_millis(500)), 1);
        assert_eq!(lease_secs(Duration::from_secs(2)), 2);
        assert_eq!(lease_secs(Duration::from_millis(2001)), 3);
    }
}
