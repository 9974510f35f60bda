//! `wait` is a bound: whatever the servers do, an acquire answers within its wait plus one request
//! timeout (`connect_timeout + response_timeout`), also when its last attempt's outcome is unknown
//! and when one attempt takes several requests (Redlock's fence write-back, `min_replicas`).
//!
//! Most tests stall the link after the connection is made (a blackhole: requests are read and
//! held, nothing is refused), prove the stalled request reached the proxy, and measure the call;
//! the last two freeze a node (SIGSTOP) under waiters: a single node, and one of five Redlock
//! nodes under ten waiters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    FaultProxy, RedisMasters, RedisServer, await_waiter, bounded, client, ms, unique_key,
    wait_until, warm_up,
};

const CONNECT: Duration = Duration::from_millis(100);
const RESPONSE: Duration = Duration::from_secs(1);
/// Timer and scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(250);

/// A client of `config` with this file's timeouts ([`CONNECT`], [`RESPONSE`]), so its bound is
/// wait + `CONNECT + RESPONSE`, and a 50 ms retry delay.
fn timed_client(config: LockConfig) -> LockClient {
    LockClient::new(
        config
            .connect_timeout(CONNECT)
            .response_timeout(RESPONSE)
            .retry_delay(Duration::from_millis(50)),
    )
    .expect("valid lock config")
}

/// Makes one lock call so that the client's connections are up, then stalls every proxy and
/// returns their byte counts at the stall.
async fn connected_then_stalled(locks: &LockClient, proxies: &[&FaultProxy]) -> Vec<u64> {
    warm_up(locks).await;
    proxies
        .iter()
        .map(|p| {
            p.set_blackhole(true);
            p.bytes_up()
        })
        .collect()
}

/// Acquires `key` with `wait` and returns how long the call took and what it answered, after
/// checking that the stalled requests reached the proxies (the stall was what the call met).
async fn timed_acquire(
    locks: &LockClient,
    key: &str,
    wait: Duration,
    proxies: &[&FaultProxy],
    before: &[u64],
) -> (Duration, Result<(), LockError>) {
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(30),
        "stalled acquire",
        locks
            .lock(key)
            .ttl(Duration::from_secs(10))
            .wait(wait)
            .acquire(),
    )
    .await
    .map(drop);
    let took = started.elapsed();
    for (proxy, before) in proxies.iter().zip(before) {
        assert!(
            proxy.bytes_up() > *before,
            "the acquire never reached the stalled link"
        );
    }
    (took, result)
}

fn assert_unavailable_within(
    what: &str,
    took: Duration,
    result: &Result<(), LockError>,
    wait: Duration,
) {
    let bound = wait + CONNECT + RESPONSE + SLACK;
    eprintln!("{what}: {result:?} after {took:?} (bound {bound:?})");
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{what}: expected Unavailable, got {result:?}"
    );
    assert!(
        took <= bound,
        "{what}: answered after {took:?}, bound {bound:?}"
    );
}

#[tokio::test]
async fn a_stalled_single_node_answers_within_wait_plus_one_request_timeout() {
    let server = RedisServer::start();
    for wait in [Duration::ZERO, Duration::from_millis(400)] {
        let proxy = FaultProxy::start(server.port());
        let locks = timed_client(LockConfig::single(proxy.url()));
        let before = connected_then_stalled(&locks, &[&proxy]).await;
        let key = unique_key("bound:single");
        let (took, result) = timed_acquire(&locks, &key, wait, &[&proxy], &before).await;
        assert_unavailable_within(&format!("single node, wait {wait:?}"), took, &result, wait);
        // The held request lands once the link heals: the failed call's cleanup takes it back.
        proxy.set_blackhole(false);
        let mut admin = server.admin();
        let lock_key = lock_tests::lock_keys(&key).lock;
        wait_until(RESPONSE * 3, "the late grant withdrawn", || {
            !redis::cmd("EXISTS")
                .arg(&lock_key)
                .query::<bool>(&mut admin)
                .unwrap()
        });
    }
}

/// Redlock over `n` masters, each behind a proxy of its own.
fn proxied_redlock(n: usize) -> (RedisMasters, Vec<FaultProxy>, LockClient) {
    let masters = RedisMasters::start(n);
    let proxies: Vec<FaultProxy> = masters
        .nodes
        .iter()
        .map(|s| FaultProxy::start(s.port()))
        .collect();
    let locks =
        timed_client(LockConfig::redlock(proxies.iter().map(FaultProxy::url)).fencing(true));
    (masters, proxies, locks)
}

#[tokio::test]
async fn a_stalled_redlock_majority_answers_within_wait_plus_one_request_timeout() {
    let (_masters, proxies, locks) = proxied_redlock(3);
    // Two of three stalled: no quorum can be won or ruled out until their requests time out.
    let stalled: Vec<&FaultProxy> = proxies.iter().take(2).collect();
    let before = connected_then_stalled(&locks, &stalled).await;
    let wait = Duration::from_millis(300);
    let key = unique_key("bound:redlock");
    let (took, result) = timed_acquire(&locks, &key, wait, &stalled, &before).await;
    assert_unavailable_within("redlock, majority stalled", took, &result, wait);
}

#[tokio::test]
async fn redlocks_fence_write_back_fits_in_the_bound() {
    // Three nodes, one stalled: the quorum needs the other two, and one of them answers each
    // request after 0.8 s (0.4 s each way). The grant's quorum comes after 0.8 s, the fence
    // write-back to a quorum after another 0.8 s: two requests in one attempt, which must
    // still fit in one request timeout past the (zero) wait. Granted without its fences
    // written back, it is no grant: `Unavailable`.
    let (_masters, proxies, locks) = proxied_redlock(3);
    let mut before = connected_then_stalled(&locks, &[&proxies[2]]).await;
    proxies[1].set_delay(Duration::from_millis(400));
    before.push(proxies[1].bytes_up());
    let wait = Duration::ZERO;
    let key = unique_key("bound:raise");
    let asked = [&proxies[2], &proxies[1]];
    let (took, result) = timed_acquire(&locks, &key, wait, &asked, &before).await;
    assert_unavailable_within("redlock, slow fence write-back", took, &result, wait);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_bounds_a_waiter_on_a_frozen_single_node() {
    let wait = Duration::from_secs(1);
    let timeout = ms(200);
    let bound = wait + timeout + ms(300);
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(
        LockConfig::single(server.url())
            .connect_timeout(timeout)
            .response_timeout(timeout),
    );
    let key = unique_key("life:frozen-single");
    let _held = holder
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let task = {
        let key = key.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let result = waiter.lock(&key).wait(wait).acquire().await;
            (start.elapsed(), result.map(drop))
        })
    };
    await_waiter(&server, &key).await;
    server.freeze();
    let (took, result) = bounded(Duration::from_secs(30), "waiter", task)
        .await
        .unwrap();
    server.thaw();
    eprintln!("waiter on a frozen node, wait {wait:?}: {result:?} after {took:?}");
    assert!(result.is_err(), "acquired a held lock");
    assert!(took <= bound, "answered after {took:?}, bound {bound:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_bounds_ten_waiters_with_a_frozen_redlock_node() {
    const WAITERS: usize = 10;
    let wait = ms(300);
    let timeout = ms(200);
    let bound = wait + timeout + ms(300);
    let cluster = RedisMasters::start(5);
    let config = || {
        LockConfig::redlock(cluster.urls())
            .connect_timeout(timeout)
            .response_timeout(timeout)
    };
    let holder = client(config());
    let waiters = client(config());
    let key = unique_key("life:frozen-redlock");
    cluster.nodes[0].freeze();
    let held = holder
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("four of five nodes grant it");
    let started = Instant::now();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let waiters = waiters.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let result = waiters.lock(&key).wait(wait).acquire().await;
                (start.elapsed(), result.map(drop))
            })
        })
        .collect();
    // Released only once every wait ran out: a waiter that gets it now acquired too late.
    tokio::time::sleep_until((started + wait + ms(400)).into()).await;
    held.release().await.unwrap();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(
            bounded(Duration::from_secs(30), "waiter", task)
                .await
                .unwrap(),
        );
    }
    cluster.nodes[0].thaw();
    let slowest = answers.iter().map(|(t, _)| *t).max().unwrap();
    eprintln!(
        "10 waiters, wait {wait:?}, one of five nodes frozen: slowest answered after {slowest:?}; {:?}",
        answers
            .iter()
            .map(|(t, r)| (t.as_millis(), r.is_ok()))
            .collect::<Vec<_>>()
    );
    for (took, result) in &answers {
        assert!(
            result.as_ref().is_err_and(LockError::is_contended),
            "a waiter answered {result:?} after {took:?} (wait {wait:?}, holder released after it)"
        );
        assert!(
            *took <= bound,
            "a waiter answered after {took:?}, bound {bound:?}"
        );
    }
}
