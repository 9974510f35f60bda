//! The behaviour suite on a Sentinel set (master, replica, 3 sentinels; one set for this binary).

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::LockConfig;
use lock_tests::SentinelSet;

fn fixture() -> behaviour::Fx {
    let set = SentinelSet::shared();
    behaviour::Fx::on(
        LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls()),
        vec![Box::new(set)],
    )
}

behaviour_tests!(fixture());

/// `min_replicas(1)`: when `acquire` returns, the lock key is already on the replica (`WAIT`
/// counted it); renewals are checked the same way and keep a short lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_grants_are_on_the_replica_when_acquire_returns() {
    let _turn =
        behaviour::turn("min_replicas_grants_are_on_the_replica_when_acquire_returns").await;
    let set = SentinelSet::shared();
    let config =
        LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls()).min_replicas(1);
    let client = lock_runtime::LockClient::new(config).unwrap();
    let key = lock_tests::unique_key("sentinel:replicated");
    let lock = lock_tests::lock_keys(&key).lock;
    let ttl = std::time::Duration::from_millis(600);
    let guard = client.lock(&key).ttl(ttl).acquire().await.unwrap();
    assert_eq!(set.replica().keys(&lock), [lock.as_str()]);
    tokio::time::sleep(ttl * 3).await;
    assert!(!guard.is_lost(), "renewed with replica acknowledgements");
    guard.release().await.unwrap();
}
