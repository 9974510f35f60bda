//! What a lock costs on one Redis node, counted with `INFO commandstats` (which the machine's
//! load does not move): an unfenced, uncontended pair is the hand-written pair (`SET NX PX`, and
//! a compare-and-delete script of `GET` and `DEL`), a fenced one adds its counter's `INCR` and
//! `TIME`, and a release announces itself only when someone waits for the lock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{
    RedisServer, await_waiter, bounded, client, key_exists, lock_keys, unique_key,
    wait_until_async, warm_up,
};

const PAIRS: u64 = 20;

/// `PAIRS` acquire+release pairs of distinct names, nobody else on them.
async fn pairs(locks: &LockClient, fencing: bool) {
    for i in 0..PAIRS {
        let lock = locks.lock(unique_key(&format!("lean:pair{i}")));
        let guard = lock.fencing(fencing).acquire().await.unwrap();
        assert_eq!(guard.fencing_token().is_some(), fencing);
        guard.release().await.unwrap();
    }
}

fn counts(of: &[(&str, u64)]) -> BTreeMap<String, u64> {
    of.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect()
}

#[tokio::test]
async fn an_unfenced_uncontended_pair_is_the_hand_written_pair() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    // Connected, and the release script loaded.
    warm_up(&locks).await;
    let before = server.stats();
    pairs(&locks, false).await;
    assert_eq!(
        server.stats().since(&before),
        counts(&[
            ("del", PAIRS),
            ("evalsha", PAIRS),
            ("get", PAIRS),
            ("set", PAIRS)
        ]),
        "4 commands a pair"
    );
    assert!(server.keys("*").is_empty(), "{:?}", server.keys("*"));
}

/// A fenced pair: the acquire script's `SET NX PX GET`, `INCR` and `TIME` (and a `SET` raising
/// the counter to the server's clock, when it fell more than 100 ms behind: here at the first
/// grant, as the counter does not exist, and at most once per 100 ms after), then the release.
#[tokio::test]
async fn a_fenced_uncontended_pair_adds_its_counter_and_the_clock() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    warm_up(&locks).await;
    let before = server.stats();
    let started = std::time::Instant::now();
    pairs(&locks, true).await;
    let mut ran = server.stats().since(&before);
    let raises = ran.get("set").copied().unwrap_or(0) - PAIRS;
    let bound = 1 + u64::try_from(started.elapsed().as_millis() / 100).unwrap();
    assert!(
        raises <= bound,
        "{raises} raises in {:?}",
        started.elapsed()
    );
    ran.insert("set".to_owned(), PAIRS);
    assert_eq!(
        ran,
        counts(&[
            ("del", PAIRS),
            ("evalsha", 2 * PAIRS),
            ("get", PAIRS),
            ("incr", PAIRS),
            ("set", PAIRS),
            ("time", PAIRS),
        ]),
        "7 commands a pair, and the raises"
    );
    assert_eq!(server.keys("*"), [lock_keys("any").fence]);
}

/// A release nobody waits for announces nothing; one somebody waits for wakes it. The waiter
/// would otherwise sleep at least half its 5 s retry delay (the holder's ttl is longer), so a
/// grant within 2 s can only be the wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_announces_itself_only_when_someone_waits() {
    let server = RedisServer::start();
    let config = LockConfig::single(server.url()).retry_delay(Duration::from_secs(5));
    let [holder, waiter] = [(); 2].map(|()| client(config.clone()));
    let key = unique_key("lean:wake");
    let keys = lock_keys(&key);
    let alone = holder.lock(&key).acquire().await.unwrap();
    let publishes = server.command_calls("publish");
    alone.release().await.unwrap();
    assert_eq!(server.command_calls("publish"), publishes, "nobody waited");

    let held = holder.lock(&key).acquire().await.unwrap();
    let asked = server.command_calls("pttl");
    let waiting = tokio::spawn({
        let lock = waiter.lock(&key).wait(Duration::from_secs(20));
        async move { lock.acquire().await }
    });
    await_waiter(&server, &key).await;
    // Its first attempt, and the one after its subscription was confirmed: both refused, each
    // marking the lock waited for and reading its time to live.
    wait_until_async(Duration::from_secs(5), "two refused attempts", || {
        server.command_calls("pttl") >= asked + 2
    })
    .await;
    assert!(key_exists(&server, &keys.waiting), "no waiting mark");
    held.release().await.unwrap();
    let got = bounded(Duration::from_secs(2), "the woken waiter", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(server.command_calls("publish"), publishes + 1);
    assert!(
        !key_exists(&server, &keys.waiting),
        "the release kept the mark"
    );
    got.release().await.unwrap();
    assert!(server.keys(&format!("*{key}*")).is_empty());
}
