//! Fenced writes (`lock_runtime::fence`) on a real Redis node and a Redis Cluster: a write with a
//! token smaller than the largest that wrote the key is refused with nothing written, an equal
//! or larger one is accepted, and the value comes back with its token. And the SQL pattern the
//! module documents, on SQLite.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_runtime::fence::{self, Fenced};
use lock_runtime::{FenceError, LockConfig};
// As a user names it: the redis-rs the library is built with (the harness's is the same crate).
use lock_runtime::redis;
use lock_tests::{RedisCluster, RedisServer, client, lock_keys, unique_key};

/// The writes a fenced key takes and refuses, on any async connection.
async fn stale_tokens_are_refused<C: redis::aio::ConnectionLike>(conn: &mut C, key: &str) {
    fence::set(conn, key, "first", 10).await.unwrap();
    // The same holder writes again: an equal token is accepted.
    fence::set(conn, key, "again", 10).await.unwrap();
    // A later holder: accepted.
    fence::set(conn, key, "later", 11).await.unwrap();
    // The holder of token 10, late: refused, and the later holder's value stays.
    match fence::set(conn, key, "late", 10).await {
        Err(FenceError::Stale {
            key: refused,
            token: 10,
            current: 11,
        }) => assert_eq!(refused, key),
        other => panic!("a write with token 10 after token 11 answered {other:?}"),
    }
    let read: Option<Fenced<String>> = fence::get(conn, key).await.unwrap();
    let read = read.expect("the fenced value is gone");
    assert_eq!((read.value.as_str(), read.token), ("later", 11));
}

/// A connection of the user's own, as the fenced writes take it.
async fn connect(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_smaller_token_is_refused_and_an_equal_or_larger_one_writes() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let key = unique_key("fence:single");
    let missing: Option<Fenced<String>> = fence::get(&mut conn, &key).await.unwrap();
    assert_eq!(missing, None);
    stale_tokens_are_refused(&mut conn, &key).await;
    // Value and token in one hash, with no TTL of its own.
    let mut admin = server.admin();
    let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(&key).query(&mut admin).unwrap();
    let mut fields = fields;
    fields.sort();
    assert_eq!(
        fields,
        [
            ("fence".to_owned(), "11".to_owned()),
            ("value".to_owned(), "later".to_owned())
        ]
    );
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut admin).unwrap();
    assert_eq!(ttl, -1, "the fenced key got a TTL nobody set");
}

#[tokio::test]
async fn tokens_compare_exactly_across_all_of_u64() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let key = unique_key("fence:wide");
    // 2^53 + 1 and 2^53 are one number to Lua's doubles: compared as such, the smaller would
    // pass. Shorter decimal strings are smaller numbers, whatever their first digits.
    let big = (1_u64 << 53) + 1;
    fence::set(&mut conn, &key, 1_i64, big).await.unwrap();
    for smaller in [big - 1, 99, 9] {
        match fence::set(&mut conn, &key, 2_i64, smaller).await {
            Err(FenceError::Stale { current, .. }) => assert_eq!(current, big),
            other => panic!("token {smaller} after {big} answered {other:?}"),
        }
    }
    fence::set(&mut conn, &key, 3_i64, u64::MAX).await.unwrap();
    let read: Fenced<i64> = fence::get(&mut conn, &key).await.unwrap().unwrap();
    assert_eq!((read.value, read.token), (3, u64::MAX));
}

#[tokio::test]
async fn a_key_that_is_not_a_fenced_value_is_an_error_not_a_write() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let plain = unique_key("fence:plain");
    let mut admin = server.admin();
    let _: () = redis::cmd("SET")
        .arg(&plain)
        .arg("x")
        .query(&mut admin)
        .unwrap();
    match fence::set(&mut conn, &plain, "v", 1).await {
        Err(FenceError::Redis { key, .. }) => assert_eq!(key, plain),
        other => panic!("a fenced write over a string answered {other:?}"),
    }
    let garbled = unique_key("fence:garbled");
    let _: () = redis::cmd("HSET")
        .arg(&garbled)
        .arg("fence")
        .arg("soon")
        .query(&mut admin)
        .unwrap();
    match fence::set(&mut conn, &garbled, "v", 1).await {
        Err(FenceError::Redis { source, .. }) => {
            assert!(source.to_string().contains("not a token"), "{source}");
        }
        other => panic!("a fenced write over a garbled fence answered {other:?}"),
    }
    let value: Option<String> = redis::cmd("HGET")
        .arg(&garbled)
        .arg("value")
        .query(&mut admin)
        .unwrap();
    assert_eq!(value, None, "written despite the error");
}

/// The tokens of real grants: the holder whose lock expired (here: its key deleted, as an
/// expiry would) writes after the next holder did, and is refused.
#[tokio::test]
async fn a_superseded_holder_s_write_is_refused() {
    let server = RedisServer::start();
    let config = || LockConfig::single(server.url()).fencing(true);
    let [first, second] = [(); 2].map(|()| client(config()));
    let mut conn = connect(&server).await;
    let name = unique_key("fence:holders");
    let resource = format!("{name}:balance");
    let old = first.lock(&name).acquire().await.unwrap();
    let old_token = old.fencing_token().unwrap();
    fence::set(&mut conn, &resource, 100_i64, old_token)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(lock_keys(&name).lock)
        .query(&mut server.admin())
        .unwrap();
    let new = second.lock(&name).acquire().await.unwrap();
    let new_token = new.fencing_token().unwrap();
    assert!(new_token > old_token);
    fence::set(&mut conn, &resource, 150_i64, new_token)
        .await
        .unwrap();
    match fence::set(&mut conn, &resource, 90_i64, old_token).await {
        Err(FenceError::Stale { token, current, .. }) => {
            assert_eq!((token, current), (old_token, new_token));
        }
        other => panic!("the superseded holder's write answered {other:?}"),
    }
    let read: Fenced<i64> = fence::get(&mut conn, &resource).await.unwrap().unwrap();
    assert_eq!((read.value, read.token), (150, new_token));
    new.release().await.unwrap();
    drop(old);
}

#[tokio::test]
async fn fenced_writes_work_on_a_cluster_connection() {
    let cluster = RedisCluster::shared();
    let mut conn = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    // Keys on two different masters: each script call goes to its key's slot. A fresh key
    // lands on another master than the first with chance 2/3, so 32 tries all failing is a
    // broken cluster (or helper), not bad luck.
    let first = unique_key("fence:cluster");
    let other = (0..32)
        .map(|n| unique_key(&format!("fence:cluster:{n}")))
        .find(|key| cluster.master_of(key).port() != cluster.master_of(&first).port())
        .expect("32 keys all on one master");
    let keys = [first, other];
    for key in &keys {
        stale_tokens_are_refused(&mut conn, key).await;
    }
}

/// The SQL pattern of `lock_runtime::fence`'s docs: the check and the write in one statement.
mod sql {
    use rusqlite::{Connection, params};

    /// A write that a later holder's write superseded.
    #[derive(Debug, PartialEq)]
    struct Stale;

    /// Sets the balance of wallet `id` if `token` is at least the fence that wrote it; inserts
    /// the wallet if it does not exist.
    fn set_balance(db: &Connection, id: i64, balance: i64, token: u64) -> Result<(), Stale> {
        let token = i64::try_from(token).expect("SQLite integers are i64");
        let updated = db
            .execute(
                "UPDATE wallets SET balance = ?1, fence = ?2 WHERE id = ?3 AND fence <= ?2",
                params![balance, token, id],
            )
            .unwrap();
        if updated == 1 {
            return Ok(());
        }
        // No row updated: a missing wallet (insert it) or a later holder's fence (refuse).
        // `OR IGNORE`: a wallet inserted meanwhile by another writer is a row this write did
        // not update, so it is refused rather than overwritten.
        let inserted = db
            .execute(
                "INSERT OR IGNORE INTO wallets (id, balance, fence) VALUES (?1, ?2, ?3)",
                params![id, balance, token],
            )
            .unwrap();
        if inserted == 1 { Ok(()) } else { Err(Stale) }
    }

    fn read(db: &Connection, id: i64) -> (i64, i64) {
        db.query_row(
            "SELECT balance, fence FROM wallets WHERE id = ?1",
            params![id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
    }

    #[test]
    fn an_update_with_a_stale_fence_changes_no_row() {
        let db = Connection::open_in_memory().unwrap();
        db.execute_batch(
            "CREATE TABLE wallets (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, \
             fence INTEGER NOT NULL DEFAULT 0)",
        )
        .unwrap();
        assert_eq!(set_balance(&db, 42, 100, 7), Ok(()), "insert");
        assert_eq!(set_balance(&db, 42, 110, 7), Ok(()), "equal token");
        assert_eq!(set_balance(&db, 42, 150, 8), Ok(()), "larger token");
        assert_eq!(set_balance(&db, 42, 90, 7), Err(Stale), "smaller token");
        assert_eq!(read(&db, 42), (150, 8));
    }
}
