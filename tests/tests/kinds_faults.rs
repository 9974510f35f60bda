//! Fair, shared and permit locks on a single Redis node under faults: the node frozen while one
//! is held, a permit's holder process killed, a fair waiter's (or a starving default waiter's)
//! process killed while it queues.
//! Rows of the fault table in `lock-runtime/FAULTS.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockError};
use lock_tests::sections::Kind;
use lock_tests::{
    RedisServer, SCHEDULING_SLACK, Worker, assert_lost_at_the_deadline, bounded, client,
    default_validity, lock_keys, unique_key, until_queued,
};

/// The default retry delay (100 ms) at its largest jitter (x1.5): how late a waiter that was not
/// woken (an expiry publishes nothing) asks again.
const LONGEST_BACKOFF: Duration = Duration::from_millis(150);

fn server_ms(server: &RedisServer) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut server.admin()).unwrap();
    secs * 1000 + micros / 1000
}

/// How long the leases (sorted set scores, server-clock ms) left in `key` still run, the longest
/// first; the `+inf` member saying what the key is left out.
fn leases_left(server: &RedisServer, key: &str) -> Vec<Duration> {
    let scores: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut server.admin())
        .unwrap();
    let now = server_ms(server);
    let mut left: Vec<Duration> = scores
        .iter()
        .filter(|(_, score)| score.is_finite())
        .map(|(_, score)| {
            #[allow(clippy::cast_possible_truncation)]
            let ms = (*score as i64 - now).max(0);
            Duration::from_millis(u64::try_from(ms).unwrap())
        })
        .collect();
    left.sort_unstable_by(|a, b| b.cmp(a));
    left
}

/// Panics unless `what` was taken `took` after its holder died, at the end of the lease it had
/// `left` then: not before (the server's clock decides), and within one backoff (an expiry wakes
/// nobody) + scheduling slack.
#[track_caller]
fn assert_taken_when_the_lease_ran_out(what: &str, took: Duration, left: Duration) {
    assert!(
        took + Duration::from_millis(2) >= left,
        "{what}: taken {took:?} after the kill, before its lease ({left:?} left) ran out"
    );
    assert!(
        took <= left + LONGEST_BACKOFF + SCHEDULING_SLACK,
        "{what}: taken only {took:?} after the kill; its lease had {left:?} left"
    );
}

fn holder(server: &RedisServer, key: &str, ttl: Duration, kind: Kind) -> Worker {
    Worker::spawn(
        env!("CARGO_BIN_EXE_holder"),
        &[
            server.url(),
            key.to_owned(),
            ttl.as_millis().to_string(),
            kind.to_string(),
        ],
    )
}

/// A frozen node: a fair, shared or permit holder cannot renew, so it is told `Lost` at its
/// validity deadline (`ttl - (ttl * 0.01 + 2 ms)` after the acquire was sent), not before, and
/// its release says `Lost` once the node is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_loses_a_fair_shared_or_permit_lock_at_the_validity_deadline() {
    let ttl = Duration::from_secs(1);
    let validity = default_validity(ttl);
    for kind in [Kind::Fair, Kind::Shared, Kind::Permits(2)] {
        let server = RedisServer::start();
        let locks = client(LockConfig::single(server.url()));
        let key = unique_key("kinds:frozen");
        let asked = Instant::now();
        let guard = kind
            .apply(locks.lock(&key).ttl(ttl))
            .acquire()
            .await
            .unwrap();
        let granted = Instant::now();
        server.freeze();
        bounded(
            validity + SCHEDULING_SLACK + Duration::from_secs(1),
            "lost() while frozen",
            guard.lost(),
        )
        .await;
        let lost = Instant::now();
        eprintln!(
            "{kind}: frozen node, lost {:?} after the acquire was sent (validity {validity:?})",
            lost - asked
        );
        assert_lost_at_the_deadline(asked, granted, lost, validity);
        server.thaw();
        let released = bounded(Duration::from_secs(5), "release", guard.release()).await;
        assert!(
            matches!(released, Err(LockError::Lost { .. })),
            "{kind}: release after the thaw said {released:?}"
        );
    }
}

/// A permit holder's process killed: its permit (a lease in the key's sorted set) frees when the
/// lease runs out, not before, and another process takes the permit then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_permit_holder_frees_its_permit_within_its_ttl_not_before() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let ttl = Duration::from_secs(1);
    let key = unique_key("kinds:permit-killed");
    let mut dead = holder(&server, &key, ttl, Kind::Permits(1));
    let line = dead.next_line(Duration::from_secs(20));
    assert!(line.starts_with("acquired"), "holder said {line:?}");
    dead.kill();
    let left = leases_left(&server, &lock_keys(&key).lock)[0];
    let killed = Instant::now();
    let guard = bounded(
        ttl + Duration::from_secs(5),
        "take the permit",
        locks
            .lock(&key)
            .permits(1)
            .ttl(ttl)
            .wait(ttl + SCHEDULING_SLACK)
            .acquire(),
    )
    .await
    .expect("the dead holder's permit never freed");
    let took = killed.elapsed();
    eprintln!("killed permit holder: lease had {left:?} left; the permit taken {took:?} later");
    assert_taken_when_the_lease_ran_out("the dead holder's permit", took, left);
    guard.release().await.unwrap();
}

/// A fair waiter's process killed while it queues, next in line: the holder's release hands the
/// lock to its entry, which blocks the line until that entry's lease runs out (its ttl after its
/// last attempt), not longer; the waiter behind it gets the lock then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_fair_waiter_leaves_the_line_within_its_ttl() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let behind = client(LockConfig::single(server.url()));
    let ttl = Duration::from_secs(1);
    let key = unique_key("kinds:fair-waiter-killed");
    let held = locks.lock(&key).fair(true).acquire().await.unwrap();
    let mut dead = holder(&server, &key, ttl, Kind::Fair);
    until_queued(&locks, &key, 1).await;
    dead.kill();
    let leases = lock_keys(&key).queue_leases;
    let left = leases_left(&server, &leases)[0];
    let killed = Instant::now();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            behind
                .lock(&key)
                .fair(true)
                .ttl(ttl)
                .wait(ttl * 3)
                .acquire()
                .await
        })
    };
    until_queued(&locks, &key, 2).await;
    held.release().await.unwrap();
    let guard = bounded(ttl * 4, "the waiter behind", waiter)
        .await
        .unwrap()
        .expect("the waiter behind a dead one never got the lock");
    let took = killed.elapsed();
    eprintln!(
        "killed fair waiter: its entry had {left:?} left; the one behind it got the lock {took:?} \
         after the kill"
    );
    assert_taken_when_the_lease_ran_out("the lock behind a dead fair waiter", took, left);
    guard.release().await.unwrap();
}

/// A default lock's waiter that queued because it starved (it waited past 10 ms), its process
/// then killed: the holder's release hands the lock to its place, which lives 3 s past its last
/// attempt (not the lock's ttl, 30 s here), so the waiter behind it gets the lock when that short
/// lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_starving_waiter_holds_up_a_default_lock_only_for_its_short_lease() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    let behind = client(LockConfig::single(server.url()));
    let (ttl, lease) = (Duration::from_secs(30), Duration::from_secs(3));
    let key = unique_key("kinds:starving-waiter-killed");
    let held = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let mut dead = holder(&server, &key, ttl, Kind::Exclusive);
    until_queued(&locks, &key, 1).await;
    dead.kill();
    let left = leases_left(&server, &lock_keys(&key).queue_leases)[0];
    assert!(left <= lease, "the starving waiter's place lives {left:?}");
    let killed = Instant::now();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move { behind.lock(&key).ttl(ttl).wait(lease * 3).acquire().await })
    };
    until_queued(&locks, &key, 2).await;
    held.release().await.unwrap();
    let guard = bounded(lease * 4, "the waiter behind", waiter)
        .await
        .unwrap()
        .expect("the waiter behind a dead one never got the lock");
    let took = killed.elapsed();
    eprintln!(
        "killed starving waiter: its place had {left:?} left; the one behind it got the lock \
         {took:?} after the kill"
    );
    assert_taken_when_the_lease_ran_out("the lock behind a dead starving waiter", took, left);
    guard.release().await.unwrap();
}
