//! A waiter that meets a fault while it waits: a process paused (SIGSTOP: a GC pause, a VM
//! freeze) across the release that handed it the lock, a slow link. A hand-off is a grant only
//! for the place in line that the waiter's last answer renewed: a message about a place that
//! lapsed while the waiter was paused is not a grant, whoever holds the lock since. Rows of the
//! fault table in `lock-runtime/FAULTS.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockConfig;
use lock_tests::{
    FaultProxy, RedisServer, SCHEDULING_SLACK, Worker, bounded, client, lock_keys, unique_key,
    until_queued, wait_until_async,
};

/// The waiter's ttl: a default lock's waiter that starves takes a place whose lease is the
/// smaller of 3 s and the ttl, so a hand-off to it lives at most this long.
const TTL: Duration = Duration::from_secs(1);
/// One request with the default timeouts: connect 1 s + response 500 ms.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);
/// Rounds: the stale message and the waiter's next attempt race once the waiter resumes (the
/// message was read first in 4 of 6 rounds before the fix), so one round alone may miss it.
const ROUNDS: usize = 3;

fn key_exists(admin: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(admin).unwrap() == 1
}

/// H holds a key; W, another process, waits for it (a default lock: it queues once it starved)
/// and is paused; H releases, which hands the lock to W's place and tells W (a message W cannot
/// read while paused); X waits, and gets the lock once the lock handed to W's place expires; W
/// resumes, asks again (answered "held", with a new place) and then reads the stale message. It
/// must not take it for a grant: X holds the lock. Before the fix W answered Ok at once, with a
/// token below X's, in 4 of 6 rounds of the reproduction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_paused_across_its_hand_off_does_not_take_the_stale_message_for_a_grant() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    for round in 0..ROUNDS {
        let key = unique_key("waiters:stale-hand-off");
        let redis_key = lock_keys(&key).lock;
        let h = locks
            .lock(&key)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let mut w = Worker::spawn(
            env!("CARGO_BIN_EXE_holder"),
            &[
                server.url().as_str(),
                key.as_str(),
                &TTL.as_millis().to_string(),
                "write",
            ],
        );
        // W waited past its starving threshold and took a place in the key's queue.
        until_queued(&locks, &key, 1).await;
        w.pause();
        let published = server.command_calls("publish");
        h.release().await.unwrap();
        // The release handed the lock to W's place (the key is held again, by W's token) and
        // told W so.
        assert!(
            key_exists(&mut admin, &redis_key),
            "round {round}: the release did not hand the lock to the paused waiter's place"
        );
        assert_eq!(
            server.command_calls("publish"),
            published + 1,
            "round {round}: the hand-off was not published"
        );
        // X gets the lock once the lock handed to W's place expires (at most its lease).
        let x = bounded(
            TTL + REQUEST_TIMEOUT * 2,
            "X's acquire",
            locks
                .lock(&key)
                .ttl(Duration::from_secs(30))
                .wait(TTL + REQUEST_TIMEOUT)
                .acquire(),
        )
        .await
        .expect("X never got the lock handed to the paused waiter's place");
        let x_fence = x.fencing_token().unwrap();
        w.resume();
        // W's next attempt reached the server and was answered "held" with a new place: the
        // stale message has been in its socket since before the resume.
        until_queued(&locks, &key, 1).await;
        // A third of W's place's lease: W's pause, by the end of which its listener has long
        // read the message.
        if let Some(line) = w.try_line(TTL / 3 + SCHEDULING_SLACK) {
            panic!(
                "round {round}: the resumed waiter said {line:?} while X held the lock with token \
                 {x_fence} (X lost: {})",
                x.is_lost()
            );
        }
        assert!(!x.is_lost(), "round {round}: X lost the lock");
        x.release().await.unwrap();
        // Now the lock is handed to W's new place, with a larger token than X's.
        let line = w.next_line(REQUEST_TIMEOUT + SCHEDULING_SLACK);
        let w_fence: u64 = line
            .strip_prefix("acquired fence=")
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("round {round}: the waiter said {line:?}"));
        assert!(
            w_fence > x_fence,
            "round {round}: the waiter's token {w_fence} is not above X's {x_fence}"
        );
        w.kill();
    }
}

/// A default lock's waiter that starved has a place in line whose lease is its ttl (at most 3 s):
/// it renews it three times per lease, paced from each attempt's start. Paced from the answer, a
/// round trip longer than two thirds of the lease lost the place every cycle (the next renewal
/// reached the server after the lease ended, and the waiter got a new place at the end of the
/// line each time). Here the round trip (400 ms) is four fifths of the lease (500 ms): the waiter
/// keeps one place, its first ticket, over many renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_slow_link_keeps_its_place_in_line() {
    const ONE_WAY: Duration = Duration::from_millis(200);
    const LEASE: Duration = Duration::from_millis(500);
    // Every renewal reaches the server at most a round trip after the last one: many of them.
    const WATCH: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let direct = client(LockConfig::single(server.url()).fencing(true));
    let slow = client(
        LockConfig::single(proxy.url())
            .fencing(true)
            .response_timeout(ONE_WAY * 2 + Duration::from_secs(2))
            .connect_timeout(ONE_WAY * 2 + Duration::from_secs(2)),
    );
    let key = unique_key("waiters:slow-link");
    let queue = lock_keys(&key).queue;
    let holder = direct
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    proxy.set_delay(ONE_WAY);
    let waiter = tokio::spawn(async move {
        slow.lock(&key)
            .ttl(LEASE)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .map(|guard| guard.fencing_token())
    });
    let tickets = || -> Vec<(String, u64)> {
        redis::cmd("ZRANGE")
            .arg(&queue)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut server.admin())
            .unwrap()
    };
    wait_until_async(
        Duration::from_secs(10),
        "the waiter's place in line",
        || !tickets().is_empty(),
    )
    .await;
    let attempts = server.command_calls("evalsha");
    let until = Instant::now() + WATCH;
    let mut seen = std::collections::BTreeSet::new();
    while Instant::now() < until {
        seen.extend(tickets().into_iter().map(|(_, ticket)| ticket));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Renewals did reach the server meanwhile (the holder's ttl of 30 s renews every 10 s).
    let renewals = server.command_calls("evalsha") - attempts;
    assert!(renewals >= 4, "only {renewals} attempts reached the server");
    assert_eq!(
        seen.len(),
        1,
        "the waiter took {} places in {WATCH:?}: its place lapsed between renewals",
        seen.len()
    );
    holder.release().await.unwrap();
    let granted = bounded(Duration::from_secs(10), "the waiter's grant", waiter)
        .await
        .unwrap();
    assert!(granted.is_ok(), "the waiter: {granted:?}");
}

/// A default lock's waiter that starved and queued, whose link then stalls so that its renewals
/// time out (their outcome unknown): it stops queueing until an answer proves those requests ran
/// and meanwhile listens to the lock's releases again; then it queues again. The lock, kept until
/// a place not renewed since the stall would have lapsed, is then taken again at once by its
/// releaser after every 50 ms section: a release hands the waiter the lock. Before the fix it
/// never queued again and kept listening only for the hand-off to its lapsed place: it won none
/// of the releases and answered `Contended` at the end of its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_renewals_timed_out_is_handed_the_lock_again() {
    // Longer one way than the response timeout (500 ms) is for the round trip: renewals time out.
    const STALL_LINK: Duration = Duration::from_millis(700);
    const STALL: Duration = Duration::from_secs(3);
    const SECTION: Duration = Duration::from_millis(50);
    // A default lock's place in line lives 3 s after its last renewal.
    const LEASE: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let looper = client(LockConfig::single(server.url()).fencing(true));
    let waiting = client(LockConfig::single(proxy.url()).fencing(true));
    let key = unique_key("waiters:renewals-timed-out");
    let mut held = looper.lock(&key).acquire().await.unwrap();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = waiting
                .lock(&key)
                .wait(Duration::from_secs(30))
                .acquire()
                .await;
            (result.map(drop), started.elapsed())
        })
    };
    until_queued(&looper, &key, 1).await;
    let attempts = server.command_calls("evalsha");
    proxy.set_delay(STALL_LINK);
    tokio::time::sleep(STALL).await;
    proxy.set_delay(Duration::ZERO);
    // The waiter's renewals did reach the server during the stall (each a third of a lease
    // apart, 700 ms late): they timed out at the waiter, their outcome unknown.
    let renewals = server.command_calls("evalsha") - attempts;
    assert!(
        renewals >= 1,
        "no renewal reached the server during the stall"
    );
    // The holder keeps the lock until a place last renewed during the stall would have lapsed
    // (as the holder kept it 9 s): a waiter that no longer queues has none left.
    tokio::time::sleep(LEASE + STALL_LINK).await;
    assert!(
        !waiter.is_finished(),
        "the waiter answered during the stall"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let releases = Arc::new(AtomicUsize::new(0));
    let looping = {
        let (key, stop, releases) = (key.clone(), Arc::clone(&stop), Arc::clone(&releases));
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                // The critical section's work, not a wait for anything.
                tokio::time::sleep(SECTION).await;
                held.release().await?;
                releases.fetch_add(1, Ordering::SeqCst);
                held = looper
                    .lock(&key)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await?;
            }
            held.release().await
        })
    };
    let looped = Instant::now();
    // Within two of its pauses (at most a third of a lease each): an answer that proves its
    // timed-out renewals ran, then an attempt that queues; then the next release hands it the
    // lock.
    let bound = LEASE / 3 * 2 + SECTION * 2 + SCHEDULING_SLACK;
    let (result, waited) = bounded(Duration::from_secs(40), "the waiter answers", waiter)
        .await
        .unwrap();
    let took = looped.elapsed();
    let during = releases.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    bounded(Duration::from_secs(5), "the loop ends", looping)
        .await
        .unwrap()
        .unwrap();
    assert!(
        result.is_ok(),
        "the waiter answered {result:?} after {waited:?}, the loop let go {during} times"
    );
    assert!(
        took <= bound,
        "handed the lock {took:?} after the loop began (the loop let go {during} times), not \
         within {bound:?}"
    );
}
