//! The client: one backend (single node, Redlock or in-memory), the renewal driver, and the
//! acquire loop shared by every mode.

mod memory;
mod redlock;
mod single;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::config::{Settings, ValidBackend};
use crate::error::{FailureKind, LockError, NodeFailure};
use crate::global::InPlace;
use crate::guard::{Held, LockGuard};
use crate::renew::Renewer;
use crate::wait::{Backoff, WakeHandle, WakeRegistry};
use crate::{LockConfig, global};

pub(crate) use memory::MemoryStore;
pub(crate) use redlock::Redlock;
pub(crate) use single::RedisNode;

/// The Redis keys and channel of one lock (see [`redis_keys`]).
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// The key as the caller wrote it (in errors and `LockGuard::key`).
    pub(crate) name: String,
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: String) -> Self {
        let [lock, fence, channel] = redis_keys(prefix, &name);
        LockKeys {
            lock,
            fence,
            channel,
            name,
        }
    }
}

/// The Redis lock key, fence counter key and release channel of the lock `name`, in that order.
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

/// The part of `key` Redis Cluster hashes when it has a hash tag: the text between the first `{`
/// and the next `}`, when not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

fn escape(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(['%', '{', '}']) {
        return std::borrow::Cow::Borrowed(name);
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
    std::borrow::Cow::Owned(out)
}

/// The secret that proves ownership of one acquisition: 128 random bits from the OS, hex encoded.
/// Never printed: `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(Arc<str>);

impl Token {
    fn new() -> Result<Self, NodeFailure> {
        let bytes = random_16().map_err(|e| NodeFailure {
            node: "local".to_owned(),
            kind: FailureKind::Io,
            detail: format!("no randomness for a lock token: {e}"),
        })?;
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = String::with_capacity(32);
        for b in bytes {
            hex.push(char::from(HEX[usize::from(b >> 4)]));
            hex.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
        Ok(Token(hex.into()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// 16 bytes from the OS's secure random source, read 4 KiB at a time per thread so that a token
/// does not cost a system call. Each byte is used once.
fn random_16() -> Result<[u8; 16], getrandom::Error> {
    use std::cell::RefCell;
    const POOL: usize = 4096;
    thread_local! {
        static RANDOM: RefCell<(Box<[u8; POOL]>, usize)> = RefCell::new((Box::new([0; POOL]), POOL));
    }
    RANDOM.with_borrow_mut(|(pool, used)| {
        if *used + 16 > POOL {
            getrandom::fill(&mut pool[..])?;
            *used = 0;
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&pool[*used..*used + 16]);
        // Never hand out the same bytes twice.
        pool[*used..*used + 16].fill(0);
        *used += 16;
        Ok(out)
    })
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The answer to one acquire attempt.
#[derive(Debug)]
pub(crate) enum Attempt {
    Acquired {
        fence: Option<u64>,
    },
    /// Someone else holds it; `pttl` is its remaining time to live when known.
    Held {
        pttl: Option<Duration>,
    },
}

/// The answer to one extension.
#[derive(Debug, Clone)]
pub(crate) enum ExtendOutcome {
    Extended,
    /// The lock is no longer ours (expired, deleted, or taken by someone else).
    NotOwned,
    /// No answer that settles it; the renewal driver retries until the validity deadline.
    Failed(NodeFailure),
}

/// One backend per client. An enum rather than a trait object: three closed cases, and the
/// operations are async.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per client, behind an Arc; boxing would add an indirection on every call"
)]
pub(crate) enum Backend {
    Single(RedisNode),
    Redlock(Redlock),
    Memory(MemoryStore),
}

impl Backend {
    pub(crate) async fn acquire(
        &self,
        keys: &Arc<LockKeys>,
        token: &Token,
        ttl: Duration,
        settings: &Settings,
    ) -> Result<Attempt, Vec<NodeFailure>> {
        match self {
            Backend::Single(node) => node
                .acquire(keys, token, ttl, settings.fencing)
                .await
                .map_err(|f| vec![f]),
            Backend::Redlock(redlock) => redlock.acquire(keys, token, ttl, settings.fencing).await,
            Backend::Memory(store) => Ok(store.acquire(keys, token, ttl, settings.fencing)),
        }
    }

    pub(crate) async fn extend_many(
        &self,
        items: &[(&LockKeys, &Token, Duration)],
    ) -> Vec<ExtendOutcome> {
        match self {
            Backend::Single(node) => node.extend_many(items).await,
            Backend::Redlock(redlock) => redlock.extend_many(items).await,
            Backend::Memory(store) => items
                .iter()
                .map(|(keys, token, ttl)| {
                    if store.extend(keys, token, *ttl) {
                        ExtendOutcome::Extended
                    } else {
                        ExtendOutcome::NotOwned
                    }
                })
                .collect(),
        }
    }

    /// `Ok(true)` when the lock was ours up to the release.
    pub(crate) async fn release(
        &self,
        keys: &Arc<LockKeys>,
        token: &Token,
    ) -> Result<bool, Vec<NodeFailure>> {
        match self {
            Backend::Single(node) => node.release(keys, token).await.map_err(|f| vec![f]),
            Backend::Redlock(redlock) => redlock.release(keys, token).await,
            Backend::Memory(store) => Ok(store.release(keys, token)),
        }
    }

    /// Subscribes to the lock's release notifications. Must complete before the next attempt so
    /// that a release between that attempt and the wait cannot be missed.
    async fn watch(&self, wakers: &Arc<WakeRegistry>, keys: &LockKeys) -> WakeHandle {
        let mut handle = wakers.watch(&keys.channel);
        match self {
            Backend::Single(node) => {
                if let Some(sub) = node.subscribe(keys).await {
                    handle.hold(sub);
                }
            }
            Backend::Redlock(redlock) => {
                for sub in redlock.subscribe(keys).await {
                    handle.hold(sub);
                }
            }
            Backend::Memory(_) => {}
        }
        handle
    }
}

/// A handle to a configured lock backend. Cheap to clone; all clones share connections and the
/// renewal driver.
///
/// Most code uses the global client through [`init`](crate::init), [`Lock::new`](crate::Lock::new)
/// and the attribute; a `LockClient` is for programs that need several backends, or tests.
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.inner.backend)
            .finish_non_exhaustive()
    }
}

pub(crate) struct ClientInner {
    pub(crate) backend: Arc<Backend>,
    pub(crate) settings: Arc<Settings>,
    pub(crate) renewer: Renewer,
    pub(crate) runtime: Handle,
    wakers: Arc<WakeRegistry>,
}

impl LockClient {
    /// Validates `config` and builds a client. Connections are made lazily, on first use, so this
    /// neither blocks nor fails when Redis is down; lock calls then report `Unavailable`.
    pub fn new(config: LockConfig) -> Result<LockClient, LockError> {
        let valid = config.validate()?;
        let runtime = match valid.runtime {
            Some(runtime) => runtime,
            None => global::runtime()?.clone(),
        };
        // The connection manager and the renewal driver spawn onto the current runtime: this one.
        let _entered = runtime.enter();
        let settings = Arc::new(valid.settings);
        let wakers = Arc::new(WakeRegistry::default());
        let backend = match valid.backend {
            ValidBackend::Single(addr) => {
                Backend::Single(RedisNode::new(&addr, &settings, Arc::clone(&wakers))?)
            }
            ValidBackend::Redlock(addrs) if addrs.len() == 1 => {
                Backend::Single(RedisNode::new(&addrs[0], &settings, Arc::clone(&wakers))?)
            }
            ValidBackend::Redlock(addrs) => {
                Backend::Redlock(Redlock::new(&addrs, &settings, Arc::clone(&wakers))?)
            }
            ValidBackend::InMemory => Backend::Memory(MemoryStore::new(Arc::clone(&wakers))),
        };
        let backend = Arc::new(backend);
        let renewer = Renewer::start(Arc::clone(&backend), Arc::clone(&settings));
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                backend,
                settings,
                renewer,
                runtime,
                wakers,
            }),
        })
    }

    /// A lock on `key` through this client (instead of the global one).
    pub fn lock(&self, key: impl Into<String>) -> crate::Lock {
        crate::Lock::with_client(self.clone(), key.into())
    }

    /// Acquires on the client's runtime, from any async context. If the caller's future is
    /// dropped meanwhile, waiting stops and a lock granted in the meantime is released.
    pub(crate) async fn acquire(
        &self,
        name: String,
        ttl: Option<Duration>,
        wait: Option<Duration>,
    ) -> Result<LockGuard, LockError> {
        if global::on(&self.inner.runtime) {
            let abandoned = CancellationToken::new();
            let gone = abandoned.clone().cancelled_owned();
            let client = self.clone();
            let work = async move { client.acquire_here(name, ttl, wait, gone).await };
            let outcome = InPlace::new(work, self.inner.runtime.clone(), Some(abandoned)).await;
            // `None` only once abandoned, and then nobody reads this.
            return outcome.unwrap_or_else(|| Err(background_gone()));
        }
        let (tx, rx) = oneshot::channel();
        let client = self.clone();
        self.inner.runtime.spawn(async move {
            let mut tx = tx;
            let outcome = client.acquire_here(name, ttl, wait, tx.closed()).await;
            if let Some(result) = outcome {
                // A guard the caller no longer wants is dropped here, which releases it.
                let _ = tx.send(result);
            }
        });
        rx.await.unwrap_or_else(|_| Err(background_gone()))
    }

    /// Acquires from sync code: blocks this thread (never the library's runtime), also when
    /// called from inside an async runtime.
    pub(crate) fn acquire_blocking(
        &self,
        name: String,
        ttl: Option<Duration>,
        wait: Option<Duration>,
    ) -> Result<LockGuard, LockError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let client = self.clone();
        self.inner.runtime.spawn(async move {
            let outcome = client
                .acquire_here(name, ttl, wait, std::future::pending())
                .await;
            if let Some(result) = outcome {
                let _ = tx.send(result);
            }
        });
        global::wait_for(&self.inner.runtime, rx).unwrap_or_else(|| Err(background_gone()))
    }

    /// The acquire loop; runs on the library's runtime. `None` when the caller went away.
    async fn acquire_here(
        &self,
        name: String,
        ttl: Option<Duration>,
        wait: Option<Duration>,
        caller_gone: impl Future<Output = ()>,
    ) -> Option<Result<LockGuard, LockError>> {
        let inner = &self.inner;
        let settings = &*inner.settings;
        let ttl = ttl.unwrap_or(settings.default_ttl);
        let wait = wait.unwrap_or(settings.default_wait);
        if let Err(e) = check_lock(&name, ttl, settings) {
            return Some(Err(e));
        }
        let keys = Arc::new(LockKeys::new(&settings.key_prefix, name));
        let token = match Token::new() {
            Ok(token) => token,
            Err(failure) => {
                return Some(Err(LockError::Unavailable {
                    key: keys.name.clone(),
                    causes: vec![failure],
                }));
            }
        };
        let started = Instant::now();
        let give_up = started + wait;
        let mut backoff = Backoff::new(settings);
        let mut watch: Option<WakeHandle> = None;
        // Set once an attempt's outcome is unknown (timeout, broken connection): the lock may be
        // ours on the server, so a failed call must release by token before returning.
        let mut unsure = false;
        let mut final_try = false;
        tokio::pin!(caller_gone);
        let outcome = loop {
            if let Some(w) = watch.as_mut() {
                w.mark_seen();
            }
            let attempt_start = Instant::now();
            let attempt = inner.backend.acquire(&keys, &token, ttl, settings).await;
            let now = Instant::now();
            let failures = match attempt {
                Ok(Attempt::Acquired { fence }) => {
                    let valid_until = attempt_start + ttl.saturating_sub(settings.drift(ttl));
                    if valid_until > now {
                        break Ok(self.guard(
                            Arc::clone(&keys),
                            token.clone(),
                            ttl,
                            fence,
                            valid_until,
                        ));
                    }
                    // Granted too slowly to be of use: not a success.
                    unsure = true;
                    vec![NodeFailure::timeout(
                        "quorum",
                        "acquire before the lock's validity ran out",
                    )]
                }
                Ok(Attempt::Held { pttl }) => {
                    // `unsure` stays set: after a reconnect, an earlier attempt may still land
                    // behind this answer. A release by token is harmless if it never did.
                    if now >= give_up {
                        break Err(LockError::Contended {
                            key: keys.name.clone(),
                            waited: now - started,
                        });
                    }
                    if watch.is_none() {
                        // Subscribe, then retry at once: a release from here on wakes us.
                        watch = Some(inner.backend.watch(&inner.wakers, &keys).await);
                        continue;
                    }
                    let nap = backoff
                        .next_delay()
                        .min(pttl.map_or(Duration::MAX, |p| p + Duration::from_millis(1)))
                        .min(give_up - now);
                    let released = async {
                        match watch.as_mut() {
                            Some(w) => w.released().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        () = tokio::time::sleep(nap) => {}
                        () = released => {}
                        () = &mut caller_gone => {
                            self.release_in_background(&keys, &token, unsure);
                            return None;
                        }
                    }
                    continue;
                }
                Err(failures) => failures,
            };
            unsure |= failures.iter().any(|f| f.kind.may_have_applied());
            let transient = failures.iter().all(|f| f.kind.is_transient());
            if !transient || final_try {
                break Err(unavailable(&keys, failures));
            }
            if now >= give_up {
                if !unsure {
                    break Err(unavailable(&keys, failures));
                }
                // The last outcome is unknown: ask once more with the same token (the acquire
                // script answers "ours" for it) rather than guess.
                final_try = true;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay().min(give_up - now)) => {}
                () = &mut caller_gone => {
                    self.release_in_background(&keys, &token, unsure);
                    return None;
                }
            }
        };
        if outcome.is_err() {
            self.release_in_background(&keys, &token, unsure);
        }
        Some(outcome)
    }

    fn guard(
        &self,
        keys: Arc<LockKeys>,
        token: Token,
        ttl: Duration,
        fence: Option<u64>,
        valid_until: Instant,
    ) -> LockGuard {
        let held = Arc::new(Held::new(keys, token, ttl, fence));
        let every = self.inner.settings.renew_every(ttl);
        self.inner
            .renewer
            .register(Arc::clone(&held), valid_until, every);
        LockGuard::new(self.clone(), held)
    }

    /// Best-effort release of a token whose acquisition may have succeeded unseen.
    fn release_in_background(&self, keys: &Arc<LockKeys>, token: &Token, unsure: bool) {
        if !unsure {
            return;
        }
        let backend = Arc::clone(&self.inner.backend);
        let keys = Arc::clone(keys);
        let token = token.clone();
        self.inner.runtime.spawn(async move {
            if let Err(causes) = backend.release(&keys, &token).await {
                tracing::debug!(key = %keys.name, ?causes, "cleanup release failed; the key expires by its ttl");
            }
        });
    }
}

fn check_lock(name: &str, ttl: Duration, settings: &Settings) -> Result<(), LockError> {
    if name.is_empty() {
        return Err(LockError::config("key", "must not be empty"));
    }
    if ttl.is_zero() {
        return Err(LockError::config("ttl", "must be greater than zero"));
    }
    if settings.renew_every(ttl) >= ttl || settings.drift(ttl) >= ttl {
        return Err(LockError::config(
            "ttl",
            format!("{ttl:?} is too short for the renew interval and drift allowance"),
        ));
    }
    Ok(())
}

fn unavailable(keys: &LockKeys, causes: Vec<NodeFailure>) -> LockError {
    LockError::Unavailable {
        key: keys.name.clone(),
        causes,
    }
}

pub(crate) fn background_gone() -> LockError {
    LockError::Runtime {
        reason: "the lock runtime stopped before answering".to_owned(),
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
    fn the_three_keys_share_a_slot() {
        for name in ["wallet:42", "a{t}b", "{x}", "a}b", "{{x}", "x{}"] {
            let keys = redis_keys("lock:", name);
            let tags: Vec<_> = keys.iter().map(|k| hash_tag(k)).collect();
            assert!(tags[0].is_some(), "{name}: {keys:?}");
            assert!(tags.iter().all(|t| *t == tags[0]), "{name}: {keys:?}");
        }
        assert_eq!(hash_tag(&redis_keys("lock:", "a{t}b")[0]), Some("t"));
    }

    #[test]
    fn tokens_are_128_bit_and_hidden() {
        let (Ok(a), Ok(b)) = (Token::new(), Token::new()) else {
            panic!("no randomness")
        };
        assert_eq!(a.as_str().len(), 32);
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.as_str()));
    }
}
