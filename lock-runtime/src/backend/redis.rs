//! One Redis master: its key layout, its scripts, and its release notifications.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::Hasher as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, PushKind, RedisError, RedisResult, Script, ScriptInvocation, Value};
use tokio::sync::{Notify, watch};

use super::scripts;
use super::{
    Ask, Attempt, BoxFuture, ExtendItem, ExtendOutcome, Mode, Node, NodeView, Subscription, Token,
    millis,
};
use crate::atomic_instant::AtomicInstant;
use crate::config::{NodeAddr, Settings};
use crate::error::{LockError, NodeFailure};
use crate::wait::{HandOff, WakeRegistry};

/// How many extensions go into one pipeline (one round trip).
const EXTEND_CHUNK: usize = 512;

/// The Redis lock key, fence counter key and release channel of the lock `name` under `prefix`,
/// in that order.
///
/// The layout is injective: no two names (and no name and kind) share a key, whatever braces the
/// names contain. All three carry one Redis Cluster hash tag, so they live in one slot:
/// - a name without a hash tag is escaped (`%` -> `%25`, `{` -> `%7B`, `}` -> `%7D`) and wrapped
///   in braces: `lock:{wallet:42}`, `lock:{wallet:42}:fence`, `lock:{wallet:42}:released`;
/// - a name with a hash tag `{t}` keeps `t` as the tag, so names that share a tag share a slot,
///   followed by `=` and the escaped name: `lock:{t}=a:%7Bt%7D`, `lock:{t}:fence=a:%7Bt%7D`, ...
///
/// The part after the first `}` tells the two apart: it is exactly `""`, `:fence` or `:released`
/// (or, for fair locks, `:queue` and `:queue-leases`) without a tag, and carries an `=` with one.
pub fn redis_keys(prefix: &str, name: &str) -> [String; 3] {
    let keys = LockKeys::new(prefix, name);
    [KeyKind::Lock, KeyKind::Fence, KeyKind::Released].map(|kind| keys.of(kind))
}

/// The Redis key (or channel) of `kind` of the lock `name` under `prefix` (see [`redis_keys`]).
pub fn redis_key(prefix: &str, name: &str, kind: KeyKind) -> String {
    LockKeys::new(prefix, name).of(kind)
}

/// What every key of one lock shares, so that the name is escaped once for all of them:
/// `prefix{tag}` before the kind's suffix, and `=escaped-name` after it (nothing when the name
/// is its own tag).
pub(crate) struct LockKeys {
    head: String,
    tail: String,
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> LockKeys {
        let escaped = escape(name);
        match hash_tag(name) {
            Some(tag) => LockKeys {
                head: [prefix, "{", tag, "}"].concat(),
                tail: ["=", &escaped].concat(),
            },
            None => LockKeys {
                head: [prefix, "{", &escaped, "}"].concat(),
                tail: String::new(),
            },
        }
    }

    /// The key (or channel) of `kind`.
    pub(crate) fn of(&self, kind: KeyKind) -> String {
        [&*self.head, kind.suffix(), &*self.tail].concat()
    }
}

/// Which of a lock's Redis keys [`lock_name_of`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// The lock key itself.
    Lock,
    /// The fence counter.
    Fence,
    /// The release channel.
    Released,
    /// A fair lock's waiters, scored by ticket (arrival).
    Queue,
    /// A fair lock's waiters, scored by the expiry of their entry's lease.
    QueueLeases,
}

impl KeyKind {
    fn suffix(self) -> &'static str {
        match self {
            KeyKind::Lock => "",
            KeyKind::Fence => ":fence",
            KeyKind::Released => ":released",
            KeyKind::Queue => ":queue",
            KeyKind::QueueLeases => ":queue-leases",
        }
    }
}

/// The lock name whose Redis key (or channel) of `kind` under `prefix` is `key`: the inverse of
/// [`redis_keys`]. `None` for anything else.
pub fn lock_name_of(prefix: &str, key: &str, kind: KeyKind) -> Option<String> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let close = rest.find('}')?;
    let (inner, after) = (&rest[..close], &rest[close + 1..]);
    let after = after.strip_prefix(kind.suffix())?;
    let name = if after.is_empty() {
        unescape(inner)?
    } else {
        unescape(after.strip_prefix('=')?)?
    };
    (redis_key(prefix, &name, kind) == key).then_some(name)
}

fn unescape(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let (code, tail) = (rest.get(i + 1..i + 3)?, &rest[i + 3..]);
        out.push(match code {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = tail;
    }
    out.push_str(rest);
    Some(out)
}

/// The part of `key` Redis Cluster hashes when it has a hash tag: the text between the first `{`
/// and the next `}`, when not empty.
pub(super) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

fn escape(name: &str) -> Cow<'_, str> {
    if !name.contains(['%', '{', '}']) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// One Redis node: a multiplexed, reconnecting connection shared by every lock, and a lazily
/// started second connection (RESP3, resubscribing after reconnects) for release notifications.
pub(crate) struct RedisNode {
    calls: Calls,
    conn: ConnectionManager,
    subs: Arc<Subscriptions>,
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        // Lets the notification task notice that the node is gone.
        self.subs.kick.notify_one();
    }
}

impl std::fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNode")
            .field("node", &self.calls.addr)
            .finish()
    }
}

impl RedisNode {
    /// Must run inside the library's runtime: the connection manager spawns its tasks there.
    pub(crate) fn new(
        addr: &NodeAddr,
        field: &'static str,
        settings: &Settings,
        wakers: Arc<WakeRegistry>,
    ) -> Result<Self, LockError> {
        let invalid =
            |e: RedisError| LockError::config(field, format!("{}: {}", addr.name, e.category()));
        let client = redis::Client::open(addr.info.clone()).map_err(invalid)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(settings.connect_timeout);
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(invalid)?;
        let resp3 = addr.info.clone().set_redis_settings(
            addr.info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3),
        );
        let notify_client = redis::Client::open(resp3).map_err(invalid)?;
        let (connect_timeout, response_timeout) =
            (settings.connect_timeout, settings.response_timeout);
        let open: OpenPubSub = Box::new(move |on_push| {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout))
                .set_number_of_retries(1)
                .set_max_delay(connect_timeout)
                .set_push_sender(move |push| on_push(push))
                .set_automatic_resubscription();
            let conn = ConnectionManager::new_lazy_with_config(notify_client.clone(), config);
            Box::pin(async move { conn.map(|c| Box::new(c) as Box<dyn PubSub>) })
        });
        Ok(RedisNode {
            calls: Calls::new(addr.name.clone(), settings, "PUBLISH", true),
            conn,
            subs: Subscriptions::new(open, wakers, settings),
        })
    }
}

/// The `WAIT` after every grant and renewal (`min_replicas`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MinReplicas {
    pub(crate) count: u32,
    pub(crate) timeout: Duration,
}

/// A lossy map from lock names to until when their fence counter on this node is known to be
/// within [`scripts::FENCE_LAG_US`] of the server's clock, so that a plain lock of one of them
/// can take its fence with the transaction's `INCR` ([`Calls::acquire_plain`]). A name it lacks
/// (or whose time ran out) takes the script; a name it holds by a hash collision, or one whose
/// counter fell behind meanwhile (a failover), takes the transaction, which notices the lagging
/// counter and raises it in a second round trip. Either way the answer is right: this only picks
/// the cheaper path.
struct Fresh(Box<[FreshSlot]>);

#[derive(Default)]
struct FreshSlot {
    /// The name's hash (never 0, which marks an empty slot).
    hash: AtomicU64,
    until: AtomicInstant,
}

impl Fresh {
    const SLOTS: u64 = 1024;

    fn new() -> Self {
        Fresh((0..Self::SLOTS).map(|_| FreshSlot::default()).collect())
    }

    fn slot(&self, name: &str) -> (u64, &FreshSlot) {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(name, &mut hasher);
        let hash = hasher.finish() | 1;
        let index = usize::try_from(hash % Self::SLOTS).unwrap_or(0);
        (hash, &self.0[index])
    }

    /// Whether the counter of `name` is still known to be close enough to the clock at `now`.
    fn contains(&self, name: &str, now: Instant) -> bool {
        let (hash, slot) = self.slot(name);
        slot.hash.load(Ordering::Relaxed) == hash && now < slot.until.load()
    }

    /// The counter of `name` stays close enough to the clock for `margin` from `now`.
    fn insert(&self, name: &str, now: Instant, margin: Duration) {
        let (hash, slot) = self.slot(name);
        slot.hash.store(hash, Ordering::Relaxed);
        // A margin past any instant (a counter far ahead of the clock) counts as none.
        slot.until.store(now.checked_add(margin).unwrap_or(now));
    }
}

/// The script calls on one Redis master, over any connection that reaches it: a connection
/// manager, or a cluster connection (which sends each call to the master of its keys' slot; the
/// keys of one call then share a slot).
pub(crate) struct Calls {
    /// Named in failures.
    pub(crate) addr: String,
    prefix: String,
    /// Bound on one request, connection set-up included.
    deadline: Duration,
    /// How a release announces itself: `PUBLISH`, or `SPUBLISH` on a cluster.
    publish: &'static str,
    /// Replicas that must acknowledge each grant and renewal.
    replicas: Option<MinReplicas>,
    /// Whether a plain lock of one key may be taken with a transaction
    /// ([`Calls::acquire_plain`]): not through a cluster connection (which routes command by
    /// command), not with `min_replicas` (the grant goes through the script and its `WAIT`),
    /// and no more once the server refused a transaction (an ACL without `MULTI`/`EXEC`).
    plain: AtomicBool,
    /// Where the transaction can take the fence: see [`Fresh`].
    fresh: Fresh,
}

impl Calls {
    /// `transactions`: whether the connection sends a MULTI/EXEC to one server as it is.
    pub(crate) fn new(
        addr: String,
        settings: &Settings,
        publish: &'static str,
        transactions: bool,
    ) -> Self {
        Calls {
            plain: AtomicBool::new(transactions && settings.min_replicas.is_none()),
            fresh: Fresh::new(),
            addr,
            prefix: settings.key_prefix.clone(),
            deadline: settings.request_timeout(),
            publish,
            replicas: settings.min_replicas.map(|count| MinReplicas {
                count,
                // Within the request's own bound.
                timeout: settings.response_timeout / 2,
            }),
        }
    }

    pub(crate) fn keys(&self, name: &str) -> [String; 3] {
        redis_keys(&self.prefix, name)
    }

    fn lock_keys(&self, name: &str) -> LockKeys {
        LockKeys::new(&self.prefix, name)
    }

    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, NodeFailure> {
        match tokio::time::timeout(self.deadline, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(NodeFailure::from_redis(&self.addr, &err)),
            Err(_) => Err(NodeFailure::timeout(&self.addr, what)),
        }
    }

    /// Runs `invocation` and, with `min_replicas`, `WAIT` behind it in one pipeline on the same
    /// connection: the replica count then covers this script's writes. Reloads the script once
    /// if the server lost it.
    async fn invoke<C: Conn, T: FromRedisValue>(
        &self,
        conn: &C,
        what: &str,
        script: &Script,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<(T, Option<u32>), NodeFailure> {
        let mut conn = conn.clone();
        let Some(replicas) = self.replicas else {
            let value = self
                .bounded(what, invocation.invoke_async(&mut conn))
                .await?;
            return Ok((value, None));
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation)
            .cmd("WAIT")
            .arg(replicas.count)
            .arg(millis(replicas.timeout));
        let mut reply = self
            .bounded(what, pipe.query_async::<(T, u32)>(&mut conn))
            .await;
        // The server lost its script cache (restart, SCRIPT FLUSH): load once and resend.
        let lost_script = |f: &NodeFailure| {
            f.kind == crate::error::FailureKind::Response
                && (f.detail.contains("NOSCRIPT") || f.detail.contains("NoScript"))
        };
        if reply.as_ref().is_err_and(lost_script) {
            self.bounded("script load", script.load_async(&mut conn))
                .await?;
            reply = self.bounded(what, pipe.query_async(&mut conn)).await;
        }
        reply.map(|(value, acks)| (value, Some(acks)))
    }

    /// A failure saying that fewer than `min_replicas` replicas acknowledged `what`.
    fn too_few_replicas(&self, what: &str, acks: u32) -> NodeFailure {
        let (count, timeout) = self
            .replicas
            .map_or((0, Duration::ZERO), |r| (r.count, r.timeout));
        NodeFailure::replication(
            &self.addr,
            &format!(
                "{what}: {acks} of min_replicas {count} replicas acknowledged it within {timeout:?}"
            ),
        )
    }

    pub(crate) async fn extend_chunk<C: Conn>(
        &self,
        conn: &C,
        chunk: &[ExtendItem<'_>],
    ) -> Vec<ExtendOutcome> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for item in chunk {
            let mut invocation = match item.mode {
                Mode::Exclusive | Mode::Fair => scripts::EXTEND.prepare_invoke(),
                Mode::Shared | Mode::Permits(_) => scripts::SHARED_EXTEND.prepare_invoke(),
            };
            for name in item.names {
                invocation.key(self.lock_keys(name).of(KeyKind::Lock));
            }
            invocation.arg(item.token.as_str()).arg(millis(item.ttl));
            pipe.invoke_script(&invocation);
        }
        if let Some(replicas) = self.replicas {
            pipe.cmd("WAIT")
                .arg(replicas.count)
                .arg(millis(replicas.timeout));
        }
        let mut conn = conn.clone();
        let mut replies = self
            .bounded(
                "extend",
                pipe.query_async::<Vec<RedisResult<i64>>>(&mut conn),
            )
            .await;
        let lost_scripts = |r: &Result<Vec<RedisResult<i64>>, NodeFailure>| {
            r.as_ref().is_ok_and(|items| {
                items.iter().any(|i| {
                    i.as_ref().is_err_and(|e| {
                        e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                    })
                })
            })
        };
        if lost_scripts(&replies) {
            // The server lost its script cache (restart, SCRIPT FLUSH): load once and resend.
            let load = async {
                scripts::EXTEND.load_async(&mut conn).await?;
                scripts::SHARED_EXTEND.load_async(&mut conn).await
            };
            replies = match self.bounded("script load", load).await {
                Ok(_) => self.bounded("extend", pipe.query_async(&mut conn)).await,
                Err(failure) => Err(failure),
            };
        }
        // With `min_replicas`, the last reply is WAIT's count: too few acknowledgements turn
        // every extension of the chunk into a failed (retried) one.
        let short = match (&mut replies, self.replicas) {
            (Ok(items), Some(replicas)) if items.len() == chunk.len() + 1 => match items.pop() {
                Some(Ok(acks)) if acks >= i64::from(replicas.count) => None,
                Some(Ok(acks)) => {
                    Some(self.too_few_replicas("renewal", u32::try_from(acks).unwrap_or(0)))
                }
                Some(Err(err)) => Some(NodeFailure::from_redis(&self.addr, &err)),
                None => None,
            },
            _ => None,
        };
        match replies {
            Ok(items) if items.len() == chunk.len() => items
                .into_iter()
                .map(|reply| match reply {
                    Ok(1) => match &short {
                        Some(failure) => ExtendOutcome::Failed(failure.clone()),
                        None => ExtendOutcome::Extended,
                    },
                    Ok(n) => ExtendOutcome::NotOwned {
                        index: usize::try_from(-n - 1).unwrap_or(0),
                    },
                    Err(err) => ExtendOutcome::Failed(NodeFailure::from_redis(&self.addr, &err)),
                })
                .collect(),
            Ok(_) => {
                let failure = NodeFailure::response(&self.addr, "extend: wrong number of replies");
                ExtendOutcome::all_failed(chunk.len(), &failure)
            }
            Err(failure) => ExtendOutcome::all_failed(chunk.len(), &failure),
        }
    }

    pub(crate) async fn extend_many<C: Conn>(
        &self,
        conn: &C,
        items: &[ExtendItem<'_>],
    ) -> Vec<ExtendOutcome> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(EXTEND_CHUNK) {
            out.extend(self.extend_chunk(conn, chunk).await);
        }
        out
    }

    pub(crate) async fn inspect<C: Conn>(
        &self,
        conn: &C,
        name: &str,
    ) -> Result<Option<NodeView>, NodeFailure> {
        let keys = self.lock_keys(name);
        let mut invocation = scripts::INSPECT.prepare_invoke();
        invocation
            .key(keys.of(KeyKind::Lock))
            .key(keys.of(KeyKind::Fence))
            .key(keys.of(KeyKind::QueueLeases));
        let mut conn = conn.clone();
        let reply: Vec<i64> = self
            .bounded("inspect", invocation.invoke_async(&mut conn))
            .await?;
        let count = |n: i64| usize::try_from(n).unwrap_or(0);
        match reply.as_slice() {
            // -2: no such key.
            [-2] => Ok(None),
            [pttl, fence, holders, queued] => Ok(Some(NodeView {
                remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
                fence: u64::try_from(*fence).ok(),
                holders: count(*holders),
                queued: count(*queued),
            })),
            _ => Err(NodeFailure::response(
                &self.addr,
                "inspect: unexpected reply",
            )),
        }
    }

    pub(crate) async fn force_release<C: Conn>(
        &self,
        conn: &C,
        name: &str,
    ) -> Result<bool, NodeFailure> {
        let [lock, _, channel] = self.keys(name);
        let mut invocation = scripts::FORCE_RELEASE.prepare_invoke();
        invocation.key(lock).arg(self.publish).arg(channel);
        let mut conn = conn.clone();
        let deleted: i64 = self
            .bounded("force release", invocation.invoke_async(&mut conn))
            .await?;
        Ok(deleted == 1)
    }

    pub(crate) async fn acquire<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        token: &Token,
        ask: Ask,
    ) -> Result<Attempt, NodeFailure> {
        let Ask {
            ttl,
            fencing,
            mode,
            queue,
            waits,
        } = ask;
        if let [name] = names
            && mode == Mode::Exclusive
            && self.plain.load(Ordering::Relaxed)
            && (!fencing || self.fresh.contains(name, Instant::now()))
            && let Some(answer) = self.acquire_plain(conn, name, token, ttl, fencing).await
        {
            return answer;
        }
        let flag = |on: bool| if on { "1" } else { "0" };
        let script = match mode {
            Mode::Exclusive => &scripts::ACQUIRE,
            Mode::Fair => &scripts::FAIR_ACQUIRE,
            Mode::Shared | Mode::Permits(_) => &scripts::SHARED_ACQUIRE,
        };
        let mut invocation = script.prepare_invoke();
        match mode {
            Mode::Exclusive => {
                let keys: Vec<LockKeys> = names.iter().map(|n| self.lock_keys(n)).collect();
                for k in &keys {
                    invocation.key(k.of(KeyKind::Lock));
                }
                for k in &keys {
                    invocation.key(k.of(KeyKind::Fence));
                }
            }
            Mode::Fair | Mode::Shared | Mode::Permits(_) => {
                let keys = self.lock_keys(&names[0]);
                invocation
                    .key(keys.of(KeyKind::Lock))
                    .key(keys.of(KeyKind::Fence));
                if mode == Mode::Fair {
                    invocation
                        .key(keys.of(KeyKind::Queue))
                        .key(keys.of(KeyKind::QueueLeases));
                }
            }
        }
        invocation
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(flag(fencing));
        match mode {
            // How long a writer's mark keeps readers out (0: it does not wait).
            Mode::Exclusive => invocation.arg(if queue { millis(waits).max(1) } else { 0 }),
            Mode::Fair => invocation.arg(flag(queue)),
            Mode::Shared => invocation.arg(0),
            Mode::Permits(n) => invocation.arg(n),
        };
        let (reply, acks): (Vec<i64>, _) =
            self.invoke(conn, "acquire", script, &invocation).await?;
        match reply.as_slice() {
            [1, fences @ ..] if fences.len() == names.len() => {
                if let (Some(acks), Some(replicas)) = (acks, self.replicas) {
                    if acks < replicas.count {
                        // Not a grant until replicated: withdraw it (nobody waits for a lock
                        // that never was).
                        let short = self.too_few_replicas("grant", acks);
                        return match self.release(conn, names, token, mode, false).await {
                            Ok(_) => Err(short),
                            Err(failure) => Err(NodeFailure {
                                detail: format!("{}; withdrawing it failed too", short.detail),
                                ..failure
                            }),
                        };
                    }
                }
                if fencing && mode == Mode::Exclusive {
                    // The script raised each counter to the clock at least.
                    let now = Instant::now();
                    for name in names {
                        self.fresh.insert(name, now, FENCE_LAG);
                    }
                }
                Ok(Attempt::Acquired {
                    fences: if fencing {
                        fences
                            .iter()
                            .map(|f| u64::try_from(*f).unwrap_or(0))
                            .collect()
                    } else {
                        Vec::new()
                    },
                })
            }
            [0, index, pttl, rest @ ..] if rest.len() <= 1 => Ok(Attempt::Held {
                index: usize::try_from(*index - 1).unwrap_or(0),
                // -1: the key has no expiry (set by someone else without one); wait by backoff.
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                ticket: rest
                    .first()
                    .and_then(|t| u64::try_from(*t).ok())
                    .filter(|t| *t > 0),
            }),
            [2, index, other] => {
                let key = names
                    .get(usize::try_from(*index - 1).unwrap_or(0))
                    .unwrap_or(&names[0]);
                Ok(Attempt::mismatch(key, mode, *other))
            }
            _ => Err(NodeFailure::response(
                &self.addr,
                "acquire: unexpected reply",
            )),
        }
    }

    /// A plain lock of one key, asked for with `SET NX PX GET`, the fence's `INCR` and `PTTL` in
    /// one MULTI/EXEC instead of the `ACQUIRE` script: the same answer for about half of Redis's
    /// CPU. A refused transaction counts the fence on without a grant, which only leaves a gap.
    /// `None` when the script must answer: the key holds our token already (a resent attempt:
    /// the script refreshes it), is of another type (a shared lock or semaphore: the script
    /// marks a waiting writer or reports the mismatch), or the server refused the transaction.
    async fn acquire_plain<C: Conn>(
        &self,
        conn: &C,
        name: &str,
        token: &Token,
        ttl: Duration,
        fencing: bool,
    ) -> Option<Result<Attempt, NodeFailure>> {
        let keys = self.lock_keys(name);
        let lock = keys.of(KeyKind::Lock);
        let fence = fencing.then(|| keys.of(KeyKind::Fence));
        // MULTI and EXEC written out in a plain pipeline, not as redis-rs's atomic pipeline: that
        // one loses count of the replies when the server refuses the MULTI itself.
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .cmd("MULTI")
            .cmd("SET")
            .arg(&lock)
            .arg(token.as_str())
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .arg("GET");
        if let Some(fence) = &fence {
            pipe.cmd("INCR").arg(fence).cmd("TIME");
        }
        pipe.cmd("PTTL").arg(&lock).cmd("EXEC");
        let mut c = conn.clone();
        let replies: Vec<Value> = match self.bounded("acquire", pipe.query_async(&mut c)).await {
            Ok(replies) => replies,
            Err(failure) => return Some(Err(failure)),
        };
        let unexpected = || {
            Some(Err(NodeFailure::response(
                &self.addr,
                "acquire: unexpected reply",
            )))
        };
        let (Some(Value::Okay), Some(exec)) = (replies.first(), replies.last()) else {
            // The server refused the MULTI, and so ran the other commands on their own: the
            // script finds the lock ours if that `SET` took it. The refusal stays the same (an
            // ACL without MULTI and EXEC), so the script answers from now on.
            self.plain.store(false, Ordering::Relaxed);
            return None;
        };
        let results = match exec {
            Value::Array(results) => results,
            Value::ServerError(refused)
                if refused.details().is_some_and(|d| d.contains("NOPERM")) =>
            {
                // An ACL with MULTI but without EXEC (the server then discards the transaction
                // itself): the script from now on.
                self.plain.store(false, Ordering::Relaxed);
                return None;
            }
            // The server refused the transaction (out of memory, a read-only replica): the
            // script says why in its own words.
            _ => return None,
        };
        let (set, counted, pttl) = match (results.as_slice(), fencing) {
            ([set, counted, clock, pttl], true) => (set, Some((counted, clock)), pttl),
            ([set, pttl], false) => (set, None, pttl),
            _ => return unexpected(),
        };
        match set {
            Value::Nil => {}
            Value::BulkString(holder) if holder.as_slice() == token.as_str().as_bytes() => {
                return None;
            }
            Value::BulkString(_) => {
                let Value::Int(pttl) = pttl else {
                    return unexpected();
                };
                return Some(Ok(Attempt::Held {
                    index: 0,
                    pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                    ticket: None,
                }));
            }
            Value::ServerError(_) => return None,
            _ => return unexpected(),
        }
        // Granted.
        let fences = match (counted, fence) {
            (Some((Value::Int(f), clock)), Some(fence)) => {
                let margin = server_micros(clock).map(|clock| *f - (clock - scripts::FENCE_LAG_US));
                if let Some(margin) = margin.filter(|m| *m > 0) {
                    // Close enough to the clock: the token as counted.
                    let margin = Duration::from_micros(u64::try_from(margin).unwrap_or(0));
                    self.fresh.insert(name, Instant::now(), margin);
                    vec![u64::try_from(*f).unwrap_or(0)]
                } else {
                    // Lost, recreated, or behind after a failover: raised to the clock.
                    let mut invocation = scripts::SEED_FENCE.prepare_invoke();
                    invocation.key(fence);
                    match self
                        .bounded("acquire", invocation.invoke_async::<u64>(&mut c))
                        .await
                    {
                        Ok(f) => {
                            self.fresh.insert(name, Instant::now(), FENCE_LAG);
                            vec![f]
                        }
                        Err(failure) => {
                            return Some(Err(self.withdraw(conn, name, token, failure).await));
                        }
                    }
                }
            }
            (Some(_), Some(_)) => {
                // The script refuses before writing; here the `SET` ran.
                let failure =
                    NodeFailure::response(&self.addr, "acquire: the fence counter is not a number");
                return Some(Err(self.withdraw(conn, name, token, failure).await));
            }
            _ => Vec::new(),
        };
        Some(Ok(Attempt::Acquired { fences }))
    }

    /// Takes back a grant of `name` that has no fence (the counter is not a number, or seeding
    /// it failed): no fence, no lock. Returns `failure`, saying so if the withdrawal failed too
    /// (then the lock expires by its ttl, or the caller's release by token takes it back).
    async fn withdraw<C: Conn>(
        &self,
        conn: &C,
        name: &str,
        token: &Token,
        failure: NodeFailure,
    ) -> NodeFailure {
        let names = [Arc::<str>::from(name)];
        match self
            .release(conn, &names, token, Mode::Exclusive, false)
            .await
        {
            Ok(_) => failure,
            Err(also) => NodeFailure {
                detail: format!("{}; withdrawing the grant failed too", failure.detail),
                ..also
            },
        }
    }

    pub(crate) async fn release<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        token: &Token,
        mode: Mode,
        wake: bool,
    ) -> Result<bool, NodeFailure> {
        let channel = |keys: &LockKeys| {
            if wake {
                keys.of(KeyKind::Released)
            } else {
                String::new()
            }
        };
        let mut invocation;
        match mode {
            Mode::Exclusive => {
                invocation = scripts::RELEASE.prepare_invoke();
                invocation.arg(token.as_str()).arg(self.publish);
                for name in names {
                    let keys = self.lock_keys(name);
                    invocation.key(keys.of(KeyKind::Lock)).arg(channel(&keys));
                }
            }
            Mode::Fair => {
                // Always with its channel: leaving the queue may hand the lock to the next
                // waiter, who must be woken.
                let keys = self.lock_keys(&names[0]);
                invocation = scripts::FAIR_RELEASE.prepare_invoke();
                invocation
                    .key(keys.of(KeyKind::Lock))
                    .key(keys.of(KeyKind::Fence))
                    .key(keys.of(KeyKind::Queue))
                    .key(keys.of(KeyKind::QueueLeases))
                    .arg(token.as_str())
                    .arg(self.publish)
                    .arg(keys.of(KeyKind::Released));
            }
            Mode::Shared | Mode::Permits(_) => {
                let keys = self.lock_keys(&names[0]);
                invocation = scripts::SHARED_RELEASE.prepare_invoke();
                invocation
                    .key(keys.of(KeyKind::Lock))
                    .arg(token.as_str())
                    .arg(self.publish)
                    .arg(channel(&keys));
            }
        }
        let mut conn = conn.clone();
        let deleted: i64 = self
            .bounded("release", invocation.invoke_async(&mut conn))
            .await?;
        Ok(usize::try_from(deleted) == Ok(names.len()))
    }

    pub(crate) async fn raise_fences<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        fences: &[u64],
    ) -> Result<(), NodeFailure> {
        let mut invocation = scripts::RAISE_FENCE.prepare_invoke();
        for (name, fence) in names.iter().zip(fences) {
            let [_, fence_key, _] = self.keys(name);
            invocation.key(fence_key).arg(*fence);
        }
        let mut conn = conn.clone();
        self.bounded("raise fence", invocation.invoke_async::<i64>(&mut conn))
            .await
            .map(drop)
    }
}

/// How long a fence counter raised to the clock stays close enough to it for the transaction.
const FENCE_LAG: Duration = Duration::from_micros(scripts::FENCE_LAG_US.unsigned_abs());

/// The server clock in microseconds from a `TIME` reply (seconds and microseconds, as strings).
fn server_micros(reply: &Value) -> Option<i64> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let [secs, micros] = parts.as_slice() else {
        return None;
    };
    let number = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<i64>().ok(),
        Value::Int(n) => Some(*n),
        _ => None,
    };
    number(secs)?
        .checked_mul(1_000_000)?
        .checked_add(number(micros)?)
}

/// What a release message says: a fair lock's hand-off names the waiter it went to by ticket,
/// with the new fence and the digest of its token (see `scripts::FAIR_RELEASE`); anything else
/// ("", garbage) is for every waiter (ticket 0).
fn hand_off(payload: &[u8]) -> (u64, Option<HandOff>) {
    let text = std::str::from_utf8(payload).unwrap_or_default();
    let mut parts = text.split(' ');
    let Some(ticket) = parts.next().and_then(|t| t.parse::<u64>().ok()) else {
        return (0, None);
    };
    let fence = parts.next().and_then(|f| f.parse::<u64>().ok());
    let digest = parts.next().and_then(|d| u64::from_str_radix(d, 16).ok());
    match (fence, digest) {
        (Some(fence), Some(digest)) => (ticket, Some(HandOff { fence, digest })),
        _ => (ticket, None),
    }
}

/// A connection [`Calls`] can use.
pub(crate) trait Conn: ConnectionLike + Clone + Send + Sync + 'static {}

impl<T: ConnectionLike + Clone + Send + Sync + 'static> Conn for T {}

impl Node for RedisNode {
    fn addr(&self) -> &str {
        &self.calls.addr
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeView>, NodeFailure>> {
        Box::pin(self.calls.inspect(&self.conn, name))
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(self.calls.force_release(&self.conn, name))
    }

    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ask: Ask,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        Box::pin(self.calls.acquire(&self.conn, names, token, ask))
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        Box::pin(self.calls.extend_many(&self.conn, items))
    }

    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        mode: Mode,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(self.calls.release(&self.conn, names, token, mode, wake))
    }

    fn raise_fences<'a>(
        &'a self,
        names: &'a [Arc<str>],
        fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        Box::pin(self.calls.raise_fences(&self.conn, names, fences))
    }

    fn watch(&self, name: &str) -> Subscription {
        let [_, _, channel] = self.calls.keys(name);
        self.subs.watch(name, channel)
    }
}

/// A pub/sub connection: plain channels on one node, sharded channels on a cluster.
pub(crate) trait PubSub: Send + 'static {
    fn subscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>>;
    fn unsubscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>>;
}

impl PubSub for ConnectionManager {
    fn subscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>> {
        Box::pin(ConnectionManager::subscribe(self, channels))
    }

    fn unsubscribe<'a>(&'a mut self, channels: &'a [String]) -> BoxFuture<'a, RedisResult<()>> {
        Box::pin(ConnectionManager::unsubscribe(self, channels))
    }
}

/// Where pushes (messages, disconnections) of the notification connection go.
pub(crate) type PushFn =
    Arc<dyn Fn(redis::PushInfo) -> Result<(), redis::aio::SendError> + Send + Sync>;

/// Opens the notification connection (lazily connecting, resubscribing after reconnects).
pub(crate) type OpenPubSub =
    Box<dyn Fn(PushFn) -> BoxFuture<'static, RedisResult<Box<dyn PubSub>>> + Send + Sync>;

/// The release channels this node's waiters listen on, and the task that keeps the notification
/// connection subscribed to exactly those.
///
/// One task per node applies changes in order (so an unsubscribe never overtakes a later
/// subscribe of the same channel) and in batches: a frozen or dead node costs one request timeout
/// per round, whatever the number of waiters, and no waiter ever waits for it (waiters only
/// learn, through `confirmed`, when their releases can no longer be missed).
pub(crate) struct Subscriptions {
    table: Mutex<HashMap<String, Entry>>,
    kick: Notify,
    started: OnceLock<()>,
    open: OpenPubSub,
    wakers: Arc<WakeRegistry>,
    connect_timeout: Duration,
    response_timeout: Duration,
}

struct Entry {
    name: Arc<str>,
    waiters: usize,
    /// `Some(true)` once subscribed on the server, `Some(false)` when that failed.
    confirmed: watch::Sender<Option<bool>>,
}

impl Subscriptions {
    pub(crate) fn new(
        open: OpenPubSub,
        wakers: Arc<WakeRegistry>,
        settings: &Settings,
    ) -> Arc<Self> {
        Arc::new(Subscriptions {
            table: Mutex::new(HashMap::new()),
            kick: Notify::new(),
            started: OnceLock::new(),
            open,
            wakers,
            connect_timeout: settings.connect_timeout,
            response_timeout: settings.response_timeout,
        })
    }

    /// A waiter's interest in `channel`, the release channel of the lock `name`.
    pub(crate) fn watch(self: &Arc<Self>, name: &str, channel: String) -> Subscription {
        let confirmed = {
            let mut table = self.table();
            let entry = table.entry(channel.clone()).or_insert_with(|| Entry {
                name: name.into(),
                waiters: 0,
                confirmed: watch::channel(None).0,
            });
            entry.waiters += 1;
            if *entry.confirmed.borrow() == Some(false) {
                // The last try failed: this waiter waits for the next one.
                entry.confirmed.send_replace(None);
            }
            entry.confirmed.subscribe()
        };
        self.start();
        self.kick.notify_one();
        let mut confirmed = confirmed;
        Subscription {
            confirmed: Box::pin(async move {
                match confirmed.wait_for(Option::is_some).await {
                    Ok(value) => value.unwrap_or(false),
                    Err(_) => false,
                }
            }),
            keep: Some(Box::new(Unwatch {
                subs: Arc::clone(self),
                channel,
            })),
        }
    }

    /// Lets the notification task notice that its node is gone.
    pub(crate) fn node_dropped(&self) {
        self.kick.notify_one();
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn start(self: &Arc<Self>) {
        self.started.get_or_init(|| {
            tokio::spawn(Arc::clone(self).run());
        });
    }

    /// Keeps the server's subscriptions equal to the table's channels.
    async fn run(self: Arc<Self>) {
        let me = Arc::downgrade(&self);
        let wakers = Arc::clone(&self.wakers);
        let on_push = move |push: redis::PushInfo| {
            let Some(subs) = me.upgrade() else {
                return Ok(());
            };
            match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    if let Some(redis::Value::BulkString(channel)) = push.data.first() {
                        let name = std::str::from_utf8(channel)
                            .ok()
                            .and_then(|c| subs.table().get(c).map(|e| Arc::clone(&e.name)));
                        if let Some(name) = name {
                            let (ticket, hand_off) = match push.data.get(1) {
                                Some(redis::Value::BulkString(payload)) => hand_off(payload),
                                _ => (0, None),
                            };
                            wakers.notify_for(&name, ticket, hand_off);
                        }
                    }
                }
                // Releases may have been missed while disconnected: every waiter retries now.
                PushKind::Disconnection => wakers.notify_all(),
                _ => {}
            }
            Ok::<(), redis::aio::SendError>(())
        };
        let mut conn = match (self.open)(Arc::new(on_push)).await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(%err, "release notifications unavailable; waiters rely on backoff");
                return;
            }
        };
        let mut subscribed: HashSet<String> = HashSet::new();
        loop {
            self.kick.notified().await;
            if Arc::strong_count(&self) == 1 {
                return; // the node is gone
            }
            let (add, remove) = {
                let mut table = self.table();
                table.retain(|_, e| e.waiters > 0);
                let add: Vec<String> = table
                    .iter()
                    .filter(|(c, e)| {
                        !subscribed.contains(*c) || *e.confirmed.borrow() != Some(true)
                    })
                    .map(|(c, _)| c.clone())
                    .collect();
                let remove: Vec<String> = subscribed
                    .iter()
                    .filter(|c| !table.contains_key(*c))
                    .cloned()
                    .collect();
                (add, remove)
            };
            if !remove.is_empty() {
                let done =
                    tokio::time::timeout(self.response_timeout, conn.unsubscribe(&remove)).await;
                if matches!(done, Ok(Ok(()))) {
                    for c in &remove {
                        subscribed.remove(c);
                    }
                }
            }
            if add.is_empty() {
                continue;
            }
            let bound = self.connect_timeout.saturating_add(self.response_timeout);
            let ok = matches!(
                tokio::time::timeout(bound, conn.subscribe(&add)).await,
                Ok(Ok(()))
            );
            let table = self.table();
            for c in add {
                if ok {
                    subscribed.insert(c.clone());
                }
                if let Some(entry) = table.get(&c) {
                    entry.confirmed.send_replace(Some(ok));
                }
            }
        }
    }
}

/// Drops a waiter's interest in a channel.
struct Unwatch {
    subs: Arc<Subscriptions>,
    channel: String,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        let last = {
            let mut table = self.subs.table();
            match table.get_mut(&self.channel) {
                Some(entry) => {
                    entry.waiters -= 1;
                    entry.waiters == 0
                }
                None => false,
            }
        };
        if last {
            self.subs.kick.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let keys = |name: &str| redis_keys("lock:", name);
        assert_eq!(
            keys("wallet:42"),
            [
                "lock:{wallet:42}",
                "lock:{wallet:42}:fence",
                "lock:{wallet:42}:released"
            ]
        );
        assert_eq!(keys("a{t}b")[0], "lock:{t}=a%7Bt%7Db");
        assert_eq!(keys("a{t}b")[1], "lock:{t}:fence=a%7Bt%7Db");
        assert_eq!(keys("odd{}")[0], "lock:{odd%7B%7D}");
    }

    #[test]
    fn key_layout_is_injective() {
        let names = [
            "x",
            "{x}",
            "{x}:fence",
            "{x}:released",
            "x:fence",
            "x}",
            "{x",
            "%7Bx%7D",
            "x=",
            "{x}=",
            "{x}=%7Bx%7D",
            "a{x}",
            "{x}a",
            "",
            "{}",
            "{{x}",
            "%",
            "%25",
            "x:released",
            "{y}:fence",
            "y",
        ];
        let mut seen = std::collections::HashMap::new();
        for name in names {
            for (kind, key) in keys_of(name).into_iter().enumerate() {
                if let Some(other) = seen.insert(key.clone(), (name, kind)) {
                    panic!("{key} is both {other:?} and {:?}", (name, kind));
                }
            }
        }
    }

    fn keys_of(name: &str) -> [String; 3] {
        redis_keys("lock:", name)
    }

    #[test]
    fn names_read_back_from_their_keys() {
        for name in [
            "wallet:42",
            "a{t}b",
            "{x}",
            "a}b",
            "{{x}",
            "x{}",
            "%",
            "x=y",
            "{x}:fence",
        ] {
            let keys = redis_keys("lock:", name);
            for (kind, key) in [KeyKind::Lock, KeyKind::Fence, KeyKind::Released]
                .into_iter()
                .zip(&keys)
            {
                assert_eq!(
                    lock_name_of("lock:", key, kind).as_deref(),
                    Some(name),
                    "{key}"
                );
            }
            assert_eq!(
                lock_name_of("lock:", &keys[1], KeyKind::Lock),
                None,
                "{name}"
            );
            assert_eq!(
                lock_name_of("other:", &keys[0], KeyKind::Lock),
                None,
                "{name}"
            );
        }
        assert_eq!(lock_name_of("lock:", "lock:{a%zz}", KeyKind::Lock), None);
        assert_eq!(lock_name_of("lock:", "unrelated", KeyKind::Lock), None);
    }

    #[test]
    fn the_three_keys_share_a_slot() {
        for name in ["wallet:42", "a{t}b", "{x}", "a}b", "{{x}", "x{}"] {
            let keys = redis_keys("lock:", name);
            let tags: Vec<_> = keys.iter().map(|k| hash_tag(k)).collect();
            assert!(tags[0].is_some(), "{name}: {keys:?}");
            assert!(tags.iter().all(|t| *t == tags[0]), "{name}: {keys:?}");
        }
        assert_eq!(hash_tag(&redis_keys("lock:", "a{t}b")[0]), Some("t"));
    }
}
