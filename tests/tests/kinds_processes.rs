//! The lock kinds across OS processes on one Redis node, proven from the section history every
//! worker task records (`lock_tests::sections`): a fair lock grants eight workers in arrival
//! order, readers overlap and never meet a writer that still gets its turn, permits never admit
//! more than their count, and a SIGKILLed waiter or holder is out of the way within its ttl.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::history::{self, Grant};
use lock_tests::sections::{self, Kind, Section};
use lock_tests::{RedisMasters, RedisServer, Worker, finish_all, unique_key, until_queued};

const WORKERS_TIMEOUT: Duration = Duration::from_secs(180);
/// Two asks closer than this are concurrent: the clock is read before the request is sent, and
/// on a loaded machine the sender can lose its core for a scheduler tick in between. The fair
/// workers hold for twice as long, so that consecutive asks (each follows a release) are further
/// apart than this and every inversion between them counts.
const SLACK: Duration = Duration::from_millis(10);

/// The stress tests take turns: each fills both cores on its own.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one `kinds_worker` per item of `processes` (its task list) on `key` at `url` (several,
/// comma-separated: Redlock) until it has been granted `total` times, and returns every section,
/// after checking that each worker ended well and saw no violation and no lost lock.
fn run_workers(url: &str, key: &str, total: usize, processes: &[&str]) -> Vec<Section> {
    let data = unique_key("kinds-processes:data");
    let mut workers: Vec<Worker> = processes
        .iter()
        .map(|tasks| {
            Worker::spawn(
                env!("CARGO_BIN_EXE_kinds_worker"),
                &[url, key, &data, &total.to_string(), tasks],
            )
        })
        .collect();
    let outputs = finish_all(&mut workers, WORKERS_TIMEOUT);
    let mut all = Vec::new();
    for (out, tasks) in outputs.iter().zip(processes) {
        out.assert_success(&format!("worker {tasks}"));
        assert_eq!(
            history::summary(&out.stdout),
            (0, 0),
            "worker {tasks} saw violations or lost locks\nstderr: {}",
            out.stderr
        );
        all.extend(sections::sections(&out.stdout));
    }
    assert_eq!(all.len(), total, "sections recorded");
    all
}

fn percentile(mut values: Vec<u64>, p: f64) -> Duration {
    values.sort_unstable();
    let at = ((values.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_nanos(values.get(at).copied().unwrap_or(0))
}

/// The gap between each release and the next grant, in grant order.
fn hand_offs(sections: &[Section]) -> Vec<u64> {
    let mut by_grant: Vec<&Section> = sections.iter().collect();
    by_grant.sort_by_key(|s| s.acquired_ns);
    by_grant
        .windows(2)
        .map(|w| w[1].acquired_ns.saturating_sub(w[0].released_ns))
        .collect()
}

/// What 8 fair workers in 2 processes saw over `total` grants of one key at `url`, after
/// checking that no two grants overlapped and fencing tokens grew: the grants out of arrival
/// order, owner changes out of consecutive pairs, and Jain's index of the grants per worker.
fn fair_run(url: &str, setup: &str, total: usize) -> (usize, (usize, usize), f64) {
    let _turn = one_at_a_time();
    let key = unique_key("kinds-processes:fair");
    let started = Instant::now();
    let all = run_workers(url, &key, total, &["fair@20,fair@20,fair@20,fair@20"; 2]);
    let took = started.elapsed();

    let grants: Vec<Grant> = all
        .iter()
        .map(|s| Grant {
            pid: 0,
            key: key.clone(),
            fence: s.fence,
            acquired_ns: s.acquired_ns,
            released_ns: s.released_ns,
        })
        .collect();
    if let Err(violation) = history::check(&grants) {
        panic!("{violation}");
    }
    let slack = u64::try_from(SLACK.as_nanos()).unwrap();
    let late = sections::out_of_order(&all, slack);
    for (granted, waiting) in late.iter().take(5) {
        eprintln!(
            "granted out of arrival order:\n  {granted}\n  while waiting since earlier: {waiting}"
        );
    }
    let (changes, pairs) = sections::owner_changes(&all);
    let shares = sections::per_holder(&all);
    let jain = sections::jain(shares.values().copied());
    let gaps = hand_offs(&all);
    eprintln!(
        "fair, {setup}, 8 workers in 2 processes: {total} grants in {took:?}; out of arrival order {}; \
         owner changes {changes}/{pairs}; shares {shares:?}, Jain {jain:.4}; hand-off p50 {:?} p99 {:?}",
        late.len(),
        percentile(gaps.clone(), 0.5),
        percentile(gaps, 0.99),
    );
    assert_eq!(shares.len(), 8, "every worker was granted the lock");
    (late.len(), (changes, pairs), jain)
}

/// 8 workers in 2 processes, 2,000 grants of one fair lock on one node: no overlap, fences
/// grow, no grant out of arrival order, every release hands the lock to another worker, and all
/// get a fair share (Jain's index).
#[test]
fn a_fair_lock_grants_eight_workers_in_arrival_order() {
    let server = RedisServer::start();
    let (late, (changes, pairs), jain) = fair_run(&server.url(), "1 node", 2000);
    assert_eq!(late, 0, "grants out of arrival order");
    assert_eq!(
        changes, pairs,
        "a release did not hand the lock to another worker"
    );
    assert!(jain >= 0.99, "Jain's fairness index {jain}");
}

/// The same on Redlock over 3 nodes (1,000 grants): a majority grants each hand-off, the order
/// is the gate node's line; measured, with the same fairness bound.
#[test]
fn a_fair_redlock_lock_grants_eight_workers_fairly() {
    let masters = RedisMasters::start(3);
    let (late, (changes, pairs), jain) =
        fair_run(&masters.urls().join(","), "Redlock, 3 nodes", 1000);
    eprintln!(
        "Redlock: {:.2}% of grants out of arrival order, {:.2}% owner changes",
        late as f64 * 100.0 / 1000.0,
        changes as f64 * 100.0 / pairs.max(1) as f64
    );
    assert!(jain >= 0.99, "Jain's fairness index {jain}");
}

/// A waiter SIGKILLed in the fair queue, first in line: the release hands it the lock, and the
/// next waiter gets it when the dead waiter's queue lease runs out, not later.
#[tokio::test]
async fn a_sigkilled_fair_waiter_delays_the_next_by_at_most_its_ttl() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("kinds-processes:fair-kill");
    let dead_ttl = Duration::from_millis(1500);
    let head = client
        .lock(&key)
        .fair(true)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let mut doomed = Worker::spawn(
        env!("CARGO_BIN_EXE_holder"),
        &[
            server.url(),
            key.clone(),
            dead_ttl.as_millis().to_string(),
            "fair".to_owned(),
        ],
    );
    until_queued(&client, &key, 1).await;
    let next = tokio::spawn({
        let lock = client
            .lock(&key)
            .fair(true)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(20));
        lock.acquire()
    });
    until_queued(&client, &key, 2).await;
    doomed.kill();
    let released = Instant::now();
    head.release().await.unwrap();
    let guard = next.await.unwrap().unwrap();
    let delay = released.elapsed();
    eprintln!(
        "a SIGKILLed fair waiter (queue lease {dead_ttl:?}) delayed the next one by {delay:?}"
    );
    assert!(
        delay <= dead_ttl + Duration::from_secs(1),
        "the next waiter got the lock {delay:?} after the release"
    );
    guard.release().await.unwrap();
}

/// 7 readers and a writer in 2 processes: readers overlap, the writer never meets anyone, and
/// when it comes while readers hold it waits for those readers only (new readers wait behind
/// it), so its longest wait stays near one reader hold.
#[test]
fn readers_overlap_and_a_writer_waits_about_one_reader_hold() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let key = unique_key("kinds-processes:rw");
    let reader_hold = Duration::from_millis(40);
    let started = Instant::now();
    let all = run_workers(
        &server.url(),
        &key,
        400,
        &[
            "read@40,read@40,read@40,write@5",
            "read@40,read@40,read@40,read@40",
        ],
    );
    let took = started.elapsed();

    if let Some((a, b)) = sections::exclusive_overlap(&all) {
        panic!("a writer held with someone else:\n  {a}\n  {b}");
    }
    let readers_at_once = sections::most_at_once(&all, |k| k == Kind::Shared);
    let writer_waits: Vec<u64> = all
        .iter()
        .filter(|s| s.kind == Kind::Exclusive)
        .map(Section::waited_ns)
        .collect();
    let longest = Duration::from_nanos(writer_waits.iter().copied().max().unwrap_or(0));
    eprintln!(
        "7 readers (hold {reader_hold:?}) and 1 writer in 2 processes: 400 sections in {took:?}; \
         {} by the writer; readers at once up to {readers_at_once}; writer wait p50 {:?}, longest {longest:?}",
        writer_waits.len(),
        percentile(writer_waits.clone(), 0.5),
    );
    assert!(readers_at_once >= 2, "readers never overlapped");
    assert!(
        writer_waits.len() >= 10,
        "the writer got in {} times",
        writer_waits.len()
    );
    // The writer waits for the readers inside (one reader hold) and for the wake-up; without
    // writer preference, readers that keep overlapping hold it off for most of the run.
    assert!(
        longest <= reader_hold * 5,
        "the writer waited {longest:?} with readers holding {reader_hold:?} each"
    );
}

/// 4 processes x 8 tasks on `permits = 3`: never more than 3 inside, and 3 reached; every
/// permit grant has its own fencing token.
#[test]
fn three_permits_among_thirty_two_tasks() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let key = unique_key("kinds-processes:permits");
    let tasks = ["permits=3@2"; 8].join(",");
    let started = Instant::now();
    let all = run_workers(&server.url(), &key, 600, &[tasks.as_str(); 4]);
    let took = started.elapsed();

    let at_once = sections::most_at_once(&all, |_| true);
    let fences: BTreeSet<u64> = all.iter().map(|s| s.fence).collect();
    eprintln!(
        "permits = 3, 4 processes x 8 tasks: 600 sections in {took:?}; at most {at_once} at once; \
         {} holders served",
        sections::per_holder(&all).len()
    );
    assert!(at_once <= 3, "{at_once} permits held at once");
    assert_eq!(at_once, 3, "the third permit was never used");
    assert_eq!(
        fences.len(),
        all.len(),
        "two permit grants shared a fencing token"
    );
    assert!(!fences.contains(&0), "a permit grant had no fencing token");
}

/// Three processes hold the three permits; one is SIGKILLed, and a waiter gets its permit when
/// its lease runs out, while the other two are still held.
#[tokio::test]
async fn a_sigkilled_permit_holder_returns_its_permit_within_its_ttl() {
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("kinds-processes:permit-kill");
    let ttl = Duration::from_millis(1500);
    let mut holders: Vec<Worker> = (0..3)
        .map(|_| {
            Worker::spawn(
                env!("CARGO_BIN_EXE_holder"),
                &[
                    server.url(),
                    key.clone(),
                    ttl.as_millis().to_string(),
                    "permits=3".to_owned(),
                ],
            )
        })
        .collect();
    for holder in &mut holders {
        let line = holder.next_line(Duration::from_secs(20));
        assert!(line.starts_with("acquired"), "{line}");
    }
    assert_eq!(holders_of(&client, &key).await, 3);
    let refused = client.lock(&key).permits(3).acquire().await;
    assert!(
        matches!(refused, Err(LockError::Contended { .. })),
        "{refused:?}"
    );

    holders[0].kill();
    let killed = Instant::now();
    let guard = client
        .lock(&key)
        .permits(3)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let delay = killed.elapsed();
    eprintln!("a SIGKILLed permit holder's permit (ttl {ttl:?}) came back after {delay:?}");
    assert!(
        delay <= ttl + Duration::from_secs(1),
        "the permit came back after {delay:?}"
    );
    assert_eq!(
        holders_of(&client, &key).await,
        3,
        "the other two permits are still held"
    );
    guard.release().await.unwrap();
}

async fn holders_of(client: &LockClient, key: &str) -> usize {
    client
        .inspect(key)
        .await
        .unwrap()
        .map_or(0, |info| info.holders)
}
