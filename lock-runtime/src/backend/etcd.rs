//! etcd v3 (feature `etcd`): one [`Node`] for the whole cluster. etcd replicates every write
//! through raft, so the cluster is one linearizable node to us, not a quorum to count.
//!
//! Layout, per lock: its key `K = prefix + name` (each NUL byte of it followed by 0x7f, so that
//! nothing below is ever another lock's key, nor falls in a range compared), which holds the token
//! of an exclusive holder; and entries `K \0 tag \0 token` for the other kinds, each holding what
//! it is, so that callers that use the key another way find out (a `Mismatch`, worded as for
//! Redis):
//! - `q`, value `fair`: a fair lock's line. The entry with the lowest create revision holds the
//!   lock (while `K` is absent); the others wait in that order;
//! - `r`, value `shared-r`: a reader (shared holder);
//! - `w`, value `shared-w`: an exclusive caller (a writer) waiting for readers: no new reader gets
//!   in while one lives;
//! - `p`, value `permits=N`: a semaphore's line: the N entries with the lowest create revisions
//!   hold a permit each, the others wait in that order.
//!
//! Every key and entry of an acquisition lives under its lease, so a crashed caller's vanish within
//! its ttl. The fencing token is the create revision of `K` or of the holder's entry: it grows
//! across the cluster and across leader changes, and every grant has its own.
//!
//! Protocol:
//! - acquire: a lease of `ttl` rounded up to whole seconds (one per acquisition, kept alive by each
//!   retry of the same token: that renews a waiter's entries too), then one transaction. Exclusive,
//!   over every key: if no key exists from `K` up to its `r` entries (one range compare per key:
//!   `K` is absent and no `p`, `q` or `r` entry is under it), put `token` under the lease on each;
//!   else read the first key of each range (a `K` holding our token means an earlier attempt of
//!   ours landed: "ours"). A caller that waits and was refused by readers then puts its `w` entry
//!   there (one more request, on the waiting path only). A reader: when no `p` or `q` entry exists
//!   (else a mismatch), put its `r` entry if `K` is absent and no `w` entry exists; granted if its
//!   entry exists. Fair: when no `p` or `r` entry exists, put its `q` entry (a caller that does not
//!   wait only when nobody is in line and `K` is absent), then read `K` and the first in line.
//!   Permits: when `K` is absent and no `q` or `r` entry exists, put its `p` entry if every `p`
//!   entry there says the same N, then read the first N; a caller that does not wait withdraws an
//!   entry that got no permit (one more request);
//! - renewal: a lease keepalive, then a read of the keys (or of the entry) that prove the hold
//!   (deleted by hand, or by `force_release`: not ours any more);
//! - release: delete the keys if each still holds our token (one transaction), or our entry, then
//!   revoke the lease (which also deletes whatever of ours a partial loss left, and a writer's
//!   marks: then before the release answers). A waiter that gives up releases too: its place in
//!   line or its marks go at once (`Attempt::Held` carries a ticket for those, which makes the
//!   caller release);
//! - waiting: one watch per waiter over `K` and every entry under it, for deletions; the first of a
//!   client's watches of a name to see a deletion wakes that client's waiters. When only fair
//!   entries left, only the new first in line is woken (its ticket is its entry's create revision),
//!   with the waiters that have no ticket;
//! - inspect and `force_release` read `K` and the entries; a forced release deletes what holds the
//!   lock (`K`, every reader, the first N entries, the first in line) and leaves the waiters in
//!   place.
//!
//! The client talks to one member at a time (the last that answered) and moves on to the next when
//! one refuses, breaks, or has no leader (requests carry etcd's require-leader flag, so a member
//! cut off from its quorum says so at once instead of hanging); all of it within one connect plus
//! one response timeout per operation. A failure names every endpoint's cause.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use futures_util::future::join_all;
use tokio::sync::OnceCell;

mod kinds;

use self::kinds::{Keys, Part, Refusal, Tag};
use super::{
    Ask, Attempt, BoxFuture, ExtendItem, ExtendOutcome, Mode, Node, NodeView, Subscription, Token,
};
use crate::config::{Settings, redact_endpoint};
use crate::error::{FailureKind, LockError, NodeFailure};
use crate::wait::WakeRegistry;

/// The validated endpoints of an etcd cluster, and the user to authenticate as.
pub(crate) struct EtcdAddrs {
    members: Vec<MemberAddr>,
    user: Option<(String, String)>,
}

struct MemberAddr {
    /// `host:port`, for errors.
    name: String,
    /// `http(s)://host:port`, without credentials.
    url: String,
}

impl fmt::Debug for EtcdAddrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.members.iter().map(|m| m.name.as_str()).collect();
        f.debug_struct("EtcdAddrs")
            .field("members", &names)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish()
    }
}

impl EtcdAddrs {
    /// Parses `endpoints` (see [`LockConfig::etcd`](crate::LockConfig::etcd)), reporting errors
    /// on `field`.
    pub(crate) fn parse(field: &'static str, endpoints: &[String]) -> Result<Self, LockError> {
        if endpoints.is_empty() {
            return Err(LockError::config(field, "must name at least one endpoint"));
        }
        let mut members: Vec<MemberAddr> = Vec::with_capacity(endpoints.len());
        let mut user: Option<(String, String)> = None;
        for endpoint in endpoints {
            let shown = redact_endpoint(endpoint);
            let (scheme, rest) = endpoint.split_once("://").unwrap_or(("http", endpoint));
            match scheme {
                "http" => {}
                "https" if cfg!(feature = "tls") => {}
                "https" => {
                    return Err(LockError::config(
                        field,
                        format!(
                            "{shown} uses TLS, which this build does not include: enable the `tls` feature of lock-runtime"
                        ),
                    ));
                }
                _ => {
                    return Err(LockError::config(
                        field,
                        format!("{shown} is not an http:// or https:// endpoint"),
                    ));
                }
            }
            let authority = rest.trim_end_matches('/');
            let (userinfo, host) = match authority.rsplit_once('@') {
                Some((userinfo, host)) => (Some(userinfo), host),
                None => (None, authority),
            };
            let port_ok = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !port_ok || host.contains('/') {
                return Err(LockError::config(
                    field,
                    format!("{shown} is not host:port (with an optional http:// or https://)"),
                ));
            }
            if let Some(userinfo) = userinfo {
                let Some((name, password)) = userinfo.split_once(':') else {
                    return Err(LockError::config(
                        field,
                        format!("{shown} names a user without a password (user:password@)"),
                    ));
                };
                let this = (name.to_owned(), password.to_owned());
                match &user {
                    Some(other) if *other != this => {
                        return Err(LockError::config(
                            field,
                            "names different users on different endpoints (one client, one user)",
                        ));
                    }
                    _ => user = Some(this),
                }
            }
            if members.iter().any(|m| m.name == host) {
                return Err(LockError::config(
                    field,
                    format!("names endpoint {host} twice"),
                ));
            }
            members.push(MemberAddr {
                name: host.to_owned(),
                url: format!("{scheme}://{host}"),
            });
        }
        Ok(EtcdAddrs { members, user })
    }
}

/// Whole seconds of lease for `ttl`: etcd counts leases in seconds, so a lease is never shorter
/// than the lock's ttl.
pub(crate) fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The etcd cluster behind one client.
pub(crate) struct EtcdNode {
    inner: Arc<Inner>,
}

struct Inner {
    members: Vec<Member>,
    user: Option<(String, String)>,
    /// Every member, for errors and inspection.
    addr: String,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// The member the next request goes to first: the last that answered.
    preferred: AtomicUsize,
    /// Each live acquisition's lease, by token.
    grants: Mutex<HashMap<Token, Grant>>,
    /// The names this client watches.
    watched: Mutex<HashMap<String, Watched>>,
    wakers: Arc<WakeRegistry>,
}

/// A name this client watches: each of its waiters has a watch of its own, and the first watch
/// to see a deletion wakes them all.
struct Watched {
    refs: usize,
    /// The revision of the last deletions that woke the waiters.
    woken: i64,
}

struct Member {
    name: String,
    url: String,
    client: OnceCell<Client>,
}

#[derive(Debug, Clone, Copy)]
struct Grant {
    lease: i64,
    /// The keys' (or the entry's) create revision once granted: the release deletes only that
    /// incarnation.
    revision: Option<i64>,
    /// A waiting writer's marks are on some keys (under the lease): the release revokes the
    /// lease at once.
    marked: bool,
}

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

impl fmt::Debug for EtcdNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdNode")
            .field("members", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

/// What a key of the lock holds, as read back in a transaction.
enum Seen {
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
                preferred: AtomicUsize::new(0),
                grants: Mutex::new(HashMap::new()),
                watched: Mutex::new(HashMap::new()),
                wakers,
            }),
        }
    }
}

type Op<T> = dyn Fn(Client) -> BoxFuture<'static, Result<T, etcd_client::Error>> + Send + Sync;

impl Inner {
    fn keys(&self, name: &str) -> Keys {
        Keys::new(&self.prefix, name)
    }

    fn key(&self, name: &str) -> Vec<u8> {
        self.keys(name).lock().to_vec()
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, HashMap<Token, Grant>> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The client of member `i`, made on first use (no I/O but authentication).
    async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let member = &self.members[i];
        let client = member
            .client
            .get_or_try_init(|| async {
                let endpoint = tonic::transport::Endpoint::from_shared(member.url.clone())?
                    .connect_timeout(self.connect_timeout)
                    .timeout(self.response_timeout)
                    .tcp_nodelay(true);
                #[cfg(feature = "tls")]
                let endpoint = if member.url.starts_with("https://") {
                    endpoint.tls_config(
                        etcd_client::TlsOptions::new()
                            .with_webpki_roots()
                            .domain_name(member.name.rsplit_once(':').map_or("", |(h, _)| h)),
                    )?
                } else {
                    endpoint
                };
                let channel = etcd_client::Channel::Tonic(endpoint.connect_lazy());
                let mut options = ConnectOptions::new().with_require_leader(true);
                if let Some((user, password)) = &self.user {
                    options = options
                        .with_user(user.clone(), password.clone())
                        .with_auto_token_refresh(true);
                }
                Client::from_channel(channel, Some(options)).await
            })
            .await?;
        Ok(client.clone())
    }

    /// Runs `op` on the preferred member, moving on to the next ones while they fail in a way
    /// another member may not (refused, broken, no leader), all within one connect plus one
    /// response timeout.
    async fn call<T>(&self, what: &str, op: &Op<T>) -> Result<T, NodeFailure> {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let deadline = Instant::now() + self.connect_timeout + self.response_timeout;
        let mut causes: Vec<(usize, FailureKind, String)> = Vec::new();
        for step in 0..n {
            let i = (first + step) % n;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let attempt = async { op(self.client(i).await?).await };
            let (kind, detail) = match tokio::time::timeout(left, attempt).await {
                Ok(Ok(value)) => {
                    if step > 0 {
                        self.preferred.store(i, Ordering::Relaxed);
                    }
                    return Ok(value);
                }
                Ok(Err(err)) => classify(&err),
                Err(_) => (FailureKind::Timeout, format!("no answer to {what} in time")),
            };
            causes.push((i, kind, detail));
            self.preferred.store((i + 1) % n, Ordering::Relaxed);
            if !kind.is_transient() {
                // Authentication and permissions are the cluster's, not one member's.
                break;
            }
        }
        Err(self.failure(what, causes))
    }

    /// One failure for the whole cluster, naming each endpoint's cause.
    fn failure(&self, what: &str, causes: Vec<(usize, FailureKind, String)>) -> NodeFailure {
        if causes.is_empty() {
            return NodeFailure::timeout(&self.addr, what);
        }
        let pick = |k: FailureKind| causes.iter().any(|(_, kind, _)| *kind == k);
        let kind = [
            FailureKind::Auth,
            FailureKind::Permission,
            FailureKind::Response,
            FailureKind::Timeout,
            FailureKind::Io,
            FailureKind::Busy,
        ]
        .into_iter()
        .find(|k| pick(*k))
        .unwrap_or(FailureKind::Refused);
        let detail = causes
            .iter()
            .map(|(i, kind, detail)| {
                let cause = NodeFailure {
                    node: self.members[*i].name.clone(),
                    kind: *kind,
                    detail: detail.clone(),
                };
                cause.to_string()
            })
            .collect::<Vec<_>>()
            .join("; ");
        NodeFailure {
            node: self.addr.clone(),
            kind,
            detail: format!("{what}: {detail}"),
        }
    }

    async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, NodeFailure> {
        let op = move |mut client: Client| -> BoxFuture<'static, _> {
            let txn = txn.clone();
            Box::pin(async move { client.txn(txn).await })
        };
        self.call(what, &op).await
    }

    /// Revokes `lease`; a lease that is gone already counts as revoked.
    async fn revoke(&self, lease: i64) -> Result<(), NodeFailure> {
        let op = move |mut client: Client| -> BoxFuture<'static, _> {
            Box::pin(async move {
                match client.lease_revoke(lease).await {
                    Ok(_) => Ok(()),
                    Err(err) if lease_not_found(&err) => Ok(()),
                    Err(err) => Err(err),
                }
            })
        };
        self.call("lease revoke", &op).await
    }

    /// Revokes `lease` in the background (housekeeping: an unrevoked lease expires by its TTL).
    fn revoke_later(self: &Arc<Self>, lease: i64) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = Arc::clone(self);
            runtime.spawn(async move {
                let _ = inner.revoke(lease).await;
            });
        }
    }

    /// What each key holds, from the `get`s of a transaction, in key order.
    fn seen(resp: &TxnResponse, token: &Token) -> Vec<Seen> {
        kvs(resp)
            .iter()
            .map(|kv| kv.as_ref().map_or(Seen::Absent, |kv| seen_kv(kv, token)))
            .collect()
    }

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

    async fn acquire(
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
    /// (`K` itself when it exists, else the entry that refuses us).
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

    /// One keepalive of `lease`: its TTL counts again from now. `Ok(false)` when it is gone.
    async fn keep_alive(&self, lease: i64) -> Result<bool, NodeFailure> {
        let op = move |client: Client| -> BoxFuture<'static, _> {
            Box::pin(async move {
                match client.lease_client().keep_alive(lease).await {
                    Ok(_) => Ok(true),
                    Err(err) if lease_not_found(&err) => Ok(false),
                    Err(err) => Err(err),
                }
            })
        };
        self.call("lease keepalive", &op).await
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

    async fn release(
        self: &Arc<Self>,
        names: &[Arc<str>],
        token: &Token,
    ) -> Result<bool, NodeFailure> {
        let grant = self.grants().remove(token);
        let keys: Vec<Vec<u8>> = names.iter().map(|n| self.key(n)).collect();
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
        let txn = Txn::new()
            .when(compares)
            .and_then(
                keys.iter()
                    .map(|k| TxnOp::delete(k.clone(), None))
                    .collect::<Vec<_>>(),
            )
            .or_else(gets(&keys));
        let resp = self.release_txn(txn, token, grant).await?;
        if resp.succeeded() {
            match grant {
                // Readers wait for the marks to go: before the release answers.
                Some(grant) if grant.marked => self.revoke(grant.lease).await?,
                Some(grant) => self.revoke_later(grant.lease),
                None => {}
            }
            return Ok(true);
        }
        // Not all ours: revoking our lease deletes whatever of ours is left.
        let mut leases: Vec<i64> = grant.map(|g| g.lease).into_iter().collect();
        for s in Self::seen(&resp, token) {
            if let Seen::Ours { lease, .. } = s {
                if !leases.contains(&lease) {
                    leases.push(lease);
                }
            }
        }
        for lease in leases {
            self.revoke(lease).await?;
        }
        Ok(false)
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
        if sent.is_err() {
            if let Some(grant) = grant {
                self.grants().insert(token.clone(), grant);
            }
        }
        sent
    }

    /// Deletes `token`'s entry of a fair, shared or permit lock (held, or waiting in line), then
    /// revokes its lease. `Ok(true)` when the entry held the lock it was granted.
    async fn release_kind(
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

    /// Wakes this client's waiters of `name` on each deletion of its key or of an entry under
    /// it, for as long as the task runs (the subscription aborts it). `confirmed` learns whether
    /// the first watch was set up; a broken watch wakes the waiters (a release may have been
    /// missed) and is set up again.
    async fn watch_loop(
        self: Arc<Self>,
        name: String,
        confirmed: tokio::sync::oneshot::Sender<bool>,
    ) {
        let keys = self.keys(&name);
        let (start, end) = keys.watch_range();
        let mut confirmed = Some(confirmed);
        let mut pause = Duration::from_millis(50);
        loop {
            let i = self.preferred.load(Ordering::Relaxed) % self.members.len();
            let options = WatchOptions::new()
                .with_range(end.clone())
                .with_filters([WatchFilterType::NoPut]);
            let open = async {
                let mut client = self.client(i).await?;
                client.watch(start.clone(), Some(options)).await
            };
            let bound = self.connect_timeout + self.response_timeout;
            if let Ok(Ok(mut stream)) = tokio::time::timeout(bound, open).await {
                while let Ok(Some(resp)) = stream.message().await {
                    if resp.created() {
                        pause = Duration::from_millis(50);
                        if let Some(tx) = confirmed.take() {
                            let _ = tx.send(true);
                        }
                    }
                    let deleted: Vec<&KeyValue> = resp
                        .events()
                        .iter()
                        .filter(|e| e.event_type() == EventType::Delete)
                        .filter_map(|e| e.kv())
                        .collect();
                    let revision = deleted.iter().map(|kv| kv.mod_revision()).max();
                    if revision.is_some_and(|r| self.first_to_wake(&name, r)) {
                        let parts: Vec<Part> =
                            deleted.iter().map(|kv| keys.part(kv.key())).collect();
                        self.wake(&name, &keys, &parts).await;
                    }
                    if resp.canceled() {
                        break;
                    }
                }
            }
            match confirmed.take() {
                Some(tx) => {
                    let _ = tx.send(false);
                }
                None => self.wakers.notify(&name),
            }
            self.preferred
                .store((i + 1) % self.members.len(), Ordering::Relaxed);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Whether the deletions at `revision` are news to this client: each of its watches of
    /// `name` sees them, and one wake-up is enough.
    fn first_to_wake(&self, name: &str, revision: i64) -> bool {
        match self.watched().get_mut(name) {
            Some(w) if w.woken >= revision => false,
            Some(w) => {
                w.woken = revision;
                true
            }
            None => true,
        }
    }

    /// Wakes the waiters of `name` after the deletion of `parts`. When only fair queue entries
    /// left, the lock can only have passed to the new first in line: only that waiter is woken
    /// (its ticket is its entry's create revision), along with waiters that have no ticket.
    async fn wake(&self, name: &str, keys: &Keys, parts: &[Part]) {
        if parts.is_empty() || parts.iter().any(|p| *p != Part::Entry(Tag::Queue)) {
            self.wakers.notify(name);
            return;
        }
        let head = kinds::oldest_in(keys.range(Tag::Queue, Tag::Queue), 1);
        let head = match self.txn("queue head", Txn::new().and_then([head])).await {
            Ok(resp) => kvs(&resp).into_iter().flatten().next(),
            Err(_) => None,
        };
        match head.and_then(|kv| u64::try_from(kv.create_revision()).ok()) {
            Some(ticket) => self.wakers.notify_for(name, ticket, None),
            None => self.wakers.notify(name),
        }
    }

    /// What etcd holds of the lock `keys`: its key and entries, read at once.
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

    async fn inspect(&self, name: &str) -> Result<Option<NodeView>, NodeFailure> {
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
        Ok(Some(NodeView {
            remaining,
            fence: u64::try_from(seen.fence).ok(),
            holders: seen.holders,
            queued: seen.queued,
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
        if let Some(lock) = deleted.iter().find(|kv| kv.key() == keys.lock()) {
            if lock.lease() != 0 {
                // The holder's other keys (of a multi-key lock) go with its lease.
                self.revoke(lock.lease()).await?;
            }
        }
        Ok(!deleted.is_empty())
    }
}

/// etcd's default limit on the operations of one transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// What each `get` of a transaction found (its first key), in order.
fn kvs(resp: &TxnResponse) -> Vec<Option<KeyValue>> {
    ranges(resp)
        .into_iter()
        .map(|r| r.into_iter().next())
        .collect()
}

/// Every key each `get` (or range) of a transaction found, in order.
fn ranges(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
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
fn gets(keys: &[Vec<u8>]) -> Vec<TxnOp> {
    keys.iter().map(|k| TxnOp::get(k.clone(), None)).collect()
}

fn seen_kv(kv: &KeyValue, token: &Token) -> Seen {
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

fn lease_not_found(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::LeaseKeepAliveError(msg) => msg.contains("not found"),
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::NotFound || status.message().contains("lease not found")
        }
        _ => false,
    }
}

/// The kind of an etcd client error, and what to say about it (never a password or token: etcd's
/// messages carry neither).
fn classify(err: &etcd_client::Error) -> (FailureKind, String) {
    use etcd_client::Error;
    use tonic::Code;
    let root = root_cause(err);
    let refused = root
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
    let kind = match err {
        _ if refused => FailureKind::Refused,
        Error::GRpcStatus(status) => {
            let msg = status.message();
            match status.code() {
                Code::Unavailable if msg.contains("refused") => FailureKind::Refused,
                Code::Unavailable
                    if msg.contains("no leader")
                        || msg.contains("leader changed")
                        || msg.contains("not capable") =>
                {
                    FailureKind::Busy
                }
                Code::Unavailable if msg.contains("timed out") => FailureKind::Timeout,
                Code::Unavailable | Code::Unknown if msg.contains("connect") => FailureKind::Io,
                Code::Unavailable => FailureKind::Io,
                Code::DeadlineExceeded | Code::Cancelled => FailureKind::Timeout,
                Code::Unauthenticated => FailureKind::Auth,
                Code::InvalidArgument if msg.contains("auth") => FailureKind::Auth,
                Code::PermissionDenied => FailureKind::Permission,
                Code::ResourceExhausted => FailureKind::Busy,
                _ => FailureKind::Response,
            }
        }
        Error::TransportError(_)
        | Error::IoError(_)
        | Error::LeaseKeepAliveError(_)
        | Error::WatchError(_) => FailureKind::Io,
        _ => FailureKind::Response,
    };
    let mut detail = match err {
        Error::GRpcStatus(status) => status.message().to_owned(),
        other => other.to_string(),
    };
    let why = root.to_string();
    if !detail.contains(&why) {
        detail = format!("{detail}: {why}");
    }
    (kind, detail)
}

/// The innermost source of `err` (for a refused connection: the OS error).
fn root_cause(err: &etcd_client::Error) -> &(dyn std::error::Error + 'static) {
    // etcd-client's own error has no `source`: start from what it wraps.
    let mut cause: &(dyn std::error::Error + 'static) = match err {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::TransportError(transport) => transport,
        etcd_client::Error::IoError(io) => io,
        other => other,
    };
    // Bounded: error chains are short, and a cycle would be a bug elsewhere.
    for _ in 0..16 {
        match cause.source() {
            Some(inner) => cause = inner,
            None => break,
        }
    }
    cause
}

/// Ends a watch when its subscription is dropped.
struct Unwatch {
    task: tokio::task::JoinHandle<()>,
    inner: Arc<Inner>,
    name: String,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        self.task.abort();
        let mut watched = self.inner.watched();
        if let Some(w) = watched.get_mut(&self.name) {
            w.refs -= 1;
            if w.refs == 0 {
                watched.remove(&self.name);
            }
        }
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

    fn raise_fences<'a>(
        &'a self,
        _names: &'a [Arc<str>],
        _fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        // Revisions are the cluster's own: nothing to write back.
        Box::pin(async { Ok(()) })
    }

    fn watch(&self, name: &str) -> Subscription {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Subscription {
                confirmed: Box::pin(async { false }),
                keep: None,
            };
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner
            .watched()
            .entry(name.to_owned())
            .or_insert(Watched { refs: 0, woken: 0 })
            .refs += 1;
        let task = runtime.spawn(Arc::clone(&self.inner).watch_loop(name.to_owned(), tx));
        Subscription {
            confirmed: Box::pin(async move { rx.await.unwrap_or(false) }),
            keep: Some(Box::new(Unwatch {
                task,
                inner: Arc::clone(&self.inner),
                name: name.to_owned(),
            })),
        }
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeView>, NodeFailure>> {
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

    fn parse(endpoints: &[&str]) -> Result<EtcdAddrs, LockError> {
        let endpoints: Vec<String> = endpoints.iter().map(|e| (*e).to_owned()).collect();
        EtcdAddrs::parse("endpoints", &endpoints)
    }

    #[test]
    fn leases_round_up_to_whole_seconds() {
        assert_eq!(lease_secs(Duration::from_millis(1)), 1);
        assert_eq!(lease_secs(Duration::from_millis(500)), 1);
        assert_eq!(lease_secs(Duration::from_secs(2)), 2);
        assert_eq!(lease_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn endpoints_parse_and_name_their_field() {
        let addrs = parse(&["127.0.0.1:2379", "http://u:hunter2@h2:2379/"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(addrs.members[0].url, "http://127.0.0.1:2379");
        assert_eq!(addrs.members[1].url, "http://h2:2379");
        assert_eq!(addrs.user, Some(("u".to_owned(), "hunter2".to_owned())));
        assert!(!format!("{addrs:?}").contains("hunter2"));
        for bad in [
            &[][..],
            &["redis://h:1"],
            &["h"],
            &["h:0"],
            &["h:1", "http://h:1"],
            &["http://u@h:1"],
            &["http://a:b@h:1", "http://c:d@h:2"],
        ] {
            match parse(bad) {
                Err(LockError::Config { field, reason }) => {
                    assert_eq!(field, "endpoints");
                    assert!(
                        !reason.contains("hunter2") && !reason.contains(":b@"),
                        "{reason}"
                    );
                }
                Err(other) => panic!("{bad:?}: {other:?}"),
                Ok(_) => panic!("{bad:?} was accepted"),
            }
        }
        let tls = parse(&["https://u:hunter2@h:2379"]);
        if cfg!(feature = "tls") {
            assert!(tls.is_ok());
        } else {
            let msg = tls.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                msg.contains("`tls` feature") && !msg.contains("hunter2"),
                "{msg}"
            );
        }
    }
}
