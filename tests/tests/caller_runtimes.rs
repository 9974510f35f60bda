//! Calls from a caller's multi-thread runtime go over a connection of that runtime (one per
//! runtime and node, on a single node and on each Redlock node), made after the node's shared
//! connection; other callers (current-thread runtimes, runtimes without IO or time, sync code) go
//! over the shared connection. Each test makes its own client, so the connections it counts are
//! its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    RedisMasters, RedisServer, SCHEDULING_SLACK, bounded, callers_connection, callers_connections,
    unique_key, wait_until,
};
use tokio::runtime::Runtime;

fn kill(server: &RedisServer, id: u64) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(killed, 1, "connection {id} was there to kill");
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A wait, so that a call that finds its connection killed connects again and goes on.
async fn pair(client: &LockClient, key: &str) -> Result<(), LockError> {
    client
        .lock(key)
        .wait(Duration::from_secs(2))
        .acquire()
        .await?
        .release()
        .await
}

/// A connection appears or goes away within this (made or closed in the background).
const SETTLE: Duration = Duration::from_secs(2);

/// The first request goes over the shared connection; the runtime's own connection is made next,
/// in the background. Once it is, the runtime's calls go over it: with the shared connection
/// killed, twenty more calls succeed and the shared connection is not made again (a call over it
/// would reconnect it). A second runtime gets a connection of its own; a runtime's connection closes
/// when the runtime shuts down.
#[test]
fn each_callers_runtime_has_its_own_connection_and_it_closes_with_the_runtime() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("callers:own");
    let first = multi_thread();
    let (shared, own) = first.block_on(callers_connection(&server, &client));
    kill(&server, shared);
    first.block_on(async {
        for _ in 0..20 {
            pair(&client, &key).await.unwrap();
        }
    });
    assert_eq!(
        server.client_ids(),
        vec![own],
        "the calls went over the runtime's own connection"
    );

    let second = multi_thread();
    second.block_on(async {
        for _ in 0..3 {
            pair(&client, &key).await.unwrap();
        }
    });
    wait_until(SETTLE, "the second runtime's connection is made", || {
        server.client_ids().len() == 3
    });
    drop(first);
    wait_until(
        SETTLE,
        "the first runtime's connection closes with it",
        || !server.client_ids().contains(&own),
    );
    second.block_on(pair(&client, &key)).unwrap();
}

/// Under Redlock too: once the runtime's own connection to every node is made, its calls go over
/// them (each node's part of a call is polled by the call itself until the quorum decides, and
/// the parts left then go on over the same connections): with every shared connection killed,
/// twenty more calls succeed and no shared connection is made again.
#[test]
fn redlock_calls_go_over_the_runtimes_own_connection_to_every_node() {
    let masters = RedisMasters::start(3);
    let client = LockClient::new(LockConfig::redlock(masters.urls())).unwrap();
    let key = unique_key("callers:redlock");
    let runtime = multi_thread();
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    let pairs = runtime.block_on(callers_connections(&nodes, &client));
    for (node, (shared, _)) in nodes.iter().zip(&pairs) {
        kill(node, *shared);
    }
    runtime.block_on(async {
        for _ in 0..20 {
            pair(&client, &key).await.unwrap();
        }
    });
    // The last node's release may still be on its way when the call returns.
    wait_until(SETTLE, "every node's release is answered", || {
        nodes
            .iter()
            .all(|node| !lock_tests::key_exists(node, &lock_tests::lock_keys(&key).lock))
    });
    for (node, (_, own)) in nodes.iter().zip(&pairs) {
        assert_eq!(
            node.client_ids(),
            vec![*own],
            "the calls went over the runtime's own connection to {}",
            node.url()
        );
    }
}

/// A current-thread runtime, a multi-thread one without IO, one without time, and sync callers
/// go over the shared connection: with it killed, their next call reconnects it, and no other
/// connection is ever made.
#[test]
fn other_callers_go_over_the_shared_connection() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("callers:shared");
    let runtimes = [
        (
            "current-thread",
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        ),
        (
            "without IO",
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_time()
                .build()
                .unwrap(),
        ),
        (
            "without time",
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_io()
                .build()
                .unwrap(),
        ),
    ];
    let sync_call = || {
        client
            .lock(&key)
            .wait(Duration::from_secs(2))
            .acquire_blocking()
            .and_then(|guard| guard.release_blocking())
    };
    sync_call().unwrap();
    for (name, runtime) in &runtimes {
        for _ in 0..2 {
            let before = server.client_ids();
            assert_eq!(before.len(), 1, "{name}: one connection: {before:?}");
            kill(&server, before[0]);
            runtime
                .block_on(async {
                    for _ in 0..5 {
                        pair(&client, &key).await?;
                    }
                    Ok::<_, LockError>(())
                })
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let after = server.client_ids();
            assert!(
                after.len() == 1 && after != before,
                "{name}: the shared connection made again, and no other: {before:?} -> {after:?}"
            );
        }
    }
    let before = server.client_ids();
    kill(&server, before[0]);
    sync_call().unwrap();
    let after = server.client_ids();
    assert!(after.len() == 1 && after != before, "sync: {after:?}");
}

/// A lock taken over a runtime's connection outlives that runtime: it is renewed (over the shared
/// connection) past two ttls after the runtime shut down, and released from another runtime.
#[test]
fn a_lock_outlives_the_runtime_that_took_it() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("callers:outlives");
    let ttl = Duration::from_secs(1);
    let first = multi_thread();
    first.block_on(callers_connection(&server, &client));
    let guard = first
        .block_on(client.lock(&key).ttl(ttl).acquire())
        .unwrap();
    drop(first);
    std::thread::sleep(ttl * 2 + SCHEDULING_SLACK);
    assert!(!guard.is_lost(), "renewed after its runtime shut down");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_tests::lock_keys(&key).lock)
        .query(&mut server.admin())
        .unwrap();
    assert!(pttl > 0, "still on the server: pttl {pttl}");
    let second = multi_thread();
    second.block_on(guard.release()).unwrap();
}

/// A frozen server fails a call over a runtime's connection within the connect + response
/// timeouts (the bound lives on the library's runtime) and the call is `Unavailable`.
#[test]
fn a_frozen_server_fails_a_call_over_a_runtimes_connection_in_time() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let client = LockClient::new(
        LockConfig::single(server.url())
            .connect_timeout(timeout)
            .response_timeout(timeout),
    )
    .unwrap();
    let key = unique_key("callers:frozen");
    let runtime = multi_thread();
    runtime.block_on(callers_connection(&server, &client));
    server.freeze();
    let bound = timeout * 2 + SCHEDULING_SLACK;
    let started = std::time::Instant::now();
    let result = runtime
        .block_on(bounded(
            bound * 2,
            "a call to a frozen server answered",
            client.lock(&key).acquire(),
        ))
        .map(drop);
    let took = started.elapsed();
    server.thaw();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(took <= bound, "answered in {took:?}, bound {bound:?}");
}

/// The runtime's own connection to `server`, once it carries its calls: calls are made on
/// `runtime` until the newest connection made since this was called (the shared connection, when
/// made now too, was made first) ran one of their scripts.
fn own_connection(server: &RedisServer, client: &LockClient, runtime: &Runtime) -> u64 {
    let before = server.client_ids().into_iter().max().unwrap_or(0);
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        runtime.block_on(lock_tests::warm_up(client));
        let own = server
            .clients()
            .into_iter()
            .filter(|(id, _)| *id > before)
            .max();
        if let Some((id, cmd)) = own
            && cmd.starts_with("eval")
        {
            return id;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the runtime's own connection carries its calls: not so after {SETTLE:?}"
        );
    }
}

/// Rounds of the race below.
const ORPHAN_ROUNDS: usize = 50;

/// An acquire sent over a runtime's own connection, and that runtime shut down before the server
/// answered (here: frozen, with the acquire's bytes in its socket): the call's cleanup releases
/// the lock over the shared connection, and must not run before the acquire does. The server
/// reads its connections in the order they became readable, so the cleanup could only overtake
/// the acquire when the shared connection was readable first: another call's request on it
/// (here an `inspect` from a sync caller) came before the acquire.
///
/// Each round proves that the acquire's bytes reached the server before the runtime shut down,
/// that the cleanup's release reached it before it resumed, and that the acquire ran once it
/// did (its `SET` count grows); then the lock is gone within the bound below, not held for its
/// 30 s ttl.
#[test]
fn a_cleanup_of_a_call_whose_runtime_shut_down_does_not_overtake_its_acquire() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let client = LockClient::new(
        LockConfig::single(server.url())
            .connect_timeout(timeout)
            .response_timeout(timeout),
    )
    .unwrap();
    let request = timeout * 2;
    // A release that timed out while the server was frozen is sent again after at most the
    // cleanup's longest pause (1 s); the release answered after the resume is followed by one
    // more (one request).
    let bound = request + Duration::from_secs(1) + request + SCHEDULING_SLACK;
    let ttl = Duration::from_secs(30);
    for round in 0..ORPHAN_ROUNDS {
        let key = unique_key("callers:orphaned");
        let runtime = multi_thread();
        let own = own_connection(&server, &client, &runtime);
        let own_port = server.client_port(own).unwrap();
        let shared_port = server
            .client_ids()
            .into_iter()
            .min()
            .and_then(|shared| server.client_port(shared))
            .unwrap();
        let sets = server.command_calls("set");
        server.freeze();
        let bystander = {
            let (client, key) = (client.clone(), key.clone());
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(client.inspect(&format!("{key}:other")))
                    .map(drop)
            })
        };
        wait_until(SETTLE, "the other call reached the server", || {
            server.unread_from(shared_port) > 0
        });
        let other_call = server.unread_from(shared_port);
        {
            let (client, key) = (client.clone(), key.clone());
            runtime.spawn(async move {
                client
                    .lock(&key)
                    .ttl(ttl)
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await
            });
        }
        wait_until(SETTLE, "the acquire reached the server", || {
            server.unread_from(own_port) > 0
        });
        drop(runtime);
        wait_until(SETTLE, "the cleanup reached the server", || {
            server.unread_from(shared_port) > other_call
        });
        server.thaw();
        wait_until(SETTLE, "the acquire ran", || {
            server.command_calls("set") > sets
        });
        let lock = lock_tests::lock_keys(&key).lock;
        wait_until(
            bound,
            &format!("round {round}: the lock is released"),
            || !lock_tests::key_exists(&server, &lock),
        );
        // Answered or timed out: either way within one request.
        let _ = bystander.join().unwrap();
    }
}
