//! etcd on three members: processes contending (history-checked, 1,000 grants), and the faults a
//! consensus backend is for: the leader killed while a lock is held, a holder process killed, the
//! client partitioned from the cluster, two of three members down, a fair waiter cut off; and
//! authentication. The behaviour suite on one member is `etcd_behaviour.rs`.
//!
//! The non-destructive tests share one cluster per binary (distinct keys); a test that kills
//! members starts a cluster of its own.

#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{ENV_ETCD_ENDPOINTS, FailureKind, LockClient, LockConfig, LockError};
use lock_tests::{
    ETCD_ELECTION_TIMEOUT, ETCD_REQUEST, EtcdCluster, FaultProxy, RedisServer, SCHEDULING_SLACK,
    Worker, bounded, default_validity, etcd_client, etcd_key, finish_all, history, unique_key,
    until_queued, wait_until,
};

/// How often etcd revokes the leases that ran out.
const ETCD_EXPIRY_SWEEP: Duration = Duration::from_millis(500);

/// `key`, waiting up to 10s for it.
async fn take_within_10s(locks: &LockClient, key: &str) -> lock_runtime::LockGuard {
    let wait = Duration::from_secs(10);
    let taken = locks.lock(key).wait(wait).acquire().await;
    taken.unwrap_or_else(|e| panic!("{key} not taken within {wait:?}: {e}"))
}

/// Three processes (sync, async, sync) take one lock 334 times each on three members and
/// increment a counter kept on Redis: no two grants overlap, fencing tokens (the key's create
/// revision) strictly increase in grant order over the 1,002 grants, and no increment is lost.
#[test]
fn three_processes_1000_grants_never_overlap_and_fences_strictly_increase() {
    const ITERATIONS: u64 = 334;
    let cluster = EtcdCluster::shared(3);
    let data_store = RedisServer::start();
    let lock_key = unique_key("etcd:processes");
    let data = unique_key("etcd:data");
    let endpoints = cluster.endpoints().join(",");
    let started = Instant::now();
    let modes = ["sync", "async", "sync"];
    let mut workers: Vec<Worker> = modes
        .iter()
        .map(|mode| {
            Worker::spawn_with_env(
                env!("CARGO_BIN_EXE_counter_worker"),
                &[
                    data_store.url().as_str(),
                    &lock_key,
                    &data,
                    &ITERATIONS.to_string(),
                    mode,
                ],
                &[(ENV_ETCD_ENDPOINTS, endpoints.as_str())],
            )
        })
        .collect();
    let outputs = finish_all(&mut workers, Duration::from_secs(240));
    let took = started.elapsed();
    let (grants, violations, lost) = history::gather(&outputs, &modes, ITERATIONS as usize);
    let counter: Option<i64> = redis::cmd("GET")
        .arg(format!("{data}:counter"))
        .query(&mut data_store.admin())
        .unwrap();
    eprintln!(
        "3 processes x {ITERATIONS} grants on 3 etcd members: {took:?}, {:.2} ms per grant",
        took.as_secs_f64() * 1000.0 / (3 * ITERATIONS) as f64
    );
    assert_eq!((violations, lost), (0, 0));
    assert_eq!(counter, Some(3 * ITERATIONS as i64), "increments were lost");
    assert!(grants.iter().all(|g| g.fence > 0), "a grant had no token");
    if let Err(violation) = history::check(&grants) {
        panic!("{violation}");
    }
    assert!(!cluster.exists(&etcd_key(&lock_key)));
}

/// The leader is killed while a lock is held: keepalives move to a surviving member and the new
/// leader keeps the lease, so the lock stays held through two ttls; nobody else gets it; the
/// next grant's fencing token is larger.
///
/// The promise holds while the cluster elects its new leader within the validity the lock has
/// left at the kill: at least the ttl less one renewal period (a third of it) and the drift.
/// The ttl gives that twice the election's bound. At 2 s (1.3 s left) a loaded 2-core CI machine
/// lost the lock before the election ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held_the_lock_stays_held() {
    let mut cluster = EtcdCluster::start(3);
    let locks = etcd_client(cluster.endpoints());
    let other = etcd_client(cluster.endpoints());
    let key = unique_key("etcd:leader");
    let election = ETCD_ELECTION_TIMEOUT * 2 + SCHEDULING_SLACK;
    let ttl = election * 3;
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let first = guard.fencing_token().unwrap();
    let leader = {
        let mut found = None;
        wait_until(Duration::from_secs(5), "a leader", || {
            found = cluster.leader();
            found.is_some()
        });
        found.unwrap()
    };
    cluster.kill(leader);
    let killed = Instant::now();
    // The behaviour under test is the passing of time: two ttls with the leader gone.
    while killed.elapsed() < ttl * 2 {
        assert!(
            !guard.is_lost(),
            "lost {:?} after the leader died",
            killed.elapsed()
        );
        assert!(matches!(
            other.lock(&key).acquire().await,
            Err(LockError::Contended { .. } | LockError::Unavailable { .. })
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Contended, not Unavailable, once the cluster has its new leader.
    let contended = bounded(Duration::from_secs(5), "a contended answer", async {
        loop {
            match other.lock(&key).acquire().await {
                Err(LockError::Contended { .. }) => return,
                Err(LockError::Unavailable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                answer => panic!("expected Contended, got {answer:?}"),
            }
        }
    });
    contended.await;
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    let next = other.lock(&key).acquire().await.unwrap();
    assert!(next.fencing_token().unwrap() > first);
    next.release().await.unwrap();
}

/// A holder process is killed (SIGKILL) while holding: its lease is not kept alive any more and
/// the lock frees within its ttl (rounded up to whole seconds) plus etcd's expiry check; a
/// waiter, woken by the deletion, gets it with a larger fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock_within_its_ttl() {
    let cluster = EtcdCluster::shared(3);
    let key = unique_key("etcd:killed");
    let endpoints = cluster.endpoints().join(",");
    let ttl = Duration::from_secs(2);
    let mut holder = Worker::spawn_with_env(
        env!("CARGO_BIN_EXE_holder"),
        &["unused", key.as_str(), &ttl.as_millis().to_string()],
        &[(ENV_ETCD_ENDPOINTS, endpoints.as_str())],
    );
    let line = holder.next_line(Duration::from_secs(10));
    let stale: u64 = line
        .strip_prefix("acquired fence=")
        .unwrap_or_else(|| panic!("holder said {line:?}"))
        .parse()
        .unwrap();
    holder.kill();
    let killed = Instant::now();
    let locks = etcd_client(cluster.endpoints());
    let guard = take_within_10s(&locks, &key).await;
    let freed = killed.elapsed();
    eprintln!("free {freed:?} after the holder was killed (ttl {ttl:?})");
    // The lease's ttl, counted from the last keepalive (up to ttl/3 before the kill), plus
    // etcd's 500ms expiry sweep and the wake-up.
    assert!(freed < ttl + Duration::from_millis(1500), "{freed:?}");
    assert!(guard.fencing_token().unwrap() > stale);
    guard.release().await.unwrap();
}

/// The client is partitioned from the cluster (a blackhole in front of its only endpoint) while
/// it holds a lock: the holder is told `Lost` at its validity deadline (ttl after the last
/// confirmed keepalive), the async body is cancelled and the call says `Lost`. A contender that
/// keeps trying (wait 0, every 50 ms) throughout the partition is refused until then and gets the
/// lock only after the holder's loss (no overlap), within the lease's end (the holder's deadline
/// + its drift) + etcd's 500 ms expiry sweep + one poll and one request timeout + slack after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_client_is_lost_at_the_lease_deadline_before_anyone_else_gets_it() {
    let cluster = EtcdCluster::shared(3);
    let proxy = FaultProxy::start(cluster.client_port(0));
    let locks = etcd_client(vec![proxy.http_url()]);
    let other = etcd_client(cluster.endpoints());
    let key = unique_key("etcd:partition");
    let ttl = Duration::from_secs(2);
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    let (inside_tx, inside) = tokio::sync::oneshot::channel();
    // A second, attribute-style call on another key shows the body cancellation.
    let body_key = unique_key("etcd:partition-body");
    let body_call = locks.lock(&body_key).ttl(ttl);
    let body = tokio::spawn(async move {
        body_call
            .run(async move {
                let _ = inside_tx.send(());
                std::future::pending::<()>().await;
                Ok::<(), LockError>(())
            })
            .await
    });
    inside.await.unwrap();
    proxy.set_blackhole(true);
    let cut = Instant::now();
    // The contender: one try every 50 ms, each recorded, until it holds the lock (bounded).
    let poll = Duration::from_millis(50);
    let contender = {
        let (other, key) = (other.clone(), key.clone());
        tokio::spawn(async move {
            let mut refused = 0u32;
            for _ in 0..200 {
                match other.lock(&key).ttl(ttl).acquire().await {
                    Ok(guard) => return (Instant::now(), refused, guard),
                    Err(LockError::Contended { .. }) => refused += 1,
                    Err(e) => panic!("the contender: {e}"),
                }
                tokio::time::sleep(poll).await;
            }
            panic!("the contender never got the lock ({refused} refusals)");
        })
    };
    bounded(ttl * 2, "the loss", guard.lost()).await;
    let lost = Instant::now();
    let lost_after = lost - cut;
    let body_result = bounded(ttl * 2, "the cancelled body", body).await.unwrap();
    assert_eq!(body_result, Err(LockError::Lost { key: body_key }));
    let (taken_at, refused, taken) = bounded(ttl * 3, "the contender", contender).await.unwrap();
    let taken_after = taken_at - cut;
    eprintln!(
        "lost {lost_after:?} after the partition; the contender, refused {refused} times, got it \
         {:?} after the loss",
        taken_at - lost
    );
    // The validity deadline is at most ttl after the cut (the last confirmed keepalive was sent
    // before it), and at least ttl - drift after the last one confirmed, which was sent at most
    // one renewal period (ttl / 3) + one request timeout before the cut; noticed by the renewal
    // driver's timer.
    let validity = default_validity(ttl);
    assert!(
        lost_after <= ttl + SCHEDULING_SLACK,
        "lost {lost_after:?} after the cut"
    );
    assert!(
        lost_after + ttl / 3 + ETCD_REQUEST + SCHEDULING_SLACK >= validity,
        "lost too early: {lost_after:?} after the cut"
    );
    assert!(
        refused > 0,
        "the contender never tried during the partition"
    );
    assert!(
        taken_at > lost,
        "granted to another {:?} before the holder knew",
        lost - taken_at
    );
    let bound = (ttl - validity) + ETCD_EXPIRY_SWEEP + poll + ETCD_REQUEST + SCHEDULING_SLACK;
    assert!(
        taken_at - lost <= bound,
        "the contender got the lock {:?} after the holder's loss (bound {bound:?}), {taken_after:?} \
         after the cut",
        taken_at - lost
    );
    proxy.set_blackhole(false);
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    taken.release().await.unwrap();
}

/// A fair waiter cut off from the cluster (to etcd, a crashed process) while it is the next in
/// line: it blocks the line only until its entry's lease runs out (its ttl after its last
/// attempt); the waiter behind it, woken by that entry's deletion, then gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_cut_off_leaves_the_line_within_its_ttl() {
    let cluster = EtcdCluster::shared(3);
    let proxy = FaultProxy::start(cluster.client_port(0));
    let cut = etcd_client(vec![proxy.http_url()]);
    let other = etcd_client(cluster.endpoints());
    let key = unique_key("etcd:fair-cut");
    let ttl = Duration::from_secs(2);
    let holder = other.lock(&key).fair(true).acquire().await.unwrap();
    let doomed = {
        let (cut, key) = (cut.clone(), key.clone());
        tokio::spawn(async move {
            let wait = Duration::from_secs(30);
            cut.lock(&key)
                .fair(true)
                .ttl(ttl)
                .wait(wait)
                .acquire()
                .await
        })
    };
    until_queued(&other, &key, 1).await;
    let behind = {
        let (other, key) = (other.clone(), key.clone());
        tokio::spawn(async move {
            let wait = Duration::from_secs(20);
            let guard = other.lock(&key).fair(true).wait(wait).acquire().await;
            (Instant::now(), guard)
        })
    };
    until_queued(&other, &key, 2).await;
    proxy.set_blackhole(true);
    let cut_at = Instant::now();
    holder.release().await.unwrap();
    let (got_at, guard) = bounded(ttl * 3, "the waiter behind", behind).await.unwrap();
    let guard = guard.unwrap();
    let waited = got_at - cut_at;
    eprintln!("the waiter behind got the lock {waited:?} after the one before it was cut off");
    // The cut-off entry was renewed at most ttl/3 before the cut (each attempt renews it), and
    // goes at its lease's end plus etcd's 500ms expiry sweep.
    assert!(
        waited >= ttl / 2,
        "served before the entry ahead ran out: {waited:?}"
    );
    assert!(waited < ttl + Duration::from_millis(1500), "{waited:?}");
    doomed.abort();
    assert!(doomed.await.is_err());
    guard.release().await.unwrap();
    proxy.set_blackhole(false);
}

/// Two of three members down: no quorum, so acquires are `Unavailable` (never `Contended`),
/// quickly, naming each endpoint; once one member is back the lock works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_down_is_unavailable_and_works_again_when_one_returns() {
    let mut cluster = EtcdCluster::start(3);
    let locks = etcd_client(cluster.endpoints());
    let key = unique_key("etcd:quorum");
    take_within_10s(&locks, &key).await.release().await.unwrap();
    cluster.kill(1);
    cluster.kill(2);
    let started = Instant::now();
    let err = locks.lock(&key).acquire().await.unwrap_err();
    let took = started.elapsed();
    eprintln!("without quorum, after {took:?}: {err}");
    let LockError::Unavailable { causes, .. } = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(took < Duration::from_secs(3), "{took:?}");
    let shown = err.to_string();
    for i in 0..3 {
        let endpoint = format!("127.0.0.1:{}", cluster.client_port(i));
        assert!(shown.contains(&endpoint), "{endpoint} missing from {shown}");
    }
    assert!(causes.iter().all(|c| c.kind != FailureKind::Auth));
    cluster.restart(2);
    take_within_10s(&locks, &key).await.release().await.unwrap();
}

/// With authentication on, the right password works; a wrong one is `Unavailable` with an `Auth`
/// cause at once (not retried for the wait), never `Contended`, and no password shows in the
/// error or the config's `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_users_authenticate_and_a_wrong_password_is_an_auth_failure() {
    let cluster = EtcdCluster::start(1);
    cluster.enable_auth("s3cret-pw");
    let port = cluster.client_port(0);
    let key = unique_key("etcd:auth");
    let good = LockConfig::etcd([format!("http://root:s3cret-pw@127.0.0.1:{port}")]);
    assert!(!format!("{good:?}").contains("s3cret-pw"));
    let locks = LockClient::new(good).unwrap();
    take_within_10s(&locks, &key).await.release().await.unwrap();

    let bad = etcd_client(vec![format!("http://root:wrong-pw@127.0.0.1:{port}")]);
    let started = Instant::now();
    let err = bad
        .lock(&key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    match &err {
        LockError::Unavailable { causes, .. } => {
            assert!(
                causes.iter().all(|c| c.kind == FailureKind::Auth),
                "{err:?}"
            );
        }
        other => panic!("expected Unavailable(Auth), got {other:?}"),
    }
    assert!(
        !shown.contains("wrong-pw") && !shown.contains("s3cret-pw"),
        "{shown}"
    );
}

/// 200 locks held by one client are renewed together (one keepalive each, then their keys read
/// 128 to a transaction) through two ttls; a key deleted by someone else (a forced release)
/// loses that lock only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_held_locks_renew_in_batches_and_a_deleted_key_loses_only_its_lock() {
    let cluster = EtcdCluster::shared(3);
    let locks = etcd_client(cluster.endpoints());
    let other = etcd_client(cluster.endpoints());
    let base = unique_key("etcd:many");
    let ttl = Duration::from_secs(2);
    let mut guards = Vec::new();
    for i in 0..200 {
        let guard = locks.lock(format!("{base}:{i}")).ttl(ttl).acquire().await;
        guards.push(guard.unwrap_or_else(|e| panic!("lock {i}: {e}")));
    }
    assert!(other.force_release(&format!("{base}:7")).await.unwrap());
    bounded(ttl * 2, "the loss of the deleted one", guards[7].lost()).await;
    // The behaviour under test is the passing of time: two ttls of renewals.
    tokio::time::sleep(ttl * 2).await;
    for (i, guard) in guards.into_iter().enumerate() {
        assert_eq!(guard.is_lost(), i == 7, "lock {i}");
        let released = guard.release().await;
        if i == 7 {
            assert!(
                matches!(released, Err(LockError::Lost { .. })),
                "{released:?}"
            );
        } else {
            released.unwrap_or_else(|e| panic!("lock {i}: {e}"));
        }
    }
    assert_eq!(cluster.count_prefix(&etcd_key(&base)), 0);
}
