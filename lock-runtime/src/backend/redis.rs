//! One Redis master: its key layout, its scripts, and its release notifications.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{PushKind, RedisError, RedisResult};
use tokio::sync::{Notify, watch};

use super::scripts;
use super::{
    Attempt, BoxFuture, ExtendItem, ExtendOutcome, Node, NodeView, Subscription, Token, millis,
};
use crate::config::{NodeAddr, Settings};
use crate::error::{LockError, NodeFailure};
use crate::wait::WakeRegistry;

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
/// without a tag, and carries an `=` with one.
pub fn redis_keys(prefix: &str, name: &str) -> [String; 3] {
    let escaped = escape(name);
    let (tag, rest) = match hash_tag(name) {
        Some(tag) => (tag, ["=", &*escaped].concat()),
        None => (&*escaped, String::new()),
    };
    let base = [prefix, "{", tag, "}"].concat();
    [
        [base.as_str(), rest.as_str()].concat(),
        [base.as_str(), ":fence", rest.as_str()].concat(),
        [base.as_str(), ":released", rest.as_str()].concat(),
    ]
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
}

impl KeyKind {
    fn suffix(self) -> &'static str {
        match self {
            KeyKind::Lock => "",
            KeyKind::Fence => ":fence",
            KeyKind::Released => ":released",
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
    (redis_keys(prefix, &name)[kind as usize] == key).then_some(name)
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
fn hash_tag(key: &str) -> Option<&str> {
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
    addr: String,
    prefix: String,
    conn: ConnectionManager,
    /// Bound on one request, connection set-up included.
    deadline: Duration,
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
            .field("node", &self.addr)
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
        Ok(RedisNode {
            addr: addr.name.clone(),
            prefix: settings.key_prefix.clone(),
            conn,
            deadline: settings
                .connect_timeout
                .saturating_add(settings.response_timeout),
            subs: Arc::new(Subscriptions {
                table: Mutex::new(HashMap::new()),
                kick: Notify::new(),
                started: OnceLock::new(),
                client: notify_client,
                wakers,
                connect_timeout: settings.connect_timeout,
                response_timeout: settings.response_timeout,
            }),
        })
    }

    fn keys(&self, name: &str) -> [String; 3] {
        redis_keys(&self.prefix, name)
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

    async fn extend_chunk(&self, chunk: &[ExtendItem<'_>]) -> Vec<ExtendOutcome> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for item in chunk {
            let mut invocation = scripts::EXTEND.prepare_invoke();
            for name in item.names {
                let [lock, ..] = self.keys(name);
                invocation.key(lock);
            }
            invocation.arg(item.token.as_str()).arg(millis(item.ttl));
            pipe.invoke_script(&invocation);
        }
        let mut conn = self.conn.clone();
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
            replies = match self
                .bounded("script load", scripts::EXTEND.load_async(&mut conn))
                .await
            {
                Ok(_) => self.bounded("extend", pipe.query_async(&mut conn)).await,
                Err(failure) => Err(failure),
            };
        }
        match replies {
            Ok(items) if items.len() == chunk.len() => items
                .into_iter()
                .map(|reply| match reply {
                    Ok(1) => ExtendOutcome::Extended,
                    Ok(n) => ExtendOutcome::NotOwned {
                        index: usize::try_from(-n - 1).unwrap_or(0),
                    },
                    Err(err) => ExtendOutcome::Failed(NodeFailure::from_redis(&self.addr, &err)),
                })
                .collect(),
            Ok(_) => {
                let failure = NodeFailure::response(&self.addr, "extend: wrong number of replies");
                chunk
                    .iter()
                    .map(|_| ExtendOutcome::Failed(failure.clone()))
                    .collect()
            }
            Err(failure) => chunk
                .iter()
                .map(|_| ExtendOutcome::Failed(failure.clone()))
                .collect(),
        }
    }
}

impl Node for RedisNode {
    fn addr(&self) -> &str {
        &self.addr
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeView>, NodeFailure>> {
        Box::pin(async move {
            let [lock, fence, _] = self.keys(name);
            let mut pipe = redis::pipe();
            pipe.cmd("PTTL").arg(lock).cmd("GET").arg(fence);
            let mut conn = self.conn.clone();
            let (pttl, fence): (i64, Option<String>) =
                self.bounded("inspect", pipe.query_async(&mut conn)).await?;
            // -2: no such key.
            Ok((pttl != -2).then(|| NodeView {
                remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                fence: fence.and_then(|f| f.parse().ok()),
            }))
        })
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        Box::pin(async move {
            let [lock, _, channel] = self.keys(name);
            let mut invocation = scripts::FORCE_RELEASE.prepare_invoke();
            invocation.key(lock).arg(channel);
            let mut conn = self.conn.clone();
            let deleted: i64 = self
                .bounded("force release", invocation.invoke_async(&mut conn))
                .await?;
            Ok(deleted == 1)
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
            let mut invocation = scripts::ACQUIRE.prepare_invoke();
            let mut fences = Vec::with_capacity(names.len());
            for name in names {
                let [lock, fence, _] = self.keys(name);
                invocation.key(lock);
                fences.push(fence);
            }
            for fence in fences {
                invocation.key(fence);
            }
            invocation
                .arg(token.as_str())
                .arg(millis(ttl))
                .arg(if fencing { "1" } else { "0" });
            let mut conn = self.conn.clone();
            let reply: Vec<i64> = self
                .bounded("acquire", invocation.invoke_async(&mut conn))
                .await?;
            match reply.as_slice() {
                [1, fences @ ..] if fences.len() == names.len() => Ok(Attempt::Acquired {
                    fences: if fencing {
                        fences
                            .iter()
                            .map(|f| u64::try_from(*f).unwrap_or(0))
                            .collect()
                    } else {
                        Vec::new()
                    },
                }),
                [0, index, pttl] => Ok(Attempt::Held {
                    index: usize::try_from(*index - 1).unwrap_or(0),
                    // -1: the key has no expiry (set by someone else without one); wait by backoff.
                    pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                }),
                _ => Err(NodeFailure::response(
                    &self.addr,
                    "acquire: unexpected reply",
                )),
            }
        })
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(items.len());
            for chunk in items.chunks(EXTEND_CHUNK) {
                out.extend(self.extend_chunk(chunk).await);
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
            let mut invocation = scripts::RELEASE.prepare_invoke();
            invocation.arg(token.as_str());
            for name in names {
                let [lock, _, channel] = self.keys(name);
                invocation
                    .key(lock)
                    .arg(if wake { channel } else { String::new() });
            }
            let mut conn = self.conn.clone();
            let deleted: i64 = self
                .bounded("release", invocation.invoke_async(&mut conn))
                .await?;
            Ok(usize::try_from(deleted) == Ok(names.len()))
        })
    }

    fn raise_fences<'a>(
        &'a self,
        names: &'a [Arc<str>],
        fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        Box::pin(async move {
            let mut invocation = scripts::RAISE_FENCE.prepare_invoke();
            for (name, fence) in names.iter().zip(fences) {
                let [_, fence_key, _] = self.keys(name);
                invocation.key(fence_key).arg(*fence);
            }
            let mut conn = self.conn.clone();
            self.bounded("raise fence", invocation.invoke_async::<i64>(&mut conn))
                .await
                .map(drop)
        })
    }

    fn watch(&self, name: &str) -> Subscription {
        let [_, _, channel] = self.keys(name);
        let confirmed = {
            let mut table = self.subs.table();
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
        self.subs.start();
        self.subs.kick.notify_one();
        let mut confirmed = confirmed;
        Subscription {
            confirmed: Box::pin(async move {
                match confirmed.wait_for(Option::is_some).await {
                    Ok(value) => value.unwrap_or(false),
                    Err(_) => false,
                }
            }),
            keep: Some(Box::new(Unwatch {
                subs: Arc::clone(&self.subs),
                channel,
            })),
        }
    }
}

/// The release channels this node's waiters listen on, and the task that keeps the notification
/// connection subscribed to exactly those.
///
/// One task per node applies changes in order (so an unsubscribe never overtakes a later
/// subscribe of the same channel) and in batches: a frozen or dead node costs one request timeout
/// per round, whatever the number of waiters, and no waiter ever waits for it (waiters only
/// learn, through `confirmed`, when their releases can no longer be missed).
struct Subscriptions {
    table: Mutex<HashMap<String, Entry>>,
    kick: Notify,
    started: OnceLock<()>,
    client: redis::Client,
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
                PushKind::Message => {
                    if let Some(redis::Value::BulkString(channel)) = push.data.first() {
                        let name = std::str::from_utf8(channel)
                            .ok()
                            .and_then(|c| subs.table().get(c).map(|e| Arc::clone(&e.name)));
                        if let Some(name) = name {
                            wakers.notify(&name);
                        }
                    }
                }
                // Releases may have been missed while disconnected: every waiter retries now.
                PushKind::Disconnection => wakers.notify_all(),
                _ => {}
            }
            Ok::<(), redis::aio::SendError>(())
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(self.connect_timeout)
            .set_push_sender(on_push)
            .set_automatic_resubscription();
        let conn = ConnectionManager::new_lazy_with_config(self.client.clone(), config);
        let mut conn = match conn {
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
