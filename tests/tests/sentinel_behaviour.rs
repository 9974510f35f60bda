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
kind_tests!(fixture());

/// `min_replicas(1)`: when `acquire` returns, the lock key is already on the replica (`WAIT`
/// counted it); renewals are checked the same way and keep a short lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_grants_are_on_the_replica_when_acquire_returns() {
    let _turn = behaviour::turn_beside_others().await;
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

/// `min_replicas(1)` and a fair hand-off: the waiter the lock is handed to still has the grant
/// acknowledged by a replica before it is granted, so with the replica frozen it is not (taken
/// from the release's message alone, it would be).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_fair_hand_offs_wait_for_the_replica() {
    // Alone: it freezes the shared replica.
    let _turn = behaviour::turn_alone().await;
    let set = SentinelSet::shared();
    let config = LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls())
        .min_replicas(1)
        .response_timeout(std::time::Duration::from_millis(300));
    let client = lock_runtime::LockClient::new(config).unwrap();
    let key = lock_tests::unique_key("sentinel:fair-replicated");
    let held = client.lock(&key).fair(true).acquire().await.unwrap();
    let waiter = tokio::spawn(
        client
            .lock(&key)
            .fair(true)
            .wait(std::time::Duration::from_secs(2))
            .acquire(),
    );
    lock_tests::until_queued(&client, &key, 1).await;
    set.replica().freeze();
    let released = held.release().await;
    let handed =
        lock_tests::bounded(std::time::Duration::from_secs(20), "the waiter", waiter).await;
    set.replica().thaw();
    released.unwrap();
    match handed.unwrap() {
        Err(lock_runtime::LockError::Unavailable { causes, .. }) => {
            assert!(causes[0].detail.contains("min_replicas"), "{causes:?}");
        }
        other => panic!("expected Unavailable (no replica acknowledged), got {other:?}"),
    }
}

/// No sentinel answers: `Unavailable` saying no sentinel named the master, never `Contended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sentinels_are_unavailable_never_contended() {
    let urls = [format!("redis://127.0.0.1:{}/", lock_tests::free_port())];
    let config = LockConfig::sentinel("nobody", urls)
        .connect_timeout(std::time::Duration::from_millis(200))
        .response_timeout(std::time::Duration::from_millis(200));
    let client = lock_runtime::LockClient::new(config).unwrap();
    match client
        .lock(lock_tests::unique_key("sentinel:down"))
        .acquire()
        .await
    {
        Err(lock_runtime::LockError::Unavailable { causes, .. }) => {
            assert!(
                causes[0].detail.contains("no sentinel named the master"),
                "{causes:?}"
            );
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("granted by no server"),
    }
    // A sentinel that knows no master of that name says so.
    let set = SentinelSet::shared();
    let client =
        lock_runtime::LockClient::new(LockConfig::sentinel("nobody", set.sentinel_urls())).unwrap();
    match client
        .lock(lock_tests::unique_key("sentinel:unknown"))
        .acquire()
        .await
    {
        Err(lock_runtime::LockError::Unavailable { causes, .. }) => {
            assert!(
                causes[0].detail.contains("knows no master named nobody"),
                "{causes:?}"
            );
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("granted for an unknown master"),
    }
}

/// A password-protected master: the password in the sentinel URLs authenticates to the master
/// (sentinels are asked without it); a wrong one is `Unavailable` with `Auth` at once, and the
/// password shows in no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_password_is_the_masters() {
    let set = SentinelSet::start_with_password(Some("s3cret-pw"));
    let urls = |pass: &str| -> Vec<String> {
        set.sentinels
            .iter()
            .map(|s| format!("redis://:{pass}@127.0.0.1:{}/", s.port()))
            .collect()
    };
    let good = LockConfig::sentinel(SentinelSet::MASTER_NAME, urls("s3cret-pw"));
    let client = lock_runtime::LockClient::new(good).unwrap();
    let key = lock_tests::unique_key("sentinel:auth");
    let guard = client.lock(&key).acquire().await.unwrap();
    assert_eq!(
        set.master().keys(&lock_tests::lock_keys(&key).lock).len(),
        1
    );
    guard.release().await.unwrap();

    let bad = LockConfig::sentinel(SentinelSet::MASTER_NAME, urls("wrong-pw"));
    let client = lock_runtime::LockClient::new(bad).unwrap();
    let started = std::time::Instant::now();
    let wait = std::time::Duration::from_secs(3);
    match client.lock(&key).wait(wait).acquire().await {
        Err(err @ lock_runtime::LockError::Unavailable { .. }) => {
            let lock_runtime::LockError::Unavailable { causes, .. } = &err else {
                unreachable!()
            };
            assert_eq!(
                causes[0].kind,
                lock_runtime::FailureKind::Auth,
                "{causes:?}"
            );
            assert!(!err.to_string().contains("wrong-pw"), "{err}");
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("granted with a wrong password"),
    }
    assert!(started.elapsed() < wait, "not retried for the wait");
}

/// `min_replicas(1)` with the replica frozen: a grant's `WAIT` blocks on the master until its
/// timeout (half the response timeout: 1 s here), on a connection of its own, so a release of
/// another lock made meanwhile answers while that `WAIT` is still blocked. On the connection
/// every lock shares, the release queued behind the `WAIT` and answered only after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_a_grant_waiting_for_the_replica_holds_up_no_other_request() {
    use std::time::Duration;
    let _turn = behaviour::turn_beside_others().await;
    let set = SentinelSet::shared();
    let config = LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls())
        .min_replicas(1)
        .response_timeout(Duration::from_secs(2));
    let client = lock_runtime::LockClient::new(config).unwrap();
    let held = client
        .lock(lock_tests::unique_key("sentinel:wait-held"))
        .acquire()
        .await
        .unwrap();
    let blocked = || {
        set.master().info("clients").lines().any(|l| {
            l.strip_prefix("blocked_clients:")
                .is_some_and(|n| n.trim() != "0")
        })
    };
    assert!(!blocked(), "a client is blocked on the master already");
    set.replica().freeze();
    let waiting = tokio::spawn(
        client
            .lock(lock_tests::unique_key("sentinel:wait-blocked"))
            .acquire(),
    );
    // The grant's `WAIT` is blocked (it waits 1 s for the frozen replica).
    let start = std::time::Instant::now();
    while !blocked() && start.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waited = blocked();
    let released = held.release().await;
    let still_blocked = blocked();
    set.replica().thaw();
    assert!(waited, "the grant's WAIT never blocked on the master");
    released.unwrap();
    assert!(
        still_blocked,
        "the release answered only once the grant's WAIT had returned"
    );
    if let Ok(guard) = lock_tests::bounded(Duration::from_secs(5), "the waiting grant", waiting)
        .await
        .unwrap()
    {
        guard.release().await.unwrap();
    }
}
