//! One holder at a time: a lock is held on a majority of the nodes and free again once released,
//! a second caller is refused (`Contended`, with how long it waited), and the blocking API works
//! from inside async code.

use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::{unique_key, wait_until_async};

use super::fixture::{Fx, takes};

pub(crate) async fn acquire_release(fx: &Fx) {
    let key = unique_key("beh:basic");
    let guard = fx.a.lock(&key).acquire().await.unwrap();
    assert_eq!(guard.key(), key);
    // A token only where asked for, or where it costs nothing (etcd, in memory): on Redis a
    // lock that does not ask pays for no counter.
    assert_eq!(
        guard.fencing_token().is_some(),
        !fx.runs_scripts(),
        "{guard:?}"
    );
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
