//! `inspect` and `force_release`: what another client sees of a held lock, and a lock freed
//! whoever holds it.

use std::time::{Duration, Instant};

use lock_runtime::LockError;
use lock_tests::{SCHEDULING_SLACK, bounded, unique_key, wait_until_async};

use super::fixture::Fx;

/// `inspect` shows a held lock (time to live within its ttl, its fencing token, one holder, every
/// node's view) and nothing for a free one; `force_release` frees a lock whoever holds it: the
/// holder sees it lost at its next renewal, and a waiter is woken at once.
pub(crate) async fn inspect_and_force_release(fx: &Fx) {
    let key = unique_key("beh:inspect");
    assert_eq!(fx.b.inspect(&key).await.unwrap(), None);
    let ttl = Duration::from_secs(3);
    let guard = fx.a.lock(&key).ttl(ttl).acquire().await.unwrap();
    wait_until_async(Duration::from_secs(2), "the lock on every node", || {
        fx.holders(&key) == fx.node_count()
    })
    .await;
    let info = fx.b.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.key, key);
    assert_eq!(info.holders, 1);
    assert!(
        info.remaining.is_some_and(|r| r <= ttl && r > ttl / 2),
        "{info:?}"
    );
    // Redis keeps one fence counter per server, not a token per lock: none to show. etcd (the
    // key's revision) and memory know the holder's.
    if fx.runs_scripts() {
        assert_eq!(info.fencing_token, None, "{info:?}");
    } else {
        assert_eq!(info.fencing_token, guard.fencing_token());
    }
    assert_eq!(info.nodes.len(), fx.node_count().max(1));
    assert!(info.nodes.iter().all(|n| n.held), "{info:?}");

    let waiter = {
        let (b, k) = (fx.b.clone(), key.clone());
        fx.start_waiter(&key, async move {
            b.lock(&k).wait(Duration::from_secs(10)).acquire().await
        })
        .await
    };
    let forced = Instant::now();
    assert!(fx.b.force_release(&key).await.unwrap());
    let taken = bounded(Duration::from_secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    // Woken by the forced release, not by its retry delay.
    assert!(
        forced.elapsed() < Duration::from_secs(2),
        "{:?}",
        forced.elapsed()
    );
    // At its next renewal: within one renewal period (ttl / 3) + one request timeout (every
    // fixture's default, connect 1 s + response 500 ms) + slack of the forced release.
    let bound = ttl / 3 + Duration::from_millis(1500) + SCHEDULING_SLACK;
    bounded(bound, "the holder sees the loss", guard.lost()).await;
    let lost_after = forced.elapsed();
    assert!(
        lost_after <= bound,
        "lost {lost_after:?} after the forced release (bound {bound:?})"
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    taken.release().await.unwrap();
    // Redlock's release answers once a majority let go; the slower nodes follow.
    fx.all_free(&[&key]).await;
    assert!(!fx.b.force_release(&key).await.unwrap());
    assert_eq!(fx.b.inspect(&key).await.unwrap(), None);
}
