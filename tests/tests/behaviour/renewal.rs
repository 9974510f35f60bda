//! Renewal and loss: renewal keeps a short lock held on every node, and a lock taken back from
//! its holder is reported lost.

use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::{bounded, unique_key};

use super::fixture::{Fx, shut_down};

pub(crate) async fn renewal_keeps_a_short_lock(fx: &Fx) {
    let key = unique_key("beh:renew");
    let ttl = fx.short_ttl();
    let guard = fx.a.lock(&key).ttl(ttl).acquire().await.unwrap();
    // The behaviour under test is the passing of time: six TTLs.
    tokio::time::sleep(ttl * 6).await;
    assert!(!guard.is_lost());
    // Renewed on every node, not only on the majority that granted it.
    assert_eq!(fx.holders(&key), fx.node_count());
    assert!(matches!(
        fx.b.lock(&key).acquire().await,
        Err(LockError::Contended { .. })
    ));
    guard.release().await.unwrap();
}

/// A lock taken back from under its holder (here by `shutdown()` of the holder's client, which
/// works the same on every backend) is lost: `lost()` resolves, `is_lost()` says so, the release
/// says `Lost`, and the lock is free. (Losing it at the validity deadline, or to a server saying
/// "not yours", is in server_outages.rs, renew.rs, link_faults.rs and redlock.rs.)
pub(crate) async fn release_of_a_lost_lock_is_lost(fx: &Fx) {
    let key = unique_key("beh:lost");
    let own = fx.client_with(|config| config);
    let guard = own.lock(&key).acquire().await.unwrap();
    assert!(!guard.is_lost());
    shut_down(&own).await;
    bounded(Duration::from_secs(5), "loss signalled", guard.lost()).await;
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    assert_eq!(fx.holders(&key), 0);
}
