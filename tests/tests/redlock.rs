//! Redlock mode (five independent masters, quorum three) under node failures: a minority down or
//! frozen, latency beyond validity, restarts, many racing clients, loss by a majority, contention
//! versus failure, and several processes through `#[distributed_lock]`. What every backend does
//! (renewal, cancellation, panics, hand-off, fencing) is the behaviour suite, redlock_behaviour.rs.
//!
//! Latencies observed are printed with `eprintln!` (run with `--nocapture` to see them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::layout::redlock_gate;
use lock_runtime::{FailureKind, Lock, LockClient, LockConfig, LockError, LockGuard};
use lock_tests::{
    FaultProxy, KeyEvents, Monitor, QUICK_REQUEST, RedisMasters, RedisServer, SCHEDULING_SLACK,
    Sent, Worker, assert_lost_at_the_deadline, await_waiter, bounded, default_validity, finish_all,
    history, key_exists, lock_keys, ms, unique_key, wait_until_async, warm_up,
};

const NODES: usize = 5;

/// Short timeouts so a dead or frozen node is given up on quickly: those of a
/// [`quick_client`](lock_tests::quick_client), one request [`QUICK_REQUEST`].
fn config(urls: impl IntoIterator<Item = String>) -> LockConfig {
    LockConfig::redlock(urls)
        .connect_timeout(ms(200))
        .response_timeout(ms(200))
}

/// A Redlock client of `urls` with [`config`]'s short timeouts.
fn redlock_client(urls: impl IntoIterator<Item = String>) -> LockClient {
    LockClient::new(config(urls)).expect("valid redlock config")
}

/// Every node of `masters` but the one at `index`.
fn all_but(masters: &RedisMasters, index: usize) -> Vec<&RedisServer> {
    (0..masters.nodes.len())
        .filter(|i| *i != index)
        .map(|i| &masters.nodes[i])
        .collect()
}

/// Starts `lock.acquire()` as a task: a waiter.
fn start_acquire(lock: Lock) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    tokio::spawn(async move { lock.acquire().await })
}

/// The guard a waiter from [`start_acquire`] got within 5 s; `why` says what should have let it
/// in.
async fn granted_soon(
    waiting: tokio::task::JoinHandle<Result<LockGuard, LockError>>,
    why: &str,
) -> LockGuard {
    bounded(Duration::from_secs(5), "the waiter's acquire", waiting)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{why}: {e:?}"))
}

/// The connect and response timeouts of a [`patient_client`].
const PATIENT: Duration = Duration::from_secs(1);

/// Long timeouts ([`PATIENT`]): an answer that waited for a frozen node would show.
fn patient_client(urls: impl IntoIterator<Item = String>) -> LockClient {
    LockClient::new(
        LockConfig::redlock(urls)
            .connect_timeout(PATIENT)
            .response_timeout(PATIENT),
    )
    .expect("valid redlock config")
}

/// `holder` takes `key` for 30 s; returns once every node has it.
async fn hold_on_all(holder: &LockClient, masters: &RedisMasters, key: &str) -> LockGuard {
    let guard = holder
        .lock(key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    wait_on_all(&masters.nodes.iter().collect::<Vec<_>>(), key).await;
    guard
}

/// The Redis keys of lock `key` on `node` (the fence counter is the server's, not the lock's).
fn keys_on(node: &RedisServer, key: &str) -> Vec<String> {
    node.keys(&format!("*{key}*"))
}

fn holds(node: &RedisServer, key: &str) -> bool {
    !node.keys(&lock_keys(key).lock).is_empty()
}

fn holders(nodes: &[&RedisServer], key: &str) -> usize {
    nodes.iter().filter(|n| holds(n, key)).count()
}

/// A won acquire returns at the quorum; the slower nodes get the lock a moment later.
async fn wait_on_all(nodes: &[&RedisServer], key: &str) {
    let took = wait_until_async(Duration::from_secs(2), "the lock on every node", || {
        holders(nodes, key) == nodes.len()
    })
    .await;
    eprintln!("redlock: lock on every node {took:?} after the acquire returned");
}

fn delete_lock(node: &RedisServer, key: &str) {
    let deleted: i64 = redis::cmd("DEL")
        .arg(lock_keys(key).lock)
        .query(&mut node.admin())
        .unwrap();
    assert_eq!(deleted, 1, "the lock key was not on port {}", node.port());
}

/// Sets the lock key of `key` on `node` to `value` for `ttl`, as another client's grant would.
fn set_lock(node: &RedisServer, key: &str, value: &str, ttl: Duration) {
    let () = redis::cmd("SET")
        .arg(lock_keys(key).lock)
        .arg(value)
        .arg("PX")
        .arg(u64::try_from(ttl.as_millis()).unwrap())
        .query(&mut node.admin())
        .unwrap();
}

/// Waits until no node has any key of `key`; returns how long that took.
async fn assert_no_keys_left(nodes: &[&RedisServer], key: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let left: Vec<String> = nodes
            .iter()
            .enumerate()
            .flat_map(|(i, node)| {
                keys_on(node, key).into_iter().map(move |k| {
                    let pttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut node.admin()).unwrap();
                    format!("node {i}: {k}, pttl {pttl} ms")
                })
            })
            .collect();
        if left.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "lock keys left on the nodes after {within:?}: {left:?}"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

fn assert_unavailable(result: Result<LockGuard, LockError>, causes: usize) -> Vec<String> {
    match result {
        Err(LockError::Unavailable { causes: c, .. }) => {
            assert_eq!(c.len(), causes, "causes: {c:?}");
            c.into_iter().map(|f| f.node).collect()
        }
        other => panic!("expected Unavailable with {causes} causes, got {other:?}"),
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn node_name(node: &RedisServer) -> String {
    format!("127.0.0.1:{}", node.port())
}

// --- 1. A minority down: still works. A majority down: Unavailable, fast, and nothing left. -----

#[tokio::test]
async fn two_of_five_down_still_acquires_and_releases() {
    let mut masters = RedisMasters::start(NODES);
    let client = redlock_client(masters.urls());
    masters.nodes[3].stop();
    masters.nodes[4].stop();
    let survivors: Vec<&RedisServer> = masters.nodes[..3].iter().collect();
    let key = unique_key("redlock:minority-down");

    for round in 0..3 {
        let start = Instant::now();
        let guard = client
            .lock(&key)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .expect("a quorum of three is up");
        let acquired = start.elapsed();
        assert_eq!(guard.fencing_token(), None, "no fencing unless asked");
        wait_on_all(&survivors, &key).await;
        let start = Instant::now();
        guard.release().await.expect("released on the quorum");
        let released = start.elapsed();
        // ttl 30s: only the release can clear these keys this fast.
        let gone = assert_no_keys_left(&survivors, &key, Duration::from_secs(2)).await;
        eprintln!(
            "redlock 2/5 down, round {round}: acquire {acquired:?}, release {released:?}, keys gone {gone:?} after"
        );
    }
}

#[tokio::test]
async fn three_of_five_down_is_unavailable_within_a_second() {
    let mut masters = RedisMasters::start(NODES);
    let client = redlock_client(masters.urls());
    let mut stopped: Vec<String> = masters.nodes[2..].iter().map(node_name).collect();
    stopped.sort();
    for node in &mut masters.nodes[2..] {
        node.stop();
    }
    let survivors: Vec<&RedisServer> = masters.nodes[..2].iter().collect();
    let key = unique_key("redlock:majority-down");

    for wait in [Duration::ZERO, ms(300)] {
        let start = Instant::now();
        let result = client
            .lock(&key)
            .ttl(Duration::from_secs(30))
            .wait(wait)
            .acquire()
            .await;
        let elapsed = start.elapsed();
        let mut failed = assert_unavailable(result, 3);
        failed.sort();
        assert_eq!(failed, stopped, "the causes name the stopped nodes");
        eprintln!("redlock 3/5 down (wait {wait:?}): Unavailable after {elapsed:?}");
        assert!(
            elapsed < wait + Duration::from_secs(1),
            "Unavailable took {elapsed:?} (wait {wait:?})"
        );
        // ttl 30s: only the release of the failed attempt can clear these keys.
        let gone = assert_no_keys_left(&survivors, &key, Duration::from_secs(2)).await;
        eprintln!("redlock 3/5 down: survivors clean {gone:?} after the error");
    }
}

// --- 2. A frozen node is never waited for. ------------------------------------------------------

/// Takes and releases `key` `n` times in a row (nobody else asks for it): how long each pair
/// took.
async fn acquire_release_pairs(client: &LockClient, key: &str, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for pair in 0..n {
        let start = Instant::now();
        let guard = client
            .lock(key)
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "pair {pair}: acquire answered {e:?} after {:?}",
                    start.elapsed()
                )
            });
        guard.release().await.unwrap_or_else(|e| {
            panic!(
                "pair {pair}: release answered {e:?} after {:?}",
                start.elapsed()
            )
        });
        samples.push(start.elapsed());
    }
    samples
}

/// With one node of five frozen, acquire and release decide from the other four and never wait
/// for it. The frozen node's part of either ends only at its response timeout ([`PATIENT`]), so
/// a pair that waited for it took at least that long: every pair must take less. The node was
/// asked all the same: every pair's acquire runs there once it thaws.
#[tokio::test]
async fn one_frozen_node_of_five_is_never_waited_for() {
    const PAIRS: u64 = 30;
    let masters = RedisMasters::start(NODES);
    let client = patient_client(masters.urls());
    let frozen = &masters.nodes[0];
    // Connections up everywhere; the warm-up's release is its last request on the node.
    warm_up(&client).await;
    wait_until_async(
        PATIENT,
        "the warm-up released on the node to freeze",
        || evalsha_calls(frozen) > 0,
    )
    .await;
    // Each acquire asks a node with one `SET NX` (granted or not); a release sends none.
    let asked = frozen.command_calls("set");
    let key = unique_key("redlock:frozen");

    frozen.freeze();
    let took = acquire_release_pairs(&client, &key, PAIRS as usize).await;
    frozen.thaw();

    wait_until_async(
        PATIENT,
        "every pair's acquire run on the thawed node",
        || frozen.command_calls("set") >= asked + PAIRS,
    )
    .await;
    let slowest = *took.iter().max().unwrap();
    eprintln!(
        "redlock acquire+release, one of five frozen: median {:?}, slowest {slowest:?} of {PAIRS}",
        median(took)
    );
    assert!(
        slowest < PATIENT,
        "a pair took {slowest:?}: it waited for the frozen node (response timeout {PATIENT:?})"
    );
}

// --- 3. Latency beyond validity never yields a lock. ---------------------------------------------

#[tokio::test]
async fn latency_beyond_validity_never_reports_success() {
    let masters = RedisMasters::start(NODES);
    let proxies: Vec<FaultProxy> = masters.nodes[..3]
        .iter()
        .map(|n| FaultProxy::start(n.port()))
        .collect();
    let urls: Vec<String> = proxies
        .iter()
        .map(FaultProxy::url)
        .chain(masters.nodes[3..].iter().map(RedisServer::url))
        .collect();
    // (a) The slow nodes answer within the response timeout, but after the lock's validity.
    let patient = LockClient::new(
        LockConfig::redlock(urls.clone())
            .connect_timeout(Duration::from_secs(3))
            .response_timeout(Duration::from_secs(3)),
    )
    .unwrap();
    // (b) The slow nodes time out.
    let impatient = redlock_client(urls);
    let all: Vec<&RedisServer> = masters.nodes.iter().collect();
    let key = unique_key("redlock:slow");
    let ttl = ms(300);

    // Connect every node while the links are fast.
    for c in [&patient, &impatient] {
        let warm = unique_key("redlock:slow-warmup");
        c.lock(&warm)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // 200ms each way: a round trip to the slow majority takes longer than the 300ms ttl.
    for p in &proxies {
        p.set_delay(ms(200));
    }
    for (name, c) in [("patient", &patient), ("impatient", &impatient)] {
        for wait in [Duration::ZERO, Duration::from_secs(1)] {
            let start = Instant::now();
            let result = c.lock(&key).ttl(ttl).wait(wait).acquire().await;
            let elapsed = start.elapsed();
            eprintln!(
                "redlock 3/5 nodes +400ms RTT, ttl {ttl:?}, {name} client, wait {wait:?}: {} after {elapsed:?}",
                match &result {
                    Ok(_) => "Ok".to_owned(),
                    Err(e) => e.to_string(),
                }
            );
            match result {
                Err(LockError::Unavailable { causes, .. }) => {
                    assert!(
                        causes.iter().all(|c| c.kind == FailureKind::Timeout),
                        "{causes:?}"
                    );
                }
                other => {
                    panic!("{name} client, wait {wait:?}: expected Unavailable, got {other:?}")
                }
            }
        }
    }
    for p in &proxies {
        p.set_delay(Duration::ZERO);
    }
    let gone = assert_no_keys_left(&all, &key, Duration::from_secs(5)).await;
    eprintln!("redlock slow majority: all nodes clean {gone:?} after the delay was removed");
}

// --- 4. Restarts. -----------------------------------------------------------------------------

#[tokio::test]
async fn node_restarted_empty_while_held_keeps_the_lock() {
    let mut masters = RedisMasters::start(NODES);
    let client = redlock_client(masters.urls());
    let key = unique_key("redlock:restart-held");

    let start = Instant::now();
    let guard = client.lock(&key).ttl(ms(1000)).acquire().await.unwrap();
    wait_on_all(&masters.nodes.iter().collect::<Vec<_>>(), &key).await;
    masters.nodes[0].restart();
    assert!(!holds(&masters.nodes[0], &key), "restarted without data");
    let remaining = Duration::from_secs(3).saturating_sub(start.elapsed());
    let lost = tokio::time::timeout(remaining, guard.lost()).await;
    assert!(lost.is_err(), "lost while a quorum of four still held it");
    assert!(!guard.is_lost());
    let others: Vec<&RedisServer> = masters.nodes[1..].iter().collect();
    assert_eq!(holders(&others, &key), 4, "renewed on the other four");
    guard.release().await.expect("still ours at release");
    let all: Vec<&RedisServer> = masters.nodes.iter().collect();
    assert_no_keys_left(&all, &key, Duration::from_secs(2)).await;
}

/// The documented limit of Redlock: a node that restarts without the keys it had (no persistence,
/// or an AOF not fsynced before the crash) can hand a held lock to a second client when the first
/// holds it on exactly a quorum. Redlock is only safe if a crashed node stays down for at least
/// the longest TTL in use before rejoining (delayed restart), or persists every write
/// (`appendonly yes` with `appendfsync always`). This test shows the violation happening; the
/// first holder only finds out at its next renewal.
#[tokio::test]
async fn restart_without_persistence_breaks_safety_documented_limit() {
    let mut masters = RedisMasters::start(NODES);
    let first = redlock_client(masters.urls());
    let key = unique_key("redlock:restart-unsafe");
    let ttl = Duration::from_secs(15);

    let held = first.lock(&key).ttl(ttl).acquire().await.unwrap();
    let acquired_at = Instant::now();
    // The lock lives on exactly A, B and C (D and E lost it, say they were down when it was
    // taken: deleting it there is that, without racing the late grant a node that comes back
    // within the request's timeout still receives).
    wait_on_all(&masters.nodes.iter().collect::<Vec<_>>(), &key).await;
    delete_lock(&masters.nodes[3], &key);
    delete_lock(&masters.nodes[4], &key);
    // A crashes and comes back at once, without its data: the lock is now on B and C only.
    masters.nodes[0].restart();

    // A client that connects now (one connected before would first have to notice that A
    // restarted under it: a request on a dead connection fails, and 2 held + 1 failed is
    // `Contended`, not the unsafe grant this test shows).
    let second = redlock_client(masters.urls());
    let stolen = second
        .lock(&key)
        .ttl(ttl)
        .acquire()
        .await
        .expect("A, D and E grant the lock to a second client");
    let overlap_at = acquired_at.elapsed();
    assert!(
        !held.is_lost(),
        "the first holder already knows (its renewal is due only at ttl/3)"
    );
    eprintln!(
        "redlock restart limit: two holders at once, {overlap_at:?} after the first acquired"
    );

    // Its next renewal finds the lock on two nodes out of five: lost.
    let detect = Instant::now();
    bounded(
        ttl,
        "the first holder learns it lost the lock within one ttl",
        held.lost(),
    )
    .await;
    eprintln!(
        "redlock restart limit: first holder told 'lost' {:?} later",
        detect.elapsed()
    );
    assert!(!stolen.is_lost());
    assert!(matches!(held.release().await, Err(LockError::Lost { .. })));
    stolen.release().await.unwrap();
}

// --- 5. Many clients racing: mutual exclusion and progress. ----------------------------------

/// Each round, sixteen clients start at once (a barrier) and try for up to `ROUND_WAIT`. The
/// first winner ends the round once it released: the others stop waiting (their acquire futures
/// are dropped). Anyone who gets the lock checks that nobody else is inside. A round nobody
/// wins within `ROUND_WAIT` means livelock (split votes forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_never_overlap_and_every_round_has_a_winner() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 200;
    const ROUND_WAIT: Duration = Duration::from_secs(5);
    const TTL: Duration = Duration::from_secs(5);
    let masters = RedisMasters::start(NODES);
    let key = Arc::new(unique_key("redlock:race"));
    let clients: Vec<LockClient> = (0..CLIENTS)
        .map(|_| {
            LockClient::new(
                LockConfig::redlock(masters.urls())
                    .retry_delay(ms(10))
                    .connect_timeout(Duration::from_secs(2))
                    .response_timeout(Duration::from_secs(2)),
            )
            .unwrap()
        })
        .collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    // The number of rounds won so far.
    let (won_tx, won_rx) = tokio::sync::watch::channel(0usize);
    let won_tx = Arc::new(won_tx);

    let start = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let (key, inside, overlaps, barrier, won_tx, mut won_rx) = (
                Arc::clone(&key),
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&barrier),
                Arc::clone(&won_tx),
                won_rx.clone(),
            );
            tokio::spawn(async move {
                // Per round: how long this client took to get the lock, if it did.
                let mut rounds = Vec::with_capacity(ROUNDS);
                for round in 0..ROUNDS {
                    barrier.wait().await;
                    let begin = Instant::now();
                    let attempt = client
                        .lock(key.as_str())
                        .ttl(TTL)
                        .wait(ROUND_WAIT)
                        .acquire();
                    let result = tokio::select! {
                        result = attempt => result,
                        _ = won_rx.wait_for(|won| *won > round) => {
                            rounds.push(None);
                            continue;
                        }
                    };
                    match result {
                        Ok(guard) => {
                            let took = begin.elapsed();
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            // Stay inside across a few scheduling points.
                            for _ in 0..3 {
                                tokio::task::yield_now().await;
                            }
                            inside.fetch_sub(1, Ordering::SeqCst);
                            guard.release().await.expect("release while held");
                            won_tx.send_modify(|won| *won = (*won).max(round + 1));
                            rounds.push(Some(took));
                        }
                        Err(LockError::Contended { .. }) => rounds.push(None),
                        Err(other) => panic!("only contention is expected here: {other}"),
                    }
                }
                rounds
            })
        })
        .collect();
    let mut per_client = Vec::new();
    for task in tasks {
        per_client.push(task.await.unwrap());
    }
    let elapsed = start.elapsed();

    let winners: Vec<usize> = (0..ROUNDS)
        .map(|r| per_client.iter().filter(|c| c[r].is_some()).count())
        .collect();
    let mut first_grant: Vec<Duration> = (0..ROUNDS)
        .filter_map(|r| per_client.iter().filter_map(|c| c[r]).min())
        .collect();
    first_grant.sort();
    eprintln!(
        "redlock race: {CLIENTS} clients x {ROUNDS} rounds in {elapsed:?}; winners per round {}..={}; first grant per round: median {:?}, p99 {:?}, max {:?}",
        winners.iter().min().unwrap(),
        winners.iter().max().unwrap(),
        first_grant.get(first_grant.len() / 2),
        first_grant.get(first_grant.len() * 99 / 100),
        first_grant.last(),
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let empty: Vec<usize> = (0..ROUNDS).filter(|r| winners[*r] == 0).collect();
    assert!(empty.is_empty(), "rounds nobody won: {empty:?}");
    let all: Vec<&RedisServer> = masters.nodes.iter().collect();
    // What a cleanup could not delete (a grant that landed on a node after its attempt's
    // withdrawal gave up there) expires by its ttl, counted from a request the run sent before
    // its tasks ended.
    assert_no_keys_left(&all, &key, TTL + SCHEDULING_SLACK).await;
}

// --- 6. Loss by a majority or a minority; one node behaves like single-node mode. ------------

#[tokio::test]
async fn deleted_on_a_majority_is_lost_within_ttl() {
    let masters = RedisMasters::start(NODES);
    let client = redlock_client(masters.urls());
    let key = unique_key("redlock:loss-majority");
    let ttl = ms(1000);
    let guard = client.lock(&key).ttl(ttl).acquire().await.unwrap();
    wait_on_all(&masters.nodes.iter().collect::<Vec<_>>(), &key).await;
    for node in &masters.nodes[..3] {
        delete_lock(node, &key);
    }
    let start = Instant::now();
    bounded(
        ttl + Duration::from_secs(1),
        "lost() resolves once a quorum says 'not yours'",
        guard.lost(),
    )
    .await;
    eprintln!(
        "redlock loss (deleted on 3/5, ttl {ttl:?}): detected after {:?}",
        start.elapsed()
    );
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test]
async fn deleted_on_a_minority_is_not_lost() {
    let masters = RedisMasters::start(NODES);
    let client = redlock_client(masters.urls());
    let key = unique_key("redlock:loss-minority");
    let guard = client.lock(&key).ttl(ms(1000)).acquire().await.unwrap();
    wait_on_all(&masters.nodes.iter().collect::<Vec<_>>(), &key).await;
    for node in &masters.nodes[..2] {
        delete_lock(node, &key);
    }
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await;
    assert!(lost.is_err(), "lost although three of five still held it");
    let all: Vec<&RedisServer> = masters.nodes.iter().collect();
    assert!(holders(&all, &key) >= 3);
    guard.release().await.expect("still ours on a quorum");
    assert_no_keys_left(&all, &key, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn one_node_redlock_behaves_like_single_node() {
    let server = RedisServer::start();
    let first = redlock_client([server.url()]);
    let second = redlock_client([server.url()]);
    let key = unique_key("redlock:one-node");

    let guard = first.lock(&key).fencing(true).acquire().await.unwrap();
    let fence = guard.fencing_token().expect("single node: fencing token");
    let keys = lock_keys(&key);
    assert_eq!(keys_on(&server, &key), vec![keys.lock]);
    assert!(key_exists(&server, &keys.fence));
    assert!(matches!(
        second.lock(&key).acquire().await,
        Err(LockError::Contended { .. })
    ));
    guard.release().await.unwrap();
    let guard = second.lock(&key).fencing(true).acquire().await.unwrap();
    assert!(guard.fencing_token().expect("fencing token") > fence);
    guard.release().await.unwrap();
}

/// Three of five Redlock nodes frozen while held: no quorum confirms a renewal, so the holder is
/// told `Lost` at its validity deadline, ttl - drift (1 s - 12 ms) after its acquire was sent: not
/// before, and not later than that deadline (counted from when the grant returned) + scheduling
/// slack (the renewal driver's timer fires at the deadline). Another acquire is `Unavailable`
/// within wait + one request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_majority_frozen_loses_the_lock_and_is_unavailable() {
    let cluster = RedisMasters::start(5);
    let holder = redlock_client(cluster.urls());
    let other = redlock_client(cluster.urls());
    let key = unique_key("table:redlock-majority");
    let ttl = Duration::from_secs(1);
    let validity = default_validity(ttl);
    let started = Instant::now();
    let guard = holder.lock(&key).ttl(ttl).acquire().await.unwrap();
    let granted = Instant::now();
    for node in &cluster.nodes[..3] {
        node.freeze();
    }
    let frozen = Instant::now();
    bounded(
        validity + SCHEDULING_SLACK + Duration::from_secs(1),
        "lost()",
        guard.lost(),
    )
    .await;
    let lost = Instant::now();
    let wait = ms(300);
    let asked = Instant::now();
    let result = other.lock(&key).ttl(ttl).wait(wait).acquire().await;
    let took = asked.elapsed();
    for node in &cluster.nodes[..3] {
        node.thaw();
    }
    eprintln!(
        "3 of 5 frozen ({:?} after the grant): holder lost {:?} after the acquire was called \
         (validity {validity:?}); acquire {:?} after {took:?}",
        frozen - granted,
        lost - started,
        result.as_ref().map(drop)
    );
    assert_lost_at_the_deadline(started, granted, lost, validity);
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(
        took <= wait + QUICK_REQUEST + SCHEDULING_SLACK,
        "answered after {took:?}"
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

// --- 7. Contention is never reported as failure, nor failure as contention. -------------------

#[tokio::test]
async fn held_key_is_contended_never_unavailable() {
    let mut masters = RedisMasters::start(NODES);
    let holder = redlock_client(masters.urls());
    // Long timeouts: a contended answer that waited for the frozen nodes would show.
    let other = patient_client(masters.urls());
    let key = unique_key("redlock:contended");
    let guard = hold_on_all(&holder, &masters, &key).await;

    // (Healthy nodes answer Contended: the behaviour suite, redlock_behaviour.rs.)
    let contended = |result: Result<LockGuard, LockError>, what: &str| match result {
        Err(LockError::Contended { waited, .. }) => waited,
        other => panic!("{what}: expected Contended, got {other:?}"),
    };
    // Two nodes frozen: the three others answer "held" at once, no waiting for the frozen ones.
    masters.nodes[3].freeze();
    masters.nodes[4].freeze();
    let start = Instant::now();
    contended(other.lock(&key).acquire().await, "two of five frozen");
    let elapsed = start.elapsed();
    eprintln!("redlock contended, 2/5 frozen: answered after {elapsed:?}");
    assert!(
        elapsed < ms(500),
        "waited {elapsed:?} for frozen nodes (response timeout 1s)"
    );
    masters.nodes[3].thaw();
    masters.nodes[4].thaw();
    // Two nodes down: the three others still say "held".
    masters.nodes[3].stop();
    masters.nodes[4].stop();
    contended(other.lock(&key).acquire().await, "two of five down");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn three_nodes_down_is_unavailable_never_contended() {
    let masters = RedisMasters::start(NODES);
    let holder = redlock_client(masters.urls());
    let other = redlock_client(masters.urls());
    let free_key = unique_key("redlock:down-free");
    let held_key = unique_key("redlock:down-held");
    // Connect every node first, so the frozen ones time out rather than fail to connect.
    other
        .lock(&free_key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let _held = holder
        .lock(&held_key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    wait_on_all(&masters.nodes.iter().collect::<Vec<_>>(), &held_key).await;

    // Frozen rather than stopped: the two live nodes answer first, the others only time out.
    for node in &masters.nodes[2..] {
        node.freeze();
    }
    let mut frozen: Vec<String> = masters.nodes[2..].iter().map(node_name).collect();
    frozen.sort();
    for key in [&free_key, &held_key] {
        for wait in [Duration::ZERO, ms(300)] {
            let start = Instant::now();
            let result = other.lock(key).wait(wait).acquire().await;
            eprintln!(
                "redlock 3/5 frozen (wait {wait:?}, {}): {:?} after {:?}",
                if key == &held_key {
                    "held elsewhere"
                } else {
                    "free"
                },
                result.as_ref().map(|_| ()),
                start.elapsed()
            );
            let mut failed = assert_unavailable(result, 3);
            failed.sort();
            assert_eq!(failed, frozen);
        }
    }
    for node in &masters.nodes[2..] {
        node.thaw();
    }
}

// --- 8. Several processes through the attribute. --------------------------------------------

#[tokio::test]
async fn six_processes_through_the_attribute_count_exactly() {
    const PROCESSES: usize = 6;
    const ITERATIONS: u64 = 60;
    let masters = RedisMasters::start(NODES);
    let data = RedisServer::start();
    let urls = masters.urls().join(",");
    let lock_key = unique_key("redlock:processes");
    let prefix = unique_key("redlock-data");
    let data_url = data.url();
    let iterations = ITERATIONS.to_string();

    let start = Instant::now();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|_| {
            Worker::spawn(
                env!("CARGO_BIN_EXE_redlock_worker"),
                &[&urls, &data_url, &lock_key, &prefix, &iterations],
            )
        })
        .collect();
    let mut violations = 0;
    let mut grants = Vec::new();
    for out in finish_all(&mut workers, Duration::from_secs(120)) {
        out.assert_success("redlock_worker");
        let (v, lost) = history::summary(&out.stdout);
        violations += v;
        assert_eq!(lost, 0, "a worker lost its lock: {:?}", out.stdout.last());
        grants.extend(history::grants(&out.stdout));
    }
    assert_eq!(grants.len(), PROCESSES * ITERATIONS as usize);
    // No two grants at once, fencing tokens (on in the workers) growing in grant order.
    if let Err(violation) = history::check(&grants) {
        panic!("{violation}");
    }
    let elapsed = start.elapsed();
    let counter: u64 = redis::cmd("GET")
        .arg(format!("{prefix}:counter"))
        .query(&mut data.admin())
        .unwrap();
    eprintln!(
        "redlock {PROCESSES} processes x {ITERATIONS} increments via #[distributed_lock]: {elapsed:?} ({:?} per critical section)",
        elapsed / (PROCESSES as u32 * ITERATIONS as u32)
    );
    assert_eq!(violations, 0, "two processes were inside at once");
    assert_eq!(counter, PROCESSES as u64 * ITERATIONS);
    // The last release returned once a quorum confirmed it; the other nodes' releases may have
    // died with the process, so their keys expire by the workers' ttl (2s). (The fencing
    // counters stay, as they must.)
    let all: Vec<&RedisServer> = masters.nodes.iter().collect();
    let clean = NODES - holders(&all, &lock_key);
    assert!(clean >= 3, "released on only {clean} nodes");
    let gone = wait_until_async(
        Duration::from_secs(3),
        "the lock gone from every node",
        || holders(&all, &lock_key) == 0,
    )
    .await;
    eprintln!("redlock processes: {clean}/5 nodes clean at exit, all {gone:?} later");
}

/// With fencing turned on, Redlock tokens grow across grants made by different majorities: before
/// each grant a different pair of the 5 nodes is frozen, so consecutive grants come from different
/// quorums whose counters started at different times. The token is the largest counter of the
/// granting nodes, written back to a majority before it is handed out; without that write-back a
/// quorum that misses the node with the largest counter would hand out a smaller token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_grow_across_changing_quorums() {
    let masters = RedisMasters::start(5);
    let clients: Vec<LockClient> = (0..2)
        .map(|i| {
            LockClient::new(
                config(masters.urls())
                    .fencing(true)
                    .owner(format!("client-{i}")),
            )
            .expect("valid config")
        })
        .collect();
    let key = unique_key("redlock:fencing");
    let mut last = 0;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..40 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let a = (seed >> 33) as usize % 5;
        let b = (a + 1 + (seed >> 40) as usize % 4) % 5;
        masters.nodes[a].freeze();
        masters.nodes[b].freeze();
        let guard = clients[round % 2]
            .lock(&key)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap_or_else(|e| {
                let lock = lock_keys(&key).lock;
                let seen: Vec<String> = masters
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != a && *i != b)
                    .map(|(i, node)| {
                        let pttl: i64 = redis::cmd("PTTL")
                            .arg(&lock)
                            .query(&mut node.admin())
                            .unwrap_or(-3);
                        let value: Option<String> = redis::cmd("GET")
                            .arg(&lock)
                            .query(&mut node.admin())
                            .unwrap_or(None);
                        let owner = value.map(|v| v.chars().skip(32).collect::<String>());
                        format!("node {i}: pttl {pttl} {owner:?}")
                    })
                    .collect();
                panic!("round {round} (nodes {a}, {b} frozen): {e}; {seen:?}")
            });
        let token = guard.fencing_token().expect("fencing is on");
        assert!(
            token > last,
            "round {round} (nodes {a}, {b} frozen): token {token} after {last}"
        );
        last = token;
        guard.release().await.expect("release");
        masters.nodes[a].thaw();
        masters.nodes[b].thaw();
    }
}

// --- A split vote: every contender won some nodes, none a majority. -------------------------------

/// Two foreign attempts hold three nodes of the lock, none of them its gate (the node a contended
/// lock asks first); ours wins the other two and no majority. Nobody will publish a release (a
/// withdrawn attempt never was a lock, and these foreign ones do not announce it), so a waiter
/// that treated this like a held lock would sleep its backoff (here 60 s) until its 30 s wait ran
/// out; after a split it retries within milliseconds and gets the lock as soon as the foreign
/// attempts are withdrawn.
#[tokio::test]
async fn split_vote_is_retried_soon_not_after_the_backoff() {
    let masters = RedisMasters::start(NODES);
    let waiter =
        LockClient::new(config(masters.urls()).retry_delay(Duration::from_secs(60))).unwrap();
    // Scripts loaded and connections up, so that each attempt is exactly one acquire and one
    // withdrawal script on each node it reaches.
    let warm = waiter
        .lock(unique_key("redlock:split-warm"))
        .acquire()
        .await
        .unwrap();
    warm.release().await.unwrap();
    let key = unique_key("redlock:split");
    let gate = &masters.nodes[redlock_gate(&key, NODES)];
    let others: Vec<&RedisServer> = masters
        .nodes
        .iter()
        .filter(|n| n.port() != gate.port())
        .collect();
    let scripts = |node: &RedisServer| node.command_calls("evalsha");
    let before = scripts(gate);
    let place = |node: &RedisServer, who: &str| set_lock(node, &key, who, ms(60_000));
    place(others[0], "foreign-a");
    place(others[1], "foreign-a");
    place(others[2], "foreign-b");

    let acquire = start_acquire(waiter.lock(&key).wait(Duration::from_secs(30)));
    // The waiter has been refused (it subscribes to the release channel after its first answer),
    // and has made a second attempt: once its subscriptions are confirmed it looks again, since a
    // release may have come before. Each attempt is one acquire and one withdrawal on the gate.
    await_waiter(gate, &key).await;
    wait_until_async(ms(5000), "two attempts on the gate node", || {
        scripts(gate) >= before + 4 && !holds(gate, &key)
    })
    .await;
    // The foreign attempts withdraw too, without a release announcement.
    for node in &others[..3] {
        delete_lock(node, &key);
    }
    // Long before the wait runs out (when a last attempt would take it anyway), the lock is ours.
    // (The pause after each split doubles, so on a slow machine the retry after the deletion
    // can come seconds later; still well before the 30 s wait runs out.)
    wait_until_async(
        Duration::from_secs(20),
        "the waiter's grant on a majority",
        || holders(&masters.nodes.iter().collect::<Vec<_>>(), &key) >= 3,
    )
    .await;
    let guard = bounded(Duration::from_secs(5), "the waiter's acquire", acquire)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("a split vote was waited out like a held lock: {e:?}"));
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

/// A lock this client recently found held asks its gate node first; a frozen gate is not waited
/// for (the response timeout here is 1 s): the others are asked after a few milliseconds.
#[tokio::test]
async fn a_frozen_gate_node_does_not_hold_up_a_contended_lock() {
    let masters = RedisMasters::start(NODES);
    let holder = redlock_client(masters.urls());
    let waiter = patient_client(masters.urls());
    let key = unique_key("redlock:gate");
    let guard = hold_on_all(&holder, &masters, &key).await;
    match waiter.lock(&key).acquire().await {
        Err(LockError::Contended { .. }) => {}
        other => panic!("expected Contended while held, got {other:?}"),
    }
    guard.release().await.unwrap();
    let gate = &masters.nodes[redlock_gate(&key, NODES)];
    gate.freeze();
    let start = Instant::now();
    let got = waiter.lock(&key).acquire().await;
    let elapsed = start.elapsed();
    gate.thaw();
    eprintln!("redlock: contended lock with a frozen gate acquired after {elapsed:?}");
    let got = got.unwrap_or_else(|e| panic!("four of five nodes up: {e:?}"));
    assert!(
        elapsed < ms(500),
        "waited {elapsed:?} for the frozen gate (response timeout 1s)"
    );
    got.release().await.unwrap();
}

/// A lock won beside a contender's minority (a split vote: the contender withdraws what it won
/// a moment later) is placed on those nodes too once they are free, not left on a bare
/// majority, where one node losing its key early (its clock stepped ahead) hands the lock to
/// someone else while it is held: the quick campaign's Redlock overlap (seed 760081). The
/// contender's grants here expire after 20 ms; the placement tries again for about 60 ms.
#[tokio::test]
async fn a_lock_won_beside_a_contenders_minority_is_placed_there_once_it_is_free() {
    let masters = RedisMasters::start(NODES);
    let locks = redlock_client(masters.urls());
    let warm = locks.lock(unique_key("redlock:place-warm")).acquire().await;
    warm.unwrap().release().await.unwrap();
    let key = unique_key("redlock:place");
    let lock_key = lock_keys(&key).lock;
    let contender = &masters.nodes[NODES - 2..];
    for node in contender {
        set_lock(node, &key, "contender", ms(20));
    }
    let guard = locks.lock(&key).acquire().await.unwrap();
    let ours = |node: &RedisServer| {
        let value: Option<String> = redis::cmd("GET")
            .arg(&lock_key)
            .query(&mut node.admin())
            .unwrap();
        value.is_some_and(|v| v != "contender")
    };
    let bound = ms(20 + 62) + lock_tests::SCHEDULING_SLACK;
    wait_until_async(bound, "the lock placed on the contender's nodes", || {
        contender.iter().all(ours)
    })
    .await;
    assert!(masters.nodes.iter().all(ours));
    guard.release().await.unwrap();
}

/// The placement stops once the lock's release has begun: placed after it, the lock stayed on
/// that node as a copy of a released lock until the release's own step got there (it waits for
/// the placement), and the same client's next acquire was refused there. A client taking and
/// releasing one lock in a loop with one node of five frozen met such a copy beside the one its
/// slowest node still had: two grants, two refusals, so its uncontended acquire waited out the
/// frozen node's response timeout and answered `Contended` (the test now named
/// `one_frozen_node_of_five_is_never_waited_for`, in 2 of 3 local suite runs). Here the
/// contender's copy goes once the release returned, while the placement, slowed by a 100 ms
/// round trip, still tries again.
#[tokio::test]
async fn a_released_lock_is_never_placed_afterwards() {
    let masters = RedisMasters::start(NODES);
    let node = &masters.nodes[NODES - 1];
    let proxy = FaultProxy::start(node.port());
    let mut urls = masters.urls();
    urls[NODES - 1] = proxy.url();
    let locks = redlock_client(urls);
    let warm = warm_up(&locks).await;
    // Its release is the last of its requests on each node: the script calls stand still.
    wait_until_async(QUICK_REQUEST, "the warm-up released", || {
        holders(&masters.nodes.iter().collect::<Vec<_>>(), &warm) == 0
    })
    .await;
    let key = unique_key("redlock:place-released");
    let lock_key = lock_keys(&key).lock;
    let events = KeyEvents::watch(node, &lock_key);
    let () = redis::cmd("SET")
        .arg(&lock_key)
        .arg("contender")
        .query(&mut node.admin())
        .unwrap();
    let (asked, released) = (node.command_calls("set"), evalsha_calls(node));
    proxy.set_delay(ms(50));
    let guard = locks.lock(&key).acquire().await.expect("four free nodes");
    guard.release().await.expect("released on four nodes");
    wait_until_async(
        QUICK_REQUEST,
        "the acquire refused on the held node",
        || node.command_calls("set") > asked,
    )
    .await;
    let deleted: i64 = redis::cmd("DEL")
        .arg(&lock_key)
        .query(&mut node.admin())
        .unwrap();
    assert_eq!(
        deleted, 1,
        "the contender's copy was gone before the acquire asked"
    );
    let freed = Instant::now();
    // The release's step on the node follows the placement: its pauses, and a request per try.
    wait_until_async(
        ms(62) + QUICK_REQUEST * 6,
        "the release run on the node",
        || evalsha_calls(node) > released,
    )
    .await;
    let placed: Vec<Duration> = events
        .of(&lock_key)
        .iter()
        .filter(|e| e.event == "set" && e.at >= freed)
        .map(|e| e.at - freed)
        .collect();
    assert!(
        placed.is_empty(),
        "the released lock was placed on the node {placed:?} after it was free"
    );
}

/// The gate is a hint for callers that wait, never the answer for one that does not: a lock free
/// on a majority is granted to a `wait = 0` caller that recently found it held, even while its
/// gate still has the old holder's copy (a release returns once a majority confirmed it, and the
/// gate's part may land later). Answering from the gate alone made the same client's next call
/// after its own release `Contended` (redlock_behaviour's `non_reentrant_nested_call_contends`
/// failed so in CI).
#[tokio::test]
async fn a_caller_that_does_not_wait_is_never_refused_by_the_gate_alone() {
    let masters = RedisMasters::start(NODES);
    let holder = redlock_client(masters.urls());
    let caller = patient_client(masters.urls());
    let key = unique_key("redlock:gate-only");
    let gate = redlock_gate(&key, NODES);
    let guard = hold_on_all(&holder, &masters, &key).await;
    match caller.lock(&key).acquire().await {
        Err(LockError::Contended { .. }) => {}
        other => panic!("expected Contended while held, got {other:?}"),
    }
    // The release reached every node but the gate: the lock is free on four of five.
    for node in all_but(&masters, gate) {
        delete_lock(node, &key);
    }
    assert!(holds(&masters.nodes[gate], &key), "the gate keeps its copy");
    let got = caller
        .lock(&key)
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("free on a majority, refused by the gate alone: {e:?}"));
    wait_on_all(&all_but(&masters, gate), &key).await;
    got.release().await.unwrap();
    drop(guard);
}

/// A waiter listens at the lock's gate node alone, and is woken by its announcement. Listening at
/// every node woke each waiter once per node, and a waiter woken by another node's message asked
/// the gate before the gate's own release had landed, was refused and asked again: 13 attempts
/// on the gate per hand-off with 8 clients on one key, where 8 are enough.
#[tokio::test]
async fn a_waiter_listens_at_the_gate_node_alone() {
    let masters = RedisMasters::start(NODES);
    let holder = redlock_client(masters.urls());
    let waiter = patient_client(masters.urls());
    let key = unique_key("redlock:announce");
    let gate = redlock_gate(&key, NODES);
    let guard = hold_on_all(&holder, &masters, &key).await;
    let waiting = start_acquire(waiter.lock(&key).wait(Duration::from_secs(10)));
    await_waiter(&masters.nodes[gate], &key).await;
    let channel = lock_keys(&key).channel;
    for (i, node) in masters.nodes.iter().enumerate() {
        let expected = i64::from(i == gate);
        assert_eq!(
            node.subscribers(&channel),
            expected,
            "subscribers on node {i}"
        );
    }
    guard.release().await.unwrap();
    let got = granted_soon(waiting, "woken by the gate's announcement").await;
    got.release().await.unwrap();
}

/// The latest lease a node gives a fair waiter's place on `key` (its waiters' lease expiries,
/// in the server's milliseconds); `None` when nobody waits there.
fn latest_lease(node: &RedisServer, key: &str) -> Option<f64> {
    let leases: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(lock_keys(key).queue_leases)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut node.admin())
        .unwrap();
    leases.into_iter().map(|(_, lease)| lease).reduce(f64::max)
}

/// A fair waiter is woken by the gate's hand-off to it whatever ticket its last answer carried.
/// Each node keeps its own line, with tickets of its own (its clock when the waiter lined up),
/// and an attempt whose gate did not answer within its patience is settled by the other nodes'
/// refusals, with the place one of them gave. The waiter listened for the gate's hand-off under
/// that other ticket, slept through it, and took the lock a third of its place's lease later,
/// at its next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_is_woken_by_its_hand_off_whatever_ticket_its_last_answer_carried() {
    let masters = RedisMasters::start(NODES);
    let key = unique_key("redlock:fair-ticket");
    let gate = redlock_gate(&key, NODES);
    let proxy = FaultProxy::start(masters.nodes[gate].port());
    let mut urls = masters.urls();
    urls[gate] = proxy.url();
    let holder = redlock_client(masters.urls());
    // Its attempts come when its places need renewing (every 2 s): its retry timer is later.
    let waiter = LockClient::new(config(urls).retry_delay(Duration::from_secs(10))).unwrap();
    warm_up(&waiter).await;
    let ttl = Duration::from_secs(6);
    let guard = holder
        .lock(&key)
        .fair(true)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    // On every node before the waiter asks: a node the holder's acquire (returned at its
    // quorum) had not reached yet would grant the waiter there, and it would not be in line.
    wait_on_all(&nodes, &key).await;
    let waiting = start_acquire(
        waiter
            .lock(&key)
            .fair(true)
            .ttl(ttl)
            .wait(Duration::from_secs(20)),
    );
    wait_until_async(
        QUICK_REQUEST + SCHEDULING_SLACK,
        "the waiter in line on every node",
        || nodes.iter().all(|n| latest_lease(n, &key).is_some()),
    )
    .await;
    // Its subscription's confirmation triggers another attempt at once. Set while that one is
    // on its way, the delay below could miss it on the gate and catch it elsewhere, and the
    // reads below would see it on the gate and not yet elsewhere. So the delay waits until an
    // attempt landed on every node since it lined up: the next comes a third of the ttl later.
    let lined_up: Vec<Option<f64>> = nodes.iter().map(|n| latest_lease(n, &key)).collect();
    wait_until_async(
        ttl / 3 + QUICK_REQUEST + SCHEDULING_SLACK,
        "another attempt renewed the waiter's place on every node",
        || {
            nodes
                .iter()
                .zip(&lined_up)
                .all(|(n, before)| latest_lease(n, &key) > *before)
        },
    )
    .await;
    // From now on the gate answers after its patience: the next attempt is settled without it.
    proxy.set_delay(ms(50));
    let other = all_but(&masters, gate)[0];
    let (renewed, gate_renewed) = (latest_lease(other, &key), latest_lease(nodes[gate], &key));
    wait_until_async(
        ttl / 3 + QUICK_REQUEST + SCHEDULING_SLACK,
        "the next attempt renewed the waiter's place on the other nodes",
        || latest_lease(other, &key) > renewed,
    )
    .await;
    wait_until_async(
        QUICK_REQUEST + SCHEDULING_SLACK,
        "and, late, on the gate",
        || latest_lease(nodes[gate], &key) > gate_renewed,
    )
    .await;
    proxy.set_delay(Duration::ZERO);
    let publishes = masters.nodes[gate].command_calls("publish");
    let released = Instant::now();
    guard.release().await.unwrap();
    // One attempt after the hand-off's message, and slack: far less than the wait for the next
    // renewal (2 s after the last).
    let bound = QUICK_REQUEST + SCHEDULING_SLACK;
    let got = tokio::time::timeout(bound, waiting).await;
    let took = released.elapsed();
    assert!(
        masters.nodes[gate].command_calls("publish") > publishes,
        "the gate announced the hand-off"
    );
    let got = got
        .unwrap_or_else(|_| panic!("not woken by the gate's hand-off within {bound:?}"))
        .unwrap()
        .unwrap_or_else(|e| panic!("after {took:?}: {e:?}"));
    eprintln!("redlock: fair waiter handed the lock {took:?} after the release");
    got.release().await.unwrap();
}

/// A waiter for a lock over several keys listens for each key's release at the node its attempts
/// ask first: the gate of the lock's first key. Listening at the held key's own gate lost the
/// wake-up: woken by the release there, the waiter asked its lock's gate before the release had
/// landed there, was refused, and heard nothing more (a behaviour check saw it wait out its
/// backoff).
#[tokio::test]
async fn a_waiter_on_several_keys_listens_at_its_locks_gate() {
    let masters = RedisMasters::start(NODES);
    let holder = redlock_client(masters.urls());
    let waiter = patient_client(masters.urls());
    // Two keys whose gates differ; the held one sorts second.
    let base = unique_key("redlock:multi-gate");
    let (first, held) = (0..100)
        .map(|i| (format!("{base}:a{i}"), format!("{base}:b{i}")))
        .find(|(a, b)| redlock_gate(a, NODES) != redlock_gate(b, NODES))
        .expect("two keys with different gates");
    let guard = hold_on_all(&holder, &masters, &held).await;
    let waiting = start_acquire(
        waiter
            .lock_many([&held, &first])
            .wait(Duration::from_secs(10)),
    );
    await_waiter(&masters.nodes[redlock_gate(&first, NODES)], &held).await;
    let channel = lock_keys(&held).channel;
    assert_eq!(
        masters.nodes[redlock_gate(&held, NODES)].subscribers(&channel),
        0,
        "listening at the held key's own gate"
    );
    guard.release().await.unwrap();
    let got = granted_soon(waiting, "woken by the release").await;
    assert_eq!(got.keys().len(), 2);
    got.release().await.unwrap();
}

/// A waiter whose gate does not confirm its subscription (frozen here) listens at the other
/// nodes instead, and is woken by their announcements. With the gate alone it would hear
/// nothing and sleep until its next attempt was due (here 10 s, a third of its ttl: the backoff
/// is a minute).
#[tokio::test]
async fn a_waiter_whose_gate_is_frozen_listens_at_the_other_nodes() {
    let masters = RedisMasters::start(NODES);
    let holder = redlock_client(masters.urls());
    let key = unique_key("redlock:frozen-gate-wake");
    let gate = redlock_gate(&key, NODES);
    let guard = hold_on_all(&holder, &masters, &key).await;
    masters.nodes[gate].freeze();
    let waiter = LockClient::new(
        config(masters.urls())
            .retry_delay(Duration::from_secs(60))
            .default_ttl(Duration::from_secs(30)),
    )
    .unwrap();
    let waiting = start_acquire(waiter.lock(&key).wait(Duration::from_secs(30)));
    let channel = lock_keys(&key).channel;
    let others = all_but(&masters, gate);
    wait_until_async(
        Duration::from_secs(10),
        "the waiter subscribed at the other nodes",
        || others.iter().all(|node| node.subscribers(&channel) > 0),
    )
    .await;
    guard.release().await.unwrap();
    let got = granted_soon(waiting, "four of five nodes up").await;
    masters.nodes[gate].thaw();
    got.release().await.unwrap();
}

/// A fair waiter that gives up while the lock's gate node is frozen leaves no place in line
/// behind. It queued on the other nodes only, and the gate, which would have reported its place,
/// never answered: its give-up must still take those entries back, or the holder's release hands
/// those nodes to the departed waiter, and the lock stays taken by nobody until the entries'
/// lease (the waiter's ttl) runs out.
#[tokio::test]
async fn a_fair_waiter_giving_up_behind_a_frozen_gate_leaves_no_place_in_line() {
    let masters = RedisMasters::start(3);
    let key = unique_key("redlock:fair-frozen-gate");
    let gate = redlock_gate(&key, 3);
    let queue = lock_keys(&key).queue;
    let others = all_but(&masters, gate);
    masters.nodes[gate].freeze();
    let holder = redlock_client(masters.urls());
    let guard = holder.lock(&key).fair(true).acquire().await.unwrap();
    let waiter =
        LockClient::new(config(masters.urls()).default_ttl(Duration::from_secs(30))).unwrap();
    let waiting = start_acquire(waiter.lock(&key).fair(true).wait(ms(300)));
    let queued_at = |node: &RedisServer| -> u64 {
        redis::cmd("ZCARD")
            .arg(&queue)
            .query(&mut node.admin())
            .unwrap()
    };
    // Its first attempt puts it in line on the other nodes (so giving up has something to take
    // back), within one request timeout.
    wait_until_async(ms(250), "the waiter in line on the other nodes", || {
        others.iter().all(|node| queued_at(node) == 1)
    })
    .await;
    let gave_up = bounded(Duration::from_secs(5), "the waiter", waiting)
        .await
        .unwrap()
        .map(drop);
    assert!(
        matches!(gave_up, Err(LockError::Contended { .. })),
        "{gave_up:?}"
    );
    guard.release().await.unwrap();
    let third = redlock_client(masters.urls());
    let started = Instant::now();
    let got = third
        .lock(&key)
        .fair(true)
        .wait(Duration::from_secs(3))
        .acquire()
        .await;
    masters.nodes[gate].thaw();
    let got = got.unwrap_or_else(|e| {
        panic!(
            "nobody holds the lock, yet after {:?}: {e:?}",
            started.elapsed()
        )
    });
    for node in &others {
        assert_eq!(queued_at(node), 0, "a departed waiter is still in line");
    }
    got.release().await.unwrap();
}

/// Every `EVALSHA` node `node` ran or refused (`NOSCRIPT` counts as a failed call).
fn evalsha_calls(node: &RedisServer) -> u64 {
    ["calls", "failed_calls", "rejected_calls"]
        .iter()
        .map(|stat| node.command_stat("evalsha", stat))
        .sum()
}

/// A node that never ran the release script (a fresh server) answers a release `NOSCRIPT`. When
/// that answer comes after the release gave up on the node (here its replies are held back),
/// nobody loads the script and sends the release again, and the grant its late acquire made just
/// before, on the same connection, stayed for the whole ttl: a lock orphaned on a minority (with
/// two other nodes frozen, nobody could take it; `fencing_tokens_grow_across_changing_quorums`
/// failed so about one run in five). The release now carries the script's load until the node
/// has answered it, so the grant goes as soon as the node runs the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_answered_too_late_by_a_fresh_node_still_deletes_its_late_grant() {
    let masters = RedisMasters::start(3);
    let node = &masters.nodes[0];
    let proxy = FaultProxy::start(node.port());
    let mut urls = masters.urls();
    urls[0] = proxy.url();
    let client = redlock_client(urls);
    let key = unique_key("redlock:noscript");
    let lock = lock_keys(&key).lock;
    // Connections up on every node; no release script ever ran on any of them.
    assert!(client.inspect(&key).await.unwrap().is_none());
    let scripts = evalsha_calls(node);
    proxy.set_blackhole_down(true);
    let guard = client
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("nodes 1 and 2 are a majority");
    wait_until_async(QUICK_REQUEST, "node 0 grants the lock", || {
        key_exists(node, &lock)
    })
    .await;
    guard.release().await.expect("nodes 1 and 2 release it");
    // Node 0's release follows its acquire step, which gives up on the held reply after one
    // request.
    wait_until_async(
        QUICK_REQUEST * 2 + SCHEDULING_SLACK,
        "node 0 runs the release",
        || evalsha_calls(node) > scripts,
    )
    .await;
    assert!(
        !key_exists(node, &lock),
        "the late grant stays on node 0 after its release ran there"
    );
    proxy.set_blackhole_down(false);
}

/// The operations of one token reach each node in order, also when a gated attempt ends at the
/// gate and never asks the other nodes: its unused steps must not let the next attempt's step
/// overtake the one still in flight on a slow node. Here attempt 1's grant on the slow node is
/// withdrawn (it lost the vote) only after its reply came back; a later attempt that won the
/// gate and asked that node at once was granted there first, and the late withdrawal then
/// deleted the new lock's key: the lock sat on the gate alone, a minority.
#[tokio::test]
async fn a_late_withdrawal_never_deletes_a_later_attempts_grant() {
    let masters = RedisMasters::start(3);
    let key = unique_key("redlock:step-order");
    let gate = redlock_gate(&key, 3);
    let (slow, held) = ((gate + 1) % 3, (gate + 2) % 3);
    let proxy = FaultProxy::start(masters.nodes[slow].port());
    let urls: Vec<String> = (0..3)
        .map(|i| {
            if i == slow {
                proxy.url()
            } else {
                masters.nodes[i].url()
            }
        })
        .collect();
    // Fencing on: every attempt is one call per node (a script or a transaction).
    let locks = LockClient::new(
        config(urls)
            .response_timeout(Duration::from_secs(2))
            .retry_delay(ms(30))
            .fencing(true),
    )
    .unwrap();
    // Scripts loaded and connections up everywhere.
    let warm = warm_up(&locks).await;
    // Its release is the last of its requests on each node.
    wait_until_async(Duration::from_secs(2), "the warm-up released", || {
        holders(&masters.nodes.iter().collect::<Vec<_>>(), &warm) == 0
    })
    .await;
    let lock_key = lock_keys(&key).lock;
    for node in [gate, held] {
        set_lock(&masters.nodes[node], &key, "someone-else", ms(30_000));
    }
    let calls = |node: &RedisServer| node.command_calls("evalsha") + node.command_calls("multi");
    let (gate_calls, held_calls) = (calls(&masters.nodes[gate]), calls(&masters.nodes[held]));
    let events = KeyEvents::watch(&masters.nodes[slow], &lock_key);
    proxy.set_delay(ms(300));
    let waiting = start_acquire(locks.lock(&key).wait(Duration::from_secs(10)));
    // Attempt 1 asked every node (it is held up on its way to the slow one); attempt 2 asked the
    // gate alone and was refused there.
    wait_until_async(ms(250), "a gated second attempt", || {
        calls(&masters.nodes[gate]) >= gate_calls + 2
    })
    .await;
    assert!(
        calls(&masters.nodes[held]) > held_calls,
        "attempt 1 never asked every node"
    );
    assert!(
        masters.nodes[slow].keys(&lock_key).is_empty(),
        "attempt 1 was not held up on the slow link"
    );
    // What follows is fast, but queued behind attempt 1's request on that link.
    proxy.set_delay(Duration::ZERO);
    let _: i64 = redis::cmd("DEL")
        .arg(&lock_key)
        .query(&mut masters.nodes[gate].admin())
        .unwrap();
    let guard = granted_soon(waiting, "the gate and the slow node are free").await;
    // The grant needed the slow node (the third is held), so the winning attempt's request ran
    // there; attempt 1's withdrawal deletes the key there once it lands.
    wait_until_async(Duration::from_secs(3), "attempt 1's withdrawal", || {
        events.of(&lock_key).iter().any(|e| e.event == "del")
    })
    .await;
    let value = |node: &RedisServer| -> Option<String> {
        redis::cmd("GET")
            .arg(&lock_key)
            .query(&mut node.admin())
            .unwrap()
    };
    let ours = value(&masters.nodes[gate]);
    assert!(ours.is_some(), "the gate lost the lock");
    assert_eq!(
        value(&masters.nodes[slow]),
        ours,
        "a late withdrawal deleted the lock on the slow node: the lock sits on a minority"
    );
    let released = guard.release().await;
    assert!(released.is_ok(), "{released:?}");
}

/// A token is handed out only once a majority of the nodes that granted it have it written
/// back. A later grant's majority then shares one of those nodes, and is granted there only
/// after this lock let go of it, so it counts on from the token. Any majority was not enough:
/// the fault campaign (seed 200639) saw a token 4 s of clock below the one before it, the later
/// grant's nodes all being ones the write-back had not reached when they granted it.
///
/// Here one node's counter is far ahead (as a node whose clock stepped ahead leaves it), the
/// third node is held by someone else and refuses, and the link to the second is slow: the
/// grant comes from the first and the slow one, and the refusing node acks the write-back long
/// before the slow one does.
#[tokio::test]
async fn a_token_is_handed_out_once_a_majority_of_its_granting_nodes_has_it() {
    let masters = RedisMasters::start(3);
    let key = unique_key("redlock:write-back");
    let (ahead, slow, refusing) = (0, 1, 2);
    let proxy = FaultProxy::start(masters.nodes[slow].port());
    let mut urls = masters.urls();
    urls[slow] = proxy.url();
    let locks = LockClient::new(
        config(urls)
            .response_timeout(Duration::from_secs(2))
            .fencing(true),
    )
    .unwrap();
    // Scripts loaded and connections up everywhere.
    warm_up(&locks).await;
    let keys = lock_keys(&key);
    // Far above any server clock in microseconds (2033): the token comes from this node.
    let far_ahead: u64 = 2_000_000_000_000_000;
    let () = redis::cmd("SET")
        .arg(&keys.fence)
        .arg(far_ahead)
        .query(&mut masters.nodes[ahead].admin())
        .unwrap();
    set_lock(&masters.nodes[refusing], &key, "someone-else", ms(30_000));
    // The acquire then takes two round trips of the slow link (the grant, the write-back),
    // well inside its bound of one request timeout; the write-back to the slow node lands
    // 100 ms after it leaves.
    proxy.set_delay(ms(100));
    let guard = bounded(
        Duration::from_secs(10),
        "the acquire",
        locks.lock(&key).acquire(),
    )
    .await
    .unwrap();
    let token = guard.fencing_token().unwrap();
    let fence_on = |node: &RedisServer| -> Option<u64> {
        redis::cmd("GET")
            .arg(&keys.fence)
            .query(&mut node.admin())
            .unwrap()
    };
    // Read at once, straight from the servers (not through the slow link).
    let on_slow = fence_on(&masters.nodes[slow]);
    assert!(
        holds(&masters.nodes[slow], &key),
        "the slow node did not grant it"
    );
    assert_eq!(
        token,
        far_ahead + 1,
        "the token did not come from the node ahead"
    );
    assert!(
        on_slow.is_some_and(|f| f >= token),
        "handed out token {token} while a granting node's counter was {on_slow:?}"
    );
    proxy.set_delay(Duration::ZERO);
    guard.release().await.unwrap();
    // The write-back reaches the refusing node's counter too, which no grant touched.
    let refusing_node = &masters.nodes[refusing];
    wait_until_async(
        QUICK_REQUEST + SCHEDULING_SLACK,
        "the write-back on every node",
        || fence_on(refusing_node).is_some_and(|f| f >= token),
    )
    .await;
}

/// The longest pause of a waiter with the default `retry_delay` (100 ms) behind a holder of this
/// library, whose release announces itself: 8 x 100 ms x 1.5 (`retry_jitter` 0.5). A stale copy
/// on the gate announces nothing, so it holds a gated waiter up for at most one such pause
/// (DEPLOYING.md, "The gate"; it said `2 x retry_delay x 1.5`, 300 ms, the bound behind a release
/// that announces nothing, which a waiter behind our holder no longer keeps: measured 378-889
/// ms).
const ANNOUNCED_PAUSE: Duration = Duration::from_millis(1200);
/// The old holder's ttl: what its copy left on the gate held a gated waiter up for.
const STALE_GATE_TTL: Duration = Duration::from_secs(30);
/// The first pause before a release's part that may have run unseen is sent again.
const PART_RETRY: Duration = Duration::from_millis(50);

/// The value of `key`'s lock on `node` (the holder's token: compared, never printed).
fn lock_value(node: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(lock_keys(key).lock)
        .query(&mut node.admin())
        .unwrap()
}

/// A holder whose link to the lock's gate goes through `proxy`, the lock held by it on every
/// node, and a waiter with the default `retry_delay` that was refused by every node and now
/// listens at the gate (its next attempts ask the gate first). Then the release, whose part on
/// the gate is held by the proxy and reset with the link: the other two nodes confirm it, which
/// is the release's majority, and the gate keeps the old holder's copy. Returns the waiter, the
/// instant of the release, the copy's value, and the holder's client (its release's part on the
/// gate runs on).
async fn released_past_the_gate(
    masters: &RedisMasters,
    proxy: &FaultProxy,
    key: &str,
) -> (
    tokio::task::JoinHandle<Result<LockGuard, LockError>>,
    Instant,
    Option<String>,
    LockClient,
) {
    let gate = redlock_gate(key, 3);
    let mut urls = masters.urls();
    urls[gate] = proxy.url();
    let holder = redlock_client(urls);
    warm_up(&holder).await;
    let waiter = redlock_client(masters.urls());
    let guard = holder
        .lock(key)
        .ttl(STALE_GATE_TTL)
        .acquire()
        .await
        .unwrap();
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    wait_on_all(&nodes, key).await;
    let held_by = lock_value(nodes[gate], key);
    assert!(held_by.is_some());
    let waiting = start_acquire(waiter.lock(key).wait(Duration::from_secs(20)));
    await_waiter(nodes[gate], key).await;
    proxy.set_blackhole(true);
    guard.release().await.unwrap();
    proxy.cut_all();
    let released = Instant::now();
    for node in all_but(masters, gate) {
        assert!(
            lock_value(node, key) != held_by,
            "the release did not reach port {}",
            node.port()
        );
    }
    (waiting, released, held_by, holder)
}

/// A release whose part on the gate is lost while the releaser cannot reach the gate at all (the
/// link reset, and the gate unreachable since: the part's retries are held too) leaves the old
/// holder's copy there until its ttl, and the gate announces nothing. A gated attempt after a
/// pause that heard no release, refused by the same copy as the attempt before, asks every node:
/// the waiter is granted within one pause, the longest behind an announced holder (1.2 s with
/// the default `retry_delay`), not the copy's ttl (30 s).
#[tokio::test]
async fn a_stale_copy_on_the_gate_holds_up_a_waiter_at_most_one_pause() {
    let masters = RedisMasters::start(3);
    let key = unique_key("redlock:stale-gate");
    let gate = redlock_gate(&key, 3);
    let proxy = FaultProxy::start(masters.nodes[gate].port());
    let (waiting, released, held_by, _holder) =
        released_past_the_gate(&masters, &proxy, &key).await;
    assert!(
        lock_value(&masters.nodes[gate], &key) == held_by,
        "the gate no longer has the old holder's copy"
    );
    // The attempt in flight at the release (the gate, then the others: two requests), at most
    // one pause, and the attempt after it.
    let bound = QUICK_REQUEST * 4 + ANNOUNCED_PAUSE + SCHEDULING_SLACK;
    let got = tokio::time::timeout(bound, waiting).await;
    let took = released.elapsed();
    let stale: i64 = redis::cmd("PTTL")
        .arg(lock_keys(&key).lock)
        .query(&mut masters.nodes[gate].admin())
        .unwrap();
    assert!(
        lock_value(&masters.nodes[gate], &key) == held_by && stale > 20_000,
        "the gate's stale copy is gone (PTTL {stale} ms): it did not hold the waiter up"
    );
    let got = got
        .unwrap_or_else(|_| panic!("a stale copy on the gate held the waiter up past {bound:?}"))
        .unwrap()
        .unwrap_or_else(|e| panic!("after {took:?}: {e:?}"));
    eprintln!("redlock: a waiter behind a stale gate copy granted {took:?} after the release");
    got.release().await.unwrap();
}

/// The same release, the link to the gate reset and reachable again at once (a connection
/// reset, a restarted proxy): the part on the gate, which may have run unseen, is sent again
/// after 50 ms over a new connection, deletes the old holder's copy and announces the release.
/// Before, a part was never sent again once a majority confirmed the release: the copy stayed
/// for its ttl (30 s), and each waiter that asked the gate waited a pause for it.
#[tokio::test]
async fn a_release_part_the_gate_lost_with_its_link_is_sent_again() {
    let masters = RedisMasters::start(3);
    let key = unique_key("redlock:part-sent-again");
    let gate = redlock_gate(&key, 3);
    let proxy = FaultProxy::start(masters.nodes[gate].port());
    let (waiting, released, held_by, _holder) =
        released_past_the_gate(&masters, &proxy, &key).await;
    proxy.set_blackhole(false);
    // The reset part's retry: its pause, a new connection and the request. (The waiter may hold
    // the lock on the gate by then: the old holder's copy is what must go.)
    let bound = PART_RETRY + QUICK_REQUEST + SCHEDULING_SLACK;
    let gone = wait_until_async(bound, "the gate's copy deleted by the retried part", || {
        lock_value(&masters.nodes[gate], &key) != held_by
    })
    .await;
    eprintln!("redlock: the gate's copy deleted {gone:?} after the release");
    // Announced: the waiter, which listens at the gate, is granted within its attempt.
    let guard = bounded(QUICK_REQUEST * 2 + SCHEDULING_SLACK, "the waiter", waiting)
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "redlock: the waiter granted {:?} after the release",
        released.elapsed()
    );
    guard.release().await.unwrap();
}

/// A writer granted by a majority while one node still had the reader it waited for, and
/// released before it was placed there, leaves no waiting writer's mark on that node: once the
/// reader's late release lands, the node is free. The reader's link to one node (not the gate)
/// is delayed so that its release lands there after the writer came and went.
///
/// Failed before each waiting writer had a mark of its own (in 5 of 5 runs; and
/// `a_waiting_writer_is_not_starved` on Redlock, "released on every node", 1 of 15 runs on 3
/// Valkey nodes, 1 of 30 on 3 Redis nodes, 3 of 60 on 5 Redis nodes): the last reader's release
/// kept `#shared` and the one `#w` until the writer's mark ran out (the writer's remaining wait),
/// and the writer's release, a compare-and-delete of its token, did not touch a key it never got
/// there. That node refused readers meanwhile. Now the writer's release drops its own mark there.
#[tokio::test]
async fn a_released_writer_leaves_no_mark_where_a_reader_left_late() {
    let masters = RedisMasters::start(3);
    let key = unique_key("redlock:late-reader");
    let gate = redlock_gate(&key, 3);
    let late = (gate + 1) % 3;
    let proxies: Vec<FaultProxy> = masters
        .nodes
        .iter()
        .map(|n| FaultProxy::start(n.port()))
        .collect();
    let reader_client = patient_client(proxies.iter().map(FaultProxy::url));
    let writer_client = patient_client(masters.urls());
    let reader = reader_client
        .lock(&key)
        .shared(true)
        .acquire()
        .await
        .unwrap();
    wait_on_all(&masters.nodes.iter().collect::<Vec<_>>(), &key).await;
    let writer = start_acquire(writer_client.lock(&key).wait(Duration::from_secs(10)));
    await_waiter(&masters.nodes[gate], &key).await;
    // Less than a patient client's response timeout, so the release still answers; far more
    // than a writer's grant and release on loopback take.
    proxies[late].set_delay(ms(500));
    let releasing = tokio::spawn(reader.release());
    let granted = granted_soon(writer, "the writer, woken by the gate's release").await;
    // The writer won without the late node, where the reader is still held.
    assert!(holds(&masters.nodes[late], &key));
    granted.release().await.unwrap();
    bounded(Duration::from_secs(5), "the reader's release", releasing)
        .await
        .unwrap()
        .unwrap();
    proxies[late].set_delay(Duration::ZERO);
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    wait_until_async(Duration::from_secs(2), "every node free", || {
        holders(&nodes, &key) == 0
    })
    .await;
}

/// The fair acquire attempts (`EVALSHA` of the fair script: five keys) among `sent`; a call
/// that a fresh server answered `NOSCRIPT` (`SCRIPT LOAD`, then the same call again, follow it
/// from the same client) counts once.
fn fair_attempts(sent: &[Sent]) -> usize {
    let fair = |s: &Sent| s.command == "evalsha" && s.args.get(1).map(String::as_str) == Some("5");
    sent.iter()
        .enumerate()
        .filter(|(i, s)| {
            let mut next = sent[i + 1..].iter().filter(|next| next.client == s.client);
            let reloaded = next.next().is_some_and(|load| load.command == "script")
                && next.next().is_some_and(|again| again.args == s.args);
            fair(s) && !reloaded
        })
        .count()
}

/// A client holding `key` on every node, with its guard; `waiter` has been refused it once, so
/// its client found the lock held and its attempts ask the gate first (it lines up there alone).
async fn held_and_refused_once(
    masters: &RedisMasters,
    waiter: &LockClient,
    key: &str,
) -> (LockClient, LockGuard) {
    warm_up(waiter).await;
    let holder = redlock_client(masters.urls());
    let guard = hold_on_all(&holder, masters, key).await;
    let refused = waiter.lock(key).wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(refused, Err(LockError::Contended { .. })),
        "{refused:?}"
    );
    (holder, guard)
}

/// Starts `waiter`'s fair acquire of `key` (its place living `ttl`, a 10 s wait) and returns
/// once it has a place in line at the lock's gate node.
async fn in_line_at_the_gate(
    waiter: &LockClient,
    masters: &RedisMasters,
    key: &str,
    ttl: Duration,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    let waiting = start_acquire(
        waiter
            .lock(key)
            .fair(true)
            .ttl(ttl)
            .wait(Duration::from_secs(10)),
    );
    let gate = &masters.nodes[redlock_gate(key, NODES)];
    wait_until_async(
        QUICK_REQUEST + SCHEDULING_SLACK,
        "the waiter in line at the gate",
        || latest_lease(gate, key).is_some(),
    )
    .await;
    waiting
}

/// A waiter's attempt after its subscription is confirmed asks the gate alone: it only finds out
/// whether a hand-off came before the waiter listened, and the gate tells. It used to be taken
/// for an attempt after a pause that ran out, whose gate still shows the copy that refused it,
/// and ask the other nodes too: with 8 fair clients on one key over 3 nodes, such an attempt took
/// a node whose release had landed while the gate handed the lock to the next waiter in its
/// line; the vote split, and one waiter after another won the gate and lost the others (bench
/// section 8: 494 sections/s, 23 round trips per hand-off, 295 commands per section).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_attempt_after_its_subscription_is_confirmed_asks_the_gate_alone() {
    let masters = RedisMasters::start(NODES);
    // Its retry timer is later than its wait: its pause lasts until the wait is over.
    let waiter =
        LockClient::new(config(masters.urls()).retry_delay(Duration::from_secs(10))).unwrap();
    let key = unique_key("redlock:confirmed");
    let gate = redlock_gate(&key, NODES);
    let (_holder, guard) = held_and_refused_once(&masters, &waiter, &key).await;
    let monitors: Vec<Monitor> = masters.nodes.iter().map(Monitor::start).collect();
    // Its first attempt asks the gate; the next, once its subscription is confirmed, the gate
    // again; the last, when its wait has run out, every node (then it leaves its line).
    let wait = Duration::from_secs(1);
    let got = waiter
        .lock(&key)
        .fair(true)
        .ttl(Duration::from_secs(30))
        .wait(wait)
        .acquire()
        .await;
    assert!(
        matches!(got, Err(LockError::Contended { .. })),
        "refused while held: {got:?}"
    );
    for (i, (monitor, node)) in monitors.into_iter().zip(&masters.nodes).enumerate() {
        let attempts = fair_attempts(&monitor.stop(node));
        let expected = if i == gate { 3 } else { 1 };
        assert_eq!(
            attempts, expected,
            "the waiter's attempts on node {i} (gate {gate})"
        );
    }
    guard.release().await.unwrap();
}

/// A waiter that its gate grants asks the other nodes without a place in their lines: the gate's
/// line is the order. Refused there (a holder's release has not landed yet, or the node's own
/// line hands it on), it lined up, and the node handed the lock to it later, in an order of its
/// own, while it listened at the gate alone: the lock sat there, out of the next waiter's reach,
/// until the lease of that place ran out or its turn came round again at the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_granted_by_its_gate_takes_no_place_in_the_other_nodes_lines() {
    let masters = RedisMasters::start(NODES);
    let waiter = patient_client(masters.urls());
    let key = unique_key("redlock:gate-granted");
    let keys = lock_keys(&key);
    let gate = redlock_gate(&key, NODES);
    let (_holder, guard) = held_and_refused_once(&masters, &waiter, &key).await;
    // Its place lives `ttl`; it is renewed a third of that after each attempt.
    let ttl = Duration::from_millis(2400);
    let waiting = in_line_at_the_gate(&waiter, &masters, &key, ttl).await;
    let gate_node = &masters.nodes[gate];
    let others = all_but(&masters, gate);
    for node in &others {
        assert_eq!(
            latest_lease(node, &key),
            None,
            "in line elsewhere than at the gate"
        );
    }
    // The gate hands the lock to the waiter (as a release there would; the holder keeps every
    // other node): its next attempt is granted there, and refused by the others.
    let waiting_token: Vec<String> = redis::cmd("ZRANGE")
        .arg(&keys.queue)
        .arg(0)
        .arg(0)
        .query(&mut gate_node.admin())
        .unwrap();
    set_lock(gate_node, &key, &waiting_token[0], ms(30_000));
    let asked: Vec<u64> = others.iter().map(|n| evalsha_calls(n)).collect();
    wait_until_async(
        ttl / 3 + QUICK_REQUEST + SCHEDULING_SLACK,
        "the waiter's attempt after its grant at the gate reached every other node",
        || {
            others
                .iter()
                .zip(&asked)
                .all(|(n, before)| evalsha_calls(n) > *before)
        },
    )
    .await;
    for node in &others {
        assert_eq!(
            latest_lease(node, &key),
            None,
            "the waiter lined up at node {} after its gate granted it",
            node_name(node)
        );
    }
    waiting.abort();
    guard.release().await.unwrap();
}

/// A hand-off message from the gate is no grant under Redlock: here the gate hands the lock to
/// its waiter while another value holds a majority of the nodes, and the waiter's attempt,
/// granted by the gate and one other node, loses, withdraws both, and lines up nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_from_the_gate_while_a_majority_is_held_elsewhere_grants_nothing() {
    let masters = RedisMasters::start(NODES);
    let waiter = patient_client(masters.urls());
    let key = unique_key("redlock:stale-hand-off");
    let gate = redlock_gate(&key, NODES);
    let (_holder, guard) = held_and_refused_once(&masters, &waiter, &key).await;
    let waiting = in_line_at_the_gate(&waiter, &masters, &key, Duration::from_secs(30)).await;
    let gate_node = &masters.nodes[gate];
    // Another value takes three of the four other nodes from the holder.
    let others = all_but(&masters, gate);
    let taken = &others[..3];
    for node in taken {
        set_lock(node, &key, "another-client", ms(30_000));
    }
    let (publishes, asked) = (
        gate_node.command_calls("publish"),
        taken.iter().map(|n| evalsha_calls(n)).collect::<Vec<_>>(),
    );
    // Ours on the gate and one other node only: not a majority, whatever the call says.
    let _ = guard.release().await;
    assert!(
        gate_node.command_calls("publish") > publishes,
        "the gate handed the lock to its waiter"
    );
    // Two attempts on each: the first (after the hand-off) was decided, and lost, before the
    // second (a split vote's retry, a moment later) was made.
    wait_until_async(
        2 * QUICK_REQUEST + SCHEDULING_SLACK,
        "two attempts of the waiter after the hand-off reached the taken nodes",
        || {
            taken
                .iter()
                .zip(&asked)
                .all(|(n, before)| evalsha_calls(n) > before + 1)
        },
    )
    .await;
    assert!(
        !waiting.is_finished(),
        "granted without a majority: {:?}",
        waiting.await
    );
    for node in taken {
        assert_eq!(
            latest_lease(node, &key),
            None,
            "the waiter lined up at node {}",
            node_name(node)
        );
    }
    waiting.abort();
}
