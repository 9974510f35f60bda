//! The behaviour suite with clients hosted on the test's own runtime (`LockConfig::runtime`), and
//! what only a hosted client meets: a runtime it cannot use, and its runtime gone (with a lock
//! held, which then expires by its ttl).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod behaviour;

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    KeyEvents, RedisServer, SCHEDULING_SLACK, bounded_blocking, client, lock_keys, ms, unique_key,
    wait_until,
};

fn fixture() -> behaviour::Fx {
    let server = RedisServer::start();
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

/// The runtime hosting a client shut down while it holds a lock: renewal stops with it, so the
/// key expires by its ttl after its last write (a keyspace `expired` event, not before that
/// write + ttl - slack, not after it + slack) and nothing renews it afterwards; another client then
/// gets it within its retry delay (100 ms, jitter 1.5x) + slack of the expiry. The dead client's
/// lock calls and the guard's release answer with an error within one request timeout
/// (connect 1 s + response 500 ms, the defaults) + slack: never a hang, never `Ok`.
#[test]
fn runtime_shut_down_mid_hold_frees_the_lock_by_its_ttl() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let hosted = client(LockConfig::single(server.url()).runtime(rt.handle().clone()));
    let key = unique_key("table:runtime-gone");
    let lock = lock_keys(&key).lock;
    let events = KeyEvents::watch(&server, &lock);
    let ttl = Duration::from_secs(1);
    let request = ms(1500);
    let guard = rt.block_on(hosted.lock(&key).ttl(ttl).acquire()).unwrap();
    drop(rt);
    let dropped = Instant::now();
    let other = client(LockConfig::single(server.url()));
    let taken = {
        let key = key.clone();
        bounded_blocking(ttl * 3, "the other client's acquire", move || {
            let taken = other
                .lock(&key)
                .ttl(ttl)
                .wait(ttl + Duration::from_secs(2))
                .acquire_blocking();
            (taken, Instant::now())
        })
    };
    let (taken, taken_at) = taken;
    let removal = ["del", "expired", "evicted"];
    let since = dropped - Duration::from_secs(60);
    wait_until(SCHEDULING_SLACK, "the removal heard", || {
        events.first_after(&lock, &removal, since).is_some()
    });
    let history = events.of(&lock);
    // The dead client's key: its writes (grant, renewals), then its removal. (A notification is
    // heard a moment after the write, so the grant may be heard after `dropped`.)
    let end = history
        .iter()
        .position(|e| removal.contains(&e.event.as_str()))
        .unwrap_or_else(|| panic!("the lock was never freed: {history:?}"));
    let removed = &history[end];
    let last_write = history[..end]
        .iter()
        .rfind(|e| e.event == "set" || e.event == "expire")
        .unwrap_or_else(|| panic!("no grant seen: {history:?}"))
        .at;
    eprintln!(
        "hosting runtime gone mid-hold: {} {:?} after the last renewal; the other client {:?} \
         {:?} after that",
        removed.event,
        removed.at - last_write,
        taken.as_ref().map(drop),
        taken_at.saturating_duration_since(removed.at)
    );
    assert!(
        last_write <= dropped + SCHEDULING_SLACK,
        "renewed after its runtime was gone: {history:?}"
    );
    assert_eq!(removed.event, "expired", "{history:?}");
    assert!(
        removed.at + SCHEDULING_SLACK >= last_write + ttl,
        "freed {:?} after its last write, before its ttl",
        removed.at - last_write
    );
    assert!(
        removed.at <= last_write + ttl + SCHEDULING_SLACK,
        "freed {:?} after its last write, past its ttl",
        removed.at - last_write
    );
    assert!(
        taken_at <= removed.at + ms(150) + SCHEDULING_SLACK,
        "taken {:?} after the key expired",
        taken_at.saturating_duration_since(removed.at)
    );
    // The dead client answers, with an error.
    let asked = Instant::now();
    let again = {
        let (hosted, key) = (hosted.clone(), unique_key("table:runtime-gone-again"));
        bounded_blocking(request * 2, "a lock call on a dead runtime", move || {
            hosted.lock(&key).acquire_blocking()
        })
    };
    let took = asked.elapsed();
    assert!(
        matches!(again, Err(LockError::Runtime { .. })),
        "{:?}",
        again.map(drop)
    );
    assert!(
        took <= request + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    let asked = Instant::now();
    let released = bounded_blocking(request * 2, "the release on a dead runtime", move || {
        guard.release_blocking()
    });
    let took = asked.elapsed();
    eprintln!("dead runtime: lock call and release answered, release {released:?} in {took:?}");
    assert!(released.is_err(), "released Ok on a dead runtime");
    assert!(
        took <= request + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    taken
        .expect("the lock of a dead runtime is freed by its ttl")
        .release_blocking()
        .unwrap();
}
