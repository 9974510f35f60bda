//! The etcd backend under faults the other etcd tests do not inject: a member frozen (a follower,
//! the leader) while a lock is held, a waiter whose watch must start again at a compacted
//! revision, and a lease revoked by someone else. Rows of the fault table in
//! `lock-runtime/FAULTS.md`. Three real `etcd` members on 127.0.0.1.

#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::{
    CLEANUP_PAUSE, ETCD_REQUEST, EtcdCluster, FaultProxy, SCHEDULING_SLACK, bounded, etcd_client,
    etcd_key, release_lost_in_a_partition, unique_key, wait_until, wait_until_async, waiter,
};

/// The default retry delay (100 ms) at its largest jitter (x1.5).
const LONGEST_BACKOFF: Duration = Duration::from_millis(150);

fn leader(cluster: &EtcdCluster) -> usize {
    let mut found = None;
    wait_until(Duration::from_secs(5), "a leader", || {
        found = cluster.leader();
        found.is_some()
    });
    found.unwrap()
}

/// Freezes member `frozen` for two ttls while `key` is held and renewed: the holder is never
/// told lost, and another client never gets the lock; returns the guard, still held.
async fn hold_through_a_frozen_member(
    cluster: &EtcdCluster,
    frozen: usize,
    locks: &LockClient,
    other: &LockClient,
    key: &str,
    ttl: Duration,
) -> lock_runtime::LockGuard {
    let guard = locks.lock(key).ttl(ttl).acquire().await.unwrap();
    cluster.freeze(frozen, true);
    let since = Instant::now();
    // The fault's own duration: two ttls, so renewals had to go through the other members.
    while since.elapsed() < ttl * 2 {
        assert!(
            !guard.is_lost(),
            "lost {:?} into the freeze",
            since.elapsed()
        );
        let taken = other.lock(key).acquire().await;
        assert!(
            matches!(
                taken,
                Err(LockError::Contended { .. } | LockError::Unavailable { .. })
            ),
            "another client got the held lock: {taken:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!guard.is_lost(), "lost at the end of the freeze");
    guard
}

/// A follower frozen (SIGSTOP) for two ttls while a lock is held: keepalives go through the
/// others (a majority), the lock stays held, and its release works once the member is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_follower_while_held_the_lock_stays_held() {
    let cluster = EtcdCluster::start(3);
    let locks = etcd_client(cluster.endpoints());
    let other = etcd_client(cluster.endpoints());
    let key = unique_key("etcd-faults:follower");
    let follower = (leader(&cluster) + 1) % cluster.len();
    let ttl = Duration::from_secs(2);
    let guard = hold_through_a_frozen_member(&cluster, follower, &locks, &other, &key, ttl).await;
    cluster.freeze(follower, false);
    bounded(ETCD_REQUEST * 2, "release", guard.release())
        .await
        .expect("release after the follower came back");
    assert!(!cluster.exists(&etcd_key(&key)), "the key is left");
}

/// The leader frozen (isolated: it answers nobody) for two ttls while a lock is held: the others
/// elect a new leader, the lock stays held through them; once the holder releases, a waiter
/// that was waiting meanwhile gets the lock within one request + one backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_frozen_the_lock_stays_held_and_a_waiter_gets_it_after_the_release() {
    let cluster = EtcdCluster::start(3);
    let locks = etcd_client(cluster.endpoints());
    let other = etcd_client(cluster.endpoints());
    let key = unique_key("etcd-faults:leader");
    let old_leader = leader(&cluster);
    let ttl = Duration::from_secs(2);
    let guard = hold_through_a_frozen_member(&cluster, old_leader, &locks, &other, &key, ttl).await;
    let new_leader = leader(&cluster);
    assert_ne!(
        new_leader, old_leader,
        "no new leader while the old one is frozen"
    );
    let first = guard.fencing_token().unwrap();
    // Watchers on the members that answer (the frozen one's metrics would not come).
    let watchers = || -> f64 {
        (0..cluster.len())
            .filter(|&i| i != old_leader)
            .map(|i| cluster.metric(i, "etcd_debugging_mvcc_watcher_total", ""))
            .sum()
    };
    let before = watchers();
    let waiter = waiter(other, &key, Duration::from_secs(10));
    // Waiting: it watches the key, through a member that answers.
    wait_until_async(Duration::from_secs(5), "the waiter watches", || {
        watchers() > before
    })
    .await;
    assert!(!waiter.is_finished(), "the waiter did not wait");
    bounded(ETCD_REQUEST * 2, "release", guard.release())
        .await
        .expect("release with the old leader frozen");
    let released = Instant::now();
    let (taken, at) = bounded(Duration::from_secs(10), "the waiter", waiter)
        .await
        .unwrap();
    let next = taken.expect("the waiter never got the lock");
    let after = at - released;
    eprintln!("leader frozen: the waiter got the lock {after:?} after the release");
    assert!(
        after <= ETCD_REQUEST + LONGEST_BACKOFF + SCHEDULING_SLACK,
        "the waiter got the lock only {after:?} after the release"
    );
    assert!(
        next.fencing_token().unwrap() > first,
        "the token did not grow"
    );
    cluster.freeze(old_leader, false);
    next.release().await.unwrap();
}

/// A waiter reaches the cluster through a proxy, which holds its traffic while the holder
/// releases and the history is compacted past the revision the waiter watches from, then resets
/// its connections: the waiter's watch must start again at a compacted revision. It is still
/// woken, or retries within its backoff, and gets the lock well within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_watch_start_was_compacted_still_gets_the_lock_within_its_wait() {
    let cluster = EtcdCluster::start(3);
    let proxy = FaultProxy::start(cluster.client_port(0));
    let locks = etcd_client(cluster.endpoints());
    let waiting = etcd_client(vec![proxy.http_url()]);
    let key = unique_key("etcd-faults:compacted");
    let guard = locks.lock(&key).acquire().await.unwrap();
    let watchers = cluster.watchers();
    let wait = Duration::from_secs(10);
    let waiter = waiter(waiting, &key, wait);
    wait_until_async(Duration::from_secs(5), "the waiter watches", || {
        cluster.watchers() > watchers
    })
    .await;
    let watched_from = cluster.revision();
    proxy.set_blackhole(true);
    guard.release().await.unwrap();
    // More history after the deletion, then all of it compacted.
    for _ in 0..3 {
        let g = locks
            .lock(unique_key("etcd-faults:churn"))
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let compacted = cluster.compact();
    assert!(
        compacted > watched_from + 1,
        "compacted at {compacted}, the watch started at {watched_from}"
    );
    proxy.cut_all();
    proxy.set_blackhole(false);
    let healed = Instant::now();
    let (taken, at) = bounded(wait + ETCD_REQUEST, "the waiter", waiter)
        .await
        .unwrap();
    let after = at - healed;
    eprintln!(
        "watch from revision {watched_from} compacted at {compacted}: the waiter answered \
         {:?} {after:?} after the heal",
        taken.as_ref().map(|_| "granted")
    );
    let next = taken.expect("the waiter did not get the lock");
    assert!(
        after <= ETCD_REQUEST * 2 + LONGEST_BACKOFF + SCHEDULING_SLACK,
        "the waiter got the lock only {after:?} after the heal"
    );
    next.release().await.unwrap();
}

/// The connection under an acquire is reset while its request is in flight (the proxy holds
/// the request, then cuts every connection). A broken connection is a transient failure like a
/// refused one: the acquire tries again on a new connection and is granted within its wait, and
/// is not `Unavailable` at once (it was, when tonic's "transport error" counted as an etcd error
/// reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_connection_is_reset_in_flight_is_retried_within_its_wait() {
    let cluster = EtcdCluster::shared(1);
    let proxy = FaultProxy::start(cluster.client_port(0));
    let locks = etcd_client(vec![proxy.http_url()]);
    let key = unique_key("etcd-faults:reset");
    // The connection exists (a read leaves no lease behind to be revoked later).
    assert!(locks.inspect(&key).await.unwrap().is_none());
    let sent = proxy.bytes_up();
    proxy.set_blackhole(true);
    let wait = Duration::from_secs(5);
    let acquiring = {
        let key = key.clone();
        tokio::spawn(async move { locks.lock(&key).wait(wait).acquire().await })
    };
    wait_until_async(ETCD_REQUEST, "the acquire reached the proxy", || {
        proxy.bytes_up() > sent
    })
    .await;
    proxy.cut_all();
    proxy.set_blackhole(false);
    let cut = Instant::now();
    let taken = bounded(wait, "the acquire", acquiring).await.unwrap();
    let guard = taken.expect("the acquire failed on the reset instead of retrying");
    eprintln!("reset in flight: granted {:?} after the cut", cut.elapsed());
    assert!(cluster.exists(&etcd_key(&key)), "granted, but no key");
    guard.release().await.unwrap();
}

/// A release no member answered goes on in the background: the holder's link partitioned during
/// its release (the held bytes dropped, so the first delete never reaches etcd), then healed. Its
/// lock (ttl 30 s: a lease that a leader change would renew in full) goes, and a waiter on
/// another link is granted, within the cleanup's longest pause + two requests of the heal.
/// Before, the lock stayed for its lease and the waiter's 10 s ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_no_member_answered_is_retried_once_the_partition_heals() {
    let cluster = EtcdCluster::shared(1);
    let proxy = FaultProxy::start(cluster.client_port(0));
    let locks = etcd_client(vec![proxy.http_url()]);
    let waiting = etcd_client(cluster.endpoints());
    let key = unique_key("etcd-faults:release-retried");
    let ttl = Duration::from_secs(30);
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let watchers = cluster.watchers();
    let waiter = waiter(waiting, &key, Duration::from_secs(10));
    wait_until_async(Duration::from_secs(5), "the waiter watches", || {
        cluster.watchers() > watchers
    })
    .await;
    release_lost_in_a_partition(&proxy, guard).await;
    assert!(
        cluster.exists(&etcd_key(&key)),
        "the release reached etcd through the partition"
    );
    proxy.set_blackhole(false);
    let healed = Instant::now();
    let bound = CLEANUP_PAUSE + ETCD_REQUEST * 2 + SCHEDULING_SLACK;
    let (taken, at) = bounded(bound, "the waiter, after the heal", waiter)
        .await
        .unwrap();
    eprintln!(
        "release retried: the waiter answered {:?} {:?} after the heal (bound {bound:?})",
        taken.as_ref().map(|_| "granted"),
        at - healed
    );
    let next = taken.expect("the waiter did not get the lock");
    next.release().await.unwrap();
}

/// Someone else revokes the lease a held lock is bound to (its key goes with it): the holder is
/// told `Lost` within a renewal period (ttl / 3) + one request, and its release says `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_revoked_by_someone_else_is_lost_within_a_renewal_period() {
    let cluster = EtcdCluster::start(3);
    let locks = etcd_client(cluster.endpoints());
    let key = unique_key("etcd-faults:revoked");
    let ttl = Duration::from_secs(3);
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    assert!(
        cluster.revoke_lease_of(&etcd_key(&key)),
        "no lease to revoke"
    );
    let revoked = Instant::now();
    assert!(
        !cluster.exists(&etcd_key(&key)),
        "the key outlived its lease"
    );
    bounded(
        ttl / 3 + ETCD_REQUEST + SCHEDULING_SLACK,
        "lost() after the revoke",
        guard.lost(),
    )
    .await;
    eprintln!("revoked lease: lost {:?} later", revoked.elapsed());
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "release after the revoke said {released:?}"
    );
}
