//! Your own `redis::Client`: `LockConfig::from_client` and `LockConfig::redlock_from_clients`
//! connect as the client says (ACL user and password, database, TLS certificates) and never show
//! its password; what they cannot use is a `Config` error naming the argument.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lock_runtime::{FailureKind, LockClient, LockConfig};
// As a user names it: the redis-rs the library is built with (the harness's is the same crate).
use lock_runtime::redis;
use lock_tests::{
    RedisMasters, RedisServer, ServerOptions, TestCa, client, config_field, lock_keys,
    unavailable_causes, unique_key, wait_until_async,
};

/// How many nodes of `masters` have `key`'s lock.
fn holders(masters: &RedisMasters, key: &str) -> usize {
    masters
        .nodes
        .iter()
        .filter(|n| !n.keys(&lock_keys(key).lock).is_empty())
        .count()
}

/// The password reaches the server only through the client; the database too. A client of the
/// same address with a wrong password is refused as `Auth`, so the credentials are the client's.
#[tokio::test]
async fn an_acl_user_and_database_given_only_through_the_client_are_used() {
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some("admin-pw".into()),
        acl_rules: vec!["user locker on >locker-pw ~* &* +@all".into()],
        ..ServerOptions::default()
    });
    let key = unique_key("own-client:acl");
    let own = redis::Client::open(format!("{}3", server.url_as("locker", "locker-pw"))).unwrap();
    let config = LockConfig::from_client(own);
    let shown = format!("{config:?}");
    assert!(!shown.contains("locker-pw"), "the password shows: {shown}");
    assert!(shown.contains(&server.port().to_string()), "{shown}");

    let guard = client(config).lock(&key).acquire().await.unwrap();
    let mut admin = server.admin();
    redis::cmd("SELECT").arg(3).exec(&mut admin).unwrap();
    let in_db_3: Option<String> = redis::cmd("GET")
        .arg(lock_keys(&key).lock)
        .query(&mut admin)
        .unwrap();
    assert!(
        in_db_3.is_some(),
        "the lock is not in the client's database 3"
    );
    guard.release().await.unwrap();

    let wrong = redis::Client::open(server.url_as("locker", "not-the-password")).unwrap();
    let err = client(LockConfig::from_client(wrong))
        .lock(&key)
        .acquire()
        .await
        .expect_err("a wrong password was accepted");
    let causes = unavailable_causes(&err);
    assert!(
        causes.iter().all(|c| c.kind == FailureKind::Auth),
        "{causes:?}"
    );
}

/// A client built with the test CA's certificate locks over TLS with no TLS setting on the
/// config: the certificates are the client's. The same address without them is refused.
#[tokio::test]
async fn a_tls_client_locks_with_its_own_certificates() {
    let server = RedisServer::start_with(ServerOptions {
        tls: Some(TestCa::shared().clone()),
        ..ServerOptions::default()
    });
    let key = unique_key("own-client:tls");
    let own = server.client();
    let guard = client(LockConfig::from_client(own))
        .lock(&key)
        .acquire()
        .await
        .unwrap();
    assert_eq!(server.keys(&lock_keys(&key).lock).len(), 1);
    guard.release().await.unwrap();

    // Without the client's certificates, the test CA is not trusted.
    let untrusting = redis::Client::open(server.url()).unwrap();
    let err = client(
        LockConfig::from_client(untrusting)
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2)),
    )
    .lock(&key)
    .acquire()
    .await
    .expect_err("an untrusted certificate was accepted");
    assert!(!unavailable_causes(&err).is_empty());
}

/// Redlock over three clients: a grant is on a majority at once and on every node soon, and its
/// release frees every node.
#[tokio::test]
async fn redlock_from_clients_locks_on_every_clients_node() {
    let masters = RedisMasters::start(3);
    let key = unique_key("own-client:redlock");
    let clients = masters.nodes.iter().map(RedisServer::client);
    let locks = client(LockConfig::redlock_from_clients(clients));
    let guard = locks.lock(&key).acquire().await.unwrap();
    assert!(holders(&masters, &key) >= 2);
    wait_until_async(Duration::from_secs(2), "the lock on every node", || {
        holders(&masters, &key) == 3
    })
    .await;
    guard.release().await.unwrap();
    wait_until_async(Duration::from_secs(2), "every node free", || {
        holders(&masters, &key) == 0
    })
    .await;
}

/// What the library cannot connect with is a `Config` error naming the argument, when the
/// client is made: a Unix socket, no node, the same node twice.
#[test]
fn clients_it_cannot_use_are_config_errors_naming_the_argument() {
    let unix = redis::Client::open("unix:///tmp/lock-tests-no-such.sock").unwrap();
    assert_eq!(
        config_field(LockClient::new(LockConfig::from_client(unix))),
        "client"
    );
    assert_eq!(
        config_field(LockClient::new(LockConfig::redlock_from_clients([]))),
        "clients"
    );
    let node = redis::Client::open("redis://127.0.0.1:6379/").unwrap();
    assert_eq!(
        config_field(LockClient::new(LockConfig::redlock_from_clients([
            node.clone(),
            node
        ]))),
        "clients"
    );
}
