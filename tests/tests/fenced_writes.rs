//! `lock_runtime::fence`: a write carrying a lock's fencing token is made only when the token is
//! at least the largest that wrote the key, on a real Redis; a holder paused past its validity
//! (SIGSTOP-free here: its guard is simply kept while a later holder takes over) has its late
//! write refused and nothing written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lock_runtime::LockConfig;
use lock_runtime::fence::{self, FenceError};
use lock_tests::{RedisServer, bounded, client, unique_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_below_the_largest_token_are_refused_and_change_nothing() {
    let server = RedisServer::start();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = unique_key("fenced");
    assert_eq!(
        fence::get::<_, String>(&mut conn, &key).await.unwrap(),
        None
    );
    fence::set(&mut conn, &key, "a", 10).await.unwrap();
    // The same token again (one holder writing twice) and a larger one: written.
    fence::set(&mut conn, &key, "b", 10).await.unwrap();
    fence::set(&mut conn, &key, "c", 12).await.unwrap();
    assert_eq!(
        fence::get(&mut conn, &key).await.unwrap(),
        Some(("c".to_owned(), 12))
    );
    let err = fence::set(&mut conn, &key, "stale", 11).await.unwrap_err();
    assert!(
        matches!(&err, FenceError::Stale { token: 11, stored: 12, key: k } if *k == key),
        "{err:?}"
    );
    assert_eq!(
        fence::get(&mut conn, &key).await.unwrap(),
        Some(("c".to_owned(), 12)),
        "a refused write changed the value"
    );
    // Tokens as the library hands them out (the server clock in microseconds) compare exactly.
    let big = 1_796_433_794_203_664_u64;
    fence::set(&mut conn, &key, "d", big).await.unwrap();
    let err = fence::set(&mut conn, &key, "e", big - 1).await.unwrap_err();
    assert!(
        matches!(err, FenceError::Stale { stored, .. } if stored == big),
        "{err:?}"
    );
    // No TTL of its own.
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ttl, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_holders_late_write_is_refused() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let name = unique_key("fenced:wallet");
    let balance = format!("{name}:balance");
    let ttl = Duration::from_millis(300);
    let stale = locks.lock(&name).ttl(ttl).acquire().await.unwrap();
    let stale_token = stale.fencing_token().unwrap();
    fence::set(&mut conn, &balance, 100, stale_token)
        .await
        .unwrap();
    // The first holder's key is made to expire (as when it is paused past its validity), and a
    // second holder takes over and writes.
    let _: i64 = redis::cmd("DEL")
        .arg(lock_tests::lock_keys(&name).lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    let fresh = bounded(
        Duration::from_secs(5),
        "the second holder",
        locks.lock(&name).ttl(Duration::from_secs(10)).acquire(),
    )
    .await
    .unwrap();
    let fresh_token = fresh.fencing_token().unwrap();
    assert!(fresh_token > stale_token);
    fence::set(&mut conn, &balance, 90, fresh_token)
        .await
        .unwrap();
    // The first holder's late write: refused, the second holder's value stays.
    let err = fence::set(&mut conn, &balance, 200, stale_token)
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Stale { .. }), "{err:?}");
    assert_eq!(
        fence::get(&mut conn, &balance).await.unwrap(),
        Some((90_i64, fresh_token))
    );
    fresh.release().await.unwrap();
    drop(stale);
}
