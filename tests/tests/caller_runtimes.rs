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

/// The runtime's own connection to each of `servers`, once it carries its calls: calls are made
/// on `runtime` until, on every server, the newest connection made since this was called (the
/// shared connection, when made now too, was made first) ran one of their scripts.
fn own_connections(servers: &[&RedisServer], client: &LockClient, runtime: &Runtime) -> Vec<u64> {
    let before: Vec<u64> = servers
        .iter()
        .map(|s| s.client_ids().into_iter().max().unwrap_or(0))
        .collect();
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        runtime.block_on(lock_tests::warm_up(client));
        let own: Vec<Option<u64>> = servers
            .iter()
            .zip(&before)
            .map(|(server, before)| {
                let newest = server
                    .clients()
                    .into_iter()
                    .filter(|(id, _)| id > before)
                    .max()?;
                newest.1.starts_with("eval").then_some(newest.0)
            })
            .collect();
        if own.iter().all(Option::is_some) {
            return own.into_iter().flatten().collect();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the runtime's own connections carry its calls: not so after {SETTLE:?}"
        );
    }
}

/// Each server's shared connection (its oldest): the port it connected from.
fn shared_ports(servers: &[&RedisServer]) -> Vec<u16> {
    servers
        .iter()
        .map(|server| {
            server
                .client_ids()
                .into_iter()
                .min()
                .and_then(|shared| server.client_port(shared))
                .unwrap()
        })
        .collect()
}

/// Rounds of the race below.
const ORPHAN_ROUNDS: usize = 50;
/// Under Redlock a round costs three servers' worth: fewer, so the test stays short.
const REDLOCK_ORPHAN_ROUNDS: usize = 20;

/// An acquire sent over a runtime's own connections, and that runtime shut down before the
/// servers answered (here: frozen, with the acquire's bytes in their sockets): the call's cleanup
/// releases the lock over the shared connections, and must not run before the acquire does. A
/// server reads its connections in the order they became readable, so the cleanup could only
/// overtake the acquire where the shared connection was readable first: another call's request
/// on it (here an `inspect` from a sync caller) came before the acquire.
///
/// Each round proves that the acquire's bytes reached every server before the runtime shut down,
/// that the cleanup's release reached it before it resumed, and that the acquire ran once it did
/// (its `SET` count grows); then the lock is gone within the bound below (from the server; under
/// Redlock from a majority), not held for its 30 s ttl.
fn cleanup_after_the_runtime_shut_down(
    servers: &[&RedisServer],
    config: LockConfig,
    rounds: usize,
) {
    let timeout = Duration::from_millis(300);
    let client =
        LockClient::new(config.connect_timeout(timeout).response_timeout(timeout)).unwrap();
    let request = timeout * 2;
    // A release that timed out while the servers were frozen is sent again after at most the
    // cleanup's longest pause (1 s); the release answered after the resume is followed by one
    // more (one request).
    let bound = request + Duration::from_secs(1) + request + SCHEDULING_SLACK;
    let ttl = Duration::from_secs(30);
    let unread = |ports: &[u16]| -> Vec<u64> {
        servers
            .iter()
            .zip(ports)
            .map(|(server, port)| server.unread_from(*port))
            .collect()
    };
    for round in 0..rounds {
        let key = unique_key("callers:orphaned");
        let runtime = multi_thread();
        let own = own_connections(servers, &client, &runtime);
        let own_ports: Vec<u16> = servers
            .iter()
            .zip(&own)
            .map(|(server, id)| server.client_port(*id).unwrap())
            .collect();
        let shared_ports = shared_ports(servers);
        let sets: Vec<u64> = servers.iter().map(|s| s.command_calls("set")).collect();
        for server in servers {
            server.freeze();
        }
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
        wait_until(SETTLE, "the other call reached every server", || {
            unread(&shared_ports).iter().all(|n| *n > 0)
        });
        let other_call = unread(&shared_ports);
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
        wait_until(SETTLE, "the acquire reached every server", || {
            unread(&own_ports).iter().all(|n| *n > 0)
        });
        drop(runtime);
        wait_until(SETTLE, "the cleanup reached every server", || {
            unread(&shared_ports)
                .iter()
                .zip(&other_call)
                .all(|(now, before)| now > before)
        });
        for server in servers {
            server.thaw();
        }
        wait_until(SETTLE, "the acquire ran on every server", || {
            servers
                .iter()
                .zip(&sets)
                .all(|(server, before)| server.command_calls("set") > *before)
        });
        let lock = lock_tests::lock_keys(&key).lock;
        // Under Redlock a node whose release timed out while frozen is not asked again once a
        // majority answered: its grant, a minority, expires by its ttl and keeps no one out.
        let minority = servers.len().div_ceil(2) - 1;
        wait_until(
            bound,
            &format!("round {round}: the lock is released"),
            || {
                servers
                    .iter()
                    .filter(|server| lock_tests::key_exists(server, &lock))
                    .count()
                    <= minority
            },
        );
        // Answered or timed out: either way within one request.
        let _ = bystander.join().unwrap();
    }
}

#[test]
fn a_cleanup_of_a_call_whose_runtime_shut_down_does_not_overtake_its_acquire() {
    let server = RedisServer::start();
    cleanup_after_the_runtime_shut_down(
        &[&server],
        LockConfig::single(server.url()),
        ORPHAN_ROUNDS,
    );
}

/// The same under Redlock: each node's withdrawal and the cleanup's release go over its shared
/// connection.
#[test]
fn a_redlock_cleanup_of_a_call_whose_runtime_shut_down_does_not_overtake_its_acquire() {
    let masters = RedisMasters::start(3);
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    cleanup_after_the_runtime_shut_down(
        &nodes,
        LockConfig::redlock(masters.urls()),
        REDLOCK_ORPHAN_ROUNDS,
    );
}

/// A Redlock call is decided before every node answered: the parts still running (here on a
/// frozen node, the acquire's bytes in its socket) go on as a task on the caller's runtime. When
/// that runtime shuts down before the node answers, they are handed to the library's runtime and
/// end as they would have: the acquire was refused (two nodes held by another), so its late
/// grant on the frozen node is withdrawn, over the shared connection, not left for its ttl.
#[test]
fn a_decided_redlock_calls_parts_outlive_the_callers_runtime() {
    let masters = RedisMasters::start(3);
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    let timeout = Duration::from_millis(300);
    let client = LockClient::new(
        LockConfig::redlock(masters.urls())
            .connect_timeout(timeout)
            .response_timeout(timeout),
    )
    .unwrap();
    let runtime = multi_thread();
    let own = own_connections(&nodes, &client, &runtime);
    let frozen = nodes[2];
    let own_port = frozen.client_port(own[2]).unwrap();
    let shared_port = shared_ports(&[frozen])[0];
    let key = unique_key("callers:decided");
    let lock = lock_tests::lock_keys(&key).lock;
    for held in &nodes[..2] {
        let _: () = redis::cmd("SET")
            .arg(&lock)
            .arg("another")
            .arg("PX")
            .arg(30_000)
            .query(&mut held.admin())
            .unwrap();
    }
    let sets = frozen.command_calls("set");
    frozen.freeze();
    let refused = runtime.block_on(
        client
            .lock(&key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::ZERO)
            .acquire(),
    );
    assert!(
        matches!(refused, Err(LockError::Contended { .. })),
        "held by another on two nodes of three: {refused:?}"
    );
    assert!(
        frozen.unread_from(own_port) > 0,
        "the acquire's bytes wait in the frozen node's socket"
    );
    drop(runtime);
    wait_until(SETTLE, "the withdrawal reached the frozen node", || {
        frozen.unread_from(shared_port) > 0
    });
    frozen.thaw();
    wait_until(SETTLE, "the late acquire ran", || {
        frozen.command_calls("set") > sets
    });
    // The withdrawal was read after the acquire: by the time the acquire ran, it is one read away.
    wait_until(SCHEDULING_SLACK, "the late grant is withdrawn", || {
        !lock_tests::key_exists(frozen, &lock)
    });
}
