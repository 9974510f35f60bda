//! `shutdown()`: it releases the locks still held (their holders see them lost, an async body
//! is cancelled) and waits, bounded, for the releases in flight, so a process can exit right
//! after it and leave no key behind. On one Redis node, in a child process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockError};
use lock_tests::{
    FaultProxy, KeyEvents, RedisServer, SCHEDULING_SLACK, Worker, bounded, client, key_exists,
    lock_keys, ms, unique_key, wait_until_async,
};

/// One request with the default timeouts: connect 1 s + response 500 ms.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);

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
    let result = lock_runtime::__private::finish(guard, out).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    stop.await.unwrap();
}

/// A waiter with a place in a lock's queue, in a process that calls `shutdown()` and exits at
/// once (the `queued_worker` child, which says `queued` once `inspect` counts it in the queue):
/// `shutdown()` stops it (it answers `Runtime`) and takes its place back, within its bound (one
/// request timeout + slack). Nothing is queued once the process exited, and when the holder
/// releases, a newcomer that does not wait gets the lock, instead of the release handing it to
/// the dead place, which would keep it for the place's lease (a fair waiter's: its 30 s ttl; a
/// default lock's waiter that queued when it starved: 3 s).
async fn shutdown_takes_back_a_place_in_line(kind: &str, fair: bool) {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let key = unique_key(&format!("life:shutdown-queued-{kind}"));
    let guard = locks.lock(&key).fair(fair).acquire().await.unwrap();
    let url = server.url();
    let mut worker = Worker::spawn(
        env!("CARGO_BIN_EXE_queued_worker"),
        &[url.as_str(), &key, kind],
    );
    let bound = REQUEST_TIMEOUT + SCHEDULING_SLACK;
    let report = tokio::task::block_in_place(|| {
        assert_eq!(worker.next_line(Duration::from_secs(20)), "queued");
        let report = worker.next_line(bound + Duration::from_secs(5));
        worker
            .finish(Duration::from_secs(5))
            .assert_success("queued_worker");
        report
    });
    let took: u64 = report
        .strip_prefix("shutdown took=")
        .and_then(|r| r.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("queued_worker said {report:?}"));
    assert!(
        Duration::from_millis(took) <= bound,
        "shutdown() blocked {took} ms (bound {bound:?})"
    );
    assert!(
        report.ends_with("waiter=stopped"),
        "shutdown() stops the waiter: {report}"
    );
    assert_eq!(
        lock_tests::queued(&locks, &key).await,
        0,
        "the exited waiter's place is left in line"
    );
    guard.release().await.unwrap();
    let next = locks.lock(&key).fair(fair).acquire().await;
    assert!(
        next.is_ok(),
        "the lock went to the exited waiter's place: {:?}",
        next.map(drop)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_takes_back_a_fair_waiters_place() {
    shutdown_takes_back_a_place_in_line("fair", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_takes_back_a_starving_waiters_place() {
    shutdown_takes_back_a_place_in_line("default", false).await;
}
