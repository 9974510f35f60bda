//! Acquisition: the lease of each acquisition, and the transactions that take an exclusive
//! lock or put a fair, shared or permit caller's entry.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, KeyValue, PutOptions, Txn, TxnOp};

use super::kinds::{self, Keys, Part, Refusal, Tag};
use super::node::{Grant, Inner, Seen, kvs, lease_secs, seen_kv};
use crate::backend::{Ask, Attempt, BoxFuture, Mode, Token};
use crate::error::NodeFailure;

/// What one acquire transaction came to, before the lease is kept or dropped.
enum Answer {
    /// Ours, with the create revision of the key (or of our entry): the fencing token.
    Granted(i64),
    /// Refused, with entries of ours left waiting under the lease (a place in line, a writer's
    /// marks).
    Waiting { attempt: Attempt, marked: bool },
    /// Refused, leaving nothing behind: the lease goes.
    Refused(Attempt),
}

impl Inner {
    /// The lease of `token`'s acquisition: a retry after an unknown outcome, or a waiter's next
    /// attempt, keeps the one it has alive (the lease must count its TTL from this attempt, as
    /// the grant's validity does, and it carries the waiter's entries); gone, a new one it is.
    async fn lease_for(self: &Arc<Self>, token: &Token, ttl: Duration) -> Result<i64, NodeFailure> {
        let secs = lease_secs(ttl);
        let known = self.grants().get(token).copied();
        if let Some(grant) = known {
            if self.keep_alive(grant.lease).await? {
                return Ok(grant.lease);
            }
            self.grants().remove(token);
        }
        let op = move |mut client: Client| -> BoxFuture<'static, _> {
            Box::pin(async move { client.lease_grant(secs, None).await })
        };
        let granted = self.call("lease grant", &op).await?;
        if granted.ttl() < secs {
            self.revoke_later(granted.id());
            return Err(NodeFailure::response(
                &self.addr,
                "etcd granted a lease shorter than the lock's ttl",
            ));
        }
        self.grants().insert(
            token.clone(),
            Grant {
                lease: granted.id(),
                revision: None,
                marked: false,
            },
        );
        Ok(granted.id())
    }

    /// A lease of `ttl` rounded up to whole seconds (one per acquisition, kept alive by each retry
    /// of the same token: that renews a waiter's entries too), then one transaction (an exclusive
    /// lock's, or a fair, shared or permit caller's).
    pub(super) async fn acquire(
        self: &Arc<Self>,
        names: &[Arc<str>],
        token: &Token,
        ask: Ask,
    ) -> Result<Attempt, NodeFailure> {
        let lease = self.lease_for(token, ask.ttl).await?;
        let answer = match ask.mode {
            Mode::Exclusive => self.acquire_exclusive(names, token, ask, lease).await,
            _ => self.acquire_kind(&names[0], token, ask, lease).await,
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(failure) => {
                if !failure.kind.may_have_applied() {
                    // Nothing landed: the lease is of no use to anyone.
                    self.forget(token);
                }
                return Err(failure);
            }
        };
        match answer {
            Answer::Granted(revision) => {
                if let Some(grant) = self.grants().get_mut(token) {
                    grant.revision = Some(revision);
                }
                let fence = u64::try_from(revision).unwrap_or(0);
                let fences = if ask.fencing {
                    vec![fence; names.len()]
                } else {
                    Vec::new()
                };
                Ok(Attempt::Acquired { fences })
            }
            Answer::Waiting { attempt, marked } => {
                // Our entries wait on the server under the lease: keep it (the next attempt
                // renews it, a release or its TTL ends it).
                if let Some(grant) = self.grants().get_mut(token) {
                    grant.marked |= marked;
                }
                Ok(attempt)
            }
            Answer::Refused(attempt) => {
                self.forget(token);
                Ok(attempt)
            }
        }
    }

    /// One transaction over every key: if no key exists from each `K` up to its `p`, `q` and
    /// `r` entries (one range compare: the key is absent and no reader, fair line or semaphore
    /// is on it), put `token` under the lease on each; else read the first key of each range
    /// (`K` itself when it exists, else the entry that refuses us). A `K` holding our token means
    /// an earlier attempt of ours landed: "ours".
    async fn acquire_exclusive(
        &self,
        names: &[Arc<str>],
        token: &Token,
        ask: Ask,
        lease: i64,
    ) -> Result<Answer, NodeFailure> {
        let keys: Vec<Keys> = names.iter().map(|n| self.keys(n)).collect();
        // One compare, one put and one read per key: as many keys as a transaction takes.
        let mut when = Vec::with_capacity(keys.len());
        let mut then = Vec::with_capacity(keys.len());
        let mut otherwise = Vec::with_capacity(keys.len());
        for k in &keys {
            when.push(kinds::none_in(k.claim_range()));
            let options = PutOptions::new().with_lease(lease);
            then.push(TxnOp::put(k.lock(), token.as_str(), Some(options)));
            otherwise.push(kinds::first_in(k.claim_range()));
        }
        let txn = Txn::new().when(when).and_then(then).or_else(otherwise);
        let resp = self.txn("acquire", txn).await?;
        if resp.succeeded() {
            return Ok(Answer::Granted(resp.header().map_or(0, |h| h.revision())));
        }
        let found: Vec<Option<KeyValue>> = kvs(&resp);
        if found.len() != keys.len() {
            return Err(NodeFailure::response(
                &self.addr,
                "acquire: etcd answered with other reads than asked",
            ));
        }
        let mut seen = Vec::with_capacity(keys.len());
        for (index, (k, first)) in keys.iter().zip(&found).enumerate() {
            let s = match first {
                Some(kv) if kv.key() == k.lock() => seen_kv(kv, token),
                _ => Seen::Absent,
            };
            let refusal = match s {
                Seen::Theirs => Some(Refusal::Held),
                Seen::Ours { .. } => None,
                Seen::Absent => kinds::exclusive_refusal(first.as_ref(), &names[index]),
            };
            match refusal {
                Some(Refusal::Held) => {
                    return self
                        .writer_waits(k, token, ask, lease, index, first.as_ref())
                        .await;
                }
                Some(Refusal::Mismatch(attempt)) => return Ok(Answer::Refused(attempt)),
                None => seen.push(s),
            }
        }
        match seen.iter().position(|s| matches!(s, Seen::Absent)) {
            // An earlier attempt of ours landed: every key holds our token.
            None => Ok(Answer::Granted(
                seen.iter()
                    .map(|s| match s {
                        Seen::Ours { revision, .. } => *revision,
                        _ => 0,
                    })
                    .max()
                    .unwrap_or(0),
            )),
            // Part of an earlier grant of ours is gone (deleted by hand): give the rest back and
            // try again at once with a fresh lease.
            Some(index) => Ok(Answer::Refused(Attempt::Held {
                index,
                pttl: Some(Duration::ZERO),
                ticket: None,
                announced: true,
            })),
        }
    }

    /// An exclusive caller refused at key `index` of its lock (`k`, whose first entry or holder is
    /// `first`). One that waits and was refused by readers marks itself as a waiting writer
    /// there (one more request, on the waiting path only): while the mark lives no new reader
    /// gets in. The marks stay under the lease until the release (which revokes it), so a writer
    /// that marked a key keeps its lease while it waits.
    async fn writer_waits(
        &self,
        k: &Keys,
        token: &Token,
        ask: Ask,
        lease: i64,
        index: usize,
        first: Option<&KeyValue>,
    ) -> Result<Answer, NodeFailure> {
        let readers = first.is_some_and(|kv| k.part(kv.key()) == Part::Entry(Tag::Reader));
        let mut marked = self.grants().get(token).is_some_and(|g| g.marked);
        let mut revision = 0;
        if ask.queue && readers {
            let resp = self
                .txn("writer mark", kinds::writer_mark(k, token, lease))
                .await?;
            marked |= resp.succeeded();
            revision = resp.header().map_or(0, |h| h.revision());
        }
        let attempt = Attempt::Held {
            index,
            pttl: None,
            // A release takes a waiting writer's marks away when it gives up.
            ticket: marked.then(|| u64::try_from(revision).unwrap_or(1).max(1)),
            announced: true,
        };
        Ok(if marked {
            Answer::Waiting {
                attempt,
                marked: true,
            }
        } else {
            Answer::Refused(attempt)
        })
    }

    /// A fair, shared or permit lock: one transaction (see `kinds::attempt`), and for a
    /// semaphore caller that does not wait and found no permit, one more to withdraw its entry.
    async fn acquire_kind(
        &self,
        name: &str,
        token: &Token,
        ask: Ask,
        lease: i64,
    ) -> Result<Answer, NodeFailure> {
        let keys = self.keys(name);
        let txn = kinds::attempt(&keys, token, ask.mode, ask.queue, lease);
        let resp = self.txn("acquire", txn).await?;
        let outcome = kinds::outcome(name, token, &keys, ask.mode, ask.queue, &resp)
            .map_err(|why| NodeFailure::response(&self.addr, &format!("acquire: {why}")))?;
        let held = |ticket: Option<i64>| Attempt::Held {
            index: 0,
            pttl: None,
            ticket: ticket.map(|t| u64::try_from(t).unwrap_or(1).max(1)),
            announced: true,
        };
        Ok(match outcome {
            kinds::Outcome::Granted(revision) => Answer::Granted(revision),
            kinds::Outcome::Refused {
                waiting: Some(revision),
            } => Answer::Waiting {
                attempt: held(Some(revision)),
                marked: false,
            },
            kinds::Outcome::Refused { waiting: None } => Answer::Refused(held(None)),
            kinds::Outcome::Withdraw => {
                let Some(tag) = Tag::of(ask.mode) else {
                    return Ok(Answer::Refused(held(None)));
                };
                let withdraw = Txn::new().and_then([TxnOp::delete(keys.entry(tag, token), None)]);
                self.txn("withdraw", withdraw).await?;
                Answer::Refused(held(None))
            }
            kinds::Outcome::Mismatch(attempt) => Answer::Refused(attempt),
        })
    }

    /// Drops `token`'s lease (revoked in the background, which deletes any key still on it).
    fn forget(self: &Arc<Self>, token: &Token) {
        let grant = self.grants().remove(token);
        if let Some(grant) = grant {
            self.revoke_later(grant.lease);
        }
    }
}
