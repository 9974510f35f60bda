//! Values out of range, given to a client or a lock (`wait`, `ttl`, `retry_delay`, the timeouts,
//! `renew_interval`): each is a `Config` error naming its field, or works; never a panic or a
//! `Runtime` error. On one Redis node.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{RedisServer, bounded, client, eventually, ms, unique_key};

/// The field a `Config` error names; `None` for any other error.
fn field_of(err: &LockError) -> Option<&'static str> {
    match err {
        LockError::Config { field, .. } => Some(field),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_forever_is_supported_or_a_config_error() {
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(server.url()));
    let key = unique_key("life:wait-max");
    let held = holder.lock(&key).acquire().await.unwrap();
    let task = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(Duration::MAX).acquire().await })
    };
    // Either it fails at once (Config), or it waits: release once it is waiting.
    let waiting = eventually(Duration::from_secs(2), || task.is_finished()).await;
    if !waiting {
        held.release().await.unwrap();
    }
    let result = bounded(Duration::from_secs(10), "wait(MAX)", task)
        .await
        .unwrap();
    eprintln!("wait(Duration::MAX) on a held key: {result:?}");
    match result {
        Ok(guard) => guard.release().await.unwrap(),
        Err(err) => assert_eq!(field_of(&err), Some("wait"), "{err:?}"),
    }
}

#[tokio::test]
async fn a_ttl_redis_rejects_is_a_config_error() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    for ttl in [Duration::MAX, Duration::from_secs(u64::MAX / 1000)] {
        let result = bounded(
            Duration::from_secs(10),
            "acquire",
            locks.lock(unique_key("life:ttl-max")).ttl(ttl).acquire(),
        )
        .await;
        eprintln!("ttl {ttl:?}: {result:?}");
        match result {
            Err(err) => assert_eq!(field_of(&err), Some("ttl"), "ttl {ttl:?}: {err:?}"),
            Ok(_) => panic!("ttl {ttl:?} granted: Redis cannot store it"),
        }
    }
    // 400 days is a valid PX for Redis: it works, or is refused as a Config error on `ttl`.
    let ttl = Duration::from_secs(400 * 86_400);
    let key = unique_key("life:ttl-400d");
    match locks.lock(&key).ttl(ttl).acquire().await {
        Ok(guard) => guard.release().await.unwrap(),
        Err(err) => assert_eq!(field_of(&err), Some("ttl"), "{err:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_delay_is_a_config_error_or_works() {
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let key = unique_key("life:retry-max");
    let _held = holder.lock(&key).acquire().await.unwrap();
    let waiter = match LockClient::new(
        // No jitter: with the default one, whether the first delay overflows is a coin toss.
        LockConfig::single(server.url())
            .retry_delay(Duration::MAX)
            .retry_jitter(0.0),
    ) {
        Err(err) => {
            assert_eq!(field_of(&err), Some("retry_delay"), "{err:?}");
            return;
        }
        Ok(waiter) => waiter,
    };
    let wait = ms(500);
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire",
        waiter.lock(&key).wait(wait).acquire(),
    )
    .await;
    eprintln!(
        "retry_delay(MAX), wait {wait:?} on a held key: {result:?} after {:?}",
        started.elapsed()
    );
    assert!(
        result.as_ref().is_err_and(LockError::is_contended),
        "expected Contended after the wait, got {result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_timeouts_are_config_errors_or_work() {
    let server = RedisServer::start();
    let url = server.url();
    let cases = [
        (
            "connect_timeout",
            LockConfig::single(url.as_str()).connect_timeout(Duration::MAX),
        ),
        (
            "response_timeout",
            LockConfig::single(url.as_str())
                .default_ttl(Duration::MAX)
                .response_timeout(Duration::MAX - Duration::from_secs(1)),
        ),
    ];
    for (field, config) in cases {
        let made =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| LockClient::new(config)));
        let Ok(made) = made else {
            panic!("LockClient::new panicked with a huge {field}");
        };
        let locks = match made {
            Err(err) => {
                assert!(
                    field_of(&err).is_some_and(|f| f == field || f == "default_ttl"),
                    "{field}: {err:?}"
                );
                continue;
            }
            Ok(locks) => locks,
        };
        let result = bounded(
            Duration::from_secs(10),
            field,
            locks
                .lock(unique_key("life:timeouts"))
                .ttl(Duration::from_secs(5))
                .acquire(),
        )
        .await;
        eprintln!("huge {field}: {result:?}");
        match result {
            Ok(guard) => guard.release().await.unwrap(),
            Err(err) => assert!(field_of(&err).is_some(), "huge {field}: {err:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_interval_close_to_the_ttl_is_rejected_or_keeps_the_lock() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(1);
    let config = LockConfig::single(server.url())
        .default_ttl(ttl)
        .renew_interval(ms(990));
    let locks = match LockClient::new(config) {
        Err(err) => {
            assert_eq!(field_of(&err), Some("renew_interval"), "{err:?}");
            return;
        }
        Ok(locks) => locks,
    };
    let key = unique_key("life:renew-990");
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let lost = tokio::time::timeout(3 * ttl, guard.lost()).await;
    eprintln!(
        "renew_interval 990ms, ttl 1s accepted: {}",
        if lost.is_ok() { "lost" } else { "held 3 ttls" }
    );
    assert!(
        lost.is_err(),
        "renew_interval(990ms) was accepted, then the lock was lost"
    );
    guard.release().await.expect("still ours");
}

/// `Lock::min_hold` by the attribute's rule (lock-rules): at most 365 days, as a ttl. Before, two
/// years left the key for two years after the release, and `Duration::MAX` was taken and kept
/// nothing (the key was gone at the release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_past_365_days_is_a_config_error() {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    for too_long in [DAY * 366, DAY * 730, Duration::MAX] {
        let key = unique_key("life:min-hold-long");
        let err = locks
            .lock(&key)
            .min_hold(too_long)
            .acquire()
            .await
            .expect_err("taken");
        assert_eq!(field_of(&err), Some("min_hold"), "{too_long:?}: {err:?}");
        assert!(
            server.keys(&format!("*{key}*")).is_empty(),
            "{too_long:?}: something was written"
        );
    }
    // The bound itself is taken, and kept that long after the release.
    let key = unique_key("life:min-hold-year");
    let guard = locks
        .lock(&key)
        .min_hold(DAY * 365)
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_tests::lock_keys(&key).lock)
        .query(&mut server.admin())
        .unwrap();
    let year_ms = i64::try_from((DAY * 365).as_millis()).unwrap();
    assert!(
        pttl > year_ms - 60_000 && pttl <= year_ms,
        "the key's ttl after the release: {pttl} ms"
    );
}
