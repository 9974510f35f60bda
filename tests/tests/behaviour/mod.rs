//! Behaviour every backend must show. A backend's test file builds its fixture with [`Fx::new`]
//! and calls `behaviour_tests!(fixture)`, which makes one test of every check: the list in that
//! macro is the only one, and a check missing from it is dead code, which is denied here.

#![deny(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{RedisServer, lock_keys, unique_key, wait_until_async};

/// Between two attempts a waiter sleeps at least half of this (jitter 0.5), unless a release
/// wakes it: long, so that a hand-off within a second can only be a wake-up.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// Two clients on one backend (two "processes" for Redis; one client, cloned, in memory, where
/// clients share nothing) and the Redis nodes behind them, if any.
pub(crate) struct Fx {
    pub(crate) a: LockClient,
    pub(crate) b: LockClient,
    /// What `a` and `b` were made from, for a check that needs a client of its own.
    config: LockConfig,
    /// None in memory, one node, or the Redlock masters.
    pub(crate) nodes: Vec<RedisServer>,
}

impl Fx {
    /// `config` with [`RETRY_DELAY`]. In memory (no `nodes`), it must be hosted on the test's
    /// runtime: a waiter's first poll then runs its attempts in place, which is how
    /// [`start_waiter`](Self::start_waiter) knows it waits.
    pub(crate) fn new(config: LockConfig, nodes: Vec<RedisServer>) -> Fx {
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

    fn client_with(&self, adjust: impl FnOnce(LockConfig) -> LockConfig) -> LockClient {
        LockClient::new(adjust(self.config.clone())).unwrap()
    }

    /// How many nodes must agree: none in memory, one of one, three of five.
    fn majority(&self) -> usize {
        if self.nodes.is_empty() {
            0
        } else {
            self.nodes.len() / 2 + 1
        }
    }

    /// On how many nodes the lock key of `key` exists.
    fn holders(&self, key: &str) -> usize {
        let lock = lock_keys(key).lock;
        self.nodes
            .iter()
            .filter(|node| node.keys(&lock) == [lock.as_str()])
            .count()
    }

    /// Spawns `waiter` (an acquire of `key`, which is held) and returns once it waits for a
    /// release: with Redis, once every node has its subscription to the release channel; in
    /// memory, once its first poll, which makes every attempt in place, returned `Pending`.
    async fn start_waiter<F>(&self, key: &str, waiter: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
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
        let waiting = tokio::spawn(waiter);
        let channel = lock_keys(key).channel;
        wait_until_async(
            Duration::from_secs(5),
            "the waiter subscribed on every node",
            || self.nodes.iter().all(|node| node.subscribers(&channel) > 0),
        )
        .await;
        waiting
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
    let all = lock_keys("beh:basic*").lock;
    for node in &fx.nodes {
        let found = node.keys(&all);
        assert!(
            found.is_empty() || found == [lock_keys(&key).lock],
            "{found:?}"
        );
    }
    assert!(fx.holders(&key) >= fx.majority());
    guard.release().await.unwrap();
    // Released on a majority when `release` returns, and soon on every node.
    assert!(fx.holders(&key) <= fx.nodes.len() - fx.majority());
    wait_until_async(Duration::from_secs(2), "released on every node", || {
        fx.nodes.iter().all(|node| node.keys(&all).is_empty())
    })
    .await;
    // Free again: the next acquisition succeeds at once.
    fx.b.lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
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
    let b = fx.b.clone();
    let k = key.clone();
    let waiter = fx
        .start_waiter(&key, async move {
            let guard = b.lock(&k).wait(Duration::from_secs(10)).acquire().await;
            (Instant::now(), guard)
        })
        .await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (got_at, guard) = waiter.await.unwrap();
    let guard = guard.unwrap();
    assert!(got_at >= released_at);
    eprintln!("hand-off after release: {:?}", got_at - released_at);
    // Woken by the release: its next attempt was due 2.5s or more later (RETRY_DELAY).
    assert!(got_at - released_at < Duration::from_secs(2));
    guard.release().await.unwrap();
}

pub(crate) async fn renewal_keeps_a_short_lock(fx: &Fx) {
    let key = unique_key("beh:renew");
    let ttl = Duration::from_millis(500);
    let guard = fx.a.lock(&key).ttl(ttl).acquire().await.unwrap();
    // The behaviour under test is the passing of time: six TTLs.
    tokio::time::sleep(ttl * 6).await;
    assert!(!guard.is_lost());
    // Renewed on every node, not only on the majority that granted it.
    assert_eq!(fx.holders(&key), fx.nodes.len());
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
    let shutting = own.clone();
    tokio::task::spawn_blocking(move || shutting.shutdown())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss not signalled");
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    assert_eq!(fx.holders(&key), 0);
}

/// One `#[tokio::test]` per check, each with a fresh `$fixture`. The only list of the checks.
#[macro_export]
macro_rules! behaviour_tests {
    ($fixture:expr) => {
        behaviour_tests!(@each $fixture;
            acquire_release, contention_error_and_waited, waiter_gets_lock_right_after_release,
            renewal_keeps_a_short_lock, dropped_guard_frees_promptly, cancelled_future_frees_promptly,
            cancelled_waiter_keeps_nothing, panic_frees, fencing_tokens_increase, blocking_api_inside_async_code,
            release_of_a_lost_lock_is_lost);
    };
    (@each $fixture:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fx = $fixture;
                behaviour::$name(&fx).await;
            }
        )*
    };
}
