//! Several OS processes contending for one lock on one Redis node: mutual exclusion of a
//! read-modify-write counter, sync and async callers mixed, and fencing tokens that only grow.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisServer, unique_key};

const WORKERS: usize = 6;
const ITERATIONS: u64 = 100;
const WORKERS_TIMEOUT: Duration = Duration::from_secs(120);

/// A child whose stdout and stderr are drained by threads (so a chatty child never blocks on a
/// full pipe), killed if still running when dropped.
struct Worker {
    mode: &'static str,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl Worker {
    fn spawn(url: &str, lock_key: &str, data: &str, mode: &'static str) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_counter_worker"))
            .args([url, lock_key, data, &ITERATIONS.to_string(), mode])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn counter_worker");
        let stdout = drain(child.stdout.take().expect("piped stdout"));
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        Worker {
            mode,
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// Output of a finished child (the pipes are closed once it exited).
    fn output(&mut self) -> (String, String) {
        let join = |h: Option<JoinHandle<String>>| h.map(|h| h.join().unwrap()).unwrap_or_default();
        (join(self.stdout.take()), join(self.stderr.take()))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn drain(mut pipe: impl std::io::Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

#[test]
fn six_processes_increment_a_counter_without_overlap() {
    let server = RedisServer::start();
    let lock_key = unique_key("processes:counter");
    let data = unique_key("processes:data");

    let started = Instant::now();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|i| {
            let mode = if i % 2 == 0 { "sync" } else { "async" };
            Worker::spawn(&server.url(), &lock_key, &data, mode)
        })
        .collect();

    // Bounded wait for all of them; on timeout every child is killed (Drop) and the test fails.
    let deadline = started + WORKERS_TIMEOUT;
    let mut statuses = vec![None; WORKERS];
    while statuses.iter().any(Option::is_none) {
        for (worker, status) in workers.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = worker.child.try_wait().expect("try_wait on a worker");
            }
        }
        if Instant::now() >= deadline {
            let unfinished = statuses.iter().filter(|s| s.is_none()).count();
            drop(workers);
            panic!("{unfinished} workers still running after {WORKERS_TIMEOUT:?}; killed");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();

    let mut fences = Vec::new();
    let mut violations = 0;
    let mut lost = 0;
    for (worker, status) in workers.iter_mut().zip(&statuses) {
        let (stdout, stderr) = worker.output();
        let status = status.expect("finished");
        assert!(
            status.success(),
            "{} worker exited with {status}\nstdout tail: {}\nstderr: {stderr}",
            worker.mode,
            stdout.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        );
        let mut own = Vec::new();
        for line in stdout.lines() {
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
            "{} worker reported {} grants\nstderr: {stderr}",
            worker.mode,
            own.len()
        );
        assert!(
            own.windows(2).all(|w| w[0] < w[1]),
            "fencing tokens seen by one {} worker are not increasing: {own:?}",
            worker.mode
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
        server.keys(&format!("lock:{{{lock_key}}}")).is_empty(),
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
    assert!(server.keys(&format!("lock:{{{key}}}")).is_empty());
}
