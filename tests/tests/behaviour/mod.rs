//! Behaviour every backend must show. A backend's test file builds its fixture with [`Fx::new`]
//! and calls `behaviour_tests!(fixture)`, which makes one test of every check: the list in that
//! macro is the only one, and a check missing from it is dead code, which is denied here.

#![deny(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

mod election;
pub(crate) mod kinds;
mod owners;

pub(crate) use owners::inspect_names_the_owner;

pub(crate) use election::*;

use lock_runtime::{Lock, LockClient, LockConfig, LockError, LockGuard};
use lock_tests::{
    LockStore, RedisServer, SCHEDULING_SLACK, SHORT_TTL, bounded, unique_key, wait_until,
    wait_until_async,
};

/// Between two attempts a waiter sleeps at least half of this (jitter 0.5), unless a release
/// wakes it: long, so that a hand-off within a second can only be a wake-up.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// Two clients on one backend (two "processes" for Redis and etcd; one client, cloned, in
/// memory, where clients share nothing) and the stores behind them, if any: one per node (one,
/// or the Redlock masters), or one for a whole Cluster, Sentinel set or etcd cluster (a lock
/// lives on one master, or in one linearizable store).
pub(crate) struct Fx {
    pub(crate) a: LockClient,
    pub(crate) b: LockClient,
    /// What `a` and `b` were made from, for a check that needs a client of its own.
    config: LockConfig,
    /// None in memory, one node, the Redlock masters, or one shared topology.
    pub(crate) nodes: Vec<Box<dyn LockStore>>,
}

impl Fx {
    /// `config` with [`RETRY_DELAY`]. In memory (no `nodes`), it must be hosted on the test's
    /// runtime: a waiter's first poll then runs its attempts in place, which is how
    /// [`start_waiter`](Self::start_waiter) knows it waits.
    #[allow(
        dead_code,
        reason = "the shared topologies' fixtures use `on`, the etcd ones `Fx::etcd`"
    )]
    pub(crate) fn new(config: LockConfig, nodes: Vec<RedisServer>) -> Fx {
        let stores = nodes
            .into_iter()
            .map(|n| Box::new(n) as Box<dyn LockStore>)
            .collect();
        Self::on(config, stores)
    }

    /// [`new`](Self::new) over stores of any topology.
    pub(crate) fn on(config: LockConfig, nodes: Vec<Box<dyn LockStore>>) -> Fx {
        let config = config.retry_delay(RETRY_DELAY);
        let a = LockClient::new(config.clone()).unwrap();
        let b = if nodes.is_empty() {
            a.clone()
        } else {
            LockClient::new(config.clone()).unwrap()
        };
        Fx {
            a,
            b,
            config,
            nodes,
        }
    }

    /// On a member of `cluster`, reached through a proxy of its own (which counts the clients'
    /// requests): `config` must be `LockConfig::etcd([proxy.http_url()])`, given the proxy this
    /// makes.
    #[cfg(feature = "etcd")]
    #[allow(dead_code, reason = "only the etcd test binary builds this fixture")]
    pub(crate) fn etcd(
        cluster: &'static lock_tests::EtcdCluster,
        config: impl FnOnce(&lock_tests::FaultProxy) -> LockConfig,
    ) -> Fx {
        let proxy = lock_tests::FaultProxy::start(cluster.client_port(0));
        let config = config(&proxy).retry_delay(RETRY_DELAY);
        Fx {
            a: LockClient::new(config.clone()).unwrap(),
            b: LockClient::new(config.clone()).unwrap(),
            config,
            nodes: vec![Box::new(lock_tests::EtcdStore::new(cluster, proxy))],
        }
    }

    /// A short ttl that renewal must keep alive: the longest any store asks for.
    fn short_ttl(&self) -> Duration {
        self.nodes
            .iter()
            .map(|node| node.short_ttl())
            .max()
            .unwrap_or(SHORT_TTL)
    }

    /// How many nodes hold a lock: a topology seen as one store is one node.
    fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn client_with(&self, adjust: impl FnOnce(LockConfig) -> LockConfig) -> LockClient {
        LockClient::new(adjust(self.config.clone())).unwrap()
    }

    /// How many nodes must agree: none in memory, one of one, three of five.
    fn majority(&self) -> usize {
        match self.node_count() {
            0 => 0,
            n => n / 2 + 1,
        }
    }

    /// Whether no node holds a lock whose name starts with `prefix` but `key`'s (if given).
    fn at_most_under(&self, prefix: &str, key: Option<&str>) -> bool {
        self.nodes
            .iter()
            .all(|node| node.holds_none_under(prefix, key))
    }

    /// On how many nodes the lock `key` is held.
    fn holders(&self, key: &str) -> usize {
        self.nodes.iter().filter(|node| node.holds(key)).count()
    }

    /// Spawns `waiter` (an acquire of `key`, which is held) and returns once it waits for a
    /// release: once a store sees it listen (under Redlock a waiter listens at one node, the gate
    /// of its lock's first key); in memory, once its first poll, which makes every attempt in
    /// place, returned `Pending`.
    async fn start_waiter<F>(&self, key: &str, waiter: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + std::fmt::Debug + 'static,
    {
        let mut waiter = Box::pin(waiter);
        if self.nodes.is_empty() {
            let first = std::future::poll_fn(|cx| Poll::Ready(waiter.as_mut().poll(cx))).await;
            assert!(
                first.is_pending(),
                "the waiter did not wait for a held lock"
            );
            return tokio::spawn(waiter);
        }
        let mut listening: Vec<_> = self.nodes.iter().map(|node| node.listening(key)).collect();
        let timeout = self.nodes.iter().map(|node| node.listen_timeout()).max();
        let waiting = tokio::spawn(waiter);
        wait_until_async(
            timeout.unwrap_or_default(),
            "the waiter listens for a release",
            || listening.iter_mut().any(|listens| listens()) || waiting.is_finished(),
        )
        .await;
        if waiting.is_finished() {
            let answer = waiting.await;
            panic!("the waiter did not wait for a held lock: it returned {answer:?}");
        }
        waiting
    }

    /// [`start_waiter`](Self::start_waiter) for `lock.acquire()`; the task answers when the
    /// acquire returned, and what it returned.
    async fn start_lock_waiter(
        &self,
        blocked_on: &str,
        lock: Lock,
    ) -> tokio::task::JoinHandle<(Instant, Result<LockGuard, LockError>)> {
        self.start_waiter(blocked_on, async move {
            let guard = lock.acquire().await;
            (Instant::now(), guard)
        })
        .await
    }

    /// Starts `waiter` (a lock of `b` that waits, blocked on `blocked_on`), releases `held`, and
    /// returns the waiter's guard, checking it was woken by the release: its next attempt was due
    /// 2.5s or more later ([`RETRY_DELAY`]).
    async fn hand_off(&self, held: LockGuard, blocked_on: &str, waiter: Lock) -> LockGuard {
        let waiter = self.start_lock_waiter(blocked_on, waiter).await;
        released_to(held.release(), waiter, Duration::from_secs(2)).await
    }

    /// Waits (bounded) until no node has the lock key of `key` any more, then until `b` can take
    /// and release it; returns how long both took.
    async fn time_until_free(&self, key: &str) -> Duration {
        let start = Instant::now();
        wait_until_async(Duration::from_secs(2), "released on every node", || {
            self.holders(key) == 0
        })
        .await;
        let bound = Duration::from_secs(5);
        let guard = self
            .b
            .lock(key)
            .wait(bound)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{key} not free within {bound:?}: {e}"));
        let took = start.elapsed();
        guard.release().await.unwrap();
        took
    }
}

pub(crate) async fn acquire_release(fx: &Fx) {
    let key = unique_key("beh:basic");
    let guard = fx.a.lock(&key).acquire().await.unwrap();
    assert_eq!(guard.key(), key);
    assert!(guard.fencing_token().is_some());
    assert!(!guard.is_lost());
    // No lock key under the check's prefix but this one, and that on at least a majority.
    assert!(fx.at_most_under("beh:basic", Some(&key)));
    assert!(fx.holders(&key) >= fx.majority());
    guard.release().await.unwrap();
    // Released on a majority when `release` returns, and soon on every node.
    assert!(fx.holders(&key) <= fx.node_count() - fx.majority());
    wait_until_async(Duration::from_secs(2), "released on every node", || {
        fx.at_most_under("beh:basic", None)
    })
    .await;
    // Free again: the next acquisition succeeds at once.
    takes(fx.b.lock(&key)).await;
}

pub(crate) async fn contention_error_and_waited(fx: &Fx) {
    let key = unique_key("beh:contended");
    let held = fx.a.lock(&key).acquire().await.unwrap();
    match fx.b.lock(&key).acquire().await {
        Err(LockError::Contended { key: k, waited }) => {
            assert_eq!(k, key);
            assert!(waited < Duration::from_secs(1), "{waited:?}");
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    let wait = Duration::from_millis(300);
    match fx.b.lock(&key).wait(wait).acquire().await {
        Err(LockError::Contended { waited, .. }) => assert!(waited >= wait, "{waited:?}"),
        other => panic!("expected Contended, got {other:?}"),
    }
    held.release().await.unwrap();
}

pub(crate) async fn waiter_gets_lock_right_after_release(fx: &Fx) {
    let key = unique_key("beh:handoff");
    let held = fx.a.lock(&key).acquire().await.unwrap();
    let waiter = fx.b.lock(&key).wait(Duration::from_secs(10));
    let guard = fx.hand_off(held, &key, waiter).await;
    guard.release().await.unwrap();
}

pub(crate) async fn renewal_keeps_a_short_lock(fx: &Fx) {
    let key = unique_key("beh:renew");
    let ttl = fx.short_ttl();
    let guard = fx.a.lock(&key).ttl(ttl).acquire().await.unwrap();
    // The behaviour under test is the passing of time: six TTLs.
    tokio::time::sleep(ttl * 6).await;
    assert!(!guard.is_lost());
    // Renewed on every node, not only on the majority that granted it.
    assert_eq!(fx.holders(&key), fx.node_count());
    assert!(matches!(
        fx.b.lock(&key).acquire().await,
        Err(LockError::Contended { .. })
    ));
    guard.release().await.unwrap();
}

pub(crate) async fn dropped_guard_frees_promptly(fx: &Fx) {
    let key = unique_key("beh:drop");
    let guard =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
    drop(guard);
    let took = fx.time_until_free(&key).await;
    eprintln!("free after drop: {took:?}");
    // And a guard of the blocking API dropped on a plain thread, outside any runtime.
    let guard =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .acquire_blocking()
            .unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let took = fx.time_until_free(&key).await;
    eprintln!("free after a drop on a plain thread: {took:?}");
}

pub(crate) async fn cancelled_future_frees_promptly(fx: &Fx) {
    let key = unique_key("beh:cancel");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let a = fx.a.clone();
    let k = key.clone();
    let task = tokio::spawn(async move {
        let guard = a
            .lock(&k)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        tx.send(()).unwrap();
        std::future::pending::<()>().await;
        drop(guard);
    });
    rx.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let took = fx.time_until_free(&key).await;
    eprintln!("free after cancellation: {took:?}");
}

/// A waiter whose future is dropped stops waiting; a grant it might still have received on the way
/// out is released, so the lock is free right after the holder lets go (not after its 30s TTL).
pub(crate) async fn cancelled_waiter_keeps_nothing(fx: &Fx) {
    let key = unique_key("beh:cancelwait");
    let held =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
    let b = fx.b.clone();
    let k = key.clone();
    let waiter = fx
        .start_waiter(&key, async move {
            b.lock(&k)
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        })
        .await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    held.release().await.unwrap();
    let took = fx.time_until_free(&key).await;
    eprintln!("free after the holder released, waiter cancelled: {took:?}");
}

pub(crate) async fn panic_frees(fx: &Fx) {
    let key = unique_key("beh:panic");
    let a = fx.a.clone();
    let k = key.clone();
    let task = tokio::spawn(async move {
        let _guard = a
            .lock(&k)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        panic!("boom inside the critical section");
    });
    assert!(task.await.unwrap_err().is_panic());
    let took = fx.time_until_free(&key).await;
    eprintln!("free after panic: {took:?}");
}

pub(crate) async fn fencing_tokens_increase(fx: &Fx) {
    let key = unique_key("beh:fence");
    let mut last = 0;
    for _ in 0..50 {
        let guard = fx.a.lock(&key).acquire().await.unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(token > last, "{token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
}

pub(crate) async fn blocking_api_inside_async_code(fx: &Fx) {
    let key = unique_key("beh:blocking");
    // On this runtime's own thread: blocks it, must not panic.
    let guard = fx.a.lock(&key).acquire_blocking().unwrap();
    assert!(
        fx.b.lock(&key)
            .acquire_blocking()
            .unwrap_err()
            .is_contended()
    );
    guard.release_blocking().unwrap();
    let a = fx.a.clone();
    let k = key.clone();
    tokio::task::spawn_blocking(move || a.lock(&k).acquire_blocking().unwrap().release_blocking())
        .await
        .unwrap()
        .unwrap();
}

/// A lock taken back from under its holder (here by `shutdown()` of the holder's client, which
/// works the same on every backend) is lost: `lost()` resolves, `is_lost()` says so, the release
/// says `Lost`, and the lock is free. (Losing it at the validity deadline, or to a server saying
/// "not yours", is in faults.rs, lifecycle.rs and redlock.rs.)
pub(crate) async fn release_of_a_lost_lock_is_lost(fx: &Fx) {
    let key = unique_key("beh:lost");
    let own = fx.client_with(|config| config);
    let guard = own.lock(&key).acquire().await.unwrap();
    assert!(!guard.is_lost());
    shut_down(&own).await;
    bounded(Duration::from_secs(5), "loss signalled", guard.lost()).await;
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    assert_eq!(fx.holders(&key), 0);
}

/// Lets go with `release` (a guard's release, a leadership's resignation) and returns what
/// `waiter` (from [`Fx::start_lock_waiter`], or a task that answers when it got the lock) got,
/// checking that it got it after the release and less than `within` after it.
async fn released_to<T: Send + 'static>(
    release: impl Future<Output = Result<(), LockError>>,
    waiter: tokio::task::JoinHandle<(Instant, Result<T, LockError>)>,
    within: Duration,
) -> T {
    let released_at = Instant::now();
    release.await.unwrap();
    let (got_at, guard) = bounded(Duration::from_secs(10), "the waiter", waiter)
        .await
        .unwrap();
    let guard = guard.unwrap();
    assert!(got_at >= released_at);
    eprintln!("hand-off after release: {:?}", got_at - released_at);
    assert!(
        got_at - released_at < within,
        "got it {:?} after the release",
        got_at - released_at
    );
    guard
}

/// Takes `lock` and lets it go at once: the key is free for it.
async fn takes(lock: Lock) {
    lock.acquire().await.unwrap().release().await.unwrap();
}

/// Two keys `<base>:a` < `<base>:b` no other check uses.
fn two_keys(prefix: &str) -> (String, String) {
    let base = unique_key(prefix);
    (format!("{base}:a"), format!("{base}:b"))
}

/// A body that never ends and reports, through the returned flag, that it was dropped.
fn endless_body(
    dropped: &std::sync::Arc<AtomicBool>,
    started: tokio::sync::oneshot::Sender<()>,
) -> impl Future<Output = Result<u32, LockError>> + Send + 'static {
    let on_drop = SetOnDrop(std::sync::Arc::clone(dropped));
    async move {
        let _on_drop = on_drop;
        let _ = started.send(());
        std::future::pending::<()>().await;
        Ok(0)
    }
}

struct SetOnDrop(std::sync::Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Fx {
    /// The stores' counts of lock requests so far, summed (0 in memory): it stands still while
    /// no request goes out.
    fn lock_requests(&self) -> u64 {
        self.nodes.iter().map(|node| node.lock_requests()).sum()
    }

    /// Script calls (one per lock operation on a Redis node) run so far, summed over the nodes
    /// (0 in memory and where locks are no scripts).
    fn script_calls(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|node| node.script_calls())
            .sum()
    }

    /// Whether the stores run lock scripts, which [`script_calls`](Self::script_calls) counts.
    fn runs_scripts(&self) -> bool {
        self.nodes.iter().any(|node| node.script_calls().is_some())
    }

    /// Waits (bounded) until no node has a lock key of any of `keys`.
    async fn all_free(&self, keys: &[&str]) {
        wait_until_async(Duration::from_secs(2), "released on every node", || {
            keys.iter().all(|key| self.holders(key) == 0)
        })
        .await;
    }

    /// [`all_free`](Self::all_free), then `b` takes and releases each key at once (wait 0).
    async fn free_now(&self, keys: &[&str]) {
        self.all_free(keys).await;
        for key in keys {
            let guard = self.b.lock(*key).acquire().await;
            let guard = guard.unwrap_or_else(|e| panic!("{key} not free: {e}"));
            guard.release().await.unwrap();
        }
    }
}

/// `client` runs an empty body under `key` with wait 0: `Ok` if it joined or got the lock.
async fn run_now(client: LockClient, key: String, reentrant: bool) -> Result<(), LockError> {
    let lock = client.lock(key).reentrant(reentrant).wait(Duration::ZERO);
    lock.run(async { Ok(()) }).await
}

/// [`run_now`] from sync code.
fn run_now_blocking(client: &LockClient, key: &str, reentrant: bool) -> Result<(), LockError> {
    let lock = client.lock(key).reentrant(reentrant).wait(Duration::ZERO);
    lock.run_blocking(|| Ok(()))
}

/// Nested `run` calls `depth` deep on `key` through `client`, each with wait 0: the innermost
/// returns 0, each level adds 1.
fn nested_chain(
    client: LockClient,
    key: String,
    depth: u32,
) -> std::pin::Pin<Box<dyn Future<Output = Result<u32, LockError>> + Send>> {
    Box::pin(async move {
        let inner_client = client.clone();
        let inner_key = key.clone();
        client
            .lock(&key)
            .wait(Duration::ZERO)
            .run(async move {
                if depth == 0 {
                    Ok(0)
                } else {
                    nested_chain(inner_client, inner_key, depth - 1)
                        .await
                        .map(|n| n + 1)
                }
            })
            .await
    })
}

/// One lock over two keys holds both (on a majority at once, then on every node), keeps others
/// off both, and frees both on release.
pub(crate) async fn multi_key_acquire_release(fx: &Fx) {
    let (ka, kb) = two_keys("beh:many");
    // Given out of order: the guard lists them in canonical (sorted) order.
    let guard = fx.a.lock_many([&kb, &ka]).acquire().await.unwrap();
    assert_eq!(guard.keys().collect::<Vec<_>>(), [ka.as_str(), kb.as_str()]);
    assert_eq!(guard.keys().len(), 2);
    assert_eq!(guard.key(), ka);
    assert!(fx.holders(&ka) >= fx.majority() && fx.holders(&kb) >= fx.majority());
    wait_until_async(
        Duration::from_secs(2),
        "both keys held on every node",
        || fx.holders(&ka) == fx.node_count() && fx.holders(&kb) == fx.node_count(),
    )
    .await;
    for key in [&ka, &kb] {
        assert!(
            fx.b.lock(key).acquire().await.unwrap_err().is_contended(),
            "{key} was free while the two-key lock held it"
        );
    }
    guard.release().await.unwrap();
    fx.free_now(&[&ka, &kb]).await;
}

/// Duplicates are merged: `transfer(a, a)` locks one key, and `["b", "a", "a"]` locks a and b.
pub(crate) async fn duplicate_keys_are_locked_once(fx: &Fx) {
    let (ka, kb) = two_keys("beh:dedupe");
    let guard = fx.a.lock_many([&ka, &ka]).acquire().await.unwrap();
    assert_eq!(guard.keys().collect::<Vec<_>>(), [ka.as_str()]);
    assert!(guard.fencing_token().is_some());
    assert_eq!(guard.fencing_token_of(&ka), guard.fencing_token());
    assert!(fx.holders(&ka) >= fx.majority());
    guard.release().await.unwrap();
    fx.all_free(&[&ka]).await;

    let guard = fx.a.lock_many([&kb, &ka, &ka]).acquire().await.unwrap();
    assert_eq!(guard.keys().collect::<Vec<_>>(), [ka.as_str(), kb.as_str()]);
    guard.release().await.unwrap();
    fx.all_free(&[&ka, &kb]).await;
}

/// All or nothing: when the second key is held, acquiring both is `Contended` on that key, and
/// nothing of the first key is left behind (it is free for anyone at once).
pub(crate) async fn held_second_key_fails_the_whole_lock(fx: &Fx) {
    let (ka, kb) = two_keys("beh:allornothing");
    let held = fx.b.lock(&kb).acquire().await.unwrap();
    wait_until_async(
        Duration::from_secs(2),
        "the second key held on every node",
        || fx.holders(&kb) == fx.node_count(),
    )
    .await;
    match fx.a.lock_many([&ka, &kb]).acquire().await {
        Err(LockError::Contended { key, .. }) => assert_eq!(key, kb),
        other => panic!("expected Contended on {kb}, got {other:?}"),
    }
    // Also with a short wait: it gives up on the whole set, still keeping nothing.
    let wait = Duration::from_millis(200);
    assert!(
        fx.a.lock_many([&ka, &kb])
            .wait(wait)
            .acquire()
            .await
            .unwrap_err()
            .is_contended()
    );
    fx.free_now(&[&ka]).await;
    held.release().await.unwrap();
}

/// A waiter on {a, b} is woken by the release of b (not only of its first key), well before its
/// next retry would have been due.
pub(crate) async fn multi_key_waiter_wakes_on_any_release(fx: &Fx) {
    let (ka, kb) = two_keys("beh:manywait");
    let held = fx.a.lock(&kb).acquire().await.unwrap();
    let waiter = fx.b.lock_many([&ka, &kb]).wait(Duration::from_secs(10));
    let guard = fx.hand_off(held, &kb, waiter).await;
    assert_eq!(guard.keys().len(), 2);
    guard.release().await.unwrap();
}

/// Each key of a multi-key lock has its own fencing token, from the same counter as a one-key
/// lock of that key, and it grows with every grant.
pub(crate) async fn multi_key_fencing_tokens_grow_per_key(fx: &Fx) {
    let (ka, kb) = two_keys("beh:manyfence");
    let (mut last_a, mut last_b) = (0, 0);
    for i in 0..20 {
        if i % 3 == 2 {
            // A one-key grant of a in between moves a's counter only.
            let guard = fx.a.lock(&ka).acquire().await.unwrap();
            let token = guard.fencing_token().unwrap();
            assert!(token > last_a, "{token} after {last_a}");
            last_a = token;
            guard.release().await.unwrap();
            continue;
        }
        let guard = fx.b.lock_many([&kb, &ka]).acquire().await.unwrap();
        let (Some(ta), Some(tb)) = (guard.fencing_token_of(&ka), guard.fencing_token_of(&kb))
        else {
            panic!("no token per key: {guard:?}");
        };
        assert_eq!(
            guard.fencing_token_of("beh:manyfence:not-a-key-of-it"),
            None
        );
        assert!(ta > last_a, "{ka}: {ta} after {last_a}");
        assert!(tb > last_b, "{kb}: {tb} after {last_b}");
        (last_a, last_b) = (ta, tb);
        guard.release().await.unwrap();
    }
}

/// A nested call on a held key joins the hold: with wait 0 it succeeds, ten levels deep, async
/// and sync, without one server command; the key stays held until the outermost call ends.
pub(crate) async fn reentrant_nested_calls_join(fx: &Fx) {
    let key = unique_key("beh:reentrant");
    let ttl = Duration::from_secs(60); // no renewal during the count
    let everywhere = || fx.holders(&key) == fx.node_count();
    let result = fx
        .a
        .lock(&key)
        .ttl(ttl)
        .run(async {
            // Nothing of the outer acquire is still in flight (Redlock's slower nodes included).
            wait_until_async(Duration::from_secs(5), "the lock on every node", everywhere).await;
            let before = fx.lock_requests();
            let n = nested_chain(fx.a.clone(), key.clone(), 9).await? + 1;
            assert_eq!(
                fx.lock_requests() - before,
                0,
                "nested calls went to the server"
            );
            // Still held after the nested calls returned: another task (never the holder) is refused.
            let (b, k) = (fx.b.clone(), key.clone());
            let other = tokio::spawn(async move { b.lock(&k).acquire().await.map(drop) });
            assert!(other.await.unwrap().unwrap_err().is_contended());
            Ok::<_, LockError>(n)
        })
        .await;
    assert_eq!(result, Ok(10));
    fx.all_free(&[&key]).await;

    // The same from sync code, on one thread: three nested levels.
    let result = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                fx.a.lock(&key).ttl(ttl).run_blocking(|| {
                    wait_until(Duration::from_secs(5), "the lock on every node", everywhere);
                    let before = fx.lock_requests();
                    let n =
                        fx.a.lock(&key)
                            .wait(Duration::ZERO)
                            .run_blocking(|| {
                                fx.a.lock(&key).wait(Duration::ZERO).run_blocking(|| Ok(2))
                            })
                            .map(|n: u32| n + 1);
                    assert_eq!(
                        fx.lock_requests() - before,
                        0,
                        "sync nested calls went to the server"
                    );
                    n
                })
            })
            .join()
            .unwrap()
    });
    assert_eq!(result, Ok::<u32, LockError>(3));
    fx.free_now(&[&key]).await;
}

/// A nested guard returned out of the outer call's body (it joined the outer hold) holds
/// nothing once the outer call released: it reports the lock lost, its release says `Lost`, and
/// it never claims a key that another client holds by then.
pub(crate) async fn an_escaped_joined_guard_is_lost_once_the_outer_hold_ends(fx: &Fx) {
    let key = unique_key("beh:escaped");
    let escaped =
        fx.a.lock(&key)
            .run(async { fx.a.lock(&key).wait(Duration::ZERO).acquire().await })
            .await
            .unwrap();
    assert!(escaped.is_lost(), "a joined guard outlived its hold");
    bounded(
        Duration::from_secs(1),
        "the escaped guard's lost()",
        escaped.lost(),
    )
    .await;
    // Someone else holds the key now: the escaped guard must not look held beside them.
    let other = fx.b.lock(&key).acquire().await.unwrap();
    assert!(escaped.is_lost());
    assert!(matches!(
        escaped.release().await,
        Err(LockError::Lost { .. })
    ));
    assert!(!other.is_lost());
    other.release().await.unwrap();
    fx.all_free(&[&key]).await;
}

/// Inside a hold of {a, b}, a nested call on b joins; inside a hold of a, a nested call on
/// {a, b} is a `Config` error naming `keys` (upgrading a held set is not atomic).
pub(crate) async fn reentrant_subset_joins_superset_is_an_error(fx: &Fx) {
    let (ka, kb) = two_keys("beh:subset");
    let (a, k) = (fx.a.clone(), kb.clone());
    let subset =
        fx.a.lock_many([&ka, &kb])
            .run(async move { a.lock(&k).wait(Duration::ZERO).run(async { Ok(1) }).await })
            .await;
    assert_eq!(subset, Ok::<u32, LockError>(1));
    fx.all_free(&[&ka, &kb]).await;

    let (a, keys) = (fx.a.clone(), [ka.clone(), kb.clone()]);
    let superset =
        fx.a.lock(&ka)
            .run(async move {
                let nested = a
                    .lock_many(keys)
                    .wait(Duration::ZERO)
                    .run(async { Ok::<u32, LockError>(1) })
                    .await;
                Ok::<_, LockError>(nested)
            })
            .await
            .unwrap();
    match superset {
        Err(LockError::Config { field, reason }) => {
            assert_eq!(field, "keys", "{reason}");
        }
        other => panic!("expected a Config error on `keys`, got {other:?}"),
    }
    fx.all_free(&[&ka, &kb]).await;
}

/// A task spawned inside a hold, or a thread started there, is not the holder: with wait 0 it is
/// `Contended`.
pub(crate) async fn spawned_task_inside_a_hold_waits(fx: &Fx) {
    let key = unique_key("beh:spawned");
    let (a, k) = (fx.a.clone(), key.clone());
    let (task, thread) =
        fx.a.lock(&key)
            .run(async move {
                let task = tokio::spawn(run_now(a.clone(), k.clone(), true));
                let task = task.await.unwrap();
                let thread = std::thread::spawn(move || run_now_blocking(&a, &k, true));
                let thread = tokio::task::spawn_blocking(move || thread.join().unwrap());
                Ok::<_, LockError>((task, thread.await.unwrap()))
            })
            .await
            .unwrap();
    assert!(task.unwrap_err().is_contended(), "a spawned task joined");
    assert!(thread.unwrap_err().is_contended(), "another thread joined");
}

/// A loss reaches every level of a nested hold: the async stack is cancelled and every level
/// says `Lost` naming the key; a sync stack runs to its end, and neither level's success survives.
pub(crate) async fn loss_reaches_every_nested_level(fx: &Fx) {
    let key = unique_key("beh:nestedloss");
    let own = fx.client_with(|config| config);
    let dropped = std::sync::Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (inner_tx, inner_rx) = tokio::sync::oneshot::channel();
    let body = endless_body(&dropped, started_tx);
    let (inner_client, k) = (own.clone(), key.clone());
    let outer = tokio::spawn(own.lock(&key).run(async move {
        let inner = inner_client.lock(&k).wait(Duration::ZERO).run(body).await;
        let _ = inner_tx.send(inner.clone());
        inner
    }));
    let started = bounded(Duration::from_secs(5), "the inner body started", started);
    started.await.unwrap();
    shut_down(&own).await;
    let outer = bounded(Duration::from_secs(5), "the outer call ended", outer)
        .await
        .unwrap();
    assert_eq!(outer, Err(LockError::Lost { key: key.clone() }));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the inner body was not cancelled"
    );
    // Whether the inner call still reported (or was dropped with the outer body), never a success.
    if let Ok(inner) = inner_rx.await {
        assert_eq!(inner, Err(LockError::Lost { key: key.clone() }));
    }
    assert_eq!(fx.holders(&key), 0);

    // Sync: both bodies finish after the loss; both calls return `Lost`.
    let own = fx.client_with(|config| config);
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let (client, k) = (own.clone(), key.clone());
    let stack = tokio::task::spawn_blocking(move || {
        let mut inner = None;
        let outer = client.lock(&k).run_blocking(|| {
            inner = Some(client.lock(&k).wait(Duration::ZERO).run_blocking(|| {
                started_tx.send(()).unwrap();
                go.recv_timeout(Duration::from_secs(10)).unwrap();
                Ok::<u32, LockError>(1)
            }));
            Ok::<u32, LockError>(2)
        });
        (outer, inner)
    });
    let started = move || started.recv_timeout(Duration::from_secs(5)).unwrap();
    tokio::task::spawn_blocking(started).await.unwrap();
    shut_down(&own).await;
    go_tx.send(()).unwrap();
    let (outer, inner) = bounded(Duration::from_secs(5), "the sync stack ended", stack)
        .await
        .unwrap();
    assert_eq!(inner, Some(Err(LockError::Lost { key: key.clone() })));
    assert_eq!(outer, Err(LockError::Lost { key: key.clone() }));
}

/// With `reentrant(false)` a nested call is like any other caller: with wait 0 it is `Contended`.
pub(crate) async fn non_reentrant_nested_call_contends(fx: &Fx) {
    let key = unique_key("beh:nonreentrant");
    let (a, k) = (fx.a.clone(), key.clone());
    let nested =
        fx.a.lock(&key)
            .run(async move { Ok::<_, LockError>(run_now(a, k, false).await) })
            .await
            .unwrap();
    match nested {
        Err(LockError::Contended { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected Contended, got {other:?}"),
    }
    let (a, k) = (fx.a.clone(), key.clone());
    let nested = tokio::task::spawn_blocking(move || {
        a.lock(&k)
            .run_blocking(|| Ok::<_, LockError>(run_now_blocking(&a, &k, false)))
    })
    .await
    .unwrap()
    .unwrap();
    assert!(nested.unwrap_err().is_contended());
    fx.all_free(&[&key]).await;
}

/// An async body that never ends is cancelled at `max_hold` (per lock, or the config default), the
/// call returns `MaxHoldExceeded`, and the key is free right after, long before its TTL.
pub(crate) async fn max_hold_stops_an_endless_async_body(fx: &Fx) {
    let max_hold = Duration::from_millis(300);
    let per_lock = fx.a.clone();
    let by_config = fx.client_with(|config| config.max_hold(max_hold));
    for (how, client) in [("per lock", per_lock), ("config default", by_config)] {
        let key = unique_key("beh:maxhold");
        let lock = client.lock(&key).ttl(Duration::from_secs(30));
        let lock = if how == "per lock" {
            lock.max_hold(max_hold)
        } else {
            lock
        };
        let dropped = std::sync::Arc::new(AtomicBool::new(false));
        let (started_tx, _started) = tokio::sync::oneshot::channel();
        let start = Instant::now();
        let result = bounded(
            Duration::from_secs(5),
            "the body stopped at max_hold",
            lock.run(endless_body(&dropped, started_tx)),
        )
        .await;
        let took = start.elapsed();
        eprintln!("{how}: stopped after {took:?}");
        assert_eq!(
            result,
            Err(LockError::MaxHoldExceeded {
                key: key.clone(),
                max_hold
            }),
            "{how}"
        );
        assert!(took >= max_hold, "{how}: stopped after {took:?}");
        assert!(
            dropped.load(Ordering::SeqCst),
            "{how}: the body was not cancelled"
        );
        // Released (on a majority) when the call returns, then on every node; free for others.
        assert!(fx.holders(&key) <= fx.node_count() - fx.majority(), "{how}");
        fx.free_now(&[&key]).await;
    }
}

/// A sync body that runs past `max_hold` is not interrupted, but its success is replaced by
/// `MaxHoldExceeded`; the key is free right after.
pub(crate) async fn max_hold_replaces_a_late_sync_result(fx: &Fx) {
    let key = unique_key("beh:maxholdsync");
    let max_hold = Duration::from_millis(200);
    let finished = std::sync::Arc::new(AtomicBool::new(false));
    let (a, k, done) = (fx.a.clone(), key.clone(), std::sync::Arc::clone(&finished));
    let start = Instant::now();
    let result = tokio::task::spawn_blocking(move || {
        a.lock(&k)
            .ttl(Duration::from_secs(30))
            .max_hold(max_hold)
            .run_blocking(|| {
                // The behaviour under test is a body that runs too long.
                std::thread::sleep(max_hold * 3);
                done.store(true, Ordering::SeqCst);
                Ok::<u32, LockError>(5)
            })
    })
    .await
    .unwrap();
    assert!(
        finished.load(Ordering::SeqCst),
        "the sync body was interrupted"
    );
    assert!(start.elapsed() >= max_hold * 3);
    assert_eq!(
        result,
        Err(LockError::MaxHoldExceeded {
            key: key.clone(),
            max_hold
        })
    );
    fx.free_now(&[&key]).await;
}

/// `min_hold` of the checks below: long enough that the calls that must not wait for it (bounded
/// by [`UNBLOCKED`]) clearly do not.
const MIN_HOLD: Duration = Duration::from_secs(3);

/// How long a call may take that makes at most four requests on warm connections (acquire on
/// etcd: lease and transaction; a release kept for `min_hold`: the same), each within one
/// response timeout (every fixture's default: 500 ms). Below [`MIN_HOLD`].
const UNBLOCKED: Duration = Duration::from_secs(2);

impl Fx {
    /// How much later than `min_hold` a kept key may be found free: the coarsest store's expiry
    /// granularity (none in memory, which counts milliseconds).
    fn expiry_granularity(&self) -> Duration {
        self.nodes
            .iter()
            .map(|node| node.expiry_granularity())
            .max()
            .unwrap_or_default()
    }
}

/// Takes and lets go of a lock on `client`, so its connections are up before a timed call.
async fn warm_up(client: &LockClient) {
    takes(client.lock(unique_key("beh:warm"))).await;
}

/// A lock with `min_hold` whose body returns at once: the call returns without waiting for
/// `min_hold`, another client is refused until it passed (checked at a point proven to be before
/// it: measured from before the grant), and gets the lock once it has, within the key's expiry
/// granularity.
pub(crate) async fn min_hold_keeps_a_lock_its_body_let_go_early(fx: &Fx) {
    let key = unique_key("beh:minhold");
    warm_up(&fx.a).await;
    warm_up(&fx.b).await;
    let before_grant = Instant::now();
    let ran =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .min_hold(MIN_HOLD)
            .run(async { Ok::<_, LockError>(7) })
            .await;
    let returned = before_grant.elapsed();
    eprintln!("the call returned after {returned:?}");
    assert_eq!(ran, Ok(7));
    assert!(returned < UNBLOCKED, "blocked for {returned:?}");
    assert!(fx.holders(&key) >= fx.majority());
    // Left for the rest of `min_hold`, not for the rest of its 30 s ttl.
    let info = fx.b.inspect(&key).await.unwrap().expect("kept");
    assert!(info.remaining.is_some_and(|r| r <= MIN_HOLD), "{info:?}");

    let refused = fx.b.lock(&key).acquire().await;
    let checked = before_grant.elapsed();
    assert!(checked < MIN_HOLD, "checked {checked:?} after the grant");
    assert!(
        matches!(refused, Err(LockError::Contended { .. })),
        "{refused:?} {checked:?} after the grant"
    );

    // A waiter is not woken by the release that kept the key: it gets the lock when the key
    // expires (its pause is capped by the key's time to live).
    let bound = MIN_HOLD + fx.expiry_granularity() + Duration::from_millis(1500) + SCHEDULING_SLACK;
    let got = fx.b.lock(&key).wait(bound).acquire().await;
    let got_after = before_grant.elapsed();
    eprintln!("the other client got it {got_after:?} after the grant");
    let got = got.unwrap_or_else(|e| panic!("not free {got_after:?} after the grant: {e}"));
    assert!(got_after >= MIN_HOLD, "free {got_after:?} after the grant");
    assert!(got_after <= bound, "free {got_after:?} after the grant");
    got.release().await.unwrap();
}

/// A lock let go after its `min_hold` passed is deleted at once: another client takes it
/// without waiting.
pub(crate) async fn release_after_min_hold_deletes_at_once(fx: &Fx) {
    let key = unique_key("beh:minholdpast");
    let min_hold = Duration::from_millis(300);
    let guard =
        fx.a.lock(&key)
            .ttl(Duration::from_secs(30))
            .min_hold(min_hold)
            .acquire()
            .await
            .unwrap();
    // The behaviour under test is the passing of time: min_hold, and then some.
    tokio::time::sleep(min_hold * 2).await;
    guard.release().await.unwrap();
    assert!(fx.holders(&key) <= fx.node_count() - fx.majority());
    takes(fx.b.lock(&key)).await;
}

/// `shutdown()` of a client that holds a lock whose `min_hold` has not passed: its holder sees it
/// lost (and its release says so), but the key stays for the rest of `min_hold`.
pub(crate) async fn shutdown_keeps_a_lock_for_its_min_hold(fx: &Fx) {
    let key = unique_key("beh:minholdshut");
    let own = fx.client_with(|config| config);
    warm_up(&own).await;
    warm_up(&fx.b).await;
    let before_grant = Instant::now();
    let guard = own
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    shut_down(&own).await;
    bounded(UNBLOCKED, "the loss is signalled", guard.lost()).await;
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    // Kept for the rest of `min_hold` (not deleted, nor left for its 30 s ttl). In memory the
    // lock lives in the shut-down client, which still answers `inspect`.
    let observer = if fx.node_count() == 0 { &own } else { &fx.b };
    let info = observer.inspect(&key).await.unwrap();
    let checked = before_grant.elapsed();
    assert!(checked < MIN_HOLD, "checked {checked:?} after the grant");
    let info = info.expect("kept after shutdown");
    assert!(info.remaining.is_some_and(|r| r <= MIN_HOLD), "{info:?}");
}

/// `client.shutdown()` (which blocks) off the runtime's threads.
async fn shut_down(client: &LockClient) {
    let shutting = client.clone();
    tokio::task::spawn_blocking(move || shutting.shutdown())
        .await
        .unwrap();
}

/// `inspect` shows a held lock (time to live within its ttl, its fencing token, one holder, every
/// node's view) and nothing for a free one; `force_release` frees a lock whoever holds it: the
/// holder sees it lost at its next renewal, and a waiter is woken at once.
pub(crate) async fn inspect_and_force_release(fx: &Fx) {
    let key = unique_key("beh:inspect");
    assert_eq!(fx.b.inspect(&key).await.unwrap(), None);
    let ttl = Duration::from_secs(3);
    let guard = fx.a.lock(&key).ttl(ttl).acquire().await.unwrap();
    wait_until_async(Duration::from_secs(2), "the lock on every node", || {
        fx.holders(&key) == fx.node_count()
    })
    .await;
    let info = fx.b.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.key, key);
    assert_eq!(info.holders, 1);
    assert!(
        info.remaining.is_some_and(|r| r <= ttl && r > ttl / 2),
        "{info:?}"
    );
    if fx.node_count() > 1 {
        // Redlock: the largest counter over the nodes, which may have counted past the token
        // the majority granted.
        assert!(info.fencing_token >= guard.fencing_token(), "{info:?}");
    } else {
        assert_eq!(info.fencing_token, guard.fencing_token());
    }
    assert_eq!(info.nodes.len(), fx.node_count().max(1));
    assert!(info.nodes.iter().all(|n| n.held), "{info:?}");

    let waiter = {
        let (b, k) = (fx.b.clone(), key.clone());
        fx.start_waiter(&key, async move {
            b.lock(&k).wait(Duration::from_secs(10)).acquire().await
        })
        .await
    };
    let forced = Instant::now();
    assert!(fx.b.force_release(&key).await.unwrap());
    let taken = bounded(Duration::from_secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    // Woken by the forced release, not by its retry delay.
    assert!(
        forced.elapsed() < Duration::from_secs(2),
        "{:?}",
        forced.elapsed()
    );
    // At its next renewal: within one renewal period (ttl / 3) + one request timeout (every
    // fixture's default, connect 1 s + response 500 ms) + slack of the forced release.
    let bound = ttl / 3 + Duration::from_millis(1500) + SCHEDULING_SLACK;
    bounded(bound, "the holder sees the loss", guard.lost()).await;
    let lost_after = forced.elapsed();
    assert!(
        lost_after <= bound,
        "lost {lost_after:?} after the forced release (bound {bound:?})"
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    taken.release().await.unwrap();
    // Redlock's release answers once a majority let go; the slower nodes follow.
    fx.all_free(&[&key]).await;
    assert!(!fx.b.force_release(&key).await.unwrap());
    assert_eq!(fx.b.inspect(&key).await.unwrap(), None);
}

static TURNS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A check's turn on the servers of this test binary, alone: for the checks marked `alone` in
/// the lists of [`behaviour_tests!`](crate::behaviour_tests) and
/// [`kind_tests!`](crate::kind_tests), and a backend's own tests that must not share the store.
pub(crate) async fn turn_alone() -> Box<dyn Send + Sync> {
    Box::new(TURNS.write().await)
}

/// A check's turn on the servers of this test binary, beside the other checks that do not run
/// alone.
pub(crate) async fn turn_beside_others() -> Box<dyn Send + Sync> {
    Box::new(TURNS.read().await)
}

/// One `#[tokio::test]` per check, each with a fresh `$fixture`. The only list of the checks.
///
/// A check marked `alone` runs alone on a store shared by a whole test binary (Cluster,
/// Sentinel, etcd): one that counts the commands the servers ran or freezes a server, or whose
/// waiters must line up in a given order. Where a store only sees that some new waiter listens,
/// not whose (etcd counts watchers, not per key), another check's waiter could pass for this one:
/// a reader then came before the writer it was meant to queue behind (a clean-clone CI run).
#[macro_export]
macro_rules! behaviour_tests {
    ($fixture:expr) => {
        behaviour_tests!(@each $fixture; behaviour;
            acquire_release, contention_error_and_waited, waiter_gets_lock_right_after_release,
            renewal_keeps_a_short_lock, dropped_guard_frees_promptly, cancelled_future_frees_promptly,
            cancelled_waiter_keeps_nothing, panic_frees, fencing_tokens_increase, blocking_api_inside_async_code,
            release_of_a_lost_lock_is_lost, multi_key_acquire_release, duplicate_keys_are_locked_once,
            held_second_key_fails_the_whole_lock, multi_key_waiter_wakes_on_any_release,
            multi_key_fencing_tokens_grow_per_key, alone reentrant_nested_calls_join,
            an_escaped_joined_guard_is_lost_once_the_outer_hold_ends,
            reentrant_subset_joins_superset_is_an_error, spawned_task_inside_a_hold_waits,
            loss_reaches_every_nested_level, non_reentrant_nested_call_contends,
            max_hold_stops_an_endless_async_body, max_hold_replaces_a_late_sync_result,
            min_hold_keeps_a_lock_its_body_let_go_early, release_after_min_hold_deletes_at_once,
            shutdown_keeps_a_lock_for_its_min_hold, inspect_and_force_release,
            inspect_names_the_owner,
            election_hands_over_when_the_leader_resigns,
            election_deposed_leader_sees_the_loss_and_a_rival_takes_over,
            election_cancelled_campaign_leaves_nothing, election_epochs_are_fenced_with_fencing_off,
            election_leader_is_the_holder_while_it_leads,
            election_observe_yields_the_leader_then_each_change);
    };
    // The list, one check at a time: `alone name` or `name`, each the name of a check in
    // `$module` (which `behaviour::$name` reaches).
    (@each $fixture:expr; $($module:ident)::+;) => {};
    (@each $fixture:expr; $($module:ident)::+; alone $name:ident $(, $($rest:tt)*)?) => {
        behaviour_tests!(@test $fixture; $($module)::+; $name; turn_alone);
        behaviour_tests!(@each $fixture; $($module)::+; $($($rest)*)?);
    };
    (@each $fixture:expr; $($module:ident)::+; $name:ident $(, $($rest:tt)*)?) => {
        behaviour_tests!(@test $fixture; $($module)::+; $name; turn_beside_others);
        behaviour_tests!(@each $fixture; $($module)::+; $($($rest)*)?);
    };
    (@test $fixture:expr; $($module:ident)::+; $name:ident; $turn:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let _turn = behaviour::$turn().await;
            let fx = $fixture;
            $($module)::+::$name(&fx).await;
        }
    };
}
