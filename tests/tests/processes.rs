//! Several OS processes contending for one lock on one Redis node: mutual exclusion of a
//! read-modify-write counter, sync and async callers mixed, and fencing tokens that only grow,
//! proven from the grant history every worker records (and the history checker shown to fail).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisServer, Worker, finish_all, history, lock_keys, unique_key, wait_until};

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

    let (grants, violations, lost) =
        history::gather(&outputs, &modes, usize::try_from(ITERATIONS).unwrap());

    let counter: Option<i64> = redis::cmd("GET")
        .arg(format!("{data}:counter"))
        .query(&mut server.admin())
        .unwrap();
    let fences: BTreeSet<u64> = grants.iter().map(|g| g.fence).collect();
    eprintln!(
        "{WORKERS} processes x {ITERATIONS} increments: {took:?} in total, {:.2} ms per grant \
         (hand-off included), counter {counter:?}, violations {violations}, lost {lost}, \
         fences {}..={}",
        took.as_secs_f64() * 1000.0 / (WORKERS as f64 * ITERATIONS as f64),
        fences.first().copied().unwrap_or(0),
        fences.last().copied().unwrap_or(0),
    );
    assert_eq!(violations, 0, "critical sections overlapped");
    assert_eq!(lost, 0, "locks were lost during short critical sections");
    assert_eq!(
        counter,
        Some(600),
        "increments were lost: mutual exclusion broken"
    );
    assert!(
        grants.iter().all(|g| g.fence > 0),
        "a grant had no fencing token"
    );
    // No two grants at once, tokens strictly growing in grant order, across all processes.
    if let Err(violation) = history::check(&grants) {
        panic!("{violation}");
    }
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
        LockClient::new(LockConfig::single(server.url()).fencing(true)).unwrap(),
        LockClient::new(LockConfig::single(server.url()).fencing(true)).unwrap(),
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

/// The history checker can fail: a worker's lock key is deleted while it is inside its critical
/// section (held for 3s), a second worker is granted the lock meanwhile, and the checker names
/// exactly these two grants.
/// Two reader processes hold one read lock, a third an exclusive one: this process reads back
/// who holds each, by process id and program, with the default owner name `host:pid`, recorded
/// between the processes' start and their grant.
#[tokio::test(flavor = "multi_thread")]
async fn another_process_sees_which_processes_hold_a_lock() {
    let server = RedisServer::start();
    let (shared, exclusive) = (
        unique_key("processes:owners-r"),
        unique_key("processes:owners-w"),
    );
    let spawned = std::time::SystemTime::now();
    let holder = |key: &str, kind: &str| {
        let mut worker = Worker::spawn(
            env!("CARGO_BIN_EXE_holder"),
            &[server.url().as_str(), key, "30000", kind],
        );
        let line = worker.next_line(Duration::from_secs(10));
        assert!(line.starts_with("acquired"), "the holder said {line:?}");
        worker
    };
    let readers = [holder(&shared, "read"), holder(&shared, "read")];
    let writer = holder(&exclusive, "write");
    let granted = std::time::SystemTime::now();
    let client = LockClient::new(LockConfig::single(server.url()).fencing(true)).unwrap();

    let info = client.inspect(&shared).await.unwrap().expect("held");
    let mut pids: Vec<u32> = info.owners.iter().map(|o| o.pid).collect();
    pids.sort_unstable();
    let mut expected: Vec<u32> = readers.iter().map(Worker::pid).collect();
    expected.sort_unstable();
    assert_eq!(pids, expected, "{info:?}");
    let info = client.inspect(&exclusive).await.unwrap().expect("held");
    let [owner] = info.owners.as_slice() else {
        panic!("one owner: {info:?}");
    };
    assert_eq!(owner.pid, writer.pid());
    assert_eq!(owner.program, "holder");
    assert_eq!(owner.name, format!("{}:{}", owner.host, owner.pid));
    let since = owner.since.expect("a time");
    assert!(
        spawned <= since + Duration::from_millis(1) && since <= granted,
        "{owner:?}"
    );
}

#[test]
fn the_history_checker_reports_a_double_grant() {
    let server = RedisServer::start();
    let lock_key = unique_key("processes:double");
    let data = unique_key("processes:double-data");
    let worker = |hold: &[&str]| {
        let mut args = vec![server.url(), lock_key.clone(), data.clone(), "1".into()];
        args.extend(["sync"].iter().chain(hold).map(|s| (*s).to_owned()));
        Worker::spawn(env!("CARGO_BIN_EXE_counter_worker"), &args)
    };
    let mut first = worker(&["3000"]);
    let mut admin = server.admin();
    wait_until(Duration::from_secs(20), "the first worker inside", || {
        redis::cmd("GET")
            .arg(format!("{data}:inside"))
            .query::<Option<i64>>(&mut admin)
            .unwrap()
            == Some(1)
    });
    let deleted: i64 = redis::cmd("DEL")
        .arg(lock_keys(&lock_key).lock)
        .query(&mut admin)
        .unwrap();
    assert_eq!(deleted, 1, "the first worker's lock key was not there");
    let mut second = worker(&[]);
    let second_out = second.finish(Duration::from_secs(20));
    second_out.assert_success("second worker");
    assert!(
        first.is_running(),
        "the first worker left its critical section before the second one got in"
    );
    let first_out = first.finish(Duration::from_secs(20));
    first_out.assert_success("first worker");

    let grants: Vec<_> = [&first_out, &second_out]
        .iter()
        .flat_map(|out| history::grants(&out.stdout))
        .collect();
    assert_eq!(grants.len(), 2, "{grants:?}");
    let violation = history::check(&grants).expect_err("the checker missed the double grant");
    eprintln!("{violation}");
    match violation {
        history::Violation::Overlap {
            first: held,
            second: granted,
        } => {
            assert_eq!(held.pid, first.pid());
            assert_eq!(granted.pid, second.pid());
        }
        other => panic!("expected an overlap, got {other}"),
    }
}
