//! Multi-key locks on one Redis node with keys in different hash slots: taken in one script call
//! like a one-key lock, nothing left behind when one key is held, and nothing left behind when
//! the acquisition is cancelled at any point while replies are slow. (Semantics on every backend:
//! the behaviour suite.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{FaultProxy, RedisServer, key_exists, lock_keys, unique_key, wait_until_async};

/// The Redis Cluster hash slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key).
fn slot(key: &str) -> u16 {
    let hashed = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for byte in hashed.bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % 16384
}

/// Two names `<base>:a<n>` < `<base>:b<n>` whose lock keys live in different slots.
fn cross_slot_pair(prefix: &str) -> (String, String) {
    let base = unique_key(prefix);
    (0..)
        .map(|n| (format!("{base}:a{n}"), format!("{base}:b{n}")))
        .find(|(a, b)| slot(&lock_keys(a).lock) != slot(&lock_keys(b).lock))
        .unwrap()
}

/// Calls the node has run so far that ask for a lock: scripts, and a one-key lock's
/// transaction.
fn lock_calls(server: &RedisServer) -> u64 {
    ["evalsha", "eval", "fcall", "multi"]
        .iter()
        .map(|command| server.command_calls(command))
        .sum()
}

#[test]
fn the_slot_function_matches_redis_cluster() {
    // Reference values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    assert_eq!(slot("123456789"), 0x31C3);
    assert_eq!(slot("foo"), 12182);
    assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
}

/// A two-key lock over two slots costs one call (a script), as a one-key lock does (its `SET`,
/// no script); when either key is held, the whole acquisition is `Contended` and the other key is not left
/// locked.
#[tokio::test]
async fn cross_slot_keys_in_one_call_and_nothing_left_when_one_is_held() {
    let server = RedisServer::start();
    let config = LockConfig::single(server.url());
    let (a, b) = (
        LockClient::new(config.clone()).unwrap(),
        LockClient::new(config).unwrap(),
    );
    // Warm-up: scripts loaded for both shapes.
    let (wa, wb) = cross_slot_pair("multi:warm");
    let warm = a.lock(&wa).acquire().await.unwrap();
    warm.release().await.unwrap();
    let warm = a.lock_many([&wa, &wb]).acquire().await.unwrap();
    warm.release().await.unwrap();

    let (ka, kb) = cross_slot_pair("multi:slots");
    let before = (lock_calls(&server), server.command_calls("set"));
    let one = a.lock(&ka).acquire().await.unwrap();
    let one_key = (
        lock_calls(&server) - before.0,
        server.command_calls("set") - before.1,
    );
    assert_eq!(one_key, (0, 1), "a one-key lock is one SET");
    one.release().await.unwrap();
    let before = lock_calls(&server);
    let both = a.lock_many([&ka, &kb]).acquire().await.unwrap();
    let two_keys = lock_calls(&server) - before;
    assert_eq!(two_keys, 1, "a cross-slot pair took more calls");
    assert!(key_exists(&server, &lock_keys(&ka).lock) && key_exists(&server, &lock_keys(&kb).lock));
    both.release().await.unwrap();

    for (held, other) in [(&kb, &ka), (&ka, &kb)] {
        let holder = b.lock(held).acquire().await.unwrap();
        for wait in [Duration::ZERO, Duration::from_millis(200)] {
            match a.lock_many([&ka, &kb]).wait(wait).acquire().await {
                Err(LockError::Contended { key, .. }) => assert_eq!(&key, held),
                other => panic!("expected Contended on {held}, got {other:?}"),
            }
            assert!(
                !key_exists(&server, &lock_keys(other).lock),
                "{other} left locked after {held} was refused (wait {wait:?})"
            );
        }
        holder.release().await.unwrap();
    }
    let both = a.lock_many([&ka, &kb]).acquire().await.unwrap();
    both.release().await.unwrap();
}

/// Acquisitions of a cross-slot pair dropped at 0-59ms while every chunk is delayed 15ms each way
/// (one attempt takes about 30ms): whether the drop came before the request, during it or after
/// the grant, no key stays locked (ttl 30s, so not by expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_cross_slot_acquire_leaves_nothing_behind() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = LockClient::new(LockConfig::single(proxy.url())).unwrap();
    // Connect and load scripts before the delay.
    let (wa, wb) = cross_slot_pair("multi:cancelwarm");
    let warm = client.lock_many([&wa, &wb]).acquire().await.unwrap();
    warm.release().await.unwrap();
    proxy.set_delay(Duration::from_millis(15));

    let (mut granted, mut cancelled) = (0, 0);
    for i in 0..40u64 {
        let (ka, kb) = cross_slot_pair("multi:cancel");
        let after = Duration::from_millis(i * 37 % 60);
        let acquire = client
            .lock_many([&kb, &ka])
            .ttl(Duration::from_secs(30))
            .acquire();
        match tokio::time::timeout(after, acquire).await {
            Ok(guard) => {
                granted += 1;
                drop(guard.unwrap());
            }
            Err(_) => cancelled += 1,
        }
        wait_until_async(
            Duration::from_secs(3),
            &format!("no key of a pair left after a drop at {after:?}"),
            || {
                [&ka, &kb]
                    .iter()
                    .all(|k| !key_exists(&server, &lock_keys(k).lock))
            },
        )
        .await;
    }
    eprintln!("{cancelled} acquisitions dropped in flight, {granted} granted then dropped");
    assert!(cancelled > 0, "no acquisition was dropped in flight");
}
