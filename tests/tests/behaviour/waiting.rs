//! Waiting for a held lock: a waiter gets it right after the release (woken by it, not by its
//! retry), and a waiter whose future is dropped keeps nothing.

use std::time::Duration;

use lock_tests::unique_key;

use super::fixture::Fx;

pub(crate) async fn waiter_gets_lock_right_after_release(fx: &Fx) {
    let key = unique_key("beh:handoff");
    let held = fx.a.lock(&key).acquire().await.unwrap();
    let waiter = fx.b.lock(&key).wait(Duration::from_secs(10));
    let guard = fx.hand_off(held, &key, waiter).await;
    guard.release().await.unwrap();
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
