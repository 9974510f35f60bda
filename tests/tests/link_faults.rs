//! Faults of the link between a client and one Redis node that the symmetric proxy faults do not
//! cover: an asymmetric partition (requests delivered, replies lost). Rows of the fault table in
//! `lock-runtime/FAULTS.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::LockError;
use lock_tests::{
    CLEANUP_PAUSE, FaultProxy, KeyEvents, QUICK_REQUEST, RedisServer, SCHEDULING_SLACK, bounded,
    key_exists, lock_keys, quick_client, unique_key, warm_up,
};

/// Replies lost, requests delivered: the acquire lands on Redis but its caller never hears of
/// it. The call must answer `Unavailable` within its bound, and the grant it made must not live
/// on until its ttl (30 s): the cleanup's release goes through the same half-open link, so it
/// lands within the cleanup's longest pause plus one request of the failure, before the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_the_acquire_is_unavailable_and_its_landed_grant_is_released() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick_client(proxy.url());
    let key = unique_key("link:replies-lost");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_millis(500);
    // Connected (scripts loaded) before the partition, so the acquire itself is what is cut.
    warm_up(&locks).await;
    let events = KeyEvents::watch(&server, &lock);
    proxy.set_blackhole_down(true);
    let up_before = proxy.bytes_up();
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire",
        locks.lock(&key).ttl(ttl).wait(wait).acquire(),
    )
    .await;
    let failed = Instant::now();
    let took = failed - started;
    eprintln!("acquire (wait {wait:?}) with its replies lost: {result:?} after {took:?}");
    assert!(
        matches!(&result, Err(LockError::Unavailable { causes, .. }) if !causes.is_empty()),
        "{result:?}"
    );
    assert!(
        took <= wait + QUICK_REQUEST + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    // The fault as meant: the request went through and made a grant nobody was told of.
    assert!(proxy.bytes_up() > up_before, "no request reached the proxy");
    let landed = events
        .wait_first_after(
            &lock,
            &["set"],
            started,
            Duration::from_secs(1),
            "the acquire's grant",
        )
        .await;
    assert!(
        landed.at <= failed,
        "the grant landed only after the call answered"
    );

    // The link heals two seconds after the call failed; the grant is released (a `del`, not its
    // ttl) within the cleanup's longest pause plus one request of the failure, before the heal.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let healed = Instant::now();
    proxy.set_blackhole_down(false);
    let removed = events
        .wait_first_after(
            &lock,
            &["del", "expired", "evicted"],
            landed.at,
            Duration::from_secs(5),
            "the landed grant's removal",
        )
        .await;
    eprintln!(
        "landed {:?} after the call started; removed ({}) {:?} after the landing, {} the heal",
        landed.at - started,
        removed.event,
        removed.at - landed.at,
        if removed.at < healed {
            "before"
        } else {
            "after"
        }
    );
    assert_eq!(removed.event, "del", "the landed grant was not released");
    let bound = CLEANUP_PAUSE + QUICK_REQUEST + SCHEDULING_SLACK;
    assert!(
        removed.at <= failed + bound,
        "released {:?} after the call failed, past {bound:?}",
        removed.at.saturating_duration_since(failed)
    );

    // The held replies came in after the heal: the connection still pairs replies with their
    // requests, so the next acquire and release through it are right.
    let guard = bounded(
        Duration::from_secs(5),
        "acquire after the heal",
        locks.lock(&key).ttl(ttl).acquire(),
    )
    .await
    .expect("acquire after the heal");
    assert!(key_exists(&server, &lock), "granted, but no key");
    guard.release().await.expect("release after the heal");
    assert!(!key_exists(&server, &lock), "released, but the key is left");
}
