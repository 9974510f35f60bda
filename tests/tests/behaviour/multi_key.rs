//! Locks over several keys: all held or none, duplicates merged, and a waiter woken by the
//! release of any of its keys.

use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::wait_until_async;

use super::fixture::{Fx, two_keys};

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
    let guard = fx.a.lock_many([&ka, &ka]).fencing(true).acquire().await;
    let guard = guard.unwrap();
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
