//! The rows of the fault table (`lock-runtime/FAULTS.md`) that no other test file covers, and a
//! check that every row of that table names a test that exists.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockError};
use lock_tests::{
    CLEANUP_PAUSE, FaultProxy, KeyEvents, QUICK_REQUEST, RedisMasters, RedisServer,
    SCHEDULING_SLACK, ServerOptions, Worker, assert_lost_at_the_deadline, await_waiter, bounded,
    bounded_blocking, client, default_validity, eventually, key_exists, lock_keys, ms,
    quick_client, unique_key, wait_until, wait_until_async, warm_up,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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

/// The connection is made, then partitioned (blackhole: the proxy reads and holds the bytes):
/// the acquire answers `Unavailable` within wait + one request timeout. Once the partition heals,
/// the held requests reach Redis: the grant lands there (a keyspace `set` event, after the call
/// failed), and the call's cleanup deletes it within one cleanup retry pause (at most 1 s, the
/// engine's backoff) + one request timeout: a leak would live for the 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_before_acquire_is_unavailable_and_leaves_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick_client(proxy.url());
    let key = unique_key("table:partition-before");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_secs(30);
    let wait = ms(500);
    // Connected (scripts loaded) before the partition, so the acquire itself is what is held.
    warm_up(&locks).await;
    let events = KeyEvents::watch(&server, &lock);
    proxy.set_blackhole(true);
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire",
        locks.lock(&key).ttl(ttl).wait(wait).acquire(),
    )
    .await;
    let failed = Instant::now();
    let took = failed - started;
    eprintln!("acquire (wait {wait:?}) behind a partition: {result:?} after {took:?}");
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(
        took <= wait + QUICK_REQUEST + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    assert!(
        !key_exists(&server, &lock),
        "the partition let the acquire through"
    );
    // The held bytes reach Redis once the partition heals: the late grant lands, then the
    // cleanup's release deletes it, long before the ttl.
    let healed = Instant::now();
    proxy.set_blackhole(false);
    let bound = CLEANUP_PAUSE + QUICK_REQUEST + SCHEDULING_SLACK;
    let (landed, lived) = events
        .late_grant_released(
            &lock,
            healed,
            Duration::from_secs(2),
            bound,
            "the acquire held in the partition",
        )
        .await;
    eprintln!(
        "partition healed: the late grant landed {landed:?} later, released {lived:?} after \
         (bound {bound:?}, ttl {ttl:?})"
    );
    assert!(
        !key_exists(&server, &lock),
        "granted again after the cleanup: {:?}",
        events.of(&lock)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_while_waiting_still_gets_the_lock_within_wait() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = client(LockConfig::single(server.url()));
    let waiter = quick_client(proxy.url());
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
    let locks = quick_client(proxy.url());
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

/// Three of five Redlock nodes frozen while held: no quorum confirms a renewal, so the holder is
/// told `Lost` at its validity deadline, ttl - drift (1 s - 12 ms) after its acquire was sent: not
/// before, and not later than that deadline (counted from when the grant returned) + scheduling
/// slack (the renewal driver's timer fires at the deadline). Another acquire is `Unavailable`
/// within wait + one request timeout.
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
    let validity = default_validity(ttl);
    let started = Instant::now();
    let guard = holder.lock(&key).ttl(ttl).acquire().await.unwrap();
    let granted = Instant::now();
    for node in &cluster.nodes[..3] {
        node.freeze();
    }
    let frozen = Instant::now();
    bounded(
        validity + SCHEDULING_SLACK + Duration::from_secs(1),
        "lost()",
        guard.lost(),
    )
    .await;
    let lost = Instant::now();
    let wait = ms(300);
    let asked = Instant::now();
    let result = other.lock(&key).ttl(ttl).wait(wait).acquire().await;
    let took = asked.elapsed();
    for node in &cluster.nodes[..3] {
        node.thaw();
    }
    eprintln!(
        "3 of 5 frozen ({:?} after the grant): holder lost {:?} after the acquire was called \
         (validity {validity:?}); acquire {:?} after {took:?}",
        frozen - granted,
        lost - started,
        result.as_ref().map(drop)
    );
    assert_lost_at_the_deadline(started, granted, lost, validity);
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(
        took <= wait + QUICK_REQUEST + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
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

/// The lock key evicted (`volatile-ttl` picks it, the key closest to expiry): the holder is told
/// `Lost` at its next renewal, within one renewal period (ttl / 3 = 1 s) + one request timeout
/// + slack of the eviction, long before its 3 s ttl.
#[tokio::test]
async fn evicted_lock_key_is_reported_lost() {
    let server = RedisServer::start();
    let locks = quick_client(server.url());
    let key = unique_key("table:evicted");
    let lock = lock_keys(&key).lock;
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
    // The eviction came after this instant: the lock was still there, and not lost.
    let mut present = Instant::now();
    for _ in 0..100 {
        if !key_exists(&server, &lock) {
            break;
        }
        assert!(!guard.is_lost(), "lost before the eviction");
        present = Instant::now();
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
    assert!(!key_exists(&server, &lock), "the lever failed: not evicted");
    let bound = ttl / 3 + QUICK_REQUEST + SCHEDULING_SLACK;
    bounded(bound, "lost() after eviction", guard.lost()).await;
    let took = present.elapsed();
    eprintln!("lock key evicted: lost at most {took:?} later (bound {bound:?})");
    assert!(took <= bound, "lost {took:?} after the eviction");
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

/// The runtime hosting a client shut down while it holds a lock: renewal stops with it, so the
/// key expires by its ttl after its last write (a keyspace `expired` event, not before that
/// write + ttl - slack, not after it + slack) and nothing renews it afterwards; another client then
/// gets it within its retry delay (100 ms, jitter 1.5x) + slack of the expiry. The dead client's
/// lock calls and the guard's release answer with an error within one request timeout
/// (connect 1 s + response 500 ms, the defaults) + slack: never a hang, never `Ok`.
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
    let lock = lock_keys(&key).lock;
    let events = KeyEvents::watch(&server, &lock);
    let ttl = Duration::from_secs(1);
    let request = ms(1500);
    let guard = rt.block_on(hosted.lock(&key).ttl(ttl).acquire()).unwrap();
    drop(rt);
    let dropped = Instant::now();
    let other = client(LockConfig::single(server.url()));
    let taken = {
        let key = key.clone();
        bounded_blocking(ttl * 3, "the other client's acquire", move || {
            let taken = other
                .lock(&key)
                .ttl(ttl)
                .wait(ttl + Duration::from_secs(2))
                .acquire_blocking();
            (taken, Instant::now())
        })
    };
    let (taken, taken_at) = taken;
    let removal = ["del", "expired", "evicted"];
    let since = dropped - Duration::from_secs(60);
    wait_until(SCHEDULING_SLACK, "the removal heard", || {
        events.first_after(&lock, &removal, since).is_some()
    });
    let history = events.of(&lock);
    // The dead client's key: its writes (grant, renewals), then its removal. (A notification is
    // heard a moment after the write, so the grant may be heard after `dropped`.)
    let end = history
        .iter()
        .position(|e| removal.contains(&e.event.as_str()))
        .unwrap_or_else(|| panic!("the lock was never freed: {history:?}"));
    let removed = &history[end];
    let last_write = history[..end]
        .iter()
        .rfind(|e| e.event == "set" || e.event == "expire")
        .unwrap_or_else(|| panic!("no grant seen: {history:?}"))
        .at;
    eprintln!(
        "hosting runtime gone mid-hold: {} {:?} after the last renewal; the other client {:?} \
         {:?} after that",
        removed.event,
        removed.at - last_write,
        taken.as_ref().map(drop),
        taken_at.saturating_duration_since(removed.at)
    );
    assert!(
        last_write <= dropped + SCHEDULING_SLACK,
        "renewed after its runtime was gone: {history:?}"
    );
    assert_eq!(removed.event, "expired", "{history:?}");
    assert!(
        removed.at + SCHEDULING_SLACK >= last_write + ttl,
        "freed {:?} after its last write, before its ttl",
        removed.at - last_write
    );
    assert!(
        removed.at <= last_write + ttl + SCHEDULING_SLACK,
        "freed {:?} after its last write, past its ttl",
        removed.at - last_write
    );
    assert!(
        taken_at <= removed.at + ms(150) + SCHEDULING_SLACK,
        "taken {:?} after the key expired",
        taken_at.saturating_duration_since(removed.at)
    );
    // The dead client answers, with an error.
    let asked = Instant::now();
    let again = {
        let (hosted, key) = (hosted.clone(), unique_key("table:runtime-gone-again"));
        bounded_blocking(request * 2, "a lock call on a dead runtime", move || {
            hosted.lock(&key).acquire_blocking()
        })
    };
    let took = asked.elapsed();
    assert!(
        matches!(again, Err(LockError::Runtime { .. })),
        "{:?}",
        again.map(drop)
    );
    assert!(
        took <= request + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    let asked = Instant::now();
    let released = bounded_blocking(request * 2, "the release on a dead runtime", move || {
        guard.release_blocking()
    });
    let took = asked.elapsed();
    eprintln!("dead runtime: lock call and release answered, release {released:?} in {took:?}");
    assert!(released.is_err(), "released Ok on a dead runtime");
    assert!(
        took <= request + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    taken
        .expect("the lock of a dead runtime is freed by its ttl")
        .release_blocking()
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Cancellation at every await of an acquire.

/// An acquire cancelled after 0..40 ms, with a 10 ms link each way (a round trip of ~20 ms, on a
/// connection made beforehand): the cancellation lands at every stage, before the request left,
/// while it travels, while the reply does, and after, so some grants
/// reaches Redis once nobody waits for it any more (keyspace `set` events prove it, and the test
/// requires such late grants). Each grant must be released within one request timeout (+ slack)
/// of landing or of the cancellation, whichever is later: a leak would live for the 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_cancelled_at_any_point_leaves_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick_client(proxy.url());
    let ttl = Duration::from_secs(30);
    let events = KeyEvents::watch(&server, "*");
    warm_up(&locks).await;
    proxy.set_delay(ms(10));
    let mut cancelled = Vec::new();
    for after in 0..40 {
        let key = unique_key("table:cancel");
        let attempt = tokio::time::timeout(ms(after), locks.lock(&key).ttl(ttl).acquire()).await;
        if let Ok(guard) = attempt {
            guard.unwrap().release().await.unwrap();
            continue;
        }
        cancelled.push((after, lock_keys(&key).lock, Instant::now()));
    }
    let bound = QUICK_REQUEST + SCHEDULING_SLACK;
    let (mut late, mut early, mut unsent) = (0, 0, 0);
    for (after, lock, at) in &cancelled {
        // Anything sent before the cancellation has landed by now, or lands within a link delay.
        wait_until_async(
            bound,
            &format!("cancelled after {after}ms: {lock} gone"),
            || !key_exists(&server, lock),
        )
        .await;
        let Some(landed) = events.first_after(lock, &["set"], *at - Duration::from_secs(60)) else {
            unsent += 1;
            continue;
        };
        let removed = events
            .first_after(lock, &["del", "expired", "evicted"], landed.at)
            .unwrap_or_else(|| panic!("cancelled after {after}ms: {:?}", events.of(lock)));
        let from = landed.at.max(*at);
        let lived = removed.at.saturating_duration_since(from);
        if landed.at > *at {
            late += 1;
        } else {
            early += 1;
        }
        assert_eq!(
            removed.event, "del",
            "cancelled after {after}ms: the grant was not released"
        );
        assert!(
            lived <= bound,
            "cancelled after {after}ms: a grant outlived the call by {lived:?} (bound {bound:?}, \
             ttl {ttl:?})"
        );
    }
    eprintln!(
        "{} of 40 acquires cancelled: {late} granted after the cancellation, {early} granted \
         before it (reply unseen), {unsent} never reached Redis",
        cancelled.len()
    );
    assert!(
        late > 0,
        "no grant landed after its call was cancelled: the lever missed"
    );
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
