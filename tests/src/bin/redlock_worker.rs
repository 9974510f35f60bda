//! Test helper for `tests/redlock.rs`: read-modify-write increments of a counter under a Redlock
//! lock taken through `#[distributed_lock]` and the global client.
//!
//! Usage: `redlock_worker <lock-urls,comma-separated> <data-url> <lock-key> <data-prefix> <iterations>`.
//!
//! Each iteration calls a sync `#[distributed_lock]` fn (ttl 2s, wait 30s) whose body does, on the data
//! server (not one of the lock nodes): `INCR <data-prefix>:inside` (anything but 1 means another
//! process is in the critical section), `GET <data-prefix>:counter`, a short pause, `SET` it to the
//! value + 1, `DECR` the inside marker. Fencing is on. Prints one `lock_tests::history::Grant` line
//! per grant, then `violations=<v> lost=<l>`, and exits with 0 when every iteration ran, 2 on bad
//! arguments, 3 on a lock or Redis error (on stderr).

use std::process::ExitCode;
use std::time::Duration;

use lock_runtime::{LockConfig, LockError, distributed_lock};
use lock_tests::history::{Grant, now_ns};

#[derive(Debug)]
enum WorkerError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::Lock(err) => write!(f, "lock: {err}"),
            WorkerError::Redis(err) => write!(f, "data server: {err}"),
        }
    }
}

impl From<LockError> for WorkerError {
    fn from(err: LockError) -> Self {
        WorkerError::Lock(err)
    }
}

impl From<redis::RedisError> for WorkerError {
    fn from(err: redis::RedisError) -> Self {
        WorkerError::Redis(err)
    }
}

#[derive(Debug, Default)]
struct Report {
    grants: Vec<Grant>,
    violations: u64,
    lost: u64,
}

#[distributed_lock(key = "<lock_key>", ttl = "2s", wait = "30s", guard = held)]
fn increment(
    lock_key: &str,
    data: &mut redis::Connection,
    prefix: &str,
    pause: Duration,
    report: &mut Report,
) -> Result<(), WorkerError> {
    let acquired_ns = now_ns();
    let inside: i64 = redis::cmd("INCR")
        .arg(format!("{prefix}:inside"))
        .query(data)?;
    if inside != 1 {
        report.violations += 1;
    }
    let value: Option<u64> = redis::cmd("GET")
        .arg(format!("{prefix}:counter"))
        .query(data)?;
    std::thread::sleep(pause);
    let () = redis::cmd("SET")
        .arg(format!("{prefix}:counter"))
        .arg(value.unwrap_or(0) + 1)
        .query(data)?;
    let _: i64 = redis::cmd("DECR")
        .arg(format!("{prefix}:inside"))
        .query(data)?;
    if held.is_lost() {
        report.lost += 1;
    }
    report.grants.push(Grant::ending_now(
        held.key(),
        held.fencing_token(),
        acquired_ns,
    ));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [urls, data_url, lock_key, prefix, iterations] = args.as_slice() else {
        eprintln!(
            "usage: redlock_worker <lock-urls> <data-url> <lock-key> <data-prefix> <iterations>"
        );
        return ExitCode::from(2);
    };
    let Ok(iterations) = iterations.parse::<u64>() else {
        eprintln!("redlock_worker: iterations must be a number");
        return ExitCode::from(2);
    };
    if let Err(err) = lock_runtime::init(LockConfig::redlock(urls.split(',')).fencing(true)) {
        eprintln!("redlock_worker: {err}");
        return ExitCode::from(2);
    }
    let mut data = match redis::Client::open(data_url.as_str()).and_then(|c| c.get_connection()) {
        Ok(data) => data,
        Err(err) => {
            eprintln!("redlock_worker: data server: {err}");
            return ExitCode::from(3);
        }
    };
    let mut report = Report::default();
    for i in 0..iterations {
        // 0-999 µs, different per process and iteration.
        let pause =
            Duration::from_micros((i * 7919 + u64::from(std::process::id()) * 104_729) % 1000);
        if let Err(err) = increment(lock_key, &mut data, prefix, pause, &mut report) {
            eprintln!("redlock_worker ({}): {err}", std::process::id());
            return ExitCode::from(3);
        }
    }
    for grant in &report.grants {
        println!("{grant}");
    }
    println!("violations={} lost={}", report.violations, report.lost);
    ExitCode::SUCCESS
}
