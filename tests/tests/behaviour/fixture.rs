//! The fixture of the behaviour suite ([`Fx`]: two clients on one backend and the stores behind
//! them) and the helpers its checks share.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use lock_runtime::{Lock, LockClient, LockConfig, LockError, LockGuard};
use lock_tests::{LockStore, RedisServer, SHORT_TTL, bounded, unique_key, wait_until_async};

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
    /// One Redis server: a queued waiter looks at the key where elsewhere it asks again.
    one_server: bool,
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
        let one_server = nodes.len() == 1;
        let stores = nodes
            .into_iter()
            .map(|n| Box::new(n) as Box<dyn LockStore>)
            .collect();
        Fx {
            one_server,
            ..Self::on(config, stores)
        }
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
            one_server: false,
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
            one_server: false,
            nodes: vec![Box::new(lock_tests::EtcdStore::new(cluster, proxy))],
        }
    }

    /// A short ttl that renewal must keep alive: the longest any store asks for.
    pub(crate) fn short_ttl(&self) -> Duration {
        self.nodes
            .iter()
            .map(|node| node.short_ttl())
            .max()
            .unwrap_or(SHORT_TTL)
    }

    /// How many nodes hold a lock: a topology seen as one store is one node.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn client_with(&self, adjust: impl FnOnce(LockConfig) -> LockConfig) -> LockClient {
        LockClient::new(adjust(self.config.clone())).unwrap()
    }

    /// How many nodes must agree: none in memory, one of one, three of five.
    pub(crate) fn majority(&self) -> usize {
        match self.node_count() {
            0 => 0,
            n => n / 2 + 1,
        }
    }

    /// Whether no node holds a lock whose name starts with `prefix` but `key`'s (if given).
    pub(crate) fn at_most_under(&self, prefix: &str, key: Option<&str>) -> bool {
        self.nodes
            .iter()
            .all(|node| node.holds_none_under(prefix, key))
    }

    /// On how many nodes the lock `key` is held.
    pub(crate) fn holders(&self, key: &str) -> usize {
        self.nodes.iter().filter(|node| node.holds(key)).count()
    }

    /// Spawns `waiter` (an acquire of `key`, which is held) and returns once it waits for a
    /// release: once a store sees it listen (under Redlock a waiter listens at one node, the gate
    /// of its lock's first key); in memory, once its first poll, which makes every attempt in
    /// place, returned `Pending`.
    pub(crate) async fn start_waiter<F>(
        &self,
        key: &str,
        waiter: F,
    ) -> tokio::task::JoinHandle<F::Output>
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
    pub(crate) async fn start_lock_waiter(
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
    pub(crate) async fn hand_off(
        &self,
        held: LockGuard,
        blocked_on: &str,
        waiter: Lock,
    ) -> LockGuard {
        let waiter = self.start_lock_waiter(blocked_on, waiter).await;
        released_to(held.release(), waiter, Duration::from_secs(2)).await
    }

    /// Waits (bounded) until no node has the lock key of `key` any more, then until `b` can take
    /// and release it; returns how long both took.
    pub(crate) async fn time_until_free(&self, key: &str) -> Duration {
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

impl Fx {
    /// The stores' counts of lock requests so far, summed (0 in memory): it stands still while
    /// no request goes out.
    pub(crate) fn lock_requests(&self) -> u64 {
        self.nodes.iter().map(|node| node.lock_requests()).sum()
    }

    /// Script calls (one per lock operation on a Redis node) run so far, summed over the nodes
    /// (0 in memory and where locks are no scripts).
    pub(crate) fn script_calls(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|node| node.script_calls())
            .sum()
    }

    /// How many times `command` ran on the stores (those scripts ran included; 0 where locks are
    /// no Redis commands).
    pub(crate) fn command_calls(&self, command: &str) -> u64 {
        self.nodes
            .iter()
            .filter_map(|node| node.command_calls(command))
            .sum()
    }

    /// One Redis server, where a queued waiter whose subscription is confirmed looks at the
    /// lock's key (`GET` and `PTTL`) instead of asking again with an attempt.
    pub(crate) fn one_server(&self) -> bool {
        self.one_server
    }

    /// Whether the stores run lock scripts, which [`script_calls`](Self::script_calls) counts.
    pub(crate) fn runs_scripts(&self) -> bool {
        self.nodes.iter().any(|node| node.script_calls().is_some())
    }

    /// Waits (bounded) until no node has a lock key of any of `keys`.
    pub(crate) async fn all_free(&self, keys: &[&str]) {
        wait_until_async(Duration::from_secs(2), "released on every node", || {
            keys.iter().all(|key| self.holders(key) == 0)
        })
        .await;
    }

    /// [`all_free`](Self::all_free), then `b` takes and releases each key at once (wait 0).
    pub(crate) async fn free_now(&self, keys: &[&str]) {
        self.all_free(keys).await;
        for key in keys {
            let guard = self.b.lock(*key).acquire().await;
            let guard = guard.unwrap_or_else(|e| panic!("{key} not free: {e}"));
            guard.release().await.unwrap();
        }
    }
}

impl Fx {
    /// How much later than `min_hold` a kept key may be found free: the coarsest store's expiry
    /// granularity (none in memory, which counts milliseconds).
    pub(crate) fn expiry_granularity(&self) -> Duration {
        self.nodes
            .iter()
            .map(|node| node.expiry_granularity())
            .max()
            .unwrap_or_default()
    }
}

/// Lets go with `release` (a guard's release, a leadership's resignation) and returns what
/// `waiter` (from [`Fx::start_lock_waiter`], or a task that answers when it got the lock) got,
/// checking that it got it after the release and less than `within` after it.
pub(crate) async fn released_to<T: Send + 'static>(
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
pub(crate) async fn takes(lock: Lock) {
    lock.acquire().await.unwrap().release().await.unwrap();
}

/// Two keys `<base>:a` < `<base>:b` no other check uses.
pub(crate) fn two_keys(prefix: &str) -> (String, String) {
    let base = unique_key(prefix);
    (format!("{base}:a"), format!("{base}:b"))
}

/// A body that never ends and reports, through the returned flag, that it was dropped.
pub(crate) fn endless_body(
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

/// `client.shutdown()` (which blocks) off the runtime's threads.
pub(crate) async fn shut_down(client: &LockClient) {
    let shutting = client.clone();
    tokio::task::spawn_blocking(move || shutting.shutdown())
        .await
        .unwrap();
}
