//! A holder process killed (SIGKILL) or paused (SIGSTOP: a GC pause, a VM stall) past its ttl:
//! its lock is free once its key expires, not before, and whoever takes it then has a larger
//! fencing token; a paused holder, once resumed, learns that it lost the lock, through a guard, a
//! sync attribute call or an async one, and never reports a success. Rows of the fault table in
//! `lock-runtime/FAULTS.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisServer, Worker, bounded, client, lock_keys, unique_key, wait_until_async};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The holder's ttl (`paused_holder` takes every lock with 1s).
const TTL: Duration = Duration::from_secs(1);
/// One request with the default timeouts: connect 1s + response 500ms.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);
/// Scheduling slack on this loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(250);
/// The default retry delay (100ms) at its largest jitter (x1.5): how late a waiter that was not
/// woken (an expiry publishes nothing) asks again.
const LONGEST_BACKOFF: Duration = Duration::from_millis(150);

fn pttl(admin: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(admin).unwrap()
}

fn start(server: &RedisServer, key: &str, go: &std::path::Path, mode: &str) -> (Worker, u64) {
    let mut holder = Worker::spawn(
        env!("CARGO_BIN_EXE_paused_holder"),
        &[server.url().as_str(), key, go.to_str().unwrap(), mode],
    );
    let line = holder.next_line(Duration::from_secs(20));
    let fence = line
        .strip_prefix("acquired fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("paused_holder said {line:?}"));
    (holder, fence)
}

/// Pauses a holder running `mode` past its ttl, takes the lock over, resumes the holder and
/// returns what it printed after the resume (`go`: whether to let its body finish by itself).
async fn pause_past_the_ttl(mode: &str, go: bool) -> Vec<String> {
    let server = RedisServer::start();
    let locks = LockClient::new(LockConfig::single(server.url()).fencing(true)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let go_file = dir.path().join("go");
    let key = unique_key(&format!("pauses:{mode}"));
    let redis_key = lock_keys(&key).lock;
    let (mut holder, stale) = start(&server, &key, &go_file, mode);

    holder.pause();
    let paused = Instant::now();
    // The key's remaining time once nothing can renew it: the earliest the lock may change hands.
    let left = Duration::from_millis(u64::try_from(pttl(&mut server.admin(), &redis_key)).unwrap());
    let left_at = Instant::now();
    let fresh = bounded(
        TTL + Duration::from_secs(5),
        "take over",
        locks.lock(&key).ttl(TTL).wait(TTL + SLACK * 4).acquire(),
    )
    .await
    .expect("the paused holder's lock was never taken over");
    let took = left_at.elapsed();
    eprintln!(
        "{mode}: key had {left:?} left when paused; taken over {took:?} later; token grew: {}",
        fresh.fencing_token().unwrap() > stale
    );
    // Redis expires the key by its own clock: not a millisecond before its PTTL (rounding aside).
    assert!(
        took + Duration::from_millis(2) >= left,
        "{mode}: taken over after {took:?}, before the key's {left:?} ran out"
    );
    assert!(
        took <= left + LONGEST_BACKOFF + SLACK,
        "{mode}: taken over only {took:?} after the pause, the key had {left:?} left"
    );
    assert!(
        fresh.fencing_token().unwrap() > stale,
        "{mode}: the new holder's token does not exceed the paused one's"
    );

    // The cause: the holder stayed stopped until its key expired, so past its validity (which
    // ends before the key's expiry, measured from the sending of its last renewal).
    let pause = paused.elapsed();
    assert!(pause >= left, "{mode}: paused for {pause:?} only");
    holder.resume();
    let resumed = Instant::now();
    if go {
        std::fs::write(&go_file, b"").unwrap();
    }
    let mut said = Vec::new();
    loop {
        let line = holder.next_line(Duration::from_secs(10));
        let last = line.starts_with("outcome=");
        said.push(line);
        if last {
            break;
        }
    }
    let answered = resumed.elapsed();
    eprintln!("{mode}: paused {pause:?}; after the resume it said {said:?} within {answered:?}");
    assert!(
        answered <= REQUEST_TIMEOUT + SLACK,
        "{mode}: the resumed holder took {answered:?} to answer"
    );
    holder
        .finish(Duration::from_secs(10))
        .assert_success("paused_holder");

    // Its release did not touch the new holder's key, which still is ours.
    assert!(!fresh.is_lost(), "{mode}: the new holder lost the lock");
    fresh.release().await.expect("the new holder's release");
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_guard_says_lost_after_the_resume() {
    let said = pause_past_the_ttl("guard", true).await;
    assert_eq!(said, ["is_lost=true", "outcome=lost"], "the resumed guard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_sync_attribute_call_returns_lost() {
    let said = pause_past_the_ttl("sync", true).await;
    assert_eq!(said, ["outcome=lost"], "the resumed sync call");
}

/// No go file: the body would run for a minute; only the loss can end it (cancelled at its
/// next `.await`) within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_async_attribute_call_is_cancelled_with_lost() {
    let said = pause_past_the_ttl("async", false).await;
    assert_eq!(said, ["outcome=lost"], "the resumed async call");
}

#[tokio::test]
async fn killed_holder_process_frees_the_lock_after_its_ttl_not_before() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let key = unique_key("faults:killed");
    let ttl = Duration::from_secs(2);
    let renew_every = ttl / 3;

    let mut holder = Worker::spawn(
        env!("CARGO_BIN_EXE_holder"),
        &[&server.url(), &key, &ttl.as_millis().to_string()],
    );
    let line = holder.next_line(Duration::from_secs(20));
    assert!(line.starts_with("acquired"), "holder said {line:?}");

    // See one renewal from the other process first (the PTTL jumps back up), then kill it.
    let mut last = pttl(&mut admin, &lock_keys(&key).lock);
    assert!(last > 0, "holder's lock not in redis: pttl {last}");
    wait_until_async(renew_every * 3, "a renewal of the holder's lock", || {
        let now = pttl(&mut admin, &lock_keys(&key).lock);
        let jumped = now > last + 100;
        last = now;
        jumped
    })
    .await;
    let queried = Instant::now();
    let left_at_kill = pttl(&mut admin, &lock_keys(&key).lock);
    holder.kill();
    let killed = Instant::now();

    let locks = client(LockConfig::single(server.url()).fencing(true));
    let err = locks
        .lock(&key)
        .ttl(ttl)
        .acquire()
        .await
        .expect_err("a killed holder's lock was free right away");
    let probed = killed.elapsed();
    assert!(err.is_contended(), "got {err:?}");
    assert!(
        probed < ttl / 2,
        "probe came too late to mean anything: {probed:?}"
    );

    let guard = bounded(
        Duration::from_secs(10),
        "acquire after the holder died",
        locks
            .lock(&key)
            .ttl(ttl)
            .wait(ttl + Duration::from_secs(2))
            .acquire(),
    )
    .await
    .expect("the lock of a killed holder was never freed");
    let freed = killed.elapsed();
    let since_query = queried.elapsed();
    let left = Duration::from_millis(u64::try_from(left_at_kill).unwrap());
    eprintln!(
        "holder SIGKILLed with {left_at_kill}ms of ttl left: lock taken over {} ms after the kill \
         (ttl {} ms, renew every {} ms)",
        freed.as_millis(),
        ttl.as_millis(),
        renew_every.as_millis()
    );
    // The last renewal was at most one interval before the kill (plus the 20ms batch window).
    assert!(
        freed + Duration::from_millis(50) >= ttl - renew_every,
        "freed {freed:?} after the kill: earlier than its ttl allows"
    );
    // Sharper: Redis reported `left` of ttl just before the kill; not a millisecond of it is cut.
    assert!(
        since_query + Duration::from_millis(2) >= left,
        "taken over {since_query:?} after Redis reported {left:?} of ttl left"
    );
    assert!(
        freed <= ttl + Duration::from_secs(2),
        "freed only after {freed:?}"
    );
    guard.release().await.unwrap();
}

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
    let locks = client(LockConfig::single(server.url()).fencing(true));
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
