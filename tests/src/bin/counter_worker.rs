//! Test helper for `tests/processes.rs`: read-modify-write increments of a Redis counter under a lock.
//!
//! Usage: `counter_worker <redis-url> <lock-key> <data-prefix> <iterations> <sync|async> [hold-ms]`.
//!
//! Each iteration takes the lock (wait 10s), then `INCR <data-prefix>:inside` (anything but 1 means
//! another process is in the critical section: a violation), `GET <data-prefix>:counter`, sleeps
//! 0-1ms (or `hold-ms`), `SET` it to the value + 1, `DECR` the inside marker, and releases. `sync` uses
//! `acquire_blocking` from a plain `main` without any runtime; `async` runs on a tokio runtime
//! built here (what `#[tokio::main]` expands to) and uses `acquire().await`.
//!
//! With `LOCK_ETCD_ENDPOINTS` set, the lock is taken on etcd (`LockConfig::from_env`); the data
//! stays on Redis.
//!
//! Prints one `lock_tests::history::Grant` line per grant, then `violations=<v> lost=<l>`. Exits with 0 when every
//! iteration ran (violations are reported, not an exit code), 2 on bad arguments, 3 on a lock or
//! Redis error (with the error on stderr).

use std::process::ExitCode;
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig, LockError, LockGuard};
use lock_tests::history::{self, Grant, now_ns};

const WAIT: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(5);

struct Args {
    url: String,
    lock_key: String,
    inside: String,
    counter: String,
    iterations: u64,
    asynchronous: bool,
    hold: Option<Duration>,
}

#[derive(Default)]
struct Report {
    grants: Vec<Grant>,
    violations: u64,
    lost: u64,
}

fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        eprintln!(
            "usage: counter_worker <redis-url> <lock-key> <data-prefix> <iterations> <sync|async> [hold-ms]"
        );
        return ExitCode::from(2);
    };
    // With LOCK_ETCD_ENDPOINTS set, the lock lives on etcd (the data stays on Redis).
    let config = if std::env::var_os(lock_runtime::ENV_ETCD_ENDPOINTS).is_some() {
        LockConfig::from_env()
    } else {
        LockConfig::single(args.url.as_str()).fencing(true)
    };
    let client = match LockClient::new(config) {
        Ok(client) => client,
        Err(err) => {
            eprintln!("counter_worker: {err}");
            return ExitCode::from(2);
        }
    };
    let outcome = if args.asynchronous {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(run_async(&client, &args)),
            Err(err) => Err(format!("tokio runtime: {err}")),
        }
    } else {
        run_sync(&client, &args)
    };
    match outcome {
        Ok(report) => history::print_report(
            report.grants.iter().map(ToString::to_string),
            report.violations,
            report.lost,
        ),
        Err(err) => {
            eprintln!("counter_worker ({}): {err}", std::process::id());
            ExitCode::from(3)
        }
    }
}

fn parse_args() -> Option<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, lock_key, data, iterations, mode, hold) = match args.as_slice() {
        [url, lock_key, data, iterations, mode] => (url, lock_key, data, iterations, mode, None),
        [url, lock_key, data, iterations, mode, hold_ms] => (
            url,
            lock_key,
            data,
            iterations,
            mode,
            Some(Duration::from_millis(hold_ms.parse().ok()?)),
        ),
        _ => return None,
    };
    let asynchronous = match mode.as_str() {
        "sync" => false,
        "async" => true,
        _ => return None,
    };
    Some(Args {
        url: url.clone(),
        lock_key: lock_key.clone(),
        inside: format!("{data}:inside"),
        counter: format!("{data}:counter"),
        iterations: iterations.parse().ok()?,
        asynchronous,
        hold,
    })
}

/// `hold-ms`, or 0-999 µs, different per process and iteration (no RNG dependency needed).
fn pause(args: &Args, i: u64) -> Duration {
    args.hold.unwrap_or_else(|| {
        Duration::from_micros((i * 7919 + u64::from(std::process::id()) * 104_729) % 1000)
    })
}

/// Records what one grant saw: `inside` is the INCR result on entry, `acquired_ns` when the
/// acquire returned; called right before the release.
fn check(report: &mut Report, guard: &LockGuard, inside: i64, acquired_ns: u64) {
    report.grants.push(Grant::ending_now(
        guard.key(),
        guard.fencing_token(),
        acquired_ns,
    ));
    if inside != 1 {
        report.violations += 1;
        eprintln!(
            "counter_worker ({}): violation: {inside} holders inside",
            std::process::id()
        );
    }
}

fn released(report: &mut Report, result: Result<(), LockError>) -> Result<(), String> {
    match result {
        Ok(()) => Ok(()),
        Err(LockError::Lost { .. }) => {
            report.lost += 1;
            Ok(())
        }
        Err(err) => Err(format!("release: {err}")),
    }
}

fn run_sync(client: &LockClient, args: &Args) -> Result<Report, String> {
    let redis = redis::Client::open(args.url.as_str()).map_err(|e| e.to_string())?;
    let mut con = redis
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let mut report = Report::default();
    for i in 0..args.iterations {
        let guard = client
            .lock(args.lock_key.as_str())
            .ttl(TTL)
            .wait(WAIT)
            .acquire_blocking()
            .map_err(|e| format!("acquire #{i}: {e}"))?;
        let acquired_ns = now_ns();
        let mut step = || -> redis::RedisResult<i64> {
            let inside: i64 = redis::cmd("INCR").arg(&args.inside).query(&mut con)?;
            let value: Option<i64> = redis::cmd("GET").arg(&args.counter).query(&mut con)?;
            std::thread::sleep(pause(args, i));
            let () = redis::cmd("SET")
                .arg(&args.counter)
                .arg(value.unwrap_or(0) + 1)
                .query(&mut con)?;
            let _: i64 = redis::cmd("DECR").arg(&args.inside).query(&mut con)?;
            Ok(inside)
        };
        let inside = step().map_err(|e| format!("redis #{i}: {e}"))?;
        check(&mut report, &guard, inside, acquired_ns);
        released(&mut report, guard.release_blocking())?;
    }
    Ok(report)
}

async fn run_async(client: &LockClient, args: &Args) -> Result<Report, String> {
    let redis = redis::Client::open(args.url.as_str()).map_err(|e| e.to_string())?;
    let mut con = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut report = Report::default();
    for i in 0..args.iterations {
        let guard = client
            .lock(args.lock_key.as_str())
            .ttl(TTL)
            .wait(WAIT)
            .acquire()
            .await
            .map_err(|e| format!("acquire #{i}: {e}"))?;
        let acquired_ns = now_ns();
        let step = async {
            let inside: i64 = redis::cmd("INCR")
                .arg(&args.inside)
                .query_async(&mut con)
                .await?;
            let value: Option<i64> = redis::cmd("GET")
                .arg(&args.counter)
                .query_async(&mut con)
                .await?;
            tokio::time::sleep(pause(args, i)).await;
            let () = redis::cmd("SET")
                .arg(&args.counter)
                .arg(value.unwrap_or(0) + 1)
                .query_async(&mut con)
                .await?;
            let _: i64 = redis::cmd("DECR")
                .arg(&args.inside)
                .query_async(&mut con)
                .await?;
            redis::RedisResult::Ok(inside)
        };
        let inside = step.await.map_err(|e| format!("redis #{i}: {e}"))?;
        check(&mut report, &guard, inside, acquired_ns);
        released(&mut report, guard.release().await)?;
    }
    Ok(report)
}
