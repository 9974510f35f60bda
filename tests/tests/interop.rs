//! Locks shared with lock clients of other languages on the lock's own key
//! (`layout::redis_key`, `lock:{name}`): redis-py's `redis.lock.Lock` and node-redlock, run by the
//! scripts under `tests/interop/` (installed by `scripts/test.sh`; `LOCK_TESTS_INTEROP=no` skips
//! these tests). An exclusive lock of ours, fenced or not, excludes theirs and is excluded by
//! theirs, on one node and (node-redlock) over three Redlock nodes; a foreign client cannot
//! release ours; our waiter notices a foreign release, which announces nothing, within its
//! polling interval; and a counter that all of them increment under the lock loses no update.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{Lock, LockClient, LockConfig, LockError};
use lock_tests::{
    Foreign, Interop, RedisMasters, RedisServer, SCHEDULING_SLACK, Worker, bounded, client,
    config_field, lock_keys, unique_key, wait_until_async,
};

/// A foreign client's answer to one command: its attempt or release (a round trip per node).
const ANSWER: Duration = Duration::from_secs(5);
/// A foreign holder's ttl when it lets go by itself: longer than any test holds.
const FOREIGN_TTL: Duration = Duration::from_secs(30);
/// A foreign holder's ttl when it is left to expire.
const SHORT_TTL: Duration = Duration::from_millis(400);
/// The longest pause between two attempts of a waiter with the default `retry_delay` (100 ms)
/// and `retry_jitter` (0.5): 2 x 100 ms x 1.5 (the bound `LockConfig::retry_delay` documents).
const POLL: Duration = Duration::from_millis(300);
/// How long after a release that announced nothing our waiter is granted at the latest: its
/// next attempt (one pause, one request) and slack.
const NOTICE: Duration = POLL.saturating_add(SCHEDULING_SLACK);
/// One request of a client with the default timeouts: connect 1 s + response 500 ms.
const ONE_REQUEST: Duration = Duration::from_millis(1500);

/// `command`'s answer from `worker`, on a thread that may block (multi-thread runtime).
fn ask(worker: &mut Worker, command: &str) -> String {
    tokio::task::block_in_place(|| worker.ask(command, ANSWER))
}

/// Waits until a waiter of ours for `name` subscribed on one of `nodes`: its first attempt was
/// refused.
async fn until_waiting(nodes: &[&RedisServer], name: &str) {
    let channel = lock_keys(name).channel;
    wait_until_async(ANSWER, "our waiter subscribed", || {
        nodes.iter().any(|n| n.subscribers(&channel) > 0)
    })
    .await;
}

/// The installed foreign clients (`None`: the test is skipped), a node, and a client of ours on it.
fn on_one_node() -> Option<(Interop, RedisServer, LockClient)> {
    let interop = Interop::find()?;
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    Some((interop, server, locks))
}

fn key_type(node: &RedisServer, key: &str) -> String {
    redis::cmd("TYPE")
        .arg(key)
        .query(&mut node.admin())
        .unwrap()
}

/// The nodes of `nodes` that hold `key` as a plain string (our lock, fenced or not). A grant
/// needs a majority: a node whose foreign key was deleted or expired only after our attempt
/// reached it refused ours, and Redlock grants without it. No node holds the key as anything else.
fn holding<'a>(nodes: &[&'a RedisServer], key: &str, case: &str) -> Vec<&'a RedisServer> {
    let mut holding = Vec::new();
    for node in nodes {
        match key_type(node, key).as_str() {
            "string" => holding.push(*node),
            "none" => {}
            other => panic!("{case}: our key's type is {other}"),
        }
    }
    assert!(
        holding.len() > nodes.len() / 2,
        "{case}: ours holds {} of {} nodes",
        holding.len(),
        nodes.len()
    );
    holding
}

fn exists(node: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query(&mut node.admin())
        .unwrap()
}

/// The foreign client and ours on the lock `name` over `nodes`, both ways: a foreign holder
/// refuses ours at once and grants it on release; ours (`fencing` or not, a plain string on a
/// majority of nodes) refuses the foreign client; a foreign holder whose key expired and went to ours
/// cannot release ours.
async fn both_ways(
    interop: &Interop,
    foreign: Foreign,
    nodes: &[&RedisServer],
    locks: &LockClient,
    fencing: bool,
) {
    let case = format!("{foreign:?}, {} node(s), fencing {fencing}", nodes.len());
    let name = unique_key("interop:both-ways");
    let key = lock_keys(&name).lock;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port()).collect();
    let lock = || locks.lock(&name).fencing(fencing);

    let mut other = interop.start(foreign, &ports, &key, FOREIGN_TTL);
    assert_eq!(ask(&mut other, "try"), "held", "{case}");
    match lock().acquire().await {
        Err(LockError::Contended { waited, .. }) => assert!(waited < ANSWER, "{case}: {waited:?}"),
        other => panic!("{case}: a foreign holder, yet {other:?}"),
    }
    let waiting = tokio::spawn(lock().wait(FOREIGN_TTL).acquire());
    until_waiting(nodes, &name).await;
    assert_eq!(ask(&mut other, "release"), "released", "{case}");
    let released = Instant::now();
    let guard = bounded(NOTICE, &format!("{case}: our waiter"), waiting)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    eprintln!(
        "{case}: granted {:?} after the foreign release",
        released.elapsed()
    );
    assert_eq!(guard.fencing_token().is_some(), fencing, "{case}");

    assert_eq!(ask(&mut other, "try"), "refused", "{case}: ours holds");
    holding(nodes, &key, &case);
    guard.release().await.unwrap();

    let mut late = interop.start(foreign, &ports, &key, SHORT_TTL);
    assert_eq!(ask(&mut late, "try"), "held", "{case}");
    let guard = bounded(
        SHORT_TTL + NOTICE,
        &format!("{case}: ours after the foreign key expired"),
        lock().wait(FOREIGN_TTL).acquire(),
    )
    .await
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    let ours = holding(nodes, &key, &case);
    assert_eq!(
        ask(&mut late, "release"),
        "not-owned",
        "{case}: a late release"
    );
    for node in ours {
        assert!(exists(node, &key), "{case}: the late release deleted ours");
    }
    guard.release().await.unwrap();
    // A Redlock release returns once a majority confirmed it; the last node's part lands within
    // one request of that (checked at once, it failed with two busy loops beside the run).
    wait_until_async(
        ONE_REQUEST + SCHEDULING_SLACK,
        &format!("{case}: our release deleted the key on every node"),
        || nodes.iter().all(|node| !exists(node, &key)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_and_node_redlock_exclude_ours_and_are_excluded_on_one_node() {
    let Some((interop, server, locks)) = on_one_node() else {
        return;
    };
    for foreign in [Foreign::RedisPy, Foreign::NodeRedlock] {
        for fencing in [false, true] {
            both_ways(&interop, foreign, &[&server], &locks, fencing).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_and_our_redlock_exclude_each_other_over_three_nodes() {
    let Some(interop) = Interop::find() else {
        return;
    };
    let masters = RedisMasters::start(3);
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    let locks = client(LockConfig::redlock(masters.urls()));
    for fencing in [false, true] {
        both_ways(&interop, Foreign::NodeRedlock, &nodes, &locks, fencing).await;
    }
}

/// A redis-py holder lets go after holding for a while (so our waiter's pauses grew to their
/// longest): our waiter, which no message tells, is granted within its polling interval of the
/// release, however long it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_waiter_notices_a_release_that_announces_nothing_within_its_polling_interval() {
    let Some((interop, server, locks)) = on_one_node() else {
        return;
    };
    let name = unique_key("interop:notice");
    let key = lock_keys(&name).lock;
    let mut other = interop.start(Foreign::RedisPy, &[server.port()], &key, FOREIGN_TTL);
    let mut took = Vec::new();
    for hold in [100, 700, 1500, 2500, 3500].map(Duration::from_millis) {
        assert_eq!(ask(&mut other, "try"), "held");
        let waiting = tokio::spawn(locks.lock(&name).wait(FOREIGN_TTL).acquire());
        until_waiting(&[&server], &name).await;
        // The foreign holder's critical section: what our waiter's pauses grow through.
        tokio::time::sleep(hold).await;
        assert_eq!(ask(&mut other, "release"), "released");
        let released = Instant::now();
        let guard = bounded(FOREIGN_TTL, "our waiter", waiting)
            .await
            .unwrap()
            .unwrap();
        took.push(released.elapsed());
        guard.release().await.unwrap();
    }
    eprintln!("granted after the foreign release: {took:?}");
    let slowest = took.iter().max().copied().unwrap_or_default();
    assert!(
        slowest <= NOTICE,
        "granted {took:?} after releases that announced nothing; the bound is {NOTICE:?}"
    );
}

/// Rust tasks, a redis-py process and a node-redlock process each add 1 to one counter,
/// `INCREMENTS` times, by `GET` and `SET` under the lock: no update is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_incremented_under_the_lock_by_every_language_loses_no_update() {
    const INCREMENTS: u64 = 25;
    const RUST_TASKS: u64 = 2;
    let Some(interop) = Interop::find() else {
        return;
    };
    let server = RedisServer::start();
    let name = unique_key("interop:counter");
    let key = lock_keys(&name).lock;
    let counter = format!("counter:{name}");
    let total = INCREMENTS * (RUST_TASKS + 2);
    // Each increment waits at most for one pause of ours after a foreign release (the foreign
    // clients ask every 10 ms, and our releases wake our waiters).
    let bound = NOTICE * u32::try_from(total).unwrap();
    let started = Instant::now();

    let mut foreign = Vec::new();
    for kind in [Foreign::RedisPy, Foreign::NodeRedlock] {
        let mut worker = interop.start(kind, &[server.port()], &key, FOREIGN_TTL);
        let command = format!("count {counter} {INCREMENTS}");
        foreign.push(tokio::task::spawn_blocking(move || {
            worker.ask(&command, bound)
        }));
    }
    let mut ours = tokio::task::JoinSet::new();
    for _ in 0..RUST_TASKS {
        let locks = client(LockConfig::single(server.url()));
        let (name, counter) = (name.clone(), counter.clone());
        let mut conn = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        ours.spawn(async move {
            for _ in 0..INCREMENTS {
                let guard = locks.lock(&name).wait(bound).acquire().await?;
                let value: Option<u64> = redis::cmd("GET")
                    .arg(&counter)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let () = redis::cmd("SET")
                    .arg(&counter)
                    .arg(value.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        });
    }
    bounded(bound, "our increments", async {
        while let Some(done) = ours.join_next().await {
            done.unwrap().unwrap();
        }
    })
    .await;
    for done in foreign {
        assert_eq!(done.await.unwrap(), "counted");
    }
    let count: u64 = redis::cmd("GET")
        .arg(&counter)
        .query(&mut server.admin())
        .unwrap();
    eprintln!("{total} increments in {:?}", started.elapsed());
    assert_eq!(count, total, "updates lost");
}

/// Our locks of other shapes on the same name. A fair lock's key is a plain lock key (its line
/// is in keys of its own), refused as one; a shared lock and a semaphore keep a sorted set in the
/// lock's key, which a foreign `SET NX` finds there (refused, no error); each key of a lock of
/// several keys is a plain lock key, refused as one too. The other way, a key that redis-py
/// holds refuses our fair and shared locks and our lock of several keys (`Contended`), and our
/// semaphore of the key says the key is used as another kind of lock (`Config { field:
/// "permits" }`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_fair_and_shared_locks_semaphores_and_multi_key_locks_and_redis_py_exclude_each_other()
{
    let Some((interop, server, locks)) = on_one_node() else {
        return;
    };
    let [fair, shared, permits, first, second] = ["fair", "shared", "permits", "many-a", "many-b"]
        .map(|s| unique_key(&format!("interop:{s}")));
    let fair_lock = || locks.lock(&fair).fair(true);
    let shared_lock = || locks.lock(&shared).shared(true);
    let semaphore = || locks.lock(&permits).permits(2);
    let many = || locks.lock_many([&first, &second]);
    let shapes: [(&dyn Fn() -> Lock, &str, &str); 4] = [
        (&fair_lock, &fair, "string"),
        (&shared_lock, &shared, "zset"),
        (&semaphore, &permits, "zset"),
        (&many, &first, "string"),
    ];
    for (lock, name, kind) in shapes {
        let key = lock_keys(name).lock;
        let mut other = interop.start(Foreign::RedisPy, &[server.port()], &key, FOREIGN_TTL);
        assert_eq!(ask(&mut other, "try"), "held", "{name}");
        let refused = lock().acquire().await;
        if name == permits {
            assert_eq!(config_field(refused), "permits", "{name}");
        } else {
            assert!(
                matches!(refused, Err(LockError::Contended { .. })),
                "{name}: {refused:?}"
            );
        }
        assert_eq!(ask(&mut other, "release"), "released", "{name}");

        let guard = lock().acquire().await.unwrap();
        assert_eq!(key_type(&server, &key), kind, "{name}");
        assert_eq!(ask(&mut other, "try"), "refused", "{name}");
        guard.release().await.unwrap();
        assert_eq!(ask(&mut other, "try"), "held", "{name}: after our release");
        assert_eq!(ask(&mut other, "release"), "released", "{name}");
    }
}
