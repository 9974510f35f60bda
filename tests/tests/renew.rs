//! Renewal on one Redis node: at scale and its effect on the keys in Redis, in time after a slow
//! acquire, and what it finds: one lock of a batch gone bad fails only itself, and a lock whose
//! key someone else deleted or overwrote is reported lost within a renewal period (the other
//! owner's key left alone).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{FaultProxy, RedisServer, bounded, client, lock_keys, ms, unique_key};

fn get(admin: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(admin).unwrap()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_acquire_still_renews_before_its_deadline() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(
        LockConfig::single(proxy.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1)),
    );
    let ttl = Duration::from_secs(2);
    // Warm up: connect, and load both the extend script (one renewal) and the acquire script.
    let key = unique_key("life:slow-acquire");
    let warm = locks.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    tokio::time::sleep(ms(250)).await;
    assert!(!warm.is_lost());
    warm.release().await.unwrap();

    // 400ms each way: every round trip takes 0.4 ttl, the acquire included (one round trip,
    // fenced or not).
    proxy.set_delay(ms(400));
    let started = Instant::now();
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    eprintln!(
        "acquire through a 800ms round trip took {:?}",
        started.elapsed()
    );
    let lost = tokio::time::timeout(3 * ttl, guard.lost()).await;
    if lost.is_ok() {
        panic!(
            "lost {:?} after a slow acquire (ttl {ttl:?}, round trip 800ms): its first renewal came too late",
            started.elapsed()
        );
    }
    proxy.set_delay(Duration::ZERO);
    guard.release().await.expect("still ours");
}

/// A client's first lock over a slow link (300 ms round trip, default timeouts: 500 ms per
/// response) stays held: its first renewal does not also pay for making the renewal connection
/// and loading the extension script (four round trips, past the lock's validity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_clients_first_lock_over_a_slow_link_is_renewed_in_time() {
    const DELAY: Duration = Duration::from_millis(150);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    proxy.set_delay(DELAY);
    let locks = client(LockConfig::single(proxy.url()));
    let ttl = Duration::from_secs(2);
    let started = Instant::now();
    let guard = locks
        .lock(unique_key("life:cold"))
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    eprintln!(
        "first acquire over a 300ms round trip took {:?}",
        started.elapsed()
    );
    // Three ttls: the first renewal and the ones after it were confirmed in time.
    if tokio::time::timeout(3 * ttl, guard.lost()).await.is_ok() {
        panic!(
            "lost {:?} after a cold client's first acquire (ttl {ttl:?}, round trip 300ms)",
            started.elapsed()
        );
    }
    let renewals = server.command_calls("evalsha") + server.command_calls("set");
    assert!(renewals >= 4, "renewed {renewals} times in three ttls");
    proxy.set_delay(Duration::ZERO);
    guard.release().await.expect("still ours");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_item_in_a_renewal_batch_fails_only_itself() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let ttl = Duration::from_secs(1);
    let (good_key, bad_key) = (unique_key("life:batch-good"), unique_key("life:batch-bad"));
    // Taken together, so their renewals fall into one batch.
    let (good, bad) = tokio::join!(
        locks.lock(&good_key).ttl(ttl).acquire(),
        locks.lock(&bad_key).ttl(ttl).acquire(),
    );
    let (good, bad) = (good.unwrap(), bad.unwrap());
    let mut admin = server.admin();
    let () = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(lock_keys(&bad_key).lock)
        .ignore()
        .cmd("HSET")
        .arg(lock_keys(&bad_key).lock)
        .arg("f")
        .arg("v")
        .ignore()
        .query(&mut admin)
        .unwrap();
    let started = Instant::now();
    bounded(2 * ttl, "the bad lock reported lost", bad.lost()).await;
    eprintln!("WRONGTYPE lock reported lost after {:?}", started.elapsed());
    let good_lost = tokio::time::timeout(3 * ttl, good.lost()).await;
    assert!(
        good_lost.is_err(),
        "the healthy lock was lost {:?} after its batch neighbour went bad",
        started.elapsed()
    );
    good.release()
        .await
        .expect("the healthy lock is still ours");
    assert!(matches!(bad.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test]
async fn externally_deleted_key_is_lost_within_a_renewal_period() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("faults:deleted");
    let ttl = Duration::from_millis(900);

    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let deleted: i64 = redis::cmd("DEL")
        .arg(lock_keys(&key).lock)
        .query(&mut admin)
        .unwrap();
    assert_eq!(deleted, 1, "the lock key was not where expected");
    let at = Instant::now();
    bounded(
        ttl / 3 + Duration::from_secs(1),
        "lost() after DEL",
        guard.lost(),
    )
    .await;
    eprintln!("deleted key: lost after {:?}", at.elapsed());
    assert!(guard.is_lost());
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "got {released:?}"
    );
}

#[tokio::test]
async fn externally_overwritten_key_is_lost_and_not_deleted_by_release() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("faults:overwritten");
    let ttl = Duration::from_millis(900);

    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let () = redis::cmd("SET")
        .arg(lock_keys(&key).lock)
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query(&mut admin)
        .unwrap();
    let at = Instant::now();
    bounded(
        ttl / 3 + Duration::from_secs(1),
        "lost() after SET",
        guard.lost(),
    )
    .await;
    eprintln!("overwritten key: lost after {:?}", at.elapsed());
    assert!(guard.is_lost());
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "got {released:?}"
    );
    assert_eq!(
        get(&mut admin, &lock_keys(&key).lock).as_deref(),
        Some("someone-else"),
        "release deleted or changed another owner's lock"
    );
    // The other owner's lock is respected: contended, not stolen.
    let err = locks
        .lock(&key)
        .acquire()
        .await
        .expect_err("stole the lock");
    assert!(err.is_contended(), "got {err:?}");
}
