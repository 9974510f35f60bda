//! The behaviour suite with clients hosted on the test's own runtime (`LockConfig::runtime`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod behaviour;

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{SCHEDULING_SLACK, bounded_blocking};

fn fixture() -> behaviour::Fx {
    let server = lock_tests::RedisServer::start();
    let config = LockConfig::single(server.url()).runtime(tokio::runtime::Handle::current());
    behaviour::Fx::new(config, vec![server])
}

behaviour_tests!(fixture());

#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_runtime_is_refused() {
    let config = LockConfig::in_memory().runtime(tokio::runtime::Handle::current());
    match LockClient::new(config) {
        Err(LockError::Config { field, .. }) => assert_eq!(field, "runtime"),
        other => panic!("expected a config error naming `runtime`, got {other:?}"),
    }
}

/// Once the hosting runtime is gone, lock calls fail with `Runtime` instead of hanging (an
/// in-memory lock taken in place would not be renewed: its renewal driver died with the runtime).
/// A lock held across the runtime's end is still released: in memory that needs no runtime.
#[test]
fn a_dead_hosting_runtime_is_an_error_not_a_hang() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = LockClient::new(LockConfig::in_memory().runtime(rt.handle().clone())).unwrap();
    let held = rt.block_on(async {
        client
            .lock("hosted:dead")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        client.lock("hosted:held").acquire().await.unwrap()
    });
    drop(rt);
    // In memory nothing waits on I/O: both answer within scheduling slack.
    let asked = Instant::now();
    let again = bounded_blocking(
        Duration::from_secs(5),
        "a lock call on a dead runtime",
        move || client.lock("hosted:dead").acquire_blocking(),
    );
    let took = asked.elapsed();
    match again {
        Err(LockError::Runtime { .. }) => {}
        other => panic!("expected a runtime error, got {other:?}"),
    }
    assert!(took <= SCHEDULING_SLACK, "answered after {took:?}");
    let asked = Instant::now();
    let released = bounded_blocking(
        Duration::from_secs(5),
        "the release on a dead runtime",
        move || held.release_blocking(),
    );
    let took = asked.elapsed();
    assert_eq!(released, Ok(()));
    assert!(took <= SCHEDULING_SLACK, "released after {took:?}");
}
