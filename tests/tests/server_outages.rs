//! One Redis node unreachable, stopped, restarted (with and without its data) or frozen
//! (SIGSTOP) while a lock is held: `Unavailable` while down, never `Contended`; the client
//! reconnects by itself; a lock is kept only if the data is, else (or frozen) its holder is told
//! `Lost`, at the validity deadline when frozen.
//!
//! Timings are measured and printed (`--nocapture` shows them). Upper bounds are asserted only where
//! the bound is the behaviour under test, and then generously.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockConfig, LockError};
use lock_tests::{
    HttpServer, RedisServer, SCHEDULING_SLACK, ServerOptions, assert_lost_at_the_deadline, bounded,
    client, default_validity, free_port, key_exists, lock_keys, unavailable_causes, unique_key,
    wait_key_gone,
};

#[tokio::test]
async fn redis_down_is_unavailable_never_contended() {
    // Nobody listens on this port.
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let locks = client(LockConfig::single(&url));
    let key = unique_key("faults:down");

    let started = Instant::now();
    let err = bounded(
        Duration::from_secs(10),
        "acquire, wait 0",
        locks.lock(&key).ttl(Duration::from_secs(5)).acquire(),
    )
    .await
    .expect_err("acquired a lock without a server");
    let took = started.elapsed();
    eprintln!("no server, wait 0: {took:?} -> {err}");
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "expected Unavailable, got {err:?}"
    );
    assert!(!err.is_contended());
    assert_eq!(err.key(), Some(key.as_str()));
    let found = unavailable_causes(&err);
    assert!(!found.is_empty(), "Unavailable without a cause");
    assert!(
        found.iter().all(|c| matches!(
            c.kind,
            FailureKind::Refused | FailureKind::Io | FailureKind::Timeout
        )),
        "{found:?}"
    );
    assert!(took < Duration::from_secs(5), "wait 0 took {took:?}");

    // With a wait, it keeps trying for about the wait, and still says Unavailable.
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let err = bounded(
        Duration::from_secs(15),
        "acquire, wait 1s",
        locks
            .lock(&key)
            .ttl(Duration::from_secs(5))
            .wait(wait)
            .acquire(),
    )
    .await
    .expect_err("acquired a lock without a server");
    let took = started.elapsed();
    eprintln!("no server, wait 1s: {took:?}");
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "expected Unavailable, got {err:?}"
    );
    assert!(took >= wait, "gave up after {took:?}, before the wait");
    assert!(took < wait + Duration::from_secs(5), "took {took:?}");
}

/// An address where something other than Redis answers (an HTTP server, which answers a Redis
/// client's first commands with `400 Bad Request`) is `Unavailable` at once, not retried for the
/// wait and never `Contended`, with one cause that names the address and says what is there,
/// not redis-rs's parse error (`Parse error at 1`, then the unexpected bytes as numbers, a line
/// each).
#[tokio::test]
async fn an_http_server_at_the_address_is_not_a_redis_server() {
    let http = HttpServer::start();
    let locks = client(LockConfig::single(format!("redis://{}/", http.addr())));
    let key = unique_key("faults:not-redis");
    let wait = Duration::from_secs(2);

    let started = Instant::now();
    let err = bounded(
        Duration::from_secs(10),
        "acquire, wait 2s",
        locks.lock(&key).wait(wait).acquire(),
    )
    .await
    .expect_err("an HTTP server granted a lock");
    let took = started.elapsed();
    eprintln!("an HTTP server, wait 2s: {took:?} -> {err}");
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "expected Unavailable, got {err:?}"
    );
    assert_eq!(err.key(), Some(key.as_str()));
    let causes = unavailable_causes(&err);
    assert_eq!(causes.len(), 1, "{causes:?}");
    let expected = format!(
        "{}: protocol error: not a Redis server (or a TLS port spoken to in plain text)",
        http.addr()
    );
    assert_eq!(causes[0].to_string(), expected);
    assert!(err.to_string().ends_with(&expected), "{err}");
    assert_eq!(causes[0].node, http.addr());
    assert_eq!(causes[0].kind, FailureKind::Protocol);
    assert!(took < wait, "retried for the wait: {took:?}");
}

#[tokio::test]
async fn stopped_server_is_unavailable_and_recovers_after_restart() {
    let mut server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("faults:stopped");
    // Connect first, so the failure is a broken established connection.
    let guard = locks.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();

    server.stop();
    let started = Instant::now();
    let err = bounded(
        Duration::from_secs(10),
        "acquire on a stopped server",
        locks.lock(&key).acquire(),
    )
    .await
    .expect_err("acquired on a stopped server");
    let took = started.elapsed();
    eprintln!("stopped server, wait 0: {took:?} -> {err}");
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "expected Unavailable, got {err:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");

    server.restart();
    let guard = bounded(
        Duration::from_secs(10),
        "acquire after restart",
        locks.lock(&key).wait(Duration::from_secs(5)).acquire(),
    )
    .await
    .expect("the client reconnects after a restart");
    guard.release().await.unwrap();
}

/// SIGSTOP of the only node while held: no renewal is confirmed, so the lock is lost at its
/// validity deadline, ttl - drift (1 s - 12 ms) after the acquire was sent: not before, and not
/// later than that deadline (counted from when the grant returned) + scheduling slack: the
/// renewal driver's timer fires at the deadline itself.
#[tokio::test]
async fn frozen_server_loses_the_lock_at_the_validity_deadline_not_before() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("faults:frozen");
    let ttl = Duration::from_secs(1);
    let validity = default_validity(ttl);

    let started = Instant::now();
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let granted = Instant::now();
    server.freeze();
    let frozen = Instant::now();
    bounded(
        validity + SCHEDULING_SLACK + Duration::from_secs(1),
        "lost() while frozen",
        guard.lost(),
    )
    .await;
    let lost = Instant::now();
    eprintln!(
        "frozen server ({:?} after the grant): lock declared lost {:?} after acquire was called \
         (ttl {ttl:?}, validity {validity:?})",
        frozen - granted,
        lost - started
    );
    assert!(guard.is_lost());
    assert_lost_at_the_deadline(started, granted, lost, validity);

    server.thaw();
    let released = bounded(Duration::from_secs(5), "release", guard.release()).await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "release of a lock declared lost must say Lost, got {released:?}"
    );
    // Whatever the renewals queued while frozen did, nothing is left behind.
    wait_key_gone(
        &server,
        &lock_keys(&key).lock,
        ttl + Duration::from_secs(1),
        "after thaw",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_persistence_keeps_the_lock() {
    let mut server = RedisServer::start_with(ServerOptions {
        appendonly: true,
        extra_args: vec!["--appendfsync".into(), "always".into()],
        ..ServerOptions::default()
    });
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("table:restart-aof");
    let ttl = Duration::from_secs(3);
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    server.restart();
    assert!(
        key_exists(&server, &lock_keys(&key).lock),
        "the AOF lost the lock"
    );
    let lost = tokio::time::timeout(2 * ttl, guard.lost()).await;
    assert!(lost.is_err(), "lost across a restart that kept the key");
    guard.release().await.expect("still ours after the restart");
    assert!(!key_exists(&server, &lock_keys(&key).lock));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_holder_reports_lost() {
    let mut server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("table:restart-empty");
    let ttl = Duration::from_secs(3);
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    server.restart();
    let restarted = Instant::now();
    bounded(ttl, "lost() after the key vanished", guard.lost()).await;
    eprintln!(
        "restart without persistence: lost {:?} after",
        restarted.elapsed()
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}
