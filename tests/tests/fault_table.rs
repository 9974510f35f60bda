//! The rows of the fault table (`lock-runtime/FAULTS.md`) that no other test file covers, and a
//! check that every row of that table names a test that exists.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    FaultProxy, RedisMasters, RedisServer, ServerOptions, Worker, await_waiter, bounded,
    eventually, key_exists, lock_keys, unique_key,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn client(config: LockConfig) -> LockClient {
    LockClient::new(config).expect("valid lock config")
}

/// Short timeouts, so a fault is noticed quickly.
fn quick(url: String) -> LockClient {
    client(
        LockConfig::single(url)
            .connect_timeout(ms(200))
            .response_timeout(ms(200)),
    )
}

fn config_set(server: &RedisServer, name: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut server.admin())
        .unwrap();
}

fn used_memory(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut server.admin())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Partitions (blackhole: packets stall, nothing is refused).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_before_acquire_is_unavailable_and_leaves_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick(proxy.url());
    let key = unique_key("table:partition-before");
    let ttl = Duration::from_secs(30);
    let wait = ms(500);
    proxy.set_blackhole(true);
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire",
        locks.lock(&key).ttl(ttl).wait(wait).acquire(),
    )
    .await;
    let took = started.elapsed();
    eprintln!("acquire (wait {wait:?}) behind a partition: {result:?} after {took:?}");
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(took <= wait + ms(200) + ms(500), "answered after {took:?}");
    // The held bytes reach Redis once the partition heals: whatever they granted is released.
    proxy.set_blackhole(false);
    let clean = eventually(Duration::from_secs(3), || {
        !key_exists(&server, &lock_keys(&key).lock)
    })
    .await;
    assert!(
        clean,
        "a grant of the failed acquire outlived it (ttl {ttl:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_while_waiting_still_gets_the_lock_within_wait() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = client(LockConfig::single(server.url()));
    let waiter = quick(proxy.url());
    let key = unique_key("table:partition-waiting");
    let held = holder.lock(&key).acquire().await.unwrap();
    let wait = Duration::from_secs(5);
    let task = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(wait).acquire().await })
    };
    await_waiter(&server, &key).await;
    proxy.set_blackhole(true);
    // The scenario: the holder releases while the waiter is cut off, for one second.
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set_blackhole(false);
    let healed = Instant::now();
    let result = bounded(Duration::from_secs(15), "waiter", task)
        .await
        .unwrap();
    eprintln!(
        "waiter cut off during the release: {:?} {:?} after the partition healed",
        result.as_ref().map(drop),
        healed.elapsed()
    );
    result
        .expect("the waiter gets the lock within its wait")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_during_release_answers_and_frees_by_ttl_at_the_latest() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick(proxy.url());
    let key = unique_key("table:partition-release");
    let ttl = Duration::from_secs(2);
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    proxy.set_blackhole(true);
    let started = Instant::now();
    let released = bounded(Duration::from_secs(10), "release", guard.release()).await;
    let took = started.elapsed();
    eprintln!("release behind a partition: {released:?} after {took:?}");
    assert!(
        matches!(released, Err(LockError::Unavailable { .. })),
        "{released:?}"
    );
    assert!(took < Duration::from_secs(2), "release took {took:?}");
    let freed = eventually(ttl + Duration::from_secs(1), || {
        !key_exists(&server, &lock_keys(&key).lock)
    })
    .await;
    proxy.set_blackhole(false);
    assert!(freed, "the lock outlived its ttl after a failed release");
}

// ---------------------------------------------------------------------------------------------
// SIGSTOP of a Redlock majority.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_majority_frozen_loses_the_lock_and_is_unavailable() {
    let cluster = RedisMasters::start(5);
    let config = || {
        LockConfig::redlock(cluster.urls())
            .connect_timeout(ms(200))
            .response_timeout(ms(200))
    };
    let holder = client(config());
    let other = client(config());
    let key = unique_key("table:redlock-majority");
    let ttl = Duration::from_secs(1);
    let guard = holder.lock(&key).ttl(ttl).acquire().await.unwrap();
    let acquired = Instant::now();
    for node in &cluster.nodes[..3] {
        node.freeze();
    }
    bounded(Duration::from_secs(5), "lost()", guard.lost()).await;
    let lost_after = acquired.elapsed();
    let wait = ms(300);
    let started = Instant::now();
    let result = other.lock(&key).ttl(ttl).wait(wait).acquire().await;
    let took = started.elapsed();
    for node in &cluster.nodes[..3] {
        node.thaw();
    }
    eprintln!(
        "3 of 5 frozen: holder lost after {lost_after:?}; acquire {:?} after {took:?}",
        result.as_ref().map(drop)
    );
    assert!(lost_after >= ms(900), "lost before its validity ran out");
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(took <= wait + ms(200) + ms(300), "answered after {took:?}");
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

// ---------------------------------------------------------------------------------------------
// Restarts.

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

// ---------------------------------------------------------------------------------------------
// Memory: OOM under noeviction, and the lock key evicted.

#[tokio::test]
async fn oom_under_noeviction_is_unavailable_and_writes_nothing() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("table:oom");
    config_set(&server, "maxmemory-policy", "noeviction");
    config_set(
        &server,
        "maxmemory",
        &(used_memory(&server) + 512 * 1024).to_string(),
    );
    // Fill until a write is refused (bounded).
    let mut admin = server.admin();
    let mut refused = false;
    for i in 0..2000 {
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("junk:{i}"))
            .arg(vec![b'x'; 4096])
            .query(&mut admin);
        if set.is_err_and(|e| e.code() == Some("OOM")) {
            refused = true;
            break;
        }
    }
    assert!(refused, "the lever failed: no OOM reply");
    let result = locks.lock(&key).acquire().await;
    eprintln!("acquire under OOM: {:?}", result.as_ref().map(drop));
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    let left = server.keys(&format!("*{key}*"));
    assert!(left.is_empty(), "half-written: {left:?}");
}

#[tokio::test]
async fn evicted_lock_key_is_reported_lost() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("table:evicted");
    let ttl = Duration::from_secs(3);
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    // volatile-ttl evicts the key closest to expiry first: the lock, not the hour-long junk.
    config_set(&server, "maxmemory-policy", "volatile-ttl");
    config_set(
        &server,
        "maxmemory",
        &(used_memory(&server) + 512 * 1024).to_string(),
    );
    let mut admin = server.admin();
    let mut junk = 0u64;
    for _ in 0..100 {
        if !key_exists(&server, &lock_keys(&key).lock) {
            break;
        }
        let mut pipe = redis::pipe();
        for _ in 0..50 {
            junk += 1;
            pipe.cmd("SET")
                .arg(format!("junk:{junk}"))
                .arg(vec![b'x'; 1024])
                .arg("EX")
                .arg(3600)
                .ignore();
        }
        let _: redis::RedisResult<()> = pipe.query(&mut admin);
    }
    assert!(
        !key_exists(&server, &lock_keys(&key).lock),
        "the lever failed: not evicted"
    );
    let evicted = Instant::now();
    bounded(ttl, "lost() after eviction", guard.lost()).await;
    eprintln!("lock key evicted: lost {:?} later", evicted.elapsed());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

// ---------------------------------------------------------------------------------------------
// CLIENT KILL of the notification connection.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_of_the_notification_connection_does_not_strand_a_waiter() {
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(server.url()));
    let key = unique_key("table:client-kill");
    let held = holder.lock(&key).acquire().await.unwrap();
    let wait = Duration::from_secs(5);
    let started = Instant::now();
    let task = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(wait).acquire().await })
    };
    await_waiter(&server, &key).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.admin())
        .unwrap();
    assert!(killed >= 1, "no pubsub connection killed");
    held.release().await.unwrap();
    let result = bounded(Duration::from_secs(15), "waiter", task)
        .await
        .unwrap();
    let took = started.elapsed();
    eprintln!(
        "notification connection killed: waiter {:?} after {took:?}",
        result.as_ref().map(drop)
    );
    assert!(took <= wait, "answered after {took:?}");
    result
        .expect("the waiter gets the lock")
        .release()
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// A holder process stopped past its ttl, or killed: fencing shows the stale holder.

/// Starts the `holder` binary (killed on drop) and returns it with its fencing token once it
/// holds the lock.
fn start_holder(url: &str, key: &str, ttl: Duration) -> (Worker, u64) {
    let mut holder = Worker::spawn(
        env!("CARGO_BIN_EXE_holder"),
        &[url, key, &ttl.as_millis().to_string()],
    );
    let line = holder.next_line(Duration::from_secs(20));
    let fence = line
        .trim()
        .strip_prefix("acquired fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("holder said {line:?}"));
    (holder, fence)
}

fn send(holder: &Worker, signal: Signal) {
    kill(Pid::from_raw(i32::try_from(holder.pid()).unwrap()), signal).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_or_killed_holder_process_is_superseded_with_a_larger_token() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let ttl = Duration::from_secs(1);
    for sig in [Signal::SIGSTOP, Signal::SIGKILL] {
        let key = unique_key("table:stale-holder");
        let (holder, stale) = start_holder(&server.url(), &key, ttl);
        send(&holder, sig);
        let stopped = Instant::now();
        let guard = bounded(
            Duration::from_secs(10),
            "take over",
            locks
                .lock(&key)
                .ttl(ttl)
                .wait(ttl + Duration::from_secs(2))
                .acquire(),
        )
        .await
        .expect("the stale holder's lock never expired");
        let took = stopped.elapsed();
        let fresh = guard.fencing_token().unwrap();
        eprintln!(
            "holder {sig}: taken over after {took:?}; token grew: {}",
            fresh > stale
        );
        assert!(
            took >= ttl / 2,
            "taken over after {took:?}, before the ttl allows"
        );
        assert!(
            fresh > stale,
            "the new holder's token does not exceed the stale one"
        );
        if sig == Signal::SIGSTOP {
            send(&holder, Signal::SIGCONT);
        }
        guard.release().await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// The runtime hosting the client shut down mid-hold.

#[test]
fn runtime_shut_down_mid_hold_frees_the_lock_by_its_ttl() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let hosted = client(LockConfig::single(server.url()).runtime(rt.handle().clone()));
    let key = unique_key("table:runtime-gone");
    let ttl = Duration::from_secs(1);
    let guard = rt.block_on(hosted.lock(&key).ttl(ttl).acquire()).unwrap();
    drop(rt);
    let started = Instant::now();
    let other = client(LockConfig::single(server.url()));
    let taken = other
        .lock(&key)
        .ttl(ttl)
        .wait(ttl + Duration::from_secs(2))
        .acquire_blocking();
    eprintln!(
        "hosting runtime gone mid-hold: {:?} after {:?}",
        taken.as_ref().map(drop),
        started.elapsed()
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(guard.release_blocking());
    });
    let released = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("release of a guard whose runtime is gone hangs");
    assert!(released.is_err(), "released Ok on a dead runtime");
    taken
        .expect("the lock of a dead runtime is freed by its ttl")
        .release_blocking()
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Cancellation at every await of an acquire.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_cancelled_at_any_point_leaves_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(LockConfig::single(proxy.url()));
    let ttl = Duration::from_secs(30);
    // Each round trip takes ~4ms: cancelling after 0..40ms lands at every stage of an acquire.
    proxy.set_delay(ms(2));
    for after in 0..40 {
        let key = unique_key("table:cancel");
        let cancelled = tokio::time::timeout(ms(after), locks.lock(&key).ttl(ttl).acquire()).await;
        if let Ok(guard) = cancelled {
            guard.unwrap().release().await.unwrap();
            continue;
        }
        let clean = eventually(Duration::from_secs(2), || {
            !key_exists(&server, &lock_keys(&key).lock)
        })
        .await;
        assert!(
            clean,
            "cancelled after {after}ms: a grant outlived the call (ttl {ttl:?})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The table itself.

/// Every row of `lock-runtime/FAULTS.md` names tests as `file.rs::name`; each must exist.
#[test]
fn fault_table_names_only_existing_tests() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = std::fs::read_to_string(root.join("../lock-runtime/FAULTS.md"))
        .expect("lock-runtime/FAULTS.md");
    let mut rows = 0;
    let mut missing = Vec::new();
    for line in table.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() != 3 || cells[0] == "fault" || cells[0].starts_with("---") {
            continue;
        }
        rows += 1;
        let named: Vec<&str> = cells[2]
            .split(|c: char| c.is_whitespace() || c == ',' || c == '`')
            .filter(|s| s.contains(".rs::"))
            .collect();
        assert!(!named.is_empty(), "row without a test: {line}");
        for test in named {
            let (file, name) = test.split_once("::").unwrap();
            let source = std::fs::read_to_string(root.join("tests").join(file))
                .unwrap_or_else(|e| panic!("{test}: {file}: {e}"));
            let defined = source.lines().any(|l| {
                let l = l.trim_start();
                ["fn ", "async fn ", "pub(crate) async fn ", "pub(crate) fn "]
                    .iter()
                    .any(|p| {
                        l.strip_prefix(p)
                            .and_then(|rest| rest.strip_prefix(name))
                            .is_some_and(|rest| rest.starts_with('(') || rest.starts_with('<'))
                    })
            });
            if !defined {
                missing.push(test.to_owned());
            }
        }
    }
    assert!(rows >= 20, "only {rows} rows in the fault table");
    assert!(
        missing.is_empty(),
        "the fault table names missing tests: {missing:?}"
    );
}
