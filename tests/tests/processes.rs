//! Several OS processes contending for one lock on one Redis node: mutual exclusion of a
//! read-modify-write counter, sync and async callers mixed, and fencing tokens that only grow.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisServer, Worker, finish_all, lock_keys, unique_key};

const WORKERS: usize = 6;
const ITERATIONS: u64 = 100;
const WORKERS_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn six_processes_increment_a_counter_without_overlap() {
    let server = RedisServer::start();
    let lock_key = unique_key("processes:counter");
    let data = unique_key("processes:data");

    let started = Instant::now();
    let modes: Vec<&str> = (0..WORKERS)
        .map(|i| if i % 2 == 0 { "sync" } else { "async" })
        .collect();
    let mut workers: Vec<Worker> = modes
        .iter()
        .map(|mode| {
            Worker::spawn(
                env!("CARGO_BIN_EXE_counter_worker"),
                &[
                    server.url().as_str(),
                    &lock_key,
                    &data,
                    &ITERATIONS.to_string(),
                    mode,
                ],
            )
        })
        .collect();
    // Bounded wait for all of them; on timeout every child is killed (Drop) and the test fails.
    let outputs = finish_all(&mut workers, WORKERS_TIMEOUT);
    let took = started.elapsed();

    let mut fences = Vec::new();
    let mut violations = 0;
    let mut lost = 0;
    for (out, mode) in outputs.iter().zip(&modes) {
        out.assert_success(&format!("{mode} worker"));
        let mut own = Vec::new();
        for line in &out.stdout {
            if let Some(n) = line.strip_prefix("fence ") {
                own.push(n.parse::<u64>().expect("fence number"));
            } else if let Some(rest) = line.strip_prefix("violations=") {
                let (v, l) = rest.split_once(" lost=").expect("summary line");
                violations += v.parse::<u64>().expect("violations");
                lost += l.parse::<u64>().expect("lost");
            }
        }
        assert_eq!(
            own.len(),
            usize::try_from(ITERATIONS).unwrap(),
            "{mode} worker reported {} grants\nstderr: {}",
            own.len(),
            out.stderr
        );
        assert!(
            own.windows(2).all(|w| w[0] < w[1]),
            "fencing tokens seen by one {mode} worker are not increasing: {own:?}"
        );
        fences.extend(own);
    }

    let counter: Option<i64> = redis::cmd("GET")
        .arg(format!("{data}:counter"))
        .query(&mut server.admin())
        .unwrap();
    let distinct: BTreeSet<u64> = fences.iter().copied().collect();
    eprintln!(
        "{WORKERS} processes x {ITERATIONS} increments: {took:?} in total, {:.2} ms per grant \
         (hand-off included), counter {counter:?}, violations {violations}, lost {lost}, \
         fences {}..={}",
        took.as_secs_f64() * 1000.0 / (WORKERS as f64 * ITERATIONS as f64),
        distinct.first().copied().unwrap_or(0),
        distinct.last().copied().unwrap_or(0),
    );
    assert_eq!(violations, 0, "critical sections overlapped");
    assert_eq!(lost, 0, "locks were lost during short critical sections");
    assert_eq!(
        counter,
        Some(600),
        "increments were lost: mutual exclusion broken"
    );
    assert!(
        fences.iter().all(|&f| f > 0),
        "a grant had no fencing token"
    );
    assert_eq!(
        distinct.len(),
        fences.len(),
        "two grants across processes carried the same fencing token"
    );
    assert!(
        server.keys(&lock_keys(&lock_key).lock).is_empty(),
        "the lock is still held after every worker released it"
    );
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_across_1000_grants() {
    let server = RedisServer::start();
    // Two clients taking turns: the counter lives in Redis, not in one client.
    let clients = [
        LockClient::new(LockConfig::single(server.url())).unwrap(),
        LockClient::new(LockConfig::single(server.url())).unwrap(),
    ];
    let key = unique_key("processes:fence");
    let started = Instant::now();
    let mut last = 0u64;
    for i in 0..1000 {
        let guard = clients[i % 2]
            .lock(&key)
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("grant #{i}: {e}"));
        let fence = guard
            .fencing_token()
            .unwrap_or_else(|| panic!("grant #{i} has no fencing token"));
        assert!(
            fence > last,
            "grant #{i}: fencing token {fence} after {last}"
        );
        last = fence;
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("release #{i}: {e}"));
    }
    eprintln!(
        "1000 sequential grants in {:?} (last fencing token {last})",
        started.elapsed()
    );
    assert!(server.keys(&lock_keys(&key).lock).is_empty());
}
