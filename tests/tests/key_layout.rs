//! How lock names map to Redis keys: names that look like another lock's keys (braced, or shaped
//! like a fence counter) are independent locks and leave nothing behind. On one Redis node.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_runtime::LockConfig;
use lock_tests::{RedisServer, client, key_exists, lock_keys, unique_key};

#[tokio::test]
async fn braced_and_plain_names_are_independent_locks() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let base = unique_key("life:layout");
    let braced = format!("{{{base}}}");
    let a = locks.lock(&base).acquire().await.expect("x");
    let b = locks
        .lock(&braced)
        .acquire()
        .await
        .expect("{x} is not the same lock as x");
    assert_ne!(lock_keys(&base).lock, lock_keys(&braced).lock);
    assert!(
        key_exists(&server, &lock_keys(&base).lock)
            && key_exists(&server, &lock_keys(&braced).lock)
    );
    a.release().await.unwrap();
    assert!(
        key_exists(&server, &lock_keys(&braced).lock),
        "releasing x released {{x}}"
    );
    b.release().await.unwrap();
    for name in [&base, &braced] {
        assert!(
            !key_exists(&server, &lock_keys(name).lock),
            "{name} left behind"
        );
    }
}

#[tokio::test]
async fn a_name_shaped_like_a_fence_key_leaves_nothing_behind() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let y = unique_key("life:fence-shape");
    let fence_shaped = format!("{{{y}}}:fence");
    let first = locks
        .lock(&fence_shaped)
        .acquire()
        .await
        .expect("{y}:fence");
    let second = locks.lock(&y).acquire().await.expect("y after {y}:fence");
    assert!(first.fencing_token().is_some() && second.fencing_token().is_some());
    first.release().await.unwrap();
    second.release().await.unwrap();
    for name in [&fence_shaped, &y] {
        assert!(
            !key_exists(&server, &lock_keys(name).lock),
            "lock key of {name} left behind"
        );
    }
    // Nothing of either lock stays: their tokens counted on the server's one counter.
    assert!(server.keys(&format!("*{y}*")).is_empty());
    assert!(key_exists(&server, &lock_keys(&y).fence));
}
