//! Faults only replicated topologies have: a Redis Cluster slot resharded while its locks are held
//! and taken, a cluster master killed while it holds an unreplicated grant (the double-grant
//! window without `min_replicas`, closed by `min_replicas(1)`), and a Sentinel failover during a
//! stress run. Each test starts its own topology (they change it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockClient, LockConfig, LockError};
use lock_tests::history::{self, Grant, now_ns};
use lock_tests::{
    KeyEvents, RedisCluster, RedisServer, SCHEDULING_SLACK, SentinelOptions, SentinelSet, bounded,
    default_validity, eventually, lock_keys, pause_writes, unique_key, wait_until_async, warm_up,
};

/// What a stress task saw: its grants, and how its calls ended otherwise.
#[derive(Default)]
struct Tally {
    grants: Vec<Grant>,
    lost: u64,
    unavailable: u64,
    contended: u64,
}

/// Takes and releases `keys` in turn (wait 10s, body 0-2ms) until `stop`, at most 100,000 times.
async fn churn(client: LockClient, keys: Vec<String>, stop: Arc<AtomicBool>) -> Tally {
    let mut tally = Tally::default();
    for i in 0..100_000usize {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let key = &keys[i % keys.len()];
        match client
            .lock(key)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
        {
            Ok(guard) => {
                let acquired = now_ns();
                tokio::time::sleep(Duration::from_micros(fastrand_micros(i))).await;
                let grant = Grant::ending_now(key, guard.fencing_token(), acquired);
                match guard.release().await {
                    Ok(()) => tally.grants.push(grant),
                    // Lost while held: reported, and not counted as a clean grant.
                    Err(LockError::Lost { .. }) => {
                        tally.lost += 1;
                        tally.grants.push(grant);
                    }
                    Err(_) => {
                        tally.unavailable += 1;
                        tally.grants.push(grant);
                    }
                }
            }
            Err(LockError::Contended { .. }) => tally.contended += 1,
            Err(err @ LockError::Unavailable { .. }) => {
                if tally.unavailable < 3 {
                    eprintln!("{err}");
                }
                tally.unavailable += 1;
            }
            Err(other) => panic!("{key}: {other}"),
        }
    }
    tally
}

fn fastrand_micros(i: usize) -> u64 {
    // Deterministic spread of 0..2000µs without a random source.
    u64::try_from(i.wrapping_mul(7919) % 2000).unwrap_or(0)
}

/// Runs `tasks` churn tasks on `client` over `keys` while `disturb` runs on a blocking thread,
/// then `settle` longer; returns every task's tally.
async fn churn_during(
    client: &LockClient,
    keys: &[String],
    tasks: usize,
    settle: Duration,
    disturb: impl FnOnce() + Send + 'static,
) -> Vec<Tally> {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let mut mine = keys.to_vec();
            mine.rotate_left(t % keys.len());
            tokio::spawn(churn(client.clone(), mine, Arc::clone(&stop)))
        })
        .collect();
    bounded(
        Duration::from_secs(60),
        "the disturbance",
        tokio::task::spawn_blocking(disturb),
    )
    .await
    .unwrap();
    tokio::time::sleep(settle).await;
    stop.store(true, Ordering::Relaxed);
    let mut tallies = Vec::new();
    for handle in handles {
        tallies.push(
            bounded(Duration::from_secs(30), "a churn task", handle)
                .await
                .unwrap(),
        );
    }
    tallies
}

fn check_history(what: &str, tallies: &[Tally]) -> usize {
    let grants: Vec<Grant> = tallies.iter().flat_map(|t| t.grants.clone()).collect();
    let (lost, unavailable, contended) = tallies.iter().fold((0, 0, 0), |(l, u, c), t| {
        (l + t.lost, u + t.unavailable, c + t.contended)
    });
    eprintln!(
        "{what}: {} grants, lost {lost}, unavailable {unavailable}, contended {contended}",
        grants.len()
    );
    if let Err(violation) = history::check(&grants) {
        panic!("{what}: {violation}");
    }
    grants.len()
}

/// The slot of four locks (one hash tag) moves to another master and back while tasks take and
/// release them and one more lock stays held (ttl 1s, renewed across both moves): no two holders
/// at once, fencing tokens still grow (the fence keys move with the slot), and the long-held
/// lock is neither lost nor reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_the_slot_in_use_keeps_exclusion_and_held_locks() {
    let cluster = Arc::new(RedisCluster::start());
    let tag = unique_key("reshard");
    let keys: Vec<String> = (0..4).map(|i| format!("{{{tag}}}:k{i}")).collect();
    let long = format!("{{{tag}}}:held");
    let slot = cluster.slot_of(&lock_keys(&long).lock);
    assert!(
        keys.iter()
            .all(|k| cluster.slot_of(&lock_keys(k).lock) == slot)
    );
    let client = LockClient::new(LockConfig::cluster(cluster.urls()).fencing(true)).unwrap();
    let held = client
        .lock(&long)
        .ttl(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    let first_owner = cluster.master_of_slot(slot).port();
    let moved = Arc::new(AtomicU64::new(0));
    let disturb = {
        let (cluster, moved) = (Arc::clone(&cluster), Arc::clone(&moved));
        move || {
            let other = cluster
                .masters()
                .into_iter()
                .find(|m| m.port() != first_owner)
                .unwrap()
                .port();
            for to in [other, first_owner] {
                std::thread::sleep(Duration::from_millis(500));
                let target = &cluster.nodes[cluster.index_of(to)];
                let n = cluster.move_slot(slot, target);
                moved.fetch_add(u64::try_from(n).unwrap(), Ordering::Relaxed);
                assert_eq!(cluster.master_of_slot(slot).port(), to);
            }
        }
    };
    let tallies = churn_during(&client, &keys, 4, Duration::from_millis(1500), disturb).await;
    let grants = check_history("resharding", &tallies);
    assert!(grants > 50, "only {grants} grants");
    assert!(
        moved.load(Ordering::Relaxed) >= 2,
        "the held lock's keys moved twice"
    );
    assert!(!held.is_lost(), "renewal followed the slot");
    held.release().await.unwrap();
    let lost: u64 = tallies.iter().map(|t| t.lost).sum();
    assert_eq!(lost, 0, "short holds lost during a reshard");
}

/// Freezes `master`'s replica and cuts its replication link: from now on writes to `master`
/// reach no replica (a frozen replica would still read what was already on its socket).
fn cut_off_replica(cluster: &RedisCluster, master_port: u16) -> u16 {
    let master = &cluster.nodes[cluster.index_of(master_port)];
    let replica = cluster.replica_of(master);
    replica.freeze();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut master.admin())
        .unwrap();
    assert_eq!(killed, 1, "one replication link cut");
    replica.port()
}

/// Kills the master on `master_port`, thaws its frozen replica and waits until the replica took
/// over (the cluster healthy again, one master fewer replicas); returns how long that took.
fn fail_over(cluster: &mut RedisCluster, master_port: u16, replica_port: u16) -> Duration {
    let started = Instant::now();
    let master = cluster.index_of(master_port);
    cluster.nodes[master].stop();
    let replica = cluster.index_of(replica_port);
    cluster.nodes[replica].thaw();
    cluster.wait_ok(Duration::from_secs(30));
    started.elapsed()
}

/// A fresh cluster, a fresh key on it, its master's port, and a cluster config (ttl 15s).
fn failover_case(name: &str) -> (RedisCluster, String, u16, LockConfig) {
    let cluster = RedisCluster::start();
    let key = unique_key(name);
    let master = cluster.master_of(&lock_keys(&key).lock).port();
    let config = LockConfig::cluster(cluster.urls())
        .fencing(true)
        .default_ttl(Duration::from_secs(15));
    (cluster, key, master, config)
}

/// [`fail_over`] off the async workers; gives the cluster back.
async fn fail_over_async(mut cluster: RedisCluster, master: u16, replica: u16) -> RedisCluster {
    tokio::task::spawn_blocking(move || {
        let took = fail_over(&mut cluster, master, replica);
        eprintln!("failover took {took:?}");
        cluster
    })
    .await
    .unwrap()
}

/// Without `min_replicas`, a grant the replica never received is gone after its master dies and
/// the replica takes over: another client gets the same lock while the first still believes it
/// holds it (the documented double-grant window). The first holder learns it at its next
/// renewal: `Lost`, never a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_without_min_replicas_opens_a_double_grant_window() {
    let (cluster, key, master, config) = failover_case("failover:plain");
    let lock = lock_keys(&key).lock;
    let a = LockClient::new(config.clone()).unwrap();
    assert_eq!(a.inspect(&key).await.unwrap(), None);

    // A grant the replica did receive: its fence counter exists there, one grant behind after
    // the next.
    let replicated = a.lock(&key).acquire().await.unwrap();
    let replicated_fence = replicated.fencing_token().unwrap();
    replicated.release().await.unwrap();
    let master_node = &cluster.nodes[cluster.index_of(master)];
    let counter = lock_keys(&key).slot_fence;
    await_fence_on(cluster.replica_of(master_node), &counter, replicated_fence).await;

    let replica = cut_off_replica(&cluster, master);
    let asked = Instant::now();
    let first = a.lock(&key).acquire().await.unwrap();
    let cluster = fail_over_async(cluster, master, replica).await;
    assert_eq!(cluster.master_of(&lock).port(), replica);

    let b = LockClient::new(config).unwrap();
    let second = b
        .lock(&key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let second_granted = Instant::now();
    // Both believe they hold it: the window. Fencing still tells them apart: the promoted
    // replica's counter was one grant behind, and the second token is larger all the same.
    assert!(!first.is_lost(), "the first holder has not noticed yet");
    assert!(
        second.fencing_token() > first.fencing_token(),
        "the token repeated or went back across the failover: {:?} after {:?}",
        second.fencing_token(),
        first.fencing_token()
    );
    // Its next renewal (every ttl / 3 = 5 s; a failed one is retried sooner) reaches the promoted
    // replica, where the key is the second holder's: lost within one renewal period + one
    // request timeout (1.5 s, the defaults) + slack of the second grant, by that answer and not
    // by its validity deadline (ttl - drift after its acquire was sent).
    let ttl = Duration::from_secs(15);
    let bound = ttl / 3 + Duration::from_millis(1500) + SCHEDULING_SLACK;
    bounded(
        bound,
        "the first holder sees the loss at its next renewal",
        first.lost(),
    )
    .await;
    let lost = Instant::now();
    eprintln!(
        "double grant: the first holder lost {:?} after the second grant, {:?} after its own",
        lost - second_granted,
        lost - asked
    );
    assert!(
        lost < asked + default_validity(ttl),
        "lost only at its validity deadline, not by a renewal"
    );
    assert!(matches!(first.release().await, Err(LockError::Lost { .. })));
    assert!(!second.is_lost());
    second.release().await.unwrap();
}

/// The same failure with `min_replicas(1)`: the grant that no replica acknowledged is withdrawn
/// and the call fails with `Unavailable` (cause kind `Replication`), so after the failover the
/// second client is the only holder. Fails without `min_replicas` (the first acquire succeeds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_withdraws_a_grant_no_replica_acknowledged() {
    let (cluster, key, master, config) = failover_case("failover:wait");
    let lock = lock_keys(&key).lock;
    // WAIT gets half the response timeout: 1s, so a replica that lags on a loaded machine (the
    // whole suite runs at once) still acknowledges the grants that should go through.
    let patient = config.clone().response_timeout(Duration::from_secs(2));
    let a = LockClient::new(patient.min_replicas(1)).unwrap();
    // Replicated grants go through.
    a.lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let replica = cut_off_replica(&cluster, master);
    let started = Instant::now();
    match a.lock(&key).acquire().await {
        Err(LockError::Unavailable { causes, .. }) => {
            assert!(
                causes.iter().any(|c| c.kind == FailureKind::Replication),
                "{causes:?}"
            );
            eprintln!("refused after {:?}: {}", started.elapsed(), causes[0]);
        }
        Ok(_) => panic!("granted although no replica acknowledged it"),
        Err(other) => panic!("expected Unavailable, got {other}"),
    }
    // Withdrawn on the master itself.
    let master_node: &RedisServer = &cluster.nodes[cluster.index_of(master)];
    assert!(master_node.keys(&lock).is_empty());

    let cluster = fail_over_async(cluster, master, replica).await;
    // The new master has no replica left: `b` asks for none.
    let b = LockClient::new(config).unwrap();
    let only = b
        .lock(&key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(!only.is_lost());
    only.release().await.unwrap();
    drop(cluster);
}

/// The Sentinel master is killed while four tasks take and release two locks: no two holders at
/// once, and once every sentinel names the promoted replica, the tasks get their next grant
/// within `sentinel::RECHECK` (1s) + connect_timeout + response_timeout (1.5s) + the longest
/// retry backoff (1.2s before it was capped at 300 ms; kept as the bound): 3.7s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_killed_during_a_stress_run_is_followed_within_the_bound() {
    let set = Arc::new(Mutex::new(SentinelSet::start()));
    let (urls, old, new) = {
        let set = set.lock().unwrap();
        (
            set.sentinel_urls(),
            set.master().port(),
            set.replica().port(),
        )
    };
    let keys: Vec<String> = (0..2)
        .map(|i| unique_key(&format!("sentinel:{i}")))
        .collect();
    let config = LockConfig::sentinel(SentinelSet::MASTER_NAME, urls)
        .fencing(true)
        .default_ttl(Duration::from_secs(5));
    let client = LockClient::new(config).unwrap();
    let switched_ns = Arc::new(AtomicU64::new(0));
    let disturb = {
        let (set, switched_ns) = (Arc::clone(&set), Arc::clone(&switched_ns));
        move || {
            std::thread::sleep(Duration::from_millis(500));
            let mut set = set.lock().unwrap();
            set.data[0].stop();
            let took = set.wait_master_is(new, Duration::from_secs(20));
            switched_ns.store(now_ns(), Ordering::SeqCst);
            eprintln!("the sentinels all named the replica master {took:?} after the kill");
        }
    };
    let tallies = churn_during(&client, &keys, 4, Duration::from_secs(5), disturb).await;
    check_history("sentinel failover", &tallies);
    let switched = switched_ns.load(Ordering::SeqCst);
    let set = set.lock().unwrap();
    let first_after = tallies
        .iter()
        .flat_map(|t| &t.grants)
        .map(|g| g.acquired_ns)
        .filter(|&at| at > switched)
        .min()
        .unwrap_or_else(|| {
            let logs: String = set.data.iter().map(|n| n.log_tail(20)).collect();
            panic!("no grant after the switch (old master {old}, new {new})\n{logs}")
        });
    let follow = Duration::from_nanos(first_after - switched);
    eprintln!("first grant {follow:?} after the sentinels switched");
    assert!(follow < Duration::from_millis(3700), "{follow:?}");
    let new_master = &set.data[1];
    assert!(
        new_master.command_calls("evalsha") + new_master.command_calls("eval") > 0,
        "locks went to the new master"
    );
}

/// One call of [`calls_until`]: when it started and ended, whether it failed (and how), whether
/// the failure was its release's `Lost`, and whether its grant was on the node it was asked to
/// look at.
struct Call {
    started: Instant,
    ended: Instant,
    failed: Option<String>,
    lost_at_release: bool,
    on_watched: bool,
}

/// Takes and releases `key` (wait 2 s) every 20 ms until `stop` (at most 1,000 times), and
/// records every call in `calls`; a grant counts as on `watched` when that node has the key
/// while held.
async fn calls_until(
    client: LockClient,
    key: String,
    watched: String,
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
) {
    // A connection per look: the sentinels kill the promoted node's normal clients.
    let watched = redis::Client::open(watched).unwrap();
    let lock = lock_keys(&key).lock;
    for _ in 0..1000 {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let started = Instant::now();
        let (failed, lost_at_release, on_watched) = match client
            .lock(&key)
            .wait(Duration::from_secs(2))
            .acquire()
            .await
        {
            Ok(guard) => {
                // The sentinels can kill this connection too, between its connect and its
                // query: a look that was reset is taken again (a few times at most).
                let on_watched = tokio::task::block_in_place(|| {
                    let look = || -> redis::RedisResult<bool> {
                        let mut conn = watched.get_connection()?;
                        redis::cmd("EXISTS").arg(&lock).query::<bool>(&mut conn)
                    };
                    let mut last = None;
                    for _ in 0..5 {
                        match look() {
                            Ok(held) => return held,
                            Err(e) => last = Some(e),
                        }
                    }
                    panic!("five looks at the watched node failed, the last: {last:?}");
                });
                let released = guard.release().await;
                let lost = matches!(released, Err(LockError::Lost { .. }));
                (
                    released.err().map(|e| format!("release: {e}")),
                    lost,
                    on_watched,
                )
            }
            Err(e) => (Some(format!("acquire: {e}")), false, false),
        };
        calls.lock().unwrap().push(Call {
            started,
            ended: Instant::now(),
            failed,
            lost_at_release,
            on_watched,
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `SENTINEL FAILOVER`: the old master keeps answering (as a master, until the sentinels
/// reconfigure it), so no acquire fails: a caller that takes and releases the lock every 20 ms
/// from before the failover until after it sees no acquire error and no error but one: a grant
/// the deposed master made after the replica was promoted is not on the new master (replication
/// is asynchronous, and the old master drops its data when it becomes a replica), so its release
/// is `Lost`, truthfully. Such a call is allowed only when its grant was not on the new master;
/// a lock held on the new master and reported lost fails the test. The client still moves to
/// the new master within `sentinel::RECHECK` (1s) of the sentinels naming it, plus one request
/// timeout (1.5 s) and slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_forced_failover_is_followed_while_the_old_master_still_answers() {
    let set = SentinelSet::start();
    let new = set.replica().port();
    let client = LockClient::new(LockConfig::sentinel(
        SentinelSet::MASTER_NAME,
        set.sentinel_urls(),
    ))
    .unwrap();
    let key = unique_key("sentinel:forced");
    client
        .lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let caller = tokio::spawn(calls_until(
        client.clone(),
        key.clone(),
        set.replica().url(),
        Arc::clone(&stop),
        Arc::clone(&calls),
    ));
    let failing_over = Instant::now();
    set.failover();
    tokio::task::block_in_place(|| set.wait_master_is(new, Duration::from_secs(20)));
    let switched = Instant::now();
    // sentinel::RECHECK (1 s) + one request timeout (1.5 s, the defaults) + slack.
    let bound = Duration::from_millis(2500) + SCHEDULING_SLACK;
    let on_new = eventually(bound, || {
        calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.started >= switched && c.on_watched && c.failed.is_none())
    })
    .await;
    let followed = switched.elapsed();
    stop.store(true, Ordering::SeqCst);
    bounded(Duration::from_secs(10), "the caller", caller)
        .await
        .unwrap();
    let calls = calls.lock().unwrap();
    let during = calls
        .iter()
        .filter(|c| c.ended >= failing_over && c.started <= switched)
        .count();
    // Lost with the deposed master: granted where the new master never had it.
    let deposed = |c: &Call| c.lost_at_release && !c.on_watched;
    let failures: Vec<&String> = calls
        .iter()
        .filter(|c| !deposed(c))
        .filter_map(|c| c.failed.as_ref())
        .collect();
    eprintln!(
        "forced failover: {} calls, {during} during the failover ({:?}), {} failed, {} lost \
         with the deposed master; a grant on the new master {followed:?} after the sentinels \
         switched ({on_new})",
        calls.len(),
        switched - failing_over,
        failures.len(),
        calls.iter().filter(|c| deposed(c)).count()
    );
    let summary: Vec<String> = calls
        .iter()
        .map(|c| {
            format!(
                "{:?}..{:?} {} {}",
                c.started.saturating_duration_since(switched),
                c.ended.saturating_duration_since(switched),
                if c.on_watched { "new" } else { "old" },
                c.failed.as_deref().unwrap_or("ok")
            )
        })
        .collect();
    assert!(
        on_new,
        "no grant on the new master within {bound:?} of the switch; calls (since the switch): \
         {summary:#?}"
    );
    assert!(
        during > 0,
        "no call ran during the failover: the check proves nothing"
    );
    assert!(
        failures.is_empty(),
        "calls failed during a forced failover: {failures:?}"
    );
    // Once a grant was on the new master the client has moved: no grant after it is the old
    // master's.
    if let Some(moved) = calls
        .iter()
        .filter(|c| c.on_watched && c.failed.is_none())
        .map(|c| c.ended)
        .min()
    {
        let late: Vec<&String> = calls
            .iter()
            .filter(|c| deposed(c) && c.started >= moved)
            .filter_map(|c| c.failed.as_ref())
            .collect();
        assert!(
            late.is_empty(),
            "granted by the deposed master after the client had moved: {late:?}"
        );
    }
}

/// A reply delayed past the lock's validity is never a success: writes on `master` (the
/// lock's) are paused (`CLIENT PAUSE WRITE`: a proxy cannot sit in front, the client finds the
/// nodes itself) for 2 s, past the 300 ms ttl, so the first attempt's reply comes after the
/// validity ran out. Its grant lands past the validity (keyspace `set`; for the impatient client
/// it may not land at all, its connection closed after a timeout). An impatient client
/// (200 ms timeouts; the pause outlasts its wait + one request timeout, so no attempt of the call
/// is answered) is `Unavailable`. A patient one (3 s timeouts: the late reply comes within them)
/// is `Unavailable`, or `Ok` only through a fresh same-token attempt made after the pause (a
/// second write of the key after the late grant, within the call's bound): never by the late
/// reply. Once the pause is over, nothing is left within the ttl + slack.
///
/// `still_master()` tells whether the topology still names `master` the key's master: checked
/// after each round, since a failover during the pause would hand the call an unpaused master,
/// whose grant is a fresh one (a write pause blocks the sentinels' hello `PUBLISH`, and with it
/// their pings behind it on the same link: a 1 s down-after fails the master over).
async fn replies_past_validity_are_never_success(
    config: &LockConfig,
    master: &RedisServer,
    key: &str,
    still_master: impl Fn() -> bool,
) {
    let ttl = Duration::from_millis(300);
    let validity = default_validity(ttl);
    let pause = Duration::from_secs(2);
    let patient = LockClient::new(
        config
            .clone()
            .connect_timeout(Duration::from_secs(3))
            .response_timeout(Duration::from_secs(3)),
    )
    .unwrap();
    let impatient = LockClient::new(
        config
            .clone()
            .connect_timeout(Duration::from_millis(200))
            .response_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    let lock = lock_keys(key).lock;
    let events = KeyEvents::watch(master, &lock);
    for (name, locks) in [("patient", &patient), ("impatient", &impatient)] {
        warm_up(locks).await;
        for wait in [Duration::ZERO, Duration::from_secs(1)] {
            let what = format!("{name} client, wait {wait:?}");
            let paused = pause_writes(master, pause);
            let result = bounded(
                pause + Duration::from_secs(7),
                &what,
                locks.lock(key).ttl(ttl).wait(wait).acquire(),
            )
            .await;
            let took = paused.elapsed();
            let () = redis::cmd("CLIENT")
                .arg("UNPAUSE")
                .query(&mut master.admin())
                .unwrap();
            assert!(
                tokio::task::block_in_place(&still_master),
                "{what}: the key's master changed during the pause, so the round proves nothing"
            );
            // The patient client's late reply comes within its timeouts, over a connection it
            // keeps: its grant lands. The impatient client's last attempt times out as the pause
            // ends, and a connection closed after a timeout takes the write the pause held with
            // it, which races the unpause: its grant may never land (once in 17 CI runs nothing
            // of the round reached the key). The call must be `Unavailable` either way.
            let landed = if name == "patient" {
                Some(
                    events
                        .wait_first_after(&lock, &["set"], paused, Duration::from_secs(2), &what)
                        .await,
                )
            } else {
                eventually(Duration::from_secs(2), || {
                    events.first_after(&lock, &["set"], paused).is_some()
                })
                .await;
                events.first_after(&lock, &["set"], paused)
            };
            let landed_at = landed.as_ref().map(|l| l.at - paused);
            if let Some(at) = landed_at {
                assert!(
                    at >= validity,
                    "{what}: the grant landed {at:?} into the pause, within the validity"
                );
            }
            let outcome = match result {
                Err(LockError::Unavailable { .. }) => "Unavailable".to_owned(),
                Ok(guard) if name == "patient" => {
                    let landed = landed.expect("the patient client's grant landed");
                    // The late grant's `SET .. PX` notifies `set` and `expire`; a second
                    // `expire` is the same-token retry's PEXPIRE.
                    // (Heard a moment after the reply that made the call return.)
                    let rewritten = eventually(SCHEDULING_SLACK, || {
                        events
                            .of(&lock)
                            .iter()
                            .filter(|e| e.event == "expire" && e.at >= landed.at)
                            .count()
                            >= 2
                    })
                    .await;
                    assert!(
                        rewritten,
                        "{what}: Ok from the late reply, with no later attempt: {:?}",
                        events.of(&lock)
                    );
                    assert!(!guard.is_lost(), "{what}");
                    guard.release().await.unwrap();
                    "Ok, by a fresh attempt after the pause".to_owned()
                }
                other => panic!(
                    "{what}: a reply past the validity: expected Unavailable, got {:?}",
                    other.map(drop)
                ),
            };
            eprintln!(
                "writes paused {pause:?}, ttl {ttl:?}, {what}: {outcome} after {took:?}; the late \
                 grant landed {landed_at:?} into the pause"
            );
            wait_until_async(
                ttl + SCHEDULING_SLACK,
                &format!("{what}: nothing left"),
                || master.keys(&lock).is_empty(),
            )
            .await;
        }
    }
}

/// [`replies_past_validity_are_never_success`] on a Redis Cluster (the master of the key's slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replies_past_validity_are_never_success() {
    let cluster = RedisCluster::start();
    let key = unique_key("cluster:past-validity");
    let lock = lock_keys(&key).lock;
    let master = cluster.master_of(&lock);
    replies_past_validity_are_never_success(
        &LockConfig::cluster(cluster.urls()),
        master,
        &key,
        || cluster.master_of(&lock).port() == master.port(),
    )
    .await;
}

/// [`replies_past_validity_are_never_success`] behind Sentinel (its master). The sentinels'
/// down-after outlasts every pause with room to spare: with the harness's 1 s, four 2 s write
/// pauses in a row failed the master over (by hand, Redis 7.0), and the impatient client was
/// then granted by the new master (a CI failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_replies_past_validity_are_never_success() {
    let set = SentinelSet::start_with(SentinelOptions {
        down_after: Some(Duration::from_secs(10)),
        ..SentinelOptions::default()
    });
    let key = unique_key("sentinel:past-validity");
    let config = LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls());
    let named = set.master_port();
    replies_past_validity_are_never_success(&config, set.master(), &key, || {
        set.master_port() == named
    })
    .await;
}

/// Waits (bounded by a replication round trip on a loaded machine) until `node`'s copy of the fence
/// counter `key` has counted `fence`.
async fn await_fence_on(node: &RedisServer, key: &str, fence: u64) {
    let mut admin = node.admin();
    // A cluster replica answers reads once told (elsewhere this is an error, and not needed).
    let _ = redis::cmd("READONLY").query::<()>(&mut admin);
    lock_tests::wait_until_async(Duration::from_secs(5), "the replica has the fence", || {
        redis::cmd("GET")
            .arg(key)
            .query::<Option<u64>>(&mut admin)
            .unwrap()
            >= Some(fence)
    })
    .await;
}

/// Sentinel: the master dies after a grant its replica missed, the replica is promoted, and the
/// next grant there must still carry a larger fencing token. The replica's counter is one grant
/// behind (put back here, on the replica alone, to its value before the grant), so counting on
/// from it gave the lost grant's token again; the server clock floor of every grant makes it
/// larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_fencing_tokens_grow_across_a_failover_that_lost_a_grant() {
    let mut set = SentinelSet::start();
    let (old, new) = (set.master().port(), set.replica().port());
    let locks = LockClient::new(
        LockConfig::sentinel(SentinelSet::MASTER_NAME, set.sentinel_urls())
            .fencing(true)
            .connect_timeout(Duration::from_millis(200))
            .response_timeout(Duration::from_millis(500)),
    )
    .unwrap();
    let key = unique_key("sentinel:fence-failover");
    let grant = |locks: &LockClient| {
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            let guard = locks
                .lock(&key)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            let fence = guard.fencing_token().unwrap();
            guard.release().await.unwrap();
            fence
        }
    };
    let before = grant(&locks).await;
    let counter = lock_keys(&key).fence;
    await_fence_on(set.replica(), &counter, before).await;
    let lost = grant(&locks).await;
    await_fence_on(set.replica(), &counter, lost).await;
    // The replica misses the second grant: its counter back to what it was before.
    let replica = set.replica();
    let mut admin = replica.admin();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-read-only")
        .arg("no")
        .query(&mut admin)
        .unwrap();
    let () = redis::cmd("SET")
        .arg(lock_keys(&key).fence)
        .arg(before)
        .query(&mut admin)
        .unwrap();
    let old_index = set.data.iter().position(|n| n.port() == old).unwrap();
    set.data[old_index].stop();
    let took = set.wait_master_is(new, Duration::from_secs(20));
    eprintln!("the replica was promoted {took:?} after the kill");
    let after = grant(&locks).await;
    eprintln!("tokens: {before}, {lost} (lost by the failover), then {after}");
    assert!(
        after > lost,
        "the token repeated or went back across the failover: {after} after {lost}"
    );
}
