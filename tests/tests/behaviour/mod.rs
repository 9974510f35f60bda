//! Behaviour every backend must show, run against single-node Redis (default user and a
//! least-privilege ACL user) and the in-memory backend. Each check takes a fresh fixture.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{RedisServer, ServerOptions, lock_keys, unique_key, wait_until_async};

/// Two clients on one backend (two "processes" for Redis; one store, shared, in memory) and the
/// server behind them when there is one.
pub(crate) struct Fx {
    pub(crate) a: LockClient,
    pub(crate) b: LockClient,
    pub(crate) server: Option<RedisServer>,
}

impl Fx {
    pub(crate) fn memory() -> Fx {
        let a = LockClient::new(LockConfig::in_memory()).unwrap();
        Fx {
            b: a.clone(),
            a,
            server: None,
        }
    }

    pub(crate) fn redis() -> Fx {
        let server = RedisServer::start();
        let url = server.url();
        Fx::on(server, &url, |config| config)
    }

    /// Clients hosted on the calling test's own runtime (`LockConfig::runtime`): lock operations
    /// run in place on it instead of hopping to the library's runtime.
    pub(crate) fn redis_hosted() -> Fx {
        let server = RedisServer::start();
        let url = server.url();
        Fx::on(server, &url, |config| {
            config.runtime(tokio::runtime::Handle::current())
        })
    }

    /// A user limited to what the crate needs: its scripts, pub/sub on its channels, keys and
    /// channels under its prefix.
    pub(crate) fn redis_acl() -> Fx {
        let server = RedisServer::start_with(ServerOptions {
            acl_rules: vec![ACL_RULE.to_owned()],
            ..ServerOptions::default()
        });
        let url = server.url_as("locker", "lockpw");
        Fx::on(server, &url, |config| config)
    }

    fn on(server: RedisServer, url: &str, adjust: impl Fn(LockConfig) -> LockConfig) -> Fx {
        let config = || adjust(LockConfig::single(url).retry_delay(Duration::from_millis(50)));
        Fx {
            a: LockClient::new(config()).unwrap(),
            b: LockClient::new(config()).unwrap(),
            server: Some(server),
        }
    }

    /// Waits (bounded) until some client is subscribed to `key`'s release channel, i.e. waiting.
    async fn await_waiter(&self, key: &str) {
        let Some(server) = &self.server else { return };
        let channel = lock_keys(key).channel;
        wait_until_async(Duration::from_secs(5), "the waiter subscribed", || {
            server.subscribers(&channel) > 0
        })
        .await;
    }

    /// Polls (bounded) until `b` can take `key` with no wait, and returns how long that took.
    async fn time_until_free(&self, key: &str, bound: Duration) -> Duration {
        let start = Instant::now();
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

/// The least-privilege ACL user the README documents.
pub(crate) const ACL_RULE: &str = "user locker on >lockpw resetkeys ~lock:* resetchannels &lock:* -@all \
     +evalsha +eval +script|load +subscribe +unsubscribe +ping +select \
     +set +get +del +incr +pexpire +pttl +publish +time";

pub(crate) async fn acquire_release(fx: &Fx) {
    let key = unique_key("beh:basic");
    let guard = fx.a.lock(&key).acquire().await.unwrap();
    assert_eq!(guard.key(), key);
    assert!(guard.fencing_token().is_some());
    assert!(!guard.is_lost());
    if let Some(server) = &fx.server {
        assert_eq!(
            server.keys(&lock_keys("beh:basic*").lock),
            vec![lock_keys(&key).lock]
        );
    }
    guard.release().await.unwrap();
    if let Some(server) = &fx.server {
        assert!(server.keys(&lock_keys("beh:basic*").lock).is_empty());
    }
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
    let waiter = tokio::spawn(async move {
        let guard = b.lock(&k).wait(Duration::from_secs(10)).acquire().await;
        (Instant::now(), guard)
    });
    fx.await_waiter(&key).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (got_at, guard) = waiter.await.unwrap();
    let guard = guard.unwrap();
    assert!(got_at >= released_at);
    eprintln!("hand-off after release: {:?}", got_at - released_at);
    // Woken by the release, not by polling its 10s wait or the 30s TTL.
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
    let took = fx.time_until_free(&key, Duration::from_secs(5)).await;
    eprintln!("free after drop: {took:?}");
    assert!(took < Duration::from_secs(5));
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
    let took = fx.time_until_free(&key, Duration::from_secs(5)).await;
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
    let waiter = tokio::spawn(async move {
        b.lock(&k)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    fx.await_waiter(&key).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    held.release().await.unwrap();
    let took = fx.time_until_free(&key, Duration::from_secs(5)).await;
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
    let took = fx.time_until_free(&key, Duration::from_secs(5)).await;
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

pub(crate) async fn release_of_a_lost_lock_is_lost(fx: &Fx) {
    let key = unique_key("beh:lost");
    let ttl = Duration::from_millis(600);
    let guard = fx.a.lock(&key).ttl(ttl).acquire().await.unwrap();
    let Some(server) = &fx.server else { return };
    let _: () = redis::cmd("DEL")
        .arg(lock_keys(&key).lock)
        .query(&mut server.admin())
        .unwrap();
    let start = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss not signalled");
    eprintln!("loss signalled {:?} after the delete", start.elapsed());
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// Generates one `#[tokio::test]` per behaviour for a fixture constructor.
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
