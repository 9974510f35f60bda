//! Single-node failure behaviour: Redis down, frozen or tampered with, a flaky link, unknown
//! outcomes, a crashed holder process, bad credentials, and secrets that must never show in
//! `Debug` output or logs. (Cancellation, drop and panic are in the behaviour suite.)
//!
//! Timings are measured and printed (`--nocapture` shows them). Upper bounds are asserted only where
//! the bound is the behaviour under test, and then generously.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockConfig, LockError, LockGuard};
use lock_tests::{
    FaultProxy, KeyEvents, RedisServer, SCHEDULING_SLACK, ServerOptions, Worker,
    assert_lost_at_the_deadline, bounded, capture, client, default_validity, free_port, lock_keys,
    unique_key, wait_until, wait_until_async, warm_up,
};

/// The Redis key of lock `name` under the default prefix.
fn redis_key(name: &str) -> String {
    lock_keys(name).lock
}

fn exists(admin: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(admin).unwrap()
}

fn get(admin: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(admin).unwrap()
}

fn pttl(admin: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(admin).unwrap()
}

/// Waits until `key` is gone from the server; panics after `timeout`. Returns the time it took.
async fn wait_gone(server: &RedisServer, key: &str, timeout: Duration, what: &str) -> Duration {
    let mut admin = server.admin();
    wait_until_async(timeout, &format!("{what}: {key} gone"), || {
        !exists(&mut admin, key)
    })
    .await
}

fn causes(err: &LockError) -> &[lock_runtime::NodeFailure] {
    match err {
        LockError::Unavailable { causes, .. } => causes,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Redis down

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
    let found = causes(&err);
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

// ---------------------------------------------------------------------------------------------
// 2. Redis frozen

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
    wait_gone(
        &server,
        &redis_key(&key),
        ttl + Duration::from_secs(1),
        "after thaw",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 3. Key deleted or overwritten by someone else

#[tokio::test]
async fn externally_deleted_key_is_lost_within_a_renewal_period() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("faults:deleted");
    let ttl = Duration::from_millis(900);

    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let deleted: i64 = redis::cmd("DEL")
        .arg(redis_key(&key))
        .query(&mut admin)
        .unwrap();
    assert_eq!(deleted, 1, "the lock key was not where expected");
    let at = Instant::now();
    bounded(
        ttl / 3 + Duration::from_secs(1),
        "lost() after DEL",
        guard.lost(),
    )
    .await;
    eprintln!("deleted key: lost after {:?}", at.elapsed());
    assert!(guard.is_lost());
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "got {released:?}"
    );
}

#[tokio::test]
async fn externally_overwritten_key_is_lost_and_not_deleted_by_release() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("faults:overwritten");
    let ttl = Duration::from_millis(900);

    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let () = redis::cmd("SET")
        .arg(redis_key(&key))
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query(&mut admin)
        .unwrap();
    let at = Instant::now();
    bounded(
        ttl / 3 + Duration::from_secs(1),
        "lost() after SET",
        guard.lost(),
    )
    .await;
    eprintln!("overwritten key: lost after {:?}", at.elapsed());
    assert!(guard.is_lost());
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "got {released:?}"
    );
    assert_eq!(
        get(&mut admin, &redis_key(&key)).as_deref(),
        Some("someone-else"),
        "release deleted or changed another owner's lock"
    );
    // The other owner's lock is respected: contended, not stolen.
    let err = locks
        .lock(&key)
        .acquire()
        .await
        .expect_err("stole the lock");
    assert!(err.is_contended(), "got {err:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. A single failed renewal is not a loss

#[tokio::test]
async fn a_failed_renewal_within_validity_is_not_a_loss() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(
        LockConfig::single(proxy.url())
            // Shorter than the blackhole, so the renewal inside it really fails (times out).
            .response_timeout(Duration::from_millis(200)),
    );
    let key = unique_key("faults:blip");
    let ttl = Duration::from_secs(3);
    // The logs prove that a renewal really failed in the blackhole (else this test proves nothing).
    capture::install();
    let every = ttl / 3;

    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let acquired = Instant::now();
    // The first renewal is due `every` after the grant: cut the link around it, for 600ms.
    tokio::time::sleep_until((acquired + every - Duration::from_millis(300)).into()).await;
    proxy.set_blackhole(true);
    tokio::time::sleep_until((acquired + every + Duration::from_millis(300)).into()).await;
    proxy.set_blackhole(false);
    assert!(!guard.is_lost(), "lost during a 600ms blip of a 3s lock");

    // Past the original validity and two more renewal periods: renewals must have resumed.
    let until = acquired + every + Duration::from_millis(300) + 2 * every + every / 2;
    let lost = tokio::time::timeout(until - Instant::now(), guard.lost()).await;
    assert!(
        lost.is_err(),
        "declared lost {:?} after the grant although the link healed",
        acquired.elapsed()
    );
    let mut admin = server.admin();
    let left = pttl(&mut admin, &redis_key(&key));
    eprintln!(
        "after a 600ms blackhole: still held {:?} after the grant, server pttl {left}ms",
        acquired.elapsed()
    );
    assert!(left > 0, "the key is gone or has no ttl: pttl {left}");
    let failed_renewals = capture::text()
        .lines()
        .filter(|l| l.contains("renewal failed") && l.contains(&key))
        .count();
    eprintln!("after a 600ms blackhole: {failed_renewals} failed renewal(s) logged");
    assert!(
        failed_renewals >= 1,
        "no renewal failed during the blackhole: the fault missed the renewal"
    );
    bounded(Duration::from_secs(5), "release", guard.release())
        .await
        .expect("release after a healed blip");
    assert!(!exists(&mut admin, &redis_key(&key)));
}

#[tokio::test]
async fn cut_connections_while_held_are_not_a_loss() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(LockConfig::single(proxy.url()));
    let key = unique_key("faults:cut");
    let ttl = Duration::from_secs(3);

    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let acquired = Instant::now();
    // Reset every connection twice while held: renewal must reconnect and carry on.
    for _ in 0..2 {
        proxy.cut_all();
        tokio::time::sleep(ttl / 3).await;
    }
    let until = acquired + ttl + ttl / 3;
    let lost = tokio::time::timeout(until - Instant::now(), guard.lost()).await;
    assert!(
        lost.is_err(),
        "declared lost {:?} after the grant although only connections were reset",
        acquired.elapsed()
    );
    bounded(Duration::from_secs(5), "release", guard.release())
        .await
        .expect("release after reconnecting");
    assert!(server.keys(&redis_key(&key)).is_empty());
}

// ---------------------------------------------------------------------------------------------
// 5. Unknown outcome of an acquire

/// The server's clock in microseconds (`TIME`).
fn server_clock_us(admin: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(admin).unwrap();
    secs * 1_000_000 + micros
}

/// A same-token retry whose grant comes long after an earlier attempt of the same token landed
/// (its reply lost) gets a token raised to its own grant's server clock, as every grant does (the
/// clock is the floor that keeps tokens growing across what loses a counter): it used to answer
/// the counter as the lost grant left it. The link delays each way by 400 ms with 200 ms
/// timeouts, so the first attempt lands (keyspace `set`) but is never answered; the link heals
/// 1.5 s in, and the retry that succeeds then finds the key ours. Its token is at least the
/// server's clock read right after the acquire returned, less the transaction's lag
/// (`FENCE_LAG_US`, 100 ms) and the slack for that read.
#[tokio::test]
async fn a_same_token_retry_long_after_its_lost_grant_gets_a_token_at_the_clock() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let timeout = Duration::from_millis(200);
    let locks = client(
        LockConfig::single(proxy.url())
            .connect_timeout(timeout)
            .response_timeout(timeout),
    );
    let key = unique_key("faults:same-token");
    let lock = redis_key(&key);
    warm_up(&locks).await;
    let events = KeyEvents::watch(&server, &lock);
    let mut admin = server.admin();
    let heal_after = Duration::from_millis(1500);
    proxy.set_delay(Duration::from_millis(400));
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        bounded(
            Duration::from_secs(15),
            "acquire with wait through a slow link",
            locks.lock(&key).wait(Duration::from_secs(5)).acquire(),
        ),
        async {
            tokio::time::sleep(heal_after).await;
            proxy.set_delay(Duration::ZERO);
        },
    );
    let guard = result.expect("acquired once the link healed");
    let clock_after = server_clock_us(&mut admin);
    let returned = Instant::now();
    let token = guard.fencing_token().expect("fencing is on");
    // The cause: the same token's grant landed long before the one that was answered.
    let first = events
        .first_after(&lock, &["set"], started)
        .expect("the first attempt's grant landed");
    assert!(
        returned - first.at >= Duration::from_millis(800),
        "the first grant landed {:?} before the acquire returned: too close to show anything",
        returned - first.at
    );
    let floor = clock_after - 100_000 - SCHEDULING_SLACK.as_micros() as u64;
    eprintln!(
        "same-token retry: first grant {:?} after the start, answered {:?}; token {token}, \
         server clock after {clock_after} ({} us apart)",
        first.at - started,
        returned - started,
        clock_after.saturating_sub(token)
    );
    assert!(
        token >= floor,
        "token {token} is {} us below the server's clock right after the grant",
        clock_after.saturating_sub(token)
    );
    guard.release().await.unwrap();
}

/// A reply delayed past the response timeout (400 ms each way, timeout 200 ms): the outcome is
/// unknown, so the call says `Unavailable` (a timeout, never `Contended`). The request did reach
/// Redis (a keyspace `set` event after the call returned); the cleanup release, sent when the call
/// failed, follows it down the same link: the grant is deleted within one request timeout of
/// landing (+ slack), not by its 30 s ttl. With a wait, the same token is retried and wins.
/// From a current-thread runtime the calls go over the client's shared connection.
#[tokio::test]
async fn acquire_with_unknown_outcome_leaves_no_orphan() {
    unknown_outcome_leaves_no_orphan(false).await;
}

/// The same from a multi-thread runtime, whose calls go over a connection of its own (made once
/// the shared one is): the cleanup follows the acquire down that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_unknown_outcome_over_the_callers_connection_leaves_no_orphan() {
    unknown_outcome_leaves_no_orphan(true).await;
}

async fn unknown_outcome_leaves_no_orphan(callers_own: bool) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let (connect, response) = (Duration::from_millis(200), Duration::from_millis(200));
    let locks = client(
        LockConfig::single(proxy.url())
            .connect_timeout(connect)
            .response_timeout(response),
    );
    let direct = client(LockConfig::single(server.url()));
    let key = unique_key("faults:unknown");
    let lock = redis_key(&key);
    let ttl = Duration::from_secs(30);
    // Connect through the proxy first, so only the acquire itself is slow.
    warm_up(&locks).await;
    if callers_own {
        // The shared connection and the runtime's own: nothing else has connected yet.
        let made = || server.client_ids().len() == 2;
        tokio::task::block_in_place(|| {
            wait_until(Duration::from_secs(2), "the runtime's connection", made)
        });
    }
    let events = KeyEvents::watch(&server, &lock);

    proxy.set_delay(Duration::from_millis(400));
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire through a slow link",
        locks.lock(&key).ttl(ttl).acquire(),
    )
    .await;
    let returned = Instant::now();
    match result {
        Err(LockError::Unavailable { causes, .. }) => {
            eprintln!("slow link: unavailable after {:?}", returned - started);
            assert!(
                causes.iter().all(|c| c.kind == FailureKind::Timeout),
                "{causes:?}"
            );
        }
        other => panic!(
            "a reply 800 ms away with a 200 ms timeout: expected Unavailable (never Contended: \
             the only holder is ourselves), got {other:?}"
        ),
    }
    // The server did get the SET (it was only slow, 400 ms away); the cleanup
    // release, sent at most one request timeout after the acquire, trails it by no more than
    // that on the same delayed link.
    let bound = connect + response + SCHEDULING_SLACK;
    let (landed, lived) = events
        .late_grant_released(
            &lock,
            started,
            Duration::from_secs(2),
            bound,
            "the slow acquire",
        )
        .await;
    eprintln!(
        "slow link: the grant landed {landed:?} after the acquire started, released {lived:?} \
         later (bound {bound:?}, ttl {ttl:?})"
    );
    let mut admin = server.admin();
    assert!(!exists(&mut admin, &lock), "{:?}", events.of(&lock));
    let guard = bounded(
        Duration::from_secs(5),
        "second client",
        direct.lock(&key).ttl(ttl).acquire(),
    )
    .await
    .expect("a second client can take the lock once the uncertain one is gone");
    guard.release().await.unwrap();

    // With a wait, the same token is retried until the link is fast again: the acquire succeeds.
    proxy.set_delay(Duration::from_millis(400));
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        bounded(
            Duration::from_secs(15),
            "acquire with wait through a slow link",
            locks
                .lock(&key)
                .ttl(ttl)
                .wait(Duration::from_secs(3))
                .acquire(),
        ),
        async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            proxy.set_delay(Duration::ZERO);
        },
    );
    let guard = result.expect("acquire retried after the link recovered");
    eprintln!(
        "slow link healed after 500ms: acquired after {:?}",
        started.elapsed()
    );
    assert!(guard.fencing_token().is_some());
    assert!(exists(&mut admin, &redis_key(&key)));
    bounded(Duration::from_secs(5), "release", guard.release())
        .await
        .expect("release");
    assert!(!exists(&mut admin, &redis_key(&key)));
}

/// A reply delayed past the lock's validity is never a success, on a single node: a proxy adds
/// 200 ms each way, so every round trip (400 ms) outlasts the 300 ms ttl. With a patient client
/// (3 s timeouts: the reply comes within them) and an impatient one (200 ms: it times out),
/// wait 0 and 1 s: `Unavailable`. The request did land (keyspace `set`, one link delay in), and
/// once the delay is gone nothing is left within the ttl + slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_past_validity_is_never_success_on_a_single_node() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let timeouts = |t: Duration| {
        client(
            LockConfig::single(proxy.url())
                .connect_timeout(t)
                .response_timeout(t),
        )
    };
    let (patient, impatient) = (
        timeouts(Duration::from_secs(3)),
        timeouts(Duration::from_millis(200)),
    );
    let key = unique_key("faults:past-validity");
    let lock = redis_key(&key);
    let ttl = Duration::from_millis(300);
    let one_way = Duration::from_millis(200);
    assert!(2 * one_way > default_validity(ttl));
    let events = KeyEvents::watch(&server, &lock);
    for (name, locks) in [("patient", &patient), ("impatient", &impatient)] {
        warm_up(locks).await;
        proxy.set_delay(one_way);
        for wait in [Duration::ZERO, Duration::from_secs(1)] {
            let what = format!("{name} client, wait {wait:?}");
            let started = Instant::now();
            let result = bounded(
                Duration::from_secs(10),
                &what,
                locks.lock(&key).ttl(ttl).wait(wait).acquire(),
            )
            .await;
            eprintln!(
                "single node +400ms RTT, ttl {ttl:?}, {what}: {} after {:?}",
                match &result {
                    Ok(_) => "Ok".to_owned(),
                    Err(e) => e.to_string(),
                },
                started.elapsed()
            );
            assert!(
                matches!(result, Err(LockError::Unavailable { .. })),
                "{what}: a reply past the validity: expected Unavailable, got {:?}",
                result.map(drop)
            );
            let landed = events
                .wait_first_after(&lock, &["set"], started, Duration::from_secs(2), &what)
                .await;
            assert!(
                landed.at >= started + one_way,
                "{what}: the grant landed {:?} in, not delayed",
                landed.at - started
            );
        }
        proxy.set_delay(Duration::ZERO);
        let mut admin = server.admin();
        wait_gone(&server, &lock, ttl + SCHEDULING_SLACK, name).await;
        assert!(!exists(&mut admin, &lock));
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Holder process killed (cancellation, drop and panic: the behaviour suite, behaviour/mod.rs)

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
    let mut last = pttl(&mut admin, &redis_key(&key));
    assert!(last > 0, "holder's lock not in redis: pttl {last}");
    wait_until_async(renew_every * 3, "a renewal of the holder's lock", || {
        let now = pttl(&mut admin, &redis_key(&key));
        let jumped = now > last + 100;
        last = now;
        jumped
    })
    .await;
    let queried = Instant::now();
    let left_at_kill = pttl(&mut admin, &redis_key(&key));
    holder.kill();
    let killed = Instant::now();

    let locks = client(LockConfig::single(server.url()));
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

// ---------------------------------------------------------------------------------------------
// 7. Credentials

#[tokio::test]
async fn wrong_password_is_an_auth_failure_not_contention() {
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some("correct-horse".into()),
        acl_rules: vec!["user narrow on >narrowpw ~other:* +@all".into()],
        ..ServerOptions::default()
    });
    let key = unique_key("faults:auth");
    let cases = [
        (
            "wrong password",
            format!("redis://:battery-staple@127.0.0.1:{}/", server.port()),
            FailureKind::Auth,
        ),
        (
            "no password",
            format!("redis://127.0.0.1:{}/", server.port()),
            FailureKind::Auth,
        ),
        (
            "unknown user",
            server.url_as("nobody", "x"),
            FailureKind::Auth,
        ),
        (
            "no permission on lock keys",
            server.url_as("narrow", "narrowpw"),
            FailureKind::Permission,
        ),
    ];
    for (what, url, kind) in cases {
        let locks = client(LockConfig::single(&url));
        let started = Instant::now();
        // A long wait: a credentials problem must not be retried until it runs out.
        let err = bounded(
            Duration::from_secs(15),
            what,
            locks.lock(&key).wait(Duration::from_secs(10)).acquire(),
        )
        .await
        .expect_err(what);
        let took = started.elapsed();
        eprintln!("{what}: {took:?} -> {err}");
        let found = causes(&err);
        assert_eq!(found.len(), 1, "{what}: {found:?}");
        assert_eq!(found[0].kind, kind, "{what}: {found:?}");
        assert_eq!(
            found[0].node,
            format!("127.0.0.1:{}", server.port()),
            "{what}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{what}: retried for {took:?}"
        );
        let shown = format!("{err} {err:?}");
        assert!(
            !shown.contains("battery-staple") && !shown.contains("narrowpw"),
            "{shown}"
        );
    }
    assert!(server.keys("lock:*").is_empty(), "{:?}", server.keys("*"));

    // The right password works.
    let locks = client(LockConfig::single(server.url()));
    locks
        .lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// 8. Secrets never shown

#[tokio::test]
async fn tokens_and_passwords_never_in_debug_or_logs() {
    capture::install();
    let password = "pw-7f3a9c-secret";
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some(password.into()),
        ..ServerOptions::default()
    });
    let mut admin = server.admin();
    let config = LockConfig::single(server.url()).default_ttl(Duration::from_secs(5));
    let locks = client(config.clone());
    let key = unique_key("faults:secrets");
    let mut tokens = Vec::new();
    let mut shown = vec![format!("{config:?}"), format!("{locks:?}")];

    // A held lock, and the contention error of a second attempt.
    let guard: LockGuard = locks
        .lock(&key)
        .ttl(Duration::from_millis(900))
        .acquire()
        .await
        .unwrap();
    tokens.push(get(&mut admin, &redis_key(&key)).expect("token in redis"));
    shown.push(format!("{guard:?}"));
    let contended = locks.lock(&key).acquire().await.expect_err("contended");
    shown.push(format!("{contended:?}"));
    shown.push(contended.to_string());

    // A lost lock (logged by the renewal driver), and its Lost error.
    let () = redis::cmd("SET")
        .arg(redis_key(&key))
        .arg("intruder")
        .query(&mut admin)
        .unwrap();
    bounded(Duration::from_secs(5), "lost()", guard.lost()).await;
    shown.push(format!("{guard:?}"));
    let lost = guard.release().await.expect_err("lost");
    shown.push(format!("{lost:?}"));

    // A guard dropped while the server is frozen: the drop's release fails and is logged.
    let key2 = unique_key("faults:secrets");
    let guard = locks
        .lock(&key2)
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    tokens.push(get(&mut admin, &redis_key(&key2)).expect("token in redis"));
    server.freeze();
    drop(guard);
    let wrong = LockConfig::single(format!(
        "redis://:{password}-nope@127.0.0.1:{}/",
        server.port()
    ));
    shown.push(format!("{wrong:?}"));
    let unavailable = client(LockConfig::single(format!(
        "redis://:{password}@127.0.0.1:{}/",
        free_port()
    )))
    .lock(&key2)
    .acquire()
    .await
    .expect_err("no server there");
    shown.push(format!("{unavailable:?}"));
    shown.push(unavailable.to_string());
    // The failed release on drop is logged: its event is among those checked for secrets below.
    wait_until_async(
        Duration::from_secs(5),
        "the failed drop-release logged",
        || capture::text().contains("release failed; the lock expires by its ttl"),
    )
    .await;
    server.thaw();

    let text = capture::text();
    assert!(
        text.contains(&key),
        "the capture saw no event about {key}: the log check would be vacuous\n{text}"
    );
    eprintln!("captured {} log lines", text.lines().count());
    for value in &tokens {
        // The value is the token's secret (32 hex digits), then the owner record, which may
        // be shown: the secret may not.
        let secret = value
            .get(..32)
            .unwrap_or_else(|| panic!("a short value: {value:?}"));
        assert!(
            secret.bytes().all(|b| b.is_ascii_hexdigit()),
            "unexpected token format: {value:?}"
        );
        for s in &shown {
            assert!(!s.contains(secret), "token shown in {s}");
        }
        assert!(!text.contains(secret), "token in the logs");
    }
    for s in &shown {
        assert!(!s.contains(password), "password shown in {s}");
    }
    assert!(!text.contains(password), "password in the logs");
}

// ---------------------------------------------------------------------------------------------
// Fencing across a restart that loses the data

/// Redis restarted without persistence loses the fence counter; the next token must still be
/// larger than every token before (the counter restarts from the server clock, not from 1).
#[tokio::test]
async fn fencing_tokens_keep_growing_across_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("faults:fence-restart");
    let mut before = 0;
    for _ in 0..3 {
        let guard = locks.lock(&key).acquire().await.unwrap();
        before = guard.fencing_token().unwrap();
        guard.release().await.unwrap();
    }
    server.restart();
    assert!(
        server.keys(&format!("{}*", redis_key(&key))).is_empty(),
        "restart kept the data"
    );
    // The client reconnects on its own; retry through the brief reconnection window.
    let guard = locks
        .lock(&key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let after = guard.fencing_token().unwrap();
    eprintln!("fencing token {before} before the restart, {after} after");
    assert!(after > before, "token went back from {before} to {after}");
    guard.release().await.unwrap();
}
