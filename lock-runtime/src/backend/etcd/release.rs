//! Release: deleting a holder's keys or entry and revoking its lease, and the release of a lock
//! whose `min_hold` has not passed.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::kinds::Tag;
use super::node::{Grant, Inner, Seen, gets, kvs, lease_secs, seen_kv};
use crate::backend::{BoxFuture, Mode, Token};
use crate::error::NodeFailure;

impl Inner {
    /// Deletes the keys if each still holds our token (one transaction), or our entry, then revokes
    /// the lease (which also deletes whatever of ours a partial loss left, and a writer's marks:
    /// then before the release answers). A waiter that gives up releases too: its place in line or
    /// its marks go at once (`Attempt::Held` carries a ticket for those, which makes the caller
    /// release).
    pub(super) async fn release(
        self: &Arc<Self>,
        names: &[Arc<str>],
        token: &Token,
    ) -> Result<bool, NodeFailure> {
        let grant = self.grants().remove(token);
        let keys: Vec<Vec<u8>> = names.iter().map(|n| self.key(n)).collect();
        let txn = Txn::new()
            .when(ours(&keys, token, grant))
            .and_then(
                keys.iter()
                    .map(|k| TxnOp::delete(k.clone(), None))
                    .collect::<Vec<_>>(),
            )
            .or_else(gets(&keys));
        let resp = self.release_txn(txn, token, grant).await?;
        self.after_release(&resp, token, grant).await
    }

    /// What a release transaction of `token` came to: when it succeeded, `grant`'s lease goes
    /// (the keys are deleted or live under another lease now); when not all keys were ours,
    /// revoking our leases deletes whatever of ours is left.
    async fn after_release(
        self: &Arc<Self>,
        resp: &TxnResponse,
        token: &Token,
        grant: Option<Grant>,
    ) -> Result<bool, NodeFailure> {
        if resp.succeeded() {
            match grant {
                // Readers wait for the marks to go: before the release answers.
                Some(grant) if grant.marked => self.revoke(grant.lease).await?,
                Some(grant) => self.revoke_later(grant.lease),
                None => {}
            }
            return Ok(true);
        }
        let mut leases: Vec<i64> = grant.map(|g| g.lease).into_iter().collect();
        for s in Self::seen(resp, token) {
            if let Seen::Ours { lease, .. } = s
                && !leases.contains(&lease)
            {
                leases.push(lease);
            }
        }
        for lease in leases {
            self.revoke(lease).await?;
        }
        Ok(false)
    }

    /// Leaves the keys of `token`'s exclusive lock to live `left` more, for its `min_hold`. etcd
    /// cannot shorten a lease, and keeping the lock's own alive would keep the keys for up to
    /// its ttl: each key moves to a new lease of `left` (rounded up to whole seconds) in one
    /// transaction that compares the token (and the create revision, which a put keeps: the
    /// fencing token stays), then the old lease is revoked. The keys then go when the new lease
    /// expires: less than a second past `min_hold` (etcd's minimum lease TTL when `left` is
    /// shorter), plus the time etcd takes to expire a lease. A put wakes no waiter (they watch
    /// for deletions).
    pub(super) async fn keep(
        self: &Arc<Self>,
        names: &[Arc<str>],
        token: &Token,
        left: Duration,
    ) -> Result<bool, NodeFailure> {
        let secs = lease_secs(left);
        let op = move |mut client: Client| -> BoxFuture<'static, _> {
            Box::pin(async move { client.lease_grant(secs, None).await })
        };
        let lease = self.call("lease grant", &op).await?.id();
        let grant = self.grants().remove(token);
        let keys: Vec<Vec<u8>> = names.iter().map(|n| self.key(n)).collect();
        let options = PutOptions::new().with_lease(lease);
        let puts: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::put(k.clone(), token.as_str(), Some(options.clone())))
            .collect();
        let txn = Txn::new()
            .when(ours(&keys, token, grant))
            .and_then(puts)
            .or_else(gets(&keys));
        let resp = match self.release_txn(txn, token, grant).await {
            Ok(resp) => resp,
            Err(failure) => {
                self.revoke_later(lease);
                return Err(failure);
            }
        };
        if !resp.succeeded() {
            self.revoke_later(lease);
        }
        self.after_release(&resp, token, grant).await
    }

    /// Sends a release transaction of `token`, whose `grant` the caller took out of the table:
    /// on failure it goes back, since a retry (the engine's cleanup) still needs the lease.
    async fn release_txn(
        &self,
        txn: Txn,
        token: &Token,
        grant: Option<Grant>,
    ) -> Result<TxnResponse, NodeFailure> {
        let sent = self.txn("release", txn).await;
        if sent.is_err()
            && let Some(grant) = grant
        {
            self.grants().insert(token.clone(), grant);
        }
        sent
    }

    /// Deletes `token`'s entry of a fair, shared or permit lock (held, or waiting in line), then
    /// revokes its lease. `Ok(true)` when the entry held the lock it was granted.
    pub(super) async fn release_kind(
        self: &Arc<Self>,
        name: &str,
        token: &Token,
        mode: Mode,
    ) -> Result<bool, NodeFailure> {
        let Some(tag) = Tag::of(mode) else {
            return self.release(&[Arc::from(name)], token).await;
        };
        let grant = self.grants().remove(token);
        let own = self.keys(name).entry(tag, token);
        let options = etcd_client::DeleteOptions::new().with_prev_key();
        let txn = Txn::new().and_then([TxnOp::delete(own, Some(options))]);
        let resp = self.release_txn(txn, token, grant).await?;
        let deleted = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Delete(deleted) => deleted.prev_kvs().first().cloned(),
            _ => None,
        });
        if let Some(grant) = grant {
            self.revoke_later(grant.lease);
        }
        Ok(
            deleted
                .is_some_and(|kv| grant.is_none_or(|g| g.revision == Some(kv.create_revision()))),
        )
    }

    /// What each key holds, from the `get`s of a transaction, in key order.
    fn seen(resp: &TxnResponse, token: &Token) -> Vec<Seen> {
        kvs(resp)
            .iter()
            .map(|kv| kv.as_ref().map_or(Seen::Absent, |kv| seen_kv(kv, token)))
            .collect()
    }
}

/// The compares that hold while every key of `keys` is `token`'s, and the incarnation `grant`
/// was granted when known.
fn ours(keys: &[Vec<u8>], token: &Token, grant: Option<Grant>) -> Vec<Compare> {
    let mut compares: Vec<Compare> = keys
        .iter()
        .map(|k| Compare::value(k.clone(), CompareOp::Equal, token.as_str()))
        .collect();
    if let Some(revision) = grant.and_then(|g| g.revision) {
        compares.extend(
            keys.iter()
                .map(|k| Compare::create_revision(k.clone(), CompareOp::Equal, revision)),
        );
    }
    compares
}
