//! Two processes x four tasks transferring money between five wallets in opposite directions, each
//! transfer under one lock over both wallets (`Lock::many`), for ten seconds: on one Redis node and
//! on Redlock and on Redis Cluster (where the two wallets of a transfer are mostly in slots of
//! different masters: the lock takes them slot by slot). No deadlock (every call answers within its 5s wait, none is refused), no two
//! holders of a wallet at once (grant history), and not a unit of money created or lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lock_tests::{
    RedisCluster, RedisMasters, RedisServer, Worker, finish_all, history, lock_keys, unique_key,
};

const WALLETS: u64 = 5;
const TASKS: u64 = 4;
const START_BALANCE: i64 = 1000;
const RUN_FOR: Duration = Duration::from_secs(10);
/// The workers' `wait`: a call that took longer than this (plus one request) did not answer in time.
const WAIT: Duration = Duration::from_secs(5);
const CALL_SLACK: Duration = Duration::from_secs(2);

/// One run at a time: on a small machine two of them would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What a worker said on its `transfers=` line: (transfers, contended, slowest call).
fn counts(stdout: &[String]) -> (u64, u64, Duration) {
    let line = stdout
        .iter()
        .find_map(|line| line.strip_prefix("transfers="))
        .unwrap_or_else(|| panic!("no transfers line in {stdout:?}"));
    let numbers: Vec<u64> = line
        .split(' ')
        .map(|field| field.rsplit('=').next().unwrap().parse().unwrap())
        .collect();
    let [transfers, contended, max_call_ms] = numbers[..] else {
        panic!("bad transfers line: {line:?}");
    };
    (transfers, contended, Duration::from_millis(max_call_ms))
}

/// Runs the two workers in `mode` against `lock_urls`, the wallets on `data`, and checks the
/// outcome; `lock_nodes` must hold no lock key afterwards.
fn transfers(mode: &str, lock_urls: &[String], data: &RedisServer, lock_nodes: &[&RedisServer]) {
    transfers_of(mode, lock_urls, data, lock_nodes, &unique_key("transfers"));
}

fn transfers_of(
    mode: &str,
    lock_urls: &[String],
    data: &RedisServer,
    lock_nodes: &[&RedisServer],
    prefix: &str,
) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let wallet = |w: u64| format!("{prefix}:wallet:{w}");
    let mut admin = data.admin();
    for w in 0..WALLETS {
        let () = redis::cmd("SET")
            .arg(wallet(w))
            .arg(START_BALANCE)
            .query(&mut admin)
            .unwrap();
    }

    let started = Instant::now();
    let mut workers: Vec<Worker> = ["up", "down"]
        .iter()
        .map(|direction| {
            Worker::spawn(
                env!("CARGO_BIN_EXE_transfer_worker"),
                &[
                    mode,
                    &lock_urls.join(","),
                    &data.url(),
                    prefix,
                    &WALLETS.to_string(),
                    &TASKS.to_string(),
                    &RUN_FOR.as_secs().to_string(),
                    direction,
                ],
            )
        })
        .collect();
    // A worker stuck in a deadlock never exits: it is killed here and the test fails.
    let outputs = finish_all(&mut workers, RUN_FOR + WAIT + CALL_SLACK * 2);
    let took = started.elapsed();

    let mut grants = Vec::new();
    let mut total = 0;
    for (out, direction) in outputs.iter().zip(["up", "down"]) {
        out.assert_success(&format!("{mode} worker ({direction})"));
        let (transfers, contended, max_call) = counts(&out.stdout);
        let (violations, lost) = history::summary(&out.stdout);
        let own = history::grants(&out.stdout);
        eprintln!(
            "{mode} {direction}: {transfers} transfers, slowest call {max_call:?}, \
             contended {contended}, violations {violations}, lost {lost}"
        );
        assert!(transfers > 0, "the {direction} worker made no transfer");
        assert_eq!(
            contended, 0,
            "{direction}: calls ran out of their {WAIT:?} wait"
        );
        assert!(
            max_call <= WAIT + CALL_SLACK,
            "{direction}: a call took {max_call:?}"
        );
        assert_eq!(
            violations, 0,
            "{direction}: two holders of a wallet at once"
        );
        assert_eq!(lost, 0, "{direction}: locks lost during short transfers");
        assert_eq!(
            own.len(),
            usize::try_from(2 * transfers).unwrap(),
            "one grant line per wallet of each transfer"
        );
        total += transfers;
        grants.extend(own);
    }
    eprintln!("{mode}: {total} transfers in {took:?}");
    if let Err(violation) = history::check(&grants) {
        panic!("{violation}");
    }

    let balances: Vec<Option<i64>> = (0..WALLETS)
        .map(|w| redis::cmd("GET").arg(wallet(w)).query(&mut admin).unwrap())
        .collect();
    let sum: i64 = balances.iter().map(|b| b.unwrap()).sum();
    assert_eq!(
        sum,
        START_BALANCE * i64::try_from(WALLETS).unwrap(),
        "money created or lost: {balances:?}"
    );
    assert!(balances.iter().all(|b| b.unwrap() >= 0), "{balances:?}");
    // Every transfer wrote both versions once: a lost update would leave the sum short.
    let versions: u64 = (0..WALLETS)
        .map(|w| {
            redis::cmd("GET")
                .arg(format!("{}:version", wallet(w)))
                .query::<Option<u64>>(&mut admin)
                .unwrap()
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(versions, 2 * total);
    for node in lock_nodes {
        for w in 0..WALLETS {
            let lock = lock_keys(&wallet(w)).lock;
            assert!(node.keys(&lock).is_empty(), "{lock} left behind");
        }
    }
}

#[test]
fn opposite_transfers_on_one_node_neither_deadlock_nor_overlap() {
    let server = RedisServer::start();
    transfers("single", &[server.url()], &server, &[&server]);
}

/// Three masters, not five: two processes, two cores.
#[test]
fn opposite_transfers_on_redlock_neither_deadlock_nor_overlap() {
    let masters = RedisMasters::start(3);
    let data = RedisServer::start();
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    transfers("redlock", &masters.urls(), &data, &nodes);
}

/// Redis Cluster: the five wallets' locks sit on all three masters (asserted), so most transfers
/// lock two slots of two masters, taken slot by slot in canonical order.
#[test]
fn opposite_transfers_on_a_cluster_neither_deadlock_nor_overlap() {
    let cluster = RedisCluster::start();
    let data = RedisServer::start();
    // A prefix whose wallets' lock keys are on every master.
    let prefix = (0..100)
        .map(|_| unique_key("transfers"))
        .find(|prefix| {
            let masters: std::collections::BTreeSet<u16> = (0..WALLETS)
                .map(|w| {
                    let lock = lock_keys(&format!("{prefix}:wallet:{w}")).lock;
                    cluster.master_of(&lock).port()
                })
                .collect();
            masters.len() == 3
        })
        .expect("a prefix spreading five wallets over three masters in 100 tries");
    let masters = cluster.masters();
    transfers_of("cluster", &cluster.urls(), &data, &masters, &prefix);
}
