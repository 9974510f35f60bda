//! Faults of the link between a client and one Redis node, through the fault proxy: a partition
//! (blackhole: packets stall, nothing is refused) before an acquire, while waiting, while held
//! (shorter than the validity: not a loss; past it, while another client takes the lock: `Lost`)
//! and during a release; an asymmetric partition (requests delivered, replies lost); connections
//! reset while held. Rows of the fault table in `lock-runtime/FAULTS.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError, LockGuard};
use lock_tests::{
    CLEANUP_PAUSE, FaultProxy, KeyEvents, QUICK_REQUEST, RedisServer, SCHEDULING_SLACK,
    await_waiter, bounded, capture, client, eventually, key_exists, lock_keys, ms, quick_client,
    release_lost_in_a_partition, unique_key, waiter, warm_up,
};

fn pttl(admin: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(admin).unwrap()
}

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
    let left = pttl(&mut admin, &lock_keys(&key).lock);
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
    assert!(!key_exists(&server, &lock_keys(&key).lock));
}

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
        let holder = quick_client(proxy.url());
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

/// A release no server answered goes on in the background: a partition during the release (its
/// held bytes dropped, so the first delete never reaches Redis), healed; the lock (ttl 30 s) is
/// deleted and its waiter, on another link, woken within the cleanup's longest pause + two
/// request timeouts of the heal. Before, it stayed for its ttl and the waiter's 10 s ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_no_server_answered_is_retried_once_the_partition_heals() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick_client(proxy.url());
    let key = unique_key("link:release-retried");
    let guard = locks
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiting = client(LockConfig::single(server.url()));
    let mut waiter = waiter(waiting, &key, Duration::from_secs(10));
    await_waiter(&server, &key).await;
    release_lost_in_a_partition(&proxy, guard).await;
    assert!(
        key_exists(&server, &lock_keys(&key).lock),
        "the release reached Redis through the partition"
    );
    let healed = Instant::now();
    proxy.set_blackhole(false);
    let bound = CLEANUP_PAUSE + 2 * QUICK_REQUEST + SCHEDULING_SLACK;
    let (granted, at) = tokio::time::timeout(bound, &mut waiter)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the waiter was not granted within {bound:?} of the heal (lock still there: {})",
                key_exists(&server, &lock_keys(&key).lock)
            )
        })
        .unwrap();
    let guard = granted.expect("the waiter's acquire");
    eprintln!(
        "release retried: the waiter granted {:?} after the heal (bound {bound:?})",
        at - healed
    );
    guard.release().await.unwrap();
}

/// Replies lost, requests delivered: the acquire lands on Redis but its caller never hears of
/// it. The call must answer `Unavailable` within its bound, and the grant it made must not live
/// on until its ttl (30 s): the cleanup's release goes through the same half-open link, so it
/// lands within the cleanup's longest pause plus one request of the failure, before the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_the_acquire_is_unavailable_and_its_landed_grant_is_released() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick_client(proxy.url());
    let key = unique_key("link:replies-lost");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_millis(500);
    // Connected (scripts loaded) before the partition, so the acquire itself is what is cut.
    warm_up(&locks).await;
    let events = KeyEvents::watch(&server, &lock);
    proxy.set_blackhole_down(true);
    let up_before = proxy.bytes_up();
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire",
        locks.lock(&key).ttl(ttl).wait(wait).acquire(),
    )
    .await;
    let failed = Instant::now();
    let took = failed - started;
    eprintln!("acquire (wait {wait:?}) with its replies lost: {result:?} after {took:?}");
    assert!(
        matches!(&result, Err(LockError::Unavailable { causes, .. }) if !causes.is_empty()),
        "{result:?}"
    );
    assert!(
        took <= wait + QUICK_REQUEST + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    // The fault as meant: the request went through and made a grant nobody was told of.
    assert!(proxy.bytes_up() > up_before, "no request reached the proxy");
    let landed = events
        .wait_first_after(
            &lock,
            &["set"],
            started,
            Duration::from_secs(1),
            "the acquire's grant",
        )
        .await;
    assert!(
        landed.at <= failed,
        "the grant landed only after the call answered"
    );

    // The link heals two seconds after the call failed; the grant is released (a `del`, not its
    // ttl) within the cleanup's longest pause plus one request of the failure, before the heal.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let healed = Instant::now();
    proxy.set_blackhole_down(false);
    let removed = events
        .wait_first_after(
            &lock,
            &["del", "expired", "evicted"],
            landed.at,
            Duration::from_secs(5),
            "the landed grant's removal",
        )
        .await;
    eprintln!(
        "landed {:?} after the call started; removed ({}) {:?} after the landing, {} the heal",
        landed.at - started,
        removed.event,
        removed.at - landed.at,
        if removed.at < healed {
            "before"
        } else {
            "after"
        }
    );
    assert_eq!(removed.event, "del", "the landed grant was not released");
    let bound = CLEANUP_PAUSE + QUICK_REQUEST + SCHEDULING_SLACK;
    assert!(
        removed.at <= failed + bound,
        "released {:?} after the call failed, past {bound:?}",
        removed.at.saturating_duration_since(failed)
    );

    // The held replies came in after the heal: the connection still pairs replies with their
    // requests, so the next acquire and release through it are right.
    let guard = bounded(
        Duration::from_secs(5),
        "acquire after the heal",
        locks.lock(&key).ttl(ttl).acquire(),
    )
    .await
    .expect("acquire after the heal");
    assert!(key_exists(&server, &lock), "granted, but no key");
    guard.release().await.expect("release after the heal");
    assert!(!key_exists(&server, &lock), "released, but the key is left");
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
    assert!(server.keys(&lock_keys(&key).lock).is_empty());
}
