//! The process-wide client: `init` once, failures leave the process uninitialised, bad values
//! name their field. One test, because the global client is per process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lock_runtime::{Lock, LockClient, LockConfig, LockError};
use lock_tests::config_field;

#[tokio::test]
async fn init_once_and_config_errors_name_the_field() {
    assert!(matches!(
        Lock::new("init:before").acquire().await,
        Err(LockError::NotInitialized)
    ));
    assert!(matches!(
        Lock::new("init:before").acquire_blocking(),
        Err(LockError::NotInitialized)
    ));

    // A failed init leaves the process uninitialised...
    assert_eq!(
        config_field(lock_runtime::init(LockConfig::single("http://127.0.0.1/"))),
        "url"
    );
    assert_eq!(
        config_field(lock_runtime::init(
            LockConfig::in_memory().default_ttl(Duration::ZERO)
        )),
        "default_ttl"
    );
    assert!(matches!(
        Lock::new("init:after-failure").acquire().await,
        Err(LockError::NotInitialized)
    ));
    // ... so a later valid one works, and a second successful one is refused.
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    assert!(matches!(
        lock_runtime::init(LockConfig::in_memory()),
        Err(LockError::AlreadyInitialized)
    ));
    let guard = Lock::new("init:ok").acquire().await.unwrap();
    guard.release().await.unwrap();

    // Per-lock values are checked when the lock is taken.
    assert_eq!(
        config_field(Lock::new("init:ttl").ttl(Duration::ZERO).acquire().await),
        "ttl"
    );
    assert_eq!(config_field(Lock::new("").acquire().await), "key");
    // `min_hold` must fit in `max_hold` (per lock or the config's default) and keeps exclusive
    // locks only; zero asks for nothing, so it clashes with nothing.
    let min_hold = Lock::new("init:minhold").min_hold(Duration::from_secs(2));
    assert_eq!(
        config_field(min_hold.max_hold(Duration::from_secs(1)).acquire().await),
        "min_hold"
    );
    let capped = LockClient::new(LockConfig::in_memory().max_hold(Duration::from_secs(1))).unwrap();
    let min_hold = capped.lock("init:minhold").min_hold(Duration::from_secs(2));
    assert_eq!(config_field(min_hold.acquire().await), "min_hold");
    for kind in [
        Lock::new("init:minhold").fair(true),
        Lock::new("init:minhold").shared(true),
        Lock::new("init:minhold").permits(2),
    ] {
        let kind = kind.min_hold(Duration::from_secs(1));
        assert_eq!(config_field(kind.acquire().await), "min_hold");
    }
    let zero = Lock::new("init:minhold")
        .shared(true)
        .min_hold(Duration::ZERO);
    zero.acquire().await.unwrap().release().await.unwrap();
    for ttl in [
        Duration::from_millis(5),
        Duration::from_secs(400 * 24 * 3600),
    ] {
        assert_eq!(
            config_field(Lock::new("init:ttl").ttl(ttl).acquire().await),
            "ttl"
        );
    }
    // A per-lock ttl shorter than the renew interval is renewed before its validity runs out
    // anyway (the renewal is due one request, at most half the ttl, before the deadline).
    let client =
        LockClient::new(LockConfig::in_memory().renew_interval(Duration::from_millis(200)))
            .unwrap();
    let short = client
        .lock("init:short")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    // The behaviour under test is the passing of time: four ttls.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!short.is_lost());
    short.release().await.unwrap();
    for (config, expected) in [
        (
            LockConfig::single("redis://127.0.0.1:6379/notanumber"),
            "url",
        ),
        (LockConfig::redlock(Vec::<String>::new()), "urls"),
        (
            LockConfig::redlock(["redis://127.0.0.1:1/", "redis://127.0.0.1:1/"]),
            "urls",
        ),
        (
            LockConfig::in_memory().retry_delay(Duration::ZERO),
            "retry_delay",
        ),
        (LockConfig::in_memory().drift_factor(-0.1), "drift_factor"),
        (
            LockConfig::in_memory().renew_interval(Duration::from_secs(31)),
            "renew_interval",
        ),
    ] {
        assert_eq!(config_field(LockClient::new(config)), expected);
    }
}
