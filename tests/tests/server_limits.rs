//! A single Redis node that is up but limits what it does: writes paused (`CLIENT PAUSE WRITE`),
//! no room for another connection (`maxclients`), the lock's own script made slow by a long fair
//! queue, busy with another script (`BUSY`), loading its dataset (`LOADING`), out of memory
//! (`noeviction` refuses writes; `volatile-ttl` evicts the lock key). Rows of the fault table in
//! `lock-runtime/FAULTS.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    BusyScript, CLEANUP_PAUSE, KeyEvents, LoadingServer, LockKeys, QUICK_REQUEST, RedisServer,
    SCHEDULING_SLACK, bounded, client, key_exists, lock_keys, ms, pause_writes, quick_client,
    unique_key, wait_until_async, warm_up,
};

/// One request with the default timeouts: connect 1 s + response 500 ms.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);

/// Pauses writes for `pause`, then acquires `key`; returns when the pause began, how long the
/// acquire took from then, and its outcome.
async fn acquire_in_a_pause(
    server: &RedisServer,
    locks: &LockClient,
    key: &str,
    pause: Duration,
    ttl: Duration,
    wait: Duration,
) -> (
    Instant,
    Duration,
    Result<lock_runtime::LockGuard, LockError>,
) {
    let paused = pause_writes(server, pause);
    let result = bounded(
        Duration::from_secs(10),
        "acquire",
        locks.lock(key).ttl(ttl).wait(wait).acquire(),
    )
    .await;
    (paused, paused.elapsed(), result)
}

fn pttl(server: &RedisServer, key: &str) -> Duration {
    let ms: i64 = redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.admin())
        .unwrap();
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

// ---------------------------------------------------------------------------------------------
// CLIENT PAUSE WRITE: Redis holds every write (the lock's scripts and transactions) until the
// pause ends, answering reads meanwhile.

/// A pause shorter than the wait: the acquire is held by Redis, retried with its token after a
/// response timeout, and granted once the pause ends, not before: within the pause + one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_paused_shorter_than_the_wait_the_acquire_is_granted_when_the_pause_ends() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    warm_up(&locks).await;
    let key = unique_key("limits:pause-granted");
    let pause = Duration::from_millis(800);
    let ttl = Duration::from_secs(5);
    let (_, took, result) =
        acquire_in_a_pause(&server, &locks, &key, pause, ttl, Duration::from_secs(3)).await;
    eprintln!(
        "acquire during a {pause:?} write pause: ok {} after {took:?}",
        result.is_ok()
    );
    let guard = result.expect("granted after the pause");
    assert!(
        took + Duration::from_millis(5) >= pause,
        "granted {took:?} after the pause began, before it ended"
    );
    assert!(
        took <= pause + REQUEST_TIMEOUT + SCHEDULING_SLACK,
        "granted only {took:?} after a {pause:?} pause began"
    );
    guard.release().await.unwrap();
    assert!(!key_exists(&server, &lock_keys(&key).lock));
}

/// A pause longer than the wait: `Unavailable` (timed out) within wait + one request timeout.
/// The held request runs when the pause ends (its grant lands) and the call's cleanup deletes it
/// within its longest pause + one request, not by the 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_paused_past_the_wait_the_acquire_is_unavailable_and_leaves_nothing() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    warm_up(&locks).await;
    let key = unique_key("limits:pause-unavailable");
    let lock = lock_keys(&key).lock;
    let events = KeyEvents::watch(&server, &lock);
    let wait = Duration::from_millis(200);
    let pause = Duration::from_millis(2500);
    let ttl = Duration::from_secs(30);
    let (paused, took, result) = acquire_in_a_pause(&server, &locks, &key, pause, ttl, wait).await;
    eprintln!("acquire (wait {wait:?}) during a {pause:?} write pause: {result:?} after {took:?}");
    assert!(
        matches!(&result, Err(LockError::Unavailable { causes, .. })
            if causes.iter().all(|c| c.kind == lock_runtime::FailureKind::Timeout)),
        "{result:?}"
    );
    assert!(
        took <= wait + REQUEST_TIMEOUT + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    assert!(took < pause, "the pause ended before the call answered");
    let ended = paused + pause;
    let (landed, lived) = events
        .late_grant_released(
            &lock,
            ended - Duration::from_millis(50),
            pause + Duration::from_secs(1),
            CLEANUP_PAUSE + REQUEST_TIMEOUT + SCHEDULING_SLACK,
            "the acquire held by the pause",
        )
        .await;
    eprintln!("the held acquire landed {landed:?} after the pause's end, released {lived:?} later");
}

/// A pause shorter than the validity of a held lock: its renewals are held too (the key's ttl
/// runs down past a renewal period), then go through; the lock is never reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_paused_shorter_than_the_validity_a_held_lock_is_not_lost() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("limits:pause-held");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_secs(3);
    let renew_every = ttl / 3;
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let pause = Duration::from_millis(1500);
    let paused = pause_writes(&server, pause);
    // The fault's own duration: sit out the pause (but for its last 100 ms).
    tokio::time::sleep(pause - Duration::from_millis(100)).await;
    // The cause: no renewal ran for longer than a renewal period.
    let left = pttl(&server, &lock);
    assert!(
        left < ttl - renew_every,
        "the key's ttl is {left:?} near the pause's end: a renewal got through"
    );
    assert!(!guard.is_lost(), "lost during the pause");
    // After it, the renewals go through again.
    wait_until_async(
        renew_every + REQUEST_TIMEOUT + SCHEDULING_SLACK,
        "renewed after the pause",
        || pttl(&server, &lock) > ttl - renew_every,
    )
    .await;
    let renewed = paused.elapsed();
    assert!(!guard.is_lost(), "lost after the pause");
    eprintln!(
        "held lock (ttl {ttl:?}) across a {pause:?} write pause: {left:?} left near its end, \
         renewed {renewed:?} after it began, not lost"
    );
    guard.release().await.expect("release after the pause");
}

// ---------------------------------------------------------------------------------------------
// maxclients reached.

/// Sets `maxclients` to the number of connections now open, and checks that a new connection is
/// turned away. Returns the admin connection, which counts among them.
fn fill_maxclients(server: &RedisServer) -> redis::Connection {
    let mut admin = server.admin();
    let info: String = redis::cmd("INFO").arg("clients").query(&mut admin).unwrap();
    let connected: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(connected)
        .query(&mut admin)
        .unwrap();
    // The fault as meant: a new connection is told so, and closed.
    let refusal = {
        let mut con = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        con.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut said = String::new();
        let _ = std::io::Read::read_to_string(&mut con, &mut said);
        said
    };
    assert!(
        refusal.contains("max number of clients"),
        "a new connection was told {refusal:?}"
    );
    admin
}

/// Past `maxclients` a new client's acquire is `Unavailable` (a broken connection, retried within
/// the wait like any), never `Contended`; a client connected before keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxclients_reached_a_new_client_is_unavailable_and_an_existing_one_keeps_working() {
    let server = RedisServer::start();
    let old = client(LockConfig::single(server.url()));
    let ttl = Duration::from_secs(1);
    let held_key = unique_key("limits:maxclients-held");
    let held = old.lock(&held_key).ttl(ttl).acquire().await.unwrap();
    let _admin = fill_maxclients(&server);

    for wait in [Duration::ZERO, Duration::from_secs(2)] {
        let fresh = client(LockConfig::single(server.url()));
        let key = unique_key("limits:maxclients-new");
        let started = Instant::now();
        let result = bounded(
            Duration::from_secs(10),
            "acquire",
            fresh.lock(&key).wait(wait).acquire(),
        )
        .await;
        let took = started.elapsed();
        eprintln!("new client past maxclients (wait {wait:?}): {result:?} after {took:?}");
        let Err(LockError::Unavailable { causes, .. }) = &result else {
            panic!("new client past maxclients: {result:?}");
        };
        assert!(!causes.is_empty(), "no cause");
        assert!(
            took <= wait + REQUEST_TIMEOUT + SCHEDULING_SLACK,
            "answered after {took:?}"
        );
    }

    // The existing client: its held lock renews through two renewal periods, and it takes and
    // releases another lock.
    tokio::time::sleep(ttl).await;
    assert!(!held.is_lost(), "the existing client's lock was lost");
    let other = old
        .lock(unique_key("limits:maxclients-old"))
        .acquire()
        .await;
    other
        .expect("the existing client could not acquire")
        .release()
        .await
        .unwrap();
    held.release().await.expect("the existing client's release");
}

// ---------------------------------------------------------------------------------------------
// The lock's own script made slow: a long fair line.

/// Adds `n` fake waiters to the fair line of `name`: tickets `first_ticket..`, each entry's lease
/// expiring at `lease_ms` (server clock), tokens `<tag>:<i>`.
fn queue_fake_waiters(
    server: &RedisServer,
    name: &str,
    tag: &str,
    n: u64,
    first_ticket: u64,
    lease_ms: i64,
) {
    let LockKeys {
        queue,
        queue_leases: leases,
        ..
    } = lock_keys(name);
    let mut admin = server.admin();
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let mut by_ticket = redis::cmd("ZADD");
        by_ticket.arg(&queue);
        let mut by_lease = redis::cmd("ZADD");
        by_lease.arg(&leases);
        for i in chunk {
            by_ticket.arg(first_ticket + i).arg(format!("{tag}:{i}"));
            by_lease.arg(lease_ms).arg(format!("{tag}:{i}"));
        }
        let (_, _): (i64, i64) = redis::pipe()
            .add_command(by_ticket)
            .add_command(by_lease)
            .query(&mut admin)
            .unwrap();
    }
}

fn server_ms(server: &RedisServer) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut server.admin()).unwrap();
    secs * 1000 + micros / 1000
}

/// 100,000 stale entries in a fair lock's line (waiters that died: leases run out, tickets older
/// than anyone's) make each script that purges them slow, once. The acquire is still granted
/// within one response timeout, and so is a release that purges them while 10,000 live waiters
/// queue: it hands the lock to the first live one; no stale entry is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_fair_line_of_stale_entries_is_purged_within_the_request_bounds() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    warm_up(&locks).await;
    let response_timeout = Duration::from_millis(500);
    let key = unique_key("limits:long-line");
    let LockKeys {
        queue,
        queue_leases: leases,
        ..
    } = lock_keys(&key);
    let stale = 100_000;

    // The acquire purges them.
    queue_fake_waiters(&server, &key, "stale", stale, 1, server_ms(&server) - 1000);
    assert_eq!(server.zcard(&queue), stale);
    let started = Instant::now();
    let guard = bounded(
        REQUEST_TIMEOUT * 2,
        "fair acquire",
        locks.lock(&key).fair(true).acquire(),
    )
    .await
    .expect("fair acquire past a stale line");
    let acquired = started.elapsed();
    assert_eq!(
        server.zcard(&queue) + server.zcard(&leases),
        0,
        "stale entries left"
    );

    // The release purges them, with live waiters behind them.
    queue_fake_waiters(
        &server,
        &key,
        "stale-again",
        stale,
        1,
        server_ms(&server) - 1000,
    );
    let live = 10_000;
    queue_fake_waiters(
        &server,
        &key,
        "live",
        live,
        1_000_000,
        server_ms(&server) + 60_000,
    );
    let started = Instant::now();
    bounded(REQUEST_TIMEOUT * 2, "fair release", guard.release())
        .await
        .expect("fair release past a stale line");
    let released = started.elapsed();
    eprintln!(
        "{stale} stale entries: fair acquire {acquired:?}, release (10,000 live behind) {released:?}"
    );
    assert!(
        acquired <= response_timeout + SCHEDULING_SLACK
            && released <= response_timeout + SCHEDULING_SLACK,
        "acquire {acquired:?}, release {released:?}: past one response timeout"
    );
    let holder: Option<String> = redis::cmd("GET")
        .arg(lock_keys(&key).lock)
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(
        holder.as_deref(),
        Some("live:0"),
        "not handed to the first live waiter"
    );
    assert_eq!(
        server.zcard(&queue),
        live - 1,
        "stale entries left in the line"
    );
    assert_eq!(
        server.zcard(&leases),
        live - 1,
        "stale entries left among the leases"
    );
}

// ---------------------------------------------------------------------------------------------
// Busy with another script (`BUSY`) or loading its dataset (`LOADING`): transient replies,
// retried within `wait`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_script_is_retried_within_wait() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    // Connect first, so only the BUSY reply is new.
    locks
        .lock(unique_key("life:warm"))
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let busy = BusyScript::start(&server, ms(700));
    let key = unique_key("life:busy");
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire during BUSY",
        locks.lock(&key).wait(Duration::from_secs(3)).acquire(),
    )
    .await;
    eprintln!(
        "acquire (wait 3s) started during BUSY: {result:?} after {:?}",
        started.elapsed()
    );
    busy.join();
    let guard = result.expect("a BUSY reply must be retried within wait");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_dataset_is_retried_within_wait() {
    let mut server = LoadingServer::prepare(10_000, 100);
    let locks = client(LockConfig::single(server.url()));
    server.start_loading();
    let key = unique_key("life:loading");
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(15),
        "acquire during LOADING",
        locks.lock(&key).wait(Duration::from_secs(8)).acquire(),
    )
    .await;
    eprintln!(
        "acquire (wait 8s) started during LOADING: {result:?} after {:?}",
        started.elapsed()
    );
    assert!(
        server.wait_loaded(Duration::from_secs(20)),
        "never finished loading"
    );
    let guard = result.expect("a LOADING reply must be retried within wait");
    guard.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Out of memory: writes refused under `noeviction`, the lock key evicted under `volatile-ttl`.

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
