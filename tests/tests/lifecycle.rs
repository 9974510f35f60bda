//! Regression tests for issue 7 ("one lock lifecycle, correct under every fault"), one section per
//! item of the issue. Real `redis-server` processes, faults through the servers' own levers or the
//! fault proxy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockClient, LockConfig, LockError, LockGuard};
use lock_tests::{
    BusyScript, CLEANUP_PAUSE, FaultProxy, KeyEvents, LoadingServer, RedisMasters, RedisServer,
    SCHEDULING_SLACK, Worker, await_waiter, bounded, client, eventually, key_exists, lock_keys, ms,
    unique_key, wait_until_async, warm_up,
};

/// One request with the default timeouts: connect 1 s + response 500 ms.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);

/// How far a fence counter may lag the server's clock for the transaction (`FENCE_LAG_US`).
const FENCE_LAG: Duration = Duration::from_millis(100);

fn fence_key(name: &str) -> String {
    lock_keys(name).fence
}

/// Deletes the fence counter of `key`, as an eviction or a restart without data would.
fn forget_fence(server: &RedisServer, key: &str) {
    let _: i64 = redis::cmd("DEL")
        .arg(fence_key(key))
        .query(&mut server.admin())
        .unwrap();
}

fn config_field(err: &LockError) -> Option<&'static str> {
    match err {
        LockError::Config { field, .. } => Some(field),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A lock lost during a partition is never reported as success.

/// A holder behind a proxy, cut off (blackhole: packets stall, nothing is refused) for longer
/// than the ttl while its "body" runs; another client takes the lock meanwhile.
struct Partitioned {
    server: RedisServer,
    proxy: FaultProxy,
    holder: LockClient,
    key: String,
    ttl: Duration,
}

impl Partitioned {
    fn new(what: &str) -> Partitioned {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port());
        let holder = client(
            LockConfig::single(proxy.url())
                .connect_timeout(ms(200))
                .response_timeout(ms(200)),
        );
        Partitioned {
            server,
            proxy,
            holder,
            key: unique_key(what),
            ttl: Duration::from_secs(1),
        }
    }

    /// Takes the lock with `acquire_blocking`, then [`Self::cut_off_and_taken_over`]: (holder's
    /// guard, the other client's guard).
    async fn blocking_holder_taken_over(&self) -> (LockGuard, LockGuard) {
        let holder = self.holder.clone();
        let (key, ttl) = (self.key.clone(), self.ttl);
        let guard =
            tokio::task::spawn_blocking(move || holder.lock(&key).ttl(ttl).acquire_blocking())
                .await
                .unwrap()
                .unwrap();
        (guard, self.cut_off_and_taken_over().await)
    }

    /// Cuts the holder off past its ttl and lets a second client take (and keep) the lock.
    async fn cut_off_and_taken_over(&self) -> LockGuard {
        self.proxy.set_blackhole(true);
        // The scenario: the body runs on, cut off, for longer than the lock's ttl.
        tokio::time::sleep(self.ttl + ms(300)).await;
        let other = client(LockConfig::single(self.server.url()));
        bounded(
            Duration::from_secs(10),
            "second client",
            other
                .lock(&self.key)
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(3))
                .acquire(),
        )
        .await
        .expect("the cut-off holder's key never expired")
    }
}

/// Runs `finish` on the cut-off, taken-over holder's guard (on a blocking thread); it must say Lost.
async fn sync_finish_is_lost<T: std::fmt::Debug + Send + 'static>(
    what: &str,
    finish: impl FnOnce(LockGuard) -> Result<T, LockError> + Send + 'static,
) {
    let fx = Partitioned::new(what);
    let (guard, _other) = fx.blocking_holder_taken_over().await;
    // Still cut off: the release cannot reach Redis, but validity passed long ago.
    let outcome = tokio::task::spawn_blocking(move || finish(guard))
        .await
        .unwrap();
    eprintln!("{what}: partition past validity: {outcome:?}");
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{what}: a lock lost in a partition must end as Lost, got {outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_in_a_partition_release_blocking_says_lost() {
    sync_finish_is_lost("life:partition-blocking", LockGuard::release_blocking).await;
}

/// What a sync `#[distributed_lock]` fn does when its body returned `Ok(7)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_in_a_partition_sync_attribute_outcome_is_lost() {
    sync_finish_is_lost("life:partition-attr", |guard| {
        lock_runtime::__private::finish_blocking(guard, Ok::<u32, LockError>(7))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_in_a_partition_async_release_says_lost() {
    let fx = Partitioned::new("life:partition-async");
    let guard = fx.holder.lock(&fx.key).ttl(fx.ttl).acquire().await.unwrap();
    let _other = fx.cut_off_and_taken_over().await;
    eprintln!("is_lost() when the release starts: {}", guard.is_lost());
    // Still cut off.
    let released = bounded(Duration::from_secs(10), "release", guard.release()).await;
    eprintln!("partition past validity, async release while cut off: {released:?}");
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "got {released:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. `wait` bounds every acquire, also with a node frozen.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_bounds_ten_waiters_with_a_frozen_redlock_node() {
    const WAITERS: usize = 10;
    let wait = ms(300);
    let timeout = ms(200);
    let bound = wait + timeout + ms(300);
    let cluster = RedisMasters::start(5);
    let config = || {
        LockConfig::redlock(cluster.urls())
            .connect_timeout(timeout)
            .response_timeout(timeout)
    };
    let holder = client(config());
    let waiters = client(config());
    let key = unique_key("life:frozen-redlock");
    cluster.nodes[0].freeze();
    let held = holder
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("four of five nodes grant it");
    let started = Instant::now();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let waiters = waiters.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let result = waiters.lock(&key).wait(wait).acquire().await;
                (start.elapsed(), result.map(drop))
            })
        })
        .collect();
    // Released only once every wait ran out: a waiter that gets it now acquired too late.
    tokio::time::sleep_until((started + wait + ms(400)).into()).await;
    held.release().await.unwrap();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(
            bounded(Duration::from_secs(30), "waiter", task)
                .await
                .unwrap(),
        );
    }
    cluster.nodes[0].thaw();
    let slowest = answers.iter().map(|(t, _)| *t).max().unwrap();
    eprintln!(
        "10 waiters, wait {wait:?}, one of five nodes frozen: slowest answered after {slowest:?}; {:?}",
        answers
            .iter()
            .map(|(t, r)| (t.as_millis(), r.is_ok()))
            .collect::<Vec<_>>()
    );
    for (took, result) in &answers {
        assert!(
            result.as_ref().is_err_and(LockError::is_contended),
            "a waiter answered {result:?} after {took:?} (wait {wait:?}, holder released after it)"
        );
        assert!(
            *took <= bound,
            "a waiter answered after {took:?}, bound {bound:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_bounds_a_waiter_on_a_frozen_single_node() {
    let wait = Duration::from_secs(1);
    let timeout = ms(200);
    let bound = wait + timeout + ms(300);
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(
        LockConfig::single(server.url())
            .connect_timeout(timeout)
            .response_timeout(timeout),
    );
    let key = unique_key("life:frozen-single");
    let _held = holder
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let task = {
        let key = key.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let result = waiter.lock(&key).wait(wait).acquire().await;
            (start.elapsed(), result.map(drop))
        })
    };
    await_waiter(&server, &key).await;
    server.freeze();
    let (took, result) = bounded(Duration::from_secs(30), "waiter", task)
        .await
        .unwrap();
    server.thaw();
    eprintln!("waiter on a frozen node, wait {wait:?}: {result:?} after {took:?}");
    assert!(result.is_err(), "acquired a held lock");
    assert!(took <= bound, "answered after {took:?}, bound {bound:?}");
}

// ---------------------------------------------------------------------------------------------
// 3. Renewal timing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_interval_close_to_the_ttl_is_rejected_or_keeps_the_lock() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(1);
    let config = LockConfig::single(server.url())
        .default_ttl(ttl)
        .renew_interval(ms(990));
    let locks = match LockClient::new(config) {
        Err(err) => {
            assert_eq!(config_field(&err), Some("renew_interval"), "{err:?}");
            return;
        }
        Ok(locks) => locks,
    };
    let key = unique_key("life:renew-990");
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let lost = tokio::time::timeout(3 * ttl, guard.lost()).await;
    eprintln!(
        "renew_interval 990ms, ttl 1s accepted: {}",
        if lost.is_ok() { "lost" } else { "held 3 ttls" }
    );
    assert!(
        lost.is_err(),
        "renew_interval(990ms) was accepted, then the lock was lost"
    );
    guard.release().await.expect("still ours");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_acquire_still_renews_before_its_deadline() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(
        LockConfig::single(proxy.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1)),
    );
    let ttl = Duration::from_secs(2);
    // Warm up: connect, and load both the extend script (one renewal) and the acquire script.
    let key = unique_key("life:slow-acquire");
    let warm = locks.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    tokio::time::sleep(ms(250)).await;
    assert!(!warm.is_lost());
    warm.release().await.unwrap();
    // The name's grant is older than the fence lag now, so this one is the acquire script, and
    // after the lag again, so is the slow acquire below.
    let warm = locks.lock(&key).acquire().await.unwrap();
    warm.release().await.unwrap();
    tokio::time::sleep(FENCE_LAG).await;

    // 400ms each way: every round trip takes 0.4 ttl, the acquire included. The acquire is one
    // round trip because the client saw the name longer than the fence lag ago (its acquire is
    // the script): a name new to it would be seeded at the server's clock as read before the
    // delay, which the delay makes lag, and the token would be raised in a second round trip.
    proxy.set_delay(ms(400));
    let started = Instant::now();
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    eprintln!(
        "acquire through a 800ms round trip took {:?}",
        started.elapsed()
    );
    let lost = tokio::time::timeout(3 * ttl, guard.lost()).await;
    if lost.is_ok() {
        panic!(
            "lost {:?} after a slow acquire (ttl {ttl:?}, round trip 800ms): its first renewal came too late",
            started.elapsed()
        );
    }
    proxy.set_delay(Duration::ZERO);
    guard.release().await.expect("still ours");
}

// ---------------------------------------------------------------------------------------------
// 4. Key layout: names never collide.

#[tokio::test]
async fn braced_and_plain_names_are_independent_locks() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let base = unique_key("life:layout");
    let braced = format!("{{{base}}}");
    let a = locks.lock(&base).acquire().await.expect("x");
    let b = locks
        .lock(&braced)
        .acquire()
        .await
        .expect("{x} is not the same lock as x");
    assert_ne!(lock_keys(&base).lock, lock_keys(&braced).lock);
    assert!(
        key_exists(&server, &lock_keys(&base).lock)
            && key_exists(&server, &lock_keys(&braced).lock)
    );
    a.release().await.unwrap();
    assert!(
        key_exists(&server, &lock_keys(&braced).lock),
        "releasing x released {{x}}"
    );
    b.release().await.unwrap();
    for name in [&base, &braced] {
        assert!(
            !key_exists(&server, &lock_keys(name).lock),
            "{name} left behind"
        );
    }
}

#[tokio::test]
async fn a_name_shaped_like_a_fence_key_leaves_nothing_behind() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let y = unique_key("life:fence-shape");
    let fence_shaped = format!("{{{y}}}:fence");
    let first = locks
        .lock(&fence_shaped)
        .acquire()
        .await
        .expect("{y}:fence");
    let second = locks.lock(&y).acquire().await.expect("y after {y}:fence");
    assert!(first.fencing_token().is_some() && second.fencing_token().is_some());
    first.release().await.unwrap();
    second.release().await.unwrap();
    for name in [&fence_shaped, &y] {
        assert!(
            !key_exists(&server, &lock_keys(name).lock),
            "lock key of {name} left behind"
        );
    }
    // Only the two fence counters stay (they are meant to).
    let mut left = server.keys(&format!("*{y}*"));
    left.sort();
    let mut fences = vec![fence_key(&fence_shaped), fence_key(&y)];
    fences.sort();
    assert_eq!(left, fences);
}

// ---------------------------------------------------------------------------------------------
// 5. Values that must be Config errors (or work), never a panic or a Runtime error.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_forever_is_supported_or_a_config_error() {
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let waiter = client(LockConfig::single(server.url()));
    let key = unique_key("life:wait-max");
    let held = holder.lock(&key).acquire().await.unwrap();
    let task = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(Duration::MAX).acquire().await })
    };
    // Either it fails at once (Config), or it waits: release once it is waiting.
    let waiting = eventually(Duration::from_secs(2), || task.is_finished()).await;
    if !waiting {
        held.release().await.unwrap();
    }
    let result = bounded(Duration::from_secs(10), "wait(MAX)", task)
        .await
        .unwrap();
    eprintln!("wait(Duration::MAX) on a held key: {result:?}");
    match result {
        Ok(guard) => guard.release().await.unwrap(),
        Err(err) => assert_eq!(config_field(&err), Some("wait"), "{err:?}"),
    }
}

#[tokio::test]
async fn a_ttl_redis_rejects_is_a_config_error() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    for ttl in [Duration::MAX, Duration::from_secs(u64::MAX / 1000)] {
        let result = bounded(
            Duration::from_secs(10),
            "acquire",
            locks.lock(unique_key("life:ttl-max")).ttl(ttl).acquire(),
        )
        .await;
        eprintln!("ttl {ttl:?}: {result:?}");
        match result {
            Err(err) => assert_eq!(config_field(&err), Some("ttl"), "ttl {ttl:?}: {err:?}"),
            Ok(_) => panic!("ttl {ttl:?} granted: Redis cannot store it"),
        }
    }
    // 400 days is a valid PX for Redis: it works, or is refused as a Config error on `ttl`.
    let ttl = Duration::from_secs(400 * 86_400);
    let key = unique_key("life:ttl-400d");
    match locks.lock(&key).ttl(ttl).acquire().await {
        Ok(guard) => guard.release().await.unwrap(),
        Err(err) => assert_eq!(config_field(&err), Some("ttl"), "{err:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_delay_is_a_config_error_or_works() {
    let server = RedisServer::start();
    let holder = client(LockConfig::single(server.url()));
    let key = unique_key("life:retry-max");
    let _held = holder.lock(&key).acquire().await.unwrap();
    let waiter = match LockClient::new(
        // No jitter: with the default one, whether the first delay overflows is a coin toss.
        LockConfig::single(server.url())
            .retry_delay(Duration::MAX)
            .retry_jitter(0.0),
    ) {
        Err(err) => {
            assert_eq!(config_field(&err), Some("retry_delay"), "{err:?}");
            return;
        }
        Ok(waiter) => waiter,
    };
    let wait = ms(500);
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire",
        waiter.lock(&key).wait(wait).acquire(),
    )
    .await;
    eprintln!(
        "retry_delay(MAX), wait {wait:?} on a held key: {result:?} after {:?}",
        started.elapsed()
    );
    assert!(
        result.as_ref().is_err_and(LockError::is_contended),
        "expected Contended after the wait, got {result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_timeouts_are_config_errors_or_work() {
    let server = RedisServer::start();
    let url = server.url();
    let cases = [
        (
            "connect_timeout",
            LockConfig::single(url.as_str()).connect_timeout(Duration::MAX),
        ),
        (
            "response_timeout",
            LockConfig::single(url.as_str())
                .default_ttl(Duration::MAX)
                .response_timeout(Duration::MAX - Duration::from_secs(1)),
        ),
    ];
    for (field, config) in cases {
        let made =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| LockClient::new(config)));
        let Ok(made) = made else {
            panic!("LockClient::new panicked with a huge {field}");
        };
        let locks = match made {
            Err(err) => {
                assert!(
                    config_field(&err).is_some_and(|f| f == field || f == "default_ttl"),
                    "{field}: {err:?}"
                );
                continue;
            }
            Ok(locks) => locks,
        };
        let result = bounded(
            Duration::from_secs(10),
            field,
            locks
                .lock(unique_key("life:timeouts"))
                .ttl(Duration::from_secs(5))
                .acquire(),
        )
        .await;
        eprintln!("huge {field}: {result:?}");
        match result {
            Ok(guard) => guard.release().await.unwrap(),
            Err(err) => assert!(config_field(&err).is_some(), "huge {field}: {err:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Transient replies are retried within `wait`.

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
// 7. One bad item in a batched renewal fails only itself.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_item_in_a_renewal_batch_fails_only_itself() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let ttl = Duration::from_secs(1);
    let (good_key, bad_key) = (unique_key("life:batch-good"), unique_key("life:batch-bad"));
    // Taken together, so their renewals fall into one batch.
    let (good, bad) = tokio::join!(
        locks.lock(&good_key).ttl(ttl).acquire(),
        locks.lock(&bad_key).ttl(ttl).acquire(),
    );
    let (good, bad) = (good.unwrap(), bad.unwrap());
    let mut admin = server.admin();
    let () = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(lock_keys(&bad_key).lock)
        .ignore()
        .cmd("HSET")
        .arg(lock_keys(&bad_key).lock)
        .arg("f")
        .arg("v")
        .ignore()
        .query(&mut admin)
        .unwrap();
    let started = Instant::now();
    bounded(2 * ttl, "the bad lock reported lost", bad.lost()).await;
    eprintln!("WRONGTYPE lock reported lost after {:?}", started.elapsed());
    let good_lost = tokio::time::timeout(3 * ttl, good.lost()).await;
    assert!(
        good_lost.is_err(),
        "the healthy lock was lost {:?} after its batch neighbour went bad",
        started.elapsed()
    );
    good.release()
        .await
        .expect("the healthy lock is still ours");
    assert!(matches!(bad.release().await, Err(LockError::Lost { .. })));
}

// ---------------------------------------------------------------------------------------------
// 8. Shutdown releases what is held and waits for releases still running.

/// A process that exits right after `lock_runtime::shutdown()` (the `shutdown_worker` child,
/// through a proxy adding 100 ms each way): one lock still held, one guard dropped just before
/// (its release in flight), one acquire cancelled with its request on the wire (its grant lands
/// after the cancellation). `shutdown()` returns, and the process exits, within its bound: one
/// request timeout (connect 1 s + response 500 ms, the defaults) + slack. Right after the exit,
/// not by the 30 s ttl, no key is left: each was deleted (a keyspace `del`, after the child said
/// it was shutting down, so the release was in flight then); the holder saw its lock lost and a
/// later call was refused with `Runtime`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_held_locks_and_waits_for_pending_releases() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let names = [
        unique_key("life:shutdown-held"),
        unique_key("life:shutdown-drop"),
        unique_key("life:shutdown-cancelled"),
    ];
    let locks: Vec<String> = names.iter().map(|n| lock_keys(n).lock).collect();
    let events = KeyEvents::watch(&server, "*");
    proxy.set_delay(ms(100));
    let url = proxy.url();
    let mut worker = Worker::spawn(
        env!("CARGO_BIN_EXE_shutdown_worker"),
        &[url.as_str(), &names[0], &names[1], &names[2]],
    );
    assert_eq!(worker.next_line(Duration::from_secs(20)), "acquired");
    assert_eq!(worker.next_line(Duration::from_secs(5)), "shutting down");
    let shutting = Instant::now();
    let bound = REQUEST_TIMEOUT + SCHEDULING_SLACK;
    let finished = tokio::task::block_in_place(|| worker.finish(bound + Duration::from_secs(5)));
    let exited = shutting.elapsed();
    finished.assert_success("shutdown_worker");
    // Right after the exit: nothing left.
    let left: Vec<&String> = locks.iter().filter(|l| key_exists(&server, l)).collect();
    let report = finished.stdout.last().cloned().unwrap_or_default();
    eprintln!("shutdown_worker exited {exited:?} after shutting down: {report}; left: {left:?}");
    assert!(
        left.is_empty(),
        "keys left after the process exited: {left:?}"
    );
    let took: u64 = report
        .strip_prefix("shutdown took=")
        .and_then(|r| r.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("shutdown_worker said {report:?}"));
    assert!(
        Duration::from_millis(took) <= bound,
        "shutdown() blocked {took} ms (bound {bound:?})"
    );
    assert!(
        exited <= bound + SCHEDULING_SLACK,
        "the process exited {exited:?} after shutting down"
    );
    assert!(
        report.ends_with("lost=true refused=true"),
        "the holder must see its lock lost, and later calls be refused: {report}"
    );
    for lock in &locks {
        wait_until_async(SCHEDULING_SLACK, &format!("{lock} deletion heard"), || {
            events.first_after(lock, &["del"], shutting).is_some()
        })
        .await;
        assert!(
            events
                .first_after(lock, &["set"], shutting - Duration::from_secs(60))
                .is_some(),
            "{lock} was never granted: {:?}",
            events.of(lock)
        );
    }
}

/// An async body under the attribute's glue is cancelled by a shutdown, and the call says `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_a_running_body_with_lost() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let guard = locks
        .lock(unique_key("life:shutdown-body"))
        .acquire()
        .await
        .unwrap();
    let shutting = locks.clone();
    let stop = tokio::task::spawn_blocking(move || shutting.shutdown());
    let body = std::future::pending::<Result<(), LockError>>();
    let out = bounded(
        Duration::from_secs(5),
        "the body's cancellation",
        lock_runtime::__private::until_lost(&guard, body),
    )
    .await;
    assert!(out.is_none(), "the body ran on after shutdown");
    let result: Result<(), LockError> = lock_runtime::__private::finish(guard, out).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    stop.await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 9. Fencing with the counter gone.

#[tokio::test]
async fn fencing_tokens_grow_after_the_counter_is_deleted() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("life:fence-deleted");
    let mut last = 0;
    for round in 0..4 {
        let guard = locks.lock(&key).acquire().await.unwrap();
        let token = guard
            .fencing_token()
            .expect("a grant without a fencing token");
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
        forget_fence(&server, &key);
    }
    // Every round took the transaction, whose `INCR` found no counter, and raised the token to
    // the clock: round 1 as a name new to a client that had no clock reading to seed it from yet.
    assert_eq!(server.command_calls("multi"), 4);
}

/// A name new to a client that has read the server's clock (on another name) is taken in one
/// transaction that seeds its counter at that clock: no script, and a token above every token
/// the name had before its counter was lost.
#[tokio::test]
async fn a_name_new_to_the_client_is_seeded_in_one_transaction() {
    let server = RedisServer::start();
    let [before, after] = [(); 2].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("life:fence-seeded");
    let guard = before.lock(&key).acquire().await.unwrap();
    let earlier = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    forget_fence(&server, &key);
    let reading = after
        .lock(unique_key("life:fence-clock"))
        .acquire()
        .await
        .unwrap();
    reading.release().await.unwrap();
    let (scripts, transactions) = (
        server.command_calls("evalsha"),
        server.command_calls("multi"),
    );
    let guard = after.lock(&key).acquire().await.unwrap();
    let token = guard.fencing_token().unwrap();
    assert_eq!(
        (
            server.command_calls("evalsha") - scripts,
            server.command_calls("multi") - transactions
        ),
        (0, 1),
        "not one transaction alone"
    );
    assert!(token > earlier, "token {token} not above {earlier}");
    let counter: u64 = redis::cmd("GET")
        .arg(fence_key(&key))
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(counter, token, "the counter is not the token");
    guard.release().await.unwrap();
}

/// A plain lock's attempt is a transaction that counts the fence on even when it is refused the
/// lock. With the counter lost, refused attempts leave a small count behind, and the next grant
/// (here by a client new to the name, with no clock reading to seed it from: its transaction
/// finds the small count) must still raise it to the clock.
#[tokio::test]
async fn refused_transactions_leave_no_unseeded_counter_behind() {
    let server = RedisServer::start();
    let [a, b, c] = [(); 3].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("life:fence-refused");
    // `a` learns that the name has a counter, so its next attempts take the transaction.
    let guard = a.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    let held = b.lock(&key).acquire().await.unwrap();
    let before = held.fencing_token().unwrap();
    forget_fence(&server, &key);
    let transactions = server.command_calls("multi");
    for _ in 0..3 {
        let refused = a.lock(&key).acquire().await;
        assert!(
            refused.as_ref().is_err_and(LockError::is_contended),
            "{refused:?}"
        );
    }
    assert_eq!(
        server.command_calls("multi") - transactions,
        3,
        "a's attempts were transactions"
    );
    let count: i64 = redis::cmd("GET")
        .arg(fence_key(&key))
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(
        count, 3,
        "the refused attempts counted the lost counter on from 0"
    );
    held.release().await.unwrap();
    let guard = c.lock(&key).acquire().await.unwrap();
    let token = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    assert!(token > before, "token {token} not above {before}");
}

/// A fair lock handed to its waiter by the holder's release counts the fence on by the rule of
/// every grant. With the counter lost and recreated meanwhile by the `INCR`s of refused
/// transactions (written here as those `INCR`s), the hand-off announced that small count, and
/// the waiter took it without asking: a token far below the holder's.
#[tokio::test]
async fn a_fair_hand_off_after_the_counter_was_recreated_has_a_larger_token() {
    let server = RedisServer::start();
    let [a, b] = [(); 2].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("life:fence-hand-off");
    let held = a.lock(&key).fair(true).acquire().await.unwrap();
    let before = held.fencing_token().unwrap();
    let waiting = {
        let lock = b.lock(&key).fair(true).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.acquire().await })
    };
    lock_tests::until_queued(&a, &key, 1).await;
    forget_fence(&server, &key);
    for _ in 0..3 {
        let _: i64 = redis::cmd("INCR")
            .arg(fence_key(&key))
            .query(&mut server.admin())
            .unwrap();
    }
    let publishes = server.command_calls("publish");
    held.release().await.unwrap();
    let got = bounded(Duration::from_secs(5), "the hand-off", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        server.command_calls("publish") > publishes,
        "the lock was not handed off"
    );
    let token = got.fencing_token().unwrap();
    got.release().await.unwrap();
    assert!(token > before, "hand-off token {token} not above {before}");
}

/// A fence counter that is not a number gives no fencing token, so no lock: on each path, the
/// transaction that counts on (a client that took the name a moment ago), the one that seeds (a
/// client new to the name that has read the clock) and the script (a client that took the name
/// longer than the fence lag ago), the acquire fails as unavailable and leaves no lock behind;
/// once the counter is gone the name works again.
#[tokio::test]
async fn a_fence_counter_that_is_not_a_number_grants_nothing() {
    let server = RedisServer::start();
    let [seen, seeded, stale] = [(); 3].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("life:fence-garbage");
    let guard = stale.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    // What makes its next attempt the script: its grant is older than the lag.
    tokio::time::sleep(FENCE_LAG).await;
    let guard = seen.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    let guard = seeded
        .lock(unique_key("life:fence-garbage-clock"))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let () = redis::cmd("SET")
        .arg(fence_key(&key))
        .arg("not a number")
        .query(&mut server.admin())
        .unwrap();
    let transactions = server.command_calls("multi");
    for (who, locks) in [
        ("transaction", &seen),
        ("seeded transaction", &seeded),
        ("script", &stale),
    ] {
        match locks.lock(&key).acquire().await {
            Err(LockError::Unavailable { causes, .. }) => {
                assert_eq!(causes[0].kind, FailureKind::Response, "{who}: {causes:?}");
            }
            other => panic!("{who}: expected unavailable, got {other:?}"),
        }
        assert!(
            !key_exists(&server, &lock_keys(&key).lock),
            "{who}: a lock without a fence was left behind"
        );
    }
    assert_eq!(
        server.command_calls("multi") - transactions,
        2,
        "the first two tries were transactions"
    );
    forget_fence(&server, &key);
    let guard = seen.lock(&key).acquire().await.unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();
}

/// The first attempt lands late (its reply times out), the counter is evicted, and the retry with
/// the same token answers "ours": that grant must still carry a token, larger than the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_token_retry_after_the_counter_is_gone_still_has_a_token() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(LockConfig::single(proxy.url()).response_timeout(ms(200)));
    let key = unique_key("life:fence-retry");
    let before = {
        let guard = locks.lock(&key).acquire().await.unwrap();
        let token = guard.fencing_token().unwrap();
        guard.release().await.unwrap();
        token
    };
    proxy.set_delay(ms(400));
    let task = {
        let locks = locks.clone();
        let key = key.clone();
        tokio::spawn(async move {
            locks
                .lock(&key)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    let landed = eventually(Duration::from_secs(5), || {
        key_exists(&server, &lock_keys(&key).lock)
    })
    .await;
    assert!(landed, "the first attempt never reached the server");
    forget_fence(&server, &key);
    proxy.set_delay(Duration::ZERO);
    let guard = bounded(Duration::from_secs(15), "acquire", task)
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "same-token retry after the counter vanished: token {:?}",
        guard.fencing_token().map(|t| t > before)
    );
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let token = token.expect("a grant (same-token retry) without a fencing token");
    assert!(token > before, "token {token} not above {before}");
}

#[tokio::test]
async fn fencing_tokens_grow_when_allkeys_lru_evicts_the_counter() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key("life:fence-lru");
    let used: String = redis::cmd("INFO").arg("memory").query(&mut admin).unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    for (name, value) in [
        ("maxmemory", (used + 2 * 1024 * 1024).to_string()),
        ("maxmemory-policy", "allkeys-lru".to_owned()),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut admin)
            .unwrap();
    }
    let mut last = 0;
    let mut evictions = 0;
    let mut junk = 0u64;
    for round in 0..3 {
        let guard = locks.lock(&key).acquire().await.unwrap();
        let token = guard
            .fencing_token()
            .expect("a grant without a fencing token");
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
        // Junk until the counter is evicted (bounded).
        for _ in 0..200 {
            if !key_exists(&server, &fence_key(&key)) {
                evictions += 1;
                break;
            }
            let mut pipe = redis::pipe();
            for _ in 0..100 {
                junk += 1;
                pipe.cmd("SET")
                    .arg(format!("junk:{junk}"))
                    .arg(vec![b'x'; 1024])
                    .ignore();
            }
            let () = pipe.query(&mut admin).unwrap();
        }
    }
    eprintln!("allkeys-lru: the fence counter was evicted {evictions} time(s)");
    assert!(
        evictions >= 2,
        "the lever failed: the counter was evicted {evictions} time(s)"
    );
}

// ---------------------------------------------------------------------------------------------
// 10. A stale acquire on an old socket, after a reconnect, leaves no orphan grant.

/// The server is frozen while an acquire is in flight (its bytes wait in the server's socket
/// buffer); the connection is then reset, so the client reconnects for its cleanup release. After
/// the thaw, the stale acquire still runs (a keyspace `set` event after the thaw proves it): its
/// grant must be deleted by the cleanup within one cleanup retry pause (at most 1 s, the engine's
/// backoff) + one request timeout of landing, not outlive the failed call for its 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_acquire_after_a_reconnect_leaves_no_orphan() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let (connect, response) = (ms(200), ms(200));
    let locks = client(
        LockConfig::single(proxy.url())
            .connect_timeout(connect)
            .response_timeout(response),
    );
    let key = unique_key("life:stale-acquire");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_secs(30);
    warm_up(&locks).await;
    let events = KeyEvents::watch(&server, &lock);
    server.freeze();
    let task = {
        let locks = locks.clone();
        let key = key.clone();
        tokio::spawn(async move {
            locks
                .lock(&key)
                .ttl(ttl)
                .wait(Duration::from_secs(1))
                .acquire()
                .await
        })
    };
    // The scenario: attempts are queued in the frozen server's buffer; then the link resets.
    tokio::time::sleep(ms(500)).await;
    proxy.cut_all();
    let result = bounded(Duration::from_secs(10), "acquire", task)
        .await
        .unwrap();
    eprintln!("acquire against a frozen server, link reset: {result:?}");
    assert!(result.is_err(), "acquired on a frozen server");
    // The server stays frozen a while longer (the cleanup release meets it too).
    tokio::time::sleep(ms(500)).await;
    // Nothing the frozen server runs can come before this instant.
    let thawed = Instant::now();
    server.thaw();
    let bound = CLEANUP_PAUSE + connect + response + SCHEDULING_SLACK;
    let (landed, lived) = events
        .late_grant_released(
            &lock,
            thawed,
            Duration::from_secs(2),
            bound,
            "the stale acquire after the thaw",
        )
        .await;
    eprintln!(
        "after the thaw: the stale grant landed {landed:?} later, released {lived:?} after \
         (bound {bound:?}, ttl {ttl:?})"
    );
    assert!(
        !key_exists(&server, &lock),
        "granted again after the cleanup: {:?}",
        events.of(&lock)
    );
}
