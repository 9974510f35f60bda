//! The behaviour suite on Redis Cluster (3 masters, 3 replicas, one cluster for this binary),
//! and what only a cluster has: keys spread over the masters, multi-key locks within one slot
//! (shared hash tag) and across slots, sharded release notifications.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use std::collections::BTreeMap;
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisCluster, RedisStore, lock_keys, unique_key, wait_until_async};

fn config() -> LockConfig {
    LockConfig::cluster(RedisCluster::shared().urls())
}

fn fixture() -> behaviour::Fx {
    let cluster = RedisCluster::shared();
    behaviour::Fx::on(config(), vec![Box::new(cluster)])
}

behaviour_tests!(fixture());
kind_tests!(fixture());

/// Locks of different names land on all three masters (the distribution is printed), each
/// lock's keys on its slot's master only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_all_three_masters() {
    let _turn = behaviour::turn_beside_others().await;
    let cluster = RedisCluster::shared();
    let client = LockClient::new(config()).unwrap();
    let mut guards = Vec::new();
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    for i in 0..30 {
        let key = unique_key(&format!("cl:spread:{i}"));
        guards.push(client.lock(&key).acquire().await.unwrap());
        let lock = lock_keys(&key).lock;
        let master = cluster.master_of(&lock);
        assert_eq!(master.keys(&lock), [lock.as_str()], "on its slot's master");
        *per_master.entry(master.port()).or_default() += 1;
    }
    eprintln!("locks per master (port: count): {per_master:?}");
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Two keys sharing a hash tag share a slot: one script call takes both (one EVALSHA more on
/// that master, none elsewhere). Keys in different slots are taken slot by slot, and a refusal
/// on the second slot gives back the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_locks_in_one_slot_and_across_slots() {
    // Alone: counts the scripts the masters run.
    let _turn = behaviour::turn_alone().await;
    let cluster = RedisCluster::shared();
    let (a, b) = (
        LockClient::new(config()).unwrap(),
        LockClient::new(config()).unwrap(),
    );
    let tag = unique_key("cl:tag");
    let (k1, k2) = (format!("{{{tag}}}:from"), format!("{{{tag}}}:to"));
    let (l1, l2) = (lock_keys(&k1).lock, lock_keys(&k2).lock);
    assert_eq!(cluster.slot_of(&l1), cluster.slot_of(&l2));
    // Warm the connection so that only the acquire counts.
    a.inspect(&k1).await.unwrap();
    let before = cluster.command_calls("evalsha") + cluster.command_calls("eval");
    let both = a
        .lock_many([k1.clone(), k2.clone()])
        .acquire()
        .await
        .unwrap();
    let after = cluster.command_calls("evalsha") + cluster.command_calls("eval");
    assert_eq!(after - before, 1, "one script call for one slot");
    assert_eq!(cluster.master_of(&l1).keys(&l1), [l1.as_str()]);
    assert_eq!(cluster.master_of(&l2).keys(&l2), [l2.as_str()]);
    both.release().await.unwrap();

    // Across slots: the second key is held by `b`; `a`'s lock over both fails on it and gives
    // back the first.
    let (x, y) = loop_distinct_slots(cluster);
    let held = b.lock(&y).acquire().await.unwrap();
    let err = a
        .lock_many([x.clone(), y.clone()])
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err}");
    let lx = lock_keys(&x).lock;
    assert!(
        cluster.keys(&lx).is_empty(),
        "the first slot's key was given back"
    );
    held.release().await.unwrap();
    let both = a.lock_many([x.clone(), y.clone()]).fencing(true).acquire();
    let both = both.await.unwrap();
    assert!(both.fencing_token_of(&x).is_some() && both.fencing_token_of(&y).is_some());
    assert_eq!(cluster.keys(&lx), [lx.as_str()]);
    both.release().await.unwrap();
}

/// Two fresh names whose lock keys are in slots of different masters, `x` sorting first.
fn loop_distinct_slots(cluster: &RedisCluster) -> (String, String) {
    let x = unique_key("cl:a");
    let master = cluster.master_of(&lock_keys(&x).lock).port();
    for i in 0..1000 {
        let y = unique_key(&format!("cl:b{i}"));
        if cluster.master_of(&lock_keys(&y).lock).port() != master {
            return (x, y);
        }
    }
    panic!("no name on another master in 1000 tries");
}

/// A release wakes its waiter through a sharded channel on the lock's own master: no other
/// master has a subscriber to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_use_the_shard_channel() {
    let _turn = behaviour::turn_beside_others().await;
    let cluster = RedisCluster::shared();
    let (a, b) = (
        LockClient::new(config()).unwrap(),
        LockClient::new(config()).unwrap(),
    );
    let key = unique_key("cl:shard");
    let channel = lock_keys(&key).channel;
    let held = a.lock(&key).acquire().await.unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.lock(&key).wait(Duration::from_secs(10)).acquire().await })
    };
    let master = cluster.master_of(&channel).port();
    wait_until_async(Duration::from_secs(5), "the waiter subscribed", || {
        cluster.subscribers(&channel) == 1
    })
    .await;
    for m in cluster.masters() {
        // On the release channel, or on its own once it queued (see `shard_subscribers`); for
        // a moment on both while it moves.
        let n = m.shard_subscribers(&channel);
        assert_eq!(n > 0, m.port() == master, "port {}: {n}", m.port());
    }
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken, not polled"
    );
    guard.release().await.unwrap();
}

/// `min_replicas(1)`: when `acquire` returns, the lock key is already on the master's replica
/// (`WAIT` counted it); renewals are checked the same way and keep a short lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_grants_are_on_the_replica_when_acquire_returns() {
    let _turn = behaviour::turn_beside_others().await;
    let cluster = RedisCluster::shared();
    let client = LockClient::new(config().min_replicas(1)).unwrap();
    let key = unique_key("cl:replicated");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_millis(600);
    let guard = client.lock(&key).ttl(ttl).acquire().await.unwrap();
    let replica = cluster.replica_of(cluster.master_of(&lock));
    assert_eq!(replica.keys(&lock), [lock.as_str()]);
    tokio::time::sleep(ttl * 3).await;
    assert!(!guard.is_lost(), "renewed with replica acknowledgements");
    guard.release().await.unwrap();
}

/// No cluster node answers: `Unavailable` naming the cluster, never `Contended`, within wait +
/// one request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_unavailable_never_contended() {
    let seeds = [
        format!("redis://127.0.0.1:{}/", lock_tests::free_port()),
        format!("redis://127.0.0.1:{}/", lock_tests::free_port()),
    ];
    let config = LockConfig::cluster(seeds)
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200));
    let client = LockClient::new(config).unwrap();
    let started = std::time::Instant::now();
    let wait = Duration::from_millis(300);
    match client
        .lock(unique_key("cl:down"))
        .wait(wait)
        .acquire()
        .await
    {
        Err(lock_runtime::LockError::Unavailable { causes, .. }) => {
            assert!(
                causes.iter().all(|c| c.node.starts_with("cluster(")),
                "{causes:?}"
            );
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("granted by no server"),
    }
    assert!(
        started.elapsed() < wait + Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
