//! Renewal at scale and its effect on the keys in Redis.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisServer, lock_keys, unique_key};

/// 10,000 locks held at once by one client stay held: one driver renews them in pipelined
/// batches, not one task and one round trip per lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_locks_stay_held() {
    let server = RedisServer::start();
    // A burst of 10,000 acquisitions on one connection can take longer than the default 500ms
    // response timeout on a busy 2-core machine; this test is about renewal, not that burst.
    let config = LockConfig::single(server.url()).response_timeout(Duration::from_secs(5));
    let client = LockClient::new(config).unwrap();
    let ns = unique_key("renew:many");
    let ttl = Duration::from_secs(2);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..10_000 {
        let client = client.clone();
        let key = format!("{ns}:{i}");
        tasks.spawn(async move { client.lock(key).ttl(ttl).acquire().await });
    }
    let mut guards = Vec::with_capacity(10_000);
    while let Some(done) = tasks.join_next().await {
        guards.push(done.unwrap().unwrap());
    }
    eprintln!("10,000 acquisitions took {:?}", started.elapsed());
    // Hold for more than two TTLs: every lock needs several renewals.
    let held_since = Instant::now();
    tokio::time::sleep(ttl * 5 / 2).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    assert_eq!(
        lost,
        0,
        "{lost} of 10,000 locks lost after {:?}",
        held_since.elapsed()
    );
    eprintln!(
        "after holding: {} EVALSHA calls",
        server.command_calls("evalsha")
    );
    let release_started = Instant::now();
    for guard in guards {
        guard.release().await.unwrap();
    }
    eprintln!("10,000 releases took {:?}", release_started.elapsed());
    // Only the fencing counters stay (they must, to keep growing); no lock key is left. The
    // pattern is the lock key of the name `<ns>:*`: it matches lock keys only, not counters.
    let left: Vec<String> = server.keys(&lock_keys(&format!("{ns}:*")).lock);
    assert!(
        left.is_empty(),
        "{} lock keys left, e.g. {:?}",
        left.len(),
        left.first()
    );
}

/// The key's TTL in Redis is pushed forward while held, and never lapses.
#[tokio::test]
async fn renewal_extends_the_key_in_redis() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("renew:pttl");
    let ttl = Duration::from_millis(600);
    let guard = client.lock(&key).ttl(ttl).acquire().await.unwrap();
    let mut admin = server.admin();
    let mut lowest = i64::MAX;
    let until = Instant::now() + ttl * 4;
    while Instant::now() < until {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(lock_keys(&key).lock)
            .query(&mut admin)
            .unwrap();
        lowest = lowest.min(pttl);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("lowest PTTL seen over 4 TTLs: {lowest}ms of {ttl:?}");
    // Renewed every ttl/3: the key never came near expiry (and never vanished: PTTL would be -2).
    assert!(lowest > 0, "key lapsed: PTTL {lowest}");
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}
