//! Waiting for a held lock: no polling storm, a crowd of waiters served without overlap, and
//! wake-ups that survive a lost notification connection (reset by the proxy, or killed by
//! `CLIENT KILL`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    FaultProxy, RedisServer, await_waiter, bounded, client, lock_keys, unique_key, wait_until_async,
};

/// A waiter on a lock that stays held sleeps between attempts (jittered backoff up to 8x
/// `retry_delay`, never past the holder's TTL) instead of polling: a 3s wait costs a handful of
/// attempts, not hundreds.
#[tokio::test]
async fn waiting_is_not_a_polling_storm() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("contention:storm");
    let held = client.lock(&key).acquire().await.unwrap();
    let before = server.command_calls("evalsha");
    let wait = Duration::from_secs(3);
    match client.lock(&key).wait(wait).acquire().await {
        Err(LockError::Contended { waited, .. }) => assert!(waited >= wait),
        other => panic!("expected Contended, got {other:?}"),
    }
    let attempts = server.command_calls("evalsha") - before;
    eprintln!("attempts during a 3s wait: {attempts}");
    // 100ms doubling to 800ms, jittered: about 7; a 10ms poll would be 300.
    assert!(attempts <= 15, "{attempts} attempts in 3s");
    held.release().await.unwrap();
}

/// 8 waiters, one holder releasing 40 times: every grant goes to someone, nobody is starved into
/// an error within the generous wait, and grants never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_waiters_gets_every_grant_without_overlap() {
    let server = RedisServer::start();
    let key = unique_key("contention:crowd");
    let inside = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = LockClient::new(LockConfig::single(server.url())).unwrap();
        let (key, inside, grants) = (key.clone(), Arc::clone(&inside), Arc::clone(&grants));
        tasks.spawn(async move {
            for _ in 0..5 {
                let guard = client
                    .lock(&key)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await?;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                grants.fetch_add(1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    assert_eq!(grants.load(Ordering::SeqCst), 40);
}

/// The waiter's connections (commands and release notifications) are cut while it waits: the
/// release it misses is made up for by its backoff, so it still gets the lock, well within `wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notification_connection_does_not_strand_a_waiter() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = LockClient::new(LockConfig::single(server.url())).unwrap();
    let waiter = LockClient::new(LockConfig::single(proxy.url())).unwrap();
    let key = unique_key("contention:cut");
    let held = holder.lock(&key).acquire().await.unwrap();
    let channel = lock_keys(&key).channel;
    let k = key.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .lock(&k)
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    wait_until_async(Duration::from_secs(5), "the waiter subscribed", || {
        server.subscribers(&channel) > 0
    })
    .await;
    proxy.cut_all();
    let released_at = Instant::now();
    held.release().await.unwrap();
    let guard = waiting.await.unwrap().unwrap();
    eprintln!(
        "waiter got the lock {:?} after the release",
        released_at.elapsed()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_of_the_notification_connection_does_not_strand_a_waiter() {
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(server.url()));
    let key = unique_key("table:client-kill");
    let held = holder.lock(&key).acquire().await.unwrap();
    let wait = Duration::from_secs(5);
    let started = Instant::now();
    let task = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(wait).acquire().await })
    };
    await_waiter(&server, &key).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.admin())
        .unwrap();
    assert!(killed >= 1, "no pubsub connection killed");
    held.release().await.unwrap();
    let result = bounded(Duration::from_secs(15), "waiter", task)
        .await
        .unwrap();
    let took = started.elapsed();
    eprintln!(
        "notification connection killed: waiter {:?} after {took:?}",
        result.as_ref().map(drop)
    );
    assert!(took <= wait, "answered after {took:?}");
    result
        .expect("the waiter gets the lock")
        .release()
        .await
        .unwrap();
}
