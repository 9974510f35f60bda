//! TLS end to end on every backend: servers that speak TLS only, with certificates from a
//! throw-away CA (`TestCa`) that clients trust through `LockConfig::tls_root_ca`. On each
//! backend: a lock is granted, renewed, handed to a waiter and released; a client trusting
//! another CA is `Unavailable` with a certificate error; a plain URL to a TLS port is
//! `Unavailable`, within one request. Plus mutual TLS on a single node, and the TLS settings'
//! checks at `LockClient::new`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError, NodeFailure};
use lock_tests::{
    RedisCluster, RedisMasters, RedisServer, RedisStore, SCHEDULING_SLACK, SentinelSet,
    ServerOptions, TestCa, bounded, lock_keys, unique_key, wait_until_async,
};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
/// Between two attempts a waiter sleeps at least half of this unless a release wakes it: a
/// hand-off within [`HAND_OFF`] can only be a wake-up.
const RETRY_DELAY: Duration = Duration::from_secs(5);
const HAND_OFF: Duration = Duration::from_secs(1);
/// Long enough that a waiter's backoff is not cut short by the holder's remaining TTL.
const HELD_TTL: Duration = Duration::from_secs(30);

fn config(backend: LockConfig) -> LockConfig {
    backend
        .connect_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .retry_delay(RETRY_DELAY)
}

fn tls_server() -> RedisServer {
    RedisServer::start_with(ServerOptions {
        tls: Some(TestCa::shared().clone()),
        ..ServerOptions::default()
    })
}

/// `rediss://` URLs as plain `redis://` ones (same ports).
fn plain(urls: &[String]) -> Vec<String> {
    urls.iter()
        .map(|url| url.replacen("rediss://", "redis://", 1))
        .collect()
}

/// With the shared CA trusted: a lock is granted with a fencing token, renewed past three TTLs
/// of `ttl`, then (held with a long TTL) handed to a waiter woken by its release (`waiting`
/// says someone waits for a key), and released. Every connection involved (calls, the
/// waiter's notifications) goes over TLS.
async fn lock_works(backend: LockConfig, ttl: Duration, waiting: impl Fn(&str) -> bool) {
    let config = config(backend).tls_root_ca(TestCa::shared().ca_pem());
    let a = LockClient::new(config.clone()).unwrap();
    let b = LockClient::new(config).unwrap();
    let key = unique_key("tls");
    let guard = a.lock(&key).ttl(ttl).acquire().await.unwrap();
    let first = guard.fencing_token().expect("a fencing token");
    // The behaviour under test is the passing of time: three TTLs, renewed.
    tokio::time::sleep(ttl * 3).await;
    assert!(!guard.is_lost(), "renewed over TLS");
    assert!(
        matches!(
            b.lock(&key).acquire().await,
            Err(LockError::Contended { .. })
        ),
        "still held"
    );
    guard.release().await.unwrap();

    let held = a.lock(&key).ttl(HELD_TTL).acquire().await.unwrap();
    let second = held.fencing_token().expect("a fencing token");
    assert!(second > first, "{second} after {first}");
    let waiter = {
        let lock = b.lock(&key).wait(Duration::from_secs(20));
        tokio::spawn(lock.acquire())
    };
    wait_until_async(Duration::from_secs(5), "the waiter waits", || waiting(&key)).await;
    held.release().await.unwrap();
    let released = Instant::now();
    let handed = bounded(HAND_OFF, "woken by the release", waiter)
        .await
        .unwrap()
        .unwrap();
    eprintln!("handed off {:?} after the release", released.elapsed());
    assert!(handed.fencing_token() > Some(second));
    handed.release().await.unwrap();
    // Released: taken again at once.
    a.lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// One attempt (wait 0) that must fail as `Unavailable` within one request (connect plus
/// response timeout) and scheduling slack; its causes.
async fn unavailable(config: LockConfig) -> Vec<NodeFailure> {
    let client = LockClient::new(config).unwrap();
    let started = Instant::now();
    let outcome = client.lock(unique_key("tls:refused")).acquire().await;
    let took = started.elapsed();
    let causes = match outcome {
        Err(LockError::Unavailable { causes, .. }) => causes,
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("granted"),
    };
    eprintln!("unavailable after {took:?}: {causes:?}");
    let bound = CONNECT_TIMEOUT + RESPONSE_TIMEOUT + SCHEDULING_SLACK;
    assert!(took <= bound, "took {took:?}, past {bound:?}");
    causes
}

/// A client that trusts another CA refuses the servers' certificates: `Unavailable` (never
/// `Contended`), with a cause that says so.
async fn untrusted_ca_is_unavailable(backend: LockConfig) {
    let other = TestCa::new();
    let causes = unavailable(config(backend).tls_root_ca(other.ca_pem())).await;
    let text = format!("{causes:?}").to_lowercase();
    assert!(text.contains("certificate"), "{causes:?}");
}

/// Plain `redis://` (or `http://`) to a port that speaks TLS only: `Unavailable`, within one
/// request.
async fn plain_url_is_unavailable(backend: LockConfig) {
    unavailable(config(backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_single_node_lock_works() {
    let server = tls_server();
    lock_works(
        LockConfig::single(server.url()).fencing(true),
        Duration::from_millis(500),
        |key| server.subscribers(&lock_keys(key).channel) > 0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_single_node_untrusted_ca_is_unavailable() {
    let server = tls_server();
    untrusted_ca_is_unavailable(LockConfig::single(server.url()).fencing(true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_single_node_plain_url_is_unavailable() {
    let server = tls_server();
    let url = server.url().replacen("rediss://", "redis://", 1);
    plain_url_is_unavailable(LockConfig::single(url)).await;
}

/// A server that verifies clients (`tls-auth-clients yes`): refused without a client
/// certificate, a lock works with the CA's client certificate (`tls_client_cert`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_single_node_client_certificate_is_presented() {
    let ca = TestCa::shared();
    let server = RedisServer::start_with(ServerOptions {
        tls: Some(ca.clone()),
        extra_args: vec!["--tls-auth-clients".into(), "yes".into()],
        ..ServerOptions::default()
    });
    let trusting = config(LockConfig::single(server.url()).fencing(true)).tls_root_ca(ca.ca_pem());
    unavailable(trusting.clone()).await;
    let client =
        LockClient::new(trusting.tls_client_cert(ca.client_cert_pem(), ca.client_key_pem()))
            .unwrap();
    let guard = client
        .lock(unique_key("tls:mutual"))
        .acquire()
        .await
        .unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();
}

/// Redlock over three TLS masters: every node's connection trusts the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_redlock_lock_works() {
    let masters = RedisMasters::start_with(
        3,
        &ServerOptions {
            tls: Some(TestCa::shared().clone()),
            ..ServerOptions::default()
        },
    );
    lock_works(
        LockConfig::redlock(masters.urls()).fencing(true),
        Duration::from_millis(500),
        |key| {
            let channel = lock_keys(key).channel;
            masters.nodes.iter().any(|n| n.subscribers(&channel) > 0)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_lock_works() {
    let cluster = RedisCluster::shared_tls();
    lock_works(
        LockConfig::cluster(cluster.urls()).fencing(true),
        Duration::from_millis(500),
        |key| cluster.subscribers(&lock_keys(key).channel) > 0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_untrusted_ca_is_unavailable() {
    let cluster = RedisCluster::shared_tls();
    untrusted_ca_is_unavailable(LockConfig::cluster(cluster.urls())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_plain_url_is_unavailable() {
    let cluster = RedisCluster::shared_tls();
    plain_url_is_unavailable(LockConfig::cluster(plain(&cluster.urls()))).await;
}

/// Sentinels and data nodes over TLS: the lookup and the master's connection both trust the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinel_lock_works() {
    let set = SentinelSet::shared_tls();
    lock_works(
        LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls()).fencing(true),
        Duration::from_millis(500),
        |key| set.subscribers(&lock_keys(key).channel) > 0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinel_untrusted_ca_is_unavailable() {
    let set = SentinelSet::shared_tls();
    untrusted_ca_is_unavailable(LockConfig::sentinel(
        SentinelSet::MASTER_NAME,
        set.sentinel_urls(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinel_plain_url_is_unavailable() {
    let set = SentinelSet::shared_tls();
    plain_url_is_unavailable(LockConfig::sentinel(
        SentinelSet::MASTER_NAME,
        plain(&set.sentinel_urls()),
    ))
    .await;
}

/// etcd over `https://`: a renewal is a keepalive committed by an fsyncing member, so the ttl
/// is 2 s (as in the behaviour suite).
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_etcd_lock_works() {
    let cluster = lock_tests::EtcdCluster::shared_tls();
    let before = cluster.watchers();
    lock_works(
        LockConfig::etcd(cluster.endpoints()),
        Duration::from_secs(2),
        |_| cluster.watchers() > before,
    )
    .await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_etcd_untrusted_ca_is_unavailable() {
    let cluster = lock_tests::EtcdCluster::shared_tls();
    untrusted_ca_is_unavailable(LockConfig::etcd(cluster.endpoints())).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_etcd_plain_url_is_unavailable() {
    let cluster = lock_tests::EtcdCluster::shared_tls();
    let port = cluster.tls_port(0).expect("a TLS port");
    plain_url_is_unavailable(LockConfig::etcd([format!("http://127.0.0.1:{port}")])).await;
}

/// What `tls_root_ca` and `tls_client_cert` are given is checked when the client is made, as a
/// `Config` error naming the setting; neither the key nor the PEM shows in `Debug`.
#[test]
fn tls_settings_are_checked_when_the_client_is_made() {
    let ca = TestCa::shared();
    let url = "rediss://127.0.0.1:6380/";
    let field = |config: LockConfig| match LockClient::new(config) {
        Err(LockError::Config { field, reason }) => {
            eprintln!("{field}: {reason}");
            field
        }
        Err(other) => panic!("expected a Config error, got {other}"),
        Ok(_) => panic!("expected a Config error, got a client"),
    };
    let single = || LockConfig::single(url);
    assert_eq!(
        field(single().tls_root_ca("not a certificate")),
        "tls_root_ca"
    );
    assert_eq!(
        field(single().tls_root_ca(ca.client_key_pem())),
        "tls_root_ca"
    );
    let truncated = ca.ca_pem()[..200].to_vec();
    assert_eq!(field(single().tls_root_ca(truncated)), "tls_root_ca");
    assert_eq!(
        field(single().tls_client_cert(ca.client_cert_pem(), "no key")),
        "tls_client_cert"
    );
    assert_eq!(
        field(single().tls_client_cert(ca.client_cert_pem(), ca.server_key_pem())),
        "tls_client_cert",
        "a key that is not the certificate's"
    );
    assert_eq!(
        field(LockConfig::single("redis://127.0.0.1:6379/").tls_root_ca(ca.ca_pem())),
        "tls_root_ca",
        "no URL uses TLS"
    );
    let valid = single()
        .tls_root_ca(ca.ca_pem())
        .tls_client_cert(ca.client_cert_pem(), ca.client_key_pem());
    assert!(LockClient::new(valid.clone()).is_ok());
    let shown = format!("{valid:?}");
    assert!(
        shown.contains("root_ca: set, client_cert: set") && !shown.contains("-----BEGIN"),
        "{shown}"
    );
}
